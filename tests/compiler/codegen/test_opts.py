"""Every opt, alone and combined, computes the same values as numpy: elementwise, reductions over rows, columns and
everything, matmul, convolution, padded (gated) loads, several dtypes; at odd sizes, sizes the amounts do not divide,
1-element and empty reductions; parallel kernels run slice by slice with several core counts."""
from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

from rawgrad.compiler.codegen.opt.heuristic import hand_coded_opts
from rawgrad.compiler.codegen.opt.kernel import (LOOP, PARALLEL, REDUCE, UNROLL, UPCAST, Opt, OptError, OptOps,
                                                 all_ranges, apply_opts, loop_axes, reduce_ranges)
from rawgrad.compiler.rangeify import create_schedule
from rawgrad.tensor import Tensor

from tests.compiler.codegen.kernels import last_kernel, run_item


def rand(*shape: int, seed: int = 0, dtype: type = np.float32) -> np.ndarray:
  values = np.random.default_rng(seed).standard_normal(shape)
  if np.issubdtype(dtype, np.integer): return (values * 10).astype(dtype)
  if dtype is np.bool_: return values > 0
  return values.astype(dtype)


def opt_lists(tensor: Tensor) -> list[list[Opt] | None]:
  """No opts, the heuristics' choice, each opt on each loop with amounts that rarely divide, and a combination."""
  ast = create_schedule([tensor.uop]).items[-1].ast
  axes = loop_axes(ast)
  inner = reduce_ranges(ast)
  lists: list[list[Opt] | None] = [[], None]
  for axis, r in enumerate(axes):
    lists += [[Opt(OptOps.UPCAST, axis, 4)], [Opt(OptOps.UPCAST, axis, 16)], [Opt(OptOps.UNROLL, axis, 3)],
              [Opt(OptOps.TILE, axis, 2)]]
    if r not in inner: lists.append([Opt(OptOps.PARALLEL, axis)])
  outputs = [a for a, r in enumerate(axes) if r not in inner]
  if outputs and len(axes) >= 2:
    lists.append([Opt(OptOps.UPCAST, len(axes) - 1, 8), Opt(OptOps.UNROLL, 0, 2), Opt(OptOps.TILE, 0, 3),
                  Opt(OptOps.PARALLEL, 0)])
  return lists


def check_all_opts(tensor: Tensor, expected: np.ndarray, rtol: float = 1e-4, atol: float = 1e-4) -> None:
  item = last_kernel(tensor)
  for opts in opt_lists(tensor):
    parallel = opts is None or any(opt.op is OptOps.PARALLEL for opt in opts)
    for cores in ((1, 3) if parallel else (1,)):
      got = run_item(item, opts, cores).reshape(expected.shape)
      np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol, err_msg=f"opts {opts}, {cores} cores")


Case = Callable[[], tuple[Tensor, np.ndarray]]


def elementwise(n: int) -> Case:
  def build() -> tuple[Tensor, np.ndarray]:
    a, b = rand(n, seed=1), rand(n, seed=2)
    return Tensor(a) * Tensor(b) + 1, a * b + 1
  return build


def broadcast_add(m: int, n: int) -> Case:
  def build() -> tuple[Tensor, np.ndarray]:
    a, b, c = rand(m, n, seed=1), rand(n, seed=2), rand(m, 1, seed=3)
    return (Tensor(a) + Tensor(b)) * Tensor(c), (a + b) * c
  return build


def row_sum(m: int, n: int) -> Case:
  def build() -> tuple[Tensor, np.ndarray]:
    a = rand(m, n, seed=1)
    return Tensor(a).sum(1), a.sum(1)
  return build


def column_sum(m: int, n: int) -> Case:
  def build() -> tuple[Tensor, np.ndarray]:
    a = rand(m, n, seed=1)
    return Tensor(a).sum(0), a.sum(0)
  return build


def full_sum(m: int, n: int) -> Case:
  def build() -> tuple[Tensor, np.ndarray]:
    a = rand(m, n, seed=1)
    return Tensor(a).sum(), np.array(a.sum())
  return build


def row_max(m: int, n: int) -> Case:
  def build() -> tuple[Tensor, np.ndarray]:
    a = rand(m, n, seed=1) - 5  # all negative: a masked lane that added 0 instead of -inf would show
    return Tensor(a).max(1), a.max(1)
  return build


def matmul(m: int, k: int, n: int) -> Case:
  def build() -> tuple[Tensor, np.ndarray]:
    a, b = rand(m, k, seed=1), rand(k, n, seed=2)
    return Tensor(a) @ Tensor(b), a @ b
  return build


