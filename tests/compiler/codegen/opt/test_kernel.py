"""compiler/codegen/opt/kernel.py: the loops of a kernel, the split a range becomes, strides, and what GROUP, STREAM
and LOCAL make, by structure and by value. (tests/compiler/codegen/test_opts.py runs every opt against numpy.)"""
import numpy as np
import pytest

from rawgrad import Tensor
from rawgrad.compiler.codegen.opt.kernel import (LOOP, PARALLEL, REDUCE, UPCAST, Opt, OptError, OptOps, all_ranges,
                                                 apply_opt, apply_opts, identity_const, is_grouped, loop_axes,
                                                 range_kind, reduce_ranges, renumber, size_of, split_range, stride)
from rawgrad.compiler.ir import Ops, UOp
from rawgrad.compiler.rangeify import create_schedule
from rawgrad.dtype import dtypes
from tests.compiler.codegen.kernels import last_kernel, run_item

rng = np.random.default_rng(29)


def _ast(tensor: Tensor) -> UOp:
  return create_schedule([tensor.uop]).items[-1].ast


def _kinds(ast: UOp) -> list[tuple[str, int]]:
  return [(range_kind(r), r.src[0].arg) for r in all_ranges(ast)]


def test_loops_come_output_first_then_reduce() -> None:
  ast = _ast(Tensor.empty(3, 5) @ Tensor.empty(5, 7))
  rows, columns, inner = loop_axes(ast)
  assert reduce_ranges(ast) == {inner} and [size_of(r) for r in (rows, columns, inner)] == [3, 7, 5]
  assert [range_kind(r) for r in all_ranges(ast)] == [LOOP, LOOP, REDUCE]


def test_stride_of_linear_and_nonlinear_indices() -> None:
  r0, r1 = UOp.range(4, 0), UOp.range(8, 1)
  assert stride(r0 * 8 + r1, r0) == 8 and stride(r0 * 8 + r1, r1) == 1 and stride(r1 * 3 + r1 * 2, r1) == 5
  assert stride(r1 + 7, r0) == 0
  assert stride((r0 * 8 + r1) // 2, r1) is None and stride(r0 * r1, r0) is None


def test_split_range_gates_what_a_remainder_would_overrun() -> None:
  ast = _ast(Tensor.empty(10) * 2)
  (loop,) = all_ranges(ast)
  split, outer, inner = split_range(ast, loop, 4, UPCAST)
  assert size_of(outer) == 3 and size_of(inner) == 4 and range_kind(inner) == UPCAST
  gates = [node.src[2] for node in split.toposort if node.op is Ops.INDEX and len(node.src) == 3]
  assert gates and all(outer in gate.toposort and inner in gate.toposort for gate in gates)
  exact, outer, _ = split_range(ast, loop, 5, UPCAST)
  assert not any(node.op is Ops.INDEX and len(node.src) == 3 for node in exact.toposort)
  _, outer, inner = split_range(ast, loop, 16, UPCAST)
  assert outer is None and size_of(inner) == 16  # one outer iteration: no outer loop at all


def test_renumber_orders_the_loops_and_refuses_a_missing_range() -> None:
  ast = _ast(Tensor.empty(3, 5) * Tensor.empty(5))  # a row broadcast: two loops
  first, second = all_ranges(ast)
  swapped = renumber(ast, [second, first])
  assert [size_of(r) for r in all_ranges(swapped)] == [5, 3]
  with pytest.raises(RuntimeError, match="have no place in the loop order"): renumber(ast, [first])


def test_applying_opts_in_turn_is_apply_opts_and_is_remembered() -> None:
  ast = _ast(Tensor.empty(64, 32) @ Tensor.empty(32, 16))
  opts = [Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.PARALLEL, 0)]
  stepwise = ast
  for opt in opts: stepwise = apply_opt(stepwise, opt)
  assert apply_opts(ast, opts) is stepwise and apply_opt(ast, opts[0]) is apply_opt(ast, opts[0])
  assert _kinds(stepwise)[0] == (PARALLEL, 16)


def test_equal_kernels_with_equal_opts_are_one_node() -> None:
  """Hash-consing plus renumbering: the same computation on other buffers of the same shape is the same kernel."""
  one = apply_opts(_ast(Tensor.empty(8, 8) + Tensor.empty(8)), [Opt(OptOps.UPCAST, 1, 4)])
  two = apply_opts(_ast(Tensor.empty(8, 8) + Tensor.empty(8)), [Opt(OptOps.UPCAST, 1, 4)])
  assert one is two


def test_group_makes_partial_stores_and_a_barrier() -> None:
  x = rng.standard_normal(10_000).astype(np.float32)
  item = last_kernel(Tensor(x).sum())
  grouped = apply_opt(item.ast, Opt(OptOps.GROUP, 0, 8))
  assert is_grouped(grouped) and len(grouped.src) == 2
  scratch = next(node for node in grouped.toposort if node.op is Ops.DEFINE_SCRATCH)
  assert scratch.dtype.size == 8 and next(n for n in grouped.toposort if n.op is Ops.BARRIER).arg == 8
  assert _kinds(grouped)[0] == (PARALLEL, 8)
  with pytest.raises(OptError, match="only STREAM can follow a GROUP"): apply_opt(grouped, Opt(OptOps.UPCAST, 0, 4))
  for cores in (1, 3, 8):
    np.testing.assert_allclose(run_item(item, [Opt(OptOps.GROUP, 0, 8)], cores), x.sum(), rtol=1e-4)


def test_group_refuses_what_it_cannot_split() -> None:
  ast = _ast(Tensor.empty(8, 64).sum(1))
  with pytest.raises(OptError, match="loop 0 is not a reduce loop"): apply_opt(ast, Opt(OptOps.GROUP, 0, 4))
  with pytest.raises(OptError, match="already has a parallel loop"):
    apply_opts(ast, [Opt(OptOps.PARALLEL, 0), Opt(OptOps.GROUP, 1, 4)])
  with pytest.raises(OptError, match="the number of chunks must be positive"): apply_opt(ast, Opt(OptOps.GROUP, 1, 0))


def test_stream_marks_the_output_stores_once() -> None:
  ast = apply_opt(_ast(Tensor.empty(64) * 2), Opt(OptOps.STREAM, 0))
  assert [store.arg for store in ast.src] == ["stream"]
  with pytest.raises(OptError, match="the stores already stream"): apply_opt(ast, Opt(OptOps.STREAM, 0))


def test_local_stages_a_load_and_keeps_the_values() -> None:
  a, b = rng.standard_normal((12, 16)).astype(np.float32), rng.standard_normal((16, 8)).astype(np.float32)
  item = last_kernel(Tensor(a) @ Tensor(b))
  opts = [Opt(OptOps.LOCAL, 0, 2)]
  staged = apply_opts(item.ast, opts)
  assert any(node.op is Ops.DEFINE_LOCAL for node in staged.toposort)
  assert "stage" in {range_kind(r) for r in all_ranges(staged)}
  with pytest.raises(OptError, match="only LOCAL can follow a LOCAL"): apply_opt(staged, Opt(OptOps.UPCAST, 0, 4))
  np.testing.assert_allclose(run_item(item, opts).reshape(12, 8), a @ b, rtol=1e-5)


def test_identity_constants() -> None:
  assert identity_const(Ops.ADD, dtypes.int32).arg == 0 and identity_const(Ops.MUL, dtypes.float32).arg == 1
  assert identity_const(Ops.MAX, dtypes.int16).arg == -(1 << 15)
