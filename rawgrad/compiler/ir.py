"""The one IR: immutable, hash-consed `UOp(op, dtype, src, arg, tag)` nodes and their derived properties."""
from __future__ import annotations

import hashlib
import math
import weakref
from enum import Enum, auto
from typing import Any, Callable, Iterator

from rawgrad.dtype import AnyDType, DType, PtrDType, dtypes, truncate
from rawgrad.errors import ShapeError
from rawgrad.helpers import cached_property


class Ops(Enum):
  # values, variables, vectors
  CONST = auto()
  DEFINE_VAR = auto()
  BIND = auto()
  VECTORIZE = auto()
  GEP = auto()
  CAST = auto()
  BITCAST = auto()
  INVALID = auto()
  IOTA = auto()  # tensor-level: the index along its one axis, [0, 1, ..., n-1]
  # unary
  EXP2 = auto()
  LOG2 = auto()
  SIN = auto()
  SQRT = auto()
  RECIPROCAL = auto()
  TRUNC = auto()
  # binary
  ADD = auto()
  MUL = auto()
  FDIV = auto()
  IDIV = auto()
  MOD = auto()
  MAX = auto()
  CMPLT = auto()
  CMPNE = auto()
  AND = auto()
  OR = auto()
  XOR = auto()
  SHL = auto()
  SHR = auto()
  THREEFRY = auto()  # uint64 (counter, key) -> the Threefry-2x32 block of the counter's two words, packed the same way
  # ternary
  WHERE = auto()
  MULACC = auto()
  # reduce
  REDUCE_AXIS = auto()
  REDUCE = auto()
  # movement
  RESHAPE = auto()
  EXPAND = auto()
  PERMUTE = auto()
  PAD = auto()
  SHRINK = auto()
  FLIP = auto()
  # buffer
  BUFFER = auto()
  BUFFER_VIEW = auto()
  DEFINE_GLOBAL = auto()
  DEFINE_LOCAL = auto()
  DEFINE_SCRATCH = auto()  # an array in the kernel's image, shared by its slices (a GROUP's partial results)
  DEFINE_REG = auto()
  INDEX = auto()
  LOAD = auto()
  STORE = auto()
  BUFFERIZE = auto()
  CONTIGUOUS = auto()
  REALIZE = auto()
  COPY = auto()
  ASSIGN = auto()
  # control
  SINK = auto()
  RANGE = auto()
  END = auto()
  IF = auto()
  ENDIF = auto()
  BARRIER = auto()  # BARRIER(scratch): a GROUP's slices meet; only the one that finishes last goes on
  KERNEL = auto()
  NOOP = auto()
  UNIQUE = auto()
  DEVICE = auto()
  SPECIAL = auto()
  DETACH = auto()
  CONTIGUOUS_BACKWARD = auto()
  AFTER = auto()

  def __repr__(self) -> str:
    return f"Ops.{self.name}"

  # members are singletons: identity hashing is correct, and being C code it keeps dispatch cheap
  __hash__ = object.__hash__


class GroupOp:
  Unary = frozenset({Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIPROCAL, Ops.TRUNC})
  Binary = frozenset({Ops.ADD, Ops.MUL, Ops.FDIV, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.AND, Ops.OR,
                      Ops.XOR, Ops.SHL, Ops.SHR, Ops.THREEFRY})
  Ternary = frozenset({Ops.WHERE, Ops.MULACC})
  ALU = Unary | Binary | Ternary
  Movement = frozenset({Ops.RESHAPE, Ops.EXPAND, Ops.PERMUTE, Ops.PAD, Ops.SHRINK, Ops.FLIP})
  Commutative = frozenset({Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR})
  Comparison = frozenset({Ops.CMPLT, Ops.CMPNE})


BOUND = "bound"  # the tag of a BIND's value node: never shared with an equal constant, and a hole in structural keys


def arg_key(arg: Any) -> Any:
  """A hashing key for an arg that tells 0.0 from -0.0 and True from 1, and keeps nan equal to itself."""
  if type(arg) is float: return ("float", arg.hex())
  if type(arg) is bool: return ("bool", arg)
  if type(arg) is tuple: return tuple(arg_key(item) for item in arg)
  return arg


_KEYED_ARGS = (float, bool, tuple)  # the arg types arg_key changes (the others are their own key)


class UOpMetaClass(type):
  """Hash-consing: constructing a node equal to a live one returns the live one. The cache holds nodes weakly,
  so a node nobody references is freed."""
  # key -> weak reference to the live node; an entry removes itself when its node dies (a plain dict of weak
  # references: every node construction looks here, and WeakValueDictionary's Python-level get is slow)
  cache: dict[tuple, _CacheReference] = {}

  def __call__(cls, op: Ops, dtype: AnyDType = dtypes.void, src: tuple[UOp, ...] = (), arg: Any = None,
               tag: Any = None) -> UOp:
    if type(src) is not tuple: src = tuple(src)
    # sources by id: a key holding them would keep them alive until their user's entry goes, so a graph with cached
    # toposorts (cycles) would be freed one layer per gc pass. The ids stay unique while the cached user lives.
    key = (op, dtype, tuple(map(id, src)), arg_key(arg) if type(arg) in _KEYED_ARGS else arg, tag)
    try:
      found = UOpMetaClass.cache.get(key)
    except TypeError as error:
      raise TypeError(f"UOp arg must be hashable, got {type(arg).__name__} {arg!r} for {op}") from error
    if found is not None and (hit := found()) is not None: return hit
    node = super().__call__(op, dtype, src, arg, tag)
    reference = UOpMetaClass.cache[key] = _CacheReference(node, _forget)
    reference.key = key
    return node


