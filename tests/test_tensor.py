"""Value tests for the Tensor API against numpy, with PyTorch's dtype rules (rawgrad's default int is int32 and its
default float float32; sums of ints are int64; true division of ints is float32; Python scalars are weak types).

Inputs come as contiguous buffers and as permuted, flipped and shrunk views of other buffers, so every op is also
checked on non-contiguous index patterns. Each distinct kernel costs one LLVM compile (~10 ms), so the grids are
sized to about a thousand distinct kernels: ~25 s with a cold compile cache, ~12 s warm.
"""
from __future__ import annotations

import gc
import operator
import warnings
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rawgrad.compiler.rangeify import buffer_base
from rawgrad.dtype import DType, dtypes
from rawgrad.errors import DTypeError, ShapeError
import rawgrad.tensor as tensor_module
from rawgrad.tensor import Tensor

# *** helpers ***

TOLERANCE: dict[DType, tuple[float, float]] = {  # (rtol, atol)
  dtypes.float16: (5e-3, 5e-3),
  dtypes.float32: (1e-5, 1e-5),
  dtypes.float64: (1e-10, 1e-10),
}
VIEWS = ("contiguous", "permuted", "flipped", "shrunk")
F32, F16, I32, BOOL = np.float32, np.float16, np.int32, np.bool_


def rand(shape: tuple[int, ...], dtype: Any, low: float = -3, high: float = 3, seed: int = 0) -> np.ndarray:
  """Random values of a numpy dtype: ints in [low, high], floats uniform in [low, high), bools half true."""
  rng = np.random.default_rng(seed)
  np_dtype = np.dtype(dtype)
  if np_dtype == np.bool_: return np.asarray(rng.random(shape) < 0.5)
  if np_dtype.kind in "iu": return np.asarray(rng.integers(int(low), int(high) + 1, shape), dtype=np_dtype)
  return np.asarray(rng.uniform(low, high, shape), dtype=np_dtype)


def view_of(arr: np.ndarray, kind: str) -> Tensor:
  """A Tensor with the values of `arr`, built as `kind` of view of another buffer (0-d arrays stay contiguous)."""
  # 0-d inputs are made from a 1-element buffer, so 0-d ops are checked apart from Tensor(0-d ndarray) itself
  if arr.ndim == 0: return Tensor(arr.reshape(1)).reshape(())
  if kind == "contiguous": return Tensor(arr)
  axes = tuple(range(arr.ndim))
  if kind == "permuted":
    order = tuple(reversed(axes))
    return Tensor(np.ascontiguousarray(arr.transpose(order))).permute(order)
  if kind == "flipped": return Tensor(np.ascontiguousarray(np.flip(arr))).flip(axes)
  if kind == "shrunk":  # the middle of a buffer one larger on every side
    big = np.zeros(tuple(s + 2 for s in arr.shape), arr.dtype)
    big[(slice(1, -1),) * arr.ndim] = arr
    return Tensor(big).shrink(tuple((1, s + 1) for s in arr.shape))
  raise ValueError(f"unknown view kind {kind}")


def check(t: Tensor, expected: Any, dtype: DType | None = None, rtol: float | None = None,
          atol: float | None = None) -> None:
  """t has expected's shape, the given dtype (default: expected's), and its values (floats within tolerance)."""
  expected = np.asarray(expected)
  dtype = dtype or dtypes.from_numpy(expected.dtype)
  assert t.dtype == dtype, f"dtype {t.dtype} != {dtype}"
  assert tuple(t.shape) == expected.shape, f"shape {t.shape} != {expected.shape}"
  out = t.numpy()
  assert out.dtype == dtypes.to_numpy(dtype) and out.shape == expected.shape
  if dtypes.is_float(dtype):
    default_rtol, default_atol = TOLERANCE[dtype]
    np.testing.assert_allclose(out.astype(np.float64), expected.astype(np.float64), equal_nan=True,
                               rtol=default_rtol if rtol is None else rtol, atol=default_atol if atol is None else atol)
  else:
    np.testing.assert_array_equal(out, expected.astype(out.dtype))


def rg(dtype: Any) -> DType:
  return dtypes.from_numpy(np.dtype(dtype))


# *** creation ***

@pytest.mark.parametrize("value, dtype", [(0, dtypes.int32), (-7, dtypes.int32), (2**31 - 1, dtypes.int32),
                                          (2**40, dtypes.int64), (-2**31 - 1, dtypes.int64), (2.5, dtypes.float32),
                                          (-0.0, dtypes.float32), (True, dtypes.bool), (False, dtypes.bool)])
def test_from_python_scalar(value: Any, dtype: DType) -> None:
  t = Tensor(value)
  assert t.shape == () and t.dtype == dtype and t.ndim == 0
  assert t.item() == value and type(t.item()) is type(value)
  assert t.tolist() == value
  check(Tensor(True).where(t, t), np.array(value, dtypes.to_numpy(dtype)), dtype)  # through a kernel, too


@pytest.mark.parametrize("data, dtype, expected", [
  ([1, 2, 3], dtypes.int32, np.array([1, 2, 3], I32)),
  ([[1, 2], [3, 4], [5, 6]], dtypes.int32, np.array([[1, 2], [3, 4], [5, 6]], I32)),
  ([[1.5, 2], [3, 4]], dtypes.float32, np.array([[1.5, 2], [3, 4]], F32)),
  ([True, False, True], dtypes.bool, np.array([True, False, True])),
  ([True, 2], dtypes.int32, np.array([1, 2], I32)),
  ([True, 2.5], dtypes.float32, np.array([1, 2.5], F32)),
  ([[[1], [2]], [[3], [4]]], dtypes.int32, np.array([[[1], [2]], [[3], [4]]], I32)),
  ((1, 2), dtypes.int32, np.array([1, 2], I32)),
  ([], dtypes.float32, np.zeros((0,), F32)),
  ([[], []], dtypes.float32, np.zeros((2, 0), F32)),
  ([2**40, 1], dtypes.int64, np.array([2**40, 1], np.int64)),
])
def test_from_nested_list(data: Any, dtype: DType, expected: np.ndarray) -> None:
  check(Tensor(data), expected, dtype)


def test_from_list_with_dtype() -> None:
  check(Tensor([1, 2, 3], dtype=dtypes.float32), np.array([1, 2, 3], F32))
  check(Tensor([[0, 2], [3, 0]], dtype=dtypes.bool), np.array([[False, True], [True, False]]))
  check(Tensor([1.5, -2.5], dtype=dtypes.float16), np.array([1.5, -2.5], F16))


@pytest.mark.parametrize("data", [[[1, 2], [3]], [[1, 2], 3], [1, [2, 3]], [[[1, 2]], [[3]]], [[], [1]]])
def test_ragged_list_raises(data: Any) -> None:
  with pytest.raises(ValueError, match="ragged"):
    Tensor(data)


@pytest.mark.parametrize("dtype", [F32, I32, BOOL, F16, np.int64, np.uint8, np.int8, np.float64])
@pytest.mark.parametrize("shape", [(), (0,), (5,), (3, 4), (2, 0, 3), (2, 3, 4)])
def test_from_numpy(shape: tuple[int, ...], dtype: Any) -> None:
  arr = rand(shape, dtype, 0, 100 if np.dtype(dtype) == np.uint8 else 3)
  t = Tensor(arr)
  assert t.dtype == rg(dtype) and t.shape == shape
  np.testing.assert_array_equal(t.numpy(), arr)
  assert t.numpy().dtype == arr.dtype


@pytest.mark.parametrize("make", [lambda a: a.T, lambda a: a[::-1], lambda a: a[:, ::2], lambda a: a[1:, 1:3]],
                         ids=["T", "reversed", "strided", "window"])
def test_from_noncontiguous_numpy(make: Callable[[np.ndarray], np.ndarray]) -> None:
  arr = make(rand((4, 6), F32))
  check(Tensor(arr), arr)
  check(Tensor(arr) * 2, arr * 2)


@pytest.mark.parametrize("value", [np.float32(2.5), np.int32(-3), np.bool_(True), np.float16(0.5), np.int64(7)])
def test_from_numpy_scalar(value: Any) -> None:
  # torch.tensor accepts numpy scalars (what indexing or reducing an ndarray gives) like 0-d arrays
  check(Tensor(value), np.asarray(value))