def padded(n: int) -> Case:
  def build() -> tuple[Tensor, np.ndarray]:
    a = rand(n, seed=1)
    return Tensor(a).pad(((2, 3),)) * 2 + 1, np.pad(a, (2, 3)) * 2 + 1
  return build


CASES = {
  "elementwise_1": elementwise(1), "elementwise_7": elementwise(7), "elementwise_37": elementwise(37),
  "broadcast_5x13": broadcast_add(5, 13),
  "row_sum_5x37": row_sum(5, 37), "row_sum_3x0": row_sum(3, 0), "row_sum_1x1": row_sum(1, 1),
  "column_sum_37x5": column_sum(37, 5), "full_sum_6x7": full_sum(6, 7), "row_max_3x19": row_max(3, 19),
  "matmul_7x13x5": matmul(7, 13, 5), "matmul_17x33x19": matmul(17, 33, 19), "matmul_1x1x1": matmul(1, 1, 1),
  "matmul_3x0x4": matmul(3, 0, 4), "padded_11": padded(11),
}


@pytest.mark.parametrize("name", list(CASES))
def test_every_opt_matches_numpy(name: str) -> None:
  tensor, expected = CASES[name]()
  check_all_opts(tensor, expected)


def test_convolution_with_padding() -> None:
  x, w = rand(2, 3, 7, 6, seed=1), rand(4, 3, 3, 3, seed=2)
  tensor = Tensor(x).conv2d(Tensor(w), padding=1)
  expected = _conv2d(x, w, padding=1)
  item = last_kernel(tensor)
  # loops: n, cout, oh, ow, then cin, kh, kw
  for opts in ([], None, [Opt(OptOps.UPCAST, 3, 4), Opt(OptOps.UNROLL, 1, 3), Opt(OptOps.PARALLEL, 0)],
               [Opt(OptOps.UPCAST, 3, 0), Opt(OptOps.UNROLL, 1, 4), Opt(OptOps.UNROLL, 3, 3)],
               [Opt(OptOps.UPCAST, 6, 3), Opt(OptOps.UNROLL, 4, 2), Opt(OptOps.TILE, 2, 4)]):
    got = run_item(item, opts, cores=2).reshape(expected.shape)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4, err_msg=f"opts {opts}")


def _conv2d(x: np.ndarray, w: np.ndarray, padding: int) -> np.ndarray:
  x = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
  n, _, h, wid = x.shape
  cout, _, kh, kw = w.shape
  out = np.zeros((n, cout, h - kh + 1, wid - kw + 1), np.float32)
  for i in range(kh):
    for j in range(kw):
      out += np.einsum("nchw,oc->nohw", x[:, :, i:i + out.shape[2], j:j + out.shape[3]], w[:, :, i, j])
  return out


@pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.float16, np.float64])
def test_dtypes_vectorize(dtype: type) -> None:
  a, b = rand(5, 19, seed=1, dtype=dtype), rand(19, seed=2, dtype=dtype)  # b broadcast: rows and columns stay loops
  for opts in ([Opt(OptOps.UPCAST, 1, 8)], [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 1, 2)]):
    got = run_item(last_kernel(Tensor(a) + Tensor(b)), opts).reshape(a.shape)
    np.testing.assert_allclose(got, a + b, rtol=1e-3)
  summed = Tensor(a).sum(1)
  got = run_item(last_kernel(summed), [Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.UNROLL, 1, 2)])
  # the lanes and copies add in another order: float16 rounds differently
  np.testing.assert_allclose(got, summed.numpy(), rtol=1e-2 if dtype is np.float16 else 1e-6)


def test_booleans_vectorize() -> None:
  a, b = rand(4, 21, seed=1, dtype=np.bool_), rand(21, seed=2, dtype=np.bool_)  # b broadcast: two loops
  got = run_item(last_kernel(Tensor(a) & Tensor(b)), [Opt(OptOps.UPCAST, 1, 16)]).reshape(a.shape)
  np.testing.assert_array_equal(got, a & b)
  got = run_item(last_kernel(Tensor(a).any(1)), [Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.UNROLL, 1, 2)])
  np.testing.assert_array_equal(got, a.any(1))
  got = run_item(last_kernel((Tensor(a) < Tensor(b)).where(1.0, 2.0)), [Opt(OptOps.UPCAST, 1, 4)]).reshape(a.shape)
  np.testing.assert_array_equal(got, np.where(a < b, 1.0, 2.0))


