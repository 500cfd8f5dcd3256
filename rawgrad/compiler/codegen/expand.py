"""Expand a kernel's upcast and unroll ranges into vectors and copies.

After the opts, a kernel may have one upcast range (its W iterations become the W lanes of a vector) and unroll
ranges (each iteration becomes a copy of the code). `expand` removes them: every value that depends on the upcast
range becomes a W-lane vector, every value that depends on unroll ranges is built once per combination of their
values, a STORE once per combination.

- A load whose index moves by 1 from lane to lane is one vector load (masked where its gate is a vector); one whose
  index does not depend on the lanes is a scalar load; any other is gathered lane by lane. On CPU targets, lanes a
  few elements apart load the run they span, and lanes far apart whose unrolled copies are neighbours (a transposing
  copy) load a block of rows and transpose it with shuffles.
- A store likewise: one vector store, or one scalar store per lane.
- A staged local buffer (AFTER(DEFINE_LOCAL, copy STORE)) holds every copy and lane: its copy store is expanded like
  any store, once.
- A REDUCE keeps its loop ranges. Its unrolled reduce ranges become separate accumulators (one REDUCE per copy, all
  over the same loops, so the linearizer runs them in one loop) combined after the loop; when the vector axis is
  reduced, the accumulator is a vector whose lanes are combined after the loop in a tree of halving shuffles.

After expand: no RANGE of kind upcast or unroll; values are scalars or W-lane vectors; GEP picks lanes of a vector
(arg: the lanes; with two sources, of both laid end to end), VECTORIZE builds one from scalars; a vector CONST's arg
is the tuple of its lanes.
"""
from __future__ import annotations

import itertools

from rawgrad.compiler.codegen.linearize import is_staging
from rawgrad.compiler.codegen.opt.kernel import (LOOP_KINDS, UNROLL, UPCAST, all_ranges, identity_const, range_kind,
                                                 stride)
from rawgrad.compiler.ir import Ops, UOp
from rawgrad.compiler.rewrite import substitute
from rawgrad.compiler.symbolic import plus_constant, simplify
from rawgrad.dtype import dtypes


MAX_INTERLEAVED = 4  # the largest distance between lanes loaded as one run: every other element or more is wasted


def expand(ast: UOp, interleave: bool = False) -> UOp:
  """The kernel with its upcast range turned into vector lanes and its unroll ranges into copies. `interleave` (CPU
  targets): lanes a few elements apart load the run they span and pick their lanes from it."""
  ranges = all_ranges(ast)
  if not any(range_kind(r) in (UPCAST, UNROLL) for r in ranges): return ast
  ast = _drop_empty_expansions(ast)
  expander = _Expander(ast, interleave)
  stores = tuple(expanded for store in ast.src for expanded in expander.stores(store))
  return UOp(Ops.SINK, dtypes.void, stores, ast.arg)


def _drop_empty_expansions(ast: UOp) -> UOp:
  """A REDUCE over an empty upcast or unroll range is its identity; a store that depends on one never happens."""
  empty = {r for r in all_ranges(ast) if range_kind(r) in (UPCAST, UNROLL) and _constant_size(r) == 0}
  if not empty: return ast
  mapping = {node: identity_const(node.arg, node.dtype) for node in ast.toposort
             if node.op is Ops.REDUCE and empty & set(node.src[1:])}
  ast = simplify(substitute(ast, mapping))
  return ast.replace(src=tuple(store for store in ast.src if not empty & set(store.toposort)))


def _constant_size(r: UOp) -> int:
  size = r.src[0]
  if size.op is not Ops.CONST: raise ValueError(f"{range_kind(r)} range r{r.arg[0]} must have a constant size")
  return size.arg


def combine(op: Ops, a: UOp, b: UOp) -> UOp:
  """a `op` b for a reduce op (a sum of booleans is their or)."""
  if op is Ops.ADD and a.dtype.scalar == dtypes.bool: op = Ops.OR
  return UOp(op, a.dtype, (a, b))


