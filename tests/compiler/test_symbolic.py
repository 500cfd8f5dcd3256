"""Symbolic algebra: simplification keeps every value, is idempotent, and bounds hold."""
import itertools
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rawgrad.compiler.ir import Ops, UOp, exec_alu
from rawgrad.compiler.symbolic import Variable, evaluate, plus_constant, simplify
from rawgrad.dtype import dtypes


# *** random expressions ***

@st.composite
def variables(draw: st.DrawFn, count: int, dtype=dtypes.index) -> list[UOp]:
  result = []
  for i in range(count):
    low = draw(st.integers(0 if dtypes.is_unsigned(dtype) else -8, 8))
    high = draw(st.integers(low, low + 12))
    result.append(UOp.variable(f"v{i}", low, high, dtype))
  return result


def _expression(draw: st.DrawFn, leaves: list[UOp], depth: int) -> UOp:
  dtype = leaves[0].dtype
  if depth == 0 or draw(st.integers(0, 3)) == 0:
    if draw(st.booleans()): return draw(st.sampled_from(leaves))
    return UOp.const(dtype, draw(st.integers(-9, 9)))
  a = _expression(draw, leaves, depth - 1)
  kind = draw(st.sampled_from(["add", "sub", "mul_const", "mul", "div", "mod", "max", "where_lt", "div_var"]))
  if kind == "add": return a + _expression(draw, leaves, depth - 1)
  if kind == "sub": return a - _expression(draw, leaves, depth - 1)
  if kind == "mul_const": return a * draw(st.integers(-6, 6))
  if kind == "mul": return a * _expression(draw, leaves, depth - 1)
  if kind == "div": return a // draw(st.integers(1, 9))
  if kind == "mod": return a % draw(st.integers(1, 9))
  if kind == "max": return a.maximum(_expression(draw, leaves, depth - 1))
  if kind == "div_var":
    # a divisor whose bounds exclude zero
    return a // (draw(st.sampled_from(leaves)).maximum(0) + 1)
  b, c = _expression(draw, leaves, depth - 1), _expression(draw, leaves, depth - 1)
  return (a < b).where(c, a)


@st.composite
def expressions(draw: st.DrawFn, dtype=dtypes.index) -> tuple[UOp, list[UOp]]:
  leaves = draw(variables(draw(st.integers(1, 3)), dtype))
  return _expression(draw, leaves, draw(st.integers(1, 4))), leaves


def _assignments(leaves: list[UOp], limit: int = 400) -> list[dict[UOp, int]]:
  ranges = [range(v.arg[1], v.arg[2] + 1) for v in leaves]
  every = list(itertools.product(*ranges))
  if len(every) > limit: every = random.Random(0).sample(every, limit)
  return [dict(zip(leaves, values)) for values in every]


def _values(expression: UOp, assignments: list[dict[UOp, int]]) -> list:
  out = []
  for assignment in assignments:
    try:
      out.append(evaluate(expression, assignment))
    except ZeroDivisionError:
      out.append("undefined")
  return out


def _check_simplification(expression: UOp, leaves: list[UOp]) -> None:
  simplified = simplify(expression)
  assignments = _assignments(leaves)
  before, after = _values(expression, assignments), _values(simplified, assignments)
  for assignment, want, got in zip(assignments, before, after):
    if want == "undefined": continue
    assert want == got, (f"{expression.render()} -> {simplified.render()} at "
                         f"{ {k.arg[0]: v for k, v in assignment.items()} }: {want} != {got}")
    assert expression.vmin <= want <= expression.vmax, f"{expression.render()}: {want} outside bounds"
    assert simplified.vmin <= got <= simplified.vmax, f"{simplified.render()}: {got} outside bounds"
  assert simplify(simplified) is simplified, f"not idempotent: {simplified.render()} -> {simplify(simplified).render()}"


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expressions())
def test_simplify_keeps_values_on_index_expressions(case: tuple[UOp, list[UOp]]) -> None:
  _check_simplification(*case)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expressions(), st.integers(-40, 40))
def test_plus_constant_keeps_values(case: tuple[UOp, list[UOp]], constant: int) -> None:
  expression, leaves = case
  simplified = simplify(expression)
  shifted = plus_constant(simplified, constant)
  assignments = _assignments(leaves)
  for want, got in zip(_values(expression, assignments), _values(shifted, assignments)):
    if want != "undefined": assert got == want + constant, f"{simplified.render()} + {constant}: {shifted.render()}"


