"""Transcendental functions as shared rewrite rules: EXP2, LOG2 and SIN become plain arithmetic, integer and bit
operations that every renderer can print, for every target that does not compute them itself (Target.native_math).

Every function is computed in float64 (float16, bfloat16 and float32 inputs are widened first and the result rounded
once to their dtype, so they are correctly rounded but for the rarest near-ties; float64 results are within a few
ulps):

  exp2(x)  2^x = 2^n * 2^f with n = round(x), |f| <= 1/2: a Taylor polynomial for 2^f, exponent bits for 2^n (in two
           factors, so results near the overflow and underflow limits round once).
  log2(x)  x = m * 2^e with sqrt(1/2) <= m < sqrt(2) (subnormals scaled first): e + 2/ln2 * atanh(s) with
           s = (m-1)/(m+1), |s| < 0.172, as an odd series.
  sin(x)   x = k*pi/2 + r with |r| <= pi/4, then +-sin(r) or +-cos(r) by k mod 4 (Taylor polynomials). Up to 2^20 the
           reduction subtracts k*pi/2 in three parts (Cody-Waite); beyond, x*2/pi is formed exactly enough in integer
           arithmetic (Payne-Hanek): the 53-bit mantissa times 128 bits of 2/pi taken at the exponent, in 32-bit limbs.

THREEFRY (the random bits' block function, one node at the tensor level so a random tensor's graph stays small)
becomes its 20 rounds of 32-bit adds, rotations and xors on every target.

After this pass: no THREEFRY, and no EXP2, LOG2 or SIN the target does not list as native.
"""
from __future__ import annotations

import functools
import math
import struct

from rawgrad.compiler.ir import Ops, UOp, threefry_packed
from rawgrad.compiler.rewrite import PatternMatcher, UPat, graph_rewrite
from rawgrad.compiler.target import Target
from rawgrad.dtype import DType, dtypes

F64, I64, U64 = dtypes.float64, dtypes.int64, dtypes.uint64
MASK32 = 0xFFFFFFFF
ROUNDING = 1.5 * 2.0 ** 52   # x + ROUNDING - ROUNDING rounds x (|x| < 2^51) to the nearest integer, ties to even
ROUNDING_BITS = struct.unpack("<q", struct.pack("<d", ROUNDING))[0]
CODY_WAITE_LIMIT = 2.0 ** 20


def _const(value: float | int, dtype: DType = F64) -> UOp:
  return UOp.const(dtype, value)


def _round_even(x: UOp) -> tuple[UOp, UOp]:
  """x (|x| < 2^51) rounded to the nearest integer, ties to even, as a float64 and as an int64. The sum x + ROUNDING
  holds the integer in its low mantissa bits, so no conversion instruction is needed (AVX2 has none from float64 to
  int64: LLVM converts lane by lane)."""
  shifted = x + ROUNDING
  return shifted - ROUNDING, shifted.bitcast(I64) - ROUNDING_BITS


def _horner(x: UOp, coefficients: list[float]) -> UOp:
  """sum(coefficients[k] * x^k), fused multiply-adds from the highest power down."""
  result = _const(coefficients[-1])
  for coefficient in reversed(coefficients[:-1]): result = UOp(Ops.MULACC, F64, (result, x, _const(coefficient)))
  return result


def _power_of_two(k: UOp) -> UOp:
  """2^k for an int64 k in the normal exponent range [-1022, 1023], from the exponent bits."""
  return ((k + 1023) << 52).bitcast(F64)


# *** exp2 ***

_EXP2_TAYLOR = [math.log(2) ** k / math.factorial(k) for k in range(14)]  # 2^f for |f| <= 1/2 to 2^-57


def exp2_f64(x: UOp, narrow: bool = False) -> UOp:
  """`narrow`: x came from float32 or narrower, so the result is rounded to 24 bits or fewer: 12 terms (to 2^-47)
  and, as every such result is a normal double, one power of two."""
  limit = 160.0 if narrow else 1100.0
  clamped = (x < -limit).where(_const(-limit), (x > limit).where(_const(limit), x))
  n, k = _round_even(clamped)
  fraction = clamped - n
  if narrow: return x.ne(x).where(x, _horner(fraction, _EXP2_TAYLOR[:12]) * _power_of_two(k))
  half = k >> 1  # floor(k/2): both factors stay normal numbers
  result = _horner(fraction, _EXP2_TAYLOR) * _power_of_two(half) * _power_of_two(k - half)
  return x.ne(x).where(x, result)


# *** log2 ***

