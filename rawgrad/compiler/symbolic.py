"""Symbolic integer and boolean algebra as rewrite rules: constant folding, bounds, and the simplifications an
indexer needs (`(r0*4 + r1) // 4 -> r0` when `0 <= r1 < 4`)."""
from __future__ import annotations

import math
from typing import Any

from rawgrad.compiler.ir import GroupOp, Ops, UOp, exec_alu
from rawgrad.compiler.rewrite import PatternMatcher, RewriteCache, UPat, graph_rewrite
from rawgrad.dtype import DType, dtypes


def Variable(name: str, min_value: int, max_value: int) -> UOp:
  """A symbolic integer `min_value <= name <= max_value`, e.g. a sequence length bound at run time."""
  return UOp.variable(name, min_value, max_value)


def _is_int(node: UOp) -> bool:
  return isinstance(node.dtype, DType) and node.dtype.count == 1 and dtypes.is_int(node.dtype)


def _is_int_or_bool(node: UOp) -> bool:
  return isinstance(node.dtype, DType) and node.dtype.count == 1 and (dtypes.is_int(node.dtype) or
                                                                        dtypes.is_bool(node.dtype))


def _fits_without_wrapping(node: UOp) -> bool:
  """True when the node's value provably never wrapped around its dtype (index never wraps)."""
  if node.dtype == dtypes.index: return True
  return dtypes.min(node.dtype) < node.vmin and node.vmax < dtypes.max(node.dtype)


# *** constant folding ***

def fold_constants(node: UOp) -> UOp | None:
  try:
    value = exec_alu(node.op, node.dtype, tuple(source.arg for source in node.src))
  except (ZeroDivisionError, ValueError, OverflowError):
    return None  # undefined behaviour stays in the graph for the target to decide, never folded to a guess
  return UOp.const(node.dtype, value)


def fold_by_bounds(node: UOp) -> UOp | None:
  """An integer or boolean node whose bounds allow one value is that value."""
  if not _is_int_or_bool(node) or node.vmin != node.vmax: return None
  return UOp.const(node.dtype, node.vmin)


# *** sums and products of integers: flatten, combine like terms, sort ***

MAX_FLAT_TERMS = 64  # a sum or product shared in itself (x = x + x, repeated) would flatten to 2**depth terms


def sum_terms(node: UOp) -> list[tuple[int, UOp | None]]:
  """A sum as (coefficient, term) pairs; the constant part has term None. Flattening stops at MAX_FLAT_TERMS."""
  terms: list[tuple[int, UOp | None]] = []
  pending = [node]
  while pending:
    current = pending.pop()
    if current.op is Ops.ADD and len(terms) + len(pending) < MAX_FLAT_TERMS: pending.extend(reversed(current.src))
    elif current.op is Ops.CONST: terms.append((current.arg, None))
    elif current.op is Ops.MUL and current.src[1].op is Ops.CONST: terms.append((current.src[1].arg, current.src[0]))
    else: terms.append((1, current))
  return terms


def _recombine_divmod(coefficients: dict[UOp, int]) -> None:
  """`(x//c)*c*k + (x%c)*k` is `x*k`, and `((x//c)%d)*c*k + (x%c)*k` is `(x%(c*d))*k`: put back together what a
  reshape took apart, one digit at a time (each identity holds for floored and truncated division alike)."""
  pending = list(coefficients)
  while pending:
    term = pending.pop()
    if term.op is not Ops.MOD or term.src[1].op is not Ops.CONST or term not in coefficients: continue
    x, divisor = term.src[0], term.src[1]
    if divisor.arg <= 0: continue
    quotient = UOp(Ops.IDIV, term.dtype, (x, divisor))
    k = coefficients[term]
    if coefficients.get(quotient) == k * divisor.arg: whole = x
    elif (digit := next((t for t in coefficients if t.op is Ops.MOD and t.src[0] is quotient
                         and t.src[1].op is Ops.CONST and t.src[1].arg > 0 and coefficients[t] == k * divisor.arg),
                        None)) is not None:
      quotient, whole = digit, x % UOp.const(term.dtype, divisor.arg * digit.src[1].arg)
    else: continue
    del coefficients[term], coefficients[quotient]
    coefficients[whole] = coefficients.get(whole, 0) + k
    pending.append(whole)