class _CacheReference(weakref.ref):
  """The cache's weak reference to a node, carrying the node's key: one callback serves every entry (no closure is
  made per node built)."""
  __slots__ = ("key",)


def _forget(reference: _CacheReference) -> None:
  if UOpMetaClass.cache.get(reference.key) is reference: del UOpMetaClass.cache[reference.key]


class MathMixin:
  """Python operators that build ALU nodes; shared by UOp (builds nodes) and UPat (builds patterns)."""

  def alu(self, op: Ops, *src: Any) -> Any:
    raise NotImplementedError

  def const_like(self, value: Any) -> Any:
    raise NotImplementedError

  def _operand(self, other: Any) -> Any:
    return other if isinstance(other, MathMixin) else self.const_like(other)

  def __add__(self, other: Any) -> Any: return self.alu(Ops.ADD, self._operand(other))
  def __radd__(self, other: Any) -> Any: return self._operand(other).alu(Ops.ADD, self)
  def __mul__(self, other: Any) -> Any: return self.alu(Ops.MUL, self._operand(other))
  def __rmul__(self, other: Any) -> Any: return self._operand(other).alu(Ops.MUL, self)
  def __neg__(self) -> Any: return self.alu(Ops.MUL, self.const_like(-1))
  def __sub__(self, other: Any) -> Any: return self + -self._operand(other)
  def __rsub__(self, other: Any) -> Any: return self._operand(other) + -self
  def __truediv__(self, other: Any) -> Any: return self.alu(Ops.FDIV, self._operand(other))
  def __rtruediv__(self, other: Any) -> Any: return self._operand(other).alu(Ops.FDIV, self)
  # `//` and `%` on nodes are C's truncating division and remainder, as in the generated code
  def __floordiv__(self, other: Any) -> Any: return self.alu(Ops.IDIV, self._operand(other))
  def __rfloordiv__(self, other: Any) -> Any: return self._operand(other).alu(Ops.IDIV, self)
  def __mod__(self, other: Any) -> Any: return self.alu(Ops.MOD, self._operand(other))
  def __rmod__(self, other: Any) -> Any: return self._operand(other).alu(Ops.MOD, self)
  def __and__(self, other: Any) -> Any: return self.alu(Ops.AND, self._operand(other))
  def __rand__(self, other: Any) -> Any: return self._operand(other).alu(Ops.AND, self)
  def __or__(self, other: Any) -> Any: return self.alu(Ops.OR, self._operand(other))
  def __ror__(self, other: Any) -> Any: return self._operand(other).alu(Ops.OR, self)
  def __xor__(self, other: Any) -> Any: return self.alu(Ops.XOR, self._operand(other))
  def __rxor__(self, other: Any) -> Any: return self._operand(other).alu(Ops.XOR, self)
  def __lshift__(self, other: Any) -> Any: return self.alu(Ops.SHL, self._operand(other))
  def __rshift__(self, other: Any) -> Any: return self.alu(Ops.SHR, self._operand(other))
  def __lt__(self, other: Any) -> Any: return self.alu(Ops.CMPLT, self._operand(other))
  def __gt__(self, other: Any) -> Any: return self._operand(other).alu(Ops.CMPLT, self)
  def __le__(self, other: Any) -> Any: return (self < other) | self.eq(other)
  def __ge__(self, other: Any) -> Any: return (self > other) | self.eq(other)
  # __eq__ stays identity (hash-consing makes it structural equality); these build comparison nodes
  def ne(self, other: Any) -> Any: return self.alu(Ops.CMPNE, self._operand(other))
  def eq(self, other: Any) -> Any: return self.ne(other).logical_not()
  def logical_not(self) -> Any: return self.alu(Ops.XOR, self.const_like(True))
  def maximum(self, other: Any) -> Any: return self.alu(Ops.MAX, self._operand(other))
  def minimum(self, other: Any) -> Any: return (self < other).where(self, other)
  def where(self, if_true: Any, if_false: Any) -> Any:
    if_true = if_true if isinstance(if_true, MathMixin) else self._operand(if_true)
    return self.alu(Ops.WHERE, if_true, if_true._operand(if_false))


