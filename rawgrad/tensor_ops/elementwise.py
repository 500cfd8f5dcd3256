"""Tensor operations: elementwise arithmetic, exponentials and logarithms, trigonometry, activations, rounding,
classification, and bitwise and logical operations, with PyTorch's names, arguments, broadcasting and result dtypes.

Everything is built from the core operations of tensor.py (plus the TRUNC, IDIV, MOD, SHL, SHR and MULACC nodes the
code generator knows), so it stays lazy, fuses into kernels and is differentiable through the core gradient rules.

Accuracy is part of the contract: float32 results are within a few ulp of the correctly rounded value over the whole
input range, and no intermediate overflows where the answer is finite (tanh(100) is 1, sigmoid(-100) is tiny, not
nan). The formulas that float32 cannot carry accurately (cos, tan, erf, erfc, gelu, the arc tangent family, hypot
and pow) are computed in float64 and rounded once at the end; the rest work in the input's own precision.
float16 and bfloat16 inputs are computed in float32. Integer and bool inputs of float functions become float32.

Branches are taken with `where`, and every branch is fed an input for which it stays finite, so the gradient of the
branch not taken is zero rather than `0 * inf = nan`.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable

from rawgrad.compiler.ir import Ops, UOp
from rawgrad.dtype import DType, dtypes
from rawgrad.errors import DTypeError
from rawgrad.tensor_ops.helpers import TensorBase
from rawgrad.tensor_ops.helpers import with_gradient as _with_gradient

if TYPE_CHECKING:
  from rawgrad.tensor import Tensor

# *** constants ***

LN2 = math.log(2)
INF = math.inf

# ln(2) as hi + lo for the exponential's argument reduction: hi has few enough bits that n*hi is exact for every n the
# reduction meets (Cody and Waite); lo is the rest. float64: fdlibm's ln2HI/ln2LO, float32: Cephes' expf split.
_LN2_PARTS = {dtypes.float32: (0.693359375, -2.12194440e-4),
              dtypes.float64: (6.93147180369123816490e-01, 1.90821492927058770002e-10)}
# |x| beyond which exp(x) is 0 or inf in the dtype; clamping there keeps the reduction's integer n small
_EXP_LIMIT = {dtypes.float32: 105.0, dtypes.float64: 746.0}

# pi/2 as three parts, the first two of 33 bits: k*part is exact for integers k < 2**20 (fdlibm's medium reduction)
_PI_OVER_2_PARTS = (1.5707963267341256, 6.077100506303966e-11, 2.0222662487959506e-21)
_REDUCIBLE_LIMIT = 2.0 ** 19 * math.pi / 2

# Polynomial and Chebyshev coefficients (lowest order first), fitted with mpmath at 60 digits:
#   mpmath.chebyfit(f, [0, b], n) for tanh, atan and erf (f(s) = g(sqrt(s)) / sqrt(s), each error < 2e-17), and the
#   Chebyshev series of log(erfc(x) * exp(x*x) / t) in t = 2 / (2 + x) on t in [0, 0.8] (x >= 0.5; error 4e-17).
# tanh(x) = x * P(x*x) for |x| < 0.625
_TANH_CUTOFF = 0.625
_TANH = (1.0, -0.33333333333332615, 0.13333333333245254, -0.053968253925945696, 0.021869487483410596,
         -0.008863220021256096, 0.003591982521583925, -0.0014549293858543903, 0.0005862314316050611,
         -0.00022841018529512851, 7.698563199045423e-05, -1.6001499513001042e-05)
# atan(z) = z * P(z*z) for 0 <= z <= tan(pi/8)
_TAN_PI_OVER_8 = 0.41421356237309503
_ATAN = (1.0, -0.3333333333332844, 0.1999999999885511, -0.14285714180976467, 0.11111106180455946,
         -0.09090773074808414, 0.07689953496306857, -0.06640233930429408, 0.056883492268090106,
         -0.04348052215716462, 0.021135373157693246)
# erf(x) = x * P(x*x) for |x| < 0.5
_ERF_CUTOFF = 0.5
_ERF = (1.1283791670955126, -0.37612638903183476, 0.11283791670925353, -0.026866170632887928, 0.00522397737302147,
        -0.0008548297753674966, 0.00012053335124353741, -1.4845849259707869e-05, 1.4725865480556744e-06)
_ERFC_ZERO_BEYOND = 30.0  # erfc(30) is 0 even in float64
# erfc(x) = t * exp(-x*x + sum_k c_k T_k(2.5 t - 1) - c_0 / 2) for x >= 0.5, t = 2 / (2 + x) (Numerical Recipes' form)
_ERFC = (-1.56637414544812, 0.5058947933173407, 0.020165332295700413, -0.004150784270483714, -0.0006929393033131829,
         8.061304448090166e-05, 2.5850999510766174e-05, -2.4532413619366538e-06, -1.0665628949056516e-06,
         1.0956136201272647e-07, 4.618283721422925e-08, -6.305089137369667e-09, -1.9633309872353595e-09,
         3.979371116364933e-10, 7.359712081538667e-11, -2.4619582503772172e-11, -1.769647748682444e-12,
         1.3810080809606214e-12, -4.600206617963027e-14, -6.380484046552098e-14, 9.937718418245514e-15,
         1.856958347210499e-15, -7.707956385933372e-16, 3.1621351296209296e-17)

# products that may be subnormal are formed 2**64 times larger and scaled down at the end, so they round once
_SUBNORMAL_SHIFT = 64
_MISH_EXP_BELOW = -40.0
_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946
_ROUNDING_MODES = (None, "trunc", "floor")
# integer powers up to this exponent multiply (exact for small ones); larger ones go through exp2(y * log2(x))
_MAX_SQUARING_EXPONENT = 64


class ElementwiseOps(TensorBase):
  """Mixin of rawgrad.tensor.Tensor."""
  __slots__ = ()

  # *** arithmetic ***

  def add(self, other: Any, reverse: bool = False, *, alpha: Any = 1) -> Tensor:
    """self + alpha * other (`reverse` swaps the operands, for __radd__); for bools a logical or, as PyTorch."""
    if _number_with_half(self, other):
      return self.cast(dtypes.float32).add(other, reverse, alpha=alpha).cast(self.dtype)
    x, y = self._broadcasted(_scaled(other, alpha), reverse)
    return _alu(x, Ops.OR if x.dtype == dtypes.bool else Ops.ADD, y)

  def sub(self, other: Any, reverse: bool = False, *, alpha: Any = 1) -> Tensor:
    """self - alpha * other (`reverse` swaps the operands before scaling, for __rsub__)."""
    if _number_with_half(self, other):
      return self.cast(dtypes.float32).sub(other, reverse, alpha=alpha).cast(self.dtype)
    x, y = self._broadcasted(other, reverse)
    if x.dtype == dtypes.bool: raise TypeError("subtraction of bool tensors is not supported; use logical_xor()")
    return _alu(x, Ops.ADD, -_scaled(y, alpha))

  def mul(self, other: Any, reverse: bool = False) -> Tensor:
    if _number_with_half(self, other): return self.cast(dtypes.float32).mul(other, reverse).cast(self.dtype)
    x, y = self._broadcasted(other, reverse)
    return _alu(x, Ops.MUL, y)

  def div(self, other: Any, reverse: bool = False, *, rounding_mode: str | None = None) -> Tensor:
    """True division (ints give float32), or with rounding_mode 'trunc' or 'floor' a rounded quotient in the
    operands' dtype, as torch.div. Integer division by zero gives 0 (PyTorch raises, which a lazy tensor cannot)."""
    if rounding_mode not in _ROUNDING_MODES:
      raise ValueError(f"div rounding_mode must be one of {_ROUNDING_MODES}, got {rounding_mode!r}")
    if rounding_mode is None and not dtypes.is_float(self.dtype) and not isinstance(other, type(self)):
      # a Python number would take the integer dtype first (-3 as a uint8 is 253): the tensor becomes float first
      return self.cast(dtypes.default_float).div(other, reverse)
    if rounding_mode is None and _number_with_half(self, other):
      return self.cast(dtypes.float32).div(other, reverse).cast(self.dtype)
    x, y = self._broadcasted(other, reverse)
    if rounding_mode == "floor": return _floor_divide(x, y)
    if rounding_mode == "trunc": return _truncating_divide(x, y)
    if not dtypes.is_float(x.dtype): x, y = x.cast(dtypes.default_float), y.cast(dtypes.default_float)
    return _alu(x, Ops.FDIV, y)

  def floor_divide(self, other: Any) -> Tensor:
    """The quotient rounded down, as Python's // and numpy's floor_divide (floats: the exact floor of the exact
    quotient, computed from an exact fmod)."""
    return _floor_divide(*self._broadcasted(other))

  def fmod(self, other: Any) -> Tensor:
    """The C remainder: the sign of the dividend, computed exactly for floats."""
    return _fmod(*self._broadcasted(other))

  def remainder(self, other: Any) -> Tensor:
    """Python's modulus: the sign of the divisor, computed exactly for floats."""
    return _remainder(*self._broadcasted(other))

  mod = remainder

  def pow(self, exponent: Any) -> Tensor:
    """self ** exponent with PyTorch's dtypes (int ** int stays int) and C99's special values; a negative base with
    an integral float exponent is fine, with a fractional one nan."""
    if isinstance(exponent, (int, float)) and not isinstance(exponent, bool): return _pow_scalar(self, exponent)
    return _pow_with_gradient(*self._broadcasted(exponent))

  def __floordiv__(self, other: Any) -> Tensor: return _floor_divide(*self._broadcasted(other))
  def __rfloordiv__(self, other: Any) -> Tensor: return _floor_divide(*self._broadcasted(other, reverse=True))
  def __mod__(self, other: Any) -> Tensor: return _remainder(*self._broadcasted(other))
  def __rmod__(self, other: Any) -> Tensor: return _remainder(*self._broadcasted(other, reverse=True))
  def __pow__(self, exponent: Any) -> Tensor: return self.pow(exponent)
  def __rpow__(self, base: Any) -> Tensor: return _pow_with_gradient(*self._broadcasted(base, reverse=True))
  def __abs__(self) -> Tensor: return self.abs()
  def __pos__(self) -> Tensor: return self

  # *** signs and magnitudes ***

  def abs(self) -> Tensor:
    if dtypes.is_unsigned(self.dtype) or self.dtype == dtypes.bool: return self
    # max(x, -x) gives +0.0 for -0.0 and keeps nan; the most negative int stays itself, as in PyTorch
    return self.maximum(-self)

  def sign(self) -> Tensor:
    """-1, 0 or 1 (0 for nan, as PyTorch; numpy gives nan)."""
    if self.dtype == dtypes.bool: return self
    if not dtypes.is_float(self.dtype):
      return (self > 0).where(self._scalar(1), (self < 0).where(self._scalar(-1), self._scalar(0)))
    return (self > 0).where(1.0, (self < 0).where(-1.0, self.zeros_like()))

  def square(self) -> Tensor:
    return self * self

  def rsqrt(self) -> Tensor:
    return self.sqrt().reciprocal()

  # *** exponentials and logarithms ***

  def exp(self) -> Tensor:
    x = _as_float(self)
    return _with_gradient(_float_function(x, _exp), (x,), lambda grad, result, _: (grad * result,))

  def expm1(self) -> Tensor:
    """exp(x) - 1, accurate near 0."""
    return _float_function(self, _expm1)

  def log1p(self) -> Tensor:
    """log(1 + x), accurate near 0."""
    return _float_function(self, _log1p)

  def log10(self) -> Tensor:
    return _float_function(self, lambda x: x.log2() * math.log10(2))

  def logaddexp(self, other: Any) -> Tensor:
    """log(exp(self) + exp(other)) without overflow."""
    return _binary_float_function(self, other, lambda x, y: _logaddexp(x, y, _exp, 1.0), wide=True)

  def logaddexp2(self, other: Any) -> Tensor:
    """log2(2**self + 2**other) without overflow."""
    return _binary_float_function(self, other, lambda x, y: _logaddexp(x, y, lambda t: t.exp2(), 1 / LN2), wide=True)

  def xlogy(self, other: Any) -> Tensor:
    """self * log(other), and 0 where self is 0 (unless other is nan)."""
    return _binary_float_function(self, other, _xlogy)

  # *** trigonometry ***

  def cos(self) -> Tensor:
    return _float_function(self, _cos, wide=True)

  def tan(self) -> Tensor:
    return _float_function(self, lambda x: x.sin() / _cos(x), wide=True)

  def atan(self) -> Tensor:
    return _float_function(self, _atan, wide=True)

  def asin(self) -> Tensor:
    return _float_function(self, lambda x: _atan2(x, _one_minus_square(x).sqrt()), wide=True)

  def acos(self) -> Tensor:
    return _float_function(self, lambda x: _atan2(_one_minus_square(x).sqrt(), x), wide=True)

  def atan2(self, other: Any) -> Tensor:
    """The angle of the point (other, self): self is y, other is x, as torch.atan2(input, other)."""
    return _binary_float_function(self, other, _atan2, wide=True)

  def hypot(self, other: Any) -> Tensor:
    return _binary_float_function(self, other, _hypot, wide=True)

  arctan, arcsin, arccos, arctan2 = atan, asin, acos, atan2

  # *** hyperbolic and special functions ***

  def tanh(self) -> Tensor:
    return _float_function(self, _tanh)

  def sigmoid(self) -> Tensor:
    return _float_function(self, _sigmoid)

  def erf(self) -> Tensor:
    return _float_function(self, lambda x: _erf(x, _is_float64(self)), wide=True)

  def erfc(self) -> Tensor:
    """1 - erf(x), accurate in the tail where erfc is tiny."""
    return _float_function(self, lambda x: _erfc(x, _is_float64(self)), wide=True)

  def sinh(self) -> Tensor:
    x = _as_float(self)
    return _with_gradient(_float_function(x, _sinh, wide=True), (x,), lambda grad, _, x: (grad * x.cosh(),))

  def cosh(self) -> Tensor:
    x = _as_float(self)
    return _with_gradient(_float_function(x, _cosh, wide=True), (x,), lambda grad, _, x: (grad * x.sinh(),))

  def asinh(self) -> Tensor:
    x = _as_float(self)
    return _with_gradient(_float_function(x, _asinh, wide=True), (x,),
                          lambda grad, _, x: (grad * (x * x + 1).rsqrt(),))

  def acosh(self) -> Tensor:
    x = _as_float(self)
    return _with_gradient(_float_function(x, _acosh, wide=True), (x,),
                          lambda grad, _, x: (grad * (x * x - 1).rsqrt(),))

  def atanh(self) -> Tensor:
    x = _as_float(self)
    return _with_gradient(_float_function(x, _atanh, wide=True), (x,), lambda grad, _, x: (grad / (1 - x * x),))

  arcsinh, arccosh, arctanh = asinh, acosh, atanh

  # *** activations ***

  def leaky_relu(self, negative_slope: float = 0.01) -> Tensor:
    return (self > 0).where(self, self * negative_slope)

  def elu(self, alpha: float = 1.0) -> Tensor:
    return _float_function(self, lambda x: (x > 0).where(x, _expm1(_non_positive(x)) * alpha))

  def selu(self) -> Tensor:
    return self.elu(_SELU_ALPHA) * _SELU_SCALE

  def celu(self, alpha: float = 1.0) -> Tensor:
    return _float_function(self, lambda x: (x > 0).where(x, _expm1(_non_positive(x) / alpha) * alpha))

  def gelu(self, approximate: str = "none") -> Tensor:
    """x * Phi(x) with the exact normal CDF (approximate='none'), or PyTorch's tanh approximation ('tanh')."""
    if approximate == "none":
      return _float_function(self, lambda x: x * 0.5 * _erfc(x * -math.sqrt(0.5), _is_float64(self)), wide=True)
    if approximate == "tanh":
      x = _as_float(self)
      return _with_gradient(_float_function(x, _gelu_tanh, wide=True), (x,), _gelu_tanh_gradient)
    raise ValueError(f"gelu approximate must be 'none' or 'tanh', got {approximate!r}")

  def silu(self) -> Tensor:
    return _float_function(self, lambda x: _times_sigmoid(x, x))

  swish = silu

  def softplus(self, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """log(1 + exp(beta * x)) / beta, and x itself where beta * x > threshold, as torch.nn.functional.softplus."""
    return _float_function(self, lambda x: _softplus(x, beta, threshold))

  def mish(self) -> Tensor:
    return _float_function(self, _mish)

  def hardtanh(self, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
    """clamp(min_val, max_val) whose gradient is 0 at the bounds themselves, as PyTorch's."""
    return (self <= min_val).where(min_val, (self >= max_val).where(max_val, self))

  def relu6(self) -> Tensor:
    return self.hardtanh(0, 6)

  def hardsigmoid(self) -> Tensor:
    return (self + 3).relu6() / 6  # relu6's gradient, 0 at the bounds, is PyTorch's here

  def hardswish(self) -> Tensor:
    # clamp's gradient, 1 at the bounds, gives PyTorch's -0.5 and 1.5 at -3 and 3; x * 6 alone would overflow
    return self * ((self + 3).clamp(0, 6) / 6)

  def softsign(self) -> Tensor:
    return _float_function(self, lambda x: x / (x.abs() + 1))

  def logsigmoid(self) -> Tensor:
    """log(sigmoid(x)) without overflow or log(0)."""
    return _float_function(self, lambda x: -_softplus(-x, 1.0, INF))

  # *** rounding ***

  def trunc(self) -> Tensor:
    return _trunc(self) if dtypes.is_float(self.dtype) else self

  def floor(self) -> Tensor:
    return _floor(self) if dtypes.is_float(self.dtype) else self

  def ceil(self) -> Tensor:
    if not dtypes.is_float(self.dtype): return self
    truncated = _trunc(self)
    return (truncated < self).where(truncated + 1, truncated)

  def round(self, decimals: int = 0) -> Tensor:
    """Round half to even, as torch.round; with decimals, round(x * 10**decimals) / 10**decimals."""
    if not dtypes.is_float(self.dtype): return self
    if decimals > 0: return _round_half_even(self * 10.0 ** decimals) / 10.0 ** decimals
    if decimals < 0: return _round_half_even(self / 10.0 ** -decimals) * 10.0 ** -decimals
    return _round_half_even(self)

  def frac(self) -> Tensor:
    return self - self.trunc()

  fix = trunc

  # *** clamping and interpolation ***

  def clamp(self, min: Any = None, max: Any = None) -> Tensor:
    """Limit to [min, max]; either bound may be None, a scalar or a tensor; a nan input or bound gives nan. As in
    PyTorch, min > max gives max, and the gradient reaches the input wherever min <= x <= max."""
    if min is None and max is None: raise ValueError("clamp needs at least one of min and max")
    result = self if min is None else _clamp_side(self, min, below=True)
    return result if max is None else _clamp_side(result, max, below=False)

  clip = clamp

  def lerp(self, end: Any, weight: Any) -> Tensor:
    """self + weight * (end - self), in PyTorch's form that is exact at both ends."""
    start, end = self._broadcasted(end)
    if not dtypes.is_float(start.dtype): raise TypeError(f"lerp needs float tensors, got {start.dtype}")
    difference = end - start
    if not isinstance(weight, type(self)):
      return start + difference * weight if abs(weight) < 0.5 else end - difference * (1 - weight)
    weight = weight.cast(start.dtype)
    return (weight.abs() < 0.5).where(start + weight * difference, end - difference * (1 - weight))

  def copysign(self, other: Any) -> Tensor:
    """|self| with the sign of other (its sign bit: -0.0 counts as negative); the result is a float."""
    x, y = self._broadcasted(other)
    x, y = _as_float(x), _as_float(y)
    return _with_sign_of(x.abs(), y.cast(x.dtype))

  # *** classification ***

  def isnan(self) -> Tensor:
    return self != self if dtypes.is_float(self.dtype) else self.full_like(False, dtypes.bool)

  def isinf(self) -> Tensor:
    return self.abs() == INF if dtypes.is_float(self.dtype) else self.full_like(False, dtypes.bool)

  def isfinite(self) -> Tensor:
    return self.abs() < INF if dtypes.is_float(self.dtype) else self.full_like(True, dtypes.bool)

  def isclose(self, other: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> Tensor:
    """|self - other| <= atol + rtol * |other| elementwise, as torch.isclose: equal values (infinities included)
    are close, nan only with equal_nan."""
    x, y = self._broadcasted(other)
    close = x == y
    if not dtypes.is_float(x.dtype): x, y = x.cast(dtypes.float64), y.cast(dtypes.float64)
    if equal_nan: close = close | (x.isnan() & y.isnan())
    if rtol == 0 and atol == 0: return close
    difference = (x - y).abs()
    return close | (difference.isfinite() & (difference <= (y * rtol).abs() + atol))

  def allclose(self, other: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> bool:
    """Whether every element is close (isclose); reads the answer on the host."""
    return bool(self.isclose(other, rtol, atol, equal_nan).all().item())

  # *** bitwise ***

  def bitwise_and(self, other: Any) -> Tensor: return _bitwise(self, Ops.AND, other, "bitwise_and")
  def bitwise_or(self, other: Any) -> Tensor: return _bitwise(self, Ops.OR, other, "bitwise_or")
  def bitwise_xor(self, other: Any) -> Tensor: return _bitwise(self, Ops.XOR, other, "bitwise_xor")
  def __and__(self, other: Any) -> Tensor: return _bitwise(self, Ops.AND, other, "&")
  def __or__(self, other: Any) -> Tensor: return _bitwise(self, Ops.OR, other, "|")
  def __xor__(self, other: Any) -> Tensor: return _bitwise(self, Ops.XOR, other, "^")
  def __rand__(self, other: Any) -> Tensor: return _bitwise(self, Ops.AND, other, "&", reverse=True)
  def __ror__(self, other: Any) -> Tensor: return _bitwise(self, Ops.OR, other, "|", reverse=True)
  def __rxor__(self, other: Any) -> Tensor: return _bitwise(self, Ops.XOR, other, "^", reverse=True)

  def bitwise_not(self) -> Tensor:
    if self.dtype == dtypes.bool: return self.logical_not()
    if not dtypes.is_int(self.dtype):
      raise DTypeError(f"bitwise_not is only defined for integer and bool tensors, got {self.dtype}")
    return _alu(self, Ops.XOR, self._scalar(dtypes.max(self.dtype) if dtypes.is_unsigned(self.dtype) else -1))

  def __invert__(self) -> Tensor: return self.bitwise_not()

  def bitwise_left_shift(self, other: Any) -> Tensor: return _shift(*self._broadcasted(other), left=True)
  def bitwise_right_shift(self, other: Any) -> Tensor: return _shift(*self._broadcasted(other), left=False)
  def __lshift__(self, other: Any) -> Tensor: return _shift(*self._broadcasted(other), left=True)
  def __rshift__(self, other: Any) -> Tensor: return _shift(*self._broadcasted(other), left=False)
  def __rlshift__(self, other: Any) -> Tensor: return _shift(*self._broadcasted(other, reverse=True), left=True)
  def __rrshift__(self, other: Any) -> Tensor: return _shift(*self._broadcasted(other, reverse=True), left=False)

  # *** logical ***

  def logical_and(self, other: Any) -> Tensor: return _logical(self, Ops.AND, other)
  def logical_or(self, other: Any) -> Tensor: return _logical(self, Ops.OR, other)
  def logical_xor(self, other: Any) -> Tensor: return _logical(self, Ops.XOR, other)

  # *** comparisons by name ***

  def eq(self, other: Any) -> Tensor: return self == other
  def ne(self, other: Any) -> Tensor: return self != other
  def lt(self, other: Any) -> Tensor: return self < other
  def le(self, other: Any) -> Tensor: return self <= other
  def gt(self, other: Any) -> Tensor: return self > other
  def ge(self, other: Any) -> Tensor: return self >= other


# *** building blocks: nodes the Tensor API does not expose ***

def _alu(x: Tensor, op: Ops, y: Tensor) -> Tensor:
  return type(x)(x.uop.alu(op, y.uop))


def _trunc(x: Tensor) -> Tensor:
  return type(x)(UOp(Ops.TRUNC, x.dtype, (x.uop,)))


def _fused_multiply_add(a: Tensor, b: Tensor, c: Tensor) -> Tensor:
  """a * b + c with one rounding."""
  return type(a)(UOp(Ops.MULACC, a.dtype, (a.uop, b.uop, c.uop)))


# *** dtype policy ***

def _as_float(x: Tensor) -> Tensor:
  return x if dtypes.is_float(x.dtype) else x.cast(dtypes.default_float)


def _is_float64(x: Tensor) -> bool:
  """Whether a float function of x answers in float64, and so must be accurate to float64's precision."""
  return x.dtype == dtypes.float64


def _working_dtype(dtype: DType, wide: bool) -> DType:
  if wide: return dtypes.float64
  return dtypes.float32 if dtype.itemsize < 4 else dtype


def _float_function(x: Tensor, compute: Callable[[Tensor], Tensor], wide: bool = False) -> Tensor:
  """compute(x) for a float function: ints become float32; the work is done in float32 at least (float64 when
  `wide`), and the result rounded once to the input's float dtype."""
  x = _as_float(x)
  return compute(x.cast(_working_dtype(x.dtype, wide))).cast(x.dtype)


def _binary_float_function(x: Tensor, other: Any, compute: Callable[[Tensor, Tensor], Tensor],
                           wide: bool = False) -> Tensor:
  x, y = x._broadcasted(other)
  x, y = _as_float(x), _as_float(y)
  working = _working_dtype(x.dtype, wide)
  return compute(x.cast(working), y.cast(working)).cast(x.dtype)


def _number_with_half(x: Tensor, other: Any) -> bool:
  """A float16 or bfloat16 tensor with a Python number: PyTorch computes in float32 and rounds once, where the number
  in the tensor's dtype would already be inf or 0 (x / 1e5, x * 1e-8)."""
  return x.dtype in (dtypes.float16, dtypes.bfloat16) and isinstance(other, (int, float)) and \
    not isinstance(other, bool)


def _scaled(value: Any, alpha: Any) -> Any:
  return value if isinstance(alpha, (int, float)) and alpha == 1 else value * alpha


# *** small helpers on float tensors ***

def _sign_bit(x: Tensor) -> Tensor:
  """True where x is negative, -0.0 included (1 / -0.0 is -inf); false for nan."""
  return (x < 0) | (x.reciprocal() < 0)


def _with_sign_of(magnitude: Tensor, x: Tensor) -> Tensor:
  return _sign_bit(x).where(-magnitude, magnitude)


def _magnitude(x: Tensor) -> Tensor:
  """|x| for odd functions f(x) = sign(x) f(|x|): its gradient at 0 is 1 (abs's is 0, which would zero f'(0))."""
  return _sign_bit(x).where(-x, x)


def _non_positive(x: Tensor) -> Tensor:
  """min(x, 0) whose gradient at 0 is 1: a branch `x <= 0` then differentiates like its own formula."""
  return (x > 0).where(0.0, x)


def _clamp_side(x: Tensor, bound: Any, below: bool) -> Tensor:
  """max(x, bound) (below) or min(x, bound); ties keep x, so its gradient is 1 there."""
  x, bound = x._broadcasted(bound)
  beyond = (x < bound) if below else (bound < x)
  result = beyond.where(bound, x)
  return (bound != bound).where(bound, result) if dtypes.is_float(x.dtype) else result


def _floor(x: Tensor) -> Tensor:
  truncated = _trunc(x)
  return (truncated > x).where(truncated - 1, truncated)


def _round_half_even(x: Tensor) -> Tensor:
  truncated = _trunc(x)
  fraction = (x - truncated).abs()  # exact
  half = truncated * 0.5
  odd = half != _trunc(half)
  away = (fraction > 0.5) | ((fraction == 0.5) & odd)
  # the untouched branch keeps trunc's signed zero: round(-0.3) is -0.0
  return away.where(truncated + (x < 0).where(-1.0, x.ones_like()), truncated)


def _polynomial(x: Tensor, coefficients: tuple[float, ...]) -> Tensor:
  """sum c_k x**k by Horner's rule."""
  result = x * coefficients[-1] + coefficients[-2]
  for coefficient in reversed(coefficients[:-2]): result = result * x + coefficient
  return result


def _chebyshev(v: Tensor, coefficients: tuple[float, ...]) -> Tensor:
  """sum c_k T_k(v) - c_0 / 2 for v in [-1, 1], by Clenshaw's recurrence (stable where monomials are not)."""
  twice = v * 2
  current, previous = twice * coefficients[-1] + coefficients[-2], v._scalar(coefficients[-1])
  for coefficient in reversed(coefficients[1:-2]):
    current, previous = twice * current - previous + coefficient, current
  return v * current - previous + coefficients[0] / 2


def _one_minus_square(x: Tensor) -> Tensor:
  return (1 - x) * (1 + x)  # exact-ish near |x| = 1 where 1 - x*x cancels


# *** exponentials and logarithms (float32 or float64 in, same out) ***

def _exp(x: Tensor, scale_exponent: int = 0) -> Tensor:
  """exp(x) * 2**scale_exponent as 2**n * exp2(r / ln2) with r = x - n*ln2 reduced exactly (Cody-Waite): exp2(x / ln2)
  alone would lose |x| / ln2 ulp to the rounding of its argument."""
  high, low = _LN2_PARTS[x.dtype]
  limit = _EXP_LIMIT[x.dtype]
  # the lower limit moves with the scale so that a scaled result that would be 0 still is
  x = x.maximum(-limit - scale_exponent * LN2).minimum(limit)
  n = _floor(x * (1 / LN2) + 0.5)
  reduced = (x - n * high) - n * low
  n = (n == n).where(n, 0.0) + scale_exponent  # nan (from a nan x, which stays nan in `reduced`) has no int value
  # 2**n in two factors, each a normal number, so the product rounds once even where 2**n would overflow or underflow
  half = _floor(n * 0.5)
  return (reduced * (1 / LN2)).exp2() * _power_of_two(n - half) * _power_of_two(half)


def _power_of_two(k: Tensor) -> Tensor:
  """2**k for integral k in the dtype's normal exponent range, exactly: the bits of the float put together."""
  exponent_bits, mantissa_bits = dtypes.finfo(k.dtype)
  biased = k.cast(dtypes.int32 if k.dtype.itemsize == 4 else dtypes.int64) + (2 ** (exponent_bits - 1) - 1)
  return type(k)(_alu(biased, Ops.SHL, biased._scalar(mantissa_bits)).uop.bitcast(k.dtype))


def _expm1(x: Tensor) -> Tensor:
  """Kahan's expm1: (u - 1) * x / log(u) with u = exp(x) cancels the rounding error u carries."""
  u = _exp(x)
  # u - 1 == -1 when u is below half an ulp of 1: there u may be subnormal, too coarse for the correction
  ordinary = (u != 1) & (u - 1 != -1) & (u != INF)
  safe_u = ordinary.where(u, 2.0)
  value = (safe_u - 1) * (ordinary.where(x, 1.0) / safe_u.log())
  special = (u == 1).where(x, (u < 1).where(u - 1, INF))  # tiny x; exp(x) negligible next to 1 (u - 1 is -1); overflow
  return ordinary.where(value, special)


def _log1p(x: Tensor) -> Tensor:
  """Kahan's log1p: log(u) * x / (u - 1) with u = 1 + x cancels the rounding error of the sum."""
  u = x + 1
  ordinary = (u != 1) & (u != INF)
  safe_u = ordinary.where(u, 2.0)
  value = safe_u.log() * (ordinary.where(x, 1.0) / (safe_u - 1))
  return ordinary.where(value, x)


def _sigmoid(x: Tensor) -> Tensor:
  return _times_sigmoid(x.ones_like(), x)


def _times_sigmoid(factor: Tensor, z: Tensor) -> Tensor:
  """factor * sigmoid(z), rounded once even where the product is subnormal (silu of -100 in float32)."""
  # exp of -|z| only: it never overflows; both halves use the branch condition so the gradient at 0 is exact
  positive = z >= 0
  scaled = _exp(positive.where(-z, z), _SUBNORMAL_SHIFT)
  e = scaled * 2.0 ** -_SUBNORMAL_SHIFT
  return positive.where(factor / (e + 1), factor * scaled / (e + 1) * 2.0 ** -_SUBNORMAL_SHIFT)


def _times_exp(factor: Tensor, z: Tensor) -> Tensor:
  """factor * exp(z) for z <= 0, rounded once even where the product is subnormal."""
  return factor * _exp(z, _SUBNORMAL_SHIFT) * 2.0 ** -_SUBNORMAL_SHIFT


def _mish(x: Tensor) -> Tensor:
  # below -40, tanh(softplus(x)) is exp(x) to within 2**-57 relative; the product there may be subnormal
  far = x < _MISH_EXP_BELOW
  return far.where(_times_exp(x, far.where(x, _MISH_EXP_BELOW)), x * _tanh(_softplus(x, 1.0, 20.0)))


def _softplus(x: Tensor, beta: float, threshold: float) -> Tensor:
  scaled = x * beta
  positive = scaled > 0
  value = positive.where(scaled, 0.0) + _log1p(_exp(positive.where(-scaled, scaled)))
  return (scaled > threshold).where(x, value / beta)


def _tanh(x: Tensor) -> Tensor:
  magnitude = x.abs()
  small = magnitude < _TANH_CUTOFF
  near_zero = small.where(x, 0.0)
  series = near_zero * _polynomial(near_zero * near_zero, _TANH)
  large = small.where(1.0, magnitude)
  tail = 1 - 2 / (_exp(large * 2) + 1)  # exp overflows to inf for large |x| and the tail becomes exactly 1
  return small.where(series, (x < 0).where(-tail, tail))


# *** hyperbolic functions (float64) ***

# beyond this |x|, exp(-|x|) is below float64's resolution next to exp(|x|)
_HYPERBOLIC_TAIL = 20.0
# beyond this |x|, asinh(x) and acosh(x) are log(2|x|) to float64's precision
_LOG_TWICE_BEYOND = 2.0 ** 28


def _sinh(x: Tensor) -> Tensor:
  magnitude = x.abs()
  tail = magnitude > _HYPERBOLIC_TAIL
  near = tail.where(0.0, magnitude)
  grown = _expm1(near)  # sinh = (e - 1/e) / 2 = (u + u / (u + 1)) / 2 with u = e - 1: no cancellation near 0
  value = tail.where(_exp(magnitude, -1), (grown + grown / (grown + 1)) * 0.5)
  return _with_sign_of(value, x)


def _cosh(x: Tensor) -> Tensor:
  magnitude = x.abs()
  tail = magnitude > _HYPERBOLIC_TAIL
  e = _exp(tail.where(0.0, magnitude))
  return tail.where(_exp(magnitude, -1), (e + 1 / e) * 0.5)


def _log_twice(magnitude: Tensor) -> Tensor:
  return magnitude.log() + LN2


def _asinh(x: Tensor) -> Tensor:
  magnitude = x.abs()
  far = magnitude > _LOG_TWICE_BEYOND
  a = far.where(1.0, magnitude)
  # asinh(a) = log1p(a + a*a / (1 + sqrt(1 + a*a))): no cancellation near 0
  near = _log1p(a + a * a / ((a * a + 1).sqrt() + 1))
  return _with_sign_of(far.where(_log_twice(magnitude), near), x)


def _acosh(x: Tensor) -> Tensor:
  far = x > _LOG_TWICE_BEYOND
  t = (far | (x < 1)).where(0.0, x - 1)
  near = _log1p(t + (t * 2 + t * t).sqrt())  # acosh(1 + t) without cancellation near 1
  return (x < 1).where(math.nan, far.where(_log_twice(far.where(x, 1.0)), near))


def _atanh(x: Tensor) -> Tensor:
  magnitude = x.abs()
  inside = magnitude <= 1
  a = inside.where(magnitude, 0.0)
  value = _log1p(a * 2 / (1 - a)) * 0.5
  return _with_sign_of(inside.where(value, math.nan), x)


_GELU_CUBIC = 0.044715
_GELU_SCALE = 2 * math.sqrt(2 / math.pi)  # z = 2u = _GELU_SCALE * (x + _GELU_CUBIC * x^3)


def _gelu_tanh(x: Tensor) -> Tensor:
  # 0.5 * (1 + tanh(u)) is sigmoid(2u): no cancellation for negative x. The cubic's rounding error is multiplied by
  # up to ~200 in the negative tail (the function's condition number there), hence float64.
  return _times_sigmoid(x, (x + x * x * x * _GELU_CUBIC) * _GELU_SCALE)


def _gelu_tanh_gradient(grad: Tensor, _: Tensor, x: Tensor) -> tuple[Tensor]:
  """grad * gelu_tanh'(x), in float64 and rounded once: sigmoid(z) + x * z' * sigmoid(z) * sigmoid(-z), the product
  of the two sigmoids as e / (1 + e)^2 with e = exp(-|z|) (no cancellation). One exponential and one division: the
  gradient taken through the forward's arithmetic formed both halves of its sigmoid and four divisions, in the
  epilogue of the matmul that computes the incoming gradient (a GPT step: 84.8 -> 74.1 ms)."""
  wide = x.cast(dtypes.float64)
  z = (wide + wide * wide * wide * _GELU_CUBIC) * _GELU_SCALE
  slope = (wide * wide * (3 * _GELU_CUBIC) + 1) * _GELU_SCALE
  e = _exp(-z.abs())
  share = 1 / (e + 1)
  sigmoid = (z >= 0).where(share, e * share)
  return ((grad.cast(dtypes.float64) * (sigmoid + wide * slope * e * share * share)).cast(grad.dtype),)


def _logaddexp(x: Tensor, y: Tensor, exponential: Callable[[Tensor], Tensor], log_scale: float) -> Tensor:
  """max + log(1 + exponential(-|x - y|)) * log_scale: the logarithm of the sum in the base of `exponential`."""
  # equal arguments (infinities included, where x - y is nan) have difference 0
  difference = (x == y).where(0.0, x - y)
  return x.maximum(y) + _log1p(exponential(-difference.abs())) * log_scale


def _xlogy(x: Tensor, y: Tensor) -> Tensor:
  zero = x == 0
  value = x * zero.where(1.0, y).log()
  return zero.where((y != y).where(y, x.zeros_like()), value)


# *** special functions (float64) ***

def _erf_series(x: Tensor) -> Tensor:
  return x * _polynomial(x * x, _ERF)


def _erfc_tail(x: Tensor, full_precision: bool) -> Tensor:
  """erfc(x) for x >= 0.5 (float64): relative accuracy down to the underflow of exp(-x*x)."""
  x = x.minimum(_ERFC_ZERO_BEYOND)
  t = 2 / (x + 2)
  # the first 16 terms are within 3e-12, plenty below float32's resolution
  series = _chebyshev(t * 2.5 - 1, _ERFC if full_precision else _ERFC[:16])
  # the rounding of x*x (up to 6e-14 absolute) is far below float32's resolution, but not float64's: there
  # exp(-x*x) is exp(-high**2) with high the upper 26 bits of x (high**2 is exact) times exp(-(x - high) * (x + high))
  if not full_precision: return t * _exp(series - x * x)
  spread = x * 134217729.0
  high = spread - (spread - x)
  return t * _exp(-(high * high)) * _exp(series - (x - high) * (x + high))


def _erf_parts(x: Tensor, full_precision: bool) -> tuple[Tensor, Tensor, Tensor]:
  """(is |x| small, erf(x) for small |x|, erfc(|x|) otherwise); each part is fed inputs where it is finite."""
  magnitude = x.abs()
  small = magnitude < _ERF_CUTOFF
  return small, _erf_series(small.where(x, 0.0)), _erfc_tail(small.where(1.0, magnitude), full_precision)


def _erf(x: Tensor, full_precision: bool) -> Tensor:
  small, series, tail = _erf_parts(x, full_precision)
  return small.where(series, (x < 0).where(tail - 1, 1 - tail))


def _erfc(x: Tensor, full_precision: bool) -> Tensor:
  small, series, tail = _erf_parts(x, full_precision)
  return small.where(1 - series, (x < 0).where(2 - tail, tail))


# *** trigonometry (float64) ***

def _cos(x: Tensor) -> Tensor:
  """cos(x) = +-sin(r) or +-cos(r) with r = x - k*pi/2 reduced exactly (|r| <= pi/4), so there is no cancellation
  near the zeros of cos (sin(x + pi/2) would round x + pi/2 first). Beyond 2**19 * pi/2 the reduction would need
  more bits of pi; there 1 - 2 sin(x/2)**2 is accurate to an absolute 1e-16."""
  reducible = x.abs() < _REDUCIBLE_LIMIT
  near = reducible.where(x, 0.0)
  k = _floor(near * (2 / math.pi) + 0.5)
  high, middle, low = _PI_OVER_2_PARTS
  reduced = ((near - k * high) - k * middle) - k * low
  quadrant = k - _floor(k * 0.25) * 4
  odd = (quadrant == 1) | (quadrant == 3)
  # one sine for every lane: sin(r) in odd quadrants; cos(r) = sin(r + pi/2) in even ones, where it is >= 0.7 so the
  # rounding of r + pi/2 costs nothing relative; sin(x/2) beyond the reducible range
  sine = reducible.where(odd.where(reduced, reduced + math.pi / 2), x * 0.5).sin()
  negative = (quadrant == 1) | (quadrant == 2)
  return reducible.where(negative.where(-sine, sine), 1 - sine * sine * 2)


def _atan_unit(z: Tensor) -> Tensor:
  """atan(z) for 0 <= z <= 1: above tan(pi/8), atan(z) = pi/4 + atan((z - 1) / (z + 1))."""
  upper = z > _TAN_PI_OVER_8
  w = upper.where((z - 1) / (z + 1), z)
  return upper.where(math.pi / 4, z.zeros_like()) + w * _polynomial(w * w, _ATAN)


def _atan(x: Tensor) -> Tensor:
  magnitude = _magnitude(x)
  outside = magnitude > 1
  angle = _atan_unit(outside.where(1 / outside.where(magnitude, 1.0), magnitude))
  return _with_sign_of(outside.where(math.pi / 2 - angle, angle), x)


def _atan2(y: Tensor, x: Tensor) -> Tensor:
  """The angle of (x, y) in [-pi, pi] with C99's signed zeros and infinities."""
  ay, ax = _magnitude(y), _magnitude(x)
  steep = ay > ax
  # the smaller magnitude over the larger; 0/0 is 0 and inf/inf is 1 (angle pi/4)
  ratio = steep.where(ax / steep.where(ay, 1.0), ay / (steep | (ax == 0)).where(1.0, ax))
  ratio = ((ay == INF) & (ax == INF)).where(1.0, ratio)
  angle = _atan_unit(ratio)
  angle = steep.where(math.pi / 2 - angle, angle)
  angle = _sign_bit(x).where(math.pi - angle, angle)
  return _with_sign_of(angle, y)


def _hypot(x: Tensor, y: Tensor) -> Tensor:
  ax, ay = x.abs(), y.abs()
  steep = ay > ax
  larger, smaller = steep.where(ay, ax), steep.where(ax, ay)
  ratio = smaller / (larger == 0).where(1.0, larger)
  value = larger * (ratio * ratio + 1).sqrt()
  return ((ax == INF) | (ay == INF)).where(INF, value)  # C99: an infinite side wins over nan


# *** powers ***

def _pow_scalar(base: Tensor, exponent: int | float) -> Tensor:
  """Powers with a Python exponent: integral ones multiply (exactly for ints, wrapping like PyTorch). The gradient
  is PyTorch's, exponent * base ** (exponent - 1), and 0 for exponent 0."""
  if not dtypes.is_float(base.dtype): return _unscaled_pow_scalar(base, exponent)
  if exponent == 0:
    # exactly 1 everywhere (nan and inf included), still a function of base so that it has a (zero) gradient
    result = (base.abs() < INF).where(base * 0, 0.0) + 1
    return _with_gradient(result, (base,), lambda grad, _, x: (grad * 0,))
  return _with_gradient(_unscaled_pow_scalar(base, exponent), (base,),
                        lambda grad, _, x: (grad * (x.pow(exponent - 1) * exponent),))


def _unscaled_pow_scalar(base: Tensor, exponent: int | float) -> Tensor:
  if not dtypes.is_float(base.dtype) and isinstance(exponent, int):
    if exponent < 0:
      raise ValueError(f"integer tensors ({base.dtype}) to a negative integer power ({exponent}) are not allowed")
    return _integer_power(base.cast(dtypes.default_int) if base.dtype == dtypes.bool else base, exponent)
  if float(exponent).is_integer() and abs(exponent) <= _MAX_SQUARING_EXPONENT:
    # x * x rounds once; longer products are formed in float64 so that their roundings do not add up
    wide = not 0 <= exponent <= 2
    return _float_function(base, lambda x: _integer_power(x, int(exponent)), wide=wide)
  if exponent == 0.5: return _float_function(base, lambda x: x.sqrt())
  if exponent == -0.5: return _float_function(base, lambda x: x.sqrt().reciprocal())  # PyTorch's rsqrt: -0.0 gives -inf
  return _pow(*base._broadcasted(exponent))


def _integer_power(base: Tensor, exponent: int) -> Tensor:
  """base ** exponent by squaring; a negative exponent takes the reciprocal (floats only)."""
  count, result, power = abs(exponent), None, base
  while count:
    if count & 1: result = power if result is None else result * power
    count >>= 1
    if count: power = _product_boundary(power * power)
  if result is None: return base.ones_like()
  return result.reciprocal() if exponent < 0 else result


def _pow_with_gradient(base: Tensor, exponent: Tensor) -> Tensor:
  """base ** exponent with PyTorch's gradients: exponent * base ** (exponent - 1) for the base (0 where the exponent
  is 0), result * log(base) for the exponent (0 where the base is 0 and the exponent is not negative)."""
  result = _pow(base, exponent)
  if not dtypes.is_float(base.dtype): return result

  def rule(grad: Tensor, result: Tensor, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    base_grad = (y == 0).where(0.0, grad * (y * x.pow(y - 1)))
    return base_grad, grad * ((y >= 0) & (x == 0)).where(0.0, result * x.log())
  return _with_gradient(result, (base, exponent), rule)


def _pow(base: Tensor, exponent: Tensor) -> Tensor:
  if base.dtype == dtypes.bool: raise TypeError("pow of bool tensors is not supported; cast one of them to int")
  if not dtypes.is_float(base.dtype): return _integer_pow(base, exponent)
  working = dtypes.float64
  return _float_pow(base.cast(working), exponent.cast(working)).cast(base.dtype)


def _integer_pow(base: Tensor, exponent: Tensor) -> Tensor:
  """int ** int tensor: square-and-multiply over every exponent bit, wrapping like PyTorch; a negative exponent
  gives 1 for base 1, +-1 for base -1 and 0 otherwise (PyTorch's rule)."""
  bits = 8 * base.dtype.itemsize - (0 if dtypes.is_unsigned(base.dtype) else 1)
  result, power, remaining = base.ones_like(), base, exponent
  one = base._scalar(1)
  for _ in range(bits):
    result = (_alu(remaining, Ops.AND, one) != 0).where(result * power, result)
    power, remaining = _product_boundary(power * power), _alu(remaining, Ops.SHR, one)
  if dtypes.is_unsigned(base.dtype): return result
  odd = _alu(exponent, Ops.AND, one) != 0
  negative_power = (base == 1).where(one, (base == -1).where(odd.where(-one, one), base.zeros_like()))
  return (exponent < 0).where(negative_power, result)


def _product_boundary(x: Tensor) -> Tensor:
  """x itself, through a cast to the same-width integer of the other signedness and back. The symbolic pass flattens
  nested integer products into one list of factors, a list that doubles with every squaring; it stops at a cast."""
  if not dtypes.is_int(x.dtype): return x
  twin = dtypes.from_name(x.dtype.name[1:] if dtypes.is_unsigned(x.dtype) else "u" + x.dtype.name)
  return x.cast(twin).cast(x.dtype)


def _float_pow(x: Tensor, y: Tensor) -> Tensor:
  """x ** y (float64) as exp2(y * log2|x|) with C99's special values; accurate to 1e-14 relative, so exact in
  float32 after rounding."""
  magnitude_x = x.abs()
  integral = y == _trunc(y)
  odd = integral & ((y * 0.5) != _trunc(y * 0.5))
  # a zero base gives 0 or inf by the rules below; elsewhere log2 stays finite for the gradient
  zero_base = magnitude_x == 0
  ordinary_base = (magnitude_x > 0) & (magnitude_x < INF)
  magnitude = (y * zero_base.where(1.0, magnitude_x).log2()).exp2()
  magnitude = zero_base.where((y < 0).where(INF, (y != y).where(y, x.zeros_like())), magnitude)
  magnitude = ((magnitude_x == 1) & (y.abs() == INF)).where(1.0, magnitude)  # C99: (+-1) ** +-inf is 1
  value = (_sign_bit(x) & odd).where(-magnitude, magnitude)
  fractional_power_of_negative = (x < 0) & (x != -INF) & integral.logical_not()
  value = fractional_power_of_negative.where(math.nan, value)
  # y == 0 with an ordinary base, and x == 1 with a finite y, already give exactly 1 and keep their gradients
  one = ((y == 0) & ordinary_base.logical_not()) | ((x == 1) & (y.abs() < INF).logical_not())
  return one.where(1.0, value)


# *** division and remainder ***

def _safe_divisor(y: Tensor) -> Tensor:
  """y with 0 (undefined) and, for signed ints, -1 (INT_MIN / -1 traps) replaced by 1; callers fix those lanes."""
  special = (y == 0) if dtypes.is_unsigned(y.dtype) else (y == 0) | (y == -1)
  return special.where(1, y)


def _check_not_bool(x: Tensor, name: str) -> None:
  if x.dtype == dtypes.bool: raise TypeError(f"{name} of bool tensors is not supported; cast them to int first")


def _truncating_divide(x: Tensor, y: Tensor) -> Tensor:
  _check_not_bool(x, "division with rounding_mode='trunc'")
  if dtypes.is_float(x.dtype): return _trunc(_alu(x, Ops.FDIV, y))
  quotient = _alu(x, Ops.IDIV, _safe_divisor(y))
  if not dtypes.is_unsigned(x.dtype): quotient = (y == -1).where(-x, quotient)
  return (y == 0).where(0, quotient)


def _floor_divide(x: Tensor, y: Tensor) -> Tensor:
  _check_not_bool(x, "floor division")
  if dtypes.is_float(x.dtype): return _float_function(x, lambda a: _float_floor_divide(a, y.cast(a.dtype)))
  return _integer_divmod(x, y)[0]


def _integer_divmod(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
  """Python's x // y and x % y for integers, from the hardware's truncating IDIV and MOD (0 for both where y is 0)."""
  divisor = _safe_divisor(y)
  quotient, modulus = _alu(x, Ops.IDIV, divisor), _alu(x, Ops.MOD, divisor)
  if not dtypes.is_unsigned(x.dtype):
    rounded_toward_zero = _signs_differ(modulus, divisor)
    quotient = (y == -1).where(-x, rounded_toward_zero.where(quotient - 1, quotient))
    modulus = rounded_toward_zero.where(modulus + divisor, modulus)
  return (y == 0).where(0, quotient), (y == 0).where(0, modulus)


def _signs_differ(remainder: Tensor, divisor: Tensor) -> Tensor:
  """Whether a truncating division left a nonzero remainder of the sign opposite to the divisor's: there the floored
  quotient is one less, and Python's modulus is the remainder plus the divisor."""
  return (remainder != 0) & ((remainder < 0) != (divisor < 0))


def _float_floor_divide(x: Tensor, y: Tensor) -> Tensor:
  """numpy's npy_divmod: the quotient of x - fmod(x, y), which is exact, moved down by one where the remainder has
  the wrong sign, and rounded to the nearest integer to remove the division's rounding."""
  modulus = _fmod_float(x, y)
  quotient = (x - modulus) / y
  quotient = _signs_differ(modulus, y).where(quotient - 1, quotient)
  floored = _floor(quotient)
  floored = (quotient - floored > 0.5).where(floored + 1, floored)
  true_quotient = x / y
  floored = (quotient == 0).where(_with_sign_of(x.zeros_like(), true_quotient), floored)
  return (y == 0).where(true_quotient, floored)


def _fmod(x: Tensor, y: Tensor) -> Tensor:
  _check_not_bool(x, "fmod")
  if dtypes.is_float(x.dtype): return _float_function(x, lambda a: _fmod_float(a, y.cast(a.dtype)))
  return (y == 0).where(0, _alu(x, Ops.MOD, _safe_divisor(y)))


def _remainder(x: Tensor, y: Tensor) -> Tensor:
  _check_not_bool(x, "remainder")
  if dtypes.is_float(x.dtype): return _float_function(x, lambda a: _float_remainder(a, y.cast(a.dtype)))
  return _integer_divmod(x, y)[1]


def _float_remainder(x: Tensor, y: Tensor) -> Tensor:
  modulus = _fmod_float(x, y)
  modulus = _signs_differ(modulus, y).where(modulus + y, modulus)
  return (modulus == 0).where(_with_sign_of(x.zeros_like(), y), modulus)  # a zero takes the divisor's sign


def _fmod_float(x: Tensor, y: Tensor) -> Tensor:
  """fmod(x, y), exactly: |x| is reduced by |y| * 2**(step*k) for k from the largest needed down to 0. Each stage's
  quotient q < 2**step is an exact integer, and r - q*B, done with one rounding (fused multiply-add), is exact
  because the true remainder is representable; enough stages cover every exponent of |x| / |y|."""
  exponent_bits, mantissa_bits = dtypes.finfo(x.dtype)
  step = mantissa_bits  # quotients below 2**mantissa_bits are exact
  ratio_bits = 2 ** exponent_bits + mantissa_bits  # the largest exponent of |x| / |y|, subnormal y included
  divisor = y.abs()
  scales = [divisor]
  for _ in range(ratio_bits // step): scales.append(scales[-1] * 2.0 ** step)  # becomes inf when not needed
  remainder = x.abs()
  for scale in reversed(scales):
    quotient = _trunc(remainder / scale)
    reduced = _fused_multiply_add(-quotient, scale, remainder)
    reduced = (reduced < 0).where(reduced + scale, reduced)  # the rounded quotient was one too large
    remainder = (scale <= remainder).where(reduced, remainder)
  remainder = (y != y).where(y, remainder)
  return _with_sign_of(remainder, x)


# *** bitwise and logical ***

def _bitwise(x: Tensor, op: Ops, other: Any, name: str, reverse: bool = False) -> Tensor:
  a, b = x._broadcasted(other, reverse)
  if dtypes.is_float(a.dtype):
    other_kind = repr(other.dtype) if isinstance(other, type(x)) else f"the {type(other).__name__} {other!r}"
    raise DTypeError(f"{name} is only defined for integer and bool tensors, got {x.dtype!r} and {other_kind}")
  return _alu(a, op, b)


def _shift(x: Tensor, amount: Tensor, left: bool) -> Tensor:
  """Shifts as PyTorch: amounts outside [0, bits) shift everything out (0, or -1 for a negative x shifted right)."""
  if not dtypes.is_int(x.dtype):
    raise DTypeError(f"{'left' if left else 'right'} shift is only defined for integer tensors, got {x.dtype}")
  bits = 8 * x.dtype.itemsize
  outside = (amount < 0) | (amount >= bits) if not dtypes.is_unsigned(x.dtype) else amount >= bits
  shifted = _alu(x, Ops.SHL if left else Ops.SHR, outside.where(0, amount))
  if left or dtypes.is_unsigned(x.dtype): return outside.where(0, shifted)
  return outside.where((x < 0).where(x._scalar(-1), x._scalar(0)), shifted)


def _logical(x: Tensor, op: Ops, other: Any) -> Tensor:
  other = other.cast(dtypes.bool) if isinstance(other, type(x)) else bool(other)
  a, b = x.cast(dtypes.bool)._broadcasted(other)
  return _alu(a, op, b)
