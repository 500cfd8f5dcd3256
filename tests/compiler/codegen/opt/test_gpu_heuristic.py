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
from tests.compiler.codegen.test_gpu import run_item, run_on

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
  Co): each thread of a block takes 8 input channels x 8 output channels, so each value loaded feeds 8 accumulators
  (H100: 12.1 ms with one output per thread, 2.5 ms with 8 x 4, 1.8 ms with 8 x 8); the block shares the batch
  loop."""
  ast = _weight_gradient_ast(128, 32, 32, 24, 5)
  assert ast.arg == "r_1_32_5_5_32_128_20_20"
  assert gpu_opts(ast, gpu_target("sm_90")) == [Opt(OptOps.UNROLL, 0, 8), Opt(OptOps.UNROLL, 3, 8),
                                                 Opt(OptOps.BLOCK_REDUCE, 4, 128)]
  # the first convolution's (one input channel, 800 outputs): 8 output channels, each image value feeding 8
  # accumulators (0.606 -> 0.344 ms); its kernel sizes, 5, divide no block
  assert gpu_opts(_weight_gradient_ast(128, 1, 32, 28, 5), gpu_target("sm_90")) == \
    [Opt(OptOps.UNROLL, 2, 8), Opt(OptOps.BLOCK_REDUCE, 3, 128)]
  # with a batch of 16, a block of 8 would leave too few threads: one output each
  assert [o.op for o in gpu_opts(_weight_gradient_ast(16, 1, 32, 28, 5), gpu_target("sm_90"))] == \
    [OptOps.BLOCK_REDUCE]


def test_a_register_block_accumulates_in_one_loop_over_the_reduction() -> None:
  """The block's 64 outputs are summed in one pass over the shared reduction, 64 accumulators, each loaded value
  feeding 8 of them. (Each partial used to get a loop of its own, a pass over the inputs each: 12.2 ms on the H100
  for this kernel with 32 of them, 2.5 ms in one pass.)"""
  from rawgrad.compiler.codegen.lower import lower_kernel
  from rawgrad.compiler.ir import Ops
  ast = _weight_gradient_ast(128, 32, 32, 24, 5)
  target = gpu_target("sm_90")
  program = lower_kernel(ast, tuple(gpu_opts(ast, target)), target).program
  loops = [node for node in program if node.op is Ops.RANGE]
  assert len(loops) == 4, [node.arg for node in loops]   # the batch's share, rows, columns; the partials' combine
  assert sum(node.op is Ops.DEFINE_REG for node in program[:program.index(loops[0])]) == 64
  assert sum(node.op is Ops.MULACC for node in program) == 64
  first_end = next(i for i, node in enumerate(program) if node.op is Ops.END)
  body = program[program.index(loops[0]):first_end]
  assert sum(node.op is Ops.LOAD and node.src[0].op is Ops.INDEX and node.src[0].src[0].op is Ops.DEFINE_GLOBAL
             for node in body) == 8 + 8


def test_register_blocks_of_a_shared_reduction_compute_the_right_values(monkeypatch) -> None:
  from rawgrad.compiler.codegen.opt import gpu_heuristic
  from tests.compiler.codegen.test_gpu import run_item, weight_gradient_kernel
  monkeypatch.setattr(gpu_heuristic, "SHARED_BLOCK_THREADS", 1 << 30)   # blocks however few threads are left
  item, expected = weight_gradient_kernel(4, 8, 8, 12, 3)
  opts = gpu_opts(item.ast, gpu_target("sm_90"))
  assert [o.op for o in opts] == [OptOps.UNROLL, OptOps.UNROLL, OptOps.BLOCK_REDUCE], opts
  np.testing.assert_allclose(run_item(item, "sm_90", opts), expected, rtol=1e-4, atol=1e-4)


def _input_gradient(n: int, ci: int, co: int, size: int, k: int):
  """The kernel summing a convolution's input gradient (its inputs computed), and its values by numpy."""
  from rawgrad.engine.realize import run_schedule
  from tests.compiler.codegen.test_gpu import rand
  x, w, g = rand(n, ci, size, size, seed=1), rand(co, ci, k, k, seed=2), rand(n, co, size - k + 1, size - k + 1, seed=3)
  image = Tensor(x, requires_grad=True)
  (image.conv2d(Tensor(w)) * Tensor(g)).sum().backward()
  items = create_schedule([image.grad.uop]).items
  index = next(i for i, item in enumerate(items) if item.ast.arg.startswith("r_"))
  run_schedule(items[:index])
  padded = np.pad(g, ((0, 0), (0, 0), (k - 1, k - 1), (k - 1, k - 1)))
  windows = np.lib.stride_tricks.sliding_window_view(padded, (k, k), axis=(2, 3))   # n, co, h, w, k, k
  return items[index], np.einsum("nohwab,ocab->nchw", windows, w[:, :, ::-1, ::-1]).reshape(-1)


def test_outputs_that_cannot_be_vectors_take_a_register_block_of_channels() -> None:
  """A 10 x 10 image's columns are no multiple of the vector width: the input gradient of MNIST's third convolution
  unrolls 8 of its channels instead, each gradient value loaded feeding 8 accumulators (H100: 0.747 -> 0.194 ms; the
  fourth convolution's forward, 6 x 6, 0.157 -> 0.072 ms)."""
  image = Tensor.empty(128, 32, 10, 10, device="SIM", requires_grad=True)
  (image.conv2d(Tensor.empty(64, 32, 3, 3, device="SIM")) * Tensor.empty(128, 64, 8, 8, device="SIM")).sum().backward()
  ast = _ast(image.grad)
  assert ast.arg == "r_128_32_10_10_64_3_3"
  assert gpu_opts(ast, gpu_target("sm_90")) == [Opt(OptOps.UNROLL, 1, 8), Opt(OptOps.THREADS, 2, 16),
                                                 Opt(OptOps.THREADS, 2, 16)]
  forward = _ast(Tensor.empty(128, 64, 8, 8, device="SIM").conv2d(Tensor.empty(64, 64, 3, 3, device="SIM")))
  assert gpu_opts(forward, gpu_target("gfx1100"))[0] == Opt(OptOps.UNROLL, 1, 8)
  # too few outputs for a thread per block of 8: one output each
  small = Tensor.empty(4, 8, 10, 10, device="SIM").conv2d(Tensor.empty(8, 8, 3, 3, device="SIM"))
  assert all(opt.op is OptOps.THREADS for opt in gpu_opts(_ast(small), gpu_target("sm_90")))


@pytest.mark.parametrize("arch", ["sm_90", "gfx1100"])
def test_a_register_block_of_channels_computes_the_right_values(arch: str) -> None:
  item, expected = _input_gradient(2, 16, 8, 10, 3)
  opts = [Opt(OptOps.UNROLL, 1, 8), Opt(OptOps.THREADS, 2, 16), Opt(OptOps.THREADS, 2, 16)]
  np.testing.assert_allclose(run_item(item, arch, opts), expected, rtol=1e-4, atol=1e-4)