class UOp(MathMixin, metaclass=UOpMetaClass):
  def __init__(self, op: Ops, dtype: AnyDType = dtypes.void, src: tuple[UOp, ...] = (), arg: Any = None,
               tag: Any = None):
    self.op, self.dtype, self.src, self.arg, self.tag = op, dtype, src, arg, tag

  def __reduce__(self) -> tuple:
    return UOp, (self.op, self.dtype, self.src, self.arg, self.tag)

  def replace(self, **changes: Any) -> UOp:
    fields = {"op": self.op, "dtype": self.dtype, "src": self.src, "arg": self.arg, "tag": self.tag}
    fields.update(changes)
    return UOp(**fields)

  # *** construction ***

  @staticmethod
  def const(dtype: DType, value: Any, src: tuple[UOp, ...] = ()) -> UOp:
    """A constant, its value held exactly as the dtype holds it (ints wrap, floats round)."""
    if isinstance(value, UOp): return value
    return UOp(Ops.CONST, dtype, src, truncate(value, dtype.scalar) if dtype.count == 1 else value)

  def const_like(self, value: Any) -> UOp:
    """A constant of this node's dtype; for a tensor-level node, a constant tensor of its shape and device."""
    if isinstance(value, UOp): return value
    dtype = self.dtype.scalar if isinstance(self.dtype, DType) else dtypes.index
    if self.shape is None: return UOp.const(dtype, value)
    const = UOp.const(dtype, value, (UOp(Ops.DEVICE, arg=self.device),))
    return const.reshape((1,) * len(self.shape)).expand(self.shape) if self.shape else const

  @staticmethod
  def variable(name: str, min_value: int, max_value: int, dtype: DType = dtypes.index) -> UOp:
    if min_value > max_value: raise ValueError(f"variable {name} has an empty range [{min_value}, {max_value}]")
    return UOp(Ops.DEFINE_VAR, dtype, arg=(name, min_value, max_value))

  @staticmethod
  def range(end: sint, axis: int, kind: str = "loop") -> UOp:
    return UOp(Ops.RANGE, dtypes.index, (as_index(end),), (axis, kind))

  @staticmethod
  def sink(*src: UOp) -> UOp:
    return UOp(Ops.SINK, dtypes.void, src)

  def alu(self, op: Ops, *src: UOp) -> UOp:
    operands = (self, *src)
    if op in GroupOp.Comparison: out_dtype = dtypes.bool.vec(self.dtype.count)
    elif op is Ops.WHERE: out_dtype = src[0].dtype
    else: out_dtype = self.dtype
    if op is not Ops.WHERE and op not in (Ops.SHL, Ops.SHR):
      mismatched = {operand.dtype.scalar for operand in operands}
      if len(mismatched) > 1:
        raise TypeError(f"{op.name} needs operands of one dtype, got {', '.join(repr(o.dtype) for o in operands)}")
    return UOp(op, out_dtype, operands)

  def cast(self, dtype: DType) -> UOp:
    return self if self.dtype == dtype else UOp(Ops.CAST, dtype, (self,))

  def bitcast(self, dtype: DType) -> UOp:
    return self if self.dtype == dtype else UOp(Ops.BITCAST, dtype, (self,))

  def bind(self, value: int, device: str | None = None) -> UOp:
    """The variable bound to a value; with a device, a 0-d tensor-level node whose value is a kernel parameter."""
    if self.op is not Ops.DEFINE_VAR: raise TypeError(f"only a variable can be bound, not {self.op}")
    name, low, high = self.arg
    if not low <= value <= high: raise ValueError(f"value {value} is outside {name}'s range [{low}, {high}]")
    on_device = (UOp(Ops.DEVICE, arg=device),) if device is not None else ()
    # the value's node is tagged: it is never shared with an equal constant used elsewhere (the schedule cache
    # treats the value as a hole, and a shared node would be one too)
    bound = UOp(Ops.CONST, self.dtype, (), value, tag=BOUND)
    return UOp(Ops.BIND, self.dtype, (self, bound, *on_device))

  # *** graph traversal ***

  @cached_property
  def local_key(self) -> tuple:
    """The node without its sources, for keys of a graph's structure: (op, dtype, arg, tag), the arg by arg_key (0.0
    is not -0.0), and left out where it names an instance rather than a structure: a UNIQUE's id, a bound value."""
    instance = self.op is Ops.UNIQUE or (self.op is Ops.CONST and self.tag == BOUND)
    return (self.op, self.dtype, None if instance else arg_key(self.arg), self.tag)

  @cached_property
  def toposort(self) -> dict[UOp, None]:
    """Every node reachable from this one, sources before their users (this node last)."""
    order: dict[UOp, None] = {}
    stack: list[tuple[UOp, bool]] = [(self, False)]
    while stack:
      node, sources_done = stack.pop()
      if node in order: continue
      if sources_done:
        order[node] = None
        continue
      if node is not self and (known := node.__dict__.get("toposort")) is not None:
        # a node's own order, less what this walk has added already, is what the walk would add below it (what the
        # walk has added is closed under sources): merged in one step, a new node on a sorted graph costs no walk
        order.update(known)
        continue
      stack.append((node, True))
      stack.extend((source, False) for source in reversed(node.src) if source not in order)
    return order

  def walked(self) -> dict[UOp, None]:
    """The toposort, cached or not, without caching it: a toposort holds its node, a cycle that keeps the graph (and
    the buffers it names) until the garbage collector runs. For walks a realize does not reuse."""
    return self.__dict__.get("toposort") or UOp.toposort.function(self)

  def walk(self) -> Iterator[UOp]:
    return iter(self.toposort)

  def reachable_without_entering(self, barrier: Callable[[UOp], bool]) -> list[UOp]:
    """The nodes reachable from this one, not looking inside the nodes `barrier` holds true for (which are included)."""
    seen: dict[UOp, None] = {}
    stack = [self]
    while stack:
      node = stack.pop()
      if node in seen: continue
      seen[node] = None
      if not barrier(node): stack.extend(node.src)
    return list(seen)

  @cached_property
  def order_key(self) -> tuple:
    """An order on nodes that is stable across runs: canonical operand order sorts by it. Op and arg first, so
    ranges sort by axis and variables by name; then a digest of the whole subgraph, so the key has a fixed size
    however deep (or however shared) the graph is."""
    return (self.op.value, repr(self.arg), self.digest)

  @cached_property
  def digest(self) -> bytes:
    """A stable fingerprint of the subgraph: op, dtype, arg, tag and the sources' digests."""
    # sources first, iteratively (deep graphs would overflow a recursive definition), not entering sources that have
    # their digest already: a new node on top of a digested graph costs one hash, not a walk of the graph
    stack: list[tuple[UOp, bool]] = [(self, False)]
    while stack:
      node, sources_done = stack.pop()
      if "digest" in node.__dict__: continue
      if not sources_done:
        stack.append((node, True))
        stack.extend((source, False) for source in node.src if "digest" not in source.__dict__)
        continue
      fingerprint = hashlib.blake2b(repr((node.op.value, node.dtype, node.arg, node.tag)).encode(), digest_size=12)
      for source in node.src: fingerprint.update(source.__dict__["digest"])
      node.__dict__["digest"] = fingerprint.digest()
    return self.__dict__["digest"]

  @cached_property
  def device(self) -> str:
    """The device a tensor-level node lives on: a COPY's target, else its first source's that has one. Taken from
    the sources' cached devices where they are known (a new node on a large graph costs nothing), else by one walk
    over the graph. Measured: always walking made building an optimizer step over a backward graph quadratic (half
    of an eager MNIST step). The walk is not cached on the node (see below); a repeated 16-element add stayed at
    32-34 us per realize without it."""
    if self.op is Ops.DEVICE: return self.arg
    if self.op is Ops.COPY: return self.src[1].arg
    for source in self.src:
      if (known := source.__dict__.get("device")) is not None: return known
      if source.op is Ops.DEVICE: return source.arg
      # a buffer names its device: a tensor made from data (a reshape of its buffer) needs no walk, and no cached
      # toposort, which holds the node itself: that cycle would keep the node, and its buffer's memory, until the
      # garbage collector runs (a jit's input from every step stayed allocated, and every new one was fresh memory)
      if source.op is Ops.BUFFER and source.src[-1].op is Ops.DEVICE: return source.src[-1].arg
      if source.src: break  # a source whose device is not known yet
    # walked, not cached on the node: a toposort holds its node, a cycle that would keep the graph's buffers until
    # the garbage collector ran (x * c with c changing each step: every step's input stayed allocated)
    order = self.walked()
    for node in order:
      if node.op is Ops.COPY: return _device_through_copies(self)
    for node in order:
      if node.op is Ops.DEVICE: return node.arg
    raise ValueError(f"{self.op} has no device")

  # *** shapes of tensor-level nodes ***

  @cached_property
  def shape(self) -> tuple | None:
    """The shape of a tensor-level node (sizes are ints or symbolic UOps), None for kernel-level nodes."""
    return _shape(self)

  @property
  def ndim(self) -> int:
    if self.shape is None: raise ValueError(f"{self.op} has no shape")
    return len(self.shape)

  def size_args(self) -> tuple:
    """The symbolic size arguments of a movement op (its sources after the first), ints where constant."""
    return tuple(to_sint(source) for source in self.src[1:])

  # *** movement ops (sizes become sources so variables inside them are ordinary nodes) ***

  def reshape(self, shape: tuple) -> UOp:
    shape = tuple(shape)
    if any(isinstance(s, int) and s < 0 for s in shape): raise ShapeError(f"reshape to negative size {shape}")
    old = _require_shape(self, "reshape")
    if all_int(old) and all_int(shape) and _product(old) != _product(shape):
      raise ShapeError(f"cannot reshape {old} ({_product(old)} elements) to {shape} ({_product(shape)} elements)")
    if shape == old: return self
    return UOp(Ops.RESHAPE, self.dtype, (self, *map(as_index, shape)))

  def expand(self, shape: tuple) -> UOp:
    shape, old = tuple(shape), _require_shape(self, "expand")
    if len(shape) != len(old) or any(o != s and not _equal_size(o, 1) for o, s in zip(old, shape)):
      raise ShapeError(f"cannot expand {old} to {shape}: only axes of size 1 can grow")
    if shape == old: return self
    return UOp(Ops.EXPAND, self.dtype, (self, *map(as_index, shape)))

  def permute(self, order: tuple[int, ...]) -> UOp:
    order, old = tuple(order), _require_shape(self, "permute")
    if sorted(order) != list(range(len(old))):
      raise ShapeError(f"permute order {order} is not a permutation of the {len(old)} axes of {old}")
    if order == tuple(range(len(old))): return self
    return UOp(Ops.PERMUTE, self.dtype, (self,), order)

  def pad(self, padding: tuple[tuple, ...]) -> UOp:
    padding, old = tuple(tuple(p) for p in padding), _require_shape(self, "pad")
    if len(padding) != len(old) or any(len(p) != 2 for p in padding):
      raise ShapeError(f"pad needs one (before, after) pair per axis of {old}, got {padding}")
    if any(isinstance(v, int) and v < 0 for p in padding for v in p):
      raise ShapeError(f"pad amounts must be non-negative, got {padding} (use shrink to cut)")
    if all(_equal_size(v, 0) for p in padding for v in p): return self
    return UOp(Ops.PAD, self.dtype, (self, *(as_index(p[0]) for p in padding), *(as_index(p[1]) for p in padding)))

  def shrink(self, bounds: tuple[tuple, ...]) -> UOp:
    bounds, old = tuple(tuple(b) for b in bounds), _require_shape(self, "shrink")
    if len(bounds) != len(old) or any(len(b) != 2 for b in bounds):
      raise ShapeError(f"shrink needs one (begin, end) pair per axis of {old}, got {bounds}")
    for (begin, end), size in zip(bounds, old):
      if all_int((begin, end, size)) and not 0 <= begin <= end <= size:
        raise ShapeError(f"shrink bounds {bounds} do not fit in shape {old}")
    if all(_equal_size(b[0], 0) and _equal_size(b[1], s) for b, s in zip(bounds, old)): return self
    return UOp(Ops.SHRINK, self.dtype, (self, *(as_index(b[0]) for b in bounds), *(as_index(b[1]) for b in bounds)))

  def flip(self, axes: tuple[int, ...]) -> UOp:
    old = _require_shape(self, "flip")
    axes = tuple(sorted(set(axes)))
    if any(not 0 <= axis < len(old) for axis in axes): raise ShapeError(f"flip axes {axes} out of range for {old}")
    if not axes: return self
    return UOp(Ops.FLIP, self.dtype, (self,), axes)

  # *** value bounds ***

  @cached_property
  def _min_max(self) -> tuple[Any, Any]:
    _bounds_of_sources_first(self)
    low, high = _bounds(self)
    if isinstance(self.dtype, DType) and self.dtype.scalar not in (dtypes.index,) and dtypes.is_int(self.dtype.scalar):
      # a result that may leave the dtype's range wraps around: then nothing is known
      if low < dtypes.min(self.dtype.scalar) or high > dtypes.max(self.dtype.scalar):
        return dtypes.min(self.dtype.scalar), dtypes.max(self.dtype.scalar)
    return low, high

  @property
  def vmin(self) -> Any:
    return self._min_max[0]

  @property
  def vmax(self) -> Any:
    return self._min_max[1]

  # *** printing ***

  def render(self) -> str:
    """A one-line expression, e.g. `((r0*2)+r1)`, for index arithmetic and debugging."""
    return _render(self)

  def __repr__(self) -> str:
    return _pretty(self)