def test_from_numpy_copies_the_data() -> None:
  # PyTorch's torch.tensor(ndarray) copies: later writes to the array do not reach the tensor
  arr = np.arange(4, dtype=F32)
  t = Tensor(arr)
  arr[:] = -1
  check(t, np.arange(4, dtype=F32))
  check(t + 1, np.arange(4, dtype=F32) + 1)


def test_from_numpy_with_dtype() -> None:
  check(Tensor(np.array([1.7, -2.2]), dtype=dtypes.float32), np.array([1.7, -2.2], F32))
  check(Tensor(np.array([1, 2], np.int64), dtype=dtypes.int32), np.array([1, 2], I32))


@pytest.mark.parametrize("shape", [(3,), (2, 3), (0, 4), ()])
def test_empty(shape: tuple[int, ...]) -> None:
  t = Tensor.empty(*shape)
  assert t.shape == shape and t.dtype == dtypes.float32
  assert t.numpy().shape == shape
  t = Tensor.empty(shape, dtype=dtypes.int32)
  assert t.shape == shape and t.dtype == dtypes.int32 and t.numpy().dtype == I32


@pytest.mark.parametrize("shape", [(), (0,), (4,), (2, 3), (2, 0, 3)])
def test_zeros_ones(shape: tuple[int, ...]) -> None:
  check(Tensor.zeros(*shape), np.zeros(shape, F32))
  check(Tensor.ones(*shape), np.ones(shape, F32))
  check(Tensor.zeros(shape, dtype=dtypes.int32), np.zeros(shape, I32))
  check(Tensor.ones(shape, dtype=dtypes.bool), np.ones(shape, BOOL))
  check(Tensor.ones(shape, dtype=dtypes.float16), np.ones(shape, F16))


@pytest.mark.parametrize("shape, value, dtype, expected", [
  ((2, 3), 7, None, np.full((2, 3), 7, I32)),
  (3, 2.5, None, np.full((3,), 2.5, F32)),
  ((), True, None, np.array(True)),
  ((0, 2), 1.5, None, np.zeros((0, 2), F32)),
  ((2, 2), 3, dtypes.float32, np.full((2, 2), 3, F32)),
  ((4,), -1.5, dtypes.float16, np.full((4,), -1.5, F16)),
  ((2,), 0.5, dtypes.int32, np.zeros((2,), I32)),
  ((3,), 2**40, None, np.full((3,), 2**40, np.int64)),
])
def test_full(shape: Any, value: Any, dtype: DType | None, expected: np.ndarray) -> None:
  t = Tensor.full(shape, value, dtype)
  check(t, expected)
  if expected.dtype != np.bool_: check(t + 1, expected + expected.dtype.type(1))


def test_full_like() -> None:
  x = Tensor(rand((2, 3), I32))
  check(x.full_like(5), np.full((2, 3), 5, I32))
  check(x.zeros_like(), np.zeros((2, 3), I32))
  check(x.ones_like(dtypes.float32), np.ones((2, 3), F32))


@pytest.mark.parametrize("args, expected", [
  ((5,), np.arange(5, dtype=I32)),
  ((2, 7), np.arange(2, 7, dtype=I32)),
  ((-3, 4, 2), np.arange(-3, 4, 2, dtype=I32)),
  ((5, 0, -1), np.arange(5, 0, -1, dtype=I32)),
  ((10, 0, -3), np.arange(10, 0, -3, dtype=I32)),
  ((0,), np.arange(0, dtype=I32)),
  ((3, 1), np.arange(3, 1, dtype=I32)),
  ((1, 3, -1), np.arange(1, 3, -1, dtype=I32)),
  ((0, 1, 0.25), np.arange(0, 1, 0.25, dtype=F32)),
  ((1, 2, 0.3), np.arange(1, 2, 0.3).astype(F32)),
  ((-2.5, 2.5, 0.5), np.arange(-2.5, 2.5, 0.5).astype(F32)),
  ((2.0, -1.0, -0.75), np.arange(2.0, -1.0, -0.75).astype(F32)),
  ((5.0,), np.arange(5.0, dtype=F32)),
  ((0.0, -1.0, 0.5), np.arange(0.0, -1.0, 0.5).astype(F32)),
])
def test_arange(args: tuple, expected: np.ndarray) -> None:
  check(Tensor.arange(*args), expected)


def test_arange_dtype_and_errors() -> None:
  check(Tensor.arange(4, dtype=dtypes.float32), np.arange(4, dtype=F32))
  check(Tensor.arange(0, 3, dtype=dtypes.float16), np.arange(0, 3, dtype=F16))
  with pytest.raises(ValueError):
    Tensor.arange(0, 5, 0)


# *** elementwise ***

BINARY: dict[str, Callable[[Any, Any], Any]] = {
  "add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv,
  "maximum": lambda a, b: a.maximum(b) if isinstance(a, Tensor) else np.maximum(a, b),
  "minimum": lambda a, b: a.minimum(b) if isinstance(a, Tensor) else np.minimum(a, b),
  "lt": operator.lt, "gt": operator.gt, "le": operator.le, "ge": operator.ge, "eq": operator.eq, "ne": operator.ne,
}
COMPARISONS = ("lt", "gt", "le", "ge", "eq", "ne")


def binary_reference(name: str, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, DType]:
  """numpy's values for two same-dtype operands, with PyTorch's result dtype."""
  dtype = rg(a.dtype)
  if name in COMPARISONS: return BINARY[name](a, b), dtypes.bool
  if name == "div":
    out_dtype = dtype if dtypes.is_float(dtype) else dtypes.float32
    with np.errstate(divide="ignore", invalid="ignore"):  # bool divisors can be False
      return (a.astype(np.float64) / b.astype(np.float64)).astype(dtypes.to_numpy(out_dtype)), out_dtype
  if dtype == dtypes.bool:  # bool arithmetic: + is or, * is and, as in numpy and PyTorch
    return {"add": np.logical_or, "mul": np.logical_and, "maximum": np.logical_or, "minimum": np.logical_and}[name](
      a, b), dtypes.bool
  return BINARY[name](a, b).astype(a.dtype), dtype


def binary_inputs(name: str, shape_a: tuple, shape_b: tuple, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
  a, b = rand(shape_a, dtype, seed=1), rand(shape_b, dtype, seed=2)
  if name == "div" and np.dtype(dtype) != np.bool_:
    b = np.where(b == 0, np.asarray(1, dtype), b)  # no division by zero here (see test_special_values)
  if name in COMPARISONS and np.dtype(dtype) != np.bool_ and a.size and b.size:
    a.reshape(-1)[: min(a.size, b.size) // 2] = b.reshape(-1)[: min(a.size, b.size) // 2]  # some equal pairs
  return a, b


@pytest.mark.parametrize("dtype", [F32, I32, BOOL, F16])
@pytest.mark.parametrize("name", list(BINARY))
@pytest.mark.parametrize("shape_a, shape_b", [((3, 4), (3, 4)), ((), ()), ((2, 3, 4), (4,)), ((0, 3), (1, 3))])
def test_binary(name: str, dtype: Any, shape_a: tuple, shape_b: tuple) -> None:
  if dtype is BOOL and name == "sub":
    with pytest.raises((TypeError, RuntimeError)):  # PyTorch refuses `-` on bools
      Tensor(rand(shape_a, BOOL)) - Tensor(rand(shape_b, BOOL))
    return
  a, b = binary_inputs(name, shape_a, shape_b, dtype)
  expected, out_dtype = binary_reference(name, a, b)
  check(BINARY[name](view_of(a, "contiguous"), view_of(b, "contiguous")), expected, out_dtype)


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "maximum", "minimum", "lt", "eq", "ge"])
@pytest.mark.parametrize("view_a, view_b", [("permuted", "flipped"), ("shrunk", "contiguous"),
                                            ("flipped", "shrunk"), ("permuted", "permuted")])