def build_sum(dtype: DType, coefficients: dict[UOp, int], constant: int) -> UOp:
  """The canonical sum: terms sorted by their stable order, coefficient on the right, constant last."""
  result: UOp | None = None
  for term in sorted(coefficients, key=lambda t: t.order_key):
    coefficient = coefficients[term]
    if coefficient == 0: continue
    part = term if coefficient == 1 else UOp(Ops.MUL, dtype, (term, UOp.const(dtype, coefficient)))
    result = part if result is None else UOp(Ops.ADD, dtype, (result, part))
  constant_node = UOp.const(dtype, constant)
  if result is None: return constant_node
  return result if constant_node.arg == 0 else UOp(Ops.ADD, dtype, (result, constant_node))


def _collect_sum(node: UOp) -> tuple[dict[UOp, int], int]:
  coefficients: dict[UOp, int] = {}
  constant = 0
  for coefficient, term in sum_terms(node):
    if term is None: constant += coefficient
    else: coefficients[term] = coefficients.get(term, 0) + coefficient
  _recombine_divmod(coefficients)
  return coefficients, constant


def normalize_sum(node: UOp) -> UOp | None:
  if not _is_int(node): return None
  coefficients, constant = _collect_sum(node)
  result = build_sum(node.dtype, coefficients, constant)
  return None if result is node else result


def _product_factors(node: UOp) -> list[UOp]:
  factors: list[UOp] = []
  pending = [node]
  while pending:
    current = pending.pop()
    if current.op is Ops.MUL and len(factors) + len(pending) < MAX_FLAT_TERMS: pending.extend(reversed(current.src))
    else: factors.append(current)
  return factors


def normalize_product(node: UOp) -> UOp | None:
  """Integer products: constants multiplied together and moved last, other factors sorted."""
  if not _is_int(node): return None
  factors, constant = [], 1
  for factor in _product_factors(node):
    if factor.op is Ops.CONST: constant *= factor.arg
    else: factors.append(factor)
  constant_node = UOp.const(node.dtype, constant)
  if constant_node.arg == 0: return constant_node
  result: UOp | None = None
  for factor in sorted(factors, key=lambda f: f.order_key):
    result = factor if result is None else UOp(Ops.MUL, node.dtype, (result, factor))
  if result is None: return constant_node
  if constant_node.arg != 1: result = UOp(Ops.MUL, node.dtype, (result, constant_node))
  return None if result is node else result


def distribute_constant(node: UOp, total: UOp, factor: UOp) -> UOp | None:
  """(a + b) * c -> a*c + b*c for integers, so sums stay flat."""
  if not _is_int(node): return None
  return total.src[0] * factor + total.src[1] * factor


# *** integer division and remainder by a positive constant ***

def fold_divmod(node: UOp, x: UOp, divisor: UOp) -> UOp | None:
  if not _is_int(node) or divisor.arg <= 0: return None
  c = divisor.arg
  if c == 1: return x if node.op is Ops.IDIV else UOp.const(node.dtype, 0)
  # truncating division is monotonic: equal quotients at both bounds mean one quotient everywhere
  if _fits_without_wrapping(x) and not (math.isinf(x.vmin) or math.isinf(x.vmax)):
    low, high = exec_alu(Ops.IDIV, node.dtype, (x.vmin, c)), exec_alu(Ops.IDIV, node.dtype, (x.vmax, c))
    if low == high:
      return UOp.const(node.dtype, low) if node.op is Ops.IDIV else x - UOp.const(node.dtype, low * c)
  if x.op is Ops.IDIV and x.src[1].op is Ops.CONST and x.src[1].arg > 0 and node.op is Ops.IDIV:
    return x.src[0] // UOp.const(node.dtype, x.src[1].arg * c)
  if x.op is Ops.MOD and x.src[1].op is Ops.CONST and x.src[1].arg > 0 and x.src[1].arg % c == 0 and node.op is Ops.MOD:
    return x.src[0] % divisor
  if not _fits_without_wrapping(x): return None
  return _divide_common_factor(node, x, c) or _split_quotient(node, x, c)


