"""dtypes, their promotion rules, and the pointer and vector types codegen uses."""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from rawgrad.errors import DTypeError


_dtypes: dict[tuple, DType] = {}


@dataclass(frozen=True, eq=False)
class DType:
  """A scalar type, or a vector of `count` scalars when count > 1."""
  name: str
  itemsize: int      # bytes of one scalar
  kind: str          # "bool", "int", "uint", "float", or "void"
  fmt: str | None    # struct format character of one scalar, None where struct has none (bfloat16)
  count: int = 1

  # dtypes are compared and hashed on every node built: there is one object per distinct dtype, so equality is
  # identity and hashing is object's, both without a Python call
  def __new__(cls, name: str, itemsize: int, kind: str, fmt: str | None, count: int = 1) -> DType:
    key = (name, itemsize, kind, fmt, count)
    if (known := _dtypes.get(key)) is None: known = _dtypes[key] = super().__new__(cls)
    return known

  def __reduce__(self) -> tuple:
    return DType, (self.name, self.itemsize, self.kind, self.fmt, self.count)  # the one object of that dtype

  @property
  def scalar(self) -> DType:
    return self if self.count == 1 else DType(self.name, self.itemsize, self.kind, self.fmt)

  @property
  def nbytes(self) -> int:
    return self.itemsize * self.count

  def vec(self, count: int) -> DType:
    if self.count != 1:
      raise ValueError(f"cannot make a vector of the vector type {self}")
    if count < 1:
      raise ValueError(f"vector length must be positive, got {count}")
    return self if count == 1 else DType(self.name, self.itemsize, self.kind, self.fmt, count)

  def ptr(self, size: int = -1, local: bool = False) -> PtrDType:
    return PtrDType(self, size, local)

  def __repr__(self) -> str:
    return f"dtypes.{self.name}" if self.count == 1 else f"dtypes.{self.name}.vec({self.count})"


@dataclass(frozen=True, eq=True)
class PtrDType:
  """A pointer to `base` elements; `size` is the element count it addresses (-1 when unknown)."""
  base: DType
  size: int = -1
  local: bool = False

  @property
  def itemsize(self) -> int:
    return 8

  @property
  def count(self) -> int:
    return 1

  @property
  def scalar(self) -> PtrDType:
    return self

  @property
  def kind(self) -> str:
    return "ptr"

  def __repr__(self) -> str:
    where = ", local=True" if self.local else ""
    return f"{self.base!r}.ptr({self.size}{where})"


AnyDType = DType | PtrDType


