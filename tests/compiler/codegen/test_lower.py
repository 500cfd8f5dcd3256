"""compiler/codegen/lower.py: the pass list, what a LoweredKernel records, its slices, and the program listing."""
import numpy as np
import pytest

from rawgrad import Tensor, Variable
from rawgrad.compiler.codegen.lower import PASSES, SLICES_PER_THREAD, LoweredKernel, format_program, lower_kernel
from rawgrad.compiler.codegen.opt.heuristic import hand_coded_opts
from rawgrad.compiler.codegen.opt.kernel import Opt, OptOps
from rawgrad.compiler.ir import Ops
from rawgrad.compiler.rangeify import create_schedule
from rawgrad.compiler.target import gpu_target, host_target
from rawgrad.helpers import Context
from tests.compiler.codegen.kernels import last_kernel, run_item


def test_the_pipeline_is_one_list_in_order() -> None:
  assert [name for name, _, _ in PASSES] == ["simplify_gated_indices", "apply_opts", "map_to_gpu", "peel_remainders",
                                             "bound_gated_loops", "expand_math", "expand"]
  assert dict((name, gone) for name, _, gone in PASSES)["expand"] == {"upcast", "unroll"}


def test_without_opts_the_heuristics_choose() -> None:
  ast = create_schedule([(Tensor.empty(512, 512) * 2).uop]).items[-1].ast
  lowered = lower_kernel(ast)
  assert list(lowered.opts) == hand_coded_opts(ast, host_target()) and lowered.target == host_target()
  assert lower_kernel(ast, []).opts == ()


def test_a_parallel_kernel_knows_its_size_and_slices() -> None:
  ast = create_schedule([(Tensor.empty(100, 64) * Tensor.empty(64)).uop]).items[-1].ast  # rows and columns
  lowered = lower_kernel(ast, [Opt(OptOps.PARALLEL, 0)])
  assert lowered.parallel and lowered.parallel_size == 100
  assert lowered.slices(1) == 1 and lowered.slices(4) == 4 * SLICES_PER_THREAD and lowered.slices(64) == 100
  serial = lower_kernel(ast, [])
  assert not serial.parallel and serial.slices(8) == 1


def test_a_symbolic_parallel_loop_takes_the_slices_it_is_given() -> None:
  n = Variable("n", 1, 100)
  x = Tensor(np.ones((100, 4), np.float32)).realize()
  item = last_kernel(x.shrink(((0, n.bind(50)), None)) * 2)
  lowered = lower_kernel(item.ast, [Opt(OptOps.PARALLEL, 0)])
  assert lowered.parallel and lowered.parallel_size is None and lowered.slices(2) == 2 * SLICES_PER_THREAD


def test_gpu_kernels_carry_their_launch_dims() -> None:
  ast = create_schedule([(Tensor.empty(64, 64) + Tensor.empty(64)).uop]).items[-1].ast
  assert lower_kernel(ast, []).global_size == ()
  lowered = lower_kernel(ast, [Opt(OptOps.THREADS, 1, 64)], gpu_target("sm_90"))
  assert [s.arg for s in lowered.global_size] == [64, 1, 1] and [s.arg for s in lowered.local_size] == [64, 1, 1]
  assert not lowered.parallel and repr(lowered) == \
    f"LoweredKernel({ast.arg}, sm_90, [Opt(THREADS, 1, 64)], {len(lowered.program)} instructions)"


def test_the_lowered_program_computes_the_kernel() -> None:
  x = np.arange(24, dtype=np.float32).reshape(4, 6)
  item = last_kernel(Tensor(x).max(1) - Tensor(x).sum(1))
  lowered = lower_kernel(item.ast, [Opt(OptOps.UPCAST, 0, 4)])
  assert isinstance(lowered, LoweredKernel) and not any(i.op is Ops.RANGE and i.arg[1] == "upcast"
                                                         for i in lowered.program)
  np.testing.assert_array_equal(run_item(item, [Opt(OptOps.UPCAST, 0, 4)]), x.max(1) - x.sum(1))


def test_format_program_indents_loops_and_numbers_operands() -> None:
  item = last_kernel(Tensor(np.ones((2, 3), np.float32)).sum(1))
  lowered = lower_kernel(item.ast, [])
  lines = format_program(item.ast.arg, lowered.program, lowered.target).splitlines()
  assert lines[0] == f"program {item.ast.arg} for {lowered.target.arch} ({len(lowered.program)} instructions):"
  ranges = [line for line in lines if " RANGE " in line]
  assert len(ranges) == 2 and ranges[1].index("RANGE") == ranges[0].index("RANGE") + 2
  assert any(line.strip().startswith(tuple("0123456789")) and "%" in line for line in lines)
  assert lines[-1].split()[1] == "END"


def test_debug_levels_print_the_kernel_and_the_program(capsys: pytest.CaptureFixture) -> None:
  ast = create_schedule([(Tensor.empty(4) * 2).uop]).items[-1].ast
  with Context(DEBUG=4):
    lower_kernel(ast, [])
  printed = capsys.readouterr().out
  assert f"kernel {ast.arg} for" in printed and "program" not in printed
  with Context(DEBUG=5):
    lower_kernel(ast, [])
  assert f"program {ast.arg} for" in capsys.readouterr().out