@pytest.mark.parametrize("dtype", [F32, I32])
def test_binary_views(name: str, view_a: str, view_b: str, dtype: Any) -> None:
  a, b = binary_inputs(name, (2, 3, 4), (2, 3, 4), dtype)
  expected, out_dtype = binary_reference(name, a, b)
  check(BINARY[name](view_of(a, view_a), view_of(b, view_b)), expected, out_dtype)


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("dtype", [BOOL, F16])
def test_binary_views_bool_half(view: str, dtype: Any) -> None:
  a, b = rand((3, 5), dtype, seed=1), rand((3, 5), dtype, seed=2)
  if dtype is BOOL:
    check(view_of(a, view) * view_of(b, "flipped"), a & b)
    check(view_of(a, view) != view_of(b, "permuted"), a != b)
  else:
    check(view_of(a, view) * view_of(b, "flipped"), a * b)
    check(view_of(a, view) - view_of(b, "permuted"), a - b)


def test_add_python_int_list() -> None:
  assert (Tensor([1, 2, 3]) + 2).tolist() == [3, 4, 5]


@pytest.mark.parametrize("dtype_a, dtype_b, out", [
  (I32, F32, dtypes.float32), (BOOL, I32, dtypes.int32), (I32, F16, dtypes.float16), (F16, F32, dtypes.float32),
  (BOOL, F16, dtypes.float16), (np.uint8, I32, dtypes.int32), (np.uint8, np.int8, dtypes.int16),
  (I32, np.int64, dtypes.int64), (BOOL, F32, dtypes.float32)])
@pytest.mark.parametrize("name", ["add", "div", "lt"])
def test_mixed_dtype_promotion(dtype_a: Any, dtype_b: Any, out: DType, name: str) -> None:
  a, b = rand((2, 3), dtype_a, 1, 9, seed=1), rand((2, 3), dtype_b, 1, 9, seed=2)
  for x, y, tx, ty in ((a, b, Tensor(a), Tensor(b)), (b, a, Tensor(b), Tensor(a))):
    wide_x, wide_y = x.astype(np.float64), y.astype(np.float64)
    if name == "lt": check(tx < ty, wide_x < wide_y, dtypes.bool)
    elif name == "div":
      div_dtype = out if dtypes.is_float(out) else dtypes.float32
      with np.errstate(divide="ignore", invalid="ignore"):  # a bool divisor can be False
        expected = wide_x / wide_y
      check(tx / ty, expected, div_dtype)
    else: check(BINARY[name](tx, ty), BINARY[name](wide_x, wide_y), out)


@pytest.mark.parametrize("dtype, scalar, fn, out", [
  (I32, 2, lambda x, s: x + s, dtypes.int32),
  (I32, 3, lambda x, s: x * s, dtypes.int32),
  (I32, 2.5, lambda x, s: x + s, dtypes.float32),
  (I32, True, lambda x, s: x + s, dtypes.int32),
  (I32, 2, lambda x, s: x / s, dtypes.float32),
  (I32, 10, lambda x, s: s - x, dtypes.int32),
  (I32, 1, lambda x, s: s / x, dtypes.float32),
  (I32, 1.5, lambda x, s: x > s, dtypes.bool),
  (I32, 2.5, lambda x, s: BINARY["maximum"](x, s), dtypes.float32),
  (F16, 2.5, lambda x, s: x + s, dtypes.float16),
  (F16, 3, lambda x, s: s - x, dtypes.float16),
  (F16, 2, lambda x, s: x / s, dtypes.float16),
  (F32, 2, lambda x, s: x * s, dtypes.float32),
  (F32, True, lambda x, s: s - x, dtypes.float32),
  (BOOL, 1, lambda x, s: x + s, dtypes.int32),
  (BOOL, 2.5, lambda x, s: x * s, dtypes.float32),
  (BOOL, True, lambda x, s: x * s, dtypes.bool),
  (BOOL, 3, lambda x, s: s * x, dtypes.int32),
  (np.int64, 2, lambda x, s: x + s, dtypes.int64),
  (np.uint8, 3, lambda x, s: x + s, dtypes.uint8),
  (np.int8, 2, lambda x, s: x * s, dtypes.int8),
])
def test_python_scalars_are_weak(dtype: Any, scalar: Any, fn: Callable, out: DType) -> None:
  arr = rand((2, 3), dtype, 1, 9)
  expected = fn(arr.astype(np.float64), float(scalar))
  check(fn(Tensor(arr), scalar), expected, out)
  check(fn(Tensor(arr)[0, 0], scalar), np.asarray(expected)[0, 0], out)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int64, np.float64, np.uint32, np.int16])
def test_other_dtypes(dtype: Any) -> None:
  info = np.iinfo(dtype) if np.dtype(dtype).kind in "iu" else None
  low, high = (max(int(info.min), -100), min(int(info.max), 250)) if info else (-100, 100)
  a, b = rand((3, 4), dtype, low, high, seed=1), rand((3, 4), dtype, low, high, seed=2)
  a[0, :2] = b[0, :2]
  with np.errstate(over="ignore"):
    check(Tensor(a) + Tensor(b), a + b)
    check(Tensor(a) * Tensor(b), a * b)
  check(Tensor(a) < Tensor(b), a < b)
  check(Tensor(a) >= Tensor(b), a >= b)
  check(Tensor(a) == Tensor(b), a == b)
  check(Tensor(a).maximum(Tensor(b)), np.maximum(a, b))
  check(Tensor(a).minimum(Tensor(b)), np.minimum(a, b))
  check(Tensor(a).max(1), a.max(1))
  check(Tensor(a).min(0), a.min(0))
  check(Tensor(a).sum(0), a.astype(np.float64).sum(0).astype(np.float64 if info is None else np.int64))
  check(Tensor(a).flip(0).pad(((1, 0), (0, 1))), np.pad(a[::-1], ((1, 0), (0, 1))))
  check(Tensor(a) / Tensor(b | 1 if info else b), (a / (b | 1 if info else b)).astype(np.float32 if info else
                                                                                         np.float64))


def test_half_compares_with_scalar_in_half() -> None:
  # the weak scalar is converted to the tensor's dtype, as in PyTorch and numpy 2
  check(Tensor(np.array([0.1, 0.2], F16)) == 0.1, np.array([True, False]))


UNARY: dict[str, tuple[Callable[[Tensor], Tensor], Callable[[np.ndarray], np.ndarray]]] = {
  "neg": (lambda t: -t, np.negative),
  "exp": (Tensor.exp, np.exp),
  "log": (Tensor.log, np.log),
  "sqrt": (Tensor.sqrt, np.sqrt),
  "sin": (Tensor.sin, np.sin),
  "relu": (Tensor.relu, lambda a: np.maximum(a, 0).astype(a.dtype)),
  "reciprocal": (Tensor.reciprocal, np.reciprocal),
}


def unary_input(name: str, shape: tuple, dtype: Any, seed: int = 0) -> np.ndarray:
  positive = name in ("log", "sqrt", "reciprocal")
  if np.dtype(dtype) == np.bool_: return rand(shape, dtype, seed=seed) | positive
  return rand(shape, dtype, 1 if positive else -3, 6 if positive else 3, seed=seed)


@pytest.mark.parametrize("name, dtype", [(name, dtype) for name in UNARY for dtype in (F32, I32, BOOL, F16)
                                         if not (dtype is BOOL and name in ("neg", "relu"))])  # PyTorch refuses these
@pytest.mark.parametrize("shape", [(3, 4), (), (0, 2)])
def test_unary(name: str, dtype: Any, shape: tuple) -> None:
  fn, reference = UNARY[name]
  arr = unary_input(name, shape, dtype)
  float_op = name not in ("neg", "relu")
  out = dtypes.float32 if float_op and dtype in (I32, BOOL) else rg(dtype)
  source = arr.astype(F32) if out == dtypes.float32 and dtype in (I32, BOOL) else arr
  check(fn(view_of(arr, "contiguous")), reference(source), out)


@pytest.mark.parametrize("view", VIEWS[1:])
@pytest.mark.parametrize("name", list(UNARY))
def test_unary_views(name: str, view: str) -> None:
  fn, reference = UNARY[name]
  arr = unary_input(name, (2, 3, 4), F32, seed=3)
  check(fn(view_of(arr, view)), reference(arr))


def test_neg_bool_raises() -> None:
  with pytest.raises((TypeError, RuntimeError)):
    -Tensor([True, False])