def _device_through_copies(root: UOp) -> str:
  """Each node's device from its sources, bottom up: a COPY's is its target DEVICE, any other node's its first
  source's that has one."""
  devices: dict[UOp, str] = {}
  for node in root.toposort:
    if node.op is Ops.DEVICE: devices[node] = node.arg
    elif node.op is Ops.COPY: devices[node] = node.src[1].arg
    elif (found := next((devices[s] for s in node.src if s in devices), None)) is not None: devices[node] = found
  if root not in devices: raise ValueError(f"{root.op} has no device")
  return devices[root]


# tensor-level node -> "operation at file:line" of the user code that made it (recorded by the profiler)
origins: weakref.WeakKeyDictionary[UOp, str] = weakref.WeakKeyDictionary()

# *** sizes ***

sint = int | UOp  # a size: a Python int, or a symbolic index expression


def as_index(value: Any) -> UOp:
  """A size or index as an index-typed node."""
  if isinstance(value, UOp):
    if value.dtype != dtypes.index and value.op is not Ops.BIND:
      raise TypeError(f"a size must have dtype index, got {value.dtype}")
    return value
  if not isinstance(value, int) or isinstance(value, bool):
    raise TypeError(f"a size must be an int or an index UOp, got {type(value).__name__} {value!r}")
  return UOp.const(dtypes.index, value)