def _divide_common_factor(node: UOp, x: UOp, c: int) -> UOp | None:
  """(g*y) // (g*c') -> y // c' and (g*y) % (g*c') -> (y % c') * g; exact for truncating division too."""
  coefficients, constant = _collect_sum(x)
  g = math.gcd(c, constant, *coefficients.values())
  if g <= 1: return None
  reduced = build_sum(node.dtype, {t: k // g for t, k in coefficients.items()}, constant // g)
  smaller = UOp.const(node.dtype, c // g)
  return reduced // smaller if node.op is Ops.IDIV else (reduced % smaller) * UOp.const(node.dtype, g)


def _split_quotient(node: UOp, x: UOp, c: int) -> UOp | None:
  """x = c*Q + R with R's coefficients in [0, c): x // c = Q + R // c and x % c = R % c when x >= 0 and R >= 0
  (truncating division equals floor division there)."""
  if x.vmin < 0: return None
  coefficients, constant = _collect_sum(x)
  quotient_terms = {t: k // c for t, k in coefficients.items() if k // c != 0}
  if not quotient_terms and constant // c == 0: return None
  remainder = build_sum(node.dtype, {t: k % c for t, k in coefficients.items()}, constant % c)
  if remainder.vmin < 0: return None
  divisor = UOp.const(node.dtype, c)
  if node.op is Ops.MOD: return remainder % divisor
  return build_sum(node.dtype, quotient_terms, constant // c) + remainder // divisor


# *** comparisons ***

def fold_compare_sum(node: UOp, x: UOp, bound: UOp) -> UOp | None:
  """For index arithmetic (which never wraps): `sum + k < b` -> `sum < b - k`, and a common factor g of the sum's
  coefficients divides out: `g*y < b` -> `y < ceil(b/g)`."""
  if x.dtype != dtypes.index: return None
  coefficients, constant = _collect_sum(x)
  if not coefficients: return None
  limit = bound.arg - constant
  g = math.gcd(*coefficients.values())
  if g < 0: g = -g
  if g > 1: coefficients, limit = {t: k // g for t, k in coefficients.items()}, -(-limit // g)
  result = build_sum(x.dtype, coefficients, 0) < UOp.const(x.dtype, limit)
  return None if result is node else result


def fold_max_by_bounds(a: UOp, b: UOp) -> UOp | None:
  if not _is_int(a): return None
  if a.vmin >= b.vmax: return a
  if b.vmin >= a.vmax: return b
  return None


def _swap_operands(node: UOp) -> UOp | None:
  """Canonical order of commutative operands: constants last, otherwise by the stable node order."""
  if node.op in (Ops.ADD, Ops.MUL) and _is_int(node): return None  # normalize_sum/normalize_product order these
  a, b = node.src
  if a.op is Ops.CONST and b.op is not Ops.CONST: return node.replace(src=(b, a))
  if a.op is not Ops.CONST and b.op is not Ops.CONST and b.order_key < a.order_key: return node.replace(src=(b, a))
  return None


def _false_like(x: UOp) -> UOp:
  return UOp.const(dtypes.bool, False)


x_var = UPat.var("x")
int_dtypes = (dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.uint16, dtypes.uint32,
              dtypes.uint64, dtypes.index)

pm_symbolic = PatternMatcher([
  # constants: fold any ALU op on constants, and any integer/boolean op whose bounds allow one value
  (UPat(GroupOp.ALU, src=UPat(Ops.CONST), name="node"), fold_constants),
  (UPat(Ops.CAST, src=(UPat(Ops.CONST),), name="node"), fold_constants),
  (UPat(GroupOp.ALU, name="node"), fold_by_bounds),
  # identities that hold exactly for every dtype
  (x_var * 1, lambda x: x),
  (UPat(Ops.WHERE, src=(UPat.cvar("c"), UPat.var("a"), UPat.var("b"))), lambda c, a, b: a if c.arg else b),
  (UPat(Ops.WHERE, src=(UPat.var(), x_var, x_var)), lambda x: x),
  (UPat(Ops.WHERE, dtype=dtypes.bool, src=(x_var, UPat.const(dtypes.bool, True), UPat.const(dtypes.bool, False))),
   lambda x: x),
  (UPat(Ops.WHERE, dtype=dtypes.bool, src=(x_var, UPat.const(dtypes.bool, False), UPat.const(dtypes.bool, True))),
   lambda x: x.logical_not()),
  # identities for integers and booleans (for floats they would change nan, inf or -0.0)
  (UPat.var("x", int_dtypes) + 0, lambda x: x),
  (UPat.var("x", int_dtypes) * 0, lambda x: UOp.const(x.dtype, 0)),
  (UPat(Ops.MAX, src=(x_var, x_var)), lambda x: x),
  (UPat(Ops.MAX, src=(UPat.var("a", int_dtypes), UPat.var("b"))), fold_max_by_bounds),
  (UPat(Ops.CMPLT, src=(UPat.var("x", int_dtypes), UPat.var("x"))), _false_like),
  (UPat(Ops.CMPNE, src=(UPat.var("x", int_dtypes), UPat.var("x"))), _false_like),
  # booleans and bits
  (UPat(Ops.AND, src=(x_var, x_var)), lambda x: x),
  (UPat(Ops.OR, src=(x_var, x_var)), lambda x: x),
  (UPat(Ops.XOR, src=(x_var, x_var)), lambda x: UOp.const(x.dtype, 0 if _is_int(x) else False)),
  (UPat.var("x", dtypes.bool) & True, lambda x: x),
  (UPat.var("x", dtypes.bool) & False, lambda x: UOp.const(dtypes.bool, False)),
  (UPat.var("x", dtypes.bool) | True, lambda x: UOp.const(dtypes.bool, True)),
  (UPat.var("x", dtypes.bool) | False, lambda x: x),
  (UPat.var("x", dtypes.bool) ^ False, lambda x: x),
  ((x_var ^ UPat.cvar("a")) ^ UPat.cvar("b"), lambda x, a, b: x ^ UOp.const(a.dtype, exec_alu(Ops.XOR, a.dtype,
                                                                                             (a.arg, b.arg)))),
  # canonical forms: flat sorted sums and products of integers, constants last
  (UPat(Ops.ADD, name="node"), normalize_sum),
  (UPat(Ops.MUL, src=(UPat(Ops.ADD, name="total"), UPat.cvar("factor")), name="node"), distribute_constant),
  (UPat(Ops.MUL, name="node"), normalize_product),
  (UPat(GroupOp.Commutative & GroupOp.Binary, name="node"), _swap_operands),
  # integer division and remainder by a positive constant
  (UPat((Ops.IDIV, Ops.MOD), src=(x_var, UPat.cvar("divisor")), name="node"), fold_divmod),
  # comparisons of index sums with a constant
  (UPat(Ops.CMPLT, src=(x_var, UPat.cvar("bound")), name="node"), fold_compare_sum),
])


_simplified = RewriteCache()


def simplify(node: UOp) -> UOp:
  """The canonical, simplified form of an expression (to a fixed point of pm_symbolic). Results are remembered:
  the scheduler simplifies the same index expressions many times."""
  return graph_rewrite(node, pm_symbolic, name="pm_symbolic", cache=_simplified)


def plus_constant(node: UOp, constant: int) -> UOp:
  """A simplified integer expression plus a constant, as simplify would make the sum (the constant joins the
  constant term a simplified sum keeps last) without walking the expression again."""
  if constant == 0: return node
  if node.op is Ops.CONST: return UOp.const(node.dtype, node.arg + constant)
  if node.op is Ops.ADD and node.src[1].op is Ops.CONST:
    total = node.src[1].arg + constant
    return node.src[0] if total == 0 else node.replace(src=(node.src[0], UOp.const(node.dtype, total)))
  return UOp(Ops.ADD, node.dtype, (node, UOp.const(node.dtype, constant)))


def evaluate(node: UOp, assignment: dict[UOp, Any]) -> Any:
  """The value of an expression with variables and ranges set by `assignment`, with exact dtype semantics."""
  values: dict[UOp, Any] = {}
  for current in node.toposort:
    if current in assignment: values[current] = assignment[current]
    elif current.op is Ops.CONST: values[current] = current.arg
    elif current.op is Ops.BIND: values[current] = values[current.src[1]]
    elif current.op in GroupOp.ALU or current.op is Ops.CAST:
      values[current] = exec_alu(current.op, current.dtype, tuple(values[source] for source in current.src))
    elif current.op in (Ops.DEFINE_VAR, Ops.RANGE):
      raise KeyError(f"evaluate needs a value for {current.render()}")
    else:
      raise ValueError(f"evaluate cannot compute {current.op}")
  return values[node]
