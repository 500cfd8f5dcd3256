"""Tensor operations: random numbers from a counter-based generator (Threefry-2x32, 20 rounds: Ops.THREEFRY).

Element i of the k-th random tensor drawn after `manual_seed(s)` is a pure function of (s, k, i), computed on the
device with 32-bit integer arithmetic: the same seed gives the same numbers on every device and in every order of
realization.
"""
from __future__ import annotations

import math
from typing import Any

from rawgrad.compiler.ir import Ops, UOp
from rawgrad.compiler.rangeify import RANDOM_DRAW
from rawgrad.dtype import DType, dtypes, to_dtype
from rawgrad.errors import ArgumentError, DTypeError
from rawgrad.runtime.device import Device
from rawgrad.tensor_ops.helpers import TensorBase, creation_shape, scalar_uop, shape_arg

DRAW_MASK = 0xFFFFFFFF


class _Generator:
  seed = 0
  draws = 0


def random_draws() -> int:
  """How many random tensors were drawn since the last manual_seed (modulo 2**32)."""
  return _Generator.draws


def random_seed() -> int:
  """The seed of the last manual_seed (0 before any)."""
  return _Generator.seed


def advance_draws(count: int) -> None:
  """Skip `count` draws, as a jit replay does for the random tensors its kernels draw."""
  _Generator.draws = (_Generator.draws + count) & DRAW_MASK