def to_sint(node: UOp) -> Any:
  return node.arg if node.op is Ops.CONST else node


def all_int(values: tuple) -> bool:
  return all(isinstance(v, int) for v in values)


def _product(values: tuple) -> int:
  return math.prod(values)


def _equal_size(a: Any, b: Any) -> bool:
  return a is b or (isinstance(a, int) and isinstance(b, int) and a == b)


def _require_shape(node: UOp, what: str) -> tuple:
  if node.shape is None: raise ValueError(f"cannot {what} {node.op}: it is not a tensor-level node")
  return node.shape


def _shape(node: UOp) -> tuple | None:
  op = node.op
  if op in (Ops.RESHAPE, Ops.EXPAND): return node.size_args()
  if op is Ops.BUFFER: return (node.arg,)
  if op is Ops.CONST: return () if node.src else None
  if op is Ops.BIND: return () if len(node.src) == 3 else None
  if op is Ops.IOTA: return (to_sint(node.src[1]),)
  if not node.src or node.src[0].shape is None: return None
  inner = node.src[0].shape
  if op is Ops.PERMUTE: return tuple(inner[i] for i in node.arg)
  if op is Ops.FLIP: return inner
  if op is Ops.PAD:
    sizes, ndim = node.size_args(), len(inner)
    return tuple(_size_add(_size_add(s, sizes[i]), sizes[ndim + i]) for i, s in enumerate(inner))
  if op is Ops.SHRINK:
    sizes, ndim = node.size_args(), len(inner)
    return tuple(_size_add(sizes[ndim + i], _size_neg(sizes[i])) for i in range(ndim))
  if op is Ops.REDUCE_AXIS: return tuple(1 if i in node.arg[1] else s for i, s in enumerate(inner))
  if op in GroupOp.ALU and any(source.shape is None for source in node.src): return None
  if op in GroupOp.ALU or op in (Ops.CAST, Ops.BITCAST, Ops.CONTIGUOUS, Ops.REALIZE, Ops.DETACH, Ops.COPY,
                                 Ops.ASSIGN, Ops.CONTIGUOUS_BACKWARD, Ops.AFTER):
    # a WHERE's condition may be a scalar-shaped node in rewrites; its value sources carry the shape
    return node.src[-1].shape if op is Ops.WHERE else inner
  return None


