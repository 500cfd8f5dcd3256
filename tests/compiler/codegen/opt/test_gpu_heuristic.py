"""compiler/codegen/opt/gpu_heuristic.py: blocks of eight warps of the target's width, one thread per output or a
block per reduction with few outputs, and the values those opts compute (through the GPU program interpreter)."""
import math

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


def _threads(opts: list[Opt]) -> int:
  return math.prod(opt.amount for opt in opts if opt.op is OptOps.THREADS)


@pytest.mark.parametrize("arch", ["sm_90", "gfx942"])
@pytest.mark.parametrize("shape", [(2048, 4096), (64, 8), (3, 1000)])
def test_every_output_kernel_fills_a_block_of_eight_warps(arch: str, shape: tuple[int, int]) -> None:
  """A short contiguous loop is topped up from the next loop out; a vector of outputs per thread is one access."""
  target = gpu_target(arch)
  opts = gpu_opts(_ast(Tensor.empty(*shape) * 2), target)
  assert _threads(opts) == target.warp_size * WARPS_PER_BLOCK
  assert all(opt.amount * 4 <= target.vector_bytes for opt in opts if opt.op is OptOps.UPCAST)


def test_a_transposed_copy_is_threaded_like_a_plain_one() -> None:
  """The store decides: the transposed copy's output is contiguous along its last axis, as a plain copy's is along
  its one loop (the rows and columns of a plain copy are merged; the transposed read keeps them apart)."""
  plain = gpu_opts(_ast(Tensor.empty(512, 4096) * 1), gpu_target("sm_90"))
  transposed = gpu_opts(_ast(Tensor.empty(4096, 512).permute(1, 0).contiguous()), gpu_target("sm_90"))
  assert plain == [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.THREADS, 0, 256)]
  assert transposed == [Opt(opt.op, 1, opt.amount) for opt in plain]


@pytest.mark.parametrize("arch", ["sm_90", "gfx942"])
def test_a_reduction_with_few_outputs_shares_a_block(arch: str) -> None:
  block = gpu_target(arch).warp_size * WARPS_PER_BLOCK
  assert gpu_opts(_ast(Tensor.empty(1 << 16).sum()), gpu_target(arch)) == [Opt(OptOps.BLOCK_REDUCE, 0, block)]
  # a reduce loop shorter than the block gets the power of two that covers it
  assert gpu_opts(_ast(Tensor.empty(4, 300).sum(1)), gpu_target(arch)) == [Opt(OptOps.BLOCK_REDUCE, 1, min(block, 512))]


def test_short_reductions_and_many_outputs_run_a_thread_per_output() -> None:
  for shape in ((4, SHARED_REDUCE_MIN // 2), (1 << 18, 1024)):  # outputs for every thread the GPU runs
    opts = gpu_opts(_ast(Tensor.empty(*shape).sum(1)), gpu_target("sm_90"))
    assert OptOps.BLOCK_REDUCE not in [o.op for o in opts] and OptOps.THREADS in [o.op for o in opts], shape


def test_nothing_to_store_or_no_loops_gets_no_opts() -> None:
  target = gpu_target("sm_90")
  assert gpu_opts(UOp.sink(), target) == []
  assert gpu_opts(_ast(Tensor.empty(1) * 2), target) == []


@pytest.mark.parametrize("arch", ["sm_90", "gfx942"])
def test_the_default_gpu_opts_compute_the_right_values(arch: str) -> None:
  x = rng.standard_normal((3, 700)).astype(np.float32)
  np.testing.assert_allclose(run_on(Tensor(x).sum(1), arch), x.sum(1), rtol=1e-4)
  np.testing.assert_allclose(run_on(Tensor(x).permute(1, 0) * 2, arch), x.T * 2, rtol=1e-6)


def _weight_gradient_ast(n: int, ci: int, co: int, size: int, k: int, device: str = "SIM") -> UOp:
  weight = Tensor.empty(co, ci, k, k, device=device, requires_grad=True)
  (Tensor.empty(n, ci, size, size, device=device).conv2d(weight) * Tensor.empty(n, co, size - k + 1, size - k + 1,
                                                                                   device=device)).sum().backward()
  return max((item.ast for item in create_schedule([weight.grad.uop]).items), key=lambda ast: len(ast.toposort))


def test_a_weight_gradient_shares_its_reduction_in_register_blocks() -> None:
  """MNIST's second convolution's weight gradient (25600 outputs, each a sum over 128x20x20, summed as Ci, kh, kw,
  Co): each thread of a block takes 8 input channels x 4 output channels, so each gradient value loaded feeds 8
  accumulators and each image value 4 (12.1 ms on the H100 with one output per thread); the block shares the batch
  loop."""
  ast = _weight_gradient_ast(128, 32, 32, 24, 5)
  assert ast.arg == "r_1_32_5_5_32_128_20_20"
  assert gpu_opts(ast, gpu_target("sm_90")) == [Opt(OptOps.UNROLL, 0, 8), Opt(OptOps.UNROLL, 3, 4),
                                                 Opt(OptOps.BLOCK_REDUCE, 4, 128)]
  # the first convolution's (one input channel, 800 outputs) would leave too few threads: one output each
  assert [o.op for o in gpu_opts(_weight_gradient_ast(128, 1, 32, 28, 5), gpu_target("sm_90"))] == \
    [OptOps.BLOCK_REDUCE]


def test_register_blocks_of_a_shared_reduction_compute_the_right_values(monkeypatch) -> None:
  from rawgrad.compiler.codegen.opt import gpu_heuristic
  from tests.compiler.codegen.test_gpu import run_item, weight_gradient_kernel
  monkeypatch.setattr(gpu_heuristic, "SHARED_BLOCK_THREADS", 1 << 30)   # blocks however few threads are left
  item, expected = weight_gradient_kernel(4, 8, 8, 12, 3)
  opts = gpu_opts(item.ast, gpu_target("sm_90"))
  assert [o.op for o in opts] == [OptOps.UNROLL, OptOps.UNROLL, OptOps.BLOCK_REDUCE], opts
  np.testing.assert_allclose(run_item(item, "sm_90", opts), expected, rtol=1e-4, atol=1e-4)
