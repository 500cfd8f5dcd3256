"""compiler/codegen/linearize.py: the linear program's shape (loops, accumulators, fused multiply-adds), the values
it computes, and the exact cost estimate of a kernel."""
import math

import numpy as np
import pytest

from rawgrad import Tensor, Variable
from rawgrad.compiler.codegen.linearize import estimate_cost, linearize, output_loops, reduce_identity
from rawgrad.compiler.codegen.lower import lower_kernel
from rawgrad.compiler.codegen.opt.kernel import Opt, OptOps
from rawgrad.compiler.ir import Ops, UOp
from rawgrad.compiler.spec import verify_program
from rawgrad.dtype import dtypes
from tests.compiler.codegen.kernels import last_kernel, run_item

rng = np.random.default_rng(3)


def _ops(program: list[UOp]) -> list[Ops]:
  return [instruction.op for instruction in program]


def _loop_kinds(program: list[UOp]) -> list[str]:
  return [instruction.arg[1] for instruction in program if instruction.op is Ops.RANGE]


def test_reduce_identities() -> None:
  assert reduce_identity(Ops.ADD, dtypes.float32) == 0 and reduce_identity(Ops.ADD, dtypes.bool) is False
  assert reduce_identity(Ops.MUL, dtypes.int32) == 1
  assert reduce_identity(Ops.MAX, dtypes.float16) == -math.inf and reduce_identity(Ops.MAX, dtypes.int8) == -128
  assert reduce_identity(Ops.MAX, dtypes.uint32) == 0
  with pytest.raises(ValueError, match="Ops.XOR is not a reduce op"): reduce_identity(Ops.XOR, dtypes.int32)


def test_a_reduction_accumulates_in_a_register_inside_its_loop() -> None:
  x = rng.standard_normal((4, 8)).astype(np.float32)
  item = last_kernel((Tensor(x) + 1).sum(1))
  program = linearize(item.ast)
  verify_program(item.ast.arg, program)
  ops = _ops(program)
  assert _loop_kinds(program) == ["loop", "reduce"] and ops.count(Ops.END) == 2
  register = ops.index(Ops.DEFINE_REG)
  # the register is reset before the reduce loop, updated in it, and read after it, before the store
  assert program[register].arg == (0, 0) and ops.index(Ops.RANGE, ops.index(Ops.RANGE) + 1) > register
  updates = [i for i, instruction in enumerate(program) if instruction.op is Ops.STORE and instruction.src[0] is
             program[register]]
  assert len(updates) == 1 and updates[0] < len(program) - 1 - ops[::-1].index(Ops.END)
  np.testing.assert_allclose(run_item(item, []), (x + 1).sum(1), rtol=1e-6)


def test_a_sum_of_products_uses_fused_multiply_adds() -> None:
  a, b = rng.standard_normal((3, 5)).astype(np.float32), rng.standard_normal((5, 2)).astype(np.float32)
  item = last_kernel(Tensor(a) @ Tensor(b))
  program = linearize(item.ast)
  assert _ops(program).count(Ops.MULACC) == 1 and Ops.MUL not in [i.op for i in program if i.dtype == dtypes.float32]
  np.testing.assert_allclose(run_item(item, []).reshape(3, 2), a @ b, rtol=1e-5)


def test_sibling_reductions_share_one_loop() -> None:
  """Two reductions of one row at one place are one pass over it with two accumulators."""
  x = rng.standard_normal((6, 16)).astype(np.float32)
  t = Tensor(x)
  item = last_kernel(t.sum(1) + (t * t).max(1))
  program = linearize(item.ast)
  assert _loop_kinds(program) == ["loop", "reduce"] and _ops(program).count(Ops.DEFINE_REG) == 2
  np.testing.assert_allclose(run_item(item, []), x.sum(1) + (x * x).max(1), rtol=1e-5)


def test_unrolled_copies_of_a_reduce_run_in_one_loop() -> None:
  x = rng.standard_normal((4, 32)).astype(np.float32)
  item = last_kernel(Tensor(x).sum(1))
  program = lower_kernel(item.ast, [Opt(OptOps.UNROLL, 1, 4)]).program
  # four copies, four accumulators, one loop
  assert _loop_kinds(program) == ["loop", "reduce"] and _ops(program).count(Ops.DEFINE_REG) == 4
  np.testing.assert_allclose(run_item(item, [Opt(OptOps.UNROLL, 1, 4)]), x.sum(1), rtol=1e-5)


def test_output_loops_are_the_ranges_outside_reductions_in_order() -> None:
  item = last_kernel(Tensor(np.ones((2, 3, 4), np.float32)).sum(1))
  store = item.ast.src[0]
  loops = output_loops(store)
  assert [r.arg for r in loops] == [(0, "loop"), (1, "loop")] and output_loops(item.ast) == loops
  assert [r.src[0].arg for r in loops] == [2, 4]


def test_cost_of_an_elementwise_kernel_and_a_reduction() -> None:
  item = last_kernel(Tensor(np.ones((4, 4), np.float32)) * 3 + 1)
  cost = estimate_cost(lower_kernel(item.ast, []).program)
  assert (cost.flops, cost.bytes_moved) == (2 * 16, 2 * 16 * 4)
  item = last_kernel((Tensor(np.ones((4, 4), np.float32)) + 1).sum(1))
  cost = estimate_cost(lower_kernel(item.ast, []).program)
  assert (cost.flops, cost.bytes_moved) == (16 + 16, 16 * 4 + 4 * 4)


def test_cost_of_a_matmul_counts_a_fused_multiply_add_twice() -> None:
  m, k, n = 3, 5, 7
  item = last_kernel(Tensor(np.ones((m, k), np.float32)) @ Tensor(np.ones((k, n), np.float32)))
  cost = estimate_cost(lower_kernel(item.ast, []).program)
  assert cost.flops == 2 * m * n * k and cost.bytes_moved == 4 * (m * k + k * n + m * n)


def test_cost_counts_every_vector_lane() -> None:
  item = last_kernel(Tensor(np.ones((4, 8), np.float32)) * 3)
  vectorized = lower_kernel(item.ast, [Opt(OptOps.UPCAST, 0, 4)]).program
  assert any(instruction.dtype.count == 4 for instruction in vectorized)
  assert estimate_cost(vectorized).flops == estimate_cost(lower_kernel(item.ast, []).program).flops == 32


def test_cost_follows_the_variables() -> None:
  n = Variable("n", 1, 10)
  x = Tensor(np.arange(10, dtype=np.float32)).realize()
  item = last_kernel(x.shrink(((0, n.bind(3)),)).sum())
  program = lower_kernel(item.ast, []).program
  variable = next(instruction for instruction in program if instruction.op is Ops.DEFINE_VAR)
  for value in (1, 3, 10):
    cost = estimate_cost(program, {variable: value})
    assert cost.flops == value