def _size_add(a: Any, b: Any) -> Any:
  """a + b for sizes, without building nodes for adding zero."""
  if isinstance(b, int) and b == 0: return a
  if isinstance(a, int) and a == 0: return b
  return a + b


def _size_neg(a: Any) -> Any:
  return -a


# *** value bounds (vmin / vmax) ***

def _trunc_div(a: int, b: int) -> int:
  quotient = abs(a) // abs(b)
  return quotient if (a >= 0) == (b > 0) else -quotient


def _bounds_of_sources_first(root: UOp) -> None:
  """Compute the sources' bounds bottom-up without recursion: the recursive cached properties would exhaust Python's
  stack on a deep expression (a sum of a few hundred terms)."""
  stack: list[tuple[UOp, bool]] = [(source, False) for source in root.src if "_min_max" not in source.__dict__]
  while stack:
    node, sources_done = stack.pop()
    if "_min_max" in node.__dict__: continue
    if sources_done:
      _ = node._min_max  # fills the cache, with every source's bounds already cached
      continue
    stack.append((node, True))
    # only ops with a bound rule look at their sources' bounds
    if node.op in _BOUND_RULES: stack.extend((s, False) for s in node.src if "_min_max" not in s.__dict__)


def _bounds(node: UOp) -> tuple[Any, Any]:
  dtype = node.dtype
  if isinstance(dtype, PtrDType) or dtype == dtypes.void: return (None, None)
  if node.op is Ops.CONST and dtype.count == 1: return (node.arg, node.arg)
  full = (dtypes.min(dtype.scalar), dtypes.max(dtype.scalar)) if dtype.scalar != dtypes.index else (-math.inf, math.inf)
  if dtypes.is_float(dtype) or dtype.count != 1: return full
  rule = _BOUND_RULES.get(node.op)
  result = rule(node, *[(s.vmin, s.vmax) for s in node.src]) if rule else None
  if result is None: return full
  low, high = result
  if dtypes.is_bool(dtype): return (bool(low), bool(high))
  return result


def _bounds_mul(_: UOp, a: tuple, b: tuple) -> tuple:
  products = [x * y for x in a for y in b if not (math.isinf(x) or math.isinf(y))]
  if len(products) < 4: return None
  return (min(products), max(products))


def _bounds_idiv(_: UOp, a: tuple, b: tuple) -> tuple | None:
  if b[0] > 0 or b[1] < 0:
    if any(math.isinf(v) for v in a + b): return None
    quotients = [_trunc_div(x, y) for x in a for y in b]
    return (min(quotients), max(quotients))
  return None


def _bounds_mod(_: UOp, a: tuple, b: tuple) -> tuple | None:
  if b[0] <= 0 or math.isinf(b[1]): return None
  largest = b[1] - 1
  if a[0] >= 0: return (0, min(a[1], largest))
  if a[1] <= 0: return (max(a[0], -largest), 0)
  return (-largest, largest)


def _bounds_cmplt(_: UOp, a: tuple, b: tuple) -> tuple:
  if a[1] < b[0]: return (True, True)
  if a[0] >= b[1]: return (False, False)
  return (False, True)


def _bounds_cmpne(_: UOp, a: tuple, b: tuple) -> tuple:
  if a[1] < b[0] or a[0] > b[1]: return (True, True)
  if a[0] == a[1] == b[0] == b[1]: return (False, False)
  return (False, True)


def _bounds_and(node: UOp, a: tuple, b: tuple) -> tuple | None:
  if dtypes.is_bool(node.dtype): return (a[0] and b[0], a[1] and b[1])
  if a[0] >= 0 and b[0] >= 0: return (0, min(a[1], b[1]))
  return None


def _bounds_or(node: UOp, a: tuple, b: tuple) -> tuple | None:
  if dtypes.is_bool(node.dtype): return (a[0] or b[0], a[1] or b[1])
  return None


def _bounds_xor(node: UOp, a: tuple, b: tuple) -> tuple | None:
  if dtypes.is_bool(node.dtype) and a[0] == a[1] and b[0] == b[1]: return (a[0] != b[0], a[0] != b[0])
  return None


def _bounds_shift(node: UOp, a: tuple, b: tuple) -> tuple | None:
  if b[0] != b[1] or not 0 <= b[0] < 64 or math.isinf(a[0]) or math.isinf(a[1]): return None
  if node.op is Ops.SHL: return (a[0] << b[0], a[1] << b[0])
  return (a[0] >> b[0], a[1] >> b[0])


