"""Values issue 17 found silently wrong, against torch."""
import math

import numpy as np
import pytest

from rawgrad import Tensor, dtypes
from rawgrad.tools.compare_torch import Input, max_error
from tests.torch_parity.parity import both, check, values

torch = pytest.importorskip("torch")
F = torch.nn.functional

INF, NAN = math.inf, math.nan


# *** scatter: one write wins ***

def test_scatter_with_duplicate_indices_of_equal_values_matches_torch():
  index = values([[0, 1, 0, 2], [0, 1, 2, 2], [1, 1, 0, 2]], "int64")
  src = values([[5.0, -1.0, 3.0, 7.0], [5.0, -1.0, 4.0, 7.0], [2.0, -1.0, 3.0, 7.0]])
  check(both("scatter_equal_duplicates", lambda x, i, s: x.scatter(0, i, s), None, Input((3, 4)), index, src))
  check(both("scatter_scalar_duplicates", lambda x, i: x.scatter(1, i, 2.5), None, Input((3, 4)), index))


def test_scatter_last_write_wins():
  rng = np.random.default_rng(5)
  x = rng.standard_normal((4, 6)).astype(np.float32)
  index = rng.integers(0, 4, (5, 6))
  src = rng.standard_normal((5, 6)).astype(np.float32)
  expected = x.copy()
  for i in range(5):  # torch's CPU loop: later rows overwrite earlier ones
    for j in range(6): expected[index[i, j], j] = src[i, j]
  result = Tensor(x).scatter(0, Tensor(index), Tensor(src)).numpy()
  np.testing.assert_array_equal(result, expected)
  np.testing.assert_array_equal(result, torch.tensor(x).scatter(0, torch.tensor(index), torch.tensor(src)).numpy())


def test_scatter_gradient_matches_torch_with_duplicates():
  index = values([[2, 0, 1, 1], [0, 0, 2, 1]], "int64")
  check(both("scatter_gradient", lambda x, i, s: x.scatter(0, i, s), None, Input((3, 4)), index, Input((2, 4))))


# *** pow and exp gradients at special values ***

SPECIAL = [-2.0, -0.5, -0.0, 0.0, 0.5, 1.0, 2.0, INF, -INF, NAN]


@pytest.mark.parametrize("exponent", [2, 3, -1, -2, 0, 1, 0.5, -0.5, 2.5, -1.5, 1e-3])
def test_pow_scalar_exponent_gradient_at_special_bases(exponent):
  check(both(f"pow_{exponent}", lambda x: x ** exponent, None, values(SPECIAL)))


def test_pow_tensor_gradients_at_special_values():
  bases, exponents = np.meshgrid(np.array(SPECIAL, np.float32), np.array([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 3.0,
                                                                          INF, -INF, NAN], np.float32))
  check(both("pow_tensor_special", lambda x, y: x ** y, None, values(bases), values(exponents)))
  check(both("pow_broadcast", lambda x, y: x.pow(y), None, Input((3, 1), 0.2, 3.0), Input((4,), -2, 2)))
  check(both("rpow", lambda y: 2.0 ** y, None, values(SPECIAL)))
  check(both("rpow_zero_base", lambda y: 0.0 ** y, None, values([-1.0, 0.0, 2.0, INF])))


def test_exp_gradient_at_infinities():
  check(both("exp_special", lambda x: x.exp(), None, values([-INF, INF, NAN, 89.0, 100.0, -104.0, -200.0, 0.0])))
  check(both("exp_float64", lambda x: x.exp(), None, values([-INF, INF, 710.0, -746.0], "float64")))


# *** softmax precision ***

def exact_gradient(x: np.ndarray, weight: np.ndarray, name: str) -> np.ndarray:
  """The gradient of sum(name(x, 1) * weight) in float64, in the pairwise form without cancellation: for softmax
  p_i * sum_j p_j (w_i - w_j), for log_softmax sum_j (p_j w_i - p_i w_j). (float64 torch cancels too, at a
  probability within 1e-16 of 1.)"""
  x, weight = x.astype(np.float64), weight.astype(np.float64)
  p = np.exp(x - x.max(1, keepdims=True))
  p /= p.sum(1, keepdims=True)
  if name == "softmax": return p * (p[:, None, :] * (weight[:, :, None] - weight[:, None, :])).sum(-1)
  return (p[:, None, :] * weight[:, :, None] - p[:, :, None] * weight[:, None, :]).sum(-1)


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("scale, offset", [(40.0, 0.0), (40.0, 1000.0), (1.0, -5000.0), (10.0, 0.0), (200.0, 0.0)])
def test_softmax_gradients_keep_float32_precision_on_large_logits(name, scale, offset):
  rng = np.random.default_rng(7)
  x = (rng.standard_normal((4, 9)) * scale + offset).astype(np.float32)
  weight = rng.standard_normal((4, 9)).astype(np.float32)
  ours = Tensor(x, requires_grad=True)
  (getattr(ours, name)(1) * Tensor(weight)).sum().backward()
  theirs = torch.tensor(x, dtype=torch.float64, requires_grad=True)
  (getattr(theirs, name)(1) * torch.tensor(weight, dtype=torch.float64)).sum().backward()
  exact = exact_gradient(x, weight, name)
  largest = np.abs(exact).max(1, keepdims=True)
  # the exact form is torch's gradient, up to float64 torch's own cancellation (1e-16 absolute)
  assert (np.abs(theirs.grad.numpy() - exact) <= 1e-15 + 1e-9 * largest).all()
  # within 1e-6 of each row's largest gradient, or below float32's normal range (torch's float32 gradient is off by
  # all of it in some of these rows)
  error = np.abs(ours.grad.numpy() - exact)
  assert (error <= 1e-6 * largest + 1e-37).all(), error / largest
  np.testing.assert_allclose(getattr(Tensor(x), name)(1).numpy(), getattr(torch.tensor(x), name)(1).numpy(),
                             rtol=1e-5, atol=1e-7)