@given(st.lists(st.integers(-9, 9), min_size=1, max_size=3), st.integers(-40, 40), st.integers(-40, 40))
def test_plus_constant_is_what_simplify_makes_of_a_sum(coefficients: list[int], start: int, constant: int) -> None:
  ranges = [UOp.range(8, axis) for axis in range(len(coefficients))]
  index = simplify(sum((r * c for r, c in zip(ranges, coefficients)), UOp.const(dtypes.index, start)))
  assert plus_constant(index, constant) is simplify(index + constant)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expressions(dtypes.int8))
def test_simplify_keeps_values_with_int8_wraparound(case: tuple[UOp, list[UOp]]) -> None:
  # int8 wraps at +-128: rules that assume unbounded integers would change values here
  _check_simplification(*case)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expressions(dtypes.uint8))
def test_simplify_keeps_values_with_unsigned_wraparound(case: tuple[UOp, list[UOp]]) -> None:
  _check_simplification(*case)


@settings(max_examples=200, deadline=None)
@given(low=st.integers(-300, 300), width=st.integers(0, 200), radices=st.lists(st.integers(1, 7), min_size=1,
       max_size=3), whole=st.booleans(), skew=st.sampled_from([0, 0, 0, 1]), scale=st.integers(1, 3))
def test_digits_put_back_together_keep_values(low: int, width: int, radices: list[int], whole: bool, skew: int,
                                              scale: int) -> None:
  """x's mixed-radix digits `((x//c)%d)*c`, the lowest `x%d0`, with or without the top `(x//C)*C`, times a scale,
  over negative and positive x; `skew` breaks one coefficient, so the digits must not be put together."""
  x = Variable("x", low, low + width)
  expression, place = (x % radices[0]) * scale, radices[0]
  for radix in radices[1:]:
    expression = expression + ((x // place) % radix) * (place * scale + skew)
    place *= radix
  if whole: expression = expression + (x // place) * (place * scale)
  _check_simplification(expression, [x])
  if whole and width and (not skew or len(radices) == 1):
    assert simplify(expression).render() == ("x" if scale == 1 else f"(x*{scale})")


# *** the indexer's simplifications, spelled out ***

r0, r1, r2 = UOp.range(4, 0), UOp.range(3, 1), UOp.range(12, 2)
a, b = Variable("a", 0, 10), Variable("b", 0, 1000)


@pytest.mark.parametrize("expression, expected", [
  ((a * 4 + r0) // 4, "a"),
  ((a * 4 + r0) % 4, "r0"),
  ((r0 * 4 + r1) * 3 // 12, "r0"),
  ((r2 // 4) * 4 + r2 % 4, "r2"),
  (((r0 * 12 + r2) // 4) % 3, "(r2//4)"),
  ((r0 + 1) * 4 - 4, "(r0*4)"),
  (r0 < 4, "True"),
  (r0 - 1 < 3, "True"),
  (r0 * 2 < 5, "(r0<3)"),
  (r0 + r1 + r0, "((r0*2)+r1)"),
  (r1 + r0, "(r0+r1)"),
  (r0 % 4, "r0"),
  (r0 // 4, "0"),
  ((a + 1).maximum(0), "(a+1)"),
  ((r0 < 10).where(r1, r2), "r1"),
  (r0 * 0 + r1 * 1, "r1"),
  ((a // 2) // 3, "(a//6)"),
  ((a % 12) % 4, "(a%4)"),
  ((a * 6) // 4, "(a+(a//2))"),
  # a flat index taken apart digit by digit (a reshape to (.., 5, 5)) and put back together
  (((b // 5) % 5) * 5 + b % 5, "(b%25)"),
  ((b // 25) * 25 + ((b // 5) % 5) * 5 + b % 5, "b"),
  (((b // 5) % 5) * 10 + (b % 5) * 2, "((b%25)*2)"),
])
def test_indexer_simplifications(expression: UOp, expected: str) -> None:
  assert simplify(expression).render() == expected


def test_equal_expressions_become_the_same_node() -> None:
  assert simplify(r0 * 4 + r1 + 2) is simplify(2 + r1 + 4 * r0)
  assert simplify((r0 + r1) * 3) is simplify(r1 * 3 + r0 * 3)


def test_rules_respect_wraparound() -> None:
  x = Variable("x", 0, 100)
  wide = UOp(Ops.CAST, dtypes.int8, (x,))
  # x*4 may wrap in int8, so (x*4)//4 is not x
  assert simplify((wide * 4) // 4) is not wide
  assert evaluate(simplify((wide * 4) // 4), {x: 100}) == exec_alu(Ops.IDIV, dtypes.int8, (exec_alu(
    Ops.MUL, dtypes.int8, (100, 4)), 4))


# *** constant folding with exact dtype semantics ***

@pytest.mark.parametrize("op, dtype, operands, expected", [
  (Ops.ADD, dtypes.int8, (100, 100), -56),
  (Ops.ADD, dtypes.uint8, (200, 100), 44),
  (Ops.MUL, dtypes.int32, (2**16, 2**16), 0),
  (Ops.MUL, dtypes.int64, (2**62, 4), 0),
  (Ops.IDIV, dtypes.int32, (-7, 2), -3),
  (Ops.IDIV, dtypes.int32, (7, -2), -3),
  (Ops.MOD, dtypes.int32, (-7, 2), -1),
  (Ops.MOD, dtypes.int32, (7, -2), 1),
  (Ops.IDIV, dtypes.int32, (-2**31, -1), -2**31),
  (Ops.SHL, dtypes.uint8, (0xF0, 2), 0xC0),
  (Ops.SHR, dtypes.int8, (-16, 2), -4),
  (Ops.SHR, dtypes.uint8, (0xF0, 4), 0x0F),
  (Ops.XOR, dtypes.bool, (True, True), False),
  (Ops.CMPLT, dtypes.bool, (3, 4), True),
  (Ops.MAX, dtypes.float32, (1.0, float("nan")), "nan"),
  (Ops.FDIV, dtypes.float32, (1.0, 0.0), float("inf")),
  (Ops.FDIV, dtypes.float32, (-1.0, 0.0), float("-inf")),
  (Ops.FDIV, dtypes.float32, (0.0, 0.0), "nan"),
  (Ops.ADD, dtypes.float16, (65504.0, 32.0), float("inf")),
  (Ops.ADD, dtypes.float32, (1.0, 1e-8), 1.0),
  (Ops.EXP2, dtypes.float32, (200.0,), float("inf")),
  (Ops.LOG2, dtypes.float32, (0.0,), float("-inf")),
  (Ops.SQRT, dtypes.float32, (-1.0,), "nan"),
  (Ops.TRUNC, dtypes.float32, (-2.5,), -2.0),
])
def test_constant_folding(op: Ops, dtype, operands: tuple, expected) -> None:
  source_dtype = dtypes.int32 if op is Ops.CMPLT else dtype
  node = UOp(op, dtype, tuple(UOp.const(source_dtype, v) for v in operands))
  folded = simplify(node)
  assert folded.op is Ops.CONST
  if expected == "nan": assert folded.arg != folded.arg
  else: assert folded.arg == expected and type(folded.arg) is type(expected)


def test_division_by_zero_is_not_folded() -> None:
  node = UOp.const(dtypes.int32, 1) // UOp.const(dtypes.int32, 0)
  assert simplify(node) is node


def test_float_identities_that_would_be_wrong_are_not_applied() -> None:
  x = UOp(Ops.DEFINE_VAR, dtypes.float32, arg=("f", 0, 1))
  assert simplify(x * 0.0) is not UOp.const(dtypes.float32, 0.0)  # x could be inf or nan
  assert simplify(x + 0.0).op is Ops.ADD  # -0.0 + 0.0 is 0.0
  assert simplify(x * 1.0) is x


def test_variable_bounds() -> None:
  v = Variable("n", 2, 9)
  assert (v.vmin, v.vmax) == (2, 9)
  assert ((v * -3) + 1).vmin == -26 and ((v * -3) + 1).vmax == -5
  assert (v % 4).vmax == 3 and (v // 4).vmax == 2
  with pytest.raises(ValueError, match="empty range"): Variable("bad", 3, 2)
  assert evaluate(v * 2 + 1, {v: 5}) == 11
  with pytest.raises(KeyError, match="needs a value for n"): evaluate(v + 1, {})