def test_special_values() -> None:
  x = Tensor(np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan], F32))
  ref = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan], F32)
  with np.errstate(all="ignore"):
    check(x.exp(), np.exp(ref))
    check(x.log(), np.log(ref))
    check(x.sqrt(), np.sqrt(ref))
    check(x.reciprocal(), np.reciprocal(ref))
    check(x / 0.0, ref / F32(0.0))
    check(Tensor([1, -1, 0]) / Tensor([0, 0, 0]), np.array([np.inf, -np.inf, np.nan], F32))
  check(x * 2 == x, ref * 2 == ref)
  check(x != x, ref != ref)
  check(x < 0, ref < 0)
  with np.errstate(all="ignore"):
    check(x.sin(), np.sin(ref))


def test_nan_propagates_through_maximum_and_relu() -> None:
  # PyTorch and numpy propagate NaN through maximum, minimum, relu and max
  x = Tensor(np.array([np.nan, 1.0, -1.0], F32))
  check(x.maximum(0.0), np.array([np.nan, 1.0, 0.0], F32))
  check(x.minimum(0.0), np.array([np.nan, 0.0, -1.0], F32))
  check(x.relu(), np.array([np.nan, 1.0, 0.0], F32))
  check(x.max(), np.array(np.nan, F32))


def test_minimum_and_min_at_int_extremes() -> None:
  # minimum and min must not negate: -(-2**31) overflows int32
  lo = -(2**31)
  check(Tensor(np.array([lo, 5], I32)).minimum(Tensor(np.array([0, 3], I32))), np.array([lo, 3], I32))
  check(Tensor(np.array([lo, 5], I32)).minimum(0), np.array([lo, 0], I32))
  check(Tensor(np.array([lo, 5, -1], I32)).min(), np.array(lo, I32))
  check(Tensor(np.array([[lo, 5], [7, -1]], I32)).min(1), np.array([lo, -1], I32))
  check(Tensor(np.array([-(2**63), 2], np.int64)).min(), np.array(-(2**63), np.int64))


def test_int_arithmetic_wraps() -> None:
  check(Tensor(np.array([2**31 - 1], I32)) + 1, np.array([-(2**31)], I32))
  check(Tensor(np.array([2**30], I32)) * 4, np.array([0], I32))
  check(Tensor(np.array([250], np.uint8)) + 10, np.array([4], np.uint8))


def test_exp_log_range() -> None:
  arr = np.array([-80, -20, -1e-3, 0, 1e-3, 20, 80], F32)
  check(Tensor(arr).exp(), np.exp(arr), rtol=1e-5, atol=0)
  pos = np.array([1e-30, 1e-5, 0.5, 1, 2, 1e5, 1e30], F32)
  check(Tensor(pos).log(), np.log(pos), rtol=1e-5, atol=1e-6)
  check(Tensor(pos).sqrt(), np.sqrt(pos), rtol=1e-6, atol=0)


def test_sin_range() -> None:
  arr = np.linspace(-20, 20, 41, dtype=F32)
  check(Tensor(arr).sin(), np.sin(arr), atol=1e-5)


@pytest.mark.parametrize("cond_dtype", [BOOL, I32, F32])
@pytest.mark.parametrize("value_dtype", [F32, I32, BOOL, F16])
def test_where(cond_dtype: Any, value_dtype: Any) -> None:
  cond = rand((3, 4), cond_dtype, -1, 1, seed=1)
  if cond_dtype is F32: cond[0, :2] = [0.0, -0.0]
  x, y = rand((3, 4), value_dtype, seed=2), rand((3, 4), value_dtype, seed=3)
  expected = np.where(cond != 0, x, y)
  check(Tensor(cond).where(Tensor(x), Tensor(y)), expected)
  check(view_of(cond, "flipped").where(view_of(x, "permuted"), view_of(y, "shrunk")), expected)


def test_where_broadcast_and_scalars() -> None:
  cond, x, y = rand((3, 1), BOOL, seed=1), rand((1, 4), F32, seed=2), rand((4,), F32, seed=3)
  check(Tensor(cond).where(Tensor(x), Tensor(y)), np.where(cond, x, y))
  xi = rand((3, 4), I32)
  check(Tensor(cond).where(Tensor(xi), 2.5), np.where(cond, xi, 2.5).astype(F32))
  check(Tensor(cond).where(-1, Tensor(xi)), np.where(cond, -1, xi).astype(I32))
  check(Tensor(cond).where(1, 0), np.where(cond, 1, 0).astype(I32))
  check(Tensor(cond).where(1.0, 0), np.where(cond, 1.0, 0).astype(F32))
  check(Tensor(cond).where(True, False), np.where(cond, True, False))
  check(Tensor(True).where(Tensor(x), Tensor(y)), np.where(True, x, y))
  check(Tensor(np.zeros((0, 1), BOOL)).where(Tensor(x), 1.0), np.zeros((0, 4), F32))
  with pytest.raises(ValueError, match=r"\(3, 1\).*\(2, 4\)|\(2, 4\).*\(3, 1\)"):
    Tensor(cond).where(Tensor(rand((2, 4), F32)), 0.0)


CASTS = [
  (F32, I32, [-2.7, -0.5, 0.0, 0.5, 2.7, 100.9, -1e6]),
  (F32, BOOL, [0.0, -0.0, 0.5, -3.0, np.nan, np.inf]),
  (F32, F16, [0.1, -2.5, 1e-3, 65504.0, 1e5, -np.inf]),
  (F32, np.uint8, [0.0, 1.9, 200.5, 255.0]),
  (F32, np.int64, [-3e9, 3e9, -1.5]),
  (F16, F32, [0.1, -2.5, 1e-3, 65504.0]),
  (F16, I32, [-2.7, 0.4, 300.9]),
  (I32, F32, [-5, 0, 7, 2**24 + 1, -(2**31)]),
  (I32, BOOL, [-5, 0, 1, 2, 256]),
  (I32, F16, [-5, 0, 7, 2049]),
  (I32, np.uint8, [0, 7, 255]),
  (I32, np.int64, [-5, 0, 2**31 - 1, -(2**31)]),
  (np.int64, I32, [-5, 0, 7]),
  (BOOL, I32, [True, False]),
  (BOOL, F32, [True, False]),
  (BOOL, F16, [True, False]),
  (np.uint8, I32, [0, 7, 200, 255]),
  (np.uint8, F32, [0, 7, 200, 255]),
  (np.int8, I32, [-128, -1, 0, 127]),
  (np.int8, np.uint8, [-128, -1, 0, 127]),
]


@pytest.mark.parametrize("src, dst, values", CASTS, ids=[f"{np.dtype(s)}-{np.dtype(d)}-{i}"
                                                          for i, (s, d, _) in enumerate(CASTS)])
def test_cast(src: Any, dst: Any, values: list) -> None:
  arr = np.array(values, dtype=src)
  with np.errstate(all="ignore"):
    expected = arr.astype(dst) if np.dtype(dst) != np.bool_ else arr != 0
  check(Tensor(arr).cast(rg(dst)), expected)
  check(view_of(arr, "flipped").cast(rg(dst)), expected)


def test_cast_helpers_and_identity() -> None:
  x = Tensor(np.array([1.5, -2.5, 0.0], F32))
  assert x.cast(dtypes.float32) is x
  check(x.int(), np.array([1, -2, 0], I32))
  check(x.bool(), np.array([True, True, False]))
  check(Tensor([1, 0]).float(), np.array([1, 0], F32))


@pytest.mark.parametrize("shape_a, shape_b", [((3, 1), (1, 4)), ((2, 3, 4), (4,)), ((5,), ()), ((2, 1, 3), (4, 1)),
                                              ((0, 3), (1, 3)), ((3,), (0, 1)), ((1, 1), (2, 1, 3)), ((), (2, 0))])
@pytest.mark.parametrize("dtype", [F32, I32])
def test_broadcasting(shape_a: tuple, shape_b: tuple, dtype: Any) -> None:
  a, b = rand(shape_a, dtype, seed=1), rand(shape_b, dtype, seed=2)
  check(Tensor(a) + Tensor(b), a + b)
  check(Tensor(b) * Tensor(a), b * a)
  check(Tensor(a) < Tensor(b), a < b)


def test_broadcasting_views() -> None:
  a, b = rand((4, 1, 3), F32, seed=1), rand((5, 1), F32, seed=2)
  check(view_of(a, "permuted") - view_of(b, "flipped"), a - b)
  check(view_of(a, "shrunk") * view_of(b, "permuted"), a * b)


