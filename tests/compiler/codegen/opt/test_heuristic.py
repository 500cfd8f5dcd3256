"""compiler/codegen/opt/heuristic.py: the default CPU opts follow the kernel's shape and the target's numbers, and
the kernels they make compute what numpy does. A fixed AVX2-like target keeps the choices independent of the host."""
from dataclasses import replace
from typing import Callable

import numpy as np
import pytest
from hypothesis import given, strategies as st

from rawgrad import Tensor
from rawgrad.compiler.codegen.opt.heuristic import SHARE_SLACK, STREAM_BYTES, _tile_amount, hand_coded_opts
from rawgrad.compiler.codegen.opt.kernel import Opt, OptOps
from rawgrad.compiler.ir import UOp
from rawgrad.compiler.rangeify import create_schedule
from rawgrad.compiler.target import Target, gpu_target
from rawgrad.dtype import dtypes
from tests.compiler.codegen.kernels import last_kernel, run_item

AVX2 = Target(kind="cpu", arch="x86_64", triple="x86_64-unknown-linux-gnu", cpu="x86-64", vector_bytes=32,
              vector_registers=16, l1_bytes=32 << 10, l2_bytes=1 << 20)
rng = np.random.default_rng(17)


def _ast(tensor: Tensor) -> UOp:
  return create_schedule([tensor.uop]).items[-1].ast


def _ops(opts: list[Opt]) -> list[OptOps]:
  return [opt.op for opt in opts]


def test_an_elementwise_kernel_fills_one_machine_vector() -> None:
  # the rows and columns of a contiguous tensor are one loop (rangeify.merge_loops)
  assert hand_coded_opts(_ast(Tensor.empty(4, 8) * 2), AVX2) == [Opt(OptOps.UPCAST, 0, 8)]
  wide = replace(AVX2, vector_bytes=64)
  assert hand_coded_opts(_ast(Tensor.empty(4, 32) * 2), wide) == [Opt(OptOps.UPCAST, 0, 16)]
  # eight float64 lanes take 64 bytes: the lanes follow the element size
  assert hand_coded_opts(_ast(Tensor.empty(4, 32, dtype=dtypes.float64) * 2), wide) == [Opt(OptOps.UPCAST, 0, 8)]
  # a row broadcast keeps the loops apart: the columns are the lanes
  assert hand_coded_opts(_ast(Tensor.empty(4, 8) * Tensor.empty(8)), AVX2) == [Opt(OptOps.UPCAST, 1, 8)]


def test_small_work_stays_on_one_core_and_large_work_is_parallel() -> None:
  assert OptOps.PARALLEL not in _ops(hand_coded_opts(_ast(Tensor.empty(16, 16) * 2), AVX2))
  assert OptOps.PARALLEL in _ops(hand_coded_opts(_ast(Tensor.empty(512, 512) * 2), AVX2))


