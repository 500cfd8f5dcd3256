"""GROUP splits a reduction across the kernel's slices: every slice reduces its chunks into a scratch array, the one
that finishes last combines them in chunk order. Values against numpy for sums, maxima, products and means at sizes
0, 1, small, odd and large, with chunk counts that do not divide; any number of slices, in any order, gives the same
bits; a kernel runs again after its count was reset; the heuristics choose it for reductions with few outputs."""
from __future__ import annotations

import numpy as np
import pytest

from rawgrad.compiler.codegen.lower import lower_kernel
from rawgrad.compiler.codegen.opt.heuristic import hand_coded_opts
from rawgrad.compiler.codegen.opt.kernel import PARALLEL, REDUCE, Opt, OptError, OptOps, all_ranges, apply_opts
from rawgrad.engine.search import actions
from rawgrad.compiler.ir import Ops, UOp
from rawgrad.compiler.rangeify import ScheduleItem, create_schedule
from rawgrad.compiler.spec import SpecError, verify_program
from rawgrad.runtime.device import buffer_for
from rawgrad.tensor import Tensor

from tests.compiler.codegen.kernels import argument_block, compiled, last_kernel, run_item

SIZES = (0, 1, 7, 4097, 100003)
GROUP = OptOps.GROUP


def rand(*shape: int, seed: int = 0, dtype: type = np.float32) -> np.ndarray:
  values = np.random.default_rng(seed).standard_normal(shape)
  if np.issubdtype(dtype, np.integer): return (values * 10).astype(dtype)
  return values.astype(dtype)


def reduction(op: str, n: int, dtype: type) -> tuple[Tensor, np.ndarray]:
  """A full reduction of n elements and numpy's value (maxima of all-negative values: an identity of 0 would show;
  products of values near 1, or of 1s and -1s, so they neither overflow nor vanish)."""
  if op == "sum":
    a = rand(n, seed=1, dtype=dtype)
    return Tensor(a).sum(), np.array(a.astype(np.float64 if dtype is np.float32 else np.int64).sum())
  if op == "max":
    a = rand(n, seed=2, dtype=dtype) - 100
    return Tensor(a).max(), np.array(a.max())
  if op == "prod":
    values = np.random.default_rng(3).uniform(-1, 1, n)
    a = (1 + values * 1e-3).astype(dtype) if dtype is np.float32 else np.where(values < 0, -1, 1).astype(dtype)
    return Tensor(a).prod(), np.array(a.astype(np.float64 if dtype is np.float32 else np.int64).prod())
  a = rand(n, seed=4)
  return Tensor(a).mean(), np.array(a.astype(np.float64).mean() if n else np.nan)


def check(got: np.ndarray, expected: np.ndarray, what: str) -> None:
  if np.issubdtype(got.dtype, np.integer): np.testing.assert_array_equal(got, expected, err_msg=what)
  else: np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-3, equal_nan=True, err_msg=what)


REDUCTIONS = [("sum", np.float32), ("sum", np.int32), ("max", np.float32), ("max", np.int32), ("prod", np.float32),
              ("prod", np.int32), ("mean", np.float32)]


# a max over nothing has no value (Tensor.max raises)
@pytest.mark.parametrize("op, dtype, n", [(op, dtype, n) for op, dtype in REDUCTIONS for n in SIZES
                                          if not (op == "max" and n == 0)])
def test_group_matches_numpy(op: str, dtype: type, n: int) -> None:
  tensor, expected = reduction(op, n, dtype)
  item = last_kernel(tensor)
  if n == 1:
    # the scheduler leaves no loop to split: the kernel reads the element
    with pytest.raises(OptError, match="the kernel has 0 loops"): lower_kernel(item.ast, [Opt(GROUP, 0, 2)])
    check(run_item(item, None).reshape(()), expected, "no opts")
    return
  # amount n: chunks of one element each
  for amount in (1, 3, 7, 64, max(n, 1)):
    opts = [Opt(GROUP, 0, amount)]
    for cores, slices in ((1, None), (2, None), (3, None), (3, [2, 1, 0])):
      got = run_item(item, opts, cores, slices=slices, fill=7.0).reshape(())
      check(got, expected, f"{opts}, {cores} cores, slices {slices}")


def test_sum_over_axis_0() -> None:
  """Three outputs, each reduced over 5000 rows: every chunk stores three partials."""
  a = rand(5000, 3, seed=5)
  item = last_kernel(Tensor(a).sum(0))
  # loops: the output (3), then the rows (5000); a vector of 4 lanes uses the whole output loop up
  for opts in ([Opt(GROUP, 1, 7)], [Opt(GROUP, 1, 5000)], [Opt(OptOps.UPCAST, 0, 4), Opt(GROUP, 0, 7)],
               [Opt(OptOps.UNROLL, 1, 3), Opt(GROUP, 1, 6)]):
    for cores, slices in ((1, None), (2, None), (3, [2, 0, 1])):
      got = run_item(item, opts, cores, slices=slices)
      np.testing.assert_allclose(got, a.sum(0), rtol=1e-4, atol=1e-3, err_msg=f"{opts}, {cores} cores")