@pytest.mark.parametrize("shape_a, shape_b", [((3,), (4,)), ((2, 3), (3, 2)), ((2, 3, 4), (5, 4)), ((0,), (2,))])
def test_broadcast_error_names_both_shapes(shape_a: tuple, shape_b: tuple) -> None:
  a, b = Tensor.zeros(*shape_a), Tensor.ones(*shape_b)
  for fn in (operator.add, operator.mul, operator.lt, lambda x, y: x.maximum(y), operator.truediv):
    with pytest.raises(ValueError) as info:
      fn(a, b)
    assert str(shape_a) in str(info.value) and str(shape_b) in str(info.value), str(info.value)


# *** movement ***

@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("shape, new_shape", [((2, 3, 4), (6, 4)), ((2, 3, 4), (4, -1)), ((2, 3, 4), (-1,)),
                                              ((2, 3, 4), (24, 1)), ((2, 3, 4), (2, 1, 3, 1, 4)),
                                              ((2, 3, 4), (3, 2, 2, 2)), ((6,), (3, 2)), ((1,), ()), ((), (1, 1)),
                                              ((0, 3), (3, 0)), ((0, 3), (-1, 3)), ((4, 1), (-1,))])
def test_reshape(shape: tuple, new_shape: tuple, view: str) -> None:
  arr = rand(shape, F32)
  check(view_of(arr, view).reshape(new_shape), arr.reshape(new_shape))
  if view == "contiguous": check(view_of(arr, view).reshape(*new_shape) + 1, arr.reshape(new_shape) + 1)


def test_reshape_errors() -> None:
  x = Tensor.zeros(2, 3)
  for bad in ((4, 2), (-1, 4), (-1, -1), (7,), (0, -1)):
    with pytest.raises(ValueError):
      x.reshape(bad)
  with pytest.raises(ValueError):
    Tensor.zeros(0, 3).reshape(-1, 0)


@pytest.mark.parametrize("shape, new_shape", [((3, 1), (3, 4)), ((3, 1), (2, 3, 4)), ((1,), (5,)), ((), (2, 3)),
                                              ((3, 1), (-1, 4)), ((1, 3), (0, 3)), ((2, 1, 1), (2, 0, 5))])
@pytest.mark.parametrize("dtype", [F32, I32, BOOL])
def test_expand(shape: tuple, new_shape: tuple, dtype: Any) -> None:
  arr = rand(shape, dtype)
  target = tuple(s if n == -1 else n for s, n in zip((None,) * (len(new_shape) - len(shape)) + shape, new_shape))
  check(Tensor(arr).expand(new_shape), np.broadcast_to(arr, target))
  check(Tensor(arr).expand(*new_shape) * Tensor(arr), np.broadcast_to(arr, target) * arr)


def test_expand_errors() -> None:
  with pytest.raises(ValueError, match=r"\(3,\).*\(4,\)"):
    Tensor.zeros(3).expand(4)
  with pytest.raises(ValueError):
    Tensor.zeros(2, 3).expand(3)
  with pytest.raises(ValueError):
    Tensor.zeros(3).expand(-1, 3)


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("order", [(2, 0, 1), (0, 1, 2), (-1, 0, 1), (1, -1, -3), (2, 1, 0)])
def test_permute(order: tuple, view: str) -> None:
  arr = rand((2, 3, 4), I32)
  check(view_of(arr, view).permute(order), arr.transpose(order))
  if view == "contiguous": check(view_of(arr, view).permute(*order) * 2, arr.transpose(order) * 2)


def test_permute_transpose_T_and_errors() -> None:
  arr = rand((2, 3, 4), F32)
  check(Tensor(arr).transpose(0, 2), arr.transpose(2, 1, 0))
  check(Tensor(arr).transpose(-1, -2), arr.swapaxes(-1, -2))
  check(Tensor(arr).T, arr.T)
  check(Tensor(arr[0]).T, arr[0].T)
  check(Tensor(np.zeros((0, 3), F32)).permute(1, 0), np.zeros((3, 0), F32))
  for bad in ((0, 1), (0, 0, 1), (0, 1, 3)):
    with pytest.raises((ValueError, IndexError)):
      Tensor(arr).permute(bad)


PADS_2D = [((1, 2), (0, 1)), ((0, 0), (2, 2)), ((1, 1), (1, 1)), ((0, 0), (0, 0))]


@pytest.mark.parametrize("dtype", [F32, I32, BOOL, F16])
@pytest.mark.parametrize("view", ["contiguous", "permuted", "flipped"])
@pytest.mark.parametrize("padding", PADS_2D)
def test_pad(padding: tuple, view: str, dtype: Any) -> None:
  arr = rand((3, 4), dtype)
  check(view_of(arr, view).pad(padding), np.pad(arr, padding))


@pytest.mark.parametrize("value", [1.5, -2.0, 1])
def test_pad_value(value: float) -> None:
  arr = rand((2, 3), F32)
  check(Tensor(arr).pad(((1, 0), (2, 1)), value), np.pad(arr, ((1, 0), (2, 1)), constant_values=value))
  check(Tensor(arr).pad(((1, 1), (0, 0)), value=value).sum(0), np.pad(arr, ((1, 1), (0, 0)),
                                                                      constant_values=value).sum(0))


def test_pad_edge_cases() -> None:
  check(Tensor(np.zeros((0, 3), F32)).pad(((1, 1), (0, 0))), np.zeros((2, 3), F32))
  check(Tensor(np.arange(3, dtype=I32)).pad(((2, 0),)) + 1, np.pad(np.arange(3, dtype=I32), (2, 0)) + 1)
  check(Tensor(np.ones(2, F32)).pad(((1, 1),)).pad(((1, 0),)), np.array([0, 0, 1, 1, 0], F32))
  with pytest.raises(ValueError):
    Tensor.zeros(2, 3).pad(((1, 1),))
  with pytest.raises(ValueError):
    Tensor.zeros(2).pad(((-1, 0),))


def test_reciprocal_then_pad_is_zero_in_the_padding() -> None:
  x = Tensor(np.array([1.0, 2.0, 4.0], F32))
  check(x.reciprocal().pad(((1, 1),)), np.array([0.0, 1.0, 0.5, 0.25, 0.0], F32))
  check(x.pad(((1, 1),)).reciprocal(), np.array([np.inf, 1.0, 0.5, 0.25, np.inf], F32))
  check(x.exp().pad(((1, 0),)), np.array([0.0, *np.exp([1.0, 2.0, 4.0])], F32))
  check(x.pad(((1, 0),)).exp(), np.array([1.0, *np.exp([1.0, 2.0, 4.0])], F32))
  check((x + 1).pad(((0, 2),)).log(), np.array([np.log(2), np.log(3), np.log(5), -np.inf, -np.inf], F32))


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("bounds", [((1, 2), (0, 2), (1, 4)), ((0, 2), (0, 3), (0, 4)), (None, (1, 2), None),
                                    ((1, 1), (0, 3), (2, 3)), ((0, 1), None, (3, 4))])
def test_shrink(bounds: tuple, view: str) -> None:
  arr = rand((2, 3, 4), F32)
  slices = tuple(slice(None) if b is None else slice(*b) for b in bounds)
  check(view_of(arr, view).shrink(bounds), arr[slices])


def test_shrink_errors() -> None:
  with pytest.raises(ValueError):
    Tensor.zeros(3, 4).shrink(((0, 4), (0, 4)))
  with pytest.raises(ValueError):
    Tensor.zeros(3, 4).shrink(((2, 1), (0, 4)))


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("axes", [(0,), (-1,), (0, 2), (1, -1), (0, 1, 2), ()])
def test_flip(axes: tuple, view: str) -> None:
  arr = rand((2, 3, 4), I32)
  check(view_of(arr, view).flip(axes), np.flip(arr, axes))
  if view == "contiguous": check(view_of(arr, view).flip(*axes) - 1, np.flip(arr, axes) - 1)


def test_flip_edge_cases() -> None:
  check(Tensor(np.zeros((0, 3), F32)).flip(0), np.zeros((0, 3), F32))
  check(Tensor(np.array([True, False, False])).flip(0), np.array([False, False, True]))
  with pytest.raises((ValueError, IndexError)):
    Tensor.zeros(2, 3).flip(2)


MOVEMENT_OPS = ("permute", "flip", "pad", "shrink", "reshape", "expand", "getitem")