def test_outputs_larger_than_the_caches_stream() -> None:
  rows = STREAM_BYTES // (4 * 4096)
  assert _ops(hand_coded_opts(_ast(Tensor.empty(rows, 4096) * 2), AVX2))[-1] is OptOps.STREAM
  assert OptOps.STREAM not in _ops(hand_coded_opts(_ast(Tensor.empty(rows // 2, 4096) * 2), AVX2))


def test_a_sum_over_rows_vectorizes_the_reduce_loop_with_separate_accumulators() -> None:
  opts = hand_coded_opts(_ast(Tensor.empty(64, 1024).sum(1)), AVX2)
  assert opts[:2] == [Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.UNROLL, 1, 4)]


def test_a_sum_over_rows_takes_accumulators_that_divide_its_vectors() -> None:
  """25 vectors per row: 5 accumulators, not 4 (which would leave every load of the loop gated)."""
  opts = hand_coded_opts(_ast(Tensor.empty(64, 200).sum(1)), AVX2)
  assert opts[:2] == [Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.UNROLL, 1, 5)]


def test_a_full_reduction_is_grouped_across_cores() -> None:
  opts = hand_coded_opts(_ast(Tensor.empty(1 << 20).sum()), AVX2)
  assert opts[-1].op is OptOps.GROUP and OptOps.PARALLEL not in _ops(opts)


def test_a_matmul_gets_register_blocks_and_large_ones_a_packed_tile() -> None:
  opts = hand_coded_opts(_ast(Tensor.empty(256, 256) @ Tensor.empty(256, 256)), AVX2)
  assert opts[0] == Opt(OptOps.UPCAST, 1, 8) and _ops(opts).count(OptOps.UNROLL) == 2
  assert OptOps.LOCAL not in _ops(opts)
  big = hand_coded_opts(_ast(Tensor.empty(1024, 1024) @ Tensor.empty(1024, 1024)), AVX2)
  assert OptOps.TILE in _ops(big) and big[-1] == Opt(OptOps.LOCAL, 0, 2)  # B (parameter 2) is packed


def test_a_gpu_target_gets_the_gpu_opts() -> None:
  opts = hand_coded_opts(_ast(Tensor.empty(64, 1024).sum(1)), gpu_target("sm_90"))
  assert _ops(opts) == [OptOps.BLOCK_REDUCE]


def test_a_kernel_with_nothing_to_store_gets_no_opts() -> None:
  assert hand_coded_opts(UOp.sink(), AVX2) == []


@pytest.mark.parametrize("name, build, expected", [
  ("odd elementwise", lambda a, b: a * 2 + 1, lambda a, b: a * 2 + 1),
  ("row sum", lambda a, b: a.sum(1), lambda a, b: a.sum(1)),
  ("column max", lambda a, b: a.max(0), lambda a, b: a.max(0)),
  ("matmul", lambda a, b: a @ b, lambda a, b: a @ b),
])
def test_the_chosen_opts_compute_the_right_values(name: str, build: Callable[[Tensor, Tensor], Tensor],
                                                   expected: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> None:
  a, b = rng.standard_normal((37, 45)).astype(np.float32), rng.standard_normal((45, 29)).astype(np.float32)
  tensor = build(Tensor(a), Tensor(b))
  item = last_kernel(tensor)
  opts = hand_coded_opts(item.ast, AVX2)
  assert opts, name
  for cores in (1, 4):
    np.testing.assert_allclose(run_item(item, opts, cores).reshape(tensor.shape), expected(a, b), rtol=1e-4,
                               atol=1e-4)


WIDE = replace(AVX2, vector_bytes=64, vector_registers=32)  # AVX-512: 16 float lanes


@pytest.mark.parametrize("target", [AVX2, WIDE], ids=["avx2", "avx512"])
def test_a_linear_layer_packs_its_weight_rows_into_lanes_instead_of_summing_dot_products(target: Target) -> None:
  """x @ W.T (W as a linear layer stores it, outputs by inputs) reads both operands along the sum: as dot products
  each output would sum its lanes and what follows the sum (a GELU) would run one output at a time. The lanes go
  along W's rows instead, W packed; where a packed copy would serve few outputs (10 classes), they stay dot products."""
  x, w = rng.standard_normal((96, 128)).astype(np.float32), rng.standard_normal((64, 128)).astype(np.float32)
  item = last_kernel((Tensor(x) @ Tensor(w).T).relu())
  opts = hand_coded_opts(item.ast, target)
  lanes = target.vector_bytes // 4
  assert opts[0] == Opt(OptOps.UPCAST, 1, lanes) and opts[-1] == Opt(OptOps.LOCAL, 0, 2), opts  # W is parameter 2
  for cores in (1, 4):
    np.testing.assert_allclose(run_item(item, opts, cores).reshape(96, 64), np.maximum(x @ w.T, 0), rtol=1e-4,
                               atol=1e-4)
  few = hand_coded_opts(_ast(Tensor.empty(128, 576) @ Tensor.empty(10, 576).T), target)
  assert few[0] == Opt(OptOps.UPCAST, 2, lanes) and OptOps.LOCAL not in _ops(few), few
  # a W larger than the packed stage (a language model's head) is packed a tile of its rows at a time
  x, w = rng.standard_normal((48, 128)).astype(np.float32), rng.standard_normal((2048, 128)).astype(np.float32)
  item = last_kernel(Tensor(x) @ Tensor(w).T)
  opts = hand_coded_opts(item.ast, target)
  assert opts[0] == Opt(OptOps.UPCAST, 1, lanes) and OptOps.TILE in _ops(opts) and opts[-1] == Opt(OptOps.LOCAL, 0, 2)
  for cores in (1, 4):
    np.testing.assert_allclose(run_item(item, opts, cores).reshape(48, 2048), x @ w.T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target", [AVX2, WIDE], ids=["avx2", "avx512"])
def test_attention_scores_over_short_heads_gather_keys_instead_of_summing_dot_products(target: Target) -> None:
  """q @ k.T with q and k slices of one buffer (a fused qkv projection) over heads of 32: too short a sum to pack
  k for, and k cannot be packed apart from q. The lanes go along the keys, each gathered vector of k serving a
  block of query rows, instead of dot products that each add up their lanes."""
  heads, context, width = 2, 32, 32
  qkv = rng.standard_normal((heads, context, 3 * width)).astype(np.float32)
  t = Tensor(qkv)
  item = last_kernel(t[:, :, :width] @ t[:, :, width:2 * width].transpose(1, 2))
  opts = hand_coded_opts(item.ast, target)
  lanes = target.vector_bytes // 4
  assert opts[0] == Opt(OptOps.UPCAST, 2, lanes) and OptOps.LOCAL not in _ops(opts), opts  # the keys' loop
  assert any(opt.op is OptOps.UNROLL and opt.axis == 1 and opt.amount >= 4 for opt in opts), opts  # query rows
  expected = qkv[:, :, :width] @ qkv[:, :, width:2 * width].transpose(0, 2, 1)
  for cores in (1, 4):
    np.testing.assert_allclose(run_item(item, opts, cores).reshape(heads, context, context), expected, rtol=1e-4,
                               atol=1e-4)


def _embedding_gradient(rows: int, width: int, picks: int) -> tuple[Tensor, np.ndarray]:
  index = rng.integers(0, rows, picks).astype(np.int32)
  upstream = rng.standard_normal((picks, width)).astype(np.float32)
  weight = Tensor(np.zeros((rows, width), np.float32), requires_grad=True)
  (weight[Tensor(index)] * Tensor(upstream)).sum().backward()
  expected = np.zeros((rows, width), np.float32)
  np.add.at(expected, index, upstream)
  return weight.grad, expected


def test_a_scatter_keeps_its_loop_order_and_adds_long_rows_in_two_halves() -> None:
  """rangeify.scatter_sum's kernels: the terms stay the outer loop; a long row is two halves on two cores, a short
  one is left as it is; rows whose terms are contiguous (scatter_add along dim 1) go outermost, on all cores."""
  gradient, expected = _embedding_gradient(1000, 256, 512)
  item = last_kernel(gradient)  # the fill runs first
  opts = hand_coded_opts(item.ast, AVX2)
  assert opts == [Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.TILE, 1, 16), Opt(OptOps.PARALLEL, 0)], opts
  for cores in (1, 2, 4):
    np.testing.assert_array_equal(run_item(item, opts, cores, fill=0.0).reshape(1000, 256), expected)
  narrow, _ = _embedding_gradient(20000, 32, 4096)
  assert hand_coded_opts(last_kernel(narrow).ast, AVX2) == []
  index = rng.integers(0, 1024, (1024, 256)).astype(np.int32)
  along_rows = Tensor.zeros(1024, 1024).contiguous().scatter_add(1, Tensor(index), Tensor.ones(1024, 256))
  assert hand_coded_opts(last_kernel(along_rows).ast, AVX2) == [Opt(OptOps.PARALLEL, 0)]


def _conv(x: np.ndarray, w: np.ndarray, padding: int) -> np.ndarray:
  x = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
  windows = np.lib.stride_tricks.sliding_window_view(x, w.shape[2:], axis=(2, 3))  # n, cin, oh, ow, kh, kw
  return np.einsum("nchwij,ocij->nohw", windows, w)


@pytest.mark.parametrize("size, padding", [(8, 0), (7, 1)])
def test_a_convolution_over_narrow_images_vectorizes_its_output_channels(size: int, padding: int) -> None:
  """Rows 6 or 7 wide would fill 16 lanes less than half; the 32 output channels fill two vectors. The weights move
  with the lanes 72 floats apart, so they are packed once per core, and the stores scatter their lanes."""
  x = rng.standard_normal((3, 8, size, size)).astype(np.float32)
  w = rng.standard_normal((32, 8, 3, 3)).astype(np.float32)
  item = last_kernel(Tensor(x).conv2d(Tensor(w), padding=padding))
  opts = hand_coded_opts(item.ast, WIDE)
  weights = next(node.arg for node in item.ast.toposort
                 if node.op.name == "DEFINE_GLOBAL" and node.dtype.size == w.size)
  assert opts[0] == Opt(OptOps.UPCAST, 1, 16) and opts[-1] == Opt(OptOps.LOCAL, 0, weights), opts
  # the vector axis is copied once more and the rows of pixels fill the registers in equal blocks
  assert Opt(OptOps.UNROLL, 1, 2) in opts and Opt(OptOps.UNROLL, 3, size + 2 * padding - 2) in opts, opts
  for cores in (1, 4):
    np.testing.assert_allclose(run_item(item, opts, cores).reshape(3, 32, -1), _conv(x, w, padding).reshape(3, 32, -1),
                               rtol=1e-4, atol=1e-4)
  # with AVX2's 8 lanes rows of 8 fill the vectors, but each step of the window slides them by one pixel: packed
  # output channels still win. A 1x1 convolution's rows do not slide: they stay the vector axis
  rows_of_8 = create_schedule([Tensor.empty(3, 8, 10, 10).conv2d(Tensor.empty(32, 8, 3, 3)).uop]).items[-1]
  assert OptOps.LOCAL in _ops(hand_coded_opts(rows_of_8.ast, AVX2))
  pointwise = create_schedule([Tensor.empty(3, 72, 8, 8).conv2d(Tensor.empty(32, 72, 1, 1)).uop]).items[-1]
  assert OptOps.LOCAL not in _ops(hand_coded_opts(pointwise.ast, AVX2))


def test_a_short_reduction_keeps_the_contiguous_vector_axis() -> None:
  """With 9 multiply-adds per output, scattering the stored lanes would cost more than the lanes save."""
  item = create_schedule([Tensor.empty(3, 1, 8, 8).conv2d(Tensor.empty(32, 1, 3, 3)).uop]).items[-1]
  opts = hand_coded_opts(item.ast, WIDE)
  assert opts[0] == Opt(OptOps.UPCAST, 3, 8) and OptOps.LOCAL not in _ops(opts), opts


@pytest.mark.parametrize("target", [AVX2, WIDE], ids=["avx2", "avx512"])
def test_an_input_gradient_read_channels_last_blocks_over_the_images(target: Target) -> None:
  """The output gradient is read where it is, channels last, its padding a view: register blocks along a row of
  pixels would need a bound of the window's columns for each pixel, so they take images instead. With AVX2's 8 lanes
  the 8-pixel rows fill the vectors as well as the 32 channels do, but they would gather the channels-last gradient
  lane by lane: the channels are the lanes. AVX-512 takes the 8 images that divide the batch (16 accumulators);
  AVX2's 4 that divide it would be exactly its FMA units x latency accumulators, so it takes 6 and codegen peels the
  last 4 off; the image rows run in parallel, not the blocks of images (the last slice would also run the rest)."""
  item, expected = _input_gradient((64, 32, 8, 8), (32, 32, 3, 3))
  opts = hand_coded_opts(item.ast, target)
  lanes = target.vector_bytes // 4
  assert opts[0] == Opt(OptOps.UPCAST, 1, lanes) and OptOps.LOCAL in _ops(opts), opts
  assert Opt(OptOps.UNROLL, 0, 8 if target is WIDE else 6) in opts, opts
  if target is AVX2: assert Opt(OptOps.PARALLEL, 2, 0) in opts, opts  # [image blocks, channel blocks, rows, columns]
  # the window's loops (cut to the image) outside, the channels' loop (32 iterations) innermost
  channels = 4 if target is AVX2 else 3  # AVX-512's 32 channels are its two vectors: no loop over channel blocks
  assert opts[-4:-2] == [Opt(OptOps.SWAP, channels, channels + 1), Opt(OptOps.SWAP, channels + 1, channels + 2)], opts
  for cores in (1, 3):
    np.testing.assert_allclose(run_item(item, opts, cores).reshape(expected.shape), expected, rtol=1e-4, atol=1e-4)


def _input_gradient(x_shape: tuple[int, ...], w_shape: tuple[int, ...]):
  """The kernel of an unpadded convolution's input gradient for a random output gradient, and numpy's values: the
  output gradient convolved with the flipped kernel, in/out channels swapped, padded by the kernel's size less one."""
  x, w = rng.standard_normal(x_shape).astype(np.float32), rng.standard_normal(w_shape).astype(np.float32)
  k = w_shape[-1]
  gradient = rng.standard_normal((x_shape[0], w_shape[0], x_shape[2] - k + 1, x_shape[3] - k + 1)).astype(np.float32)
  source = Tensor(x)
  item = last_kernel(source.conv2d(Tensor(w)).gradient(source, gradient=Tensor(gradient))[0])
  return item, _conv(gradient, w.transpose(1, 0, 2, 3)[:, :, ::-1, ::-1], k - 1)


def test_a_pooling_window_is_unrolled_under_its_output_columns_as_lanes() -> None:
  """A 2x2 max pooling reads every other input column along its output columns: with the window unrolled, its two
  columns' lanes are one run of memory (loaded whole and shuffled), so the output columns are the lanes, not the
  window's 2 columns (which gathered the rows)."""
  x = rng.standard_normal((2, 4, 20, 20)).astype(np.float32)
  item = last_kernel(Tensor(x).max_pool2d(2))
  # loops: the output rows of every channel of every image (one loop: they walk both images as one), the columns;
  # the window's rows and columns
  opts = hand_coded_opts(item.ast, AVX2)
  assert opts == [Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.UNROLL, 3, 0), Opt(OptOps.UNROLL, 2, 0)], opts
  expected = x.reshape(2, 4, 10, 2, 10, 2).max((3, 5))
  np.testing.assert_array_equal(run_item(item, opts).reshape(expected.shape), expected)


def test_a_copy_to_channels_last_unrolls_the_columns_it_reads_in_rows() -> None:
  """The store is contiguous along the channels (the lanes), the load 400 elements apart along them but contiguous
  along the columns: the columns are unrolled by a pair, which expand.py loads as rows and transposes."""
  x = rng.standard_normal((2, 16, 20, 20)).astype(np.float32)
  item = last_kernel(Tensor(x).relu().permute(0, 2, 3, 1).contiguous())
  opts = hand_coded_opts(item.ast, AVX2)  # loops: images, pixels (rows and columns, one run in both), channels
  assert opts[:2] == [Opt(OptOps.UPCAST, 2, 8), Opt(OptOps.UNROLL, 1, 2)], opts
  np.testing.assert_array_equal(run_item(item, opts), np.maximum(x, 0).transpose(0, 2, 3, 1).reshape(-1))


@pytest.mark.parametrize("target", [AVX2, WIDE], ids=["avx2", "avx512"])
def test_a_transposed_matrix_is_copied_in_square_blocks(target: Target) -> None:
  """Both loops long: a vector of rows is loaded and transposed per block, where the channels-last copy above (16
  channels) keeps its pairs."""
  x = rng.standard_normal((128, 96)).astype(np.float32)
  item = last_kernel(Tensor(x).T.contiguous())
  opts = hand_coded_opts(item.ast, target)
  lanes = target.vector_bytes // 4
  assert opts[:2] == [Opt(OptOps.UPCAST, 1, lanes), Opt(OptOps.UNROLL, 0, lanes)], opts
  for cores in (1, 4): np.testing.assert_array_equal(run_item(item, opts, cores), x.T.reshape(-1))


def test_a_weight_gradients_window_row_is_one_register_block() -> None:
  """A single-channel 5x5 convolution's weight gradient, output channels last: each image pixel's 5 neighbours are
  broadcast against 2 vectors of channels. Its broadcasts slide along the image's columns, longer than the window,
  so they are loaded next to their multiply-adds (not all live at once): the whole window row, 5 x 2 accumulators
  within AVX2's 16 registers (3 x 2 when every broadcast was counted live: 0.54 against 0.47 ms in MNIST)."""
  x = rng.standard_normal((4, 1, 16, 16)).astype(np.float32)
  w = rng.standard_normal((16, 1, 5, 5)).astype(np.float32)
  g = rng.standard_normal((4, 16, 12, 12)).astype(np.float32)
  weight = Tensor(w, requires_grad=True)
  (Tensor(x).conv2d(weight) * Tensor(g)).sum().backward()
  item = last_kernel(weight.grad, "r_")  # the sum; a copy of the weight's layout follows it
  opts = hand_coded_opts(item.ast, AVX2)  # loops: window rows, window columns, channels; the sums'
  assert opts[:3] == [Opt(OptOps.UPCAST, 2, 8), Opt(OptOps.UNROLL, 1, 5), Opt(OptOps.UNROLL, 1, 2)], opts
  windows = np.lib.stride_tricks.sliding_window_view(x[:, 0], (5, 5), axis=(1, 2))  # (4, 12, 12, 5, 5)
  expected = np.einsum("nhwij,nchw->ijc", windows, g)
  np.testing.assert_allclose(run_item(item, opts).reshape(5, 5, 16), expected, rtol=1e-4, atol=1e-3)


def test_a_row_of_three_vectors_is_copied_whole() -> None:
  """A single-channel convolution's 24-pixel rows are three AVX2 vectors: the block copies the vector axis three
  times, not twice with a third copy peeled off."""
  x = rng.standard_normal((2, 1, 28, 28)).astype(np.float32)
  w = rng.standard_normal((8, 1, 5, 5)).astype(np.float32)
  item = last_kernel(Tensor(x).conv2d(Tensor(w)))
  opts = hand_coded_opts(item.ast, AVX2)
  assert opts[0] == Opt(OptOps.UPCAST, 3, 8) and Opt(OptOps.UNROLL, 3, 3) in opts, opts
  np.testing.assert_allclose(run_item(item, opts).reshape(2, 8, 24, 24), _conv(x, w, 0), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target", [AVX2, WIDE], ids=["avx2", "avx512"])
def test_a_single_channel_input_gradient_sums_the_channels_in_lanes(target: Target) -> None:
  """The input gradient of a one-channel convolution: along the output's rows every lane would gather from the
  channels-last output gradient; along its channels only the small weights are gathered, so the channels are the
  lanes. The weights do not move along a row: a block of pixels shares each loaded weight vector, as many pixels as
  the registers hold beside two accumulators each."""
  item, expected = _input_gradient((4, 1, 14, 14), (32, 1, 5, 5))
  opts = hand_coded_opts(item.ast, target)
  lanes = target.vector_bytes // 4
  assert opts[0] == Opt(OptOps.UPCAST, 3, lanes), opts  # the output gradient's channels
  # rows of 14 pixels: (32 - 2 - 2) // 2 = 14 pixels with AVX-512; 6 with AVX2 (none from 4 to 6 divides 14)
  assert Opt(OptOps.UNROLL, 2, 14 if target is WIDE else 6) in opts, opts
  for cores in (1, 3):
    np.testing.assert_allclose(run_item(item, opts, cores).reshape(expected.shape), expected, rtol=1e-4, atol=1e-4)


def test_a_convolution_blocks_image_rows_when_its_window_limits_a_row_of_pixels() -> None:
  """A 5-wide window slides along 20 pixels: LLVM unrolls the window and keeps every broadcast of a row block live,
  which AVX2's 16 registers hold for 4 pixels x 2 vectors (8 accumulators). 5 image rows x 2 vectors (10) make the
  better block there; AVX-512's 10 pixels x 2 vectors are as good as any, and stay."""
  x = rng.standard_normal((2, 32, 24, 24)).astype(np.float32)
  w = rng.standard_normal((32, 32, 5, 5)).astype(np.float32)
  item = last_kernel(Tensor(x).conv2d(Tensor(w)))
  narrow, wide = hand_coded_opts(item.ast, AVX2), hand_coded_opts(item.ast, WIDE)
  assert Opt(OptOps.UNROLL, 2, 5) in narrow and Opt(OptOps.UNROLL, 1, 2) in narrow, narrow
  assert Opt(OptOps.UNROLL, 3, 10) in wide, wide
  expected = _conv(x, w, 0)
  np.testing.assert_allclose(run_item(item, narrow, 2).reshape(expected.shape), expected, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("target", [AVX2, WIDE], ids=["avx2", "avx512"])
def test_a_transposed_matmuls_broadcast_rows_are_packed_where_they_fill_little_of_a_line(target: Target) -> None:
  """x^T dy (a linear layer's weight gradient): the block's rows of x^T are 6 (AVX2) or 8 (this AVX-512 target, 8 L1
  ways) neighbours in a row of x, and each step of the sum jumps to the next row of x. AVX2's 24 bytes are under half
  of the cache line each step reads: they are copied k-major inside the loop over row blocks (x^T dy at 512 x 1024 x
  1024, AVX2 on a Zen 5: 177 -> 233 GFLOPS). AVX-512's 32 or more stay where they are (its 12 rows packed ran 351
  instead of 512 GFLOPS on the same machine)."""
  x, dy = rng.standard_normal((128, 192)).astype(np.float32), rng.standard_normal((128, 128)).astype(np.float32)
  item = last_kernel(Tensor(x).T @ Tensor(dy))
  small = replace(target, l2_bytes=64 << 10)  # dy's panel (64 KB) is then packed a tile at a time
  opts = hand_coded_opts(item.ast, small)
  assert Opt(OptOps.LOCAL, 0, 2) in opts, opts
  packs_rows = [opt for opt in opts if opt.op is OptOps.LOCAL and opt.amount == 1]
  assert packs_rows == ([Opt(OptOps.LOCAL, 1, 1)] if target is AVX2 else []), opts
  for cores in (1, 3):
    np.testing.assert_allclose(run_item(item, opts, cores, fill=np.nan).reshape(192, 128), x.T @ dy, rtol=1e-4,
                               atol=1e-3)


def test_a_transposed_matmul_with_packed_rows_is_blocked_along_k_before_its_tile() -> None:
  """AVX2's x^T dy over a long sum: K is cut into blocks first (ACCUMULATE), so dy's packed tile holds one block of K
  (and spans more columns: at 2048 x 1024 x 1024 on a Zen 5, 189 -> 242 GFLOPS, numpy 255); dy is packed once per
  block, x^T's rows once per row block inside it."""
  x, dy = rng.standard_normal((1024, 192)).astype(np.float32), rng.standard_normal((1024, 256)).astype(np.float32)
  item = last_kernel(Tensor(x).T @ Tensor(dy))
  opts = hand_coded_opts(item.ast, replace(AVX2, l2_bytes=256 << 10))  # a block of dy (256 KB) takes 2 tiles
  ops = _ops(opts)
  assert Opt(OptOps.ACCUMULATE, 2, 256) in opts and ops.index(OptOps.ACCUMULATE) < ops.index(OptOps.PARALLEL), opts
  assert opts[-2:] == [Opt(OptOps.LOCAL, 1, 2), Opt(OptOps.LOCAL, 2, 1)], opts  # [parallel, blocks, rows, columns]
  for cores in (1, 2):
    np.testing.assert_allclose(run_item(item, opts, cores, fill=np.nan).reshape(192, 256), x.T @ dy, rtol=1e-4,
                               atol=2e-3)


@pytest.mark.parametrize("cores, blocked", [(2, False), (1, True)])
def test_a_transposed_matmul_read_once_a_core_is_not_blocked(cores: int, blocked: bool) -> None:
  """A language model's head, x^T dy of 2048x2048 by 2048x128: two tiles of columns. On two cores each reads x once
  from memory, and blocks of the sum would only add passes over the output (AVX-512: 8.6 ms in blocks of 256, 6.4
  ms whole); on one core x is read again for its second tile, and the sum is blocked."""
  ast = _ast(Tensor.empty(2048, 2048).T @ Tensor.empty(2048, 128))
  opts = hand_coded_opts(ast, replace(WIDE, threads_in_flight=cores))
  assert (OptOps.ACCUMULATE in _ops(opts)) == blocked, opts
  assert OptOps.TILE in _ops(opts) and opts[-1] == Opt(OptOps.LOCAL, 0, 2), opts


def busiest_share(size: int, amount: int, cores: int) -> int:
  """Iterations the busiest core runs when each takes whole tiles of `amount`."""
  tiles = -(-size // amount)
  return -(-tiles // cores) * amount


@pytest.mark.parametrize("size, limit, cores, amount", [
  (63, 8, 2, 8),    # AVX2's 1000x1000 matmul: 8 tiles, 4 a core (of 7 iterations: 9 tiles, 5 on one core)
  (128, 4, 2, 4),   # 2048x2048: 32 tiles
  (64, 8, 16, 4),   # 16 cores: 16 tiles of 4, not 8 of 8 with half the cores idle
  (63, 8, 1, 7),    # one core: whole tiles
  (21, 6, 2, 1),    # AVX2's 500x500: 21 tiles of 1 (tiles of 2 to 6 leave one core 12 of the 21)
  (3, 4, 2, None),  # one core runs 2 of 3 however they are cut
])
def test_tiles_share_out_between_cores(size: int, limit: int, cores: int, amount: int | None) -> None:
  assert _tile_amount(size, limit, cores) == amount


@given(st.integers(1, 4096), st.integers(1, 64), st.integers(1, 64))
def test_a_tile_is_the_largest_fair_one(size: int, limit: int, cores: int) -> None:
  amount = _tile_amount(size, limit, cores)
  fair = [a for a in range(1, limit + 1) if busiest_share(size, a, cores) <= SHARE_SLACK * size / cores]
  if amount is None: assert not fair
  else: assert amount in fair and 2 * amount > max(fair)
