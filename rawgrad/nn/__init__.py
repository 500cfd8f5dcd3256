"""Layers with torch.nn's names, constructor signatures and default initializations.

A layer holds its parameters as Tensor attributes (`weight`, `bias`, ...; requires_grad=True, as torch's Parameters)
and computes its output in `forward`, which `__call__` runs. Nothing is registered anywhere:
`rawgrad.nn.state.get_parameters(model)` and `get_state_dict(model)` find the tensors by walking attributes, lists and
dicts, so a model can be any object.

Training mode is torch's per-module `training` flag: True after construction, switched for a layer and every layer
it holds by `module.train()` / `module.eval()`. Only BatchNorm reads it: in training it normalizes with the batch
statistics and updates its running statistics in place; in evaluation it normalizes with the running statistics.
"""
from __future__ import annotations

import math
import types
from typing import Any, Iterator, Sequence

import numpy as np

from rawgrad.dtype import DType, dtypes, to_dtype
from rawgrad.errors import ShapeError
from rawgrad.nn import init, optim, state  # noqa: F401  (rawgrad.nn.init, as torch.nn.init)
from rawgrad.tensor import Tensor

Size = int | Sequence[int]


class Module:
  """The base of the layers: torch's `training` flag, `forward` through `__call__`, and the state helpers.
  Subclass it for models of your own to get `train()`, `eval()`, `parameters()` and the state dict methods."""
  training: bool = True

  def forward(self, *args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError(f"{type(self).__name__} does not define forward()")

  def __call__(self, *args: Any, **kwargs: Any) -> Any:
    return self.forward(*args, **kwargs)

  def train(self, mode: bool = True) -> Module:
    """Set `training` on this module and on every module it holds (in attributes, lists and dicts)."""
    for module in _modules(self): module.training = mode
    return self

  def eval(self) -> Module:
    return self.train(False)

  def parameters(self) -> list[Tensor]:
    return state.get_parameters(self)

  def state_dict(self, prefix: str = "") -> dict[str, Tensor]:
    return state.get_state_dict(self, prefix)

  def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True) -> None:
    state.load_state_dict(self, state_dict, strict)


def _modules(root: Any) -> Iterator[Module]:
  """Every Module reachable from root through attributes, lists, tuples and dicts, each once."""
  seen: set[int] = set()
  pending = [root]
  while pending:
    obj = pending.pop()
    if id(obj) in seen or isinstance(obj, Tensor): continue
    seen.add(id(obj))
    if isinstance(obj, Module): yield obj
    if isinstance(obj, dict): pending.extend(obj.values())
    elif isinstance(obj, (list, tuple)): pending.extend(obj)
    elif hasattr(obj, "__dict__") and not isinstance(obj, (type, types.ModuleType)): pending.extend(vars(obj).values())


def _pair(value: Size, count: int, name: str) -> tuple[int, ...]:
  values = (value,) * count if isinstance(value, int) else tuple(value)
  if len(values) != count: raise ValueError(f"{name} must be an int or {count} ints, got {value!r}")
  return values


def _shape(normalized_shape: Size) -> tuple[int, ...]:
  return (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)


def _uniform(shape: tuple[int, ...], bound: float, dtype: DType | None, device: str | None) -> Tensor:
  return Tensor.uniform(*shape, low=-bound, high=bound, dtype=dtype, device=device, requires_grad=True)


def _kaiming_weight(shape: tuple[int, ...], dtype: DType | None, device: str | None) -> Tensor:
  # torch's reset_parameters: kaiming_uniform_(a=sqrt(5)), i.e. uniform in +-1/sqrt(fan_in)
  return Tensor.kaiming_uniform(*shape, a=math.sqrt(5), dtype=dtype, device=device, requires_grad=True)


def _fan_in_bias(count: int, fan_in: int, dtype: DType | None, device: str | None) -> Tensor:
  return _uniform((count,), 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0, dtype, device)


def _filled(shape: tuple[int, ...], value: float, dtype: DType | None, device: str | None,
            requires_grad: bool = True) -> Tensor:
  """A tensor of `value` backed by a buffer of its own, so optimizers and BatchNorm can assign into it in place.
  requires_grad=False marks state an optimizer must not train (running statistics, counters)."""
  dtype = dtypes.default_float if dtype is None else to_dtype(dtype)
  if dtype == dtypes.bfloat16:  # numpy has no bfloat16: fill on the device
    filled = Tensor.full(shape, value, dtype, device).contiguous()
    filled.requires_grad = requires_grad
    return filled
  return Tensor(np.full(shape, value, dtypes.to_numpy(dtype)), device, dtype, requires_grad)


def _check_channels(name: str, x: Tensor, channels: int, axis: int = 1) -> None:
  if x.ndim <= axis or x.shape[axis] != channels:
    raise ShapeError(f"{name}: expected input with {channels} channels in axis {axis}, got shape {x.shape}")


# *** linear and convolution ***