def test_group_with_loads_around_the_reduce_and_peeled_outputs() -> None:
  """The rest of the stored expression (here a product with another input) runs after the partials are combined; a
  tile the output loop's size does not divide is peeled off in both stores."""
  a, b = rand(5000, 7, seed=12), rand(7, seed=13)
  item = last_kernel(Tensor(a).sum(0) * Tensor(b))
  assert sum(1 for node in item.ast.toposort if node.op is Ops.REDUCE) == 1
  for opts in ([Opt(GROUP, 1, 9)], [Opt(OptOps.TILE, 0, 3), Opt(GROUP, 2, 5)],
               [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 1, 2), Opt(GROUP, 1, 4)]):
    for cores, slices in ((1, None), (3, [1, 2, 0])):
      got = run_item(item, opts, cores, slices=slices)
      np.testing.assert_allclose(got, a.sum(0) * b, rtol=1e-4, atol=1e-3, err_msg=f"{opts}, {cores} cores")


def test_vectorized_reduce_loop_with_group() -> None:
  """The heuristics' vector and accumulators on the reduce loop, then GROUP on what is left of it: the chunks'
  partial reductions are vector code."""
  a = rand(100003, seed=6)
  item = last_kernel(Tensor(a).sum())
  opts = [Opt(OptOps.UPCAST, 0, 16), Opt(OptOps.UNROLL, 0, 4), Opt(GROUP, 0, 5)]
  program = lower_kernel(item.ast, opts).program
  assert any(u.op is Ops.LOAD and u.dtype.count == 16 for u in program), "the loads of a chunk are vectors"
  assert any(u.op is Ops.BARRIER for u in program)
  for cores in (1, 2, 3):
    np.testing.assert_allclose(run_item(item, opts, cores), a.astype(np.float64).sum(), rtol=1e-5, atol=1e-3)


def test_results_are_bit_identical_for_any_slicing() -> None:
  a = rand(100003, seed=7) * 1000  # large values: a change in the order of additions changes the rounding
  item = last_kernel(Tensor(a).sum())
  opts = [Opt(OptOps.UPCAST, 0, 8), Opt(GROUP, 0, 13)]
  reference = run_item(item, opts, cores=1)
  for cores, slices in ((2, None), (3, None), (5, [4, 2, 0, 3, 1]), (13, list(range(12, -1, -1))), (20, None)):
    got = run_item(item, opts, cores, slices=slices)
    assert got.tobytes() == reference.tobytes(), (cores, slices, got, reference)


def run_program_twice(item: ScheduleItem, opts: list[Opt], cores: int) -> list[np.ndarray]:
  """One compiled kernel launched twice, its output filled with nan before each launch."""
  program, instructions = compiled(item, opts)
  buffers = [buffer_for(node).ensure_allocated() for node in item.buffers]
  kernargs = argument_block(instructions, buffers, dict(item.var_values))
  results = []
  for _ in range(2):
    buffers[0].copyin(memoryview(np.full(buffers[0].size, np.nan, np.float32).view(np.uint8)))
    for core in range(cores): program(kernargs.ctypes.data, core, cores)
    results.append(buffers[0].numpy())
  return results


def test_the_count_is_reset_for_the_next_launch() -> None:
  a = rand(4097, seed=8)
  item = last_kernel(Tensor(a).sum())
  for cores in (1, 3):
    first, second = run_program_twice(item, [Opt(GROUP, 0, 7)], cores)
    np.testing.assert_allclose(first, a.astype(np.float64).sum(), rtol=1e-5, atol=1e-3)
    assert second.tobytes() == first.tobytes()


def test_only_the_last_slice_stores() -> None:
  """Until every chunk is done, the output is untouched; the slice that completes them stores it."""
  a = rand(4097, seed=9)
  item = last_kernel(Tensor(a).sum())
  program, instructions = compiled(item, [Opt(GROUP, 0, 8)])
  buffers = [buffer_for(node).ensure_allocated() for node in item.buffers]
  kernargs = argument_block(instructions, buffers, dict(item.var_values))
  buffers[0].copyin(memoryview(np.full(1, -5.0, np.float32).view(np.uint8)))
  for core in (3, 0, 1):
    program(kernargs.ctypes.data, core, 4)
    assert buffers[0].numpy()[0] == -5.0, f"stored before slice 2 of 4 ran (after slice {core})"
  program(kernargs.ctypes.data, 2, 4)
  np.testing.assert_allclose(buffers[0].numpy(), a.astype(np.float64).sum(), rtol=1e-5, atol=1e-3)


# *** the AST and the heuristics ***

def test_group_makes_the_group_loop_parallel() -> None:
  ast = last_kernel(Tensor(rand(1000)).sum()).ast
  grouped = apply_opts(ast, [Opt(GROUP, 0, 3)])
  kinds = [(r.arg[1], r.src[0].arg) for r in all_ranges(grouped)]
  assert kinds == [(PARALLEL, 3), (REDUCE, 334), (REDUCE, 3)]
  assert lower_kernel(ast, [Opt(GROUP, 0, 3)]).parallel_size == 3


