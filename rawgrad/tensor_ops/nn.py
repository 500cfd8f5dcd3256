"""Tensor operations: neural-network functions with torch.nn.functional's names, argument order and semantics.

Everything here is built from the core operations of tensor.py, so it is lazy, fuses, and is differentiable.
Convolution and pooling read the input through a *windows view* made of movement ops only (pad, reshape, expand,
shrink, permute): the scheduler turns it into the index `x[oy*stride + ky*dilation]`, and a convolution becomes one
multiply-and-sum kernel with no im2col buffer. Its gradients are one kernel each as well: for the weight a sum over
(batch, out) positions, for the input a sum over (out_channels, kernel) positions.

Running statistics are not this module's business: batch_norm normalizes with the batch's or the given statistics,
and nn.BatchNorm computes the batch statistics itself (to update its running ones) and calls `batchnorm`.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

from rawgrad.compiler.gradient import set_custom_gradient
from rawgrad.compiler.ir import Ops, UOp
from rawgrad.dtype import dtypes
from rawgrad.errors import ShapeError
from rawgrad.helpers import prod
from rawgrad.tensor_ops.bounds import check_index_values
from rawgrad.tensor_ops.helpers import TensorBase, resolve_axis
from rawgrad.tensor_ops.reduce import log_softmax as _log_softmax
from rawgrad.tensor_ops.reduce import softmax as _softmax

if TYPE_CHECKING:
  from rawgrad.tensor import Tensor

Size = int | Sequence[int]
REDUCTIONS = ("none", "mean", "sum")


# *** argument handling ***

def _tuple(value: Size, count: int, name: str) -> tuple[int, ...]:
  """An int or a sequence of `count` ints as a tuple of `count` ints."""
  values = (value,) * count if isinstance(value, int) else tuple(value)
  if len(values) != count or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
    raise ValueError(f"{name} must be an int or {count} ints, got {value!r}")
  return values


def _positive(values: tuple[int, ...], name: str) -> tuple[int, ...]:
  if any(v < 1 for v in values): raise ValueError(f"{name} must be positive, got {values}")
  return values


def _reduce_loss(loss: Tensor, reduction: str) -> Tensor:
  if reduction == "none": return loss
  if reduction == "sum": return loss.sum()
  if reduction == "mean": return loss.mean()
  raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")


def _check_reduction(reduction: str) -> None:
  if reduction not in REDUCTIONS: raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")


# *** windows: the view convolution and pooling read ***

def _output_size(size: int, kernel: int, stride: int, dilation: int, ceil_mode: bool = False) -> int:
  span = dilation * (kernel - 1) + 1
  return (size - span + (stride - 1 if ceil_mode else 0)) // stride + 1


def _windows(x: Tensor, kernel: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...],
             batch: tuple[int, ...] | None = None) -> Tensor:
  """The sliding windows of the last len(kernel) axes: (*leading, *spatial) -> (*batch, *out, *kernel) where
  out[o][k] = x[o*stride + k*dilation], the leading axes broadcast to `batch`. Built from movement ops only, so it
  costs no memory and no kernel of its own."""
  leading, spatial = x.shape[:-len(kernel)], x.shape[-len(kernel):]
  batch = tuple(leading) if batch is None else batch
  if all(k <= s for k, s in zip(kernel, stride)) and all(d == 1 for d in dilation):
    windows = _disjoint_windows(x, kernel, stride)
    return windows.expand(*batch, *windows.shape[len(leading):])
  out = tuple(_output_size(i, k, s, d) for i, k, s, d in zip(spatial, kernel, stride, dilation))
  keep = [None] * len(batch)
  # Repeat each axis k times (in the same expand that broadcasts the leading axes, so the gradient is one sum) and
  # read it flat in rows of i + dilation: row k then starts at x[k*dilation]. Every reshape lines up with the index
  # bounds, so the scheduler's symbolic rules fold the // and % away and the windows' index stays linear:
  # (k*(i + d) + o*s) % i == k*d + o*s.
  x = x.reshape(*leading, *_interleave((1,) * len(spatial), spatial)).expand(*batch, *_interleave(kernel, spatial))
  x = x.reshape(*batch, *(k * i for k, i in zip(kernel, spatial)))
  x = x.pad([(0, 0)] * len(batch) + [(0, k * d) for k, d in zip(kernel, dilation)])
  x = x.reshape(*batch, *_interleave(kernel, tuple(i + d for i, d in zip(spatial, dilation))))
  if any(s != 1 for s in stride):
    # split each row into (out, stride) blocks, long enough for all of them, and keep the first column
    rows = tuple(max(i + d, o * s) for i, d, o, s in zip(spatial, dilation, out, stride))
    x = x.pad([(0, 0)] * len(batch) + [p for i, d, r in zip(spatial, dilation, rows) for p in ((0, 0), (0, r - i - d))])
    x = x.shrink(keep + [b for k, o, s in zip(kernel, out, stride) for b in ((0, k), (0, o * s))])
    x = x.reshape(*batch, *(v for k, o, s in zip(kernel, out, stride) for v in (k, o, s)))
    x = x.shrink(keep + [b for k, o in zip(kernel, out) for b in ((0, k), (0, o), (0, 1))])
    x = x.reshape(*batch, *_interleave(kernel, out))
  else:
    x = x.shrink(keep + [b for k, o in zip(kernel, out) for b in ((0, k), (0, o))])
  dims, first = len(kernel), len(batch)
  return x.permute(*range(first), *(first + 2 * j + 1 for j in range(dims)), *(first + 2 * j for j in range(dims)))


def _disjoint_windows(x: Tensor, kernel: tuple[int, ...], stride: tuple[int, ...]) -> Tensor:
  """Windows that do not overlap (kernel <= stride, no dilation): cut the axes into blocks of `stride` and keep the
  first `kernel` of each block. Its gradient is elementwise, not a sum over repeats."""
  batch, spatial = x.shape[:-len(kernel)], x.shape[-len(kernel):]
  out = tuple(_output_size(i, k, s, 1) for i, k, s in zip(spatial, kernel, stride))
  x = _pad_spatial(x, [(0, o * s - i) for i, o, s in zip(spatial, out, stride)])
  x = x.reshape(*batch, *_interleave(out, stride))
  if any(k != s for k, s in zip(kernel, stride)):
    x = x.shrink([None] * len(batch) + [b for o, k in zip(out, kernel) for b in ((0, o), (0, k))])
  dims, first = len(kernel), len(batch)
  return x.permute(*range(first), *(first + 2 * j for j in range(dims)), *(first + 2 * j + 1 for j in range(dims)))


def _interleave(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
  return tuple(v for pair in zip(a, b) for v in pair)


def _pad_spatial(x: Tensor, padding: Sequence[tuple[int, int]], value: float = 0.0) -> Tensor:
  """Pad (or, for negative amounts, crop) the last len(padding) axes."""
  keep = [(0, 0)] * (x.ndim - len(padding))
  grow = [(max(before, 0), max(after, 0)) for before, after in padding]
  if any(before or after for before, after in grow): x = x.pad(keep + grow, value)
  if all(before >= 0 and after >= 0 for before, after in padding): return x
  crop = [(-min(before, 0), size + min(after, 0)) for (before, after), size in zip(padding, x.shape[-len(padding):])]
  return x.shrink([None] * len(keep) + crop)


# *** convolution ***

BLOCK_IMAGES = 4  # a batch of a multiple of this many images, channels last, is blocked over them (heuristic.py)
CACHE_LINE = 64
CACHE_WAY = 4096  # bytes of an L1 data cache way (x86, most ARM): addresses this far apart share a cache set


def _conv_padding(padding: Size | str, kernel: tuple[int, ...], stride: tuple[int, ...],
                  dilation: tuple[int, ...]) -> list[tuple[int, int]]:
  if padding == "valid": return [(0, 0)] * len(kernel)
  if padding == "same":
    if any(s != 1 for s in stride): raise ValueError(f"padding='same' is not supported for strides {stride}")
    # an even window pads one more at the end, as PyTorch does
    totals = [d * (k - 1) for k, d in zip(kernel, dilation)]
    return [(total // 2, total - total // 2) for total in totals]
  if isinstance(padding, str): raise ValueError(f"padding must be 'same', 'valid', an int or ints, got {padding!r}")
  amounts = _tuple(padding, len(kernel), "padding")
  if any(p < 0 for p in amounts): raise ValueError(f"padding must not be negative, got {amounts}")
  return [(p, p) for p in amounts]


def _check_conv_shapes(name: str, x: Tensor, weight: Tensor, groups: int, dims: int, transposed: bool) -> None:
  if groups < 1: raise ValueError(f"{name}: groups must be positive, got {groups}")
  if weight.ndim != dims + 2:
    raise ShapeError(f"{name}: weight must have {dims + 2} dimensions, got shape {weight.shape}")
  if x.ndim != dims + 2:
    raise ShapeError(f"{name}: input must have {dims + 1} or {dims + 2} dimensions, got shape {x.shape}")
  in_channels = weight.shape[0] if transposed else weight.shape[1] * groups
  if x.shape[1] != in_channels:
    layout = "(in, out/groups, ...)" if transposed else "(out, in/groups, ...)"
    raise ShapeError(f"{name}: input of shape {x.shape} has {x.shape[1]} channels, but weight of shape {weight.shape} "
                     f"{layout} with groups={groups} expects {in_channels}")
  if weight.shape[0] % groups:
    raise ShapeError(f"{name}: weight of shape {weight.shape} has {weight.shape[0]} {'in' if transposed else 'out'} "
                     f"channels, not divisible by groups={groups}")


def _convolve(x: Tensor, weight: Tensor, bias: Tensor | None, stride: tuple[int, ...], padding: list[tuple[int, int]],
              dilation: tuple[int, ...], groups: int, name: str, channels_last: bool = False) -> Tensor:
  """The convolution of a batched, channels-first input with weight (out, in/groups, *kernel); `channels_last`: x is
  a view of a buffer whose channels are its innermost axis, read where it is."""
  dims = weight.ndim - 2
  kernel = tuple(weight.shape[2:])
  unpadded = x
  # Channels last, every window reads a cache line of channels at each pixel: the padding stays a view, codegen runs
  # each window's loops only over the pixels inside the input (bound_gated_loops) and its register blocks take
  # several images. A pixel's windows of a few images then stay in the L1 cache for the next pixel, unless their
  # rows all fall in the same cache sets, being a multiple of a cache way long (MNIST's 20x20x32 output gradient:
  # 20% less time with AVX2, 10% with AVX-512; a 16x16x64 one: 66% more). Otherwise the blocks run along a row of
  # pixels: the rows' padding stays a view, bounded the same way, and the columns' is written into the buffer, so a
  # row reads without checks
  pixel_bytes = x.shape[1] * x.dtype.itemsize
  if channels_last and isinstance(x.shape[0], int) and x.shape[0] % BLOCK_IMAGES == 0 and \
     pixel_bytes >= CACHE_LINE and isinstance(row := pixel_bytes * x.shape[-1], int) and row < CACHE_WAY:
    x = _pad_spatial(_contiguous_backward(x), padding)
  else:
    rows, columns = list(padding[:-1]) + [(0, 0)], [(0, 0)] * (dims - 1) + list(padding[-1:])
    x = _pad_spatial(_buffered(_pad_spatial(x, columns)), rows)
  spatial = x.shape[2:]
  out = tuple(_output_size(i, k, s, d) for i, k, s, d in zip(spatial, kernel, stride, dilation))
  if any(o < 1 for o in out):
    raise ShapeError(f"{name}: kernel {kernel} with dilation {dilation} is larger than the padded input {spatial}")
  batch, out_channels = x.shape[0], weight.shape[0]
  group_in, group_out = weight.shape[1], out_channels // groups
  # (batch, groups, group_out, group_in, *out, *kernel): one expand broadcasts the input over the output channels
  # and repeats it for the windows, so its gradient is one sum
  grouped = x.reshape(batch, groups, 1, group_in, *spatial)
  windows = _windows(grouped, kernel, stride, dilation, (batch, groups, group_out, group_in))
  summed_axes = (3, *range(4 + dims, 4 + 2 * dims))
  if bias is not None and bias.shape != (out_channels,):
    raise ShapeError(f"{name}: bias of shape {bias.shape} does not match {out_channels} output channels")
  result = _contiguous_backward((windows * weight.reshape(1, groups, group_out, group_in, *(1,) * dims, *kernel))
                                .sum(summed_axes).reshape(batch, out_channels, *out))
  return _with_gradients(result, bias, unpadded, x, weight, stride, padding, dilation, groups, name)


def _with_gradients(result: Tensor, bias: Tensor | None, x: Tensor, padded: Tensor, weight: Tensor,
                    stride: tuple[int, ...], padding: list[tuple[int, int]], dilation: tuple[int, ...], groups: int,
                    name: str) -> Tensor:
  """The convolution plus its bias, differentiated here. The rules would make the input's gradient one kernel that
  scatters each output gradient back through the windows: its loads are bounds-checked in the innermost loop (every
  input position sums the kernel positions that fall outside the output). As a transposed convolution over the
  output gradient, made a buffer with its channels last, the window loops run over the output gradient's pixels alone
  (see _convolve; MNIST's second convolution, batch 128: 40 ms -> 14 ms with its columns' padding a buffer). The
  weight's gradient: see _weight_gradient. The bias's gradient sums that buffer too, not the expression it holds (a
  ReLU's or a batch norm's gradient, which reads several buffers)."""
  kernel, spatial, out = tuple(weight.shape[2:]), x.shape[2:], result.shape[2:]
  if bias is not None: result = result + bias.reshape(1, weight.shape[0], *(1,) * len(kernel))
  # the gradient of the input before its padding (x), not of the padded input: the transposed convolution's full
  # size is (out-1)*stride + dilation*(kernel-1) + 1, of which it crops the padding before (its own `padding`) and
  # after (through `extra`, which also counts the rows past the last window: they got none)
  before = tuple(b for b, _ in padding)
  extra = tuple(i - ((o - 1) * s + d * (k - 1) + 1) + 2 * b
                for i, o, s, d, k, b in zip(spatial, out, stride, dilation, kernel, before))
  # UOps and the class only: the function lives on result.uop and must not keep any Tensor alive
  tensor, source, windowed, weights = type(x), x.uop, padded.uop, weight.uop
  biases = bias.uop if bias is not None else None

  def gradient(node: UOp, output_gradient: UOp, wanted: set[UOp]) -> dict[UOp, UOp]:
    # the output gradient becomes one buffer, output channels last: the weight's gradient vectorizes along them
    channels_last = tensor(output_gradient).permute(0, *range(2, 2 + len(kernel)), 1).contiguous()
    grads = {}
    if source in wanted:
      flowing = channels_last.permute(0, len(kernel) + 1, *range(1, len(kernel) + 1))
      # a buffer, as the padded input's gradient was (_buffered): computed inside the kernels that read it (a
      # ReLU's or a pooling's gradient), the sum would run again for each of them
      grads[source] = _transposed(flowing, tensor(weights), stride, dilation, before, extra, groups, name,
                                  channels_last=True).contiguous().uop
    if weights in wanted:
      grads[weights] = _weight_gradient(tensor(windowed), channels_last, tuple(tensor(weights).shape), stride,
                                        dilation, groups).uop
    if biases is not None and biases in wanted:
      grads[biases] = channels_last.sum(tuple(range(len(kernel) + 1))).cast(biases.dtype).uop
    return grads
  set_custom_gradient(result.uop, gradient)
  return result


def _weight_gradient(x: Tensor, channels_last: Tensor, shape: tuple[int, ...], stride: tuple[int, ...],
                     dilation: tuple[int, ...], groups: int) -> Tensor:
  """d(weight) = sum over the batch and the output positions of output gradient * input window, from the output
  gradient with its channels last (batch, *out, out_channels). Summed into a buffer with the output channels last
  too, so they are the vector lanes (the rules' form could only vectorize along the kernel's width: 5 of 8 lanes used
  in MNIST's 5x5 convolutions)."""
  dims, kernel = len(shape) - 2, shape[2:]
  batch, spatial, out = x.shape[0], x.shape[2:], channels_last.shape[1:-1]
  group_out, group_in = shape[0] // groups, shape[1]
  windows = _windows(x.reshape(batch, groups, 1, group_in, *spatial), kernel, stride, dilation,
                     (batch, groups, 1, group_in))  # (batch, groups, 1, group_in, *out, *kernel)
  windows = windows.reshape(batch, groups, group_in, *out, *kernel, 1)
  flowing = channels_last.reshape(batch, *out, groups, group_out).permute(0, dims + 1, *range(1, dims + 1), dims + 2)
  flowing = flowing.reshape(batch, groups, 1, *out, *(1,) * dims, group_out)
  summed = (windows * flowing).sum((0, *range(3, 3 + dims))).contiguous()  # (groups, group_in, *kernel, group_out)
  return summed.permute(0, 2 + dims, 1, *range(2, 2 + dims)).reshape(*shape)


def _contiguous_backward(x: Tensor) -> Tensor:
  """x unchanged; the gradient flowing back through it becomes a buffer."""
  return type(x)(UOp(Ops.CONTIGUOUS_BACKWARD, x.dtype, (x.uop,)))


def _buffered(x: Tensor) -> Tensor:
  """x and its gradient as buffers. A convolution reads each (padded) input value out_channels * prod(kernel) times
  and each output gradient in_channels * prod(kernel) times: computed in place instead, a ReLU, a normalization, a
  pooling gradient or the bounds check of the padding would repeat in the innermost loop."""
  return _contiguous_backward(x.contiguous())


def _unbatched(x: Tensor, dims: int) -> bool:
  return x.ndim == dims + 1


def _conv(x: Tensor, weight: Tensor, bias: Tensor | None, stride: Size, padding: Size | str, dilation: Size,
          groups: int, dims: int, name: str) -> Tensor:
  unbatched = _unbatched(x, dims)
  if unbatched: x = x.unsqueeze(0)
  _check_conv_shapes(name, x, weight, groups, dims, transposed=False)
  kernel = tuple(weight.shape[2:])
  _positive(kernel, f"{name} kernel size")
  strides = _positive(_tuple(stride, dims, "stride"), "stride")
  dilations = _positive(_tuple(dilation, dims, "dilation"), "dilation")
  edges = _conv_padding(padding, kernel, strides, dilations)
  result = _convolve(x, weight, bias, strides, edges, dilations, groups, name)
  return result.squeeze(0) if unbatched else result


def _conv_transpose(x: Tensor, weight: Tensor, bias: Tensor | None, stride: Size, padding: Size, output_padding: Size,
                    groups: int, dilation: Size, dims: int, name: str) -> Tensor:
  """The gradient of a convolution with respect to its input, as a convolution: spread the input `stride` apart,
  pad it by dilation*(kernel-1) - padding, and convolve with the flipped kernel whose in/out channels swap."""
  unbatched = _unbatched(x, dims)
  if unbatched: x = x.unsqueeze(0)
  _check_conv_shapes(name, x, weight, groups, dims, transposed=True)
  _positive(tuple(weight.shape[2:]), f"{name} kernel size")
  strides = _positive(_tuple(stride, dims, "stride"), "stride")
  dilations = _positive(_tuple(dilation, dims, "dilation"), "dilation")
  paddings = _tuple(padding, dims, "padding")
  extra = _tuple(output_padding, dims, "output_padding")
  if any(p < 0 for p in paddings): raise ValueError(f"{name}: padding must not be negative, got {paddings}")
  if any(not 0 <= e < max(s, d) for e, s, d in zip(extra, strides, dilations)):
    raise ValueError(f"{name}: output_padding {extra} must be smaller than stride {strides} or dilation {dilations}")
  result = _transposed(x, weight, strides, dilations, paddings, extra, groups, name)
  if bias is not None:
    if bias.shape != (result.shape[1],):
      raise ShapeError(f"{name}: bias of shape {bias.shape} does not match {result.shape[1]} output channels")
    result = result + bias.reshape(1, result.shape[1], *(1,) * dims)
  return result.squeeze(0) if unbatched else result


def _transposed(x: Tensor, weight: Tensor, strides: tuple[int, ...], dilations: tuple[int, ...],
                paddings: tuple[int, ...], extra: tuple[int, ...], groups: int, name: str,
                channels_last: bool = False) -> Tensor:
  """The transposed convolution of a batched input with weight (in, out/groups, *kernel)."""
  dims, kernel = weight.ndim - 2, tuple(weight.shape[2:])
  in_channels, group_out = weight.shape[0], weight.shape[1]
  flipped = weight.reshape(groups, in_channels // groups, group_out, *kernel).transpose(1, 2)
  flipped = flipped.reshape(groups * group_out, in_channels // groups, *kernel).flip(*range(2, 2 + dims))
  edges = [(d * (k - 1) - p, d * (k - 1) - p + e) for k, d, p, e in zip(kernel, dilations, paddings, extra)]
  spread = any(s != 1 for s in strides)  # spread apart, the input is a new buffer, channels first
  return _convolve(_spread(x, strides), flipped, None, (1,) * dims, edges, dilations, groups, name,
                   channels_last and not spread)


def _spread(x: Tensor, stride: tuple[int, ...]) -> Tensor:
  """Insert stride-1 zeros between neighbours along the last len(stride) axes."""
  if all(s == 1 for s in stride): return x
  batch, spatial = x.shape[:-len(stride)], x.shape[-len(stride):]
  x = x.reshape(*batch, *_interleave(spatial, (1,) * len(stride)))
  x = x.pad([(0, 0)] * len(batch) + [p for s in stride for p in ((0, 0), (0, s - 1))])
  x = x.reshape(*batch, *(i * s for i, s in zip(spatial, stride)))
  return x.shrink([None] * len(batch) + [(0, (i - 1) * s + 1) for i, s in zip(spatial, stride)])


# *** pooling ***

def _pool_geometry(x: Tensor, kernel_size: Size, stride: Size | None, padding: Size, dilation: Size, ceil_mode: bool,
                   dims: int, name: str) -> tuple[tuple[int, ...], ...]:
  """(kernel, stride, padding, dilation, extra): `extra` is the padding at the end ceil_mode needs beyond `padding`."""
  if x.ndim not in (dims + 1, dims + 2):
    raise ShapeError(f"{name}: input must have {dims + 1} or {dims + 2} dimensions, got shape {x.shape}")
  kernel = _positive(_tuple(kernel_size, dims, "kernel_size"), "kernel_size")
  strides = kernel if stride is None else _positive(_tuple(stride, dims, "stride"), "stride")
  paddings = _tuple(padding, dims, "padding")
  dilations = _positive(_tuple(dilation, dims, "dilation"), "dilation")
  if any(not 0 <= p <= (d * (k - 1) + 1) // 2 for p, k, d in zip(paddings, kernel, dilations)):
    raise ValueError(f"{name}: padding {paddings} must be between 0 and half the window {kernel} (dilation "
                     f"{dilations})")
  extra = []
  for size, k, s, p, d in zip(x.shape[-dims:], kernel, strides, paddings, dilations):
    out = _output_size(size + 2 * p, k, s, d, ceil_mode)
    # as in PyTorch, the last window must start inside the input or the left padding
    if ceil_mode and (out - 1) * s >= size + p: out -= 1
    if out < 1: raise ShapeError(f"{name}: window {kernel} (dilation {dilations}) does not fit input {x.shape}")
    extra.append(max(0, (out - 1) * s + d * (k - 1) + 1 - size - 2 * p))
  return kernel, strides, paddings, dilations, tuple(extra)


def _max_pool(x: Tensor, kernel_size: Size, stride: Size | None, padding: Size, dilation: Size, ceil_mode: bool,
              dims: int, name: str, return_indices: bool = False) -> Tensor | tuple[Tensor, Tensor]:
  kernel, strides, paddings, dilations, extra = _pool_geometry(x, kernel_size, stride, padding, dilation, ceil_mode,
                                                               dims, name)
  lowest = -math.inf if dtypes.is_float(x.dtype) else dtypes.min(x.dtype)
  edges = [(p, p + e) for p, e in zip(paddings, extra)]
  windows = _windows(_pad_spatial(x, edges, lowest), kernel, strides, dilations)
  pooled = windows.max(tuple(range(-dims, 0)))
  if not return_indices: return pooled
  # the flat spatial index of the first maximum of each window (PyTorch's choice), from windows of the positions
  spatial = x.shape[-dims:]
  positions = type(x).arange(prod(spatial), device=x.device).reshape(spatial)
  position_windows = _windows(_pad_spatial(positions, edges, -1), kernel, strides, dilations).flatten(-dims)
  hits = windows.flatten(-dims) == pooled.unsqueeze(-1)
  count = position_windows.shape[-1]
  first = count - hits.where(count - type(x).arange(count, device=x.device), 0).max(-1, keepdim=True)
  picked = hits & (type(x).arange(count, device=x.device) == first)
  return pooled, picked.where(position_windows, 0).sum(-1).cast(dtypes.int64)


def _avg_pool(x: Tensor, kernel_size: Size, stride: Size | None, padding: Size, ceil_mode: bool,
              count_include_pad: bool, divisor_override: int | None, dims: int, name: str) -> Tensor:
  kernel, strides, paddings, dilations, extra = _pool_geometry(x, kernel_size, stride, padding, 1, ceil_mode, dims,
                                                               name)
  x = x if dtypes.is_float(x.dtype) else x.cast(dtypes.default_float)
  padded = _pad_spatial(x, [(p, p + e) for p, e in zip(paddings, extra)])
  axes = tuple(range(-dims, 0))
  total = _windows(padded, kernel, strides, dilations).sum(axes)
  if divisor_override is not None:
    if divisor_override == 0: raise ValueError(f"{name}: divisor_override must not be zero")
    return total / divisor_override
  if not any(extra) and (count_include_pad or not any(paddings)): return total / prod(kernel)
  mask = _counted_mask(x, paddings, extra, count_include_pad)
  return total / _windows(mask, kernel, strides, dilations).sum(axes)


def _counted_mask(x: Tensor, paddings: tuple[int, ...], extra: tuple[int, ...], count_include_pad: bool) -> Tensor:
  """1 where an average counts an element of the padded input, 0 elsewhere, over the spatial axes only: the input
  counts, the padding counts with count_include_pad, the extra end padding of ceil_mode never counts."""
  spatial = x.shape[len(x.shape) - len(paddings):]
  if count_include_pad:
    ones = type(x).ones(*(s + 2 * p for s, p in zip(spatial, paddings)), device=x.device)
    return _pad_spatial(ones, [(0, e) for e in extra])
  ones = type(x).ones(*spatial, device=x.device)
  return _pad_spatial(ones, [(p, p + e) for p, e in zip(paddings, extra)])


# *** small math helpers (private stand-ins for the shared elementwise and reduce ops) ***

def _norm(x: Tensor, p: float, axis: int) -> Tensor:
  """The p-norm along `axis` (kept), whose gradient at a zero vector is 0 (PyTorch's), not 0 * inf."""
  if p == math.inf: return x.abs().max(axis, keepdim=True)
  if p == 1: return x.abs().sum(axis, keepdim=True)
  total = (x * x if p == 2 else x.abs() ** p).sum(axis, keepdim=True)
  zero = total == 0
  root = zero.where(1.0, total)
  return zero.where(0.0, root.sqrt() if p == 2 else root ** (1 / p))


def _rsqrt(x: Tensor) -> Tensor:
  return x.sqrt().reciprocal()


def _moments(x: Tensor, axes: tuple[int, ...]) -> tuple[Tensor, Tensor]:
  """Mean and biased variance over `axes`, both keeping the reduced axes."""
  mean = x.mean(axes, keepdim=True)
  centered = x - mean
  return mean, (centered * centered).mean(axes, keepdim=True)


def _abs(x: Tensor) -> Tensor:
  return (x < 0).where(-x, x)


def _log1p_exp(x: Tensor) -> Tensor:
  """log(1 + exp(x)) for x <= 0, without overflow."""
  return (x.exp() + 1).log()


def _float(x: Tensor) -> Tensor:
  return x if dtypes.is_float(x.dtype) else x.cast(dtypes.default_float)


_MACHINE_EPSILON = {dtypes.float16: 2.0 ** -10, dtypes.bfloat16: 2.0 ** -7, dtypes.float32: 2.0 ** -23,
                    dtypes.float64: 2.0 ** -52}


def _channel_shape(x: Tensor, axis: int = 1) -> tuple[int, ...]:
  """The shape that broadcasts a per-channel vector along `axis` of x."""
  return tuple(size if i == axis else 1 for i, size in enumerate(x.shape))


def _check_channels(name: str, what: str, vector: Tensor | None, channels: int) -> None:
  if vector is not None and vector.shape != (channels,):
    raise ShapeError(f"{name}: {what} of shape {vector.shape} does not match {channels} channels")


def _check_normalized_shape(name: str, x: Tensor, normalized_shape: Size) -> tuple[int, ...]:
  shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
  if not shape or tuple(x.shape[len(x.shape) - len(shape):]) != shape or len(shape) > x.ndim:
    raise ShapeError(f"{name}: normalized_shape {shape} does not match the trailing axes of input {x.shape}")
  return shape


def _affine(x: Tensor, weight: Tensor | None, bias: Tensor | None) -> Tensor:
  if weight is not None: x = x * weight
  return x if bias is None else x + bias


def _per_channel(x: Tensor, weight: Tensor | None, bias: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
  shape = _channel_shape(x)
  return (None if weight is None else weight.reshape(shape)), (None if bias is None else bias.reshape(shape))


def _causal_mask(like: Tensor, queries: int, keys: int) -> Tensor:
  """True where key j may be attended from query i: j <= i (the top-left aligned lower triangle)."""
  rows = type(like).arange(queries, device=like.device).reshape(queries, 1)
  return rows >= type(like).arange(keys, device=like.device).reshape(1, keys)


def _check_same_shape(name: str, x: Tensor, target: Tensor) -> None:
  if tuple(target.shape) != tuple(x.shape):
    raise ShapeError(f"{name}: target of shape {target.shape} does not match input {x.shape}")


# *** losses ***

def _class_one_hot(target: Tensor, classes: int, axis: int) -> Tensor:
  """A bool tensor that is True at target's class along a new axis `axis`."""
  shape = [1] * (target.ndim + 1)
  shape[axis] = classes
  arange = type(target).arange(classes, device=target.device).reshape(shape)
  return target.unsqueeze(axis) == arange


def _check_class_target(name: str, x: Tensor, target: Tensor, axis: int, ignore_index: int) -> None:
  if dtypes.is_float(target.dtype) or target.dtype == dtypes.bool:
    raise TypeError(f"{name}: class-index targets must be integers, got {target.dtype} (shape {target.shape})")
  expected = tuple(x.shape[:axis]) + tuple(x.shape[axis + 1:])
  if tuple(target.shape) != expected:
    raise ShapeError(f"{name}: target of shape {target.shape} does not match input {x.shape}: expected {expected}")
  classes = x.shape[axis]
  check_index_values(target, 0, classes, f"{name}: target {{value}} is out of bounds for {classes} classes",
                     ignored=ignore_index)


def _class_index_loss(log_probs: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int, reduction: str,
                      label_smoothing: float, axis: int) -> Tensor:
  """PyTorch's cross entropy with class-index targets over log-probabilities: the weighted negative log-likelihood,
  blended with the mean over all classes by label_smoothing; 'mean' divides by the total weight of counted targets."""
  classes = log_probs.shape[axis]
  counted = target != ignore_index
  picked = _class_one_hot(target, classes, axis) & counted.unsqueeze(axis)
  class_weight = None if weight is None else weight.cast(log_probs.dtype).reshape(_channel_shape(log_probs, axis))
  weighted = log_probs if class_weight is None else log_probs * class_weight
  loss = -picked.where(weighted, 0).sum(axis)
  if label_smoothing:
    smooth = -counted.where(weighted.sum(axis), 0)
    loss = loss * (1 - label_smoothing) + smooth * (label_smoothing / classes)
  if reduction != "mean": return _reduce_loss(loss, reduction)
  total_weight = picked.where(1.0 if class_weight is None else class_weight, 0.0).sum()
  return loss.sum() / total_weight


def _probability_loss(log_probs: Tensor, target: Tensor, weight: Tensor | None, reduction: str,
                      label_smoothing: float, axis: int) -> Tensor:
  classes = log_probs.shape[axis]
  if label_smoothing: target = target * (1 - label_smoothing) + label_smoothing / classes
  terms = log_probs * target
  if weight is not None: terms = terms * weight.reshape(_channel_shape(log_probs, axis))
  loss = -terms.sum(axis)
  return _reduce_loss(loss, reduction)


class NNOps(TensorBase):
  """Mixin of rawgrad.tensor.Tensor."""
  __slots__ = ()

  # *** linear and convolution ***

  def linear(self: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """self @ weight.T + bias, with weight shaped (out_features, in_features) as in torch.nn.functional.linear."""
    if weight.ndim not in (1, 2): raise ShapeError(f"linear: weight must be 1-D or 2-D, got shape {weight.shape}")
    if self.ndim == 0 or self.shape[-1] != weight.shape[-1]:
      raise ShapeError(f"linear: input of shape {self.shape} does not match weight of shape {weight.shape} "
                       f"(out_features, in_features)")
    result = self.matmul(weight.T)
    return result if bias is None else result + bias

  def conv1d(self: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Size = 1, padding: Size | str = 0,
             dilation: Size = 1, groups: int = 1) -> Tensor:
    """1-D convolution of (batch, in, width) or (in, width) with weight (out, in/groups, kernel)."""
    return _conv(self, weight, bias, stride, padding, dilation, groups, 1, "conv1d")

  def conv2d(self: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Size = 1, padding: Size | str = 0,
             dilation: Size = 1, groups: int = 1) -> Tensor:
    """2-D convolution of (batch, in, height, width) or (in, height, width) with weight (out, in/groups, kh, kw)."""
    return _conv(self, weight, bias, stride, padding, dilation, groups, 2, "conv2d")

  def conv_transpose1d(self: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Size = 1, padding: Size = 0,
                       output_padding: Size = 0, groups: int = 1, dilation: Size = 1) -> Tensor:
    """Transposed 1-D convolution with weight (in, out/groups, kernel)."""
    return _conv_transpose(self, weight, bias, stride, padding, output_padding, groups, dilation, 1,
                           "conv_transpose1d")

  def conv_transpose2d(self: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Size = 1, padding: Size = 0,
                       output_padding: Size = 0, groups: int = 1, dilation: Size = 1) -> Tensor:
    """Transposed 2-D convolution with weight (in, out/groups, kh, kw)."""
    return _conv_transpose(self, weight, bias, stride, padding, output_padding, groups, dilation, 2,
                           "conv_transpose2d")

  def conv3d(self: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Size = 1, padding: Size | str = 0,
             dilation: Size = 1, groups: int = 1) -> Tensor:
    """3-D convolution of (batch, in, depth, height, width) or unbatched with weight (out, in/groups, kd, kh, kw)."""
    return _conv(self, weight, bias, stride, padding, dilation, groups, 3, "conv3d")

  def conv_transpose3d(self: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Size = 1, padding: Size = 0,
                       output_padding: Size = 0, groups: int = 1, dilation: Size = 1) -> Tensor:
    """Transposed 3-D convolution with weight (in, out/groups, kd, kh, kw)."""
    return _conv_transpose(self, weight, bias, stride, padding, output_padding, groups, dilation, 3,
                           "conv_transpose3d")

  # *** pooling ***

  def max_pool1d(self: Tensor, kernel_size: Size, stride: Size | None = None, padding: Size = 0, dilation: Size = 1,
                 ceil_mode: bool = False) -> Tensor:
    return _max_pool(self, kernel_size, stride, padding, dilation, ceil_mode, 1, "max_pool1d")

  def max_pool2d(self: Tensor, kernel_size: Size, stride: Size | None = None, padding: Size = 0, dilation: Size = 1,
                 ceil_mode: bool = False, return_indices: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """Max over windows; padding counts as -inf. Ties share the gradient evenly (PyTorch gives it to one). With
    return_indices also the flat index (h * width + w, int64) of each window's first maximum, for max_unpool2d."""
    return _max_pool(self, kernel_size, stride, padding, dilation, ceil_mode, 2, "max_pool2d", return_indices)

  def max_pool3d(self: Tensor, kernel_size: Size, stride: Size | None = None, padding: Size = 0, dilation: Size = 1,
                 ceil_mode: bool = False, return_indices: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    return _max_pool(self, kernel_size, stride, padding, dilation, ceil_mode, 3, "max_pool3d", return_indices)

  def max_unpool2d(self: Tensor, indices: Tensor, kernel_size: Size, stride: Size | None = None, padding: Size = 0,
                   output_size: Sequence[int] | None = None) -> Tensor:
    """The inverse of max_pool2d with return_indices: zeros of the unpooled size with each value at its index."""
    kernel = _tuple(kernel_size, 2, "kernel_size")
    strides = kernel if stride is None else _tuple(stride, 2, "stride")
    paddings = _tuple(padding, 2, "padding")
    if tuple(indices.shape) != tuple(self.shape):
      raise ValueError(f"max_unpool2d: indices of shape {indices.shape} do not match input {self.shape}")
    size = tuple((i - 1) * s - 2 * p + k for i, s, p, k in zip(self.shape[-2:], strides, paddings, kernel))
    if output_size is not None: size = tuple(output_size)[-2:]
    flat_values, flat_indices = self.flatten(-2), indices.flatten(-2)
    out = type(self).zeros(*self.shape[:-2], prod(size), dtype=self.dtype, device=self.device)
    return out.scatter(-1, flat_indices, flat_values).reshape(*self.shape[:-2], *size)

  def avg_pool1d(self: Tensor, kernel_size: Size, stride: Size | None = None, padding: Size = 0,
                 ceil_mode: bool = False, count_include_pad: bool = True) -> Tensor:
    return _avg_pool(self, kernel_size, stride, padding, ceil_mode, count_include_pad, None, 1, "avg_pool1d")

  def avg_pool2d(self: Tensor, kernel_size: Size, stride: Size | None = None, padding: Size = 0,
                 ceil_mode: bool = False, count_include_pad: bool = True,
                 divisor_override: int | None = None) -> Tensor:
    return _avg_pool(self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 2,
                     "avg_pool2d")

  def avg_pool3d(self: Tensor, kernel_size: Size, stride: Size | None = None, padding: Size = 0,
                 ceil_mode: bool = False, count_include_pad: bool = True,
                 divisor_override: int | None = None) -> Tensor:
    return _avg_pool(self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 3,
                     "avg_pool3d")

  # *** windows as data ***

  def unfold(self: Tensor, dimension: int, size: int, step: int) -> Tensor:
    """torch.Tensor.unfold: the windows of `size` elements, `step` apart, along `dimension`, which becomes the number
    of windows; the window is a new last dim."""
    axis = resolve_axis(dimension, self.ndim)
    length = self.shape[axis] if self.ndim else 1
    if size < 0 or size > length: raise ValueError(f"unfold size {size} does not fit dim {dimension} of size {length}")
    if step < 1: raise ValueError(f"unfold step must be positive, got {step}")
    if self.ndim == 0: return self.reshape(1)
    moved = self.movedim(axis, -1)
    if size == 0: return type(self).zeros(*moved.shape[:-1], length // step + 1, 0, dtype=self.dtype,
                                          device=self.device).movedim(-2, axis)
    windows = _windows(moved, (size,), (step,), (1,))  # (..., count, size)
    return windows.movedim(-2, axis)

  def im2col(self: Tensor, kernel_size: Size, dilation: Size = 1, padding: Size = 0, stride: Size = 1) -> Tensor:
    """torch.nn.functional.unfold: the sliding blocks of a (N, C, H, W) or (C, H, W) input as columns,
    (N, C * kh * kw, blocks)."""
    unbatched = self.ndim == 3
    x = self.unsqueeze(0) if unbatched else self
    if x.ndim != 4: raise ValueError(f"im2col: input must be 3-D or 4-D, got shape {self.shape}")
    kernel = _positive(_tuple(kernel_size, 2, "kernel_size"), "kernel_size")
    dilations = _positive(_tuple(dilation, 2, "dilation"), "dilation")
    strides = _positive(_tuple(stride, 2, "stride"), "stride")
    paddings = _tuple(padding, 2, "padding")
    windows = _windows(_pad_spatial(x, [(p, p) for p in paddings]), kernel, strides, dilations)
    batch, channels, rows, cols = windows.shape[:4]
    columns = windows.permute(0, 1, 4, 5, 2, 3).reshape(batch, channels * prod(kernel), rows * cols)
    return columns.squeeze(0) if unbatched else columns

  def normalize(self: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
    """torch.nn.functional.normalize: self / max(norm_p(self along dim), eps)."""
    return self / _norm(_float(self), p, dim).clamp(min=eps)

  # *** normalization ***

  def batchnorm(self: Tensor, weight: Tensor | None, bias: Tensor | None, mean: Tensor, invstd: Tensor,
                axis: int = 1) -> Tensor:
    """(self - mean) * invstd * weight + bias with per-channel vectors along `axis`: the normalization step of
    batch_norm, for callers that computed the statistics themselves (nn.BatchNorm, to update its running stats)."""
    shape = _channel_shape(self, axis)
    x = (self - mean.reshape(shape)) * invstd.reshape(shape)
    return _affine(x, None if weight is None else weight.reshape(shape), None if bias is None else bias.reshape(shape))

  def batch_norm(self: Tensor, running_mean: Tensor | None, running_var: Tensor | None, weight: Tensor | None = None,
                 bias: Tensor | None = None, training: bool = False, momentum: float = 0.1,
                 eps: float = 1e-5) -> Tensor:
    """torch.nn.functional.batch_norm over axis 1. In training the batch's mean and biased variance normalize;
    otherwise the running ones do. This function never updates running_mean / running_var (nn.BatchNorm does that,
    with `momentum`, which is accepted here only for signature compatibility)."""
    if self.ndim < 2: raise ShapeError(f"batch_norm: input must have a channel axis, got shape {self.shape}")
    channels = self.shape[1]
    for what, vector in (("running_mean", running_mean), ("running_var", running_var), ("weight", weight),
                         ("bias", bias)):
      _check_channels("batch_norm", what, vector, channels)
    if training:
      axes = tuple(i for i in range(self.ndim) if i != 1)
      if prod(self.shape[i] for i in axes) == 1:
        raise ShapeError(f"batch_norm: training needs more than one value per channel, got input {self.shape}")
      mean, variance = _moments(self, axes)
      return _affine((self - mean) * _rsqrt(variance + eps), *_per_channel(self, weight, bias))
    if running_mean is None or running_var is None:
      raise ValueError("batch_norm: running_mean and running_var are required when not training")
    return self.batchnorm(weight, bias, running_mean, _rsqrt(running_var + eps))

  def layer_norm(self: Tensor, normalized_shape: Size, weight: Tensor | None = None, bias: Tensor | None = None,
                 eps: float = 1e-5) -> Tensor:
    """Normalize over the trailing axes `normalized_shape` (biased variance), then scale and shift elementwise."""
    shape = _check_normalized_shape("layer_norm", self, normalized_shape)
    for what, tensor in (("weight", weight), ("bias", bias)):
      if tensor is not None and tuple(tensor.shape) != shape:
        raise ShapeError(f"layer_norm: {what} of shape {tensor.shape} does not match normalized_shape {shape}")
    mean, variance = _moments(self, tuple(range(-len(shape), 0)))
    return _affine((self - mean) * _rsqrt(variance + eps), weight, bias)

  def layernorm(self: Tensor, normalized_shape: Size, weight: Tensor | None = None, bias: Tensor | None = None,
                eps: float = 1e-5) -> Tensor:
    return self.layer_norm(normalized_shape, weight, bias, eps)

  def rms_norm(self: Tensor, normalized_shape: Size, weight: Tensor | None = None, eps: float | None = None) -> Tensor:
    """self / sqrt(mean(self**2) + eps) over the trailing axes; eps defaults to the dtype's machine epsilon."""
    shape = _check_normalized_shape("rms_norm", self, normalized_shape)
    if weight is not None and tuple(weight.shape) != shape:
      raise ShapeError(f"rms_norm: weight of shape {weight.shape} does not match normalized_shape {shape}")
    x = _float(self)
    eps = _MACHINE_EPSILON.get(x.dtype, 2.0 ** -23) if eps is None else eps
    mean_square = (x * x).mean(tuple(range(-len(shape), 0)), keepdim=True)
    return _affine(x * _rsqrt(mean_square + eps), weight, None)

  def group_norm(self: Tensor, num_groups: int, weight: Tensor | None = None, bias: Tensor | None = None,
                 eps: float = 1e-5) -> Tensor:
    """Normalize each group of num_groups consecutive channels over its channels and spatial positions."""
    if self.ndim < 2: raise ShapeError(f"group_norm: input must have a channel axis, got shape {self.shape}")
    channels = self.shape[1]
    if num_groups < 1 or channels % num_groups:
      raise ShapeError(f"group_norm: {channels} channels of input {self.shape} do not split into {num_groups} groups")
    _check_channels("group_norm", "weight", weight, channels)
    _check_channels("group_norm", "bias", bias, channels)
    grouped = self.reshape(self.shape[0], num_groups, -1)
    mean, variance = _moments(grouped, (2,))
    normalized = ((grouped - mean) * _rsqrt(variance + eps)).reshape(self.shape)
    return _affine(normalized, *_per_channel(self, weight, bias))

  # *** regularization and lookup ***

  def dropout(self: Tensor, p: float = 0.5, training: bool = True, mask: Tensor | None = None) -> Tensor:
    """Zero each element with probability p and scale the rest by 1/(1-p); identity when not training. `mask`
    (True = keep) replaces the random draw, for tests and for reusing one mask."""
    if not 0.0 <= p <= 1.0: raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    if not training or p == 0.0: return self
    if p == 1.0: return self * 0
    if mask is None:
      rand_like = getattr(self, "rand_like", None)
      if rand_like is None: raise NotImplementedError("dropout needs Tensor.rand_like (random numbers) or a mask")
      mask = rand_like() >= p
    if tuple(mask.shape) != tuple(self.shape):
      raise ShapeError(f"dropout: mask of shape {mask.shape} does not match input {self.shape}")
    return mask.cast(dtypes.bool).where(self, 0) * (1 / (1 - p))

  def embedding(self: Tensor, weight: Tensor) -> Tensor:
    """Rows of weight (num_embeddings, dim) at the integer indices in self: shape (*self.shape, dim). Indices outside
    [0, num_embeddings) raise IndexOutOfRange (tensor_ops/bounds.py)."""
    if dtypes.is_float(self.dtype) or self.dtype == dtypes.bool:
      raise TypeError(f"embedding: indices must be integers, got {self.dtype} (shape {self.shape})")
    if weight.ndim != 2: raise ShapeError(f"embedding: weight must be 2-D, got shape {weight.shape}")
    rows = weight.shape[0]
    check_index_values(self, 0, rows, f"embedding: index {{value}} is out of range for {rows} embeddings")
    picked = _class_one_hot(self, weight.shape[0], -1).unsqueeze(-1)  # (..., num_embeddings, 1)
    return picked.where(weight, 0).sum(-2)

  # *** attention ***

  def scaled_dot_product_attention(self: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                                   dropout_p: float = 0.0, is_causal: bool = False,
                                   scale: float | None = None, enable_gqa: bool = False) -> Tensor:
    """softmax(self @ key^T * scale + mask) @ value with self the query (..., L, E), key (..., S, E) and value
    (..., S, Ev). A bool attn_mask keeps positions where it is True; a float one is added to the scores. is_causal
    keeps key j for query i when j <= i. Dropout with dropout_p applies to the attention weights. enable_gqa lets
    key and value have fewer heads (dim -3) than the query, each shared by a group of query heads."""
    if self.ndim < 2 or key.ndim < 2 or value.ndim < 2:
      raise ShapeError(f"attention needs query, key and value of at least 2 dimensions, got {self.shape}, {key.shape}"
                       f" and {value.shape}")
    if self.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2]:
      raise ShapeError(f"attention shapes do not match: query {self.shape}, key {key.shape}, value {value.shape}")
    if is_causal and attn_mask is not None: raise ValueError("attention: give either attn_mask or is_causal, not both")
    if enable_gqa and key.ndim >= 3 and self.ndim >= 3 and key.shape[-3] != self.shape[-3]:
      heads, key_heads = self.shape[-3], key.shape[-3]
      if heads % key_heads or value.shape[-3] != key_heads:
        raise ValueError(f"attention: {heads} query heads do not split into groups over {key_heads} key heads "
                         f"(key {key.shape}, value {value.shape})")
      key, value = key.repeat_interleave(heads // key_heads, -3), value.repeat_interleave(heads // key_heads, -3)
    scale = 1 / math.sqrt(self.shape[-1]) if scale is None else scale
    scores = self.matmul(key.transpose(-1, -2)) * scale
    if is_causal: attn_mask = _causal_mask(self, self.shape[-2], key.shape[-2])
    if attn_mask is not None:
      scores = attn_mask.where(scores, -math.inf) if attn_mask.dtype == dtypes.bool else scores + attn_mask
    weights = _softmax(scores, -1)
    if dropout_p: weights = weights.dropout(dropout_p)
    return weights.matmul(value)

  # *** losses ***

  def cross_entropy(self: Tensor, target: Tensor, weight: Tensor | None = None, ignore_index: int = -100,
                    reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
    """torch.nn.functional.cross_entropy of logits self (N, C, ...) or (C,): integer targets (N, ...) hold class
    indices (ignore_index counts for nothing), float targets of self's shape hold class probabilities."""
    _check_reduction(reduction)
    if not 0.0 <= label_smoothing <= 1.0: raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    if self.ndim == 0: raise ValueError("cross_entropy: input must have a class axis, got a 0-d tensor")
    axis = 0 if self.ndim == 1 else 1
    _check_channels("cross_entropy", "weight", weight, self.shape[axis])
    log_probs = _log_softmax(_float(self), axis)
    if dtypes.is_float(target.dtype):
      if tuple(target.shape) != tuple(self.shape):
        raise ShapeError(f"cross_entropy: probability target of shape {target.shape} does not match input {self.shape}")
      return _probability_loss(log_probs, target, weight, reduction, label_smoothing, axis)
    _check_class_target("cross_entropy", self, target, axis, ignore_index)
    return _class_index_loss(log_probs, target, weight, ignore_index, reduction, label_smoothing, axis)

  def nll_loss(self: Tensor, target: Tensor, weight: Tensor | None = None, ignore_index: int = -100,
               reduction: str = "mean") -> Tensor:
    """Negative log-likelihood of log-probabilities self (N, C, ...) or (C,) at integer class targets."""
    _check_reduction(reduction)
    if self.ndim == 0: raise ValueError("nll_loss: input must have a class axis, got a 0-d tensor")
    axis = 0 if self.ndim == 1 else 1
    _check_channels("nll_loss", "weight", weight, self.shape[axis])
    _check_class_target("nll_loss", self, target, axis, ignore_index)
    return _class_index_loss(_float(self), target, weight, ignore_index, reduction, 0.0, axis)

  def sparse_categorical_crossentropy(self: Tensor, target: Tensor, ignore_index: int = -1,
                                      label_smoothing: float = 0.0, reduction: str = "mean") -> Tensor:
    """tinygrad's name: cross entropy of logits self (..., C) with classes on the LAST axis and integer labels
    (...); labels equal to ignore_index (default -1) count for nothing."""
    _check_reduction(reduction)
    if not 0.0 <= label_smoothing <= 1.0: raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    if self.ndim == 0: raise ValueError("sparse_categorical_crossentropy: input needs a class axis, got a 0-d tensor")
    _check_class_target("sparse_categorical_crossentropy", self, target, self.ndim - 1, ignore_index)
    log_probs = _log_softmax(_float(self), -1)
    return _class_index_loss(log_probs, target, None, ignore_index, reduction, label_smoothing, self.ndim - 1)

  def binary_cross_entropy(self: Tensor, target: Tensor, weight: Tensor | None = None,
                           reduction: str = "mean") -> Tensor:
    """-(t*log(p) + (1-t)*log(1-p)) for probabilities p = self; each log is clamped at -100 as in PyTorch."""
    _check_reduction(reduction)
    _check_same_shape("binary_cross_entropy", self, target)
    p, target = _float(self), target.cast(_float(self).dtype)
    loss = -(target * p.log().maximum(-100) + (1 - target) * (1 - p).log().maximum(-100))
    return _reduce_loss(loss if weight is None else loss * weight, reduction)

  def binary_cross_entropy_with_logits(self: Tensor, target: Tensor, weight: Tensor | None = None,
                                       reduction: str = "mean", pos_weight: Tensor | None = None) -> Tensor:
    """Binary cross entropy of sigmoid(self), computed from the logits without overflow:
    (1 - t)*x + (1 + (pos_weight - 1)*t) * log(1 + exp(-x))."""
    _check_reduction(reduction)
    _check_same_shape("binary_cross_entropy_with_logits", self, target)
    x = _float(self)
    target = target.cast(x.dtype)
    # log(1 + exp(-x)) = max(-x, 0) + log(1 + exp(-|x|))
    log_sigmoid_negated = (-x).maximum(0) + _log1p_exp(-_abs(x))
    scale = 1 if pos_weight is None else (pos_weight - 1) * target + 1
    loss = (1 - target) * x + scale * log_sigmoid_negated
    return _reduce_loss(loss if weight is None else loss * weight, reduction)

  def binary_crossentropy(self: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """tinygrad's name for binary_cross_entropy (self holds probabilities)."""
    return self.binary_cross_entropy(target, reduction=reduction)

  def binary_crossentropy_logits(self: Tensor, target: Tensor, reduction: str = "mean",
                                 pos_weight: Tensor | None = None) -> Tensor:
    """tinygrad's name for binary_cross_entropy_with_logits."""
    return self.binary_cross_entropy_with_logits(target, reduction=reduction, pos_weight=pos_weight)

  def mse_loss(self: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    _check_reduction(reduction)
    difference = _float(self) - target
    return _reduce_loss(difference * difference, reduction)

  def l1_loss(self: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    _check_reduction(reduction)
    return _reduce_loss(_abs(_float(self) - target), reduction)