def gep(vector: UOp, lanes: tuple[int, ...]) -> UOp:
  return UOp(Ops.GEP, vector.dtype.scalar.vec(len(lanes)), (vector,), lanes)


def shuffle(a: UOp, b: UOp, lanes: tuple[int, ...]) -> UOp:
  """The lanes of a and b laid end to end: lane i of b is lane len(a) + i."""
  return UOp(Ops.GEP, a.dtype.scalar.vec(len(lanes)), (a, b), lanes)


def transpose(rows: list[UOp]) -> list[UOp]:
  """The columns of a square of n vectors of n lanes (n a power of two): log2(n) rounds, each interleaving the
  lanes of row k with those of row k + n/2."""
  n, half = len(rows), len(rows) // 2
  low = tuple(lane for i in range(half) for lane in (i, n + i))
  high = tuple(lane for i in range(half, n) for lane in (i, n + i))
  for _ in range(n.bit_length() - 1):
    rows = [shuffle(rows[k], rows[k + half], lanes) for k in range(half) for lanes in (low, high)]
  return rows


def concatenate(vectors: list[UOp]) -> UOp:
  """One vector of the vectors' lanes in order (as many vectors as a power of two, of one width)."""
  while len(vectors) > 1:
    vectors = [shuffle(a, b, tuple(range(2 * a.dtype.count))) for a, b in zip(vectors[::2], vectors[1::2])]
  return vectors[0]


def horizontal(vector: UOp, op: Ops) -> UOp:
  """Combine the lanes of a vector with a reduce op: halve while the width is even, then lane by lane."""
  width = vector.dtype.count
  while width > 1 and width % 2 == 0:
    half = width // 2
    vector = combine(op, gep(vector, tuple(range(half))), gep(vector, tuple(range(half, width))))
    width = half
  if width == 1: return vector
  result = gep(vector, (0,))
  for lane in range(1, width): result = combine(op, result, gep(vector, (lane,)))
  return result


