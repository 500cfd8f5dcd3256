"""The reductions and scans of tensor_ops/reduce.py, by value."""
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rawgrad import GlobalCounters, Tensor, dtypes
from rawgrad.compiler.ir import Ops
from rawgrad.compiler.rangeify import create_schedule
from rawgrad.tensor_ops import reduce

rng = np.random.default_rng(11)

x = rng.standard_normal((4, 6)).astype(np.float32)


@pytest.mark.parametrize("axis", [None, 0, 1, -1, (0, 1)])
def test_statistics(axis) -> None:
  t = Tensor(x)
  np.testing.assert_allclose(t.var(axis).numpy(), x.var(axis, ddof=1), rtol=1e-5)
  np.testing.assert_allclose(t.std(axis, correction=0).numpy(), x.std(axis), rtol=1e-5)
  np.testing.assert_allclose(t.prod(axis).numpy(), x.prod(axis), rtol=1e-5)
  np.testing.assert_allclose(t.logsumexp(axis).numpy(), np.log(np.exp(x).sum(axis)), rtol=1e-5)
  assert (Tensor(x > 1).any(axis).numpy() == (x > 1).any(axis)).all()
  assert (Tensor(x > -1).all(axis).numpy() == (x > -1).all(axis)).all()
  variance, mean = t.var_mean(axis)
  np.testing.assert_allclose(variance.numpy(), x.var(axis, ddof=1), rtol=1e-5)
  np.testing.assert_allclose(mean.numpy(), x.mean(axis), rtol=1e-5, atol=1e-7)
  deviation, mean = t.std_mean(axis, keepdim=True, correction=0)
  np.testing.assert_allclose(deviation.numpy(), x.std(axis, keepdims=True), rtol=1e-5)
  assert mean.shape == np.mean(x, axis, keepdims=True).shape


def test_argmax_argmin_take_the_first_of_ties() -> None:
  ties = np.array([[1, 3, 3, 0], [2, 2, -1, -1]], np.int32)
  assert Tensor(ties).argmax(1).tolist() == [1, 0] and Tensor(ties).argmin(1).tolist() == [3, 2]
  assert Tensor(ties).argmax().item() == 1 and Tensor(ties).argmax(1).dtype == dtypes.int64
  assert Tensor(x).argmax(0).tolist() == x.argmax(0).tolist()
  unsigned = np.array([5, 0, 7, 0], np.uint8)
  assert Tensor(unsigned).argmin().item() == 1


def test_argmax_argmin_of_a_row_with_nan_is_its_first_nan() -> None:
  """As PyTorch (nan is the row's max and min). An index past the row's end came back: no element equals nan."""
  rows = np.array([[1, np.nan, 3, np.nan], [np.nan, 0, 0, 0], [1, 3, 2, 3]], np.float32)
  assert Tensor(rows).argmax(1).tolist() == [1, 0, 1] and Tensor(rows).argmin(1).tolist() == [1, 0, 0]
  assert Tensor(rows).argmax().item() == 1 and Tensor(rows[2]).argmin().item() == 0


def test_softmax_family_is_stable() -> None:
  big = np.array([[1000.0, 1000.0, -1000.0], [-np.inf, 0.0, -np.inf]], np.float32)
  np.testing.assert_allclose(Tensor(big).softmax(1).numpy(), [[0.5, 0.5, 0], [0, 1, 0]], atol=1e-7)
  np.testing.assert_allclose(Tensor(big).log_softmax(1).numpy()[0, :2], np.log([0.5, 0.5]), rtol=1e-6)
  assert Tensor(np.full(3, -np.inf, np.float32)).logsumexp().item() == -np.inf
  e = np.exp(x - x.max(0))
  np.testing.assert_allclose(Tensor(x).softmax(0).numpy(), e / e.sum(0), rtol=1e-5)


def test_the_log_softmax_gradients_row_sums_read_no_exponentials() -> None:
  """The backward's masks come from the forward's sum of the other exponentials (a probability above 1/2 is the
  peak's, with that sum below 1): its row sums read only the gradient, and the exponentials are formed twice in all,
  for the forward's sum and for the gradient itself. Values: the dominant rows' gradients against float64."""
  rng = np.random.default_rng(5)
  x = rng.standard_normal((8, 64)).astype(np.float32)
  x[::2, 3] += 30  # a dominant element in every other row
  weight = rng.standard_normal((8, 64)).astype(np.float32)
  t = Tensor(x, requires_grad=True)
  (t.log_softmax(1) * Tensor(weight)).sum().backward()
  kernels = create_schedule([t.grad.uop]).items
  with_exponentials = [k.ast.arg for k in kernels if any(n.op is Ops.EXP2 for n in k.ast.toposort)]
  assert len(with_exponentials) == 2, with_exponentials
  x64, w64 = x.astype(np.float64), weight.astype(np.float64)
  p = np.exp(x64 - x64.max(1, keepdims=True))
  p /= p.sum(1, keepdims=True)
  exact = (p[:, None, :] * w64[:, :, None] - p[:, :, None] * w64[:, None, :]).sum(-1)
  largest = np.abs(exact).max(1, keepdims=True)
  assert (np.abs(t.grad.numpy() - exact) <= 1e-6 * largest).all()