@st.composite
def movement_chain(draw: st.DrawFn) -> list[tuple[str, Any]]:
  """A random chain of movement ops for a (2, 3, 4) input, each with arguments valid for the shape it gets."""
  shape, chain = (2, 3, 4), []
  for _ in range(draw(st.integers(1, 4))):
    ndim = len(shape)
    name = draw(st.sampled_from(MOVEMENT_OPS if ndim else ("reshape", "expand")))
    if name == "permute":
      arg: Any = tuple(draw(st.permutations(range(ndim))))
      shape = tuple(shape[i] for i in arg)
    elif name == "flip":
      arg = tuple(draw(st.lists(st.integers(0, ndim - 1), unique=True, max_size=ndim))) if ndim else ()
    elif name == "pad":
      arg = tuple((draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in range(ndim))
      shape = tuple(s + a + b for s, (a, b) in zip(shape, arg))
    elif name == "shrink":
      arg = tuple((0, 0) if s == 0 else (lambda a: (a, draw(st.integers(a + 1, s))))(draw(st.integers(0, s - 1)))
                  for s in shape)
      shape = tuple(b - a for a, b in arg)
    elif name == "reshape":
      size = int(np.prod(shape))
      arg = draw(st.sampled_from([tuple(reversed(shape)), (1, *shape)] + ([(-1,), shape[:1] + (-1,)] if size else [])))
      shape = tuple(size // max(1, int(np.prod([s for s in arg if s != -1]))) if s == -1 else s for s in arg)
    elif name == "expand":
      axis = draw(st.integers(0, ndim))
      shape = (*shape[:axis], 1, *shape[axis:])
      arg = (axis, draw(st.integers(1, 3)))
      shape = (*shape[:axis], arg[1], *shape[axis + 1:])
    else:
      arg = tuple(draw(st.one_of(st.integers(-s, s - 1) if s else st.just(slice(None)), st.builds(
        slice, st.none() | st.integers(-s - 1, s + 1), st.none() | st.integers(-s - 1, s + 1),
        st.none() | st.sampled_from([-3, -2, -1, 1, 2, 3])))) for s in shape[:2])
      shape = np.empty(shape)[arg].shape
    chain.append((name, arg))
  return chain


def apply_movement(x: Any, chain: list[tuple[str, Any]]) -> Any:
  """Apply a movement chain to a Tensor or (with numpy's equivalents) to an ndarray."""
  is_tensor = isinstance(x, Tensor)
  for name, arg in chain:
    if name == "permute": x = x.permute(arg) if is_tensor else x.transpose(arg)
    elif name == "flip": x = x.flip(arg) if is_tensor else np.flip(x, arg)
    elif name == "pad": x = x.pad(arg) if is_tensor else np.pad(x, arg)
    elif name == "shrink": x = x.shrink(arg) if is_tensor else x[tuple(slice(a, b) for a, b in arg)]
    elif name == "reshape": x = x.reshape(arg)
    elif name == "expand":
      axis, size = arg
      unsqueezed = x.unsqueeze(axis) if is_tensor else np.expand_dims(x, axis)
      target = (*unsqueezed.shape[:axis], size, *unsqueezed.shape[axis + 1:])
      x = unsqueezed.expand(target) if is_tensor else np.broadcast_to(unsqueezed, target)
    else: x = x[arg]
  return x


@settings(max_examples=40, deadline=None, derandomize=True)
@given(chain=movement_chain())
def test_movement_chains_hypothesis(chain: list[tuple[str, Any]]) -> None:
  arr = rand((2, 3, 4), F32)
  expected = apply_movement(arr, chain)
  check(apply_movement(Tensor(arr), chain).exp(), np.exp(expected))


def test_squeeze_unsqueeze_flatten() -> None:
  arr = rand((2, 1, 3), F32)
  check(Tensor(arr).squeeze(), arr.squeeze())
  check(Tensor(arr).squeeze(1), arr.squeeze(1))
  check(Tensor(arr).squeeze(-1), arr)
  check(Tensor(arr).unsqueeze(0), arr[None])
  check(Tensor(arr).unsqueeze(-1), arr[..., None])
  check(Tensor(arr).flatten(), arr.reshape(-1))
  check(Tensor(arr).flatten(1), arr.reshape(2, 3))
  check(Tensor(2.0).flatten(), np.array([2], F32))


INDICES = [
  np.s_[0], np.s_[-1], np.s_[3], np.s_[1, 2], np.s_[1, -2, -1], np.s_[:, -2], np.s_[1:3], np.s_[::2],
  np.s_[1::3, ::2], np.s_[::-1], np.s_[:, ::-2], np.s_[3:0:-1], np.s_[-1:-4:-2], np.s_[::-3, 1:4, ::-1],
  np.s_[None], np.s_[:, None, 1], np.s_[..., 1], np.s_[1, ...], np.s_[..., None], np.s_[...], np.s_[2:2],
  np.s_[10:20], np.s_[-100:100], np.s_[1, ::-1, None, 1:3], np.s_[None, ..., None, 0], np.s_[:, 4:1:-2, 5],
  np.s_[0, 0, 0], np.s_[-4, -5, -6], np.s_[:, :, ::4], np.s_[:, ::-1, :], np.s_[1, ..., ::-5],
]


@pytest.mark.parametrize("view, dtype", [("contiguous", F32), ("permuted", I32), ("flipped", BOOL), ("shrunk", F16)])
@pytest.mark.parametrize("index", INDICES, ids=[str(i) for i in range(len(INDICES))])
def test_getitem(index: Any, view: str, dtype: Any) -> None:
  arr = rand((4, 5, 6), dtype)
  check(view_of(arr, view)[index], arr[index])


def test_getitem_0d_and_1d() -> None:
  arr = np.array(2.5, F32)
  check(Tensor(2.5)[...], arr[...])
  check(Tensor(2.5)[None], arr[None])
  check(Tensor(2.5)[None, ..., None], arr[None, ..., None])
  v = Tensor(np.array([3, 1, 4, 1, 5], I32))
  assert v[2].shape == () and v[2].item() == 4 and v[-1].item() == 5
  check(v[::-1][1:4:2], np.array([3, 1, 4, 1, 5], I32)[::-1][1:4:2])
  check(v[1:][::2], np.array([1, 1], I32))


def test_getitem_chained_and_computed() -> None:
  arr = rand((4, 5, 6), F32)
  t = Tensor(arr)
  check(t[1:][:, ::-2][..., 1], arr[1:][:, ::-2][..., 1])
  check((t * 2)[::-1, 2], (arr * 2)[::-1, 2])
  check(t.sum(2)[::2], arr.sum(2)[::2], atol=1e-5)


@pytest.mark.parametrize("index", [4, -5, (0, 5), (slice(None), slice(None), 6), (0, 0, -7), (0, 0, 0, 0),
                                   (Ellipsis, Ellipsis), (None, 0, 0, 0, 0)])
def test_getitem_index_error(index: Any) -> None:
  with pytest.raises(IndexError):
    Tensor.zeros(4, 5, 6)[index]


def test_getitem_errors() -> None:
  with pytest.raises(IndexError):
    Tensor(1.0)[0]
  with pytest.raises(ValueError):
    Tensor.zeros(3)[::0]


SLICE_PART = st.one_of(st.none(), st.integers(-7, 7))
AXIS_INDEX = st.one_of(st.integers(-4, 3), st.builds(slice, SLICE_PART, SLICE_PART,
                                                    st.one_of(st.none(), st.integers(-3, 3).filter(bool))))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(index=st.lists(st.one_of(AXIS_INDEX, st.none()), min_size=0, max_size=3).filter(
  lambda items: sum(item is not None for item in items) <= 2))
def test_getitem_hypothesis(index: list) -> None:
  arr = rand((4, 5), I32)
  check(view_of(arr, "flipped")[tuple(index)], arr[tuple(index)])


# *** reductions ***

REDUCTIONS: dict[str, Callable[..., Any]] = {
  "sum": lambda x, axis, keepdim: x.sum(axis, keepdim=keepdim),
  "max": lambda x, axis, keepdim: x.max(axis, keepdim=keepdim),
  "mean": lambda x, axis, keepdim: x.mean(axis, keepdim=keepdim),
}


def reduce_reference(name: str, arr: np.ndarray, axis: Any, keepdim: bool) -> tuple[np.ndarray, DType]:
  dtype = rg(arr.dtype)
  if name == "sum":
    out = dtypes.int64 if dtype in (dtypes.int32, dtypes.bool) else dtype
    return np.sum(arr.astype(np.float64), axis=axis, keepdims=keepdim).astype(dtypes.to_numpy(out)), out
  if name == "max": return np.max(arr, axis=axis, keepdims=keepdim), dtype
  out = dtype if dtypes.is_float(dtype) else dtypes.float32
  return np.mean(arr.astype(np.float64), axis=axis, keepdims=keepdim).astype(dtypes.to_numpy(out)), out


@pytest.mark.parametrize("dtype", [F32, I32, BOOL, F16])
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("axis", [None, 0, -1, (-1, -3), (2, 0, 1)])
@pytest.mark.parametrize("name", list(REDUCTIONS))
def test_reduce(name: str, axis: Any, keepdim: bool, dtype: Any) -> None:
  arr = rand((2, 3, 4), dtype, seed=4)
  expected, out = reduce_reference(name, arr, axis, keepdim)
  tol = {"rtol": 1e-2, "atol": 2e-2} if dtype is F16 else {}
  check(REDUCTIONS[name](Tensor(arr), axis, keepdim), expected, out, **tol)


@pytest.mark.parametrize("view", ["permuted", "flipped"])
@pytest.mark.parametrize("axis", [None, 1, (0, -1)])
@pytest.mark.parametrize("name", list(REDUCTIONS))
@pytest.mark.parametrize("dtype", [F32, I32])
def test_reduce_views(name: str, axis: Any, view: str, dtype: Any) -> None:
  arr = rand((3, 4, 5), dtype, seed=5)
  expected, out = reduce_reference(name, arr, axis, False)
  check(REDUCTIONS[name](view_of(arr, view), axis, False), expected, out)


@pytest.mark.parametrize("name", list(REDUCTIONS))
@pytest.mark.parametrize("axis, keepdim", [(None, False), (0, False), (-1, True), ((), False)])
def test_reduce_0d(name: str, axis: Any, keepdim: bool) -> None:
  arr = np.array(-1.5, F32)
  check(REDUCTIONS[name](view_of(arr, "contiguous"), axis, keepdim), arr)
  out = {"sum": np.int64, "max": I32, "mean": F32}[name]
  check(REDUCTIONS[name](view_of(np.array(3, I32), "contiguous"), axis, keepdim), np.array(3, out))


def test_reduce_zero_size() -> None:
  arr = np.zeros((2, 0, 3), F32)
  check(Tensor(arr).sum(1), np.zeros((2, 3), F32))
  check(Tensor(arr).sum(), np.array(0, F32))
  check(Tensor(arr).sum(0), np.zeros((0, 3), F32))
  check(Tensor(arr).sum((0, 1), keepdim=True), np.zeros((1, 1, 3), F32))
  check(Tensor(np.zeros((2, 0), I32)).sum(1), np.zeros((2,), np.int64))
  check(Tensor(arr).max(0), np.zeros((0, 3), F32))
  check(Tensor(arr).mean(1), np.full((2, 3), np.nan, F32))
  check(Tensor(arr).mean(), np.array(np.nan, F32))
  for axis in (1, None, (0, 1)):
    with pytest.raises(ValueError):
      Tensor(arr).max(axis)


def test_reduce_errors() -> None:
  x = Tensor.zeros(2, 3)
  for axis in (2, -3, (0, 2)):
    with pytest.raises(IndexError):
      x.sum(axis)
  with pytest.raises(ValueError):
    x.sum((0, 0))
  with pytest.raises(ValueError):
    x.max((1, -1))


def test_sum_dtypes_and_precision() -> None:
  big = Tensor([2**30] * 4)
  assert big.dtype == dtypes.int32
  check(big.sum(), np.array(2**32, np.int64))
  check(Tensor([True, True, False]).sum(), np.array(2, np.int64))
  check(Tensor(np.array([1, 255, 255], np.uint8)).sum(), np.array(511, np.int64))
  check(Tensor([1, 2, 3]).sum(dtype=dtypes.float32), np.array(6, F32))
  check(Tensor(np.ones(1000, F32) * 0.1).sum(), np.array(100, F32), rtol=1e-4)
  check(Tensor(np.ones(1000, F16)).sum(), np.array(1000, F16), rtol=0, atol=0)


def test_max_extremes() -> None:
  check(Tensor(np.array([-np.inf, -np.inf], F32)).max(), np.array(-np.inf, F32))
  check(Tensor(np.array([-(2**31), -(2**31)], I32)).max(), np.array(-(2**31), I32))
  check(Tensor(np.array([-5.0, -3.0, -9.0], F32)).max(), np.array(-3.0, F32))
  check(Tensor(np.array([[False, False], [True, False]])).max(1), np.array([False, True]))
  check(Tensor(np.array([-5, -3, -9], I32)).min(), np.array(-9, I32))


@settings(max_examples=25, deadline=None, derandomize=True)
@given(chain=movement_chain(), data=st.data(), name=st.sampled_from(["sum", "max", "mean"]))
def test_reduce_after_movement_hypothesis(chain: list[tuple[str, Any]], data: st.DataObject, name: str) -> None:
  arr = rand((2, 3, 4), I32)
  moved = apply_movement(arr, chain)
  axes = None
  if moved.ndim: axes = tuple(data.draw(st.lists(st.integers(0, moved.ndim - 1), unique=True, max_size=moved.ndim)))
  assume(name != "max" or 0 not in [moved.shape[a] for a in (range(moved.ndim) if axes is None else axes)])
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)  # numpy's mean of an empty slice
    expected, out = reduce_reference(name, moved * 2, axes, False)
  check(REDUCTIONS[name](apply_movement(Tensor(arr), chain) * 2, axes, False), expected, out)


# *** matmul ***

MATMUL_SHAPES = [((3,), (3,)), ((2, 3), (3,)), ((3,), (3, 4)), ((2, 3), (3, 4)), ((5, 2, 3), (3, 4)),
                 ((5, 2, 3), (5, 3, 4)), ((2, 1, 2, 3), (5, 3, 4)), ((3,), (2, 3, 4)), ((2, 3, 4), (4,)),
                 ((2, 0), (0, 3)), ((0, 3), (3, 4)), ((1, 3), (3, 1)), ((2, 3), (1, 3, 2))]


@pytest.mark.parametrize("dtype", [F32, I32, F16])
@pytest.mark.parametrize("shape_a, shape_b", MATMUL_SHAPES)
def test_matmul(shape_a: tuple, shape_b: tuple, dtype: Any) -> None:
  a, b = rand(shape_a, dtype, seed=1), rand(shape_b, dtype, seed=2)
  expected = np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(dtype)
  tol = {"rtol": 1e-2, "atol": 5e-2} if dtype is F16 else {}
  check(Tensor(a) @ Tensor(b), expected, **tol)
  if a.ndim >= 2: check(view_of(a, "flipped").matmul(view_of(b, "permuted")), expected, **tol)


def test_matmul_noncontiguous() -> None:
  a, b = rand((4, 3), F32, seed=1), rand((4, 5), F32, seed=2)
  check(Tensor(a).T @ Tensor(b), a.T @ b)
  check(Tensor(a)[::-1].T @ Tensor(b)[::-1], a[::-1].T @ b[::-1])
  check(Tensor(a).T.dot(Tensor(b)[:, 1]), a.T @ b[:, 1])
  check((Tensor(a) @ Tensor(a).T).sum(1), (a @ a.T).sum(1))
  check(Tensor(b).T @ (Tensor(a) * 2), b.T @ (a * 2))


@pytest.mark.parametrize("shape_a, shape_b", [((2, 3), (4, 5)), ((3,), (4,)), ((2, 3), (2,)), ((2, 2, 3), (3, 3, 4)),
                                              ((4, 2, 3), (2, 3, 4))])
def test_matmul_shape_errors(shape_a: tuple, shape_b: tuple) -> None:
  with pytest.raises(ValueError) as info:
    Tensor.zeros(*shape_a) @ Tensor.zeros(*shape_b)
  assert str(shape_a) in str(info.value) and str(shape_b) in str(info.value), str(info.value)


def test_matmul_0d_raises() -> None:
  with pytest.raises(ValueError):
    Tensor(2.0) @ Tensor.zeros(3)
  with pytest.raises(ValueError):
    Tensor.zeros(3).matmul(Tensor(2.0))


# *** realize and reading ***

def test_realize() -> None:
  x = Tensor(rand((2, 3), F32))
  y = x * 2 + 1
  assert buffer_base(y.uop) is None
  assert y.realize() is y
  assert buffer_base(y.uop) is not None and y.shape == (2, 3)
  check(y, x.numpy() * 2 + 1)
  y.realize()  # realizing twice is harmless
  check(y, x.numpy() * 2 + 1)
  check(Tensor.zeros(0, 3).realize(), np.zeros((0, 3), F32))
  check(Tensor(3).realize(), np.array(3, I32))


def test_numpy_and_tolist() -> None:
  arr = rand((2, 3), I32)
  out = Tensor(arr).numpy()
  assert isinstance(out, np.ndarray) and out.dtype == I32 and out.shape == (2, 3)
  out[:] = 99  # a copy: the tensor is unchanged
  np.testing.assert_array_equal(Tensor(arr).numpy(), arr)
  t = Tensor(arr)
  t.numpy()[:] = 99
  np.testing.assert_array_equal(t.numpy(), arr)
  assert (Tensor(arr) + 1).tolist() == (arr + 1).tolist()
  assert Tensor([[True, False]]).tolist() == [[True, False]]
  assert Tensor([1.5, 2.5]).tolist() == [1.5, 2.5]
  assert Tensor(np.zeros((2, 0), F32)).tolist() == [[], []]
  assert Tensor(7).tolist() == 7 and isinstance(Tensor(2.5).tolist(), float)


def test_item() -> None:
  assert Tensor(5).item() == 5 and type(Tensor(5).item()) is int
  assert Tensor(2.5).item() == 2.5 and type(Tensor(2.5).item()) is float
  assert Tensor(True).item() is True
  assert Tensor([[3]]).item() == 3
  assert (Tensor([1, 2, 3]).sum()).item() == 6
  assert (Tensor([1.0, 2.0]) * 2).max().item() == 4.0
  assert Tensor([4, 5, 6])[1].item() == 5
  for shape in ((2,), (0,), (1, 2)):
    with pytest.raises(ValueError):
      Tensor.zeros(*shape).item()


def test_len_size_numel() -> None:
  t = Tensor.zeros(3, 4)
  assert len(t) == 3 and t.size() == (3, 4) and t.size(-1) == 4 and t.numel() == 12 and t.ndim == 2
  with pytest.raises(TypeError):
    len(Tensor(1.0))


def test_realize_files_tensors_as_lazy_or_realized() -> None:
  from rawgrad.tensor import lazy_tensors, realized_tensors
  def filed(tensor: Tensor, tensors: object) -> bool: return any(t is tensor for t in tensors)
  a = Tensor(np.arange(3, dtype=np.float32))
  b = a * 2
  assert filed(a, realized_tensors) and filed(b, lazy_tensors) and not filed(b, realized_tensors)
  c = b + 1  # shares b's graph: updated by b's realize though c stays lazy
  b.realize()
  assert filed(b, realized_tensors) and not filed(b, lazy_tensors) and filed(c, lazy_tensors)
  b.assign(b + 1)
  assert filed(b, lazy_tensors) and not filed(b, realized_tensors)
  c.realize()
  b.realize()
  assert filed(b, realized_tensors) and filed(c, realized_tensors)
  np.testing.assert_array_equal(b.numpy(), [1, 3, 5])
  np.testing.assert_array_equal(c.numpy(), [1, 3, 5])


def test_one_element_tensors_are_python_values_as_in_torch() -> None:
  """bool() fell back to len() (a 1-element False tensor was True; `if (x > 5).any():` raised), float(), int() and
  f-strings raised, and numpy saw an array of Tensors."""
  assert bool(Tensor([0.0]) > 0) is False and bool(Tensor(1.0)) is True
  assert float(Tensor([2.5])) == 2.5 and int(Tensor(np.array(3, np.int64))) == 3
  assert f"{Tensor(3.14159):.2f}" == "3.14" and [10, 20, 30][Tensor(np.array(1, np.int32))] == 20
  assert 2 in Tensor([1, 2, 3]) and 5 not in Tensor([1, 2, 3])
  np.testing.assert_array_equal(np.asarray(Tensor([1.0, 2.0])), [1.0, 2.0])
  with pytest.raises(ShapeError, match=r"truth value .* shape \(2,\)"): bool(Tensor([1.0, 2.0]) > 0)
  with pytest.raises(DTypeError, match="integer tensors"): [1, 2][Tensor(1.0)]
  # and in lists of data, as torch.tensor takes them
  assert Tensor([Tensor(1.0), Tensor(2.0)]).tolist() == [1.0, 2.0] and Tensor([[Tensor(1), 2]]).tolist() == [[1, 2]]


def test_bfloat16_from_data_and_from_doubles_holds_the_values_torch_does() -> None:
  """Data given as bfloat16 was stored as integers in its 16 bits (1.5 read back 9.2e-41), and a double narrowed to
  bfloat16 in a kernel (bf16 tensor * 2: the 2 is a double parameter) called a libgcc routine many lack."""
  torch = pytest.importorskip("torch")
  values = [1.5, 3.0, -2.7, 1 + 2 ** -8 + 2 ** -40, 65520.0, float("nan"), float("inf"), 1e300]
  expected = torch.tensor(values, dtype=torch.bfloat16).float().numpy()
  doubles = np.array(values)
  for made in (Tensor(values, dtype=dtypes.bfloat16), Tensor(doubles, dtype=dtypes.bfloat16),
               Tensor(doubles).cast(dtypes.bfloat16)):
    np.testing.assert_array_equal(made.cast(dtypes.float32).numpy(), expected)
  half = Tensor(doubles).cast(dtypes.float16).cast(dtypes.float32).numpy()
  np.testing.assert_array_equal(half, torch.tensor(values, dtype=torch.float16).float().numpy())
  assert (Tensor([1.5], dtype=dtypes.bfloat16) * 2).cast(dtypes.float32).tolist() == [3.0]


def test_shape_dtype_and_index_mistakes_are_runtime_errors_too() -> None:
  """As README says: so `except RuntimeError` written for torch catches them (these were plain ValueError, TypeError
  and IndexError)."""
  from rawgrad import nn
  from rawgrad.errors import ArgumentError, IndexOutOfRange
  cases = [(lambda: nn.BatchNorm(3)(Tensor(np.zeros((2, 4, 5, 5), np.float32))), ShapeError),
           (lambda: nn.LayerNorm(4)(Tensor(np.zeros((2, 3), np.float32))), ShapeError),
           (lambda: Tensor([1.0, 2.0]).topk(3), ArgumentError), (lambda: Tensor([[1, 2], [3]]), ShapeError),
           (lambda: Tensor([1.0, 2.0]) & Tensor([1.0, 2.0]), DTypeError),
           (lambda: Tensor([1.0, 2.0, 3.0])[Tensor([True, False])], IndexOutOfRange)]
  for make, error in cases:
    with pytest.raises(error) as raised: make()
    assert isinstance(raised.value, RuntimeError)


def test_realize_holds_the_collector_off_and_restores_it(monkeypatch: pytest.MonkeyPatch) -> None:
  seen = []
  schedule = tensor_module.cached_schedule

  def watched(*args, **kwargs):
    seen.append(gc.isenabled())
    return schedule(*args, **kwargs)
  monkeypatch.setattr(tensor_module, "cached_schedule", watched)
  assert gc.isenabled()
  np.testing.assert_equal((Tensor([1.0, 2.0]) * 3).numpy(), [3.0, 6.0])
  assert seen == [False] and gc.isenabled()
  gc.disable()  # a program that runs without the collector keeps it off
  try:
    (Tensor([1.0]) + 1).realize()
    assert not gc.isenabled()
  finally:
    gc.enable()


def test_a_failed_realize_turns_the_collector_back_on(monkeypatch: pytest.MonkeyPatch) -> None:

  def failing(*args, **kwargs):
    raise RuntimeError("scheduler failed")
  monkeypatch.setattr(tensor_module, "cached_schedule", failing)
  with pytest.raises(RuntimeError, match="scheduler failed"):
    (Tensor([1.0]) + 1).realize()
  assert gc.isenabled()