class _Expander:
  def __init__(self, ast: UOp, interleave: bool = False):
    self.interleave = interleave
    ranges = all_ranges(ast)
    upcasts = [r for r in ranges if range_kind(r) == UPCAST]
    self.upcast = upcasts[0] if upcasts else None
    self.width = _constant_size(self.upcast) if self.upcast is not None else 1
    self.unrolls = [r for r in ranges if range_kind(r) == UNROLL]
    self.lanes = UOp(Ops.CONST, dtypes.index.vec(self.width), arg=tuple(range(self.width))) if self.width > 1 else \
      UOp.const(dtypes.index, 0)
    expanded = set(upcasts) | set(self.unrolls)
    # touched: the subtree holds an expanded range somewhere; free: the expanded ranges its value depends on
    self.touched: dict[UOp, bool] = {}
    self.free: dict[UOp, frozenset[UOp]] = {}
    self.free_unrolls: dict[UOp, tuple[UOp, ...]] = {}  # the unroll ranges among them, in order
    for node in ast.toposort:
      free = frozenset().union(*(self.free[s] for s in node.src)) if node.src else frozenset()
      if node in expanded: free |= {node}
      if node.op is Ops.REDUCE: free -= set(node.src[1:])
      if is_staging(node): free = frozenset()  # a staged local buffer holds every copy and lane
      self.free[node] = free
      self.free_unrolls[node] = tuple(r for r in self.unrolls if r in free) if free else ()
      self.touched[node] = node in expanded or any(self.touched[s] for s in node.src)
    self.cache: dict[tuple, UOp] = {}
    self.steps: dict[UOp, tuple[int, ...] | None] = {}
    self.offsets: dict[UOp, tuple[UOp, int]] = {}  # a copy's index: the first copy's and the constant it adds

  # *** helpers ***

  def splat(self, node: UOp) -> UOp:
    if node.dtype.count > 1 or self.width == 1: return node
    if node.op is Ops.CONST: return UOp(Ops.CONST, node.dtype.vec(self.width), arg=(node.arg,) * self.width)
    return UOp(Ops.VECTORIZE, node.dtype.vec(self.width), (node,) * self.width)

  def lane(self, node: UOp, lane: int) -> UOp:
    return gep(node, (lane,)) if node.dtype.count > 1 else node

  def env_key(self, node: UOp, env: dict[UOp, int]) -> tuple:
    return (node, tuple([env[r] for r in self.free_unrolls[node]]))

  def concrete(self, expr: UOp, env: dict[UOp, int]) -> UOp:
    """An index or gate expression with the unroll ranges set to their values for this copy, simplified. An index
    linear in them is the first copy's plus a constant (simplifying each copy's whole index again was a seventh of
    the time a kernel took to lower)."""
    key = ("concrete",) + self.env_key(expr, env)
    if key not in self.cache:
      unrolls = self.free_unrolls[expr]
      steps = self.unroll_steps(expr) if unrolls and expr.dtype == dtypes.index else None
      if steps is not None and any(env[r] for r in unrolls):
        first = self.concrete(expr, {**env, **{r: 0 for r in unrolls}})
        offset = sum(step * env[r] for step, r in zip(steps, unrolls))
        self.cache[key] = plus_constant(first, offset)
        self.offsets[self.cache[key]] = first, offset
      else:
        mapping = {r: UOp.const(dtypes.index, env[r]) for r in unrolls}
        self.cache[key] = simplify(substitute(expr, mapping)) if mapping else expr
    return self.cache[key]

  def unroll_steps(self, index: UOp) -> tuple[int, ...] | None:
    """How far the index moves per iteration of each unroll range it depends on; None unless it is linear in all."""
    if index not in self.steps:
      steps = tuple(stride(index, r) for r in self.free_unrolls[index])
      self.steps[index] = None if None in steps else steps
    return self.steps[index]

  def at_lane(self, expr: UOp, lane: int) -> UOp:
    """An index or gate expression for one lane, simplified (the copies of a kernel share many)."""
    key = ("lane", expr, lane)
    if key not in self.cache:
      if (known := self.offsets.get(expr)) is not None:  # the first copy's index at the lane, plus the constant
        first, offset = known
        self.cache[key] = plus_constant(self.at_lane(first, lane), offset)
      else: self.cache[key] = simplify(substitute(expr, {self.upcast: UOp.const(dtypes.index, lane)}))
    return self.cache[key]

  def lane_addresses(self, index: UOp) -> list[UOp]:
    """The index of every lane of a gather or scatter: lane 0's plus the stride times the lane when the index is
    linear in the lanes (simplifying each lane's whole index again is most of the time a scattered store takes to
    build), else each lane's own."""
    if (step := self.lane_stride(index)) is None: return [self.at_lane(index, lane) for lane in range(self.width)]
    first = self.at_lane(index, 0)
    return [first] + [first + UOp.const(dtypes.index, step * lane) for lane in range(1, self.width)]

  def uses_lanes(self, expr: UOp | None) -> bool:
    return expr is not None and self.upcast is not None and self.upcast in expr.toposort

  def lane_stride(self, index: UOp) -> int | None:
    """How much the index grows from one lane to the next: 0 if it does not depend on the lanes, None unless it is
    `stride*lane + (terms without the lane)`."""
    return stride(index, self.upcast) if self.uses_lanes(index) else 0

  def vector(self, expr: UOp) -> UOp:
    """An index or gate expression evaluated for every lane at once (vector arithmetic over the lane numbers)."""
    if not self.uses_lanes(expr): return self.splat(expr)
    built: dict[UOp, UOp] = {}
    for node in expr.toposort:
      if node is self.upcast: built[node] = self.lanes
      elif not self.uses_lanes(node): built[node] = node
      else:
        sources = tuple(self.splat(built[s]) for s in node.src)
        built[node] = UOp(node.op, node.dtype.scalar.vec(self.width), sources, node.arg)
    return built[expr]

  # *** values ***

  def value(self, node: UOp, env: dict[UOp, int]) -> UOp:
    if not self.touched[node]: return node
    key = self.env_key(node, env)
    if key not in self.cache: self.cache[key] = self._value(node, env)
    return self.cache[key]

  def _value(self, node: UOp, env: dict[UOp, int]) -> UOp:
    if node.op is Ops.RANGE:
      if range_kind(node) == UNROLL: return UOp.const(dtypes.index, env[node])
      if range_kind(node) == UPCAST: return self.lanes
      return node
    if node.op is Ops.LOAD: return self.load(node, env)
    if node.op is Ops.REDUCE: return self.reduce(node, env)
    if node.op is Ops.AFTER:
      return node.replace(src=(node.src[0], *(stored for store in node.src[1:] for stored in self.stores(store))))
    sources = tuple(self.value(s, env) for s in node.src)
    if any(s.dtype.count > 1 for s in sources):
      return UOp(node.op, node.dtype.scalar.vec(self.width), tuple(self.splat(s) for s in sources), node.arg)
    return node.replace(src=sources)

  def load(self, node: UOp, env: dict[UOp, int]) -> UOp:
    buffer, index, gate = _index_parts(node.src[0])
    buffer = self.value(buffer, env)
    index = self.concrete(index, env)
    gate = self.concrete(gate, env) if gate is not None else None
    if not self.uses_lanes(index) and not self.uses_lanes(gate):
      return UOp(Ops.LOAD, node.dtype, (_index(node.src[0], buffer, index, gate),))
    if self.lane_stride(index) == 1:
      first = self.at_lane(index, 0)
      mask = self.vector(gate) if gate is not None else None
      return UOp(Ops.LOAD, node.dtype.vec(self.width), (_index(node.src[0], buffer, first, mask),))
    ungated = gate is None or (gate.op is Ops.CONST and gate.arg is True)
    if self.interleave and ungated and 2 <= (jump := self.lane_stride(index) or 0) <= MAX_INTERLEAVED:
      # lanes a few elements apart (a pooling window's stride): one load of the run from the first lane to the last,
      # the lanes picked out of it (LLVM shuffles; element by element, each lane was a load and an insert)
      span = (self.width - 1) * jump + 1
      run = UOp(Ops.LOAD, node.dtype.vec(span), (_index(node.src[0], buffer, self.at_lane(index, 0), None),))
      return gep(run, tuple(range(0, span, jump)))
    if self.interleave and ungated and (columns := self.transposed(node, env)) is not None: return columns
    if not self.uses_lanes(index) and _always_inside(buffer, index):
      # one address for all lanes, a gate per lane: load once, zero the lanes whose gate is false
      value = self.splat(UOp(Ops.LOAD, node.dtype, (_index(node.src[0], buffer, index, None),)))
      zero = UOp(Ops.CONST, value.dtype, arg=(0,) * self.width)
      return UOp(Ops.WHERE, value.dtype, (self.vector(gate), value, zero))
    lanes = []
    for lane, address in enumerate(self.lane_addresses(index)):
      lane_gate = self.at_lane(gate, lane) if gate is not None else None
      lanes.append(UOp(Ops.LOAD, node.dtype, (_index(node.src[0], buffer, address, lane_gate),)))
    return UOp(Ops.VECTORIZE, node.dtype.vec(self.width), tuple(lanes))

  def transposed(self, node: UOp, env: dict[UOp, int]) -> UOp | None:
    """A load whose lanes are far apart but whose copies along an unroll range are neighbours (a transposing copy):
    a block of copies loads each lane's run of neighbours as one vector, and a network of shuffles turns those rows
    into the copies' vectors. None where the load is not such a one. (This copy's load is ungated; so are the
    block's other copies when no gate depends on the unroll range: the rows read only what they would.)"""
    buffer, index, gate = _index_parts(node.src[0])
    jump = self.lane_stride(index)
    if jump is None or abs(jump) <= MAX_INTERLEAVED: return None
    unroll = next((r for r in self.unrolls if r in self.free[index] and stride(index, r) == 1
                   and (gate is None or r not in self.free[gate])), None)
    if unroll is None or (block := transpose_block(_constant_size(unroll), self.width)) < 2: return None
    offset = env[unroll] % block
    first = {**env, unroll: env[unroll] - offset}
    key = ("transposed",) + self.env_key(node, first)
    if key not in self.cache:
      start = self.at_lane(self.concrete(index, first), 0)
      buffer = self.value(buffer, env)
      starts = [start + UOp.const(dtypes.index, jump * lane) for lane in range(self.width)]
      rows = [UOp(Ops.LOAD, node.dtype.vec(block), (_index(node.src[0], buffer, row, None),)) for row in starts]
      pieces = [transpose(rows[group:group + block]) for group in range(0, self.width, block)]
      self.cache[key] = tuple(concatenate([piece[column] for piece in pieces]) for column in range(block))
    return self.cache[key][offset]

  def reduce(self, node: UOp, env: dict[UOp, int]) -> UOp:
    body, ranges = node.src[0], node.src[1:]
    loops = tuple(r for r in ranges if range_kind(r) in LOOP_KINDS)
    copies = [r for r in ranges if range_kind(r) == UNROLL]
    across_lanes = self.upcast in ranges
    result: UOp | None = None
    for values in itertools.product(*(range(_constant_size(r)) for r in copies)):
      value = self.value(body, {**env, **dict(zip(copies, values))})
      if across_lanes: value = self.splat(value)
      accumulated = UOp(Ops.REDUCE, value.dtype, (value, *loops), node.arg) if loops else value
      if across_lanes: accumulated = horizontal(accumulated, node.arg)
      result = accumulated if result is None else combine(node.arg, result, accumulated)
    assert result is not None, "empty expansions were dropped before"
    return result

  # *** stores ***

  def stores(self, store: UOp) -> list[UOp]:
    unrolled = [r for r in self.unrolls if r in self.free[store]]
    stores = []
    for values in itertools.product(*(range(_constant_size(r)) for r in unrolled)):
      stores.extend(self.store(store, dict(zip(unrolled, values))))
    return stores

  def store(self, store: UOp, env: dict[UOp, int]) -> list[UOp]:
    target, value = store.src
    buffer, index, gate = _index_parts(target)
    index = self.concrete(index, env)
    gate = self.concrete(gate, env) if gate is not None else None
    value = self.value(value, env)
    if not self.uses_lanes(index) and not self.uses_lanes(gate):
      if value.dtype.count > 1: raise RuntimeError(f"kernel {store}: a vector would be stored at one address")
      return [UOp(Ops.STORE, dtypes.void, (_index(target, buffer, index, gate), value), store.arg)]
    if self.lane_stride(index) == 1:
      mask = self.vector(gate) if gate is not None else None
      return [UOp(Ops.STORE, dtypes.void, (_index(target, buffer, self.at_lane(index, 0), mask), self.splat(value)),
                  store.arg)]
    return [UOp(Ops.STORE, dtypes.void, (_index(target, buffer, address,
                                                self.at_lane(gate, lane) if gate is not None else None),
                                         self.lane(value, lane)), store.arg)
            for lane, address in enumerate(self.lane_addresses(index))]


def transpose_block(copies: int, width: int) -> int:
  """The most copies whose neighbouring elements load as one row of a transposed block: the largest power of two that
  divides the copies and the vector width."""
  block = 1
  while copies % (2 * block) == 0 and width % (2 * block) == 0: block *= 2
  return block


def _always_inside(buffer: UOp, index: UOp) -> bool:
  """The index addresses an element of the buffer whatever the loops' values (so it needs no gate to be safe)."""
  return buffer.op is Ops.DEFINE_GLOBAL and 0 <= index.vmin and index.vmax < buffer.dtype.size


def _index_parts(index: UOp) -> tuple[UOp, UOp, UOp | None]:
  return index.src[0], index.src[1], index.src[2] if len(index.src) > 2 else None


def _index(original: UOp, buffer: UOp, index: UOp, gate: UOp | None) -> UOp:
  if gate is not None and gate.op is Ops.CONST and gate.dtype.count == 1:
    if gate.arg is True: gate = None
  return UOp(Ops.INDEX, original.dtype, (buffer, index) if gate is None else (buffer, index, gate))
