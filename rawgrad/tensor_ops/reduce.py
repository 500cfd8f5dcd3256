"""Tensor operations: reductions and scans built on the core sum / max / min."""
from __future__ import annotations

import math
from typing import Any, NamedTuple, Sequence

from rawgrad.compiler.ir import Ops
from rawgrad.dtype import dtypes, sum_acc_dtype
from rawgrad.errors import ShapeError
from rawgrad.tensor_ops.helpers import TensorBase, reduce_axes, resolve_axis

Axis = int | Sequence[int] | None


class ValuesIndices(NamedTuple):
  values: Any
  indices: Any


class ReduceOps(TensorBase):
  """Mixin of rawgrad.tensor.Tensor."""
  __slots__ = ()

  def prod(self, axis: Axis = None, keepdim: bool = False, dtype: Any = None):
    return self.cast(dtype or sum_acc_dtype(self.dtype))._reduce(Ops.MUL, axis, keepdim)

  def var(self, axis: Axis = None, keepdim: bool = False, correction: int = 1):
    """Variance with Bessel's correction by default (PyTorch's `correction=1`)."""
    axes = reduce_axes(axis, self.ndim)
    count = math.prod(self.shape[a] for a in axes) if self.ndim else 1
    centered = self - self.mean(axis, keepdim=True)
    return (centered * centered).sum(axis, keepdim) / max(count - correction, 0)

  def std(self, axis: Axis = None, keepdim: bool = False, correction: int = 1):
    return self.var(axis, keepdim, correction).sqrt()

  def var_mean(self, axis: Axis = None, keepdim: bool = False, correction: int = 1):
    return self.var(axis, keepdim, correction), self.mean(axis, keepdim)

  def std_mean(self, axis: Axis = None, keepdim: bool = False, correction: int = 1):
    return self.std(axis, keepdim, correction), self.mean(axis, keepdim)

  def any(self, axis: Axis = None, keepdim: bool = False):
    return self.cast(dtypes.bool).max(axis, keepdim)

  def all(self, axis: Axis = None, keepdim: bool = False):
    return self.cast(dtypes.bool).min(axis, keepdim)

  def _positions(self, axis: int):
    """The index along `axis` of every element, as an int32 tensor of self's shape."""
    shape = [1] * self.ndim
    shape[axis] = self.shape[axis]
    return type(self).arange(self.shape[axis], device=self.device).reshape(shape).expand(self.shape)

  def argmax(self, axis: int | None = None, keepdim: bool = False):
    """The index of the first maximum (int64, as in PyTorch); over the flattened tensor when axis is None."""
    if axis is None: return self.reshape(-1).argmax(0)
    axis = resolve_axis(axis, self.ndim)
    size = self.shape[axis]
    if size == 0: raise ShapeError(f"argmax of an empty axis {axis} of shape {self.shape}")
    is_max = self == self.max(axis, keepdim=True)
    # the first maximum has the largest value of size - position among the maxima
    countdown = (is_max.where(size - self._positions(axis), 0)).max(axis, keepdim)
    return (size - countdown).cast(dtypes.int64)

  def argmin(self, axis: int | None = None, keepdim: bool = False):
    if not dtypes.is_float(self.dtype): return self._invert_order().argmax(axis, keepdim)
    return (-self).argmax(axis, keepdim)

  def logsumexp(self, axis: Axis = None, keepdim: bool = False):
    peak = self.max(axis, keepdim=True)
    # a row of -inf has no finite peak to subtract: shift by 0 there so the result is -inf, not nan
    if dtypes.is_float(self.dtype): peak = ((peak == math.inf) | (peak == -math.inf)).where(0, peak)
    shifted = (self - peak).exp().sum(axis, keepdim=True).log() + peak
    return shifted if keepdim else shifted.squeeze_axes(axis)

  def squeeze_axes(self, axis: Axis):
    axes = reduce_axes(axis, self.ndim)
    return self.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

  def softmax(self, axis: int = -1, dtype: Any = None):
    x = self.cast(dtype) if dtype is not None else self
    if not dtypes.is_float(x.dtype): x = x.cast(dtypes.default_float)
    exponentials = (x - x.max(axis, keepdim=True)).exp()
    return exponentials / exponentials.sum(axis, keepdim=True)

  def log_softmax(self, axis: int = -1, dtype: Any = None):
    x = self.cast(dtype) if dtype is not None else self
    if not dtypes.is_float(x.dtype): x = x.cast(dtypes.default_float)
    # shift first: adding the peak back (as logsumexp does) would round away the small differences
    shifted = x - x.max(axis, keepdim=True)
    return shifted - shifted.exp().sum(axis, keepdim=True).log()

  # *** scans: element i along the axis combines elements 0..i, as one fused masked reduction ***

  def _scan(self, axis: int, fill: Any):
    axis = resolve_axis(axis, self.ndim)
    moved = self.transpose(axis, -1)
    size = moved.shape[-1]
    earlier = type(self).arange(size, device=self.device).reshape(1, size) <= \
      type(self).arange(size, device=self.device).reshape(size, 1)
    # rows of the (size, size) mask pick the elements each output position combines
    window = earlier.where(moved.unsqueeze(-2).expand(*moved.shape[:-1], size, size), fill)
    return window, axis

  def cumsum(self, axis: int = 0, dtype: Any = None):
    x = self.cast(dtype or sum_acc_dtype(self.dtype))
    window, axis = x._scan(axis, 0)
    return window.sum(-1).transpose(axis, -1)

  def cumprod(self, axis: int = 0, dtype: Any = None):
    x = self.cast(dtype or sum_acc_dtype(self.dtype))
    window, axis = x._scan(axis, 1)
    return window.prod(-1).transpose(axis, -1)

  def cummax(self, axis: int = 0) -> ValuesIndices:
    lowest = -math.inf if dtypes.is_float(self.dtype) else dtypes.min(self.dtype)
    window, resolved = self._scan(axis, lowest)
    values = window.max(-1).transpose(resolved, -1)
    return ValuesIndices(values, self._scan_indices(values, resolved))

  def cummin(self, axis: int = 0) -> ValuesIndices:
    if not dtypes.is_float(self.dtype):
      inverted = self._invert_order().cummax(axis)
      return ValuesIndices(inverted.values._invert_order(), inverted.indices)
    negated = (-self).cummax(axis)
    return ValuesIndices(-negated.values, negated.indices)

  def _scan_indices(self, running: Any, axis: int):
    """Index of the last element so far equal to the running extreme (PyTorch's choice for ties)."""
    moved, target = self.transpose(axis, -1), running.transpose(axis, -1)
    size = moved.shape[-1]
    positions = type(self).arange(size, device=self.device)
    earlier = positions.reshape(1, size) <= positions.reshape(size, 1)
    hits = earlier & (moved.unsqueeze(-2) == target.unsqueeze(-1))
    return hits.where(positions.reshape(1, size), -1).max(-1).cast(dtypes.int64).transpose(axis, -1)

