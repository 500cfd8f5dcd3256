"""Tensor operations: reductions and scans built on the core sum / max / min."""
from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Sequence

from rawgrad.compiler.ir import Ops
from rawgrad.dtype import dtypes, sum_acc_dtype
from rawgrad.errors import ArgumentError, ShapeError
from rawgrad.tensor_ops.helpers import TensorBase, reduce_axes, resolve_axis, with_gradient

TOPK_SELECTION = 16  # topk of at most this many (along a longer axis) takes them one pass each, instead of sorting
SCAN_BLOCK = 64  # scans longer than this go block by block (cumsum of 1024x4096 rows: 190 ms in one step, 5.4 ms)
# rows this long or longer, when rows x size^2 comparisons come to SORT_NETWORK_WORK, are sorted by a bitonic network:
# measured on 2 cores, 4 rows of 16384 took 88.6 ms as size^2 comparisons and 56 ms through the network's 105 steps
# (of 4096: 11.5 and 39 ms); one row of 50257 210 and 71 ms (torch: 3 ms); 4 rows of 131072 92 ms through the
# network, ~6 s as comparisons at that rate
SORT_NETWORK, SORT_NETWORK_WORK = 2048, 1 << 30

Axis = int | Sequence[int] | None


class ValuesIndices(NamedTuple):
  values: Any
  indices: Any