def test_strided_loads_are_gathered() -> None:
  a = rand(13, 6, seed=1)
  tensor = Tensor(a).permute(1, 0) * 2
  got = run_item(last_kernel(tensor), [Opt(OptOps.UPCAST, 1, 16)]).reshape(6, 13)
  np.testing.assert_allclose(got, a.T * 2)


def test_heuristic_opts_of_large_kernels_on_odd_sizes() -> None:
  """The opts chosen for benchmark-sized kernels, applied to sizes none of their amounts divide (each loop keeps
  more than one iteration, so the same opt list applies)."""
  cases = [(lambda m, k, n: Tensor(rand(m, k, seed=1)) @ Tensor(rand(k, n, seed=2)), (1024, 1024, 1024), (37, 45, 300)),
           (lambda m, n: Tensor(rand(m, n, seed=1)).sum(1), (4096, 4096), (45, 300)),
           (lambda m, n: Tensor(rand(m, n, seed=1)).sum(0), (4096, 4096), (45, 300)),
           (lambda n: Tensor(rand(n, seed=1)) + 1, (1 << 24,), (1001,)),
           (lambda n, c, size: Tensor(rand(n, c, size, size, seed=1)).conv2d(Tensor(rand(c, c, 5, 5, seed=2))),
            (128, 32, 24), (3, 5, 23))]
  for build, large, small in cases:
    opts = hand_coded_opts(create_schedule([build(*large).uop]).items[-1].ast)
    assert opts, "the heuristics vectorize every large kernel"
    expected = build(*small).numpy()
    got = run_item(last_kernel(build(*small)), opts, cores=2)
    np.testing.assert_allclose(got.reshape(expected.shape), expected, rtol=1e-4, atol=1e-4, err_msg=f"{opts}")


def test_parallel_slices_partition_the_output() -> None:
  a = rand(10, 3, seed=1)
  item = last_kernel(Tensor(a) + 1)
  opts = [Opt(OptOps.PARALLEL, 0)]
  first = run_item(item, opts, cores=2, slices=[0], fill=-100.0).reshape(a.shape)
  np.testing.assert_allclose(first[:5], a[:5] + 1)
  assert (first[5:] == -100).all()
  for cores in (1, 2, 3, 7, 10, 16):
    np.testing.assert_allclose(run_item(item, opts, cores=cores).reshape(a.shape), a + 1)


# *** the AST after opts ***

def matmul_ast(m: int = 32, k: int = 32, n: int = 32):
  return create_schedule([(Tensor(rand(m, k)) @ Tensor(rand(k, n))).uop]).items[-1].ast


def kinds(ast) -> list[tuple[str, int]]:
  return [(r.arg[1], r.src[0].arg) for r in all_ranges(ast)]


def test_opts_split_and_mark_ranges() -> None:
  ast = apply_opts(matmul_ast(), [Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.PARALLEL, 0)])
  assert kinds(ast) == [(PARALLEL, 8), (LOOP, 2), (REDUCE, 32), (UPCAST, 16), (UNROLL, 4)]


def test_tile_moves_the_outer_loop_first() -> None:
  ast = apply_opts(matmul_ast(), [Opt(OptOps.TILE, 1, 8)])
  assert kinds(ast) == [(LOOP, 4), (LOOP, 32), (LOOP, 8), (REDUCE, 32)]
  ast = apply_opts(matmul_ast(), [Opt(OptOps.PARALLEL, 1), Opt(OptOps.TILE, 1, 8)])
  assert kinds(ast) == [(PARALLEL, 32), (LOOP, 4), (LOOP, 8), (REDUCE, 32)]


def test_swap_exchanges_loops() -> None:
  ast = apply_opts(matmul_ast(32, 16, 8), [Opt(OptOps.SWAP, 0, 1)])
  assert kinds(ast) == [(LOOP, 8), (LOOP, 32), (REDUCE, 16)]


def test_swapping_two_loops_of_a_sum_swaps_them_in_its_loop_nest() -> None:
  """A REDUCE opens its loops in its own order: a swap of two of them reorders that too."""
  from rawgrad.compiler.codegen.lower import lower_kernel
  from rawgrad.compiler.ir import Ops
  x = rand(4, 3, 5)
  item = last_kernel(Tensor(x).sum((0, 2)))  # loops: the 3 outputs; the sum over 4, then over 5
  for opts, sizes in (([], [3, 4, 5]), ([Opt(OptOps.SWAP, 1, 2)], [3, 5, 4])):
    program = lower_kernel(item.ast, opts).program
    assert [u.src[0].arg for u in program if u.op is Ops.RANGE] == sizes
    np.testing.assert_allclose(run_item(item, opts), x.sum((0, 2)), rtol=1e-5)


