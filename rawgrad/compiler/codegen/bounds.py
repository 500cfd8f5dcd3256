"""Run a sum's loop only over the iterations where its terms can be nonzero.

A convolution over a padded input reads rows above and below the image: `x[y + ky - p]`, gated by `0 <= y + ky - p
< h`, and multiplied by a weight. For an output row near the edge most of the window's rows are padding, and every
iteration over them adds zero. When a factor of a sum's product is zero wherever such a gate fails (the gated load
itself, or the WHERE rangeify's padding puts around it), the window's loop `ky` only needs
`max(0, p - y) <= ky < min(k, h + p - y)`: it becomes `ky' + max(0, p - y)` over `ky'` in
`[0, min(k, h + p - y) - max(0, p - y))`, a loop whose length depends on the output row, and the gate clauses that
gave the bounds hold everywhere in it, so they go.

After this pass a REDUCE range's size may be an expression of the loops outside it. Only clauses `e < c` and
`not (e < c)` with `e` = the range (coefficient 1) plus terms of loops opened before it are used; a range that is
unrolled or vectorized is left alone, as is every reduction that is not a sum.
"""
from __future__ import annotations

from rawgrad.compiler.codegen.gates import clauses
from rawgrad.compiler.codegen.opt.kernel import (ACCUMULATE, LOOP, PARALLEL, REDUCE, range_kind, simplify_addresses,
                                                 stride)
from rawgrad.compiler.ir import Ops, UOp
from rawgrad.compiler.rewrite import substitute
from rawgrad.compiler.symbolic import simplify
from rawgrad.dtype import dtypes

TRUE = UOp.const(dtypes.bool, True)
OPENED = (PARALLEL, ACCUMULATE, LOOP)  # kinds of the loops open before any reduce loop starts


def bound_gated_loops(ast: UOp) -> UOp:
  """The kernel with every sum's loops cut to the iterations where a zeroing factor's gate can hold."""
  new: dict[UOp, UOp] = {}
  for node in ast.toposort:
    sources = tuple(new[source] for source in node.src)
    rebuilt = node if sources == node.src else node.replace(src=sources)
    if rebuilt.op is Ops.REDUCE and rebuilt.arg is Ops.ADD: rebuilt = _bounded(rebuilt)
    new[node] = rebuilt
  return new[ast] if new[ast] is ast else simplify_addresses(new[ast])


def _bounded(reduce: UOp) -> UOp:
  body, loops = reduce.src[0], list(reduce.src[1:])
  for position, loop in enumerate(loops):
    if range_kind(loop) != REDUCE or loop.src[0].op is not Ops.CONST: continue
    outer = set(loops[:position])
    for condition in _zeroing_conditions(body):
      found = _bounds(condition, loop, outer)
      if found is None: continue
      low, high, used = found
      low = UOp.const(dtypes.index, 0).maximum(low)
      high = high.minimum(loop.src[0])
      cut = UOp.range(simplify(UOp.const(dtypes.index, 0).maximum(high - low)), loop.arg[0], REDUCE)
      body = substitute(substitute(body, dict.fromkeys(used, TRUE)), {loop: cut + low})
      loops[position] = cut
      break
  if loops == list(reduce.src[1:]): return reduce
  body = simplify(body)
  # the gates the bounds made always true go
  ungated = {index: index.replace(src=index.src[:2]) for index in body.toposort
             if index.op is Ops.INDEX and len(index.src) == 3 and index.src[2] is TRUE}
  return reduce.replace(src=(substitute(body, ungated), *loops))


def _zeroing_conditions(body: UOp) -> list[UOp]:
  """Conditions outside which the product `body` is zero: the gates of its loaded factors and the conditions of its
  WHERE(c, value, 0) factors."""
  conditions = []
  factors = [body]
  while factors:
    factor = factors.pop()
    if factor.op is Ops.MUL: factors += factor.src
    elif factor.op is Ops.CAST: factors.append(factor.src[0])
    elif factor.op is Ops.WHERE and factor.src[2].op is Ops.CONST and factor.src[2].arg == 0:
      conditions.append(factor.src[0])
    elif factor.op is Ops.LOAD and factor.src[0].op is Ops.INDEX and len(factor.src[0].src) == 3:
      conditions.append(factor.src[0].src[2])
  return conditions


def _bounds(condition: UOp, loop: UOp, outer: set[UOp]) -> tuple[UOp, UOp, list[UOp]] | None:
  """(low, high, the clauses that give them): the condition implies low <= loop < high, both expressions of loops
  opened before `loop`. None unless it bounds the loop on both sides."""
  low = high = None
  used = []
  for clause in clauses(condition):
    negated = clause.op is Ops.XOR and clause.src[1] is TRUE
    compare = clause.src[0] if negated else clause
    if compare.op is not Ops.CMPLT or loop not in compare.src[0].toposort: continue
    rest = _rest_without(compare.src[0], loop, outer)
    if rest is None or compare.src[1].op is not Ops.CONST: continue
    # loop + rest < c  <=>  loop < c - rest;  not (loop + rest < c)  <=>  loop >= c - rest
    bound = simplify(compare.src[1] - rest)
    if loop in bound.toposort: continue  # the loop's terms did not cancel: no bound of it
    if negated: low = bound if low is None else low.maximum(bound)
    else: high = bound if high is None else high.minimum(bound)
    used.append(clause)
  return None if low is None or high is None else (low, high, used)


def _rest_without(expression: UOp, loop: UOp, outer: set[UOp]) -> UOp | None:
  """expression - loop, when the expression moves by 1 with the loop and otherwise reads only loops opened before it
  (output loops, and the REDUCE's loops in `outer`); None otherwise."""
  if stride(expression, loop) != 1: return None
  if any(r.op is Ops.RANGE and r is not loop and r not in outer and range_kind(r) not in OPENED
         for r in expression.toposort): return None
  return expression - loop