class dtypes:
  """The dtype namespace: `dtypes.float32`, `dtypes.is_float(dt)`, ..."""
  void = DType("void", 0, "void", None)
  bool = DType("bool", 1, "bool", "?")
  int8 = DType("int8", 1, "int", "b")
  uint8 = DType("uint8", 1, "uint", "B")
  int16 = DType("int16", 2, "int", "h")
  uint16 = DType("uint16", 2, "uint", "H")
  int32 = DType("int32", 4, "int", "i")
  uint32 = DType("uint32", 4, "uint", "I")
  int64 = DType("int64", 8, "int", "q")
  uint64 = DType("uint64", 8, "uint", "Q")
  float16 = DType("float16", 2, "float", "e")
  bfloat16 = DType("bfloat16", 2, "float", None)
  float32 = DType("float32", 4, "float", "f")
  float64 = DType("float64", 8, "float", "d")
  # index arithmetic: an unbounded integer in the algebra, 64-bit in generated code
  index = DType("index", 8, "int", "q")

  half, float, double = float16, float32, float64
  char, short, int, long = int8, int16, int32, int64
  uchar, ushort, uint, ulong = uint8, uint16, uint32, uint64

  default_float = float32
  default_int = int32

  @staticmethod
  def is_float(dtype: AnyDType) -> bool:
    return dtype.kind == "float"

  @staticmethod
  def is_int(dtype: AnyDType) -> bool:
    """True for signed and unsigned integers (not bool)."""
    return dtype.kind in ("int", "uint")

  @staticmethod
  def is_unsigned(dtype: AnyDType) -> bool:
    return dtype.kind == "uint"

  @staticmethod
  def is_bool(dtype: AnyDType) -> bool:
    return dtype.kind == "bool"

  @staticmethod
  def min(dtype: DType) -> int | float:
    if dtype.kind == "bool":
      return False
    if dtype.kind == "uint":
      return 0
    if dtype.kind == "int":
      return -(1 << (8 * dtype.itemsize - 1))
    return -math.inf

  @staticmethod
  def max(dtype: DType) -> int | float:
    if dtype.kind == "bool":
      return True
    if dtype.kind == "uint":
      return (1 << (8 * dtype.itemsize)) - 1
    if dtype.kind == "int":
      return (1 << (8 * dtype.itemsize - 1)) - 1
    return math.inf

  @staticmethod
  def finfo(dtype: DType) -> tuple[int, int]:
    """(exponent bits, mantissa bits) of a float dtype."""
    table = {"float16": (5, 10), "bfloat16": (8, 7), "float32": (8, 23), "float64": (11, 52)}
    if dtype.name not in table:
      raise ValueError(f"finfo needs a float dtype, got {dtype}")
    return table[dtype.name]

  @staticmethod
  def from_py(value: Any) -> DType:
    """The dtype a Python scalar (or nested list of them) gets: PyTorch's defaults."""
    if isinstance(value, (list, tuple)):
      if not value:
        return dtypes.default_float
      return least_upper_dtype(*(dtypes.from_py(v) for v in value))
    if isinstance(value, bool):
      return dtypes.bool
    if isinstance(value, int):
      return dtypes.int64 if not -2**31 <= value < 2**31 else dtypes.default_int
    if isinstance(value, float):
      return dtypes.default_float
    raise TypeError(f"cannot infer a dtype from {type(value).__name__} value {value!r}")

  @staticmethod
  def from_numpy(np_dtype: Any) -> DType:
    np_dtype = np.dtype(np_dtype)
    if np_dtype.name not in _BY_NUMPY_NAME:
      raise TypeError(f"numpy dtype {np_dtype} has no rawgrad dtype")
    return _BY_NUMPY_NAME[np_dtype.name]

  @staticmethod
  def to_numpy(dtype: DType) -> np.dtype:
    """The numpy dtype that holds this dtype's values; bfloat16 is stored as its raw uint16 bits."""
    if dtype.count != 1 or dtype.kind == "void":
      raise TypeError(f"{dtype} has no numpy equivalent")
    if dtype == dtypes.bfloat16:
      return np.dtype(np.uint16)
    if dtype == dtypes.index:
      return np.dtype(np.int64)
    return np.dtype(dtype.name)

  @staticmethod
  def from_name(name: str) -> DType:
    if name not in _BY_NAME:
      raise ValueError(f"unknown dtype name {name!r}; known: {sorted(_BY_NAME)}")
    return _BY_NAME[name]


def to_dtype(value: Any) -> DType:
  """A dtype argument as a DType: a rawgrad dtype, a name (rawgrad's first, so 'float' is float32 as torch.float is,
  then numpy's), or anything numpy takes as a dtype (np.float32, np.dtype('int64'), Python's float and int). Anything
  else raises here, where it was given, rather than deep inside the scheduler."""
  if isinstance(value, str) and isinstance(getattr(dtypes, value, None), DType): value = getattr(dtypes, value)
  if isinstance(value, DType):
    if value.count != 1 or value.kind == "void": raise DTypeError(f"{value!r} is not a dtype a tensor can hold")
    return value
  if value is not None:  # numpy reads None as float64
    try:
      return dtypes.from_numpy(np.dtype(value))
    except TypeError:
      pass
  raise DTypeError(f"dtype {value!r} is not a dtype: give a rawgrad dtype (dtypes.float32), a numpy dtype or a name "
                   f"such as 'float32'")


SCALAR_DTYPES: tuple[DType, ...] = (dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32,
                                    dtypes.uint32, dtypes.int64, dtypes.uint64, dtypes.float16, dtypes.bfloat16,
                                    dtypes.float32, dtypes.float64)