@pytest.mark.parametrize("opts, message", [
  ([Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 4)], "already has a vector axis"),
  ([Opt(OptOps.PARALLEL, 2)], "reduce loop cannot run in parallel"),
  ([Opt(OptOps.PARALLEL, 0), Opt(OptOps.PARALLEL, 1)], "already has a parallel loop"),
  ([Opt(OptOps.SWAP, 0, 2)], "only two output loops"),
  ([Opt(OptOps.UPCAST, 3, 4)], "has 3 loops"),
  ([Opt(OptOps.UNROLL, 0, 32), Opt(OptOps.UNROLL, 1, 32)], "copies of the code"),
  ([Opt(OptOps.UPCAST, 0, 1000)], "at most"),
])
def test_invalid_opts_raise(opts: list[Opt], message: str) -> None:
  with pytest.raises(OptError, match=message):
    apply_opts(matmul_ast(), opts)


def test_whole_axis_upcast_needs_a_constant_size() -> None:
  assert kinds(apply_opts(matmul_ast(4, 4, 4), [Opt(OptOps.UPCAST, 1, 0)])) == [(LOOP, 4), (REDUCE, 4), (UPCAST, 4)]
  assert UNROLL in {r.arg[1] for r in all_ranges(apply_opts(matmul_ast(), [Opt(OptOps.UNROLL, 2, 0)]))}


def test_opts_print_as_a_short_list() -> None:
  assert repr([Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.PARALLEL, 0)]) == "[Opt(UPCAST, 1, 16), Opt(PARALLEL, 0, 0)]"


# *** staging in a local buffer ***

PACKED_MATMUL = [Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.UNROLL, 1, 2), Opt(OptOps.UNROLL, 0, 8), Opt(OptOps.TILE, 1, 2),
                 Opt(OptOps.PARALLEL, 0), Opt(OptOps.LOCAL, 0, 2)]


@pytest.mark.parametrize("m, k, n", [(37, 45, 53), (8, 64, 64), (1, 3, 1), (5, 0, 7)])
def test_packed_matmul_at_odd_sizes(m: int, k: int, n: int) -> None:
  a, b = rand(m, k, seed=1), rand(k, n, seed=2)
  item = last_kernel(Tensor(a) @ Tensor(b))
  for opts in (PACKED_MATMUL, [Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.LOCAL, 0, 2)],
               [Opt(OptOps.TILE, 1, 3), Opt(OptOps.LOCAL, 0, 1), Opt(OptOps.LOCAL, 0, 2)]):
    for cores in (1, 3):
      try:
        got = run_item(item, opts, cores).reshape(m, n)
      except OptError as error:
        assert "nothing to stage" in str(error) or "loops" in str(error), error
        continue
      np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-4, err_msg=f"{opts}, {cores} cores")


def test_staging_a_padded_input_keeps_its_zeros() -> None:
  x, w = rand(2, 3, 7, 6, seed=1), rand(4, 3, 3, 3, seed=2)
  item = last_kernel(Tensor(x).conv2d(Tensor(w), padding=1))
  for opts in ([Opt(OptOps.UPCAST, 3, 0), Opt(OptOps.LOCAL, 0, 1)],
               [Opt(OptOps.UPCAST, 3, 4), Opt(OptOps.UNROLL, 1, 2), Opt(OptOps.LOCAL, 1, 1), Opt(OptOps.LOCAL, 0, 2)]):
    got = run_item(item, opts, cores=2).reshape(2, 4, 7, 6)
    np.testing.assert_allclose(got, _conv2d(x, w, padding=1), rtol=1e-4, atol=1e-4, err_msg=f"{opts}")


@pytest.mark.parametrize("opts, message", [
  ([Opt(OptOps.LOCAL, 2, 2)], "inside an output loop"),
  ([Opt(OptOps.LOCAL, 0, 7)], "0 different loads"),
  ([Opt(OptOps.LOCAL, 0, 2), Opt(OptOps.UPCAST, 0, 4)], "only LOCAL can follow"),
  ([Opt(OptOps.LOCAL, 1, 2), Opt(OptOps.LOCAL, 0, 2)], "parameter 2 is staged already"),
])
def test_invalid_staging_raises(opts: list[Opt], message: str) -> None:
  with pytest.raises(OptError, match=message):
    apply_opts(matmul_ast(), opts)


def test_staging_needs_a_loop_inside_that_moves_the_load() -> None:
  ast = create_schedule([(Tensor(rand(4, 5)) + Tensor(rand(5))).uop]).items[-1].ast
  with pytest.raises(OptError, match="nothing to stage"):
    apply_opts(ast, [Opt(OptOps.LOCAL, 1, 2)])


