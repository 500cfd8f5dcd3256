"""Tests of rawgrad/tensor_ops/elementwise.py.

Float values are checked in ulps against float64 numpy (math.erf/erfc per element) rounded once to the tested dtype,
over one float32 grid spanning the whole range: zeros of both signs, infinities, nan, subnormals, magnitudes from
1e-40 to 3.4e38 of both signs, and dense ranges where the functions bend. The grid is fed as a flipped, permuted view
of another buffer, so every kernel also reads a non-contiguous input. Integer ops are checked exactly at the limits
of each dtype, binary ops on broadcast (n, 1) x (1, m) operands. Gradients are compared with central finite
differences in float64. Each distinct kernel costs one LLVM compile, so values are batched into one tensor per case.

tensor.py still defines add, sub, mul, div, exp and &, |, ^ itself, and those shadow the mixin's versions;
the mixin's are called as ElementwiseOps.<name>(tensor, ...) here until tensor.py delegates to them
(test_tensor_methods_come_from_the_mixin says when). Gradients are taken with respect to 2-d tensors: with respect to
a 1-d tensor made from data, gradient.py fails ("no gradient rule for Ops.BUFFER": such a tensor's node is the
buffer itself).
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import pytest

from rawgrad.dtype import dtypes
from rawgrad.tensor import Tensor
from rawgrad.tensor_ops.elementwise import ElementwiseOps

INF, NAN = math.inf, math.nan
F32_MAX, F32_TINY = float(np.finfo(np.float32).max), float(np.finfo(np.float32).tiny)
SQRT_HALF = math.sqrt(0.5)
mixin = ElementwiseOps  # the mixin's own methods, for those tensor.py still shadows


# *** helpers ***

def float32_grid() -> np.ndarray:
  """About 5000 float32 values over the whole range, as a (rows, 16) array."""
  rng = np.random.default_rng(0)
  special = [0.0, -0.0, INF, -INF, NAN, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 1e-45, -1e-45, 1e-40, F32_TINY, -F32_TINY,
             F32_MAX, -F32_MAX, math.pi / 2, -math.pi / 2, math.pi, 0.625, -0.625, 88.7, 89.5, -87.5, -103.5, -110.0]
  magnitudes = np.geomspace(1e-40, 3e38, 1200)
  values = np.concatenate([special, magnitudes, -magnitudes, rng.uniform(-12, 12, 1600), rng.uniform(-120, 120, 600),
                           rng.uniform(-1e5, 1e5, 300), rng.uniform(-1.2, 1.2, 300)]).astype(np.float32)
  values = np.concatenate([values, np.zeros(-len(values) % 16, np.float32)])
  return values.reshape(-1, 16)


GRID = float32_grid()


def strided(array: np.ndarray) -> Tensor:
  """A Tensor holding `array` (2-d) as a flipped, permuted view of a differently laid out buffer."""
  return Tensor(np.ascontiguousarray(array[::-1].T)).permute(1, 0).flip(0)


def assert_ulp(actual: np.ndarray, expected: np.ndarray, max_ulp: float, inputs: Any = None,
               signed_zeros: bool = True) -> None:
  """actual lies within max_ulp ulps (of its dtype) of the float64 `expected`; nan, infinities and (optionally) the
  signs of zeros must match the rounded expectation exactly."""
  actual, expected = np.asarray(actual), np.asarray(expected, np.float64)
  assert actual.shape == expected.shape, f"shape {actual.shape} != expected {expected.shape}"
  with np.errstate(all="ignore"):
    rounded = expected.astype(actual.dtype)
    error = np.abs(actual.astype(np.float64) - expected) / np.spacing(np.abs(rounded)).astype(np.float64)
  finite = np.isfinite(rounded)
  bad = (np.isnan(actual) != np.isnan(rounded)) | (np.isinf(rounded) & (actual != rounded))
  bad |= finite & ~(error <= max_ulp)
  if signed_zeros: bad |= (rounded == 0) & (actual == 0) & (np.signbit(actual) != np.signbit(rounded))
  if bad.any():
    where = np.argwhere(bad)[:8]
    shown = [(None if inputs is None else np.broadcast_to(inputs, bad.shape)[tuple(i)], actual[tuple(i)],
              expected[tuple(i)], error[tuple(i)]) for i in where]
    raise AssertionError(f"{bad.sum()} of {bad.size} values off by more than {max_ulp} ulp "
                         f"(input, got, want, ulps): {shown}")


def assert_exact(actual: np.ndarray, expected: np.ndarray) -> None:
  actual, expected = np.asarray(actual), np.asarray(expected)
  assert actual.dtype == expected.dtype, f"dtype {actual.dtype} != expected {expected.dtype}"
  same = (actual == expected) | (np.isnan(actual) & np.isnan(expected)) if actual.dtype.kind == "f" else \
    actual == expected
  if not same.all():
    where = np.argwhere(~same)[:8]
    raise AssertionError(f"{(~same).sum()} values differ: {[(actual[tuple(i)], expected[tuple(i)]) for i in where]}")


def vectorized(function: Callable[[float], float]) -> Callable[[np.ndarray], np.ndarray]:
  return lambda x: np.vectorize(function, otypes=[np.float64])(x)


def sigmoid64(x: np.ndarray) -> np.ndarray:
  with np.errstate(all="ignore"):
    return np.where(x >= 0, 1 / (1 + np.exp(-x)), np.exp(x) / (1 + np.exp(x)))


def softplus64(x: np.ndarray, beta: float = 1.0, threshold: float = 20.0) -> np.ndarray:
  return np.where(x * beta > threshold, x, np.logaddexp(0, x * beta) / beta)


erf64, erfc64 = vectorized(math.erf), vectorized(math.erfc)


def gelu_tanh64(x: np.ndarray) -> np.ndarray:
  inner = math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)
  return x * sigmoid64(2 * inner)  # 0.5 * (1 + tanh(u)) without its cancellation


# *** float unary functions: values in ulps over the whole float32 range ***

SELU_ALPHA, SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946

# name: (rawgrad call, float64 reference, max ulp)
UNARY: dict[str, tuple[Callable[[Tensor], Tensor], Callable[[np.ndarray], np.ndarray], float]] = {
  "exp": (mixin.exp, np.exp, 1),
  "expm1": (lambda t: t.expm1(), np.expm1, 3),
  "exp2": (lambda t: t.exp2(), np.exp2, 1),
  "log": (lambda t: t.log(), np.log, 2),
  "log2": (lambda t: t.log2(), np.log2, 1),
  "log10": (lambda t: t.log10(), np.log10, 2),
  "log1p": (lambda t: t.log1p(), np.log1p, 3),
  "sqrt": (lambda t: t.sqrt(), np.sqrt, 0.5),
  "rsqrt": (lambda t: t.rsqrt(), lambda x: 1 / np.sqrt(x), 1.5),
  "reciprocal": (lambda t: t.reciprocal(), lambda x: 1 / x, 0.5),
  "square": (lambda t: t.square(), np.square, 0.5),
  "abs": (lambda t: t.abs(), np.abs, 0),
  "neg": (lambda t: -t, np.negative, 0),
  "sign": (lambda t: t.sign(), lambda x: np.where(np.isnan(x), 0.0, np.sign(x) + 0.0), 0),   # PyTorch: 0 for nan
  "sin": (lambda t: t.sin(), np.sin, 1),
  "cos": (lambda t: t.cos(), np.cos, 1),
  "tan": (lambda t: t.tan(), np.tan, 1),
  "atan": (lambda t: t.atan(), np.arctan, 1),
  "asin": (lambda t: t.asin(), np.arcsin, 1),
  "acos": (lambda t: t.acos(), np.arccos, 1),
  "tanh": (lambda t: t.tanh(), np.tanh, 2),
  "sigmoid": (lambda t: t.sigmoid(), sigmoid64, 2.5),
  "erf": (lambda t: t.erf(), erf64, 1),
  "erfc": (lambda t: t.erfc(), erfc64, 1),
  "relu": (lambda t: t.relu(), lambda x: np.maximum(x, 0) + 0.0, 0),
  "leaky_relu": (lambda t: t.leaky_relu(0.2), lambda x: np.where(x > 0, x, x * np.float32(0.2)), 0.5),
  "elu": (lambda t: t.elu(0.5), lambda x: np.where(x > 0, x, 0.5 * np.expm1(np.minimum(x, 0))), 3),
  "selu": (lambda t: t.selu(), lambda x: SELU_SCALE * np.where(x > 0, x, SELU_ALPHA * np.expm1(np.minimum(x, 0))), 4),
  "celu": (lambda t: t.celu(2.0), lambda x: np.where(x > 0, x, 2.0 * np.expm1(np.minimum(x, 0) / 2.0)), 3),
  "gelu": (lambda t: t.gelu(), lambda x: 0.5 * x * erfc64(-x * SQRT_HALF), 1),
  "gelu_tanh": (lambda t: t.gelu(approximate="tanh"), gelu_tanh64, 1),
  "silu": (lambda t: t.silu(), lambda x: x * sigmoid64(x), 3),
  "softplus": (lambda t: t.softplus(), softplus64, 3),
  "softplus_beta": (lambda t: t.softplus(beta=2.0, threshold=10.0), lambda x: softplus64(x, 2.0, 10.0), 3),
  "mish": (lambda t: t.mish(), lambda x: x * np.tanh(softplus64(x)), 4),
  "hardtanh": (lambda t: t.hardtanh(-2.0, 3.0), lambda x: np.clip(x, -2.0, 3.0), 0),
  "relu6": (lambda t: t.relu6(), lambda x: np.clip(x, 0.0, 6.0), 0),
  "hardsigmoid": (lambda t: t.hardsigmoid(), lambda x: np.clip(x + 3, 0, 6) / 6, 1),
  "hardswish": (lambda t: t.hardswish(), lambda x: x * np.clip(x + 3, 0, 6) / 6, 2),
  "softsign": (lambda t: t.softsign(), lambda x: x / (1 + np.abs(x)), 1.5),
  "logsigmoid": (lambda t: t.logsigmoid(), lambda x: -np.logaddexp(0, -x), 3),
  "floor": (lambda t: t.floor(), np.floor, 0),
  "ceil": (lambda t: t.ceil(), np.ceil, 0),
  "trunc": (lambda t: t.trunc(), np.trunc, 0),
  "round": (lambda t: t.round(), np.round, 0),
  "frac": (lambda t: t.frac(), lambda x: x - np.trunc(x), 0),
  "pow_3": (lambda t: t ** 3, lambda x: x ** 3, 0.5),
  "pow_-2": (lambda t: t ** -2, lambda x: x ** -2.0, 0.5),
  "pow_0": (lambda t: t ** 0, lambda x: x ** 0.0, 0),
  "pow_2.5": (lambda t: t ** 2.5, lambda x: x ** 2.5, 0.5),
  "pow_100": (lambda t: t ** 100, lambda x: x ** 100.0, 0.5),
  "rpow_3": (lambda t: 3 ** t, lambda x: 3.0 ** x, 0.5),
  "rpow_-2": (lambda t: (-2.0) ** t, lambda x: (-2.0) ** x, 0.5),
}
# zero signs the references give that PyTorch does not promise (max and clip pick either zero)
UNSIGNED_ZEROS = {"relu", "relu6", "hardtanh", "hardsigmoid", "hardswish", "softsign", "frac", "selu", "elu", "celu",
                  "leaky_relu", "mish", "silu", "gelu", "gelu_tanh"}


@pytest.mark.parametrize("name", list(UNARY))
def test_unary_float32_over_the_whole_range(name: str) -> None:
  call, reference, max_ulp = UNARY[name]
  result = call(strided(GRID))
  assert result.dtype == dtypes.float32 and result.shape == GRID.shape
  with np.errstate(all="ignore"):
    expected = reference(GRID.astype(np.float64))
  assert_ulp(result.numpy(), expected, max_ulp, GRID, signed_zeros=name not in UNSIGNED_ZEROS)


@pytest.mark.parametrize("name", ["exp", "tanh", "sigmoid", "erf", "erfc", "gelu", "cos", "atan", "log1p", "silu"])
def test_unary_float16_rounds_once(name: str) -> None:
  call, reference, _ = UNARY[name]
  grid = np.concatenate([np.geomspace(1e-7, 6e4, 600), -np.geomspace(1e-7, 6e4, 600),
                         np.linspace(-12, 12, 400)]).astype(np.float16)
  result = call(Tensor(grid))
  assert result.dtype == dtypes.float16
  with np.errstate(all="ignore"):
    expected = reference(grid.astype(np.float64))
  # computed in float32 and rounded to float16 once more
  assert_ulp(result.numpy(), expected, 0.51, grid, signed_zeros=False)


@pytest.mark.parametrize("name", ["exp", "expm1", "log1p", "tanh", "sigmoid", "erf", "erfc", "atan", "cos", "tan"])
def test_unary_float64(name: str) -> None:
  call, reference, _ = UNARY[name]
  rng = np.random.default_rng(1)
  magnitudes = np.geomspace(1e-300, 1e300, 300)
  grid = np.concatenate([[0.0, -0.0, INF, -INF, NAN], magnitudes, -magnitudes, rng.uniform(-30, 30, 300),
                         rng.uniform(-1e5, 1e5, 100)])
  if name in ("cos", "tan"): grid = grid[np.abs(grid) < 1e5]  # beyond 2**19 * pi/2 only absolutely accurate
  result = call(Tensor(grid))
  assert result.dtype == dtypes.float64
  with np.errstate(all="ignore"):
    expected = reference(grid)
  assert_ulp(result.numpy(), expected, 4, grid, signed_zeros=False)


def test_zero_dimensional_and_empty_shapes() -> None:
  scalar = Tensor(np.array([0.5], np.float32)).reshape(())
  assert scalar.tanh().shape == () and scalar.tanh().numpy() == np.float32(np.tanh(0.5))
  assert_exact((scalar % Tensor(np.array([0.3, -0.3], np.float32))).numpy(), np.float32(0.5) % np.float32([0.3, -0.3]))
  empty = Tensor(np.zeros((0, 3), np.float32))
  for result in (empty.erf(), empty % 2, empty.atan2(Tensor(np.ones((1, 3), np.float32))), empty ** 2.5):
    assert result.shape == (0, 3) and result.numpy().shape == (0, 3)


def test_saturating_functions_stay_finite() -> None:
  x = Tensor(np.array([-1e4, -100.0, -30.0, 30.0, 100.0, 1e4], np.float32))
  assert_exact(x.tanh().numpy(), np.array([-1, -1, -1, 1, 1, 1], np.float32))
  assert_exact(x.sigmoid().numpy()[3:], np.array([1, 1, 1], np.float32))
  assert_exact(x.softplus().numpy()[3:], np.array([30, 100, 1e4], np.float32))
  assert_exact(x.logsigmoid().numpy()[:3], np.array([-1e4, -100, -30], np.float32))
  assert_exact(x.erf().numpy(), np.array([-1, -1, -1, 1, 1, 1], np.float32))
  assert_exact(mixin.exp(x).numpy()[:1], np.zeros(1, np.float32))
  assert 0 < mixin.exp(x).numpy()[1] < 1e-43 and 0 < x.sigmoid().numpy()[1] < 1e-43


def test_cos_and_tan_of_huge_arguments() -> None:
  x = np.array([1e4, 12345.678, 1e6, 3e7, 1e10, 1e20, 3.4e38, 8388607.5, -5e8], np.float32)
  assert_ulp(Tensor(x).cos().numpy(), np.cos(x.astype(np.float64)), 1, x)
  assert_ulp(Tensor(x).tan().numpy(), np.tan(x.astype(np.float64)), 1, x)
  assert_ulp(Tensor(x).sin().numpy(), np.sin(x.astype(np.float64)), 1, x)


def test_float_functions_of_int_tensors_are_float32() -> None:
  ints = np.array([-3, -1, 0, 1, 2, 7], np.int32)
  for name in ("sigmoid", "tanh", "erf", "cos", "expm1", "log1p", "gelu", "silu"):
    result = UNARY[name][0](Tensor(ints))
    assert result.dtype == dtypes.float32, name
    with np.errstate(all="ignore"):
      assert_ulp(result.numpy(), UNARY[name][1](ints.astype(np.float64)), 4, ints, signed_zeros=False)


def test_signs_magnitudes_and_rounding_keep_int_dtypes() -> None:
  ints = np.array([-128, -7, -1, 0, 1, 5, 127], np.int8)
  x = Tensor(ints)
  assert_exact(x.abs().numpy(), np.abs(ints))
  assert_exact(x.sign().numpy(), np.sign(ints))
  assert_exact(x.square().numpy(), np.square(ints))
  for rounding in ("floor", "ceil", "round", "trunc"):
    assert_exact(getattr(x, rounding)().numpy(), ints)
  unsigned = np.array([0, 1, 200, 255], np.uint8)
  assert_exact(Tensor(unsigned).abs().numpy(), unsigned)
  assert_exact(Tensor(unsigned).sign().numpy(), np.sign(unsigned))


def test_round_half_to_even_and_decimals() -> None:
  x = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 0.49999997, 8388607.5, -3.5, 1.2345, -1.2355, 1e30], np.float32)
  assert_exact(Tensor(x).round().numpy(), np.round(x))
  for decimals in (2, -1):
    scale = np.float32(10.0 ** abs(decimals))
    expected = np.round(x * scale) / scale if decimals > 0 else np.round(x / scale) * scale
    assert_exact(Tensor(x).round(decimals).numpy(), expected)


# *** float binary functions: every pair of special values, broadcast, and random pairs ***

SPECIAL = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, -3.0, 2.5, 7.25, 1e-45, -1e-30, 1e30, F32_MAX,
                    -F32_MAX, INF, -INF, NAN], np.float32)


def random_pairs(count: int = 3000) -> tuple[np.ndarray, np.ndarray]:
  rng = np.random.default_rng(2)
  scale = lambda: 10.0 ** rng.integers(-38, 38, count)
  x = np.concatenate([rng.standard_normal(count) * scale(), rng.uniform(-20, 20, count)])
  y = np.concatenate([rng.standard_normal(count) * scale(), rng.uniform(-20, 20, count)])
  return x.astype(np.float32), y.astype(np.float32)


def xlogy64(x: np.ndarray, y: np.ndarray) -> np.ndarray:
  return np.where(x == 0, np.where(np.isnan(y), NAN, 0.0), x * np.log(np.where(x == 0, 1.0, y)))


# name: (rawgrad call, float64 reference, max ulp)
BINARY: dict[str, tuple[Callable[[Tensor, Tensor], Tensor], Callable[[np.ndarray, np.ndarray], np.ndarray], float]] = {
  "div": (lambda x, y: x / y, np.divide, 0.5),
  "atan2": (lambda x, y: x.atan2(y), np.arctan2, 1),
  "hypot": (lambda x, y: x.hypot(y), np.hypot, 1),
  "logaddexp": (lambda x, y: x.logaddexp(y), np.logaddexp, 3),
  "logaddexp2": (lambda x, y: x.logaddexp2(y), np.logaddexp2, 3),
  "xlogy": (lambda x, y: x.xlogy(y), xlogy64, 2),
  "pow": (lambda x, y: x ** y, np.power, 0.5),
  "maximum": (lambda x, y: x.maximum(y), np.maximum, 0),
  "minimum": (lambda x, y: x.minimum(y), np.minimum, 0),
}
# ops that are exact in float32: numpy's own float32 result is the reference
EXACT_BINARY: dict[str, tuple[Callable[[Tensor, Tensor], Tensor], Callable[[np.ndarray, np.ndarray], np.ndarray]]] = {
  "fmod": (lambda x, y: x.fmod(y), np.fmod),
  "remainder": (lambda x, y: x % y, np.remainder),
  "floor_divide": (lambda x, y: x // y, np.floor_divide),
  "div_floor": (lambda x, y: mixin.div(x, y, rounding_mode="floor"), np.floor_divide),
  "div_trunc": (lambda x, y: mixin.div(x, y, rounding_mode="trunc"), lambda x, y: np.trunc(x / y)),
}


@pytest.mark.parametrize("name", list(BINARY))
def test_binary_float32_special_pairs_broadcast(name: str) -> None:
  call, reference, max_ulp = BINARY[name]
  x, y = SPECIAL.reshape(-1, 1), SPECIAL.reshape(1, -1)
  result = call(strided(x), Tensor(y))
  assert result.shape == (len(SPECIAL), len(SPECIAL)) and result.dtype == dtypes.float32
  with np.errstate(all="ignore"):
    expected = reference(x.astype(np.float64), y.astype(np.float64))
  assert_ulp(result.numpy(), expected, max_ulp, x + 0 * y, signed_zeros=name not in ("maximum", "minimum"))


@pytest.mark.parametrize("name", list(BINARY))
def test_binary_float32_random_pairs(name: str) -> None:
  call, reference, max_ulp = BINARY[name]
  x, y = random_pairs()
  if name == "pow": x = np.abs(x) ** 0.25 * np.sign(x)  # results mostly in range
  with np.errstate(all="ignore"):
    expected = reference(x.astype(np.float64), y.astype(np.float64))
  assert_ulp(call(Tensor(x), Tensor(y)).numpy(), expected, max_ulp, x, signed_zeros=False)


@pytest.mark.parametrize("name", list(EXACT_BINARY))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_division_and_remainder_are_exact(name: str, dtype: Any) -> None:
  call, reference = EXACT_BINARY[name]
  x, y = random_pairs(1000)
  x, y = x.astype(dtype), y.astype(dtype)
  if dtype == np.float64: x, y = x * 1e250, y * 1e-250  # quotients up to 2**2000
  special_x, special_y = np.broadcast_arrays(SPECIAL.reshape(-1, 1), SPECIAL.reshape(1, -1))
  x = np.concatenate([x, special_x.ravel().astype(dtype)])
  y = np.concatenate([y, special_y.ravel().astype(dtype)])
  with np.errstate(all="ignore"):
    expected = reference(x, y)
  assert_exact(call(Tensor(x), Tensor(y)).numpy(), expected)


def test_float_remainder_takes_the_sign_of_the_divisor() -> None:
  x = Tensor([5.5, -5.5, 5.5, -5.5, 1.0, -1.0, 4.0, -4.0])
  y = Tensor([2.0, 2.0, -2.0, -2.0, INF, INF, 2.0, -2.0])
  assert_exact((x % y).numpy(), np.array([1.5, 0.5, -0.5, -1.5, 1.0, INF, 0.0, -0.0], np.float32))
  assert list(np.signbit((x % y).numpy())[-2:]) == [False, True]
  assert_exact((x // y).numpy(), np.array([2, -3, -3, 2, 0, -1, 2, 2], np.float32))


def test_scalar_operands_and_reversed_operators() -> None:
  x = np.array([-7.5, -1.0, 0.25, 3.0, 10.0], np.float32)
  t = Tensor(x)
  assert_exact((t // 2).numpy(), x // np.float32(2))
  assert_exact((7 // t).numpy(), np.float32(7) // x)
  assert_exact((t % 2.5).numpy(), x % np.float32(2.5))
  assert_exact((-7 % t).numpy(), np.float32(-7) % x)
  assert_ulp((2 ** t).numpy(), 2.0 ** x.astype(np.float64), 0.5)
  assert_ulp((t.abs() ** 0.5).numpy(), np.abs(x.astype(np.float64)) ** 0.5, 0.5)


def test_lerp_matches_pytorch_formula() -> None:
  rng = np.random.default_rng(3)
  start, end = rng.uniform(-10, 10, (2, 64)).astype(np.float32)
  weight = rng.uniform(-0.5, 1.5, 64).astype(np.float32)
  expected = np.where(np.abs(weight) < 0.5, start + weight * (end - start), end - (end - start) * (1 - weight))
  assert_exact(Tensor(start).lerp(Tensor(end), Tensor(weight)).numpy(), expected)
  for scalar in (0.25, 0.75, 1.0):
    scalar_weight = np.float32(scalar)
    expected = start + scalar_weight * (end - start) if scalar < 0.5 else end - (end - start) * (1 - scalar_weight)
    assert_exact(Tensor(start).lerp(Tensor(end), scalar).numpy(), expected)
  assert_exact(Tensor(start).lerp(Tensor(end), 1.0).numpy(), end)


def test_clamp_bounds_of_every_kind() -> None:
  x = np.array([[-5.0, -1.0, 0.0], [2.0, 7.0, NAN]], np.float32)
  low, high = np.array([-2.0, 0.5, 1.0], np.float32), np.array([[1.0], [3.0]], np.float32)
  t = strided(x)
  assert_exact(t.clamp(-1.5, 2.5).numpy(), np.clip(x, -1.5, 2.5))
  assert_exact(t.clamp(min=0).numpy(), np.maximum(x, 0))
  assert_exact(t.clamp(max=0).numpy(), np.minimum(x, 0))
  assert_exact(t.clamp(Tensor(low), Tensor(high)).numpy(), np.minimum(np.maximum(x, low), high))
  assert_exact(t.clip(3, 1).numpy(), np.where(np.isnan(x), x, 1).astype(np.float32))  # min > max gives max
  ints = np.array([-2 ** 31, -5, 0, 5, 2 ** 31 - 1], np.int32)
  assert_exact(Tensor(ints).clamp(-2 ** 31, 3).numpy(), np.clip(ints, -2 ** 31, 3))
  assert Tensor(ints).clamp(0.5).dtype == dtypes.float32
  assert np.isnan(t.clamp(Tensor([NAN]), 1.0).numpy()).all() and np.isnan(t.clamp(max=NAN).numpy()).all()
  with pytest.raises(ValueError, match="at least one"): t.clamp()


# *** integers: exact at the limits of each dtype ***

INT_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint32]


def int_values(dtype: Any) -> np.ndarray:
  info = np.iinfo(dtype)
  candidates = {info.min, info.min + 1, -7, -3, -2, -1, 0, 1, 2, 3, 7, info.max - 1, info.max}
  return np.array(sorted(v for v in candidates if info.min <= v <= info.max), dtype)


def python_floor_divide(a: int, b: int, dtype: Any) -> int:
  return wrap(a // b, dtype) if b else 0


def wrap(value: int, dtype: Any) -> int:
  return int(np.array(value & ((1 << 64) - 1), np.uint64).astype(dtype))


def int_reference(function: Callable[[int, int], int], x: np.ndarray, y: np.ndarray, dtype: Any) -> np.ndarray:
  a, b = np.broadcast_arrays(x, y)
  flat = [wrap(function(int(p), int(q)), dtype) for p, q in zip(a.ravel(), b.ravel())]
  return np.array(flat, dtype).reshape(a.shape)


def c_remainder(a: int, b: int) -> int:
  return a - b * int(a / b) if abs(a) < 2 ** 52 else a - b * (abs(a) // abs(b)) * (1 if (a < 0) == (b < 0) else -1)


def trunc_divide(a: int, b: int) -> int:
  return (abs(a) // abs(b)) * (1 if (a < 0) == (b < 0) else -1) if b else 0


def shift_left(a: int, b: int, bits: int) -> int:
  return a << b if 0 <= b < bits else 0


def shift_right(a: int, b: int, bits: int) -> int:
  return a >> b if 0 <= b < bits else (-1 if a < 0 else 0)


# name: (rawgrad call, Python reference on ints (wrapped to the dtype afterwards))
INT_BINARY: dict[str, tuple[Callable[[Tensor, Tensor], Tensor], Callable[[int, int], int]]] = {
  "floor_divide": (lambda x, y: x // y, lambda a, b: a // b if b else 0),
  "remainder": (lambda x, y: x % y, lambda a, b: a % b if b else 0),
  "fmod": (lambda x, y: x.fmod(y), lambda a, b: c_remainder(a, b) if b else 0),
  "div_trunc": (lambda x, y: mixin.div(x, y, rounding_mode="trunc"), trunc_divide),
  "div_floor": (lambda x, y: mixin.div(x, y, rounding_mode="floor"), lambda a, b: a // b if b else 0),
  "and": (lambda x, y: x & y, lambda a, b: a & b),
  "or": (lambda x, y: x.bitwise_or(y), lambda a, b: a | b),
  "xor": (lambda x, y: x ^ y, lambda a, b: a ^ b),
  "add": (lambda x, y: mixin.add(x, y), lambda a, b: a + b),
  "sub": (lambda x, y: mixin.sub(x, y), lambda a, b: a - b),
  "mul": (lambda x, y: mixin.mul(x, y), lambda a, b: a * b),
  "maximum": (lambda x, y: x.maximum(y), max),
  "minimum": (lambda x, y: x.minimum(y), min),
}


@pytest.mark.parametrize("name", list(INT_BINARY))
@pytest.mark.parametrize("dtype", INT_DTYPES, ids=lambda d: np.dtype(d).name)
def test_integer_binary_ops_at_the_limits(name: str, dtype: Any) -> None:
  call, reference = INT_BINARY[name]
  values = int_values(dtype)
  x, y = values.reshape(-1, 1), values.reshape(1, -1)
  result = call(strided(x), Tensor(y))
  assert result.dtype == dtypes.from_numpy(dtype)
  assert_exact(result.numpy(), int_reference(reference, x, y, dtype))


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=lambda d: np.dtype(d).name)
def test_integer_powers_shifts_and_unary_ops(dtype: Any) -> None:
  values = int_values(dtype)
  bits = 8 * np.dtype(dtype).itemsize
  exponents = np.array([0, 1, 2, 3, 5, 8, 13, 31], dtype)
  x, e = values.reshape(-1, 1), exponents.reshape(1, -1)
  assert_exact((strided(x) ** Tensor(e)).numpy(), int_reference(lambda a, b: a ** b, x, e, dtype))
  assert_exact((Tensor(values) ** 7).numpy(), int_reference(lambda a, b: a ** 7, values, values, dtype))
  amounts = np.array([0, 1, 3, bits - 1, bits, bits + 5] + ([-1] if np.dtype(dtype).kind == "i" else []), dtype)
  s = amounts.reshape(1, -1)
  assert_exact((strided(x) << Tensor(s)).numpy(), int_reference(lambda a, b: shift_left(a, b, bits), x, s, dtype))
  assert_exact((strided(x) >> Tensor(s)).numpy(), int_reference(lambda a, b: shift_right(a, b, bits), x, s, dtype))
  assert_exact(Tensor(x).bitwise_left_shift(Tensor(s)).numpy(),
               int_reference(lambda a, b: shift_left(a, b, bits), x, s, dtype))
  assert_exact(Tensor(x).bitwise_right_shift(Tensor(s)).numpy(),
               int_reference(lambda a, b: shift_right(a, b, bits), x, s, dtype))
  t = Tensor(values)
  assert_exact((~t).numpy(), np.invert(values))
  assert_exact(t.bitwise_not().numpy(), np.invert(values))
  assert_exact(t.abs().numpy(), np.abs(values))
  assert_exact(t.sign().numpy(), np.sign(values))


def test_integer_special_cases() -> None:
  # PyTorch raises for integer division by zero, which a lazy tensor cannot; the result is numpy's 0
  x, zero = Tensor([7, -7, 0]), Tensor([0, 0, 0])
  for result in (x // zero, x % zero, x.fmod(zero), mixin.div(x, zero, rounding_mode="trunc")):
    assert_exact(result.numpy(), np.zeros(3, np.int32))
  # negative exponents of an int tensor: 1 for base 1, +-1 for base -1, 0 otherwise (PyTorch's rule)
  base, exponent = Tensor([1, -1, -1, 2, 0, -3]), Tensor([-1, -1, -2, -1, -3, -2])
  assert_exact((base ** exponent).numpy(), np.array([1, -1, 1, 0, 0, 0], np.int32))
  with pytest.raises(ValueError, match="negative integer power"): Tensor([1, 2]) ** -1
  assert_exact((2 ** Tensor([0, 1, 10, 30])).numpy(), np.array([1, 2, 1024, 2 ** 30], np.int32))
  assert_exact((Tensor([3], dtype=dtypes.int64) ** 39).numpy(), np.array([3 ** 39], np.int64))
  assert_exact((Tensor([3]) ** 1000001).numpy(), np.array([wrap(pow(3, 1000001, 2 ** 32), np.int32)], np.int32))
  # true division of ints is float32 of the float32 operands
  a, b = np.array([2 ** 31 - 1, -7, 1], np.int32), np.array([3, 2, 0], np.int32)
  assert_exact(mixin.div(Tensor(a), Tensor(b)).numpy(), a.astype(np.float32) / b.astype(np.float32))
  assert_exact((Tensor(a) / Tensor(b)).numpy(), a.astype(np.float32) / b.astype(np.float32))


# *** bool, bitwise and logical ***

def test_bool_bitwise_and_logical_ops() -> None:
  p = np.array([True, True, False, False])
  q = np.array([True, False, True, False])
  assert_exact((Tensor(p) & Tensor(q)).numpy(), p & q)
  assert_exact((Tensor(p) | Tensor(q)).numpy(), p | q)
  assert_exact((Tensor(p) ^ Tensor(q)).numpy(), p ^ q)
  assert_exact((~Tensor(p)).numpy(), ~p)
  assert_exact((True & Tensor(q)).numpy(), q)
  assert_exact(mixin.add(Tensor(p), Tensor(q)).numpy(), p | q)  # True + True is True
  assert_exact(mixin.mul(Tensor(p), Tensor(q)).numpy(), p & q)
  assert_exact((5 | Tensor([1, 2])).numpy(), np.array([5, 7], np.int32))
  assert_exact((6 ^ Tensor([3])).numpy(), np.array([5], np.int32))
  mixed = np.array([0.0, 2.5, NAN, -1.0], np.float32)
  ints = np.array([[0], [3]], np.int32)
  assert_exact(Tensor(mixed).logical_and(Tensor(ints)).numpy(), np.logical_and(mixed, ints))
  assert_exact(Tensor(mixed).logical_or(Tensor(ints)).numpy(), np.logical_or(mixed, ints))
  assert_exact(Tensor(mixed).logical_xor(Tensor(ints)).numpy(), np.logical_xor(mixed, ints))
  assert_exact(Tensor(mixed).logical_xor(True).numpy(), np.logical_xor(mixed, True))
  assert_exact(Tensor(mixed).logical_not().numpy(), np.logical_not(mixed))


def test_bitwise_ops_reject_floats_naming_the_dtype() -> None:
  x = Tensor([1.5, 2.0])
  with pytest.raises(TypeError, match="float32"): x.bitwise_and(Tensor([1, 2]))
  with pytest.raises(TypeError, match="int32 and the float 2.5"): Tensor([1, 2]).bitwise_or(2.5)
  with pytest.raises(TypeError, match="float32"): x.bitwise_xor(1)
  with pytest.raises(TypeError, match="float32"): x.bitwise_not()
  with pytest.raises(TypeError, match="float32"): x.__invert__()
  with pytest.raises(TypeError, match="float32"): x << 1
  with pytest.raises(TypeError, match="float64"): Tensor([1, 2]) >> Tensor(np.array([1.0, 2.0]))
  with pytest.raises(TypeError, match="bool"): Tensor([True]) << Tensor([True])
  assert_exact((Tensor([True]) << 1).numpy(), np.array([2], np.int32))  # bool with an int scalar promotes to int
  with pytest.raises(TypeError, match="float32"): 3 & x


def test_comparisons_by_name() -> None:
  x = np.array([[1.0, NAN, -0.0, 2.0, INF]], np.float32)
  y = np.array([[1.0], [NAN], [0.0], [3.0]], np.float32)
  t, u = strided(x), Tensor(y)
  for name, reference in (("eq", np.equal), ("ne", np.not_equal), ("lt", np.less), ("le", np.less_equal),
                          ("gt", np.greater), ("ge", np.greater_equal)):
    assert_exact(getattr(t, name)(u).numpy(), reference(x, y))
  assert_exact(Tensor([1, 5]).ge(2.5).numpy(), np.array([False, True]))


def test_classification() -> None:
  result = strided(GRID)
  assert_exact(result.isnan().numpy(), np.isnan(GRID))
  assert_exact(result.isinf().numpy(), np.isinf(GRID))
  assert_exact(result.isfinite().numpy(), np.isfinite(GRID))
  ints = Tensor([1, -2])
  assert_exact(ints.isnan().numpy(), np.array([False, False]))
  assert_exact(ints.isinf().numpy(), np.array([False, False]))
  assert_exact(ints.isfinite().numpy(), np.array([True, True]))


# *** dtypes, aliases and errors ***

@pytest.mark.parametrize("build, dtype", [
  (lambda: Tensor([1, 2]).sigmoid(), dtypes.float32),
  (lambda: Tensor([1, 2]) // 2, dtypes.int32),
  (lambda: Tensor([1, 2]) // 2.0, dtypes.float32),
  (lambda: Tensor([1, 2]) % Tensor([1, 2], dtype=dtypes.int64), dtypes.int64),
  (lambda: Tensor([1, 2]) ** 2, dtypes.int32),
  (lambda: Tensor([1, 2]) ** 2.0, dtypes.float32),
  (lambda: Tensor([1, 2]) ** 0.5, dtypes.float32),
  (lambda: 2 ** Tensor([1, 2]), dtypes.int32),
  (lambda: 2.5 ** Tensor([1, 2]), dtypes.float32),
  (lambda: Tensor([1.0], dtype=dtypes.float16) ** 2, dtypes.float16),
  (lambda: Tensor([1, 2]).abs(), dtypes.int32),
  (lambda: Tensor([1, 2]).atan2(Tensor([1.0, 2.0])), dtypes.float32),
  (lambda: Tensor([1.0], dtype=dtypes.float16).erf(), dtypes.float16),
  (lambda: Tensor([1.0], dtype=dtypes.bfloat16).tanh(), dtypes.bfloat16),
  (lambda: Tensor([1, 2], dtype=dtypes.int8) % 3, dtypes.int8),
  (lambda: Tensor([True]).logical_and(1), dtypes.bool),
  (lambda: mixin.div(Tensor([1, 2]), 2, rounding_mode="floor"), dtypes.int32),
  (lambda: mixin.div(Tensor([1, 2]), 2), dtypes.float32),
  (lambda: Tensor([1.0]).hypot(Tensor(np.array([1.0]))), dtypes.float64),
])
def test_result_dtypes(build: Callable[[], Tensor], dtype: Any) -> None:
  assert build().dtype == dtype


def test_add_and_sub_with_alpha() -> None:
  x, y = Tensor([1.0, 2.0]), Tensor([3.0, 5.0])
  assert_exact(mixin.add(x, y, alpha=2).numpy(), np.array([7, 12], np.float32))
  assert_exact(mixin.sub(x, y, alpha=0.5).numpy(), np.array([-0.5, -0.5], np.float32))
  assert_exact(mixin.add(x, 1).numpy(), np.array([2, 3], np.float32))
  assert_exact(mixin.sub(x, 1, reverse=True).numpy(), np.array([0, -1], np.float32))
  assert_exact(mixin.mul(Tensor([2, 3]), 4).numpy(), np.array([8, 12], np.int32))
  with pytest.raises(TypeError, match="bool"): mixin.sub(Tensor([True]), Tensor([False]))


def test_aliases() -> None:
  x = Tensor([-1.5, 0.25, 2.0])
  for alias, name in (("clip", "clamp"), ("mod", "remainder"), ("swish", "silu"), ("arctan", "atan"), ("fix", "trunc")):
    assert getattr(ElementwiseOps, alias) is getattr(ElementwiseOps, name)
  assert_exact(x.arctan2(Tensor([1.0])).numpy(), x.atan2(Tensor([1.0])).numpy())
  assert_exact(abs(x).numpy(), np.array([1.5, 0.25, 2.0], np.float32))
  assert +x is x


def test_errors_name_the_offending_value() -> None:
  with pytest.raises(ValueError, match="'round'"): mixin.div(Tensor([1.0]), 2, rounding_mode="round")
  with pytest.raises(ValueError, match="'exact'"): Tensor([1.0]).gelu(approximate="exact")
  with pytest.raises(TypeError, match="bool"): Tensor([True]) // Tensor([True])
  with pytest.raises(TypeError, match="bool"): Tensor([True]) ** Tensor([True])
  with pytest.raises(TypeError, match="int32"): Tensor([1]).lerp(Tensor([2]), 0.5)


def test_tensor_methods_come_from_the_mixin() -> None:
  shadowed = [name for name in ("add", "sub", "mul", "div", "exp", "__and__", "__or__", "__xor__")
              if getattr(Tensor, name) is not getattr(ElementwiseOps, name, None)]
  assert not shadowed, f"tensor.py shadows ElementwiseOps.{', .'.join(shadowed)}"


# *** gradients: autograd against central finite differences in float64 ***

def central_difference(function: Callable[[Tensor], Tensor], x: np.ndarray) -> np.ndarray:
  step = 1e-6 * np.maximum(1.0, np.abs(x))
  return (function(Tensor(x + step)).numpy() - function(Tensor(x - step)).numpy()) / (2 * step)


def autograd(function: Callable[..., Tensor], *inputs: np.ndarray) -> list[np.ndarray]:
  # 2-d inputs: see the module docstring
  assert all(x.ndim == 2 for x in inputs)
  tensors = [Tensor(x) for x in inputs]
  return [g.numpy() for g in function(*tensors).sum().gradient(*tensors)]


def samples(low: float, high: float, seed: int = 4) -> np.ndarray:
  return np.random.default_rng(seed).uniform(low, high, (6, 8))


# name: (function, sample domain); smooth functions also get 0.0 (the sign switch of many formulas)
GRADIENT_UNARY: dict[str, tuple[Callable[[Tensor], Tensor], tuple[float, float], bool]] = {
  "exp": (mixin.exp, (-20, 20), True),
  "expm1": (lambda t: t.expm1(), (-20, 20), True),
  "log1p": (lambda t: t.log1p(), (-0.9, 50), True),
  "log10": (lambda t: t.log10(), (0.01, 100), False),
  "rsqrt": (lambda t: t.rsqrt(), (0.01, 100), False),
  "square": (lambda t: t.square(), (-5, 5), True),
  "abs": (lambda t: t.abs(), (-5, 5), False),
  "cos": (lambda t: t.cos(), (-30, 30), True),
  "tan": (lambda t: t.tan(), (-1.4, 1.4), True),
  "atan": (lambda t: t.atan(), (-10, 10), True),
  "asin": (lambda t: t.asin(), (-0.95, 0.95), True),
  "acos": (lambda t: t.acos(), (-0.95, 0.95), True),
  "tanh": (lambda t: t.tanh(), (-8, 8), True),
  "sigmoid": (lambda t: t.sigmoid(), (-30, 30), True),
  "erf": (lambda t: t.erf(), (-5, 5), True),
  "erfc": (lambda t: t.erfc(), (-5, 8), True),
  "leaky_relu": (lambda t: t.leaky_relu(0.2), (-5, 5), False),
  "elu": (lambda t: t.elu(0.5), (-5, 5), False),
  "selu": (lambda t: t.selu(), (-5, 5), False),
  "celu": (lambda t: t.celu(2.0), (-5, 5), True),
  "gelu": (lambda t: t.gelu(), (-8, 8), True),
  "gelu_tanh": (lambda t: t.gelu(approximate="tanh"), (-8, 8), True),
  "silu": (lambda t: t.silu(), (-30, 30), True),
  "softplus": (lambda t: t.softplus(beta=2.0), (-30, 30), True),
  "mish": (lambda t: t.mish(), (-50, 30), True),
  "hardtanh": (lambda t: t.hardtanh(-2.0, 3.0), (-5, 5), False),
  "relu6": (lambda t: t.relu6(), (-3, 9), False),
  "hardsigmoid": (lambda t: t.hardsigmoid(), (-5, 5), False),
  "hardswish": (lambda t: t.hardswish(), (-5, 5), False),
  "softsign": (lambda t: t.softsign(), (-5, 5), True),
  "logsigmoid": (lambda t: t.logsigmoid(), (-30, 30), True),
  "sign": (lambda t: t.sign(), (-5, 5), False),
  "floor": (lambda t: t.floor(), (-5, 5), False),
  "round": (lambda t: t.round(), (-5, 5), False),
  "frac": (lambda t: t.frac(), (-5, 5), False),
  "pow_3": (lambda t: t ** 3, (-3, 3), True),
  "pow_-2": (lambda t: t ** -2, (0.5, 3), False),
  "pow_2.5": (lambda t: t ** 2.5, (0.1, 3), False),
  "pow_sqrt": (lambda t: t ** 0.5, (0.1, 3), False),
  "rpow": (lambda t: 2.5 ** t, (-3, 3), True),
}


@pytest.mark.parametrize("name", list(GRADIENT_UNARY))
def test_unary_gradients(name: str) -> None:
  function, (low, high), smooth_at_zero = GRADIENT_UNARY[name]
  x = samples(low, high)
  if smooth_at_zero: x[0, 0] = 0.0
  (gradient,) = autograd(function, x)
  np.testing.assert_allclose(gradient, central_difference(function, x), rtol=1e-6, atol=1e-8)


def test_the_tanh_gelus_gradient_is_one_exponential_rounded_once() -> None:
  """gelu(x, 'tanh')' = sigmoid(z) + x z' sigmoid(z) sigmoid(-z) with z = 2u, formed in float64 from one
  exponential and one division and rounded once: within half an ulp (and a little) of the float64 derivative over
  the float32 range, where the gradient taken through the forward's arithmetic formed its sigmoid's halves and
  divisions again."""
  from rawgrad.compiler.ir import Ops
  from rawgrad.compiler.rangeify import create_schedule
  rng = np.random.default_rng(3)
  x = np.concatenate([np.linspace(-12, 12, 4001), rng.standard_normal(4000) * 3]).astype(np.float32)
  t = Tensor(x, requires_grad=True)
  t.gelu(approximate="tanh").sum().backward()
  nodes = [node for item in create_schedule([t.grad.uop]).items for node in item.ast.toposort]
  assert [sum(node.op is op for node in nodes) for op in (Ops.EXP2, Ops.FDIV)] == [1, 1]  # through the forward: 1, 4
  x64 = x.astype(np.float64)
  z = 2 * math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64 ** 3)
  slope = 2 * math.sqrt(2 / math.pi) * (1 + 3 * 0.044715 * x64 ** 2)
  expected = sigmoid64(z) + x64 * slope * sigmoid64(z) * sigmoid64(-z)
  assert_ulp(t.grad.numpy(), expected, 0.51, x, signed_zeros=False)


GRADIENT_BINARY: dict[str, tuple[Callable[[Tensor, Tensor], Tensor], tuple[float, float], tuple[float, float]]] = {
  "atan2": (lambda y, x: y.atan2(x), (-5, 5), (-5, 5)),
  "hypot": (lambda x, y: x.hypot(y), (-5, 5), (-5, 5)),
  "logaddexp": (lambda x, y: x.logaddexp(y), (-20, 20), (-20, 20)),
  "logaddexp2": (lambda x, y: x.logaddexp2(y), (-20, 20), (-20, 20)),
  "xlogy": (lambda x, y: x.xlogy(y), (-3, 3), (0.1, 5)),
  "pow": (lambda x, y: x ** y, (0.1, 4), (-3, 3)),
  "div": (lambda x, y: mixin.div(x, y), (-5, 5), (0.5, 5)),
  "fmod": (lambda x, y: x.fmod(y), (-20, 20), (0.7, 3)),
  "remainder": (lambda x, y: x % y, (-20, 20), (-3, -0.7)),
  "sub_alpha": (lambda x, y: mixin.sub(x, y, alpha=2.5), (-5, 5), (-5, 5)),
  "lerp": (lambda x, y: x.lerp(y, 0.3), (-5, 5), (-5, 5)),
}


@pytest.mark.parametrize("name", list(GRADIENT_BINARY))
def test_binary_gradients(name: str) -> None:
  function, x_domain, y_domain = GRADIENT_BINARY[name]
  x, y = samples(*x_domain, seed=5), samples(*y_domain, seed=6)
  x_gradient, y_gradient = autograd(function, x, y)
  np.testing.assert_allclose(x_gradient, central_difference(lambda t: function(t, Tensor(y)), x), rtol=1e-6,
                             atol=1e-8)
  np.testing.assert_allclose(y_gradient, central_difference(lambda t: function(Tensor(x), t), y), rtol=1e-6,
                             atol=1e-8)


def test_lerp_gradient_with_tensor_weight() -> None:
  start, end, weight = samples(-5, 5, seed=7), samples(-5, 5, seed=8), samples(-0.4, 1.4, seed=9)
  gradients = autograd(lambda s, e, w: s.lerp(e, w), start, end, weight)
  np.testing.assert_allclose(gradients[0], 1 - weight, rtol=1e-12)
  np.testing.assert_allclose(gradients[1], weight, rtol=1e-12)
  np.testing.assert_allclose(gradients[2], end - start, rtol=1e-12)


EXTREMES = np.array([[-1e300, -1e4, -750.0, -40.0, 40.0, 750.0, 1e4, 1e300]])


@pytest.mark.parametrize("name, derivative", [
  ("sigmoid", lambda x: sigmoid64(x) * sigmoid64(-x)),
  ("tanh", lambda x: 4 * sigmoid64(2 * x) * sigmoid64(-2 * x)),
  ("softplus", lambda x: sigmoid64(2 * x)),
  ("logsigmoid", lambda x: sigmoid64(-x)),
  ("erf", lambda x: 2 / math.sqrt(math.pi) * np.exp(-x * x)),
  ("erfc", lambda x: -2 / math.sqrt(math.pi) * np.exp(-x * x)),
  ("atan", lambda x: 1 / (1 + x * x)),
  ("silu", lambda x: sigmoid64(x) * (1 + x * sigmoid64(-x))),
  ("gelu", lambda x: 0.5 * erfc64(-x * SQRT_HALF) + x * np.exp(-x * x / 2) / math.sqrt(2 * math.pi)),
  ("elu", lambda x: np.where(x > 0, 1.0, 0.5 * np.exp(x))),
  ("exp", np.exp),
  ("expm1", np.exp),
])
def test_gradients_at_extreme_inputs_are_exact_limits(name: str, derivative: Callable) -> None:
  """The gradient of a branch not taken is 0, not 0 * inf = nan."""
  function = GRADIENT_UNARY[name][0]
  x = EXTREMES if name not in ("exp", "expm1") else EXTREMES[:, :4]
  (gradient,) = autograd(function, x)
  with np.errstate(all="ignore"):
    expected = derivative(x)
  np.testing.assert_allclose(gradient, np.nan_to_num(expected, nan=0.0), rtol=1e-9, atol=1e-300)


@pytest.mark.parametrize("name", ["mish", "gelu_tanh", "celu", "selu", "log1p", "softsign", "hardswish"])
def test_gradients_at_extreme_inputs_are_finite(name: str) -> None:
  x = EXTREMES[:, 1:-1] if name != "log1p" else np.abs(EXTREMES)
  (gradient,) = autograd(GRADIENT_UNARY[name][0], x)
  assert np.isfinite(gradient).all(), f"{name}' at {x}: {gradient}"


def test_gradients_at_kinks_follow_pytorch() -> None:
  x = np.array([[-2.0, -1.0, 0.0, 0.5, 1.0, 2.0]])
  low, high = np.full_like(x, -1.0), np.full_like(x, 1.0)
  x_gradient, low_gradient, high_gradient = autograd(lambda t, lo, hi: t.clamp(lo, hi), x, low, high)
  assert_exact(x_gradient, np.array([[0, 1, 1, 1, 1, 0]], np.float64))  # the bounds themselves included
  assert_exact(low_gradient, np.array([[1, 0, 0, 0, 0, 0]], np.float64))
  assert_exact(high_gradient, np.array([[0, 0, 0, 0, 0, 1]], np.float64))
  assert_exact(autograd(lambda t: t.hardtanh(), x)[0], np.array([[0, 0, 1, 1, 0, 0]], np.float64))
  assert_exact(autograd(lambda t: t.relu6(), x)[0], np.array([[0, 0, 0, 1, 1, 1]], np.float64))
  # by the output, as PyTorch's: 0 where it is 0 (-0.0 and 0 included), 1 where it is positive or nan
  kinks = np.array([[-2.0, -0.0, 0.0, 0.5, np.nan]])
  assert_exact(autograd(lambda t: t.relu(), kinks)[0], np.array([[0, 0, 0, 1, 1]], np.float64))
  assert_exact(autograd(lambda t: t.abs(), x)[0], np.array([[-1, -1, 0, 1, 1, 1]], np.float64))
  bounds = np.array([[-3.0, 3.0]])
  assert_exact(autograd(lambda t: t.hardsigmoid(), bounds)[0], np.array([[0.0, 0.0]]))
  assert_exact(autograd(lambda t: t.hardswish(), bounds)[0], np.array([[-0.5, 1.5]]))
  assert_exact(autograd(lambda t: t.leaky_relu(0.1), x)[0], np.array([[0.1, 0.1, 0.1, 1, 1, 1]], np.float64))
  assert_exact(autograd(lambda t: t.elu(0.5), x)[0][:, 2:], np.array([[0.5, 1, 1, 1]], np.float64))
  # powers at base 0 and 1, exponent 0
  base, exponent = np.array([[1.0, 1.0, 2.0, 3.0]]), np.array([[2.5, -1.0, 0.0, 2.0]])
  base_gradient, exponent_gradient = autograd(lambda b, e: b ** e, base, exponent)
  np.testing.assert_allclose(base_gradient, exponent * base ** (exponent - 1), rtol=1e-14)
  np.testing.assert_allclose(exponent_gradient, base ** exponent * np.log(base), rtol=1e-14)
  assert_exact(autograd(lambda t: t ** 2, np.array([[0.0, -1.5]]))[0], np.array([[0.0, -3.0]]))


def test_backward_accumulates_through_mixin_functions() -> None:
  values = np.array([[-1.0, 0.0, 2.0]])
  x = Tensor(values, requires_grad=True)
  (x.tanh() * x.sigmoid()).sum().backward()
  expected = (1 - np.tanh(values) ** 2) * sigmoid64(values) + np.tanh(values) * sigmoid64(values) * sigmoid64(-values)
  np.testing.assert_allclose(x.grad.numpy(), expected, rtol=1e-12)


def test_true_division_of_an_integer_tensor_by_a_python_number_is_float_division() -> None:
  """The number took the tensor's dtype first: uint8 / -3 divided by 253."""
  values = np.array([3, 200], np.uint8)
  np.testing.assert_allclose((Tensor(values) / -3).numpy(), values / -3, rtol=1e-6)
  np.testing.assert_allclose((-3 / Tensor(values)).numpy(), -3 / values, rtol=1e-6)
  np.testing.assert_allclose((Tensor(values.astype(np.int32)) / 2.5).numpy(), values / 2.5, rtol=1e-6)
  assert (Tensor(values) / -3).dtype == dtypes.float32


