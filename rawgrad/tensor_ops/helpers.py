"""What tensor.py and the tensor_ops mixins share: the mixins' common base, and the checks of shape and axis arguments.

It sits below both, so no mixin imports rawgrad.tensor (which imports the mixins): a mixin makes new tensors with
`type(self)` (or `cls`), and tells a tensor from other arguments with `isinstance(x, TensorBase)`.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from rawgrad.compiler.gradient import set_custom_gradient
from rawgrad.compiler.ir import Ops, UOp, sint
from rawgrad.dtype import DType
from rawgrad.errors import IndexOutOfRange, ShapeError
from rawgrad.helpers import LRUCache, prod
from rawgrad.runtime.device import check_fits


class TensorBase:
  """The base of every tensor_ops mixin, and so of Tensor, the one class that derives from them all."""
  __slots__ = ()


# (value, its type, dtype, device, shape) -> the constant broadcast to the shape: `x * 2` in a loop builds it once
_scalars: LRUCache[tuple, UOp] = LRUCache(4096)


def scalar_uop(value: bool | int | float, dtype: DType, device: str, shape: tuple[sint, ...]) -> UOp:
  """A Python scalar as a constant of `dtype` on `device`, broadcast to `shape`."""
  # 0.0 and -0.0 are equal keys with different values: they are not cached (nor is NaN, which equals no key)
  key = (value, type(value), dtype, device, shape) if value != 0 or type(value) is not float else None
  if key is not None and (uop := _scalars.get(key)) is not None: return uop
  uop = UOp.const(dtype, value, (UOp(Ops.DEVICE, arg=device),))
  if shape: uop = uop.reshape((1,) * len(shape)).expand(shape)
  return uop if key is None else _scalars.put(key, uop)


def resolve_axis(axis: int, ndim: int) -> int:
  """A possibly negative axis as an index into `ndim` dimensions (a 0-d tensor accepts 0 and -1)."""
  if not -max(ndim, 1) <= axis < max(ndim, 1):
    raise IndexOutOfRange(f"axis {axis} is out of range for {ndim} dimensions (a dim in [{-max(ndim, 1)}, "
                          f"{max(ndim, 1) - 1}])")
  return axis % ndim if ndim else 0


def reduce_axes(axis: int | Sequence[int] | None, ndim: int) -> tuple[int, ...]:
  """The sorted axes a reduction over `axis` covers (all of them for None)."""
  if axis is None: return tuple(range(ndim))
  axes = (axis,) if isinstance(axis, int) else tuple(axis)
  resolved = tuple(sorted({resolve_axis(a, ndim) for a in axes}))
  if len(resolved) != len(axes): raise ValueError(f"axis {axis} repeats an axis")
  return resolved


def shape_arg(shape: tuple) -> tuple:
  """A shape given as separate sizes, `f(2, 3)`, or as one sequence, `f((2, 3))`."""
  if len(shape) == 1 and isinstance(shape[0], (tuple, list)): shape = tuple(shape[0])
  for size in shape:
    if not isinstance(size, (int, UOp)) or isinstance(size, bool):
      raise TypeError(f"shape entries must be ints, got {type(size).__name__} {size!r} in {shape}")
  return tuple(shape)


def creation_shape(shape: tuple, dtype: DType, device: str) -> tuple:
  """The shape of a new tensor, given as shape_arg takes it, after checking that no size is negative and that the
  tensor can fit in the device's memory."""
  shape = shape_arg(shape)
  if negative := [size for size in shape if isinstance(size, int) and size < 0]:
    raise ShapeError(f"cannot create a tensor with negative dimension {negative[0]}: shape {shape}")
  if all(isinstance(size, int) for size in shape): check_fits(prod(shape) * dtype.itemsize, device)
  return shape


def broadcast_shape(*shapes: tuple) -> tuple:
  """The shape several shapes broadcast to, as in numpy and PyTorch."""
  if all(shape == shapes[0] for shape in shapes[1:]): return tuple(shapes[0])  # most operands agree already
  ndim = max(len(shape) for shape in shapes)
  padded = [(1,) * (ndim - len(shape)) + tuple(shape) for shape in shapes]
  result = []
  for sizes in zip(*padded):
    others = {size for size in sizes if size != 1}
    if len(others) > 1:
      raise ShapeError(f"cannot broadcast {' with '.join(str(tuple(s)) for s in shapes)}")
    result.append(others.pop() if others else 1)
  return tuple(result)


def with_gradient(result: Any, inputs: tuple, rule: Callable[..., tuple]) -> Any:
  """result, differentiated by rule(output gradient, result, *inputs) -> one gradient per input (None for none)
  instead of through the graph that computes it: PyTorch's formula, where the composition's derivative differs from
  it at special values (inf, nan, the edges of branches) or in rounding."""
  tensor, sources = type(result), tuple(x.uop for x in inputs)
  if result.uop in sources: return result

  def gradient(node: UOp, output_gradient: UOp, wanted: set[UOp]) -> dict[UOp, UOp]:
    grads = rule(tensor(output_gradient), tensor(node), *(tensor(source) for source in sources))
    return {source: grad.cast(source.dtype).uop for source, grad in zip(sources, grads)
            if grad is not None and source in wanted}
  set_custom_gradient(result.uop, gradient)
  return result