def _bounds_where(_: UOp, cond: tuple, a: tuple, b: tuple) -> tuple:
  if cond[0] == cond[1]: return a if cond[0] else b
  return (min(a[0], b[0]), max(a[1], b[1]))


def _bounds_cast(node: UOp, a: tuple) -> tuple | None:
  source = node.src[0].dtype
  if any(isinstance(v, float) and math.isinf(v) for v in a): return None
  exact_source = isinstance(source, DType) and (dtypes.is_int(source) or dtypes.is_bool(source))
  if exact_source and dtypes.is_bool(node.dtype):
    # only 0 is False, so the ends of the source's range say nothing: what matters is whether 0 lies inside it
    return (not a[0] <= 0 <= a[1], not a[0] == a[1] == 0)
  if exact_source and not dtypes.is_float(node.dtype): return (int(a[0]), int(a[1]))
  return None


_BOUND_RULES: dict[Ops, Callable[..., tuple | None]] = {
  Ops.DEFINE_VAR: lambda node: (node.arg[1], node.arg[2]),
  Ops.BIND: lambda node, var, *_: var,
  Ops.RANGE: lambda node, end: (0, max(0, end[1] - 1)),
  Ops.SPECIAL: lambda node, end: (0, max(0, end[1] - 1)),
  Ops.ADD: lambda node, a, b: (a[0] + b[0], a[1] + b[1]),
  Ops.MUL: _bounds_mul,
  Ops.IDIV: _bounds_idiv,
  Ops.MOD: _bounds_mod,
  Ops.MAX: lambda node, a, b: (max(a[0], b[0]), max(a[1], b[1])),
  Ops.CMPLT: _bounds_cmplt,
  Ops.CMPNE: _bounds_cmpne,
  Ops.AND: _bounds_and,
  Ops.OR: _bounds_or,
  Ops.XOR: _bounds_xor,
  Ops.SHL: _bounds_shift,
  Ops.SHR: _bounds_shift,
  Ops.WHERE: _bounds_where,
  Ops.CAST: _bounds_cast,
}


# *** evaluating ALU ops on Python values, with the dtype's exact semantics ***

def _fdiv(a: float, b: float) -> float:
  if b != 0: return a / b
  if a == 0 or math.isnan(a): return math.nan
  return math.copysign(math.inf, a) * math.copysign(1.0, b)


def _shift_amount(b: int, dtype: DType) -> int:
  if not 0 <= b < 8 * dtype.itemsize: raise ValueError(f"shift by {b} is undefined for {dtype}")
  return b


def _exp2(a: float) -> float:
  try:
    return 2.0 ** a
  except OverflowError:
    return math.inf


def _log2(a: float) -> float:
  if math.isnan(a) or a < 0: return math.nan
  return -math.inf if a == 0 else math.log2(a)


def _maximum(a: Any, b: Any) -> Any:
  """LLVM's maximum: nan wins, and -0.0 is below +0.0."""
  if isinstance(a, float) and math.isnan(a): return a
  if isinstance(b, float) and math.isnan(b): return b
  if a == 0 and b == 0 and isinstance(a, float): return a if math.copysign(1, a) > 0 else b
  return max(a, b)


def _sqrt(a: float) -> float:
  return math.nan if math.isnan(a) or a < 0 else math.sqrt(a)


def _sin(a: float) -> float:
  return math.nan if math.isinf(a) or math.isnan(a) else math.sin(a)


def _trunc(a: Any) -> Any:
  if not isinstance(a, float): return type(a)(math.trunc(a))
  # C's trunc keeps the sign of zero: trunc(-0.5) is -0.0
  return a if math.isinf(a) or math.isnan(a) else math.copysign(float(math.trunc(a)), a)


def _idiv(a: int, b: int) -> int:
  if b == 0: raise ZeroDivisionError("integer division by zero")
  return _trunc_div(a, b)


def _mod(a: int, b: int) -> int:
  return a - b * _idiv(a, b)


def _logic(int_op: Callable, bool_op: Callable) -> Callable:
  return lambda a, b: bool_op(a, b) if isinstance(a, bool) else int_op(a, b)


_PYTHON_ALU: dict[Ops, Callable[..., Any]] = {
  Ops.EXP2: _exp2, Ops.LOG2: _log2, Ops.SIN: _sin, Ops.SQRT: _sqrt, Ops.TRUNC: _trunc,
  Ops.RECIPROCAL: lambda a: _fdiv(1.0, a),
  Ops.ADD: lambda a, b: a + b, Ops.MUL: lambda a, b: a * b, Ops.FDIV: _fdiv, Ops.IDIV: _idiv, Ops.MOD: _mod,
  Ops.MAX: _maximum, Ops.CMPLT: lambda a, b: a < b, Ops.CMPNE: lambda a, b: a != b,
  Ops.AND: _logic(lambda a, b: a & b, lambda a, b: a and b), Ops.OR: _logic(lambda a, b: a | b, lambda a, b: a or b),
  Ops.XOR: _logic(lambda a, b: a ^ b, lambda a, b: a != b),
  Ops.WHERE: lambda c, a, b: a if c else b, Ops.MULACC: lambda a, b, c: a * b + c,
  Ops.THREEFRY: lambda x, key: threefry_packed(x, key, lambda word: word & 0xFFFFFFFF),
}