class RandomOps(TensorBase):
  """Mixin of rawgrad.tensor.Tensor."""
  __slots__ = ()

  @staticmethod
  def manual_seed(seed: int = 0) -> None:
    """Restart the random stream: the tensors drawn next are a function of the seed alone."""
    _Generator.seed, _Generator.draws = seed & 0xFFFFFFFF, 0

  @classmethod
  def _random_units(cls, shape: tuple, device: str | None, words: int = 2) -> tuple[Any, ...]:
    """`words` (1 or 2) float32 tensors in [0, 1), from the words of the Threefry block of each element's counter
    (its flat index) under the key (seed, draw number)."""
    count, device = math.prod(shape), Device.canonicalize(device)
    filled = lambda value, dtype: scalar_uop(value, dtype, device, (count,))  # noqa: E731
    counter = UOp(Ops.IOTA, dtypes.int32, (UOp(Ops.DEVICE, arg=device), UOp.const(dtypes.index, count)))
    # the draw number is a kernel parameter, so every draw of a shape runs one compiled kernel (and a jit replay
    # draws new numbers by rebinding it)
    draw = UOp.variable(RANDOM_DRAW, 0, DRAW_MASK).bind(_Generator.draws, device).cast(dtypes.uint64)
    advance_draws(1)
    key = (draw << scalar_uop(32, dtypes.uint64, device, ())) | scalar_uop(_Generator.seed, dtypes.uint64, device, ())
    # one THREEFRY node: codegen writes out its 20 rounds
    bits = UOp(Ops.THREEFRY, dtypes.uint64, (counter.cast(dtypes.uint64), key.reshape((1,)).expand((count,))))
    halves = (bits.cast(dtypes.uint32), (bits >> filled(32, dtypes.uint64)).cast(dtypes.uint32))[:words]
    # [0, 1) from the top 24 bits of a word: every value is exact in float32, and 1.0 is never produced
    return tuple(cls(((half >> filled(8, dtypes.uint32)).cast(dtypes.float32) * filled(2.0 ** -24, dtypes.float32))
                     .reshape(shape)) for half in halves)

  @classmethod
  def rand(cls, *shape: Any, dtype: DType | None = None, device: str | None = None, requires_grad: bool | None = None):
    dtype = _float_dtype(dtype)
    unit, = cls._random_units(creation_shape(shape, dtype, device), device, words=1)
    result = unit.cast(dtype)
    # a float32 just below 1 rounds to 1 in a narrower float: keep [0, 1) (the largest value below 1 instead)
    if dtype.itemsize < 4: result = result.minimum(1 - 2.0 ** -(dtypes.finfo(dtype)[1] + 1))
    result.requires_grad = requires_grad
    return result

  @classmethod
  def randn(cls, *shape: Any, dtype: DType | None = None, device: str | None = None,
            requires_grad: bool | None = None):
    """Standard normal numbers by the Box-Muller transform of the two words of each counter."""
    dtype = _float_dtype(dtype)
    u0, u1 = cls._random_units(creation_shape(shape, dtype, device), device)
    # 1 - u0 lies in (0, 1], so the log is finite
    radius = ((1 - u0).log() * -2).sqrt()
    result = (radius * (u1 * (2 * math.pi) + math.pi / 2).sin()).cast(dtype)
    result.requires_grad = requires_grad
    return result

  @classmethod
  def uniform(cls, *shape: Any, low: float = 0.0, high: float = 1.0, dtype: DType | None = None,
              device: str | None = None, requires_grad: bool | None = None):
    result = cls.rand(*shape, dtype=dtype, device=device) * (high - low) + low
    result.requires_grad = requires_grad
    return result

  @classmethod
  def normal(cls, *shape: Any, mean: float = 0.0, std: float = 1.0, dtype: DType | None = None,
             device: str | None = None, requires_grad: bool | None = None):
    result = cls.randn(*shape, dtype=dtype, device=device) * std + mean
    result.requires_grad = requires_grad
    return result

  @classmethod
  def randint(cls, *shape: Any, low: int = 0, high: int = 10, dtype: DType = dtypes.int32, device: str | None = None,
              requires_grad: bool | None = None):
    if high <= low: raise ArgumentError(f"randint needs low < high, got low={low} high={high}")
    dtype = to_dtype(dtype)
    shape = creation_shape(shape, dtype, device)
    span = high - low
    # 48 random bits from the two words (one word's 24 reached only 2**24 of a span of 2**30: multiples of 64)
    high_bits, low_bits = cls._random_units(shape, device)
    unit = high_bits.cast(dtypes.float64) + low_bits.cast(dtypes.float64) * 2.0 ** -24
    # the product is non-negative, so truncating to an integer is the floor
    result = ((unit * span).cast(dtypes.int64) + low).cast(dtype)
    result.requires_grad = requires_grad
    return result

  @classmethod
  def kaiming_uniform(cls, *shape: Any, a: float = 0.01, dtype: DType | None = None, device: str | None = None,
                      requires_grad: bool | None = None):
    """torch.nn.init.kaiming_uniform_ with leaky_relu gain: bound = gain * sqrt(3 / fan_in)."""
    shape = shape_arg(shape)
    fan_in = math.prod(shape[1:]) if len(shape) > 1 else shape[0]
    bound = math.sqrt(2.0 / (1 + a * a)) * math.sqrt(3.0 / max(fan_in, 1))
    return cls.uniform(*shape, low=-bound, high=bound, dtype=dtype, device=device, requires_grad=requires_grad)

  @classmethod
  def glorot_uniform(cls, *shape: Any, dtype: DType | None = None, device: str | None = None,
                     requires_grad: bool | None = None):
    """Xavier/Glorot uniform: bound = sqrt(6 / (fan_in + fan_out))."""
    shape = shape_arg(shape)
    receptive = math.prod(shape[2:])
    fan_in = shape[1] * receptive if len(shape) > 1 else shape[0]
    fan_out = shape[0] * receptive
    bound = math.sqrt(6.0 / max(fan_in + fan_out, 1))
    return cls.uniform(*shape, low=-bound, high=bound, dtype=dtype, device=device, requires_grad=requires_grad)

  def rand_like(self, dtype: DType | None = None, requires_grad: bool | None = None):
    return type(self).rand(*self.shape, dtype=dtype or self.dtype, device=self.device, requires_grad=requires_grad)

  def randn_like(self, dtype: DType | None = None, requires_grad: bool | None = None):
    return type(self).randn(*self.shape, dtype=dtype or self.dtype, device=self.device, requires_grad=requires_grad)


def _float_dtype(dtype: Any) -> DType:
  if dtype is None: return dtypes.default_float
  if not dtypes.is_float(dtype := to_dtype(dtype)):
    raise DTypeError(f"random floats need a float dtype, got {dtype!r} (randint draws integers)")
  return dtype
