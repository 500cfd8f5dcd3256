"""Tensor operations: shape.

Joining, splitting, repeating, padding with modes, gathering, scattering and PyTorch's advanced indexing. All of it is
built from the core movement, elementwise and reduce operations, so it stays lazy, fuses, and is differentiable.

Reading at data-dependent positions (gather, scatter, index tensors) has no primitive of its own: it is written as a
one-hot comparison of the index against an arange over the indexed axis, summed over that axis. That costs
O(output * axis size) work but stays one fused kernel with simple index arithmetic. Index values out of range raise
IndexOutOfRange: at once where the host has them, else at the next host read (tensor_ops/bounds.py).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from rawgrad.dtype import DType, dtypes, least_upper_dtype
from rawgrad.errors import ArgumentError, IndexOutOfRange, ShapeError
from rawgrad.helpers import prod
from rawgrad.tensor_ops.bounds import check_index_values
from rawgrad.tensor_ops.helpers import TensorBase, broadcast_shape, resolve_axis, shape_arg, with_gradient

if TYPE_CHECKING:
  from rawgrad.tensor import Tensor

PAD_MODES = ("constant", "reflect", "replicate", "circular")
SCATTER_REDUCTIONS = ("sum", "prod", "mean", "amax", "amin")


class ShapeOps(TensorBase):
  """Mixin of rawgrad.tensor.Tensor."""
  __slots__ = ()

  @staticmethod
  def einsum(formula: str, *operands: Any) -> Any:
    return _einsum(formula, *operands)

  def interpolate(self, size: Any = None, scale_factor: Any = None, mode: str = "nearest",
                  align_corners: bool | None = None) -> Any:
    return _interpolate(self, size, scale_factor, mode, align_corners)

  # *** reshaping and reordering ***

  def unflatten(self, dim: int, sizes: Sequence[int]) -> Tensor:
    """Split dimension `dim` into `sizes` (one entry may be -1)."""
    axis, sizes = _axis(dim, self.ndim), tuple(sizes)
    size = self.shape[axis]
    if sizes.count(-1) > 1: raise ShapeError(f"unflatten sizes {sizes} have more than one -1")
    known = prod(s for s in sizes if s != -1)
    if -1 in sizes and known and size % known == 0: sizes = tuple(size // known if s == -1 else s for s in sizes)
    if prod(sizes) != size or any(s < 0 for s in sizes):
      raise ShapeError(f"unflatten sizes {sizes} do not multiply to {size}, the size of dim {dim} of {self.shape}")
    return self.reshape(*self.shape[:axis], *sizes, *self.shape[axis + 1:])

  def view_as(self, other: Tensor) -> Tensor:
    return self.reshape(other.shape)

  def reshape_as(self, other: Tensor) -> Tensor:
    return self.reshape(other.shape)

  def expand_as(self, other: Tensor) -> Tensor:
    return self.expand(other.shape)

  def movedim(self, source: int | Sequence[int], destination: int | Sequence[int]) -> Tensor:
    """Move the dims `source` to the positions `destination`; the other dims keep their order."""
    sources, destinations = _int_tuple(source), _int_tuple(destination)
    if len(sources) != len(destinations):
      raise ValueError(f"movedim needs as many sources as destinations, got {sources} and {destinations}")
    sources = tuple(_axis(d, self.ndim) for d in sources)
    destinations = tuple(_axis(d, self.ndim) for d in destinations)
    if len(set(sources)) != len(sources) or len(set(destinations)) != len(destinations):
      raise ValueError(f"movedim dims repeat: source {source}, destination {destination}")
    order: list[int | None] = [None] * self.ndim
    for src, dst in zip(sources, destinations): order[dst] = src
    rest = iter(d for d in range(self.ndim) if d not in sources)
    return self.permute(tuple(d if d is not None else next(rest) for d in order))

  def moveaxis(self, source: int | Sequence[int], destination: int | Sequence[int]) -> Tensor:
    return self.movedim(source, destination)

  def swapaxes(self, axis0: int, axis1: int) -> Tensor:
    return self.transpose(axis0, axis1)

  def swapdims(self, dim0: int, dim1: int) -> Tensor:
    return self.transpose(dim0, dim1)

  def narrow(self, dim: int, start: int, length: int) -> Tensor:
    """The `length` elements of dim `dim` from `start` (negative counts from the end)."""
    axis = _axis(dim, self.ndim)
    size = self.shape[axis]
    if not -size <= start <= size:
      raise IndexOutOfRange(f"narrow start {start} is out of range for dim {dim} of size {size}")
    start = start % size if start < 0 else start
    if length < 0 or start + length > size:
      raise IndexOutOfRange(f"narrow of length {length} from {start} does not fit dim {dim} of size {size}")
    return self.shrink(tuple((start, start + length) if d == axis else None for d in range(self.ndim)))

  # *** repeating ***

  def repeat(self, *repeats: Any) -> Tensor:
    """Tile the tensor `repeats[i]` times along dim i, as torch.Tensor.repeat (extra leading repeats add dims)."""
    repeats = shape_arg(repeats)
    if len(repeats) < self.ndim:
      raise ShapeError(f"repeat needs at least {self.ndim} repeat counts for shape {self.shape}, got {repeats}")
    if any(r < 0 for r in repeats): raise ShapeError(f"repeat counts must not be negative, got {repeats}")
    shape = (1,) * (len(repeats) - self.ndim) + tuple(self.shape)
    # a new axis of size `count` before each old axis, broadcast, then merged with it
    spread = self.reshape(tuple(d for size in shape for d in (1, size)))
    tiled = spread.expand(tuple(d for count, size in zip(repeats, shape) for d in (count, size)))
    return tiled.reshape(tuple(count * size for count, size in zip(repeats, shape)))

  def tile(self, *dims: Any) -> Tensor:
    dims = shape_arg(dims)
    return self.repeat((1,) * (self.ndim - len(dims)) + dims)

  def repeat_interleave(self, repeats: int, dim: int | None = None) -> Tensor:
    """Repeat each element `repeats` times along `dim` (of the flattened tensor when dim is None)."""
    if isinstance(repeats, bool) or not isinstance(repeats, int):
      raise TypeError(f"repeat_interleave supports an int count of repeats, got {type(repeats).__name__}")
    if repeats < 0: raise ValueError(f"repeat_interleave count must not be negative, got {repeats}")
    if dim is None: return self.flatten().repeat_interleave(repeats, 0)
    axis = _axis(dim, self.ndim)
    spread = self.unsqueeze(axis + 1)
    shape = list(spread.shape)
    shape[axis + 1] = repeats
    return spread.expand(shape).flatten(axis, axis + 1)

  def roll(self, shifts: int | Sequence[int], dims: int | Sequence[int] | None = None) -> Tensor:
    """Shift elements along `dims` by `shifts`, wrapping around (the flattened tensor when dims is None)."""
    if dims is None:
      if not isinstance(shifts, int): raise ValueError(f"roll without dims needs one int shift, got {shifts}")
      return self.flatten().roll(shifts, 0).reshape(self.shape)
    shifts, dims = _int_tuple(shifts), _int_tuple(dims)
    if len(shifts) != len(dims): raise ValueError(f"roll needs one shift per dim, got shifts {shifts} and dims {dims}")
    result = self
    for shift, dim in zip(shifts, dims):
      axis = _axis(dim, self.ndim)
      size = self.shape[axis]
      if size == 0 or shift % size == 0: continue
      shift %= size
      result = result.narrow(axis, size - shift, shift).cat(result.narrow(axis, 0, size - shift), dim=axis)
    return result

  # *** triangles and masks ***

  def tril(self, diagonal: int = 0) -> Tensor:
    """Zero the elements above diagonal `diagonal` of the last two dims."""
    return self._triangle(diagonal, lower=True)

  def triu(self, diagonal: int = 0) -> Tensor:
    """Zero the elements below diagonal `diagonal` of the last two dims."""
    return self._triangle(diagonal, lower=False)

  def _triangle(self, diagonal: int, lower: bool) -> Tensor:
    if self.ndim < 2: raise ShapeError(f"tril/triu need at least 2 dimensions, got shape {self.shape}")
    rows, cols = self.shape[-2:]
    row = type(self).arange(rows, device=self.device).reshape(rows, 1)
    col = type(self).arange(cols, device=self.device).reshape(1, cols)
    keep = (col <= row + diagonal) if lower else (col >= row + diagonal)
    return keep.where(self, self.zeros_like())

  def masked_fill(self, mask: Tensor, value: Any) -> Tensor:
    """`value` where `mask` is True, else self; mask broadcasts to self's shape and the dtype stays self's."""
    if mask.dtype != dtypes.bool: raise TypeError(f"masked_fill needs a bool mask, got {mask.dtype}")
    if broadcast_shape(mask.shape, self.shape) != self.shape:
      raise ShapeError(f"masked_fill mask of shape {mask.shape} does not broadcast to the tensor's shape {self.shape}")
    if isinstance(value, TensorBase):
      if value.ndim != 0: raise ShapeError(f"masked_fill value must be a 0-d tensor, got shape {value.shape}")
      fill = value.cast(self.dtype)
    else:
      fill = type(self)(value, self.device, self.dtype)
    return mask.where(fill, self)

  def one_hot(self, num_classes: int = -1) -> Tensor:
    """A new last dim of `num_classes` with 1 at each value's position (int32, rawgrad's default int). With -1 the
    count is the maximum value + 1, which realizes the tensor to learn it."""
    _check_index_dtype(self, "one_hot")
    if num_classes == -1:
      if self.numel() == 0: raise ShapeError(f"one_hot cannot infer the number of classes of an empty {self.shape}")
      num_classes = int(self.max().item()) + 1
    check_index_values(self, 0, num_classes, f"one_hot: class {{value}} is out of range for num_classes={num_classes}")
    return _one_hot_mask(self, num_classes).cast(dtypes.default_int)

  def masked_select(self, mask: Tensor) -> Tensor:
    """The elements where `mask` (broadcast with self) is True, as a 1-D tensor. Its length depends on the mask's
    values, so the mask is realized and read first."""
    if mask.dtype != dtypes.bool: raise TypeError(f"masked_select needs a bool mask, got {mask.dtype}")
    shape = broadcast_shape(self.shape, mask.shape)
    return self._broadcast_to(shape).flatten()[mask._broadcast_to(shape).flatten()]

  def nonzero(self, as_tuple: bool = False) -> Any:
    """The indices (int64) of the nonzero elements in row-major order: one row (n, ndim) each, or with as_tuple one
    1-D tensor per dim. Their count depends on the values, so the mask is realized and read on the host first."""
    mask = (self != 0).numpy()
    if self.ndim == 0:
      if as_tuple: return (type(self)(np.zeros(int(mask), np.int64), self.device),)
      return type(self).zeros(int(mask), 0, dtype=dtypes.int64, device=self.device)
    if as_tuple: return tuple(type(self)(p.astype(np.int64), self.device) for p in np.nonzero(mask))
    return type(self)(np.argwhere(mask).astype(np.int64), self.device)

  def diagonal(self, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """The diagonal `offset` (above the main one if positive) of the dims dim1 and dim2, as a new last dim."""
    first, second = _axis(dim1, self.ndim), _axis(dim2, self.ndim)
    if first == second: raise ValueError(f"diagonal dims {dim1} and {dim2} are the same")
    moved = self.movedim((first, second), (-2, -1))
    rows, cols = moved.shape[-2:]
    length = max(0, min(rows, cols - offset) if offset >= 0 else min(rows + offset, cols))
    top, left = max(-offset, 0), max(offset, 0)
    square = moved[..., top:top + length, left:left + length]
    # the diagonal of a square is every (length + 1)-th element of its rows read flat
    return square.flatten(-2)[..., ::length + 1] if length else square.sum(-1)

  def diag(self, diagonal: int = 0) -> Tensor:
    """A 1-D tensor as the diagonal `diagonal` of a square matrix, or the diagonal of a 2-D tensor."""
    if self.ndim == 2: return self.diagonal(diagonal)
    if self.ndim != 1: raise ValueError(f"diag needs a 1-D or 2-D tensor, got shape {self.shape}")
    size = self.shape[0]
    # rows of size + 1 read flat as rows of size put element i at column i
    square = self.reshape(size, 1).pad(((0, 0), (0, size))).flatten()[:size * size].reshape(size, size)
    shift = abs(diagonal)
    return square.pad(((0, shift), (shift, 0)) if diagonal >= 0 else ((shift, 0), (0, shift)))

  @staticmethod
  def meshgrid(*tensors: Any, indexing: str = "ij") -> tuple[Tensor, ...]:
    """Coordinate grids from 1-D tensors: with 'ij' the grids have shape (len0, len1, ...), with 'xy' the first two
    dims swap (len1, len0, ...), as numpy's default."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)): tensors = tuple(tensors[0])
    if indexing not in ("ij", "xy"): raise ValueError(f"meshgrid indexing must be 'ij' or 'xy', got {indexing!r}")
    if any(t.ndim > 1 for t in tensors):
      raise ValueError(f"meshgrid takes 0-d or 1-D tensors, got shapes {[tuple(t.shape) for t in tensors]}")
    order = list(range(len(tensors)))
    if indexing == "xy" and len(tensors) > 1: order[0], order[1] = 1, 0
    sizes = [tensors[i].numel() for i in order]
    grids = []
    for i, tensor in enumerate(tensors):
      shape = [1] * len(tensors)
      shape[order.index(i)] = tensor.numel()
      grids.append(tensor.reshape(shape).expand(sizes))
    return tuple(grids)

  # *** joining and splitting ***

  def cat(self, *tensors: Any, dim: int = 0) -> Tensor:
    """Concatenate along `dim`: Tensor.cat(a, b, dim=0), Tensor.cat([a, b], 0) or a.cat(b, dim=0)."""
    parts, dim = _join_arguments(self, tensors, dim, "cat")
    first = parts[0]
    axis = _axis(dim, first.ndim)
    shapes = [tuple(t.shape) for t in parts]
    if any(len(s) != len(shapes[0]) or s[:axis] + s[axis + 1:] != shapes[0][:axis] + shapes[0][axis + 1:]
           for s in shapes):
      raise ShapeError(f"cat along dim {dim} needs equal sizes in the other dims, got shapes {shapes}")
    _check_devices(parts, "cat")
    dtype = least_upper_dtype(*(t.dtype for t in parts))
    total = sum(s[axis] for s in shapes)
    # every piece padded with zeros to the full size, then summed: one fused kernel of guarded loads
    padded, offset = [], 0
    for part in parts:
      size = part.shape[axis]
      if size: padded.append(part.cast(dtype).pad(_pad_axis(first.ndim, axis, offset, total - offset - size)))
      offset += size
    if not padded: return type(first).zeros(*shapes[0][:axis], 0, *shapes[0][axis + 1:], dtype=dtype,
                                            device=first.device)
    result = padded[0]
    for piece in padded[1:]: result = (result | piece) if dtype == dtypes.bool else result + piece
    return result

  def stack(self, *tensors: Any, dim: int = 0) -> Tensor:
    """Join equally shaped tensors along a new dim: Tensor.stack(a, b, dim=0), Tensor.stack([a, b], 0) or a.stack(b)."""
    parts, dim = _join_arguments(self, tensors, dim, "stack")
    shapes = [tuple(t.shape) for t in parts]
    if any(s != shapes[0] for s in shapes): raise ShapeError(f"stack needs tensors of equal shape, got {shapes}")
    axis = _axis(dim, parts[0].ndim + 1)
    return parts[0].unsqueeze(axis).cat(*(t.unsqueeze(axis) for t in parts[1:]), dim=axis)

  def split(self, split_size_or_sections: int | Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
    """Pieces of `split_size` along `dim` (the last may be smaller), or of the given list of sizes."""
    axis = _axis(dim, self.ndim)
    size = self.shape[axis]
    if isinstance(split_size_or_sections, int):
      step = split_size_or_sections
      if step <= 0 and size: raise ArgumentError(f"split size must be positive, got {step}")
      sizes = [min(step, size - start) for start in range(0, size, step)] if size else [0]
    else:
      sizes = list(split_size_or_sections)
      if sum(sizes) != size or any(s < 0 for s in sizes):
        raise ShapeError(f"split sizes {sizes} do not sum to {size}, the size of dim {dim} of {self.shape}")
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return tuple(self.narrow(axis, start, length) for start, length in zip(starts, sizes))

  def chunk(self, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    """At most `chunks` pieces of equal size ceil(size / chunks) along `dim`, as torch.chunk."""
    if chunks <= 0: raise ArgumentError(f"chunk needs a positive number of chunks, got {chunks}")
    size = self.shape[_axis(dim, self.ndim)]
    if size == 0: return (self,) * chunks
    return self.split(math.ceil(size / chunks), dim)

  # *** padding with modes ***

  def padded(self, pad: Sequence[int], mode: str = "constant", value: float = 0.0) -> Tensor:
    """torch.nn.functional.pad: `pad` holds (before, after) pairs starting from the LAST dim, e.g. (left, right,
    top, bottom); negative amounts crop. Modes: constant (fill with `value`), reflect (mirror without repeating the
    edge), replicate (repeat the edge), circular (wrap around). Tensor.pad is the core form: one pair per dim,
    first dim first, constant only."""
    pad = tuple(pad)
    if len(pad) % 2 or len(pad) > 2 * self.ndim:
      raise ShapeError(f"pad {pad} needs an even length of at most {2 * self.ndim} for shape {self.shape}")
    if mode not in PAD_MODES: raise ValueError(f"pad mode {mode!r} is not one of {PAD_MODES}")
    if mode != "constant" and value != 0: raise ValueError(f"pad value {value} only applies to mode 'constant'")
    pairs = [(0, 0)] * (self.ndim - len(pad) // 2) + [(pad[i], pad[i + 1]) for i in range(len(pad) - 2, -1, -2)]
    for axis, (before, after) in enumerate(pairs):
      if self.shape[axis] + min(before, 0) + min(after, 0) < 0:
        raise ShapeError(f"pad {pad} crops more than the {self.shape[axis]} elements of dim {axis} of {self.shape}")
    cropped = self.shrink(tuple((-min(before, 0), size + min(after, 0))
                                for (before, after), size in zip(pairs, self.shape)))
    growth = [(max(before, 0), max(after, 0)) for before, after in pairs]
    # Tensor.pad promotes an int or bool tensor to the fill value's dtype; torch keeps the tensor's dtype
    if mode == "constant": return cropped.pad(growth, value).cast(self.dtype)
    result = cropped
    for axis, (before, after) in enumerate(growth):
      if before or after: result = _pad_axis_with_mode(result, axis, before, after, mode, pad)
    return result

  # *** gathering and scattering ***

  def gather(self, dim: int, index: Tensor) -> Tensor:
    """out[..., i, ...] = self[..., index[..., i, ...], ...] along `dim`; index has self's number of dims and is no
    larger than self in the other dims (as torch.gather). Index values must lie in [0, size of dim)."""
    _check_index_dtype(index, "gather")
    axis = _axis(dim, self.ndim)
    if index.ndim != self.ndim or any(i > s for d, (i, s) in enumerate(zip(index.shape, self.shape)) if d != axis):
      raise ShapeError(f"gather index of shape {index.shape} must have the dims of {self.shape} and be no larger "
                       f"outside dim {dim}")
    _check_index_along(index, axis, self.shape[axis], "gather")
    return self._gather(axis, index)

  def _gather(self, axis: int, index: Tensor) -> Tensor:
    bounds = tuple((0, s) if d == axis else (0, i) for d, (i, s) in enumerate(zip(index.shape, self.shape)))
    return _select_along(self.shrink(bounds), axis, index)

  def take_along_dim(self, indices: Tensor, dim: int | None = None) -> Tensor:
    """Gather along `dim` after broadcasting self and indices in the other dims (of both flattened if dim is None).
    Negative indices count from the end, as in torch."""
    _check_index_dtype(indices, "take_along_dim")
    if dim is None: return self.flatten().take_along_dim(indices.flatten(), 0)
    axis = _axis(dim, self.ndim)
    if indices.ndim != self.ndim:
      raise ShapeError(f"take_along_dim indices of shape {indices.shape} need the {self.ndim} dims of {self.shape}")
    _check_index_along(indices, axis, self.shape[axis], "take_along_dim", negative=True)
    indices = (indices < 0).where(indices + self.shape[axis], indices)
    others = broadcast_shape(_without(self.shape, axis), _without(indices.shape, axis))
    source = self.expand(_inserted(others, axis, self.shape[axis]))
    return source._gather(axis, indices.expand(_inserted(others, axis, indices.shape[axis])))

  def index_select(self, dim: int, index: Tensor) -> Tensor:
    """The entries at the 1-D (or 0-d) `index` along `dim`; that dim's size becomes len(index)."""
    _check_index_dtype(index, "index_select")
    if index.ndim > 1: raise ShapeError(f"index_select needs a 1-D index, got shape {index.shape}")
    axis = _axis(dim, self.ndim)
    _check_index_along(index, axis, self.shape[axis], "index_select")
    # the index along `axis` with size-1 dims elsewhere broadcasts against self in the one-hot selection
    return _select_along(self, axis, index.reshape(_with((1,) * self.ndim, axis, index.numel())))

  def scatter(self, dim: int, index: Tensor, src: Any, reduce: str | None = None) -> Tensor:
    """A copy of self with self[..., index[..., i, ...], ...] = src[..., i, ...] along `dim` (as torch.scatter);
    `src` may be a scalar. reduce='add' or 'multiply' combines with the old value instead. Where `index` repeats a
    position without a reduce, the last write along `dim` wins (what PyTorch's CPU loop does; it leaves the choice
    unspecified)."""
    if reduce not in (None, "add", "multiply"):
      raise ValueError(f"scatter reduce must be None, 'add' or 'multiply', got {reduce!r}")
    return self._scatter(dim, index, src, {None: "replace", "add": "sum", "multiply": "prod"}[reduce], True)

  def scatter_add(self, dim: int, index: Tensor, src: Tensor) -> Tensor:
    return self._scatter(dim, index, src, "sum", True)

  def scatter_reduce(self, dim: int, index: Tensor, src: Tensor, reduce: str, include_self: bool = True) -> Tensor:
    """Combine the src values that `index` sends to each position with `reduce` (sum, prod, mean, amax, amin),
    including self's old value if include_self; positions nothing is sent to keep self's value."""
    if reduce not in SCATTER_REDUCTIONS:
      raise ValueError(f"scatter_reduce {reduce!r} is not one of {SCATTER_REDUCTIONS}")
    return self._scatter(dim, index, src, reduce, include_self)

  def _scatter(self, dim: int, index: Tensor, src: Any, reduce: str, include_self: bool) -> Tensor:
    _check_index_dtype(index, "scatter")
    axis = _axis(dim, self.ndim)
    source = _scatter_source(self, index, src, axis)
    size = self.shape[axis]
    _check_index_along(index, axis, size, "scatter")
    # hits[..., i, ..., p]: does index[..., i, ...] send its value to position p of dim `axis`?
    hits = _one_hot_mask(index, size)
    written = _scatter_combine(hits, source, axis, reduce)
    count = hits.cast(dtypes.int32).sum(axis).movedim(-1, axis)
    fit = _pad_axis_to(self.ndim, count.shape, self.shape)
    written, count = written.pad(fit, 1 if reduce == "prod" else 0), count.pad(fit)
    hit = count > 0
    if reduce == "replace": return _replaced(self, source, index, hit, written, axis)
    if reduce == "mean":
      total = written + self if include_self else written
      return hit.where(_mean(total, count + int(include_self), self.dtype), self)
    if not include_self: return hit.where(written, self)
    if reduce == "sum": return (self | written) if self.dtype == dtypes.bool else self + written
    if reduce == "prod": return self * written
    return hit.where(self.maximum(written) if reduce == "amax" else self.minimum(written), self)

  # *** advanced indexing ***

  def _advanced_getitem(self, index: Any) -> Tensor:
    """PyTorch indexing: ints, slices, None, Ellipsis, bools, integer tensors/lists (broadcast together) and bool
    masks (realized to learn the result's shape). Ints, slices and None apply first; then the dims indexed by tensors
    are replaced by the broadcast index shape, in place if those dims are adjacent (ints do not separate them, as in
    torch) and in front otherwise. Negative tensor index values count from the end."""
    items = [_index_item(item) for item in (index if isinstance(index, tuple) else (index,))]
    if not any(_is_advanced(item) for item in items): return self._basic_getitem(tuple(items))
    basic, picks = _split_index(self, items)
    return _gather_points(self._basic_getitem(tuple(basic)), picks)

  def _basic_getitem(self, index: Any) -> Tensor:
    """Basic indexing: ints, slices (any step), None and Ellipsis."""
    items = list(index) if isinstance(index, tuple) else [index]
    if sum(item is Ellipsis for item in items) > 1: raise IndexError("an index can only have a single ellipsis")
    consumed = sum(1 for item in items if item is not None and item is not Ellipsis)
    if consumed > self.ndim:
      raise IndexOutOfRange(f"too many indices for a tensor of shape {self.shape}: {consumed} given")
    if any(item is Ellipsis for item in items):
      at = next(i for i, item in enumerate(items) if item is Ellipsis)
      items[at:at + 1] = [slice(None)] * (self.ndim - consumed)
    else:
      items += [slice(None)] * (self.ndim - consumed)
    result, axis, final_shape = self, 0, []
    for item in items:
      if item is None:
        final_shape.append(1)
        continue
      size = result.shape[axis]
      if isinstance(item, bool) or not isinstance(item, (int, slice)):
        raise TypeError(f"unsupported index {item!r}: use ints, slices, None or Ellipsis")
      if isinstance(item, int):
        if not -size <= item < size:
          raise IndexOutOfRange(f"index {item} is out of bounds for dim {axis} with size {size}")
        result = result._slice_axis(axis, item % size, item % size + 1, 1)
      else:
        start, stop, step = item.indices(size)
        result = result._slice_axis(axis, start, stop, step)
        final_shape.append(result.shape[axis])
      axis += 1
    return result.reshape(tuple(final_shape))

  def _slice_axis(self, axis: int, start: int, stop: int, step: int) -> Tensor:
    if step < 0:
      # a negative step walks the flipped axis forward
      size = self.shape[axis]
      flipped_start, count = size - 1 - start, len(range(start, stop, step))
      return self.flip(axis)._slice_axis(axis, flipped_start, flipped_start + (count - 1) * -step + 1 if count else
                                         flipped_start, -step)
    count = len(range(start, stop, step))
    bounds = [(0, s) for s in self.shape]
    if step == 1 or count == 0:
      bounds[axis] = (start, start + count)
      return self.shrink(bounds)
    # take every step-th element: cut, pad to a multiple of step, split the axis and keep the first column
    bounds[axis] = (start, start + (count - 1) * step + 1)
    cut = self.shrink(bounds)
    padding = [(0, 0)] * self.ndim
    padding[axis] = (0, count * step - cut.shape[axis])
    split = cut.pad(padding).reshape(*self.shape[:axis], count, step, *self.shape[axis + 1:])
    keep = [(0, s) for s in split.shape]
    keep[axis + 1] = (0, 1)
    return split.shrink(keep).reshape(*self.shape[:axis], count, *self.shape[axis + 1:])


# *** helpers: arguments ***

def _axis(dim: int, ndim: int) -> int:
  if isinstance(dim, bool) or not isinstance(dim, int): raise TypeError(f"dim must be an int, got {dim!r}")
  return resolve_axis(dim, ndim)


def _int_tuple(value: int | Sequence[int]) -> tuple[int, ...]:
  return (value,) if isinstance(value, int) else tuple(value)


def _without(shape: tuple, axis: int) -> tuple:
  return tuple(shape[:axis]) + tuple(shape[axis + 1:])


def _with(shape: tuple, axis: int, size: int) -> tuple:
  return tuple(shape[:axis]) + (size,) + tuple(shape[axis + 1:])


def _inserted(shape: tuple, axis: int, size: int) -> tuple:
  return tuple(shape[:axis]) + (size,) + tuple(shape[axis:])


def _pad_axis(ndim: int, axis: int, before: int, after: int) -> list[tuple[int, int]]:
  return [(before, after) if d == axis else (0, 0) for d in range(ndim)]


def _pad_axis_to(ndim: int, shape: tuple, target: tuple) -> list[tuple[int, int]]:
  return [(0, target[d] - shape[d]) for d in range(ndim)]


def _join_arguments(first: Any, rest: tuple, dim: int, what: str) -> tuple[list[Tensor], int]:
  """The tensors and dim of cat/stack called as Tensor.cat(a, b, dim=d), a.cat(b), or torch's Tensor.cat([a, b], d)."""
  if isinstance(first, (list, tuple)) and len(rest) == 1 and isinstance(rest[0], int): rest, dim = (), rest[0]
  items = [t for item in (first, *rest) for t in (item if isinstance(item, (list, tuple)) else (item,))]
  if not items: raise ValueError(f"{what} needs at least one tensor")
  for item in items:
    if not isinstance(item, TensorBase): raise TypeError(f"{what} takes tensors, got {type(item).__name__}")
  return items, dim


def _check_devices(tensors: list[Tensor], what: str) -> None:
  devices = sorted({t.device for t in tensors})
  if len(devices) > 1: raise RuntimeError(f"{what} needs tensors on one device, got {devices}")


def _check_index_along(index: Tensor, axis: int, size: int, what: str, negative: bool = False) -> None:
  """Index values along dim `axis` of `size` must lie in [0, size), or in [-size, size) where negative ones count from
  the end."""
  message = f"{what}: index {{value}} is out of bounds for dim {axis} with size {size}"
  check_index_values(index, -size if negative else 0, size, message)


def _check_index_dtype(index: Any, what: str) -> None:
  if not isinstance(index, TensorBase): raise TypeError(f"{what} index must be a Tensor, got {type(index).__name__}")
  if not dtypes.is_int(index.dtype) or index.dtype == dtypes.bool:
    raise TypeError(f"{what} index must have an integer dtype, got {index.dtype}")


# *** helpers: padding modes ***

def _pad_axis_with_mode(x: Tensor, axis: int, before: int, after: int, mode: str, pad: tuple) -> Tensor:
  size = x.shape[axis]
  # replicate repeats the edge any number of times; reflect and circular read that many elements of the input
  limit = {"reflect": size - 1, "circular": size}.get(mode, math.inf)
  if before > limit or after > limit or size == 0:
    raise ValueError(f"{mode} pad {pad} needs at most {limit} elements on each side of dim {axis} of {x.shape}")
  if mode == "reflect":
    head, tail = x.narrow(axis, 1, before).flip(axis), x.narrow(axis, size - 1 - after, after).flip(axis)
  elif mode == "replicate":
    head = x.narrow(axis, 0, 1).expand(_with(x.shape, axis, before))
    tail = x.narrow(axis, size - 1, 1).expand(_with(x.shape, axis, after))
  else:
    head, tail = x.narrow(axis, size - before, before), x.narrow(axis, 0, after)
  return head.cat(x, tail, dim=axis)


# *** helpers: one-hot gathering and scattering ***

def _one_hot_mask(index: Tensor, count: int) -> Tensor:
  """index.shape + (count,) bools: True where the last coordinate equals the index value."""
  positions = type(index).arange(count, device=index.device)
  return index.unsqueeze(-1) == positions


def _zero(dtype: DType) -> Any:
  return False if dtype == dtypes.bool else 0


def _select_along(source: Tensor, axis: int, index: Tensor) -> Tensor:
  """out = source[..., index, ...] along `axis`, where index has source's shape except at `axis`."""
  size = source.shape[axis]
  # source's `axis` moves to a new last dim that the one-hot mask picks from
  values = source.unsqueeze(-1).transpose(axis, -1)
  picked = _one_hot_mask(index, size).where(values, _zero(source.dtype))
  return picked.sum(-1).cast(source.dtype)


def _scatter_source(self: Tensor, index: Tensor, src: Any, axis: int) -> Tensor:
  """src as a tensor of index's shape and self's dtype, after checking the shapes torch requires."""
  if index.ndim != self.ndim or any(i > s for d, (i, s) in enumerate(zip(index.shape, self.shape)) if d != axis):
    raise ShapeError(f"scatter index of shape {index.shape} must have the dims of {self.shape} and be no larger "
                     f"outside dim {axis}")
  if not isinstance(src, TensorBase): return type(self).full(index.shape, src, self.dtype, self.device)
  if src.ndim != index.ndim or any(i > s for i, s in zip(index.shape, src.shape)):
    raise ShapeError(f"scatter src of shape {src.shape} must have the dims of index {index.shape} and be no smaller")
  return src.shrink(tuple((0, i) for i in index.shape)).cast(self.dtype)


def _mean(total: Tensor, count: Tensor, dtype: DType) -> Tensor:
  """total / count in `dtype`; integers round down, as torch's scatter_reduce mean does."""
  quotient = total / count
  if dtypes.is_float(dtype): return quotient.cast(dtype)
  truncated = quotient.cast(dtype)
  return (truncated.cast(quotient.dtype) > quotient).where(truncated - 1, truncated)


def _scatter_combine(hits: Tensor, source: Tensor, axis: int, reduce: str) -> Tensor:
  """For every position p of dim `axis`, the `reduce` of the source values sent there (its identity if none)."""
  values = source.unsqueeze(-1)
  if reduce == "prod":
    # no product reduction exists: multiply the contributions of each index position along `axis` in turn
    product = type(source).ones(*_without(hits.shape, axis), dtype=source.dtype, device=source.device)
    for i in range(source.shape[axis]):
      product = product * hits.narrow(axis, i, 1).where(values.narrow(axis, i, 1), 1).squeeze(axis)
    return product.movedim(-1, axis)
  if reduce in ("amax", "amin"):
    lowest = dtypes.min(source.dtype) if reduce == "amax" else dtypes.max(source.dtype)
    if dtypes.is_float(source.dtype): lowest = -math.inf if reduce == "amax" else math.inf
    chosen = hits.where(values, lowest)
    combined = chosen.max(axis) if reduce == "amax" else chosen.min(axis)
    return combined.cast(source.dtype).movedim(-1, axis)
  if reduce == "replace" and hits.shape[axis]: hits = hits & _last_along(hits, axis)
  return hits.where(values, _zero(source.dtype)).sum(axis).cast(source.dtype).movedim(-1, axis)


def _replaced(self: Tensor, source: Tensor, index: Tensor, hit: Tensor, written: Tensor, axis: int) -> Tensor:
  """self with the written values where something was written, differentiated as PyTorch does: every source value
  gets the gradient of the place it was sent to, whether or not a later write replaced it."""
  tensor, hit_node, index_node = type(self), hit.uop, index.uop

  def rule(grad: Tensor, _: Tensor, target: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
    return tensor(hit_node).where(0, grad), grad.gather(axis, tensor(index_node))
  return with_gradient(hit.where(written, self), (self, source), rule)


def _last_along(hits: Tensor, axis: int) -> Tensor:
  """True at the last hit along `axis` of each position (the last of several writes to one place)."""
  shape = [1] * hits.ndim
  shape[axis] = hits.shape[axis]
  order = type(hits).arange(hits.shape[axis], device=hits.device).reshape(shape)
  return order == hits.where(order, -1).max(axis, keepdim=True)


# *** helpers: advanced indexing ***

def _index_item(item: Any) -> Any:
  """An index entry in canonical form: numpy scalars become Python scalars, lists and arrays become tensors."""
  if isinstance(item, np.bool_): return bool(item)
  if isinstance(item, np.integer): return int(item)
  if isinstance(item, (list, tuple, np.ndarray)):
    array = np.asarray(item)
    if array.size == 0: array = array.astype(np.int32)
    if array.dtype.kind not in "biu": raise IndexError(f"index lists must hold ints or bools, got {array.dtype}")
    return _StaticIndex(array)
  if isinstance(item, TensorBase) and item.dtype != dtypes.bool and not dtypes.is_int(item.dtype):
    raise IndexError(f"tensors used as indices must have an integer or bool dtype, got {item.dtype}")
  return item


class _StaticIndex:
  """An index known on the host (a list or numpy array): bounds are checked when its dim is known."""
  __slots__ = ("array",)

  def __init__(self, array: np.ndarray):
    self.array = array


def _is_advanced(item: Any) -> bool:
  return isinstance(item, (bool, TensorBase, _StaticIndex))


def _dims_consumed(item: Any) -> int:
  if item is None or item is Ellipsis or isinstance(item, bool): return 0
  if isinstance(item, _StaticIndex) and item.array.dtype == np.bool_: return item.array.ndim
  if isinstance(item, TensorBase) and item.dtype == dtypes.bool: return item.ndim
  return 1


def _split_index(tensor: Tensor, items: list) -> tuple[list, list[tuple[int, Tensor, bool]]]:
  """The basic index (ints, slices, None) and the picks: (dim after basic indexing, index tensor, whether the dim
  counts for placement) for every dim indexed by a tensor. A 0-d index acts like an int, so it does not count."""
  basic: list = []
  picks: list[tuple[int, Tensor, bool]] = []
  axis = 0  # the dim of `tensor` the next item indexes
  for item in _without_ellipsis(tensor, items):
    dim = sum(1 for entry in basic if not isinstance(entry, int))  # ints remove their dim
    entries, item_picks, consumed = _index_entry(item, tensor, axis)
    basic += entries
    picks += [(dim + offset, index, counts) for offset, index, counts in item_picks]
    axis += consumed
  return basic, picks


def _without_ellipsis(tensor: Tensor, items: list) -> list:
  # identity tests throughout: `in` and index() would compare tensors elementwise
  if sum(item is Ellipsis for item in items) > 1: raise IndexError("an index can only have a single ellipsis")
  consumed = sum(_dims_consumed(item) for item in items)
  if consumed > tensor.ndim: raise IndexOutOfRange(f"too many indices for a tensor of shape {tensor.shape}: {consumed}")
  at = next((i for i, item in enumerate(items) if item is Ellipsis), None)
  if at is None: return items
  return items[:at] + [slice(None)] * (tensor.ndim - consumed) + items[at + 1:]


def _index_entry(item: Any, tensor: Tensor, axis: int) -> tuple[list, list[tuple[int, Tensor, bool]], int]:
  """What one index item contributes: basic index entries, picks (dims relative to its first entry), and how many
  dims of `tensor` it consumes."""
  if isinstance(item, TensorBase) and item.dtype == dtypes.bool and item.ndim == 0: item = bool(item.item())
  if isinstance(item, _StaticIndex) and item.array.dtype == np.bool_ and item.array.ndim == 0: item = bool(item.array)
  if isinstance(item, bool):
    # as in torch: a new dim of size 1, indexed by [0] (True) or by nothing (False)
    return [None], [(0, _int_index([0] if item else [], tensor), True)], 0
  if item is None: return [None], [], 0
  if isinstance(item, (int, slice)): return [item], [], 1
  if (mask := _host_mask(item, tensor, axis)) is not None:
    positions = [_int_index(p, tensor) for p in np.nonzero(mask)]
    return [slice(None)] * mask.ndim, [(offset, p, True) for offset, p in enumerate(positions)], mask.ndim
  if isinstance(item, _StaticIndex): index = _static_int_index(item, tensor, axis)
  else:
    index = item
    _check_index_along(index, axis, tensor.shape[axis], "indexing", negative=True)
  return [slice(None)], [(0, index, index.ndim > 0)], 1


def _int_index(values: Any, like: Tensor) -> Tensor:
  """The int32 index tensor of `values`, on the device of the tensor it indexes."""
  array = np.asarray(values, dtype=np.int32)
  # made 1-D and reshaped back because Tensor(np.ndarray) turns a 0-d array into shape (1,)
  return type(like)(array.reshape(-1), like.device).reshape(array.shape)


def _host_mask(item: Any, tensor: Tensor, axis: int) -> np.ndarray | None:
  """A bool mask index as a numpy array, after checking it matches the dims it covers. A mask tensor is realized:
  the result's shape depends on its values, and its True positions are found on the host."""
  if isinstance(item, _StaticIndex) and item.array.dtype == np.bool_: mask = item.array
  elif isinstance(item, TensorBase) and item.dtype == dtypes.bool: mask = item.numpy()
  else: return None
  covered = tuple(tensor.shape[axis:axis + mask.ndim])
  if mask.shape != covered:
    raise IndexOutOfRange(f"mask of shape {mask.shape} does not match the shape {covered} of the dims it indexes, "
                     f"starting at dim {axis} of {tensor.shape}")
  return mask


def _static_int_index(item: _StaticIndex, tensor: Tensor, axis: int) -> Tensor:
  size = tensor.shape[axis]
  values = item.array.astype(np.int64)
  bad = values[(values < -size) | (values >= size)]
  if bad.size: raise IndexOutOfRange(f"index {int(bad.flat[0])} is out of bounds for dim {axis} with size {size}")
  return _int_index(values % max(size, 1), tensor)


def _gather_points(x: Tensor, picks: list[tuple[int, Tensor, bool]]) -> Tensor:
  """Replace the picked dims of x by the broadcast shape of their index tensors (torch's placement rule)."""
  if not picks: return x
  try:
    points = broadcast_shape(*(index.shape for _, index, _ in picks))
  except ValueError:
    shapes = ", ".join(str(tuple(index.shape)) for _, index, _ in picks)
    raise IndexOutOfRange(f"index tensors of shapes {shapes} cannot be broadcast together") from None
  dims = [dim for dim, _, _ in picks]
  rest = [d for d in range(x.ndim) if d not in dims]
  sizes = [x.shape[d] for d in dims]
  # one flat position into the picked dims, row-major, so a single one-hot comparison selects the element
  flat = None
  for dim_size, stride, (_, index, _) in zip(sizes, _strides(sizes), picks):
    wrapped = (index < 0).where(index + dim_size, index)._broadcast_to(points) * stride
    flat = wrapped if flat is None else flat + wrapped
  kept = tuple(x.shape[d] for d in rest)
  source = x.permute(rest + dims).reshape(*kept, *(1,) * len(points), prod(sizes))
  hits = _one_hot_mask(flat, prod(sizes)).reshape(*(1,) * len(kept), *points, prod(sizes))
  picked = hits.where(source, _zero(x.dtype)).sum(-1).cast(x.dtype)
  at = _placement(dims, [counts for _, _, counts in picks], rest)
  order = list(range(len(kept)))
  order[at:at] = range(len(kept), len(kept) + len(points))
  return picked.permute(order)


def _strides(sizes: list[int]) -> list[int]:
  return [prod(sizes[i + 1:]) for i in range(len(sizes))]


def _placement(dims: list[int], counts: list[bool], rest: list[int]) -> int:
  """Where the index dims go among the kept dims: where the indexed dims were if they are adjacent once dims taken by
  0-d indices are removed (those act like ints), else in front."""
  placed = sorted(d for d, count in zip(dims, counts) if count)
  if not placed: return 0
  removed = [d for d, count in zip(dims, counts) if not count]
  squeezed = [d - sum(1 for r in removed if r < d) for d in placed]
  if squeezed != list(range(squeezed[0], squeezed[0] + len(squeezed))): return 0
  return sum(1 for d in rest if d < placed[0])


# *** einsum and interpolate ***

def _einsum_letters(formula: str, operands: tuple) -> tuple[list[str], str]:
  """The per-operand subscripts and the output subscripts, with '...' spelled out as upper-case letters."""
  inputs, _, output = formula.replace(" ", "").partition("->")
  parts = inputs.split(",")
  if len(parts) != len(operands):
    raise ValueError(f"einsum formula {formula!r} names {len(parts)} operands, {len(operands)} were given")
  broadcast = max((t.ndim - len(p.replace("...", "")) for p, t in zip(parts, operands) if "..." in p), default=0)
  ellipsis = "".join(chr(ord("Z") - i) for i in range(broadcast))[::-1]
  spelled = []
  for part, tensor in zip(parts, operands):
    extra = tensor.ndim - len(part.replace("...", ""))
    spelled.append(part.replace("...", ellipsis[len(ellipsis) - extra:]) if "..." in part else part)
    if len(spelled[-1]) != tensor.ndim:
      raise ShapeError(f"einsum subscripts {part!r} do not match operand of shape {tensor.shape}")
  if "->" not in formula:
    counts = {letter: "".join(spelled).count(letter) for letter in set("".join(spelled))}
    output = ellipsis + "".join(sorted(letter for letter, count in counts.items() if count == 1 and
                                       letter not in ellipsis))
  return spelled, output.replace("...", ellipsis)


def _take_diagonals(tensor: Any, letters: str) -> tuple[Any, str]:
  """A letter repeated within one operand (as in 'ii') selects the diagonal of those axes."""
  while len(set(letters)) != len(letters):
    letter = next(c for c in letters if letters.count(c) > 1)
    first, second = letters.index(letter), letters.index(letter, letters.index(letter) + 1)
    order = [i for i in range(tensor.ndim) if i not in (first, second)] + [first, second]
    size = tensor.shape[first]
    moved = tensor.permute(order)
    tensor = moved.reshape(*moved.shape[:-2], size * size)[..., ::size + 1] if size else moved.sum(-1)
    letters = "".join(letters[i] for i in order[:-2]) + letter
  return tensor, letters


def _einsum(formula: str, *operands: Any) -> Any:
  """torch.einsum: every operand is aligned to all the formula's letters, multiplied, and summed over the letters
  missing from the output (one fused kernel for a contraction)."""
  if len(operands) == 1 and isinstance(operands[0], (list, tuple)): operands = tuple(operands[0])
  spelled, output = _einsum_letters(formula, operands)
  letters = sorted(set("".join(spelled)))
  if set(output) - set(letters) or len(set(output)) != len(output):
    raise ValueError(f"einsum output {output!r} of {formula!r} uses a letter twice or one no input has")
  sizes: dict[str, Any] = {}
  aligned = []
  for tensor, part in zip(operands, spelled):
    tensor, part = _take_diagonals(tensor, part)
    for letter, size in zip(part, tensor.shape):
      if sizes.setdefault(letter, size) != size and size != 1 and sizes[letter] != 1:
        raise ShapeError(f"einsum letter {letter!r} has sizes {sizes[letter]} and {size} in {formula!r}")
      if sizes[letter] == 1: sizes[letter] = size
    present = [letter for letter in letters if letter in part]
    moved = tensor.permute([part.index(letter) for letter in present]) if present else tensor
    aligned.append(moved.reshape([tensor.shape[part.index(letter)] if letter in part else 1 for letter in letters]))
  product = aligned[0]
  for tensor in aligned[1:]: product = product * tensor
  summed = [i for i, letter in enumerate(letters) if letter not in output]
  remaining = [letter for letter in letters if letter in output]
  result = product.sum(summed) if summed else product.expand([sizes[letter] for letter in letters])
  return result.permute([remaining.index(letter) for letter in output]) if output else result


def _source_positions(out_size: int, in_size: int, mode: str, align_corners: bool | None) -> np.ndarray:
  if mode == "nearest": return np.minimum(np.floor(np.arange(out_size) * (in_size / out_size)), in_size - 1)
  if mode == "nearest-exact":
    return np.minimum(np.floor((np.arange(out_size) + 0.5) * (in_size / out_size)), in_size - 1)
  if align_corners:
    return np.arange(out_size) * ((in_size - 1) / (out_size - 1)) if out_size > 1 else np.zeros(out_size)
  return np.clip((np.arange(out_size) + 0.5) * (in_size / out_size) - 0.5, 0, None)


def _resize_axis(tensor: Any, axis: int, out_size: int, mode: str, align_corners: bool | None) -> Any:
  tensor_type = type(tensor)
  in_size = tensor.shape[axis]
  positions = _source_positions(out_size, in_size, mode, align_corners)
  low = np.floor(positions).astype(np.int32)
  if mode.startswith("nearest"): return tensor.index_select(axis, tensor_type(low, tensor.device))
  high = np.minimum(low + 1, in_size - 1)
  weight_shape = [1] * tensor.ndim
  weight_shape[axis] = out_size
  weight = tensor_type((positions - low).astype(np.float32), tensor.device).reshape(weight_shape)
  below = tensor.index_select(axis, tensor_type(low, tensor.device))
  above = tensor.index_select(axis, tensor_type(high.astype(np.int32), tensor.device))
  if dtypes.is_float(tensor.dtype): return below * (1 - weight).cast(tensor.dtype) + above * weight.cast(tensor.dtype)
  return _blend_integers(below, above, positions - low, weight_shape)


def _blend_integers(below: Tensor, above: Tensor, fraction: np.ndarray, weight_shape: list[int]) -> Tensor:
  """below * (1 - fraction) + above * fraction for integer images as PyTorch computes it: in fixed point, with the
  weights rounded to `precision` bits (as many as fit an int16 for the largest weight), the sum rounded half up and
  clamped to the dtype's range."""
  largest = float(np.max(np.maximum(fraction, 1 - fraction), initial=0.0))
  precision = 0
  while precision < 15 and int(0.5 + largest * 2 ** (precision + 1)) < 2 ** 15: precision += 1
  tensor_type, device = type(below), below.device

  def fixed(weights: np.ndarray) -> Tensor:
    rounded = np.floor(0.5 + weights * 2 ** precision).astype(np.int32)
    return tensor_type(rounded, device).reshape(weight_shape)
  total = below.cast(dtypes.int32) * fixed(1 - fraction) + above.cast(dtypes.int32) * fixed(fraction)
  rounded = (total + 2 ** (precision - 1)) >> precision
  return rounded.clamp(dtypes.min(below.dtype), dtypes.max(below.dtype)).cast(below.dtype)


_INTERPOLATE_MODES = ("nearest", "nearest-exact", "linear", "bilinear", "trilinear")


def _interpolate(self: Any, size: Any = None, scale_factor: Any = None, mode: str = "nearest",
                align_corners: bool | None = None) -> Any:
  """torch.nn.functional.interpolate over the axes after (N, C): each axis resized separately, so bilinear is
  linear along height and then along width (exactly torch's result)."""
  if mode not in _INTERPOLATE_MODES: raise ValueError(f"interpolate mode must be one of {_INTERPOLATE_MODES}")
  if align_corners is not None and mode.startswith("nearest"):
    raise ValueError("align_corners only applies to the linear modes")
  spatial = self.ndim - 2
  if spatial < 1: raise ShapeError(f"interpolate needs (N, C, ...) input, got shape {self.shape}")
  if (size is None) == (scale_factor is None): raise ValueError("interpolate needs exactly one of size, scale_factor")
  if size is None:
    factors = scale_factor if isinstance(scale_factor, (list, tuple)) else (scale_factor,) * spatial
    size = [int(math.floor(s * f)) for s, f in zip(self.shape[2:], factors)]
  sizes = list(size) if isinstance(size, (list, tuple)) else [size] * spatial
  if len(sizes) != spatial: raise ShapeError(f"interpolate size {size} does not match {spatial} spatial axes")
  if any(s <= 0 for s in sizes) or any(s == 0 for s in self.shape[2:]):
    raise ShapeError(f"interpolate needs input and output sizes greater than 0, got input {tuple(self.shape[2:])} "
                     f"and output {tuple(sizes)}")
  result = self
  # the last axis first: for integer inputs, which round after each axis, that is PyTorch's order
  for axis, out_size in reversed(list(zip(range(2, self.ndim), sizes))):
    if out_size != result.shape[axis]: result = _resize_axis(result, axis, out_size, mode, align_corners)
  return result