def test_half_precision_with_a_python_number_computes_in_float32() -> None:
  """As PyTorch: the number in float16 would be inf or 0 first (x / 1e5 gave zeros, x * 1e5 infs). The operations with
  the tensor first match torch's bits; with the number first, the float32 result rounded once (torch rounds the
  number to the tensor's dtype there: 1e5 - 60000 in float16 is inf for it)."""
  torch = pytest.importorskip("torch")
  values = [60000.0, 1e-3, 1e4, 2.0, -3.5]
  for ours_dtype, torch_dtype in ((dtypes.float16, torch.float16), (dtypes.bfloat16, torch.bfloat16)):
    x, t = Tensor(values, dtype=ours_dtype), torch.tensor(values, dtype=torch_dtype)
    for op in (lambda a: a / 1e5, lambda a: a * 1e5, lambda a: a * 1e-8, lambda a: a + 1e-4, lambda a: a - 7,
               lambda a: a * 100000):
      got = op(x)
      assert got.dtype == ours_dtype
      np.testing.assert_array_equal(got.cast(dtypes.float32).numpy(), op(t).float().numpy())
    rounded = torch.tensor(1e5 - x.cast(dtypes.float32).numpy().astype(np.float64), dtype=torch.float32)
    np.testing.assert_array_equal((1e5 - x).cast(dtypes.float32).numpy(), rounded.to(torch_dtype).float().numpy())