def test_a_local_buffer_is_bounded() -> None:
  with pytest.raises(OptError, match="more than a local buffer holds"):
    apply_opts(matmul_ast(1024, 1024, 1024), [Opt(OptOps.LOCAL, 0, 2)])


def test_streaming_stores() -> None:
  for n in (64, 1000):
    a = rand(n, seed=1)
    got = run_item(last_kernel(Tensor(a) * 2), [Opt(OptOps.UPCAST, 0, 16), Opt(OptOps.STREAM, 0)], cores=2)
    np.testing.assert_allclose(got, a * 2)
  with pytest.raises(OptError, match="already stream"):
    apply_opts(matmul_ast(), [Opt(OptOps.STREAM, 0), Opt(OptOps.STREAM, 0)])


HEURISTIC_CASES = {
  "matmul_transposed": lambda: Tensor(rand(40, 70, seed=1)) @ Tensor(rand(33, 70, seed=2)).permute(1, 0),
  "matmul_vector": lambda: Tensor(rand(130, seed=1)) @ Tensor(rand(130, 90, seed=2)),
  "batched_matmul": lambda: Tensor(rand(3, 20, 30, seed=1)) @ Tensor(rand(3, 30, 50, seed=2)),
  "sum_middle_axis": lambda: Tensor(rand(6, 70, 33, seed=1)).sum(1),
  "mean_and_broadcast": lambda: Tensor(rand(50, 70, seed=1)) - Tensor(rand(50, 70, seed=1)).mean(1, keepdim=True),
  "softmax": lambda: Tensor(rand(9, 300, seed=1)).softmax(1),
  "argmax": lambda: Tensor(rand(9, 300, seed=1)).argmax(1),
  "large_elementwise": lambda: (Tensor(rand(300, 1000, seed=1)) * 2).exp2(),
  "large_column_sum": lambda: Tensor(rand(700, 300, seed=1)).sum(0),
  "conv_bias_relu": lambda: (Tensor(rand(4, 3, 13, 13, seed=1)).conv2d(Tensor(rand(6, 3, 3, 3, seed=2)),
                                                                           Tensor(rand(6, seed=3)))).relu(),
}


@pytest.mark.parametrize("name", list(HEURISTIC_CASES))
def test_heuristics_on_assorted_kernels(name: str) -> None:
  """Every kernel of the computation, with the heuristics' opts, as the realize path runs them, against the same
  computation without opts."""
  expected = HEURISTIC_CASES[name]()
  items = create_schedule([expected.uop]).items
  for item in items[:-1]: run_item(item, None, cores=2)
  got = run_item(items[-1], None, cores=2)
  for item in items: run_item(item, [], cores=1)
  np.testing.assert_allclose(got, run_item(items[-1], [], cores=1), rtol=1e-4, atol=1e-4)


def _ulps(got: np.ndarray, want: np.ndarray, dtype: type) -> np.ndarray:
  """Distance from the exact value in units of the dtype's spacing there (0 where got is the rounded value)."""
  with np.errstate(all="ignore"):
    rounded = want.astype(dtype)
    same = (got == rounded) | (np.isnan(got) & np.isnan(want))
    distance = np.abs(got.astype(np.float64) - want) / np.spacing(np.abs(rounded)).astype(np.float64)
  return np.where(same, 0.0, np.nan_to_num(distance, nan=np.inf))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_vector_exp2_and_log2_round_once(dtype: type) -> None:
  """Vector lanes compute exp2 and log2 in double precision: within a hair of half an ulp, specials exact."""
  rng = np.random.default_rng(0)
  specials = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 1e-45, 2.0 ** -149, 127.9999, 128.0, -149.5, -150.0]
  for op, reference, values in ((Tensor.exp2, np.exp2, rng.uniform(-160, 140, 4000)),
                                (Tensor.log2, np.log2, np.abs(rng.standard_normal(4000)) * 10.0 ** rng.uniform(-46, 38,
                                                                                                                 4000))):
    x = np.concatenate([specials, values]).astype(dtype)
    got = run_item(last_kernel(op(Tensor(x))), [Opt(OptOps.UPCAST, 0, 16)]).astype(dtype)
    with np.errstate(all="ignore"):
      want = reference(x.astype(np.float64))
    ulps = _ulps(got, want, dtype)
    assert ulps.max() <= 0.501, (op.__name__, x[ulps.argmax()], got[ulps.argmax()], want[ulps.argmax()])
