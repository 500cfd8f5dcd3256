"""The user-facing Tensor: lazy, PyTorch-style. Every operation builds UOps; nothing runs until realize()."""
from __future__ import annotations

import contextlib
import math
from typing import Any, Collection, Iterator, Sequence

import numpy as np

from rawgrad.compiler.gradient import (NOT_DIFFERENTIABLE, any_origin_remembered, autograd_origin, compute_gradient,
                                      expand_realized, remember_origin)
from rawgrad.compiler.ir import GroupOp, Ops, UOp, sint
from rawgrad.compiler.rangeify import buffer_base
from rawgrad.compiler.rewrite import substitute
from rawgrad.dtype import DType, bfloat16_bits, dtypes, least_upper_dtype, sum_acc_dtype, to_dtype
from rawgrad.engine.jit import refuse_host_read
from rawgrad.engine.schedule_cache import cached_schedule
from rawgrad.engine.realize import KernelCompiler, item_device, plan_temporaries, run_schedule
from rawgrad.errors import ArgumentError, DTypeError, ShapeError
from rawgrad.helpers import PROFILE, WeakIdentitySet, all_same, gc_paused, prod, unique_id
from rawgrad.runtime.device import Device, buffer_for
from rawgrad.runtime.profile import record_origin
from rawgrad.tensor_ops.bounds import mark_computed, raise_failed_checks, take_pending
from rawgrad.tensor_ops.elementwise import ElementwiseOps
from rawgrad.tensor_ops.helpers import (broadcast_shape, creation_shape, reduce_axes, resolve_axis, scalar_uop,
                                       shape_arg, with_gradient)
from rawgrad.tensor_ops.nn import NNOps
from rawgrad.tensor_ops.random import RandomOps
from rawgrad.tensor_ops.reduce import ReduceOps
from rawgrad.tensor_ops.shape import ShapeOps

# Every live tensor is in one of two sets: a realize looks only at the lazy ones (the others hold no node it can
# replace), so its cost does not grow with the number of realized tensors (parameters, kept results). A tensor moves
# between them where its graph changes: creation, assign, realize.
lazy_tensors: WeakIdentitySet[Tensor] = WeakIdentitySet()      # graphs that may hold nodes a realize computes
realized_tensors: WeakIdentitySet[Tensor] = WeakIdentitySet()  # plain views of a buffer
grad_tensors: WeakIdentitySet[Tensor] = WeakIdentitySet()      # requires_grad is True


def live_tensors() -> list[Tensor]:
  return [*lazy_tensors, *realized_tensors]


def _device_node(device: str) -> UOp:
  return UOp(Ops.DEVICE, arg=device)


def _canonical_device(device: str | None) -> str:
  return Device.canonicalize(device)


def _buffer_uop(shape: tuple[int, ...], dtype: DType, device: str) -> UOp:
  """A fresh buffer node viewed with `shape`; the buffer itself is allocated when it is first used."""
  size = prod(shape)
  node = UOp(Ops.BUFFER, dtype, (UOp(Ops.UNIQUE, arg=unique_id()), _device_node(device)), size)
  return node.reshape(shape)


def _nested_shape(data: Any) -> tuple[int, ...]:
  if not isinstance(data, (list, tuple)): return ()
  if not data: return (0,)
  inner = [_nested_shape(item) for item in data]
  if not all_same(inner): raise ShapeError(f"nested sequence is ragged: sub-shapes {sorted(set(inner))}")
  return (len(data), *inner[0])


def _uop_of(data: Any, device: str, dtype: DType | None) -> UOp:
  """The graph of a new tensor made from data that is not a graph (a Tensor, an array, a number, nested lists)."""
  if isinstance(data, Tensor): return data.uop if dtype is None else data.uop.cast(dtype)
  if isinstance(data, np.ndarray): return _from_numpy(data, device, dtype)
  if isinstance(data, np.generic): return _from_numpy(np.asarray(data), device, dtype)
  if isinstance(data, (bool, int, float)):
    return UOp.const(dtype or dtypes.from_py(data), data, (_device_node(device),))
  if isinstance(data, (list, tuple)):
    data = _python_values(data)
    dtype = dtype or dtypes.from_py(data)
    held = np.float64 if dtype == dtypes.bfloat16 else dtypes.to_numpy(dtype)   # bfloat16: values, not bits
    return _from_numpy(np.array(_flat(data), dtype=held).reshape(_nested_shape(data)), device, dtype)
  raise TypeError(f"cannot make a Tensor from {type(data).__name__}")


def _python_values(data: Any) -> Any:
  """Nested lists with the one-element tensors in them as Python numbers (as torch.tensor takes them)."""
  if isinstance(data, Tensor): return data.item()
  if isinstance(data, (list, tuple)) and any(isinstance(item, (Tensor, list, tuple)) for item in data):
    return [_python_values(item) for item in data]
  return data


def _flat(data: Any) -> list:
  if not isinstance(data, (list, tuple)): return [data]
  return [value for item in data for value in _flat(item)]