class ReduceOps(TensorBase):
  """Mixin of rawgrad.tensor.Tensor."""
  __slots__ = ()

  def prod(self, axis: Axis = None, keepdim: bool = False, dtype: Any = None):
    dtype = dtype or sum_acc_dtype(self.dtype)
    if dtype in (dtypes.float16, dtypes.bfloat16): return self.cast(dtypes.float32).prod(axis, keepdim).cast(dtype)
    return self.cast(dtype)._reduce(Ops.MUL, axis, keepdim)

  def var(self, axis: Axis = None, keepdim: bool = False, correction: int = 1):
    """Variance with Bessel's correction by default (PyTorch's `correction=1`)."""
    axes = reduce_axes(axis, self.ndim)
    count = math.prod(self.shape[a] for a in axes) if self.ndim else 1
    centered = self - self.mean(axis, keepdim=True)
    return (centered * centered).sum(axis, keepdim) / max(count - correction, 0)

  def std(self, axis: Axis = None, keepdim: bool = False, correction: int = 1):
    variance = self.var(axis, keepdim, correction)
    # d std / d var = 1 / (2 std) is infinite where the values are all equal (0 * inf: nan); PyTorch takes 0 there
    return with_gradient(variance.sqrt(), (variance,), lambda grad, out, _: ((out > 0).where(grad / (2 * out), 0.0),))

  def var_mean(self, axis: Axis = None, keepdim: bool = False, correction: int = 1):
    return self.var(axis, keepdim, correction), self.mean(axis, keepdim)

  def std_mean(self, axis: Axis = None, keepdim: bool = False, correction: int = 1):
    return self.std(axis, keepdim, correction), self.mean(axis, keepdim)

  def any(self, axis: Axis = None, keepdim: bool = False):
    x = self.cast(dtypes.bool)
    # max has no identity; over an empty axis any is False, as a count of the true elements says
    if _has_empty_axis(x, axis): return x.sum(axis, keepdim) != 0
    return x.max(axis, keepdim)

  def all(self, axis: Axis = None, keepdim: bool = False):
    x = self.cast(dtypes.bool)
    if _has_empty_axis(x, axis): return x.logical_not().sum(axis, keepdim) == 0
    return x.min(axis, keepdim)

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
    peak = self.max(axis, keepdim=True)
    is_max = self == peak
    # nan is the maximum of a row holding one (as max says): its first nan, as in PyTorch
    if dtypes.is_float(self.dtype): is_max = is_max | ((self != self) & (peak != peak))
    # the first maximum has the largest value of size - position among the maxima
    countdown = (is_max.where(size - self._positions(axis), 0)).max(axis, keepdim)
    return (size - countdown).cast(dtypes.int64)

  def argmin(self, axis: int | None = None, keepdim: bool = False):
    if not dtypes.is_float(self.dtype): return self._invert_order().argmax(axis, keepdim)
    return (-self).argmax(axis, keepdim)

  def logsumexp(self, axis: Axis = None, keepdim: bool = False):
    if not dtypes.is_float(self.dtype): return _float(self, None).logsumexp(axis, keepdim)  # no shift that wraps
    # the shift by the peak cancels exactly, so it takes no part in the gradient
    peak = self.max(axis, keepdim=True).detach()
    # a row of -inf has no finite peak to subtract: shift by 0 there so the result is -inf, not nan
    if dtypes.is_float(self.dtype): peak = ((peak == math.inf) | (peak == -math.inf)).where(0, peak)
    shifted = (self - peak).exp().sum(axis, keepdim=True).log() + peak
    return shifted if keepdim else shifted.squeeze_axes(axis)

  def squeeze_axes(self, axis: Axis):
    axes = reduce_axes(axis, self.ndim)
    return self.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

  def softmax(self, axis: int = -1, dtype: Any = None):
    return softmax(_float(self, dtype), axis)

  def log_softmax(self, axis: int = -1, dtype: Any = None):
    return log_softmax(_float(self, dtype), axis)

  def softmin(self, axis: int = -1, dtype: Any = None):
    return softmax(-_float(self, dtype), axis)

  # *** sorting: each element's place in the order is the count of the elements that go before it ***

  def sort(self, dim: int = -1, descending: bool = False, stable: bool = False) -> ValuesIndices:
    """The values along `dim` in order, and their indices (int64). Always stable: equal values keep their order; nan
    counts as larger than everything, as in PyTorch. Short rows: O(size**2) comparisons per row, as one fused kernel;
    long ones (see SORT_NETWORK; of floats and integers up to 32 bits): a bitonic network, O(size log^2 size)."""
    if self.ndim == 0: return ValuesIndices(self, self.zeros_like(dtypes.int64))
    axis = resolve_axis(dim, self.ndim)
    moved = self.transpose(axis, -1)
    size = moved.shape[-1]
    if size >= SORT_NETWORK and moved.numel() * size >= SORT_NETWORK_WORK and _has_order_keys(self.dtype):
      values, indices = _network_sort(moved, descending)
      return ValuesIndices(values.transpose(axis, -1), indices.transpose(axis, -1))
    positions = type(self).arange(size, device=self.device)
    # chosen[..., p, i]: element i lands at place p
    chosen = _places(moved, descending).unsqueeze(-2) == positions.reshape(size, 1)
    values = chosen.where(moved.unsqueeze(-2), _zero(self)).sum(-1).cast(self.dtype)
    indices = chosen.where(positions.cast(dtypes.int64), 0).sum(-1)
    return ValuesIndices(values.transpose(axis, -1), indices.transpose(axis, -1))

  def argsort(self, dim: int = -1, descending: bool = False, stable: bool = False):
    return self.sort(dim, descending, stable).indices

  def topk(self, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> ValuesIndices:
    """The k largest (or smallest) values along `dim` and their indices, in order (also when sorted=False)."""
    axis = resolve_axis(dim, self.ndim)
    size = self.shape[axis] if self.ndim else 1
    if not 0 <= k <= size: raise ArgumentError(f"topk k={k} is out of range for dim {dim} of size {size}")
    if 0 < k <= TOPK_SELECTION < size and _has_order_keys(self.dtype): return self._select_top(k, axis, largest)
    values, indices = self.sort(axis, descending=largest)
    if self.ndim == 0: return ValuesIndices(values, indices)
    return ValuesIndices(values.narrow(axis, 0, k), indices.narrow(axis, 0, k))

  def _select_top(self, k: int, axis: int, largest: bool) -> ValuesIndices:
    """topk as k passes over the row, each taking the first of the best values not yet taken: the order and the
    ties of the stable sort (nan the largest, -0.0 equal to 0.0), O(k * size) instead of the sort's O(size^2)."""
    moved = self.transpose(axis, -1)
    size = moved.shape[-1]
    keys = _order_keys(moved)
    if not largest: keys = -keys
    positions = type(self).arange(size, device=self.device).cast(dtypes.int64)
    taken = moved.zeros_like(dtypes.bool)
    values, indices = [], []
    for _ in range(k):
      remaining = taken.where(dtypes.min(dtypes.int64), keys)
      best = taken.logical_not() & (remaining == remaining.max(-1, keepdim=True))
      # the first of the best: the largest countdown from the end
      index = size - best.where(size - positions, 0).max(-1, keepdim=True)
      picked = positions == index
      values.append(picked.where(moved, _zero(moved)).sum(-1, keepdim=True).cast(self.dtype))
      indices.append(index)
      taken = taken | picked
    return ValuesIndices(values[0].cat(*values[1:], dim=-1).transpose(axis, -1),
                         indices[0].cat(*indices[1:], dim=-1).transpose(axis, -1))

  # *** scans: element i along the axis combines elements 0..i, as one fused masked reduction (longer than
  # SCAN_BLOCK: in blocks, see _blocked_scan) ***

  def _scan(self, axis: int, fill: Any):
    """The (..., size, size) windows of the scan along `axis` (moved last), entries after the diagonal `fill`."""
    axis = resolve_axis(axis, self.ndim)
    moved = self.transpose(axis, -1)
    size = moved.shape[-1]
    earlier = type(self).arange(size, device=self.device).reshape(1, size) <= \
      type(self).arange(size, device=self.device).reshape(size, 1)
    # rows of the (size, size) mask pick the elements each output position combines
    window = earlier.where(moved.unsqueeze(-2).expand(*moved.shape[:-1], size, size), fill)
    return window, axis

  def _blocked_scan(self, axis: int, fill: Any, scan: Callable[[Any, int], Any], combine: Callable[[Any, Any], Any]):
    """The scan along `axis` of more than SCAN_BLOCK elements in blocks of SCAN_BLOCK: each block scanned alone,
    then combined with the scan of the totals of the blocks before it. Work O(n * SCAN_BLOCK), not O(n^2)."""
    axis = resolve_axis(axis, self.ndim)
    moved = self.transpose(axis, -1)
    outer, size = moved.shape[:-1], moved.shape[-1]
    blocks = -(-size // SCAN_BLOCK)
    keep = ((0, 0),) * len(outer)
    padded = moved.pad((*keep, (0, blocks * SCAN_BLOCK - size)), value=fill)
    inner = scan(padded.reshape(*outer, blocks, SCAN_BLOCK), -1)
    totals = inner.shrink((*[None] * len(outer), None, (SCAN_BLOCK - 1, SCAN_BLOCK))).reshape(*outer, blocks)
    before = scan(totals, -1).pad((*keep, (1, 0)), value=fill).shrink((*[None] * len(outer), (0, blocks)))
    scanned = combine(inner, before.unsqueeze(-1)).reshape(*outer, blocks * SCAN_BLOCK)
    return scanned.shrink((*[None] * len(outer), (0, size))).transpose(axis, -1)

  def _long_scan(self, axis: int) -> bool:
    return self.ndim > 0 and self.shape[resolve_axis(axis, self.ndim)] > SCAN_BLOCK

  def cumsum(self, axis: int = 0, dtype: Any = None):
    x = self.cast(dtype or sum_acc_dtype(self.dtype))
    if x.ndim == 0: return x.reshape(1).cumsum(axis).reshape(())
    if x._long_scan(axis): return x._blocked_scan(axis, 0, lambda t, a: t.cumsum(a), lambda a, b: a + b)
    window, axis = x._scan(axis, 0)
    return window.sum(-1).transpose(axis, -1)

  def cumprod(self, axis: int = 0, dtype: Any = None):
    x = self.cast(dtype or sum_acc_dtype(self.dtype))
    if x.ndim == 0: return x.reshape(1).cumprod(axis).reshape(())
    if x._long_scan(axis): return x._blocked_scan(axis, 1, lambda t, a: t.cumprod(a), lambda a, b: a * b)
    window, axis = x._scan(axis, 1)
    return window.prod(-1).transpose(axis, -1)

  def logcumsumexp(self, axis: int = 0):
    """log(cumsum(exp(self))) along `axis`, each prefix shifted by its own maximum (no overflow or underflow)."""
    x = _float(self, None)
    if x.ndim == 0 or x.shape[resolve_axis(axis, x.ndim)] == 0: return x
    if x._long_scan(axis):
      return x._blocked_scan(axis, -math.inf, lambda t, a: t.logcumsumexp(a), lambda a, b: a.logaddexp(b))
    window, axis = x._scan(axis, -math.inf)
    return window.logsumexp(-1).transpose(axis, -1)

  def cummax(self, axis: int = 0) -> ValuesIndices:
    if self.ndim == 0 or self.shape[resolve_axis(axis, self.ndim)] == 0:
      return ValuesIndices(self, self.zeros_like(dtypes.int64))  # nothing to scan
    axis = resolve_axis(axis, self.ndim)
    values = self._running_max(axis)
    indices = self._running_indices(values, axis)
    # the gradient goes where the indices point (PyTorch), not shared among tied elements as a max's would be
    values = with_gradient(values, (self,), lambda grad, out, x: (x.zeros_like().scatter_add(axis, indices, grad),))
    return ValuesIndices(values, indices)

  def _running_max(self, axis: int):
    lowest = -math.inf if dtypes.is_float(self.dtype) else dtypes.min(self.dtype)
    if self._long_scan(axis):
      return self._blocked_scan(axis, lowest, lambda t, a: t._running_max(a), lambda a, b: a.maximum(b))
    window, resolved = self._scan(axis, lowest)
    return window.max(-1).transpose(resolved, -1)

  def cummin(self, axis: int = 0) -> ValuesIndices:
    if not dtypes.is_float(self.dtype):
      inverted = self._invert_order().cummax(axis)
      return ValuesIndices(inverted.values._invert_order(), inverted.indices)
    negated = (-self).cummax(axis)
    return ValuesIndices(-negated.values, negated.indices)

  def _running_indices(self, running: Any, axis: int):
    """The index of the last element so far equal to the running extreme (PyTorch's choice for ties; a nan, once
    there, is the extreme): the running maximum of the positions where an element is the extreme so far."""
    reached = (self == running) | ((self != self) & (running != running))
    return reached.where(self._positions(axis), -1)._running_max(axis).cast(dtypes.int64)


# *** helpers ***

def _float(x: Any, dtype: Any) -> Any:
  """x in `dtype` if given, else in its own dtype if that is a float, else in the default float."""
  x = x.cast(dtype) if dtype is not None else x
  return x if dtypes.is_float(x.dtype) else x.cast(dtypes.default_float)


def _zero(x: Any) -> Any:
  return False if x.dtype == dtypes.bool else 0


def _has_empty_axis(x: Any, axis: Axis) -> bool:
  return x.ndim > 0 and any(x.shape[a] == 0 for a in reduce_axes(axis, x.ndim))


def _has_order_keys(dtype: Any) -> bool:
  return dtypes.is_float(dtype) or (dtypes.is_int(dtype) and dtype.itemsize <= 4)


def _order_keys(x: Any) -> Any:
  """int64 keys in the order of the stable sort: a float's sign and magnitude bits as a signed number (-0.0 and 0.0
  both 0), every nan above +inf; integers as themselves. Their negation is exact too."""
  if not dtypes.is_float(x.dtype): return x.cast(dtypes.int64)
  bits = x.bitcast({2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}[x.dtype.itemsize]).cast(dtypes.int64)
  magnitude_mask = (1 << (8 * x.dtype.itemsize - 1)) - 1
  magnitude = bits & magnitude_mask
  return (x != x).where(magnitude_mask, (bits < 0).where(-magnitude, magnitude))


def _network_sort(x: Any, descending: bool) -> tuple[Any, Any]:
  """The last axis of x sorted by a bitonic network (Batcher): log2(n) (log2(n) + 1) / 2 steps over n, the size
  rounded up to a power of two, each an elementwise kernel comparing element i with element i ^ j (the rows viewed as
  (n / 2j, 2, j): the pairs face each other across the 2) and exchanging them where they are out of order, blocks of
  2j whose i & k is set ordered the other way. What is sorted is one int64 per element, its order key (a 32-bit
  number) times 2^32 plus its index: all distinct, in the stable sort's order. The values are then gathered by
  the indices (a gather, and a scatter for the gradient)."""
  outer, size = x.shape[:-1], x.shape[-1]
  n = 1 << (size - 1).bit_length()
  keys = _order_keys(x.detach())   # from -2^31 to 2^31 - 1; the order takes no part in the gradient
  if descending: keys = -keys - 1
  positions = type(x).arange(n, device=x.device).cast(dtypes.int64)
  # the padding sorts last: the largest key, and after any element of that key by its index
  ordered = keys.pad(((0, 0),) * len(outer) + ((0, n - size),), value=(1 << 31) - 1) * (1 << 32) + positions
  k = 2
  while k <= n:
    j = k // 2
    while j >= 1:
      blocks = n // (2 * j)
      pairs = ordered.reshape(*outer, blocks, 2, j)
      partners = pairs.flip(-2)
      # the blocks of 2j inside a block of 2k ordered from the largest down: those whose i & k is set (an int32 AND,
      # whose k becomes a kernel parameter: the steps of one j share a compiled kernel)
      reversed_block = (((type(x).arange(blocks, device=x.device) * (2 * j)) & k) != 0).reshape(blocks, 1, 1)
      takes_lower = (type(x).arange(2, device=x.device) == 0).reshape(2, 1) != reversed_block
      ordered = takes_lower.where(pairs.minimum(partners), pairs.maximum(partners)).reshape(*outer, n).realize()
      j //= 2
    k *= 2
  # realized: a gather by a loaded index is a plain gather, and its gradient a scatter (an index computed in the
  # kernel left the gradient a one-hot sum over size^2 terms, realized as a size x size mask)
  indices = (ordered & ((1 << 32) - 1)).shrink((*[None] * len(outer), (0, size))).realize()
  return x.gather(-1, indices), indices


def _places(x: Any, descending: bool) -> Any:
  """The place of each element of the last axis in the stable order: how many elements go before it. nan is the
  largest value (last ascending, first descending), equal values keep their order."""
  size = x.shape[-1]
  this, other = x.unsqueeze(-1), x.unsqueeze(-2)  # [..., i, j]: element i against element j
  this_nan, other_nan = this != this, other != other
  if descending: before = (other > this) | (other_nan & this_nan.logical_not())
  else: before = (other < this) | (this_nan & other_nan.logical_not())
  positions = type(x).arange(size, device=x.device)
  earlier = positions.reshape(1, size) < positions.reshape(size, 1)
  tie = (other == this) | (this_nan & other_nan)
  return (before | (tie & earlier)).sum(-1)


def softmax(x: Any, axis: int) -> Any:
  """exp(x - max) / sum, differentiated as PyTorch does, result * (grad - sum(grad * result)), with the cancellation
  at a dominant element taken out (see _dominant)."""
  exponentials = (x - x.max(axis, keepdim=True).detach()).exp()
  result = exponentials / exponentials.sum(axis, keepdim=True)

  def rule(grad: Any, out: Any, _: Any) -> tuple[Any]:
    dominant, others = _dominant(out, axis)
    weighted = (grad * out).sum(axis, keepdim=True)
    return (out * dominant.where(grad * others(out) - others(grad * out), grad - weighted),)
  return with_gradient(result, (x,), rule)


def log_softmax(x: Any, axis: int) -> Any:
  """x - max - log(sum(exp(x - max))), differentiated as PyTorch does, grad - exp(result) * sum(grad), with the
  cancellation at a dominant element taken out as softmax does (see _dominant), its mask and the others' share taken
  from the forward's sum. The shift comes first: adding the peak back (as logsumexp does) would round away small
  differences. The sum of the exponentials is 1 (the peak's) plus the rest, so its logarithm is log1p(rest): the
  log-probability of a dominant element keeps its digits."""
  shifted = x - x.max(axis, keepdim=True).detach()
  at_peak = shifted == 0
  rest = at_peak.where(0, shifted.exp()).sum(axis, keepdim=True) + (at_peak.sum(axis, keepdim=True) - 1)
  result = shifted - rest.log1p()

  def rule(grad: Any, out: Any, _: Any) -> tuple[Any]:
    # the probability above 1/2 is the peak's, alone at the peak, 1 / (1 + rest) with rest < 1: the others' share is
    # rest / (1 + rest), and the mask needs no exponential (the sums over the gradient read no logits' exponentials)
    dominant = at_peak & (rest < 1)
    total = grad.sum(axis, keepdim=True)
    others_grad = dominant.where(0, grad).sum(axis, keepdim=True)
    probability = out.exp()
    return (dominant.where(grad * (rest / (rest + 1)) - probability * others_grad, grad - probability * total),)
  return with_gradient(result, (x,), rule)


def _dominant(probability: Any, axis: int) -> tuple[Any, Any]:
  """Where a probability is above 1/2 (one element at most), 1 - p rounds away the other elements' share, and
  grad - p * sum(grad) cancels. There the gradient is formed from sums over the other elements only, which are exact
  up to their own rounding: (1 - p) = sum of the others' p, and sum(grad) - grad = sum of the others' grad. Returns
  the mask and that sum over the others."""
  dominant = probability > 0.5
  return dominant, lambda values: dominant.where(0, values).sum(axis, keepdim=True)