class Linear(Module):
  """y = x @ weight.T + bias, with weight (out_features, in_features)."""

  def __init__(self, in_features: int, out_features: int, bias: bool = True, device: str | None = None,
               dtype: DType | None = None):
    self.in_features, self.out_features = in_features, out_features
    self.weight = _kaiming_weight((out_features, in_features), dtype, device)
    self.bias = _fan_in_bias(out_features, in_features, dtype, device) if bias else None

  def forward(self, x: Tensor) -> Tensor:
    return x.linear(self.weight, self.bias)


def _check_conv_arguments(name: str, in_channels: int, out_channels: int, groups: int, padding_mode: str) -> None:
  if padding_mode != "zeros":
    raise ValueError(f"{name}: only padding_mode='zeros' is supported, got {padding_mode!r}")
  if groups < 1 or in_channels % groups or out_channels % groups:
    raise ValueError(f"{name}: in_channels {in_channels} and out_channels {out_channels} must be divisible by "
                     f"groups {groups}")


class _ConvNd(Module):
  """Shared construction of Conv1d and Conv2d: weight (out, in/groups, *kernel) and bias (out,)."""
  dims = 0

  def __init__(self, in_channels: int, out_channels: int, kernel_size: Size, stride: Size = 1,
               padding: Size | str = 0, dilation: Size = 1, groups: int = 1, bias: bool = True,
               padding_mode: str = "zeros", device: str | None = None, dtype: DType | None = None):
    _check_conv_arguments(type(self).__name__, in_channels, out_channels, groups, padding_mode)
    self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
    self.kernel_size = _pair(kernel_size, self.dims, "kernel_size")
    self.stride, self.dilation = stride, dilation
    self.padding = padding
    self.weight = _kaiming_weight((out_channels, in_channels // groups, *self.kernel_size), dtype, device)
    fan_in = in_channels // groups * math.prod(self.kernel_size)
    self.bias = _fan_in_bias(out_channels, fan_in, dtype, device) if bias else None


class Conv1d(_ConvNd):
  dims = 1

  def forward(self, x: Tensor) -> Tensor:
    return x.conv1d(self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class Conv2d(_ConvNd):
  dims = 2

  def forward(self, x: Tensor) -> Tensor:
    return x.conv2d(self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class ConvTranspose2d(Module):
  """The transposed convolution, with weight (in, out/groups, kh, kw) as in torch."""

  def __init__(self, in_channels: int, out_channels: int, kernel_size: Size, stride: Size = 1, padding: Size = 0,
               output_padding: Size = 0, groups: int = 1, bias: bool = True, dilation: Size = 1,
               padding_mode: str = "zeros", device: str | None = None, dtype: DType | None = None):
    _check_conv_arguments("ConvTranspose2d", in_channels, out_channels, groups, padding_mode)
    self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
    self.kernel_size = _pair(kernel_size, 2, "kernel_size")
    self.stride, self.padding, self.output_padding, self.dilation = stride, padding, output_padding, dilation
    self.weight = _kaiming_weight((in_channels, out_channels // groups, *self.kernel_size), dtype, device)
    # torch takes fan_in from the weight's second axis here: out_channels / groups * kernel area
    fan_in = out_channels // groups * math.prod(self.kernel_size)
    self.bias = _fan_in_bias(out_channels, fan_in, dtype, device) if bias else None

  def forward(self, x: Tensor) -> Tensor:
    return x.conv_transpose2d(self.weight, self.bias, self.stride, self.padding, self.output_padding, self.groups,
                              self.dilation)


# *** normalization ***

class BatchNorm(Module):
  """Batch normalization over every axis but the channel axis 1: (N, C), (N, C, L), (N, C, H, W), ...

  In training mode it normalizes with the batch's mean and biased variance and moves the running statistics toward
  them (`momentum`, or a cumulative average when momentum is None) with the unbiased variance, as torch does. The
  updates are `assign`s into the running statistics' buffers: lazy, they run in the schedule that realizes them,
  e.g. the optimizer step's, since `schedule_step()` returns every tensor it was given that needs no gradient."""

  def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
               track_running_stats: bool = True, device: str | None = None, dtype: DType | None = None):
    self.num_features, self.eps, self.momentum = num_features, eps, momentum
    self.affine, self.track_running_stats = affine, track_running_stats
    self.weight = _filled((num_features,), 1.0, dtype, device) if affine else None
    self.bias = _filled((num_features,), 0.0, dtype, device) if affine else None
    if track_running_stats:
      self.running_mean = _filled((num_features,), 0.0, dtype, device, requires_grad=False)
      self.running_var = _filled((num_features,), 1.0, dtype, device, requires_grad=False)
      self.num_batches_tracked = _filled((), 0, dtypes.int64, device, requires_grad=False)
    else:
      self.running_mean = self.running_var = self.num_batches_tracked = None

  def forward(self, x: Tensor) -> Tensor:
    _check_channels(type(self).__name__, x, self.num_features)
    if self.training or not self.track_running_stats:
      axes = tuple(a for a in range(x.ndim) if a != 1)
      mean, var = x.mean(axes), x.var(axes, correction=0)
      if self.training and self.track_running_stats: self._track(mean.detach(), var.detach(), x.numel() // x.shape[1])
    else:
      mean, var = self.running_mean, self.running_var
    return x.batchnorm(self.weight, self.bias, mean, (var + self.eps).rsqrt())

  def _track(self, mean: Tensor, var: Tensor, count: int) -> None:
    if count < 2:
      raise ValueError(f"{type(self).__name__}: training needs more than one value per channel, got {count}")
    self.num_batches_tracked.assign(self.num_batches_tracked + 1)
    if self.momentum is None:
      # a cumulative average: the n-th batch has weight 1/n
      momentum = 1 / self.num_batches_tracked.cast(self.running_mean.dtype)
    else:
      momentum = self.momentum
    self.running_mean.assign(self.running_mean * (1 - momentum) + mean * momentum)
    self.running_var.assign(self.running_var * (1 - momentum) + var * (count / (count - 1)) * momentum)


BatchNorm1d = BatchNorm
BatchNorm2d = BatchNorm


class LayerNorm(Module):
  """Normalize over the last len(normalized_shape) axes, then scale by weight and shift by bias."""

  def __init__(self, normalized_shape: Size, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
               device: str | None = None, dtype: DType | None = None):
    self.normalized_shape, self.eps = _shape(normalized_shape), eps
    self.weight = _filled(self.normalized_shape, 1.0, dtype, device) if elementwise_affine else None
    self.bias = _filled(self.normalized_shape, 0.0, dtype, device) if elementwise_affine and bias else None

  def forward(self, x: Tensor) -> Tensor:
    if tuple(x.shape[x.ndim - len(self.normalized_shape):]) != self.normalized_shape:
      raise ShapeError(f"LayerNorm: input of shape {x.shape} does not end in normalized_shape "
                       f"{self.normalized_shape}")
    return x.layer_norm(self.normalized_shape, self.weight, self.bias, self.eps)


class GroupNorm(Module):
  """Normalize each of num_groups groups of channels (axis 1) over the group's channels and all spatial axes."""

  def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True,
               device: str | None = None, dtype: DType | None = None):
    if num_groups < 1 or num_channels % num_groups:
      raise ValueError(f"GroupNorm: num_channels {num_channels} must be divisible by num_groups {num_groups}")
    self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
    self.weight = _filled((num_channels,), 1.0, dtype, device) if affine else None
    self.bias = _filled((num_channels,), 0.0, dtype, device) if affine else None

  def forward(self, x: Tensor) -> Tensor:
    _check_channels("GroupNorm", x, self.num_channels)
    return x.group_norm(self.num_groups, self.weight, self.bias, self.eps)


class RMSNorm(Module):
  """x / sqrt(mean(x**2) + eps) * weight over the last len(normalized_shape) axes; eps=None is the dtype's
  machine epsilon, as in torch."""

  def __init__(self, normalized_shape: Size, eps: float | None = None, elementwise_affine: bool = True,
               device: str | None = None, dtype: DType | None = None):
    self.normalized_shape, self.eps = _shape(normalized_shape), eps
    self.weight = _filled(self.normalized_shape, 1.0, dtype, device) if elementwise_affine else None

  def forward(self, x: Tensor) -> Tensor:
    if tuple(x.shape[x.ndim - len(self.normalized_shape):]) != self.normalized_shape:
      raise ShapeError(f"RMSNorm: input of shape {x.shape} does not end in normalized_shape {self.normalized_shape}")
    return x.rms_norm(self.normalized_shape, self.weight, self.eps)


# *** embedding ***

class Embedding(Module):
  """Rows of weight (num_embeddings, embedding_dim) picked by integer indices; weight starts standard normal. The
  padding_idx row starts at zero and gets no gradient, as in torch."""

  def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
               device: str | None = None, dtype: DType | None = None):
    if padding_idx is not None:
      if not -num_embeddings <= padding_idx < num_embeddings:
        raise ValueError(f"Embedding: padding_idx {padding_idx} is out of range for {num_embeddings} embeddings")
      padding_idx %= num_embeddings
    self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, padding_idx
    weight = Tensor.normal(num_embeddings, embedding_dim, dtype=dtype, device=device)
    if padding_idx is not None: weight = _rows_except(padding_idx, weight).where(weight, 0.0).cast(weight.dtype)
    weight.requires_grad = True
    self.weight = weight

  def forward(self, indices: Tensor) -> Tensor:
    if not dtypes.is_int(indices.dtype):
      raise TypeError(f"Embedding: indices must be integers, got {indices.dtype}")
    weight = self.weight
    # the same values, but the padding row's gradient stops here
    if self.padding_idx is not None: weight = _rows_except(self.padding_idx, weight).where(weight, weight.detach())
    return indices.embedding(weight)


def _rows_except(row: int, weight: Tensor) -> Tensor:
  """A (rows, 1) mask of weight's rows, False at `row`."""
  rows = Tensor.arange(weight.shape[0], device=weight.device).reshape(weight.shape[0], 1)
  return rows != row


__all__ = ["BatchNorm", "BatchNorm1d", "BatchNorm2d", "Conv1d", "Conv2d", "ConvTranspose2d", "Embedding", "GroupNorm",
           "LayerNorm", "Linear", "Module", "RMSNorm", "optim", "state"]