_ATANH_SERIES = [2 / ((2 * k + 1) * math.log(2)) for k in range(11)]  # 2/ln2 * atanh(s)/s as a series in s^2


def log2_f64(x: UOp, narrow: bool = False) -> UOp:
  """`narrow`: x came from float32 or narrower, so it is never a subnormal double, and 10 terms (to 2^-50) do."""
  scaled, shift = x, _const(0, I64)
  if not narrow:   # float64 subnormals are scaled into the normal range first
    subnormal = x < 2.0 ** -1022
    scaled, shift = subnormal.where(x * 2.0 ** 54, x), subnormal.where(_const(54, I64), _const(0, I64))
  bits = scaled.bitcast(I64)
  exponent = ((bits >> 52) & 0x7FF) - 1023 - shift
  mantissa = ((bits & ((1 << 52) - 1)) | (1023 << 52)).bitcast(F64)  # in [1, 2)
  big = mantissa > math.sqrt(2)
  mantissa = big.where(mantissa * 0.5, mantissa)
  exponent = exponent + big.where(_const(1, I64), _const(0, I64))
  s = (mantissa - 1.0) / (mantissa + 1.0)
  result = exponent.cast(F64) + s * _horner(s * s, _ATANH_SERIES[:10] if narrow else _ATANH_SERIES)
  special = (x < 0.0).where(_const(math.nan), x.eq(0.0).where(_const(-math.inf), x))
  ordinary = (x > 0.0) & x.ne(math.inf)
  return ordinary.where(result, special)


# *** sin ***

_SIN_TAYLOR = [(-1) ** k / math.factorial(2 * k + 1) for k in range(10)]  # sin(r)/r as a series in r^2
_COS_TAYLOR = [(-1) ** k / math.factorial(2 * k) for k in range(11)]      # cos(r) as a series in r^2


