"""Simplify the index of a gated load with what its gate guarantees.

A padded, strided view (the gradient of a convolution, say) reaches a kernel as `x % c` and `x // c` terms whose gate
reads `x % c < b`. Write x = c*q + r with r's coefficients reduced to (-c/2, c/2]: where r >= 0, `x % c` is r and
`x // c` is q; where r < 0, `x % c` is r + c, and when that is never below b those elements are gated out anyway. So
under the gate the index may use r and q, which are affine, and the gate becomes `0 <= r < b`. To let the symbolic
rules see that 0 <= r < b inside the index, r enters it clamped to that interval (exact where the gate holds, and a
gated access touches no memory), is simplified, and the clamp is removed again where nothing else needs it.

The same holds for the loads inside `WHERE(g, value, c)` (rangeify's zero padding): value only matters where g holds,
so its ungated loads may use an index simplified under g, as long as that index stays inside the buffer everywhere.

After this pass: every gate clause of the form `x % c < b` that could be resolved reads `0 <= r < b`, and the index is
simplified under it.
"""
from __future__ import annotations

import functools

from rawgrad.compiler.ir import Ops, UOp
from rawgrad.compiler.rewrite import substitute
from rawgrad.compiler.symbolic import simplify
from rawgrad.dtype import dtypes


@functools.lru_cache(maxsize=1024)
def simplify_gated_indices(ast: UOp) -> UOp:
  """The kernel with every gated load's index simplified by its gate, and the loads under a WHERE by its condition."""
  new: dict[UOp, UOp] = {}
  for node in ast.toposort:
    sources = tuple(new[source] for source in node.src)
    rebuilt = node if sources == node.src else node.replace(src=sources)
    if rebuilt.op is Ops.INDEX and len(rebuilt.src) == 3: rebuilt = _use_gate(rebuilt)
    if rebuilt.op is Ops.WHERE and rebuilt.dtype != dtypes.index: rebuilt = _use_condition(rebuilt)
    new[node] = rebuilt
  return new[ast]


def _use_condition(where: UOp) -> UOp:
  """WHERE(g, value, other): g in its simplified form, and the ungated loads of value (outside nested reductions)
  indexed as simplified under g."""
  condition, value, other = where.src
  if condition.dtype == dtypes.bool and (resolved := _resolved_condition(condition)) is not condition:
    where = where.replace(src=(resolved, value, other))
  mapping = {}
  for node in value.reachable_without_entering(lambda node: node.op is Ops.REDUCE):
    if node.op is not Ops.LOAD or node.src[0].op is not Ops.INDEX or len(node.src[0].src) != 2: continue
    buffer, address = node.src[0].src
    if buffer.op is not Ops.DEFINE_GLOBAL: continue
    simplified = _use_gate(node.src[0].replace(src=(buffer, address, condition))).src[1]
    if simplified is not address and 0 <= simplified.vmin and simplified.vmax < buffer.dtype.size:
      mapping[node] = node.replace(src=(node.src[0].replace(src=(buffer, simplified)),))
  return where.replace(src=(where.src[0], substitute(value, mapping), other)) if mapping else where


def _resolved_condition(condition: UOp) -> UOp:
  """The condition with each resolvable `x % c < b` written `0 <= r < b` (equal everywhere, not just under itself)."""
  new_clauses = []
  for clause in clauses(condition):
    resolved = _resolve(clause)
    new_clauses.append(clause if resolved is None else (resolved[0] < 0).logical_not() & (resolved[0] < resolved[1]))
  if all(new is old for new, old in zip(new_clauses, clauses(condition))): return condition
  result = new_clauses[0]
  for clause in new_clauses[1:]: result = result & clause
  return simplify(result)