def test_cross_entropy_gradient_on_large_logits():
  logits = Input((5, 7), -300.0, 300.0)
  check(both("cross_entropy_large", lambda x, t: x.cross_entropy(t), lambda x, t: F.cross_entropy(x, t), logits,
             Input((5,), 0, 7, "int64"), tolerance=1e-6))


# *** arange beyond int32 ***

@pytest.mark.parametrize("start, stop, step", [(2**31 - 3, 2**31 + 3, 1), (-2**31 - 2, -2**31 + 2, 1),
                                               (0, 2**33, 2**31 + 5), (2**40, 2**40 - 10, -3)])
def test_arange_beyond_int32_promotes_to_int64(start, stop, step):
  ours = Tensor.arange(start, stop, step)
  assert ours.dtype == dtypes.int64
  np.testing.assert_array_equal(ours.numpy(), torch.arange(start, stop, step).numpy())


def test_arange_in_range_keeps_the_default_int_and_refuses_to_wrap():
  assert Tensor.arange(-5, 2**31 - 1, 2**30).dtype == dtypes.int32
  np.testing.assert_array_equal(Tensor.arange(-5, 2**31 - 1, 2**30).numpy(), torch.arange(-5, 2**31 - 1, 2**30))
  with pytest.raises(ValueError, match="outside the range of dtypes.int32"):
    Tensor.arange(2**31 - 1, 2**31 + 1, dtype=dtypes.int32)


# *** integer bilinear interpolation ***

@pytest.mark.parametrize("size", [(9, 11), (3, 4), (5, 14), (10, 6), (4, 2)])
@pytest.mark.parametrize("align_corners", [False, True])
def test_uint8_bilinear_interpolation_matches_torch_exactly(size, align_corners):
  image = np.random.default_rng(sum(size)).integers(0, 256, (2, 3, 5, 7)).astype(np.uint8)
  ours = Tensor(image).interpolate(size=size, mode="bilinear", align_corners=align_corners)
  theirs = F.interpolate(torch.tensor(image), size=size, mode="bilinear", align_corners=align_corners)
  assert ours.dtype == dtypes.uint8
  np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def test_uint8_bilinear_extremes_do_not_wrap():
  image = np.array([[[[0, 255, 0], [255, 0, 255]]]], np.uint8)
  ours = Tensor(image).interpolate(size=(5, 8), mode="bilinear").numpy()
  np.testing.assert_array_equal(ours, F.interpolate(torch.tensor(image), size=(5, 8), mode="bilinear").numpy())


# *** arguments torch refuses ***

@pytest.mark.parametrize("dims", [(0, 0), (1, -1), (0, 1, 0)])
def test_flip_with_a_repeated_dim_raises_like_torch(dims):
  x = np.zeros((2, 3), np.float32)
  with pytest.raises(RuntimeError):
    torch.tensor(x).flip(dims)
  with pytest.raises(RuntimeError, match="more than once"):
    Tensor(x).flip(*dims)


@pytest.mark.parametrize("make, torch_make", [(lambda s: Tensor.full(s, 1.0), lambda s: torch.full(s, 1.0)),
                                              (lambda s: Tensor.zeros(*s), lambda s: torch.zeros(*s)),
                                              (lambda s: Tensor.ones(*s), lambda s: torch.ones(*s)),
                                              (lambda s: Tensor.empty(*s), lambda s: torch.empty(*s))])
def test_negative_sizes_raise_like_torch(make, torch_make):
  with pytest.raises(RuntimeError):
    torch_make((2, -3))
  with pytest.raises(RuntimeError, match="-3"):
    make((2, -3))
  assert make((0, 2)).shape == tuple(torch_make((0, 2)).shape)


def test_max_error_sees_mismatched_special_values():
  assert max_error(np.array([NAN, INF, 1.0]), np.array([NAN, INF, 1.0])) == 0.0
  assert max_error(np.array([INF]), np.array([NAN])) == INF
  assert max_error(np.array([2.0]), np.array([1.0])) == 1.0