@functools.cache
def _two_over_pi_words() -> tuple[int, ...]:
  """The bits of 2/pi after the binary point, 64 to a word, behind one word of zeros (so a window may start before
  the point): enough for any float64 exponent. Computed with Machin's formula in integers."""
  bits = 1400
  def arctan_inverse(n: int) -> int:
    term, total, k = (1 << (bits + 32)) // n, 0, 0
    while term:
      total += term // (2 * k + 1) * (-1) ** k
      term //= n * n
      k += 1
    return total
  pi = 16 * arctan_inverse(5) - 4 * arctan_inverse(239)  # pi * 2^(bits + 32)
  fraction = bin((2 << (2 * (bits + 32))) // pi)[2:].rjust(bits + 32, "0")
  stream = "0" * 64 + fraction
  return tuple(int(stream[64 * i:64 * (i + 1)], 2) for i in range(20))


def _table(index: UOp, words: tuple[int, ...]) -> UOp:
  """words[index] for an int64 index, as a chain of selects."""
  result = _const(words[0], U64)
  for i, word in enumerate(words[1:], 1): result = index.eq(_const(i, I64)).where(_const(word, U64), result)
  return result


def _multiply_window(mantissa: UOp, window_high: UOp, window_low: UOp) -> tuple[UOp, UOp]:
  """Bits 62..127 of mantissa (< 2^53) times the 128-bit window: (bits 126..127, bits 62..125 as a uint64)."""
  m = [mantissa & MASK32, mantissa >> 32]
  w = [window_low & MASK32, window_low >> 32, window_high & MASK32, window_high >> 32]
  columns: list[list[UOp]] = [[] for _ in range(6)]
  for i, part in enumerate(m):
    for j, word in enumerate(w):
      product = part * word  # < 2^64: the limbs have 32 bits, m[1] fewer
      columns[i + j].append(product & MASK32)
      columns[i + j + 1].append(product >> 32)
  digits, carry = [], _const(0, U64)
  for column in columns[:4]:
    total = carry
    for part in column: total = total + part
    digits.append(total & MASK32)
    carry = total >> 32
  quadrant = (digits[3] >> 30) & 3
  fraction = ((digits[3] & 0x3FFFFFFF) << 34) | (digits[2] << 2) | (digits[1] >> 30)
  return quadrant, fraction


def _payne_hanek(magnitude: UOp) -> tuple[UOp, UOp]:
  """|x| * 2/pi = quadrant + r with |r| <= 1/2, for |x| >= 2^20 (as int64 quadrant mod 4, float64 r)."""
  bits = magnitude.bitcast(U64)
  exponent = ((bits >> 52) & 0x7FF).cast(I64) - 1075
  mantissa = (bits & ((1 << 52) - 1)) | (1 << 52)
  # the window starts at bit exponent-1 of 2/pi: higher bits only add multiples of 4 to the product
  start = exponent + 62
  start = (start < 0).where(_const(0, I64), start)
  word, shift = start >> 6, (start & 63).cast(U64)
  words = _two_over_pi_words()
  first, second, third = (_table(word + k, words) for k in range(3))
  def funnel(high: UOp, low: UOp) -> UOp:  # (high << shift) | (low >> (64 - shift)), defined for shift 0 too
    return (high << shift) | ((low >> 1) >> (63 - shift))
  quadrant, fraction = _multiply_window(mantissa, funnel(first, second), funnel(second, third))
  # round to the nearest quadrant: a fraction of 1/2 or more belongs to the next one, as a negative remainder
  signed = fraction.bitcast(I64)
  quadrant = quadrant.cast(I64) + (signed < 0).where(_const(1, I64), _const(0, I64))
  return quadrant, signed.cast(F64) * 2.0 ** -64


_PI_OVER_2_HIGH = 1.5707963267341256   # pi/2 in three parts: the first two with 33 significant bits, so k times
_PI_OVER_2_MIDDLE = 6.077100506303966e-11  # them is exact for |k| < 2^20
_PI_OVER_2_LOW = 2.0222662487959506e-21


def _cody_waite(magnitude: UOp) -> tuple[UOp, UOp]:
  """|x| * 2/pi = quadrant + r for |x| < 2^20: k = round(|x| * 2/pi), r = (|x| - k*pi/2) / (pi/2)."""
  k, quadrant = _round_even(magnitude * (2 / math.pi))
  reduced = ((magnitude - k * _PI_OVER_2_HIGH) - k * _PI_OVER_2_MIDDLE) - k * _PI_OVER_2_LOW
  return quadrant, reduced * (2 / math.pi)


def sin_f64(x: UOp, narrow: bool = False) -> UOp:
  """`narrow` changes nothing: float32 reaches 2^128, so the reduction needs every part even then."""
  magnitude = (x < 0.0).where(-x, x)
  small = magnitude < CODY_WAITE_LIMIT
  safe = small.where(_const(CODY_WAITE_LIMIT), magnitude)  # the integer path's operand stays finite and large
  near_quadrant, near_fraction = _cody_waite(small.where(magnitude, _const(0.0)))
  far_quadrant, far_fraction = _payne_hanek(safe)
  quadrant = small.where(near_quadrant, far_quadrant) & 3
  # r in radians: the fraction of a quarter turn times pi/2, in two parts for the last bits
  fraction = small.where(near_fraction, far_fraction)
  r = fraction * 1.5707963267948966 + fraction * 6.123233995736766e-17
  square = r * r
  sine, cosine = r * _horner(square, _SIN_TAYLOR), _horner(square, _COS_TAYLOR)
  odd = (quadrant & 1).ne(_const(0, I64))
  negative = (quadrant & 2).ne(_const(0, I64))
  value = odd.where(cosine, sine)
  value = negative.where(-value, value)
  value = (x < 0.0).where(-value, value)
  finite = x.ne(x).logical_not() & magnitude.ne(math.inf)
  return finite.where(value, _const(math.nan))


# *** the pass ***

_FUNCTIONS = {Ops.EXP2: ("exp2", exp2_f64), Ops.LOG2: ("log2", log2_f64), Ops.SIN: ("sin", sin_f64)}


def _expand(node: UOp, native: frozenset[str]) -> UOp | None:
  if node.op is Ops.THREEFRY: return threefry_packed(*node.src, wrap=lambda word: word)
  name, function = _FUNCTIONS[node.op]
  if name in native or node.dtype.count != 1: return None
  source = node.src[0]
  wide = source if source.dtype == F64 else source.cast(F64)
  result = function(wide, source.dtype != F64)
  return result if node.dtype == F64 else result.cast(node.dtype)


@functools.cache
def _matcher(native: frozenset[str]) -> PatternMatcher:
  return PatternMatcher([(UPat(_EXPANDED, name="node"), lambda node: _expand(node, native))])


_EXPANDED = frozenset({*_FUNCTIONS, Ops.THREEFRY})


def expand_math(ast: UOp, target: Target) -> UOp:
  """The kernel with every THREEFRY, and every EXP2, LOG2 and SIN the target does not compute natively, written as
  arithmetic."""
  if not any(node.op in _EXPANDED for node in ast.toposort): return ast
  return graph_rewrite(ast, _matcher(target.native_math), name="pm_expand_math")