def _use_gate(index: UOp) -> UOp:
  buffer, address, gate = index.src
  eliminated: dict[UOp, UOp] = {}   # a range -> the same value written with the bounded variable (where the gate holds)
  unbound: dict[UOp, UOp] = {}      # the bounded variable -> r
  new_clauses = []
  for clause in clauses(gate):
    resolved = _resolve(clause)
    pivot = _pivot(resolved[0], set(eliminated)) if resolved is not None else None
    if resolved is None or pivot is None:
      new_clauses.append(clause)
      continue
    remainder, bound = resolved
    bounded = UOp.variable(f"gated remainder {len(unbound)}", 0, bound - 1)
    coefficient = _linear(remainder)[0][pivot]
    rest = simplify(remainder - pivot * coefficient)
    eliminated[pivot] = (bounded - rest) * coefficient  # coefficient is 1 or -1, its own inverse
    unbound[bounded] = remainder
    new_clauses.append((remainder < 0).logical_not() & (remainder < bound))
  if not eliminated: return index
  simplified = simplify(substitute(simplify(substitute(address, eliminated)), unbound))
  new_gate = new_clauses[0]
  for clause in new_clauses[1:]: new_gate = new_gate & clause
  return index.replace(src=(buffer, simplified, simplify(new_gate)))


def _pivot(remainder: UOp, taken: set[UOp]) -> UOp | None:
  """A range the remainder uses with coefficient 1 or -1 (so it can be solved for), not solved for already; a +1 one
  first, which keeps the rewritten sums non-negative."""
  terms, _ = _linear(remainder)
  candidates = [(k != 1, term) for term, k in (terms or {}).items()
                if k in (1, -1) and term.op is Ops.RANGE and term not in taken]
  return min(candidates, key=lambda pair: (pair[0], pair[1].arg[0]))[1] if candidates else None


def clauses(gate: UOp) -> list[UOp]:
  """The conditions a gate is the AND of."""
  if gate.op is Ops.AND and gate.dtype == dtypes.bool: return clauses(gate.src[0]) + clauses(gate.src[1])
  return [gate]


def _resolve(clause: UOp) -> tuple[UOp, int] | None:
  """For a clause `x % c < b` whose negative remainders are all gated out: (r, b)."""
  if clause.op is not Ops.CMPLT or clause.src[1].op is not Ops.CONST: return None
  modulo, bound = clause.src[0], clause.src[1].arg
  if modulo.op is not Ops.MOD or modulo.src[1].op is not Ops.CONST or modulo.dtype != dtypes.index: return None
  x, c = modulo.src[0], modulo.src[1].arg
  if c <= 1 or not 0 < bound <= c or x.vmin < 0: return None
  terms, constant = _linear(x)
  if terms is None: return None
  remainder_terms = {term: _centered(k, c) for term, k in terms.items()}
  remainder_constant = _centered(constant, c)
  remainder = _build(remainder_terms, remainder_constant)
  low, high = remainder.vmin, remainder.vmax
  if low <= -c or high >= c or (low < 0 and low + c < bound): return None
  return remainder, bound


def _centered(k: int, c: int) -> int:
  residue = k % c
  return residue - c if residue > c // 2 else residue


def _linear(x: UOp) -> tuple[dict[UOp, int] | None, int]:
  """x as {term: coefficient} plus a constant, or None when it is not a sum of constant multiples."""
  terms: dict[UOp, int] = {}
  constant = 0
  stack = [(x, 1)]
  while stack:
    node, factor = stack.pop()
    if node.op is Ops.ADD: stack += [(node.src[0], factor), (node.src[1], factor)]
    elif node.op is Ops.CONST: constant += factor * node.arg
    elif node.op is Ops.MUL and node.src[1].op is Ops.CONST: stack.append((node.src[0], factor * node.src[1].arg))
    elif node.op in (Ops.RANGE, Ops.DEFINE_VAR): terms[node] = terms.get(node, 0) + factor
    else: return None, 0
  return terms, constant


def _build(terms: dict[UOp, int], constant: int) -> UOp:
  total = UOp.const(dtypes.index, constant)
  for term, k in terms.items():
    if k: total = total + term * k
  return simplify(total)