def test_scans() -> None:
  t = Tensor(x)
  np.testing.assert_allclose(t.cumsum(1).numpy(), x.cumsum(1), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(t.cumprod(0).numpy(), x.cumprod(0), rtol=1e-5)
  values, indices = t.cummax(1)
  np.testing.assert_array_equal(values.numpy(), np.maximum.accumulate(x, 1))
  expected = np.array([[max(j for j in range(i + 1) if row[j] == np.maximum.accumulate(row)[i]) for i in range(6)]
                       for row in x])
  np.testing.assert_array_equal(indices.numpy(), expected)
  np.testing.assert_array_equal(t.cummin(0).values.numpy(), np.minimum.accumulate(x, 0))
  ints = np.array([3, -2, 5, -2], np.int32)
  assert Tensor(ints).cumsum().tolist() == [3, 1, 6, 4] and Tensor(ints).cumsum().dtype == dtypes.int64


@pytest.mark.parametrize("size", [65, 300])
def test_long_scans_go_block_by_block_and_match_numpy(size: int) -> None:
  """Longer than SCAN_BLOCK (64): blocks of 64 scanned alone, then the blocks' running totals added in, the last
  block padded (65: one element in it); values and gradients as the one-step scan gives them."""
  rng = np.random.default_rng(size)
  long = rng.standard_normal((3, size)).astype(np.float32)
  wide = long.astype(np.float64)
  items = create_schedule([Tensor(long).cumsum(1).uop]).items
  assert {r.src[0].arg for item in items for node in item.ast.toposort if node.op is Ops.REDUCE
          for r in node.src[1:]} <= set(range(1, 65))  # no sum over more than a block (or the blocks' totals)
  np.testing.assert_allclose(Tensor(long).cumsum(1).numpy(), np.cumsum(wide, 1), rtol=1e-5, atol=2e-5)
  np.testing.assert_allclose(Tensor(long.T.copy()).cumsum(0).numpy(), np.cumsum(wide.T, 0), rtol=1e-5, atol=2e-5)
  near_one = 1 + long * 0.01
  np.testing.assert_allclose(Tensor(near_one).cumprod(1).numpy(), np.cumprod(near_one.astype(np.float64), 1), rtol=1e-5)
  np.testing.assert_allclose(Tensor(long).logcumsumexp(1).numpy(), np.logaddexp.accumulate(wide, 1), rtol=1e-5)
  ints = rng.integers(-9, 9, size).astype(np.int32)
  assert Tensor(ints).cumsum().tolist() == np.cumsum(ints).tolist()
  t = Tensor(wide, requires_grad=True)
  (grad,) = (t.cumsum(1) * Tensor(np.arange(size, dtype=np.float64))).sum().gradient(t)
  weights = np.arange(size, dtype=np.float64)
  np.testing.assert_allclose(grad.numpy(), np.tile(np.cumsum(weights[::-1])[::-1], (3, 1)), rtol=1e-9)


def test_reduction_gradients() -> None:
  with_zero = np.array([[1.0, 0.0, 3.0], [2.0, 5.0, 4.0], [0.0, 0.0, 2.0]])
  t = Tensor(with_zero, requires_grad=True)
  (grad,) = t.prod(1).sum().gradient(t)
  np.testing.assert_allclose(grad.numpy(), [[0, 3, 0], [20, 8, 10], [0, 0, 0]])
  v = Tensor(x.astype(np.float64), requires_grad=True)
  (grad,) = v.var().gradient(v)
  np.testing.assert_allclose(grad.numpy(), 2 * (x - x.mean()) / (x.size - 1), rtol=1e-6)
  (grad,) = v.logsumexp(1).sum().gradient(v)
  e = np.exp(x.astype(np.float64))
  np.testing.assert_allclose(grad.numpy(), e / e.sum(1, keepdims=True), rtol=1e-6)
  (grad,) = v.cumsum(1).sum().gradient(v)
  np.testing.assert_allclose(grad.numpy(), np.tile(np.arange(6, 0, -1), (4, 1)))


@settings(max_examples=10, deadline=None)  # each k builds its own kernels: a few seconds of compiling
@given(size=st.integers(17, 90), k=st.integers(1, 6), largest=st.booleans(),
       dtype=st.sampled_from([np.float32, np.float16, np.int32, np.int8]), seed=st.integers(0, 2**16))
def test_a_small_topk_of_a_long_row_takes_what_the_sort_takes(size: int, k: int, largest: bool, dtype: type,
                                                               seed: int) -> None:
  """k <= 16 of more than 16: k passes, each taking the first of the best left; values and indices as the stable
  sort's, with ties, nan (the largest) and -0.0 beside 0.0."""
  rng = np.random.default_rng(seed)
  x = rng.integers(-4, 4, (3, size)).astype(dtype)  # many ties
  if dtype in (np.float32, np.float16):
    x[0, rng.integers(0, size, 3)] = np.nan
    x[1, rng.integers(0, size, 3)] = -0.0
    x[2] = rng.standard_normal(size).astype(dtype)
  t = Tensor(x)
  values, indices = t.topk(k, 1, largest=largest)
  sorted_values, sorted_indices = t.sort(1, descending=largest)
  np.testing.assert_array_equal(indices.numpy(), sorted_indices.numpy()[:, :k])
  np.testing.assert_array_equal(values.numpy(), sorted_values.numpy()[:, :k])
  np.testing.assert_array_equal(values.numpy(), np.take_along_axis(x, indices.numpy(), 1))
  assert values.dtype == t.dtype and indices.dtype == dtypes.int64


def test_a_small_topk_is_not_a_sort() -> None:
  """topk(8) of rows of 500: eight passes of 500 per row, not the sort's 500 x 500 comparisons per row."""
  values = Tensor(np.random.default_rng(3).standard_normal((4, 500)).astype(np.float32)).topk(8, 1).values
  work = 0
  for item in create_schedule([values.uop]).items:
    for node in item.ast.toposort:
      if node.op is Ops.REDUCE: work += int(np.prod(item.dims)) * int(np.prod([r.src[0].arg for r in node.src[1:]]))
  assert work < 4 * 500 * 500 // 10, work


def _stable_order(row: np.ndarray, descending: bool) -> np.ndarray:
  """The stable sort's indices by numpy: nan the largest, -0.0 equal to 0.0, ties in their order."""
  keys = np.where(np.isnan(row), np.inf, row).astype(np.float64) if row.dtype.kind == "f" else row.astype(np.int64)
  rank_nan = np.isnan(row) if row.dtype.kind == "f" else np.zeros(len(row), bool)
  if descending: return np.lexsort((np.arange(len(row)), -keys, ~rank_nan))
  return np.lexsort((np.arange(len(row)), keys, rank_nan))


@settings(max_examples=12, deadline=None)
@given(size=st.integers(2, 70), descending=st.booleans(), seed=st.integers(0, 2**16),
       dtype=st.sampled_from([np.float32, np.float16, np.int32, np.int8]))
def test_the_sorting_network_gives_the_stable_order(size: int, descending: bool, seed: int, dtype: type) -> None:
  """Rows sorted by the bitonic network (its thresholds lowered to these small rows; sizes that are not powers of
  two are padded): the stable order, with ties, nan, -0.0 and the int32 extremes."""
  r = np.random.default_rng(seed)
  x = r.integers(-4, 4, (3, size)).astype(dtype)
  if dtype in (np.float32, np.float16):
    x[0, r.integers(0, size, 3)] = np.nan
    x[1, r.integers(0, size, 3)] = -0.0
    x[2] = r.standard_normal(size).astype(dtype)
  if dtype == np.int32: x[2, r.integers(0, size, 2)] = [np.iinfo(np.int32).min, np.iinfo(np.int32).max]
  with mock.patch.multiple(reduce, SORT_NETWORK=2, SORT_NETWORK_WORK=1):
    values, indices = Tensor(x).sort(1, descending=descending)
  expected = np.stack([_stable_order(row, descending) for row in x])
  np.testing.assert_array_equal(indices.numpy(), expected)
  np.testing.assert_array_equal(values.numpy(), np.take_along_axis(x, expected, 1))
  assert values.dtype == Tensor(x).dtype and indices.dtype == dtypes.int64


def test_a_long_sort_is_a_network_not_size_squared_comparisons() -> None:
  """One row of 50257 (a language model's vocabulary): log2(65536) * 17 / 2 = 136 compare-exchange steps of 65536
  elements and a gather, not 50257^2 comparisons; the values' gradient goes back to where each value came from."""
  row = rng.standard_normal((1, 50257)).astype(np.float32)
  # on the CPU whatever DEVICE says: the GPU emulations would run the gradient's one-hot sum (GPUs have no scatter)
  # of 50257^2 terms in numpy
  t = Tensor(row, requires_grad=True, device="CPU")
  GlobalCounters.reset()
  values, indices = t.sort(1, descending=True)
  Tensor.realize(values, indices)
  assert GlobalCounters.kernel_count <= 140 and GlobalCounters.global_ops < 50257**2 // 20, \
    (GlobalCounters.kernel_count, GlobalCounters.global_ops)
  order = np.argsort(-row[0], kind="stable")
  np.testing.assert_array_equal(indices.numpy()[0], order)
  np.testing.assert_array_equal(values.numpy()[0], row[0, order])
  weights = np.arange(50257, dtype=np.float32)
  (grad,) = (values * Tensor(weights, device="CPU")).sum().gradient(t)
  expected = np.empty(50257, np.float32)
  expected[order] = weights
  np.testing.assert_array_equal(grad.numpy()[0], expected)


def test_cummax_takes_the_last_index_of_the_extreme_and_a_nan_once_there() -> None:
  """PyTorch's indices: ties take the latest, and from a nan on the running value is nan, its index the latest nan's
  (the indices were -1 there)."""
  values, indices = Tensor(np.array([1, np.nan, 2, 0, np.nan, 3], np.float32)).cummax(0)
  np.testing.assert_array_equal(values.numpy(), [1, np.nan, np.nan, np.nan, np.nan, np.nan])
  assert indices.tolist() == [0, 1, 1, 1, 4, 4]
  values, indices = Tensor(np.array([2, 5, 5, 1, 5, 7], np.int32)).cummin(0)
  assert values.tolist() == [2, 2, 2, 1, 1, 1] and indices.tolist() == [0, 0, 0, 3, 3, 3]


@pytest.mark.parametrize("size", [65, 1000])
def test_long_cummax_goes_block_by_block(size: int) -> None:
  """Longer than SCAN_BLOCK: the running maximum block by block (no window of size x size), its indices the running
  maximum of the positions where an element is the extreme so far."""
  r = np.random.default_rng(size)
  x = r.integers(-20, 20, (3, size)).astype(np.float32)
  items = create_schedule([Tensor(x).cummax(1).values.uop, Tensor(x).cummax(1).indices.uop]).items
  assert all(r.src[0].arg <= 64 for item in items for node in item.ast.toposort if node.op is Ops.REDUCE
             for r in node.src[1:]), "a reduce over more than a block"
  values, indices = Tensor(x).cummax(1)
  running = np.maximum.accumulate(x, 1)
  np.testing.assert_array_equal(values.numpy(), running)
  # the last j <= i with x[j] equal to the running maximum at i
  hits = (x[:, None, :] == running[:, :, None]) & np.tri(size, dtype=bool)[None]
  expected = size - 1 - np.argmax(hits[:, :, ::-1], axis=2)
  np.testing.assert_array_equal(indices.numpy(), expected)
  np.testing.assert_array_equal(Tensor(x).cummin(1).values.numpy(), np.minimum.accumulate(x, 1))


def test_logsumexp_of_integers_and_bools_is_computed_in_float() -> None:
  """The peak was subtracted in the integer dtype, which wrapped (uint8 [3, 1, 200]: 259.1); bools raised."""
  np.testing.assert_allclose(Tensor(np.array([3, 1, 200], np.uint8)).logsumexp(0).item(), 200.0, rtol=1e-6)
  np.testing.assert_allclose(Tensor(np.array([-128, 127], np.int8)).logsumexp(0).item(), 127.0, rtol=1e-6)
  np.testing.assert_allclose(Tensor([True, False]).logsumexp(0).item(), np.log(np.e + 1), rtol=1e-6)


def test_the_gradient_of_std_over_equal_values_is_zero() -> None:
  """As PyTorch: d std / d var is infinite there, and 0 * inf made every gradient nan."""
  x = Tensor(np.array([[2.0, 2.0, 2.0], [1.0, 2.0, 4.0]], np.float32), requires_grad=True)
  x.std(1).sum().backward()
  row = np.array([1.0, 2.0, 4.0])
  expected = (row - row.mean()) / (2 * row.std(ddof=1))   # d/dx of sqrt(sum((x - mean)^2) / 2)
  np.testing.assert_allclose(x.grad.numpy(), [[0.0, 0.0, 0.0], expected], rtol=1e-5, atol=1e-7)


def test_the_gradient_of_cummax_goes_where_its_indices_point() -> None:
  """As PyTorch: a tied running maximum's gradient went in equal shares to every tied element."""
  x = Tensor(np.array([[1.0, 3.0, 2.0, 3.0], [5.0, 5.0, 1.0, 7.0]], np.float32), requires_grad=True)
  values, indices = x.cummax(1)
  (values * Tensor(np.array([[1.0, 2.0, 3.0, 4.0]] * 2, np.float32))).sum().backward()
  assert indices.tolist() == [[0, 1, 1, 3], [0, 1, 1, 3]]   # the latest of tied elements, as torch
  np.testing.assert_array_equal(x.grad.numpy(), [[1.0, 5.0, 0.0, 4.0], [1.0, 5.0, 0.0, 4.0]])   # torch's