class Tensor(ElementwiseOps, ShapeOps, ReduceOps, NNOps, RandomOps):
  """A lazily evaluated n-dimensional array. The core operations live here; the rest, built from them, in the
  mixins of rawgrad/tensor_ops/."""
  __slots__ = ("uop", "_requires_grad", "grad", "__weakref__")

  def __init__(self, data: Any, device: str | None = None, dtype: DType | None = None,
               requires_grad: bool | None = None):
    if isinstance(data, UOp):  # every operation makes a Tensor of a UOp: that case looks up no device
      uop = data
      if Tensor._no_grad and uop.op not in (Ops.BUFFER, Ops.RESHAPE, Ops.ASSIGN, Ops.CONST):
        uop = UOp(Ops.DETACH, uop.dtype, (uop,))
    else: uop = _uop_of(data, _canonical_device(device), None if dtype is None else to_dtype(dtype))
    self.uop: UOp = uop
    if PROFILE: record_origin(uop)
    self._requires_grad: bool | None = None
    if requires_grad is not None: self.requires_grad = requires_grad
    self.grad: Tensor | None = None
    (lazy_tensors if buffer_base(uop) is None else realized_tensors).add(self)

  # *** properties ***

  @property
  def requires_grad(self) -> bool | None:
    """Whether backward() accumulates a gradient into this tensor's .grad (None: not decided, as for a new tensor)."""
    return self._requires_grad

  @requires_grad.setter
  def requires_grad(self, value: bool | None) -> None:
    if value and not dtypes.is_float(self.dtype):
      raise DTypeError(f"only float tensors can require gradients, got a {self.dtype!r} tensor of shape {self.shape}")
    if value: grad_tensors.add(self)
    elif self._requires_grad: grad_tensors.discard(self)
    self._requires_grad = value

  @property
  def shape(self) -> tuple[sint, ...]:
    return self.uop.shape

  @property
  def dtype(self) -> DType:
    return self.uop.dtype

  @property
  def device(self) -> str:
    return self.uop.device

  @property
  def ndim(self) -> int:
    return len(self.shape)

  def numel(self) -> sint:
    return prod(self.shape)

  def size(self, dim: int | None = None) -> Any:
    return self.shape if dim is None else self.shape[resolve_axis(dim, self.ndim)]

  def __len__(self) -> int:
    if not self.shape: raise TypeError("len() of a 0-d tensor")
    return self.shape[0]

  def __repr__(self) -> str:
    return f"<Tensor shape={self.shape} dtype={self.dtype!r} device={self.device}>"

  # *** one element as a Python value (each reads the device), as PyTorch's ***

  def _one_value(self, what: str, hint: str = "") -> Any:
    if self.numel() != 1: raise ShapeError(f"{what} of a tensor needs one element, got shape {self.shape}{hint}")
    return self.item()

  def __bool__(self) -> bool:
    return bool(self._one_value("the truth value", " (use .any() or .all() for truth values)"))

  def __float__(self) -> float:
    return float(self._one_value("float()"))

  def __int__(self) -> int:
    return int(self._one_value("int()"))

  def __index__(self) -> int:
    if not dtypes.is_int(self.dtype):
      raise DTypeError(f"only integer tensors of one element can be used as an index, got {self.dtype!r}")
    return int(self._one_value("an index"))

  def __format__(self, spec: str) -> str:
    return format(self._one_value("format()"), spec) if spec else repr(self)

  def __contains__(self, element: Any) -> bool:
    return bool((self == element).any())

  def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
    values = self.numpy()
    return values if dtype is None else values.astype(dtype)

  # *** creation ***

  @staticmethod
  def empty(*shape: Any, dtype: DType | None = None, device: str | None = None,
            requires_grad: bool | None = None) -> Tensor:
    dtype, device = _dtype_or(dtype, dtypes.default_float), _canonical_device(device)
    return Tensor(_buffer_uop(creation_shape(shape, dtype, device), dtype, device), requires_grad=requires_grad)

  @staticmethod
  def full(shape: Any, fill_value: Any, dtype: DType | None = None, device: str | None = None,
           requires_grad: bool | None = None) -> Tensor:
    dtype, device = _dtype_or(dtype, dtypes.from_py(fill_value)), _canonical_device(device)
    shape = creation_shape((shape,), dtype, device)
    const = Tensor(fill_value, device=device, dtype=dtype)
    return _requiring_grad(const.reshape((1,) * len(shape)).expand(shape), requires_grad)

  @staticmethod
  def zeros(*shape: Any, dtype: DType | None = None, device: str | None = None,
            requires_grad: bool | None = None) -> Tensor:
    return Tensor.full(shape_arg(shape), 0, dtype or dtypes.default_float, device, requires_grad)

  @staticmethod
  def ones(*shape: Any, dtype: DType | None = None, device: str | None = None,
           requires_grad: bool | None = None) -> Tensor:
    return Tensor.full(shape_arg(shape), 1, dtype or dtypes.default_float, device, requires_grad)

  @staticmethod
  def arange(start: int | float, stop: int | float | None = None, step: int | float = 1, dtype: DType | None = None,
             device: str | None = None, requires_grad: bool | None = None) -> Tensor:
    if stop is None: start, stop = 0, start
    if step == 0: raise ArgumentError(f"arange step must not be zero (start {start}, stop {stop})")
    count = max(0, math.ceil((stop - start) / step))
    if dtype is None and any(isinstance(v, float) for v in (start, stop, step)): dtype = dtypes.default_float
    if dtype is None:
      # ints take the default int unless a value would wrap there (PyTorch's arange is always int64)
      last = start + (count - 1) * step if count else start
      dtype = dtypes.default_int if all(_fits(v, dtypes.default_int) for v in (start, last)) else dtypes.int64
    else:
      dtype = to_dtype(dtype)
      if dtypes.is_int(dtype) and count and not all(_fits(v, dtype) for v in (start, start + (count - 1) * step)):
        raise ArgumentError(f"arange({start}, {stop}, {step}) has values outside the range of {dtype}")
    device = _canonical_device(device)
    creation_shape((count,), dtype, device)
    index = Tensor(UOp(Ops.IOTA, dtypes.int32, (_device_node(device), UOp.const(dtypes.index, count))))
    if start == 0 and step == 1: return _requiring_grad(index.cast(dtype), requires_grad)
    return _requiring_grad((index.cast(dtype) * step + start).cast(dtype), requires_grad)

  @staticmethod
  def linspace(start: float, end: float, steps: int, dtype: DType | None = None, device: str | None = None,
               requires_grad: bool | None = None) -> Tensor:
    if steps < 0: raise ArgumentError(f"linspace needs a non-negative number of steps, got {steps}")
    dtype = _dtype_or(dtype, dtypes.default_float)
    if steps == 1: return Tensor.full((1,), start, dtype, device, requires_grad)
    step = (end - start) / (steps - 1) if steps > 1 else 0.0
    points = Tensor.arange(steps, dtype=dtypes.float64 if dtype == dtypes.float64 else dtypes.float32, device=device)
    return _requiring_grad((points * step + start).cast(dtype), requires_grad)

  @staticmethod
  def eye(n: int, m: int | None = None, dtype: DType | None = None, device: str | None = None,
          requires_grad: bool | None = None) -> Tensor:
    m = n if m is None else m
    dtype = _dtype_or(dtype, dtypes.default_float)
    creation_shape((n, m), dtype, _canonical_device(device))
    rows = Tensor.arange(n, device=device).reshape(n, 1)
    return _requiring_grad((rows == Tensor.arange(m, device=device).reshape(1, m)).cast(dtype), requires_grad)

  def full_like(self, fill_value: Any, dtype: DType | None = None, requires_grad: bool | None = None) -> Tensor:
    return Tensor.full(self.shape, fill_value, dtype or self.dtype, self.device, requires_grad)

  def zeros_like(self, dtype: DType | None = None, requires_grad: bool | None = None) -> Tensor:
    return self.full_like(0, dtype, requires_grad)

  def ones_like(self, dtype: DType | None = None, requires_grad: bool | None = None) -> Tensor:
    return self.full_like(1, dtype, requires_grad)

  # *** realizing and reading ***

  def realize(self, *others: Tensor) -> Tensor:
    """Compute this tensor (and `others`, in the same schedule) into buffers."""
    realize_tensors([self, *others])
    return self

  def assign(self, value: Any) -> Tensor:
    """Write `value` into this tensor's buffer in place (when realized); returns self."""
    value = self._written_value(value, self.shape)
    if not is_buffer_view(self.uop): self.realize()
    _set_graph(self, UOp(Ops.ASSIGN, self.dtype, (self.uop, value.uop)))
    return self

  def _written_value(self, value: Any, shape: tuple) -> Tensor:
    """`value` to be written into this tensor: on its device, in its dtype, broadcast to `shape`."""
    value = value if isinstance(value, Tensor) else Tensor(value, self.device, self.dtype)
    if value.device != self.device:
      raise RuntimeError(f"cannot assign a tensor on {value.device} into one on {self.device}")
    return value.cast(self.dtype)._broadcast_to(shape)

  def to(self, device: str) -> Tensor:
    """This tensor on another device (the same tensor when it is there already); the copy runs when realized."""
    device = _canonical_device(device)
    if device == self.device: return self
    return Tensor(UOp(Ops.COPY, self.dtype, (self.uop, _device_node(device))), requires_grad=self.requires_grad)

  def clone(self) -> Tensor:
    """A copy with a buffer of its own (lazy, like everything else)."""
    return Tensor.empty(*self.shape, dtype=self.dtype, device=self.device).assign(self)

  def contiguous(self) -> Tensor:
    return Tensor(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,)))

  def numpy(self) -> np.ndarray:
    """A copy of the values on the host (waits for the device). Raises the errors deferred index checks found."""
    refuse_host_read("reading a tensor on the host (numpy/tolist/item)")
    if any(not isinstance(s, int) for s in self.shape):
      raise ValueError(f"cannot read a tensor with symbolic shape {self.shape} into numpy")
    self.realize()
    values = buffer_for(buffer_base(self.uop)).numpy()
    raise_failed_checks()
    if self.dtype == dtypes.bfloat16: values = (values.astype(np.uint32) << 16).view(np.float32)
    return values.reshape(self.shape)

  def tolist(self) -> Any:
    return self.numpy().tolist()

  @staticmethod
  def synchronize() -> None:
    """Wait until every device has run the work submitted to it, and raise the errors that deferred index checks
    found (rawgrad/tensor_ops/bounds.py): torch.cuda.synchronize's place in a program."""
    refuse_host_read("Tensor.synchronize")
    realize_tensors([])
    for device in Device.opened(): device.synchronize()
    raise_failed_checks()

  def item(self) -> Any:
    if self.numel() != 1: raise ShapeError(f"item() needs a tensor with one element, got shape {self.shape}")
    return self.numpy().reshape(()).item()

  # *** autograd ***

  _no_grad = False

  @staticmethod
  @contextlib.contextmanager
  def no_grad() -> Iterator[None]:
    """`with Tensor.no_grad():` tensors made inside carry no gradient (as torch.no_grad)."""
    previous, Tensor._no_grad = Tensor._no_grad, True
    try:
      yield
    finally:
      Tensor._no_grad = previous

  def detach(self) -> Tensor:
    return Tensor(UOp(Ops.DETACH, self.dtype, (self.uop,)))

  def gradient(self, *targets: Tensor, gradient: Tensor | None = None) -> list[Tensor]:
    """d(self)/d(target) for each target, as new lazy tensors (zeros where self does not depend on a target)."""
    if gradient is None:
      if self.numel() != 1: raise ShapeError(f"gradient of a non-scalar tensor of shape {self.shape} needs `gradient`")
      gradient = Tensor.ones(*self.shape, dtype=self.dtype, device=self.device)
    if gradient.shape != self.shape:
      raise ShapeError(f"gradient has shape {gradient.shape}, but the tensor has shape {self.shape}")
    grads = compute_gradient(self.uop, gradient.cast(self.dtype).uop, {t.uop for t in targets})
    return [Tensor(grads[t.uop]).cast(t.dtype) if t.uop in grads else t.zeros_like() for t in targets]

  def backward(self, gradient: Tensor | None = None) -> Tensor:
    """Accumulate d(self)/d(t) into t.grad for every tensor t with requires_grad that self depends on."""
    in_graph = expand_realized(self.uop)[0].toposort
    targets = [t for t in list(grad_tensors) if t.uop in in_graph]
    if not targets: raise RuntimeError("backward: no tensor with requires_grad=True contributes to this one")
    for target, grad in zip(targets, self.gradient(*targets, gradient=gradient)):
      # accumulate in place, so a jit replay that runs this step again adds to the same buffer
      if target.grad is None: target.grad = grad
      else: target.grad.assign(target.grad + grad)
    return self

  # *** broadcasting and dtype promotion ***

  def _to_tensor_like(self, other: Any) -> tuple[Tensor, Tensor]:
    """Both operands as Tensors of one dtype: a Python scalar adopts the tensor's dtype unless it is of a higher
    category (bool < int < float), as in PyTorch."""
    if isinstance(other, Tensor):
      if other.device != self.device:
        raise RuntimeError(f"tensors are on different devices: {self.device} and {other.device}")
      dtype = least_upper_dtype(self.dtype, other.dtype)
      return self.cast(dtype), other.cast(dtype)
    if not isinstance(other, (bool, int, float)):
      raise TypeError(f"unsupported operand type {type(other).__name__} for a Tensor operation")
    dtype = _scalar_result_dtype(self.dtype, other)
    return self.cast(dtype), Tensor(scalar_uop(other, dtype, self.device, self.shape))

  def _broadcasted(self, other: Any, reverse: bool = False) -> tuple[Tensor, Tensor]:
    x, y = self._to_tensor_like(other)
    if not isinstance(other, Tensor): return (y, x) if reverse else (x, y)  # a scalar comes with this tensor's shape
    shape = broadcast_shape(x.shape, y.shape)
    x, y = x._broadcast_to(shape), y._broadcast_to(shape)
    return (y, x) if reverse else (x, y)

  def _broadcast_to(self, shape: tuple) -> Tensor:
    if self.shape == shape: return self
    padded = (1,) * (len(shape) - self.ndim) + tuple(self.shape)
    return self.reshape(padded).expand(shape)

  def expand(self, *shape: Any) -> Tensor:
    shape = shape_arg(shape)
    if len(shape) < self.ndim: raise ShapeError(f"cannot expand {self.shape} to fewer dimensions {shape}")
    shape = tuple(old if new == -1 else new for old, new in zip((None,) * (len(shape) - self.ndim) + self.shape, shape))
    if None in shape: raise ShapeError(f"-1 is not allowed for new leading dimensions in expand to {shape}")
    broadcast_shape(self.shape, shape)  # names the shapes when they do not broadcast
    return Tensor(self.uop.reshape((1,) * (len(shape) - self.ndim) + tuple(self.shape)).expand(shape))

  # *** elementwise ***

  def _binary(self, op: Ops, other: Any, reverse: bool = False) -> Tensor:
    x, y = self._broadcasted(other, reverse)
    return Tensor(x.uop.alu(op, y.uop))

  def neg(self) -> Tensor:
    if self.dtype == dtypes.bool: raise TypeError("negation of a bool tensor is not supported; use logical_not()")
    return Tensor(self.uop.alu(Ops.MUL, self._scalar(-1).uop))

  def _scalar(self, value: Any) -> Tensor:
    return Tensor(value, self.device, self.dtype)._broadcast_to(self.shape)

  def cast(self, dtype: DType) -> Tensor:
    dtype = to_dtype(dtype)
    if dtype == self.dtype: return self
    if dtype == dtypes.bool and self.dtype != dtypes.bool: return self != 0
    return Tensor(self.uop.cast(dtype))

  def bitcast(self, dtype: DType) -> Tensor:
    """The same bytes read as `dtype` (torch's view(dtype)): a different item size changes the last dim, which must
    be contiguous in memory and (for a larger item) divide evenly."""
    if dtype == self.dtype: return self
    if dtypes.is_bool(dtype) or dtypes.is_bool(self.dtype): raise TypeError(f"cannot bitcast {self.dtype} to {dtype}")
    if dtype.itemsize == self.dtype.itemsize: return Tensor(self.uop.bitcast(dtype))
    if self.ndim == 0: raise ValueError(f"bitcast of a 0-d {self.dtype} tensor to {dtype} changes its size")
    source_bits, target_bits = 8 * self.dtype.itemsize, 8 * dtype.itemsize
    words = self.bitcast(_unsigned(self.dtype.itemsize))
    target_word = _unsigned(dtype.itemsize)
    if target_bits < source_bits:
      # each word splits into its parts, the least significant first (little endian)
      parts = [(words >> shift).cast(target_word) for shift in range(0, source_bits, target_bits)]
      pieces = Tensor.stack(*parts, dim=-1)
      return pieces.reshape(*self.shape[:-1], -1).bitcast(dtype)
    ratio = target_bits // source_bits
    if self.shape[-1] % ratio:
      raise ValueError(f"bitcast of shape {self.shape} ({self.dtype}) to {dtype} needs a last dim divisible by {ratio}")
    grouped = words.reshape(*self.shape[:-1], self.shape[-1] // ratio, ratio).cast(target_word)
    combined = grouped[..., 0]
    for i in range(1, ratio): combined = combined | (grouped[..., i] << source_bits * i)
    return combined.bitcast(dtype)

  def float(self) -> Tensor:
    return self.cast(dtypes.float32)

  def int(self) -> Tensor:
    return self.cast(dtypes.int32)

  def bool(self) -> Tensor:
    return self.cast(dtypes.bool)

  def half(self) -> Tensor: return self.cast(dtypes.float16)
  def bfloat16(self) -> Tensor: return self.cast(dtypes.bfloat16)
  def double(self) -> Tensor: return self.cast(dtypes.float64)
  def long(self) -> Tensor: return self.cast(dtypes.int64)
  def short(self) -> Tensor: return self.cast(dtypes.int16)
  def char(self) -> Tensor: return self.cast(dtypes.int8)
  def byte(self) -> Tensor: return self.cast(dtypes.uint8)

  def _float_unary(self, op: Ops) -> Tensor:
    x = self if dtypes.is_float(self.dtype) else self.cast(dtypes.default_float)
    return Tensor(UOp(op, x.dtype, (x.uop,)))

  def exp2(self) -> Tensor:
    return self._float_unary(Ops.EXP2)

  def log2(self) -> Tensor:
    return self._float_unary(Ops.LOG2)

  def log(self) -> Tensor:
    return self.log2() * math.log(2)

  def sqrt(self) -> Tensor:
    return self._float_unary(Ops.SQRT)

  def sin(self) -> Tensor:
    return self._float_unary(Ops.SIN)

  def reciprocal(self) -> Tensor:
    return self._float_unary(Ops.RECIPROCAL)

  def relu(self) -> Tensor:
    # a select, not maximum(x, 0): PyTorch's gradient at 0 is 0 (maximum would split it), and nan stays nan. The
    # gradient selects by the output (the same choices): a layer's pre-activation need not outlive its ReLU
    return with_gradient((self <= 0).where(0, self), (self,), lambda grad, out, _: ((out <= 0).where(0, grad),))

  def maximum(self, other: Any) -> Tensor:
    return self._binary(Ops.MAX, other)

  def minimum(self, other: Any) -> Tensor:
    x, y = self._broadcasted(other)
    # negating the most negative integer overflows, so integers select; -max(-x, -y) keeps nan for floats
    if not dtypes.is_float(x.dtype): return (x < y).where(x, y)
    return -((-x).maximum(-y))

  def where(self, if_true: Any, if_false: Any) -> Tensor:
    condition = self.cast(dtypes.bool)
    if isinstance(if_true, Tensor): x, y = if_true._broadcasted(if_false)
    elif isinstance(if_false, Tensor): y, x = if_false._broadcasted(if_true)
    else:
      dtype = least_upper_dtype(dtypes.from_py(if_true), dtypes.from_py(if_false))
      x, y = Tensor(if_true, self.device, dtype), Tensor(if_false, self.device, dtype)
    shape = broadcast_shape(condition.shape, x.shape, y.shape)
    condition, x, y = condition._broadcast_to(shape), x._broadcast_to(shape), y._broadcast_to(shape)
    return Tensor(UOp(Ops.WHERE, x.dtype, (condition.uop, x.uop, y.uop)))

  def logical_not(self) -> Tensor:
    return Tensor(self.cast(dtypes.bool).uop.alu(Ops.XOR, self.cast(dtypes.bool)._scalar(True).uop))

  def __lt__(self, other: Any) -> Tensor: return self._binary(Ops.CMPLT, other)
  def __gt__(self, other: Any) -> Tensor: return self._binary(Ops.CMPLT, other, reverse=True)
  def __ne__(self, other: Any) -> Tensor: return self._binary(Ops.CMPNE, other)  # type: ignore[override]
  def __eq__(self, other: Any) -> Tensor: return (self != other).logical_not()  # type: ignore[override]
  def __le__(self, other: Any) -> Tensor: return (self < other) | (self == other)
  def __ge__(self, other: Any) -> Tensor: return (self > other) | (self == other)
  __hash__ = object.__hash__


  def __add__(self, other: Any) -> Tensor: return self.add(other)
  def __radd__(self, other: Any) -> Tensor: return self.add(other, True)
  def __sub__(self, other: Any) -> Tensor: return self.sub(other)
  def __rsub__(self, other: Any) -> Tensor: return self.sub(other, True)
  def __mul__(self, other: Any) -> Tensor: return self.mul(other)
  def __rmul__(self, other: Any) -> Tensor: return self.mul(other, True)
  def __truediv__(self, other: Any) -> Tensor: return self.div(other)
  def __rtruediv__(self, other: Any) -> Tensor: return self.div(other, True)
  def __neg__(self) -> Tensor: return self.neg()
  def __matmul__(self, other: Tensor) -> Tensor: return self.matmul(other)
  def __rmatmul__(self, other: Tensor) -> Tensor: return Tensor(other).matmul(self)

  # *** movement ***

  def reshape(self, *shape: Any) -> Tensor:
    shape = shape_arg(shape)
    if shape.count(-1) > 1: raise ShapeError(f"only one dimension can be -1 in reshape to {shape}")
    if -1 in shape:
      known = prod(s for s in shape if s != -1)
      if known == 0 or self.numel() % known != 0:
        raise ShapeError(f"cannot reshape {self.shape} ({self.numel()} elements) to {shape}")
      shape = tuple(self.numel() // known if s == -1 else s for s in shape)
    return Tensor(self.uop.reshape(shape))

  def view(self, *shape: Any) -> Tensor:
    """reshape, or with a dtype the same bytes read as that dtype (bitcast)."""
    if len(shape) == 1 and isinstance(shape[0], DType): return self.bitcast(shape[0])
    return self.reshape(*shape)

  def permute(self, *order: Any) -> Tensor:
    order = shape_arg(order)
    if len(order) != self.ndim:
      raise ShapeError(f"permute order {order} has {len(order)} axes, but the tensor has shape {self.shape}")
    return Tensor(self.uop.permute(tuple(resolve_axis(axis, self.ndim) for axis in order)))

  def pad(self, padding: Sequence[tuple[int, int]], value: float = 0.0) -> Tensor:
    """Pad each axis by (before, after) elements of `value`: one pair per axis, first axis first."""
    padding = tuple(tuple(p) for p in padding)
    if len(padding) != self.ndim:
      raise ShapeError(f"pad needs {self.ndim} (before, after) pairs for shape {self.shape}, got {padding}")
    padded = Tensor(self.uop.pad(padding))
    if value == 0: return padded
    inside = Tensor(self.full_like(True, dtypes.bool).uop.pad(padding))
    return inside.where(padded, Tensor(value, self.device, self.dtype))

  def shrink(self, bounds: Sequence[tuple[int, int] | None]) -> Tensor:
    bounds = tuple((0, size) if b is None else tuple(b) for b, size in zip(bounds, self.shape))
    if len(bounds) != self.ndim: raise ShapeError(f"shrink needs {self.ndim} bounds for shape {self.shape}")
    return Tensor(self.uop.shrink(bounds))

  def flip(self, *axes: Any) -> Tensor:
    axes = tuple(resolve_axis(axis, self.ndim) for axis in shape_arg(axes))
    if len(set(axes)) != len(axes):
      raise RuntimeError(f"flip dims {shape_arg(axes)} name a dim more than once: {sorted(axes)}")
    return Tensor(self.uop.flip(axes))

  def transpose(self, dim0: int = 1, dim1: int = 0) -> Tensor:
    order = list(range(self.ndim))
    a, b = resolve_axis(dim0, self.ndim), resolve_axis(dim1, self.ndim)
    order[a], order[b] = order[b], order[a]
    return self.permute(order)

  @property
  def T(self) -> Tensor:
    return self.permute(tuple(reversed(range(self.ndim))))

  def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    if self.ndim == 0: return self.reshape(1)
    start, end = resolve_axis(start_dim, self.ndim), resolve_axis(end_dim, self.ndim)
    return self.reshape(*self.shape[:start], prod(self.shape[start:end + 1]), *self.shape[end + 1:])

  def squeeze(self, dim: int | None = None) -> Tensor:
    if dim is None: return self.reshape(*[s for s in self.shape if s != 1])
    axis = resolve_axis(dim, self.ndim)
    if self.ndim == 0 or self.shape[axis] != 1: return self
    return self.reshape(*self.shape[:axis], *self.shape[axis + 1:])

  def unsqueeze(self, dim: int) -> Tensor:
    axis = resolve_axis(dim, self.ndim + 1)
    return self.reshape(*self.shape[:axis], 1, *self.shape[axis:])

  def __getitem__(self, index: Any) -> Tensor:
    return self._advanced_getitem(index)

  def __setitem__(self, index: Any, value: Any) -> None:
    """Write into the elements `index` selects, in place and at once (as PyTorch does). Ints, slices, None and ...
    select a view of the buffer, written through; tensor, list and boolean-mask indices select copies, so their
    positions are scattered into (where an index repeats a position, the last write wins)."""
    if not is_buffer_view(self.uop): self.realize()
    realize_readers([self])
    if _is_basic_index(index):
      self[index].assign(value).realize()
      return
    positions = Tensor.arange(self.numel(), device=self.device).reshape(self.shape)[index]
    values = self._written_value(value, positions.shape)
    flat = self.reshape(-1).scatter(0, positions.reshape(-1), values.reshape(-1))
    self.assign(flat.reshape(self.shape)).realize()

  # *** reductions ***

  def _reduce(self, op: Ops, axis: int | Sequence[int] | None, keepdim: bool) -> Tensor:
    axes = reduce_axes(axis, self.ndim)
    if self.ndim == 0: return self
    kept = tuple(1 if i in axes else s for i, s in enumerate(self.shape))
    if not axes: reduced = self
    else: reduced = Tensor(UOp(Ops.REDUCE_AXIS, self.dtype, (self.uop,), (op, axes)))
    if keepdim: return reduced.reshape(kept) if reduced is not self else self
    return reduced.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

  def sum(self, axis: int | Sequence[int] | None = None, keepdim: bool = False, dtype: DType | None = None) -> Tensor:
    dtype = dtype or sum_acc_dtype(self.dtype)
    # float16 and bfloat16 accumulate in float32 and round once at the end, as PyTorch does
    if dtype in _HALF_FLOATS: return self.cast(dtypes.float32)._reduce(Ops.ADD, axis, keepdim).cast(dtype)
    return self.cast(dtype)._reduce(Ops.ADD, axis, keepdim)

  def max(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
    self._check_not_empty("max", axis)
    return self._reduce(Ops.MAX, axis, keepdim)

  def _check_not_empty(self, name: str, axis: int | Sequence[int] | None) -> None:
    """max, min and their arg- forms have no identity: reducing an empty axis has no answer."""
    axes = reduce_axes(axis, self.ndim)
    if self.ndim and any(self.shape[a] == 0 for a in axes):
      raise ShapeError(f"{name} over an empty axis of shape {self.shape} has no identity (axis={axis})")

  def min(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
    self._check_not_empty("min", axis)
    if not dtypes.is_float(self.dtype):
      # x ^ all-ones reverses the order of integers (and bools) without overflow, so min is a max in between
      return self._invert_order().max(axis, keepdim)._invert_order()
    return -((-self).max(axis, keepdim))

  def _invert_order(self) -> Tensor:
    all_ones = -1 if self.dtype.kind == "int" else dtypes.max(self.dtype)
    return Tensor(self.uop.alu(Ops.XOR, self._scalar(all_ones).uop))

  def mean(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
    axes = reduce_axes(axis, self.ndim)
    count = prod(self.shape[a] for a in axes) if self.ndim else 1
    x = self if dtypes.is_float(self.dtype) else self.cast(dtypes.default_float)
    if x.dtype in _HALF_FLOATS: return x.cast(dtypes.float32).mean(axis, keepdim).cast(x.dtype)  # one rounding
    total = x.sum(axis, keepdim)
    return total / count if count else total * math.nan

  def matmul(self, other: Tensor) -> Tensor:
    """Matrix product with PyTorch's rules for 1-D operands and batch broadcasting; one fused kernel."""
    if not isinstance(other, Tensor): other = Tensor(other, self.device)
    if self.ndim == 0 or other.ndim == 0:
      raise ShapeError(f"matmul needs tensors with at least one dimension, got {self.shape} and {other.shape}")
    x = self.unsqueeze(0) if self.ndim == 1 else self
    w = other.unsqueeze(1) if other.ndim == 1 else other
    if x.shape[-1] != w.shape[-2]:
      raise ShapeError(f"matmul shapes {self.shape} and {other.shape} do not match: {x.shape[-1]} != {w.shape[-2]}")
    try:
      broadcast_shape(x.shape[:-2], w.shape[:-2])
    except ShapeError:
      raise ShapeError(f"matmul batch dimensions of {self.shape} and {other.shape} do not broadcast") from None
    # x: (..., n, k, 1) times w: (..., 1, k, m), summed over k; half floats multiply and add in float32
    dtype = least_upper_dtype(self.dtype, other.dtype)
    if dtype in _HALF_FLOATS: x, w = x.cast(dtypes.float32), w.cast(dtypes.float32)
    product = x.unsqueeze(-1) * w.unsqueeze(-3)
    result = product.sum(-2, dtype=dtypes.float32 if dtype in _HALF_FLOATS else dtype).cast(dtype)
    if self.ndim == 1: result = result.squeeze(-2)
    if other.ndim == 1: result = result.squeeze(-1)
    return result

  def dot(self, other: Tensor) -> Tensor:
    return self.matmul(other)


# *** realizing ***

def realize_tensors(tensors: list[Tensor]) -> None:
  """Compute the given tensors into buffers, and the pending index checks with them; every live tensor that shared
  their graphs now reads the buffers."""
  checks = take_pending()
  if checks: tensors = [*tensors, *(check.extremes for check in checks)]
  outputs = [t.uop for t in tensors if buffer_base(t.uop) is None]
  if not outputs: return
  with gc_paused(), KernelCompiler() as compiler:
    # each kernel starts compiling as soon as it is built, while the scheduler builds the next
    schedule = cached_schedule(outputs, on_kernel=lambda item: compiler.start(item_device(item), item.ast))
    kept = _apply_becomes_map(schedule.becomes_map)
    _remember_for_autograd(schedule.becomes_map, kept, {t.uop for t in list(grad_tensors)})
    plan_temporaries(schedule.items, kept)
    run_schedule(schedule.items, compiler)
  mark_computed(checks)


def _apply_becomes_map(becomes_map: dict[UOp, UOp]) -> set[UOp]:
  """Point every lazy tensor at the buffers that now hold its nodes; returns the buffers the tensors keep (the
  others a schedule creates are temporaries). A tensor realized here becomes its buffer's view. A tensor whose graph
  was walked before (its toposort is cached) is looked up on its own, which costs a lookup per node; the others are
  walked together in one substitute, since they share most nodes."""
  kept: set[UOp] = set()
  unwalked = []
  for tensor in list(lazy_tensors):
    if (view := becomes_map.get(tensor.uop)) is not None: _set_graph(tensor, view)
    elif (order := tensor.uop.__dict__.get("toposort")) is None:
      unwalked.append(tensor)
      continue
    elif any(node in order for node in becomes_map) if len(becomes_map) < len(order) else \
         any(node in becomes_map for node in order):
      _set_graph(tensor, substitute(tensor.uop, becomes_map))
    else: continue
    kept.update(_buffers_in(tensor.uop))
  if unwalked:
    graph = substitute(UOp.sink(*(tensor.uop for tensor in unwalked)), becomes_map)
    for tensor, uop in zip(unwalked, graph.src): _set_graph(tensor, uop)
    kept.update(node for node in graph.toposort if node.op is Ops.BUFFER)
  return kept


def realize_readers(written: Sequence[Tensor], exclude: Sequence[Tensor] = ()) -> None:
  """Before the buffers of `written` are overwritten in place: realize the lazy tensors computed from them (not views
  of them, which see the new values, as PyTorch's views do), except `exclude` (realized with the write). PyTorch
  computes a tensor when it is made, so `loss.backward(); optimizer.step(); loss.item()` reads the loss of the
  weights before the step; a lazy loss realized after it read the new ones."""
  if readers := readers_of(written, exclude): readers[0].realize(*readers[1:])


def readers_of(written: Sequence[Tensor], exclude: Sequence[Tensor] = ()) -> list[Tensor]:
  """The lazy tensors computed from the buffers of `written` (not views of them), but `exclude`: what must be
  realized before those buffers are overwritten (see realize_readers)."""
  buffers = {base for tensor in written if (base := buffer_base(tensor.uop)) is not None}
  skipped = {id(tensor) for tensor in exclude}
  return [tensor for tensor in list(lazy_tensors) if id(tensor) not in skipped and not _is_view(tensor.uop) and
          not buffers.isdisjoint(tensor.uop.walked())] if buffers else []


def _is_view(node: UOp) -> bool:
  """Movement ops over a buffer: reading it sees later writes, as PyTorch's views do."""
  while node.op in GroupOp.Movement: node = node.src[0]
  return node.op is Ops.BUFFER


def _is_basic_index(index: Any) -> bool:
  """An index of ints, slices, None and Ellipsis only: it selects a view (no tensor, list or bool)."""
  items = index if isinstance(index, tuple) else (index,)
  return all(item is None or item is Ellipsis or isinstance(item, slice) or
             (isinstance(item, (int, np.integer)) and not isinstance(item, (bool, np.bool_))) for item in items)


def _set_graph(tensor: Tensor, uop: UOp) -> None:
  """Give the tensor a new graph, filed with the lazy or the realized tensors."""
  tensor.uop = uop
  if buffer_base(uop) is None: realized_tensors.move(tensor, lazy_tensors)
  else: lazy_tensors.move(tensor, realized_tensors)


def _buffers_in(graph: UOp) -> list[UOp]:
  if (base := buffer_base(graph)) is not None: return [base]  # not walked: its toposort would be kept for nothing
  return [node for node in graph.toposort if node.op is Ops.BUFFER]


def _remember_for_autograd(becomes_map: dict[UOp, UOp], kept: set[UOp], parameters: set[UOp]) -> None:
  """Realizing replaces a tensor's graph by its buffer; keep the graph for gradients that flow through it (as
  PyTorch keeps its autograd graph), so `loss.item(); loss.backward()` works. Only for buffers tensors keep (a
  temporary's storage is reused), never for assigns (that would chain every training step to the one before)."""
  if not parameters and not any_origin_remembered(): return  # no gradient can flow through any graph
  for node, view in becomes_map.items():
    if node.op is Ops.ASSIGN or node in parameters or buffer_base(view) not in kept: continue
    if not _reaches_gradients(node.walked(), parameters): continue
    # what reaches them only through a detach or a comparison (a sort's order) has no gradient to keep a graph for
    if _reaches_gradients(node.reachable_without_entering(lambda n: n.op in NOT_DIFFERENTIABLE), parameters):
      remember_origin(view, node)


def _reaches_gradients(nodes: Collection[UOp], parameters: set[UOp]) -> bool:
  return not parameters.isdisjoint(nodes) or any(map(autograd_origin, nodes))


# *** helpers ***

_HALF_FLOATS = (dtypes.float16, dtypes.bfloat16)


def _fits(value: int, dtype: DType) -> bool:
  return dtypes.min(dtype) <= value <= dtypes.max(dtype)


def _unsigned(itemsize: int) -> DType:
  return {1: dtypes.uint8, 2: dtypes.uint16, 4: dtypes.uint32, 8: dtypes.uint64}[itemsize]


def is_buffer_view(node: UOp) -> bool:
  while node.op in (Ops.RESHAPE, Ops.SHRINK, Ops.PERMUTE, Ops.FLIP, Ops.PAD, Ops.ASSIGN): node = node.src[0]
  return node.op is Ops.BUFFER


def _from_numpy(array: np.ndarray, device: str, dtype: DType | None) -> UOp:
  dtype = dtype or dtypes.from_numpy(array.dtype)
  # a copy, as torch.tensor makes: later writes to the user's array must not reach the tensor
  # bfloat16 from numbers is rounded to its bits; a uint16 array is taken as the bits themselves (how numpy holds
  # bfloat16: safetensors, ml_dtypes)
  if dtype == dtypes.bfloat16 and array.dtype != np.uint16: data = bfloat16_bits(array)
  else: data = np.array(array, dtype=dtypes.to_numpy(dtype), order="C", copy=True)
  uop = _buffer_uop(data.shape, dtype, device)
  buffer_for(uop.src[0] if uop.op is Ops.RESHAPE else uop).set_initial(data)
  return uop


def _dtype_or(dtype: Any, default: DType) -> DType:
  return default if dtype is None else to_dtype(dtype)


def _requiring_grad(tensor: Tensor, requires_grad: bool | None) -> Tensor:
  tensor.requires_grad = requires_grad
  return tensor


def _scalar_result_dtype(dtype: DType, value: Any) -> DType:
  category = 0 if dtype is dtypes.bool else 2 if dtypes.is_float(dtype) else 1
  value_category = 0 if isinstance(value, bool) else 1 if isinstance(value, int) else 2
  if value_category <= category: return dtype
  return dtypes.default_float if value_category == 2 else dtypes.default_int


__all__ = ["Tensor", "broadcast_shape"]