def test_heuristics_group_a_full_sum() -> None:
  tensor = Tensor(np.ones(1 << 22, np.float32)).sum()
  opts = hand_coded_opts(create_schedule([tensor.uop]).items[-1].ast)
  assert any(opt.op is GROUP for opt in opts) and not any(opt.op is OptOps.PARALLEL for opt in opts), opts
  assert any(opt.op is OptOps.UPCAST for opt in opts), opts
  assert tensor.numpy() == float(1 << 22)


def test_heuristics_group_a_max_over_three_rows() -> None:
  a = rand(3, 200000, seed=10)
  tensor = Tensor(a).max(1)
  assert any(opt.op is GROUP for opt in hand_coded_opts(create_schedule([tensor.uop]).items[-1].ast))
  np.testing.assert_array_equal(tensor.numpy(), a.max(1))
  mean = Tensor(a).mean()
  assert any(opt.op is GROUP for opt in hand_coded_opts(create_schedule([mean.uop]).items[-1].ast))
  np.testing.assert_allclose(mean.numpy(), a.astype(np.float64).mean(), rtol=1e-4, atol=1e-6)


def test_heuristics_keep_parallel_rows_for_many_outputs() -> None:
  opts = hand_coded_opts(create_schedule([Tensor(rand(512, 1024)).sum(1).uop]).items[-1].ast)
  assert any(opt.op is OptOps.PARALLEL for opt in opts) and not any(opt.op is GROUP for opt in opts), opts


def test_spec_rejects_a_barrier_inside_a_loop() -> None:
  program = lower_kernel(last_kernel(Tensor(rand(1000)).sum()).ast, [Opt(GROUP, 0, 3)]).program
  verify_program("grouped", program)
  barrier = next(u for u in program if u.op is Ops.BARRIER)
  moved = [u for u in program if u is not barrier]
  last_end = max(i for i, u in enumerate(moved) if u.op is Ops.END and u.src[0].arg[1] == PARALLEL)
  moved.insert(last_end, barrier)
  with pytest.raises(SpecError, match="BARRIER inside 1 loops"): verify_program("grouped", moved)


def test_beam_tries_group_on_reduce_loops_only() -> None:
  ast = last_kernel(Tensor(rand(5000, 3)).sum(0)).ast
  groups = [opt for opt in actions(ast) if opt.op is GROUP]
  assert groups and {opt.axis for opt in groups} == {1}, groups
  assert not [opt for opt in actions(apply_opts(ast, [groups[0]])) if opt.op is not OptOps.STREAM
              and _applies(apply_opts(ast, [groups[0]]), opt)], "after a GROUP, only STREAM applies"


def _applies(ast: UOp, opt: Opt) -> bool:
  try:
    apply_opts(ast, [opt])
  except OptError:
    return False
  return True


def matmul_ast(m: int, k: int, n: int) -> UOp:
  return create_schedule([(Tensor(rand(m, k)) @ Tensor(rand(k, n))).uop]).items[-1].ast


@pytest.mark.parametrize("build, opts, message", [
  (lambda: matmul_ast(8, 8, 8), [Opt(GROUP, 0, 2)], "loop 0 is not a reduce loop"),
  (lambda: matmul_ast(8, 8, 8), [Opt(OptOps.PARALLEL, 0), Opt(GROUP, 2, 2)], "already has a parallel loop"),
  (lambda: matmul_ast(8, 8, 8), [Opt(GROUP, 2, 2), Opt(OptOps.PARALLEL, 0)], "only STREAM can follow a GROUP"),
  (lambda: matmul_ast(8, 8, 8), [Opt(GROUP, 2, 2), Opt(OptOps.UPCAST, 0, 4)], "only STREAM can follow a GROUP"),
  (lambda: matmul_ast(8, 8, 8), [Opt(GROUP, 2, 0)], "number of chunks must be positive"),
  (lambda: matmul_ast(512, 8, 512), [Opt(GROUP, 2, 2)], "2097152 bytes of scratch, more than 1048576"),
  (lambda: last_kernel(Tensor(rand(6, 5)).sum(1) + Tensor(rand(6, 5)).max(1)).ast, [Opt(GROUP, 1, 2)],
   "exactly one REDUCE, the kernel has 2"),
  (lambda: last_kernel(Tensor(np.ones(100, np.float32)).shrink(((0, UOp.variable("n", 1, 100).bind(50)),)).sum()).ast,
   [Opt(GROUP, 0, 2)], "size .* is not a constant"),
])
def test_invalid_groups_raise(build, opts: list[Opt], message: str) -> None:
  with pytest.raises(OptError, match=message):
    apply_opts(build(), opts)


def test_stream_after_group_streams_only_the_outputs() -> None:
  a = rand(5000, 3, seed=11)
  item = last_kernel(Tensor(a).sum(0))
  opts = [Opt(GROUP, 1, 4), Opt(OptOps.STREAM, 0)]
  stores = apply_opts(item.ast, opts).src
  assert [store.arg for store in stores] == [None, "stream"]
  np.testing.assert_allclose(run_item(item, opts, cores=2), a.sum(0), rtol=1e-4, atol=1e-3)
