"""compiler/codegen/opt/planner.py: a kernel's accesses, the vector and unroll amounts, and the Planner that applies
opts one by one to loops named by node."""
import pytest

from rawgrad import Tensor
from rawgrad.compiler.codegen.opt.kernel import Opt, OptOps, loop_axes, stride
from rawgrad.compiler.codegen.opt.planner import Access, Planner, accesses, constant, unroll_amount, vector_amount
from rawgrad.compiler.ir import UOp
from rawgrad.compiler.rangeify import create_schedule
from rawgrad.dtype import dtypes


def _ast(tensor: Tensor) -> UOp:
  return create_schedule([tensor.uop]).items[-1].ast


def test_accesses_of_a_matmul() -> None:
  ast = _ast(Tensor.empty(3, 5) @ Tensor.empty(5, 7, dtype=dtypes.float16).float())
  found = accesses(ast)
  assert sorted((a.buffer, a.itemsize, a.is_store) for a in found) == [(0, 4, True), (1, 4, False), (2, 2, False)]
  rows, columns, reduce = loop_axes(ast)
  by_buffer = {a.buffer: a for a in found}
  assert [stride(by_buffer[1].index, r) for r in (rows, columns, reduce)] == [5, 0, 1]
  assert [stride(by_buffer[2].index, r) for r in (rows, columns, reduce)] == [0, 1, 7]
  assert [stride(by_buffer[0].index, r) for r in (rows, columns, reduce)] == [7, 1, 0]
  assert isinstance(found[0], Access)


def test_constant_sizes() -> None:
  assert constant(16) == 16 and constant(UOp.variable("n", 1, 8)) is None


@pytest.mark.parametrize("size, lanes, expected", [
  (1024, 8, 8), (8, 8, 8), (5, 8, 8), (3, 8, 4), (2, 16, 2), (1, 8, 0), (0, 8, 0), (None, 16, 16)])
def test_vector_amount_is_a_machine_vector_or_a_power_of_two(size: int | None, lanes: int, expected: int) -> None:
  assert vector_amount(size, lanes) == expected


@pytest.mark.parametrize("size, limit, expected", [
  (64, 4, 4), (3, 4, 3), (1, 4, 0), (12, 8, 6), (7, 4, 4), (10, 8, 5), (None, 8, 8), (64, 1, 0)])
def test_unroll_amount_prefers_a_divisor(size: int | None, limit: int, expected: int) -> None:
  assert unroll_amount(size, limit) == expected


def test_planner_applies_opts_to_loops_named_by_node() -> None:
  plan = Planner(_ast(Tensor.empty(32, 64) @ Tensor.empty(64, 16)))
  rows, columns, reduce = plan.loops
  assert plan.output_loops == [rows, columns] and plan.reduce_loops == [reduce]
  outer = plan.apply(OptOps.UPCAST, columns, 8)
  assert outer is not None and outer.src[0].arg == 2 and plan.opts == [Opt(OptOps.UPCAST, 1, 8)]
  assert plan.uses_lanes(next(a for a in accesses(plan.ast) if a.buffer == 2).index)
  assert not plan.uses_lanes(next(a for a in accesses(plan.ast) if a.buffer == 1).index)
  # the whole loop used up: no outer loop is left
  assert plan.apply(OptOps.UNROLL, plan.loops[1], 2) is None and len(plan.loops) == 2


def test_planner_skips_an_opt_that_does_not_apply() -> None:
  plan = Planner(_ast(Tensor.empty(8, 8).sum(1)))
  assert plan.apply(OptOps.PARALLEL, plan.reduce_loops[0]) is None and plan.opts == []
  plan.apply_local(5)  # there is no parameter 5 to stage
  assert plan.opts == []


def test_planner_streams_the_stores() -> None:
  plan = Planner(_ast(Tensor.empty(8, 8) * 2))
  plan.apply_stream()
  assert plan.opts == [Opt(OptOps.STREAM, 0)] and all(store.arg == "stream" for store in plan.ast.src)