_BY_NAME = {dt.name: dt for dt in SCALAR_DTYPES} | {"index": dtypes.index}
_BY_NUMPY_NAME = {dt.name: dt for dt in SCALAR_DTYPES if dt != dtypes.bfloat16}

_INT_BY_SIZE = {1: dtypes.int8, 2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}


def _promote_pair(a: DType, b: DType) -> DType:
  if a == b:
    return a
  if dtypes.index in (a, b):
    raise TypeError(f"index arithmetic does not mix with other dtypes: {a} and {b}")
  # floats: an integer meets a float of any width and takes it (PyTorch); two floats widen
  if dtypes.is_float(a) and dtypes.is_float(b):
    if {a, b} == {dtypes.float16, dtypes.bfloat16}:
      return dtypes.float32
    return a if a.itemsize > b.itemsize else b
  if dtypes.is_float(a):
    return a
  if dtypes.is_float(b):
    return b
  # bool is below every number
  if dtypes.is_bool(a):
    return b
  if dtypes.is_bool(b):
    return a
  if a.kind == b.kind:
    return a if a.itemsize > b.itemsize else b
  unsigned, signed = (a, b) if dtypes.is_unsigned(a) else (b, a)
  if signed.itemsize > unsigned.itemsize:
    return signed
  # a signed type wide enough for both, or float64 when none is (numpy's answer for uint64 with a signed int)
  return _INT_BY_SIZE.get(unsigned.itemsize * 2, dtypes.float64)


def least_upper_dtype(*dts: DType) -> DType:
  """The dtype two tensors of these dtypes promote to (PyTorch's `promote_types`, numpy's for the wide unsigned
  pairs PyTorch refuses). Applied left to right for more than two."""
  if not dts:
    raise ValueError("least_upper_dtype needs at least one dtype")
  result = dts[0]
  for dt in dts[1:]:
    result = _promote_pair(result, dt)
  return result


def sum_acc_dtype(dtype: DType) -> DType:
  """The dtype `sum` returns for an input dtype: PyTorch sums bool and every integer into int64 (uint64 too, so
  uint64 sums past 2**63 - 1 wrap negative), and floats into themselves."""
  if dtypes.is_bool(dtype) or dtypes.is_int(dtype):
    return dtypes.int64
  return dtype


def truncate(value: Any, dtype: DType) -> Any:
  """The value `dtype` holds for `value`: ints wrap around, floats round to the dtype's precision."""
  if dtype.kind == "bool":
    return bool(value)
  if dtype.kind in ("int", "uint"):
    if dtype == dtypes.index:
      return int(value)
    bits = 8 * dtype.itemsize
    wrapped = int(value) & ((1 << bits) - 1)
    if dtype.kind == "int" and wrapped >= 1 << (bits - 1):
      wrapped -= 1 << bits
    return wrapped
  if dtype.kind == "float":
    value = float(value)
    if dtype == dtypes.float64 or math.isnan(value) or math.isinf(value):
      return value
    if dtype == dtypes.bfloat16:
      return _round_bfloat16(value)
    try:
      return struct.unpack(dtype.fmt, struct.pack(dtype.fmt, value))[0]
    except OverflowError:
      return math.copysign(math.inf, value)
  raise TypeError(f"cannot hold a value in {dtype}")


def bfloat16_bits(values: np.ndarray) -> np.ndarray:
  """Numbers as bfloat16's bits (uint16): through float32 (as PyTorch converts), then rounded to nearest, ties to
  even; nan stays nan."""
  with np.errstate(over="ignore"):
    single = np.ascontiguousarray(values, dtype=np.float32)
  bits = single.view(np.uint32).astype(np.uint64)
  rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
  return np.where(np.isnan(single), ((bits >> 16) | 0x40).astype(np.uint16), rounded)


def _round_bfloat16(value: float) -> float:
  return float((bfloat16_bits(np.array([value])).astype(np.uint32) << 16).view(np.float32)[0])
