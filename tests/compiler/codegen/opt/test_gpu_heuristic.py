"""compiler/codegen/opt/gpu_heuristic.py: blocks of eight warps of the target's width, one thread per output or a
block per reduction with few outputs, and the values those opts compute (through the GPU program interpreter)."""
import numpy as np
import pytest

from rawgrad import Tensor
from rawgrad.compiler.codegen.opt.gpu_heuristic import SHARED_REDUCE_MIN, WARPS_PER_BLOCK, gpu_opts
from rawgrad.compiler.codegen.opt.kernel import Opt, OptOps
from rawgrad.compiler.ir import UOp
from rawgrad.compiler.rangeify import create_schedule
from rawgrad.compiler.target import gpu_target
from tests.compiler.codegen.test_gpu import run_on

rng = np.random.default_rng(23)


def _ast(tensor: Tensor) -> UOp:
  return create_schedule([tensor.uop]).items[-1].ast


@pytest.mark.parametrize("arch", ["sm_90", "gfx942"])
def test_a_long_contiguous_row_is_one_block_of_eight_warps(arch: str) -> None:
  block = gpu_target(arch).warp_size * WARPS_PER_BLOCK
  assert gpu_opts(_ast(Tensor.empty(2048, 4096) * 2), gpu_target(arch)) == [Opt(OptOps.THREADS, 1, block)]


def test_a_short_row_is_topped_up_from_the_next_loop_out() -> None:
  opts = gpu_opts(_ast(Tensor.empty(64, 8) * 2), gpu_target("sm_90"))
  assert opts == [Opt(OptOps.THREADS, 0, 32), Opt(OptOps.THREADS, 1, 8)]
  assert opts[0].amount * opts[1].amount == 256


def test_the_threads_follow_the_contiguous_store() -> None:
  # the output of a transposed copy is contiguous along the tensor's last axis, whatever the input's layout
  opts = gpu_opts(_ast(Tensor.empty(4096, 512).permute(1, 0).contiguous()), gpu_target("sm_90"))
  assert opts == [Opt(OptOps.THREADS, 1, 256)]


@pytest.mark.parametrize("arch", ["sm_90", "gfx942"])
def test_a_reduction_with_few_outputs_shares_a_block(arch: str) -> None:
  block = gpu_target(arch).warp_size * WARPS_PER_BLOCK
  assert gpu_opts(_ast(Tensor.empty(1 << 16).sum()), gpu_target(arch)) == [Opt(OptOps.BLOCK_REDUCE, 0, block)]
  # a reduce loop shorter than the block gets the power of two that covers it
  assert gpu_opts(_ast(Tensor.empty(4, 300).sum(1)), gpu_target(arch)) == [Opt(OptOps.BLOCK_REDUCE, 1, min(block, 512))]


def test_short_reductions_and_many_outputs_run_a_thread_per_output() -> None:
  short = gpu_opts(_ast(Tensor.empty(4, SHARED_REDUCE_MIN // 2).sum(1)), gpu_target("sm_90"))
  assert OptOps.BLOCK_REDUCE not in [o.op for o in short]
  many = gpu_opts(_ast(Tensor.empty(1 << 16, 1024).sum(1)), gpu_target("sm_90"))
  assert [o.op for o in many] == [OptOps.THREADS]


def test_nothing_to_store_or_no_loops_gets_no_opts() -> None:
  target = gpu_target("sm_90")
  assert gpu_opts(UOp.sink(), target) == []
  assert gpu_opts(_ast(Tensor.empty(1) * 2), target) == []


@pytest.mark.parametrize("arch", ["sm_90", "gfx942"])
def test_the_default_gpu_opts_compute_the_right_values(arch: str) -> None:
  x = rng.standard_normal((3, 700)).astype(np.float32)
  np.testing.assert_allclose(run_on(Tensor(x).sum(1), arch), x.sum(1), rtol=1e-4)
  np.testing.assert_allclose(run_on(Tensor(x).permute(1, 0) * 2, arch), x.T * 2, rtol=1e-6)