# *** Threefry-2x32 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", 2011), 20 rounds ***

_THREEFRY_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_THREEFRY_PARITY = 0x1BD11BDA


def threefry2x32(x0: Any, x1: Any, key0: Any, key1: Any, wrap: Callable[[Any], Any]) -> tuple[Any, Any]:
  """The block function on two counter words and two key words: Python ints (`wrap` masks to 32 bits) or uint32
  UOps (`wrap` is the identity: the generated code wraps)."""
  keys = (key0, key1, key0 ^ key1 ^ _THREEFRY_PARITY)
  x0, x1 = wrap(x0 + keys[0]), wrap(x1 + keys[1])
  for group in range(5):
    for rotation in _THREEFRY_ROTATIONS[group % 2]:
      x0 = wrap(x0 + x1)
      x1 = (wrap(x1 << rotation) | (x1 >> (32 - rotation))) ^ x0
    x0 = wrap(x0 + keys[(group + 1) % 3])
    x1 = wrap(x1 + keys[(group + 2) % 3] + (group + 1))
  return x0, x1


def threefry_packed(x: Any, key: Any, wrap: Callable[[Any], Any]) -> Any:
  """THREEFRY's value on uint64 words (ints, or UOps): each holds its two 32-bit words, the first in the low half."""
  if isinstance(x, int):
    y0, y1 = threefry2x32(x & 0xFFFFFFFF, x >> 32, key & 0xFFFFFFFF, key >> 32, wrap)
    return y0 | y1 << 32
  u32, u64 = dtypes.uint32, dtypes.uint64
  y0, y1 = threefry2x32(x.cast(u32), (x >> 32).cast(u32), key.cast(u32), (key >> 32).cast(u32), wrap)
  return y0.cast(u64) | (y1.cast(u64) << 32)


def exec_alu(op: Ops, dtype: DType, operands: tuple) -> Any:
  """What the generated code computes for `op` on these values: ints wrap, division truncates, floats round to
  the dtype. Raises for undefined behaviour (integer division by zero, out-of-range shifts)."""
  if op is Ops.SHL: return truncate(operands[0] << _shift_amount(operands[1], dtype), dtype)
  if op is Ops.SHR: return truncate(operands[0] >> _shift_amount(operands[1], dtype), dtype)
  if op is Ops.CAST: return cast_value(operands[0], dtype)
  if dtypes.is_float(dtype): operands = tuple(float(v) if not isinstance(v, bool) else v for v in operands)
  return truncate(_PYTHON_ALU[op](*operands), dtype)


def cast_value(value: Any, dtype: DType) -> Any:
  """C-style conversion: float to int truncates toward zero (nan and inf have no int value and raise)."""
  if dtypes.is_bool(dtype): return bool(value)
  if dtypes.is_int(dtype):
    if isinstance(value, float) and not math.isfinite(value): raise ValueError(f"cannot convert {value} to {dtype}")
    return truncate(math.trunc(value), dtype)
  return truncate(float(value), dtype)


# *** printing ***

_INFIX = {Ops.ADD: "+", Ops.MUL: "*", Ops.FDIV: "/", Ops.IDIV: "//", Ops.MOD: "%", Ops.CMPLT: "<", Ops.CMPNE: "!=",
          Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^", Ops.SHL: "<<", Ops.SHR: ">>"}


def _render(node: UOp) -> str:
  op = node.op
  if op is Ops.CONST: return str(node.arg)
  if op is Ops.RANGE: return f"r{node.arg[0]}"
  if op is Ops.DEFINE_VAR: return node.arg[0]
  if op is Ops.BIND: return _render(node.src[0])
  if op in _INFIX: return f"({_render(node.src[0])}{_INFIX[op]}{_render(node.src[1])})"
  if op is Ops.WHERE: return f"({_render(node.src[0])}?{_render(node.src[1])}:{_render(node.src[2])})"
  if op is Ops.CAST: return f"({node.dtype.name}){_render(node.src[0])}"
  if op is Ops.INVALID: return "INVALID"
  arguments = [_render(source) for source in node.src]
  return f"{op.name.lower()}({', '.join(arguments)})"


def _pretty(root: UOp) -> str:
  """Nested repr; a node used more than once is written in full once as `xN:=` and referred to as `xN` after."""
  users: dict[UOp, int] = {}
  for node in root.toposort:
    for source in node.src: users[source] = users.get(source, 0) + 1
  names: dict[UOp, str] = {}

  def show(node: UOp, depth: int) -> str:
    if node in names: return names[node]
    prefix = ""
    if users.get(node, 0) > 1:
      names[node] = f"x{len(names)}"
      prefix = f"{names[node]}:="
    fields = [repr(node.op), repr(node.dtype)]
    if node.arg is not None: fields.append(f"arg={node.arg!r}")
    if node.tag is not None: fields.append(f"tag={node.tag!r}")
    if node.src:
      inner = ",\n".join("  " * (depth + 1) + show(source, depth + 1) for source in node.src)
      fields.append(f"src=(\n{inner})")
    return f"{prefix}UOp({', '.join(fields)})"

  return show(root, 0)
