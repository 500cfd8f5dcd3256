"""Lower a kernel graph to a linear program: loops for RANGEs, registers for reductions, one instruction per UOp.

The program is a list of UOps in execution order. RANGE opens a loop and END(range) closes it; DEFINE_REG is an
accumulator reset to its identity where it appears; STORE/LOAD on a DEFINE_REG update and read it. Every other
instruction computes its op from earlier instructions. The same UOp may appear more than once (say, a load both
inside and after a loop): a use always refers to its most recent appearance, which the emitter guarantees is in
scope. Loop-invariant instructions stay where they are first used; LLVM hoists them.

REDUCEs over the same loops (the copies unrolling makes) run in one loop, each with its own accumulator; a sum of
products accumulates with fused multiply-adds. A RANGE of kind "parallel" runs slice `core` of `cores` (the renderer
computes the bounds). A loop nest of such a kernel outside its parallel loop (its last iteration, peeled off) runs in
one slice: inside a RANGE of kind "last", one iteration in the last slice and none in the others. A staged local
buffer (AFTER of a DEFINE_LOCAL and its copy stores) is filled by its own loops as soon as the loops it depends on are
open, before the loops that read it.

A GROUP's kernel (see opt/kernel.py) stores partial results into a DEFINE_SCRATCH inside its parallel loop, then
reads them through BARRIER(scratch). The BARRIER is emitted outside every loop, before the first loop nest that
needs it: there each slice counts the chunks it did (its share of BARRIER's arg, the chunks of the parallel loop), and
only the slice that completes the count runs the rest of the program, with every slice's stores visible to it.
"""
from __future__ import annotations

import itertools
import math
from collections import defaultdict
from dataclasses import dataclass

from rawgrad.compiler.ir import GroupOp, Ops, UOp
from rawgrad.compiler.symbolic import evaluate
from rawgrad.dtype import DType, dtypes


def reduce_identity(op: Ops, dtype: DType) -> int | float | bool:
  if op is Ops.ADD: return False if dtype == dtypes.bool else 0
  if op is Ops.MUL: return 1
  if op is Ops.MAX: return -math.inf if dtypes.is_float(dtype) else dtypes.min(dtype)
  raise ValueError(f"{op} is not a reduce op")


class _Linearizer:
  def __init__(self, sink: UOp) -> None:
    self.program: list[UOp] = []
    self.scopes: list[dict[UOp, UOp]] = [{}]
    self.open_loops: list[UOp] = []
    self.registers = itertools.count()
    # REDUCEs over the same loops (copies made by unrolling) share one loop, each with its own accumulator
    self.reduces_by_loops: dict[tuple[UOp, ...], list[UOp]] = defaultdict(list)
    self.needs: dict[UOp, set[UOp]] = {}
    self.nest_nodes: set[UOp] = set()  # what the stores of the current loop nest compute
    self.pending_stagings: list[UOp] = []  # GPU tiles staged inside reduce loops, not copied yet
    for node in sink.toposort:
      if node.op is Ops.REDUCE:
        self.reduces_by_loops[node.src[1:]].append(node)
        self.needs[node] = _free_ranges(node)

  def lookup(self, node: UOp) -> UOp | None:
    for scope in reversed(self.scopes):
      if node in scope: return scope[node]
    return None

  def emit(self, node: UOp) -> UOp:
    if (found := self.lookup(node)) is not None: return found
    if node.op is Ops.RANGE: raise ValueError(f"range r{node.arg[0]} is used outside its loop")
    if node.op is Ops.REDUCE:
      self.emit_reduce_group(node)
      return self.scopes[-1][node]
    if is_staging(node): return self.emit_staging(node)
    sources = tuple(self.emit(source) for source in node.src)
    instruction = node if sources == node.src else node.replace(src=sources)
    self.program.append(instruction)
    self.scopes[-1][node] = instruction
    return instruction

  def open_loop(self, loop: UOp) -> None:
    end = self.emit(loop.src[0])
    instruction = loop if end is loop.src[0] else loop.replace(src=(end,))
    self.program.append(instruction)
    self.scopes.append({loop: instruction})
    self.open_loops.append(loop)

  def close_loop(self, loop: UOp) -> None:
    self.program.append(UOp(Ops.END, dtypes.void, (self.scopes[-1][loop],)))
    self.scopes.pop()
    self.open_loops.pop()

  def emit_staging(self, node: UOp) -> UOp:
    """AFTER(DEFINE_LOCAL, *copy stores) on a CPU, BARRIER(DEFINE_LOCAL, *copy stores) on a GPU: the copy loops,
    run where the buffer is first needed; its value is the local buffer. On a GPU the block's threads meet after the
    copy (the BARRIER) and, inside a loop, before it too: no thread refills the buffer while another reads the last
    tile."""
    local = self.emit(node.src[0])
    if node.op is Ops.BARRIER and self.open_loops:
      self.program.append(UOp(Ops.BARRIER, node.dtype, (local,), "refill"))
    loops = sorted({r for store in node.src[1:] for r in store.toposort if r.op is Ops.RANGE and r.arg[1] == "stage"},
                   key=lambda r: r.arg[0])
    for loop in loops: self.open_loop(loop)
    for store in node.src[1:]: self.emit(store)
    for loop in reversed(loops): self.close_loop(loop)
    if node.op is Ops.BARRIER:
      self.program.append(node)
      self.scopes[-1][node] = node
      return node
    self.scopes[-1][node] = local
    return local

  def emit_ready_stagings(self, pending: list[UOp]) -> None:
    """Copy into a local buffer as soon as the loops it depends on are open (not inside the loops that read it)."""
    for node in list(pending):
      if self.lookup(node) is None and _free_ranges(node) - {r for r in _free_ranges(node) if r.arg[1] == "stage"} \
          <= set(self.open_loops):
        self.emit(node)
        pending.remove(node)

  def reduce_group(self, node: UOp) -> list[UOp]:
    """The REDUCEs that run in one loop with `node`: same loops, not yet computed, computable here, needed by a store
    of this loop nest, independent."""
    group = [node]
    for other in self.reduces_by_loops[node.src[1:]]:
      if other is node or self.lookup(other) is not None or not self.needs[other] <= set(self.open_loops): continue
      if other not in self.nest_nodes: continue
      if any(other in member.toposort or member in other.toposort for member in group): continue
      group.append(other)
    return group

  def emit_reduce_group(self, node: UOp) -> None:
    loops = node.src[1:]
    group = self.reduce_group(node)
    # reductions the bodies need that do not depend on these loops run before them, not once per iteration
    for member in group:
      for inner in member.src[0].toposort:
        if inner.op is Ops.REDUCE and self.lookup(inner) is None and not set(loops) & set(inner.toposort):
          self.emit(inner)
    registers = []
    for member in group:
      identity = reduce_identity(member.arg, member.dtype.scalar)
      registers.append(UOp(Ops.DEFINE_REG, member.dtype, arg=(next(self.registers), identity)))
    self.program.extend(registers)
    for loop in loops:
      self.open_loop(loop)
      # a tile staged in shared memory is copied once per iteration of the loop it belongs to, not per inner one
      self.emit_ready_stagings(self.pending_stagings)
    for member, register in zip(group, registers): self.accumulate(member, register)
    for loop in reversed(loops): self.close_loop(loop)
    for member, register in zip(group, registers):
      result = UOp(Ops.LOAD, member.dtype, (register,))
      self.program.append(result)
      self.scopes[-1][member] = result

  def accumulate(self, node: UOp, register: UOp) -> None:
    body = node.src[0]
    current = UOp(Ops.LOAD, node.dtype, (register,))
    fused = node.arg is Ops.ADD and dtypes.is_float(node.dtype.scalar)
    if fused and body.op is Ops.MUL:
      # a sum of products accumulates with fused multiply-adds
      a, b = (self.emit(source) for source in body.src)
      self.program.append(current)
      updated = UOp(Ops.MULACC, node.dtype, (a, b, current))
    elif fused and body.op is Ops.WHERE and body.src[1].op is Ops.MUL and _is_zero(body.src[2]):
      # a product where a condition holds (a masked tail, padding): accumulate with a fused multiply-add, or keep
      condition, a, b = self.emit(body.src[0]), *(self.emit(source) for source in body.src[1].src)
      self.program.append(current)
      product = UOp(Ops.MULACC, node.dtype, (a, b, current))
      self.program.append(product)
      updated = UOp(Ops.WHERE, node.dtype, (condition, product, current))
    else:
      value = self.emit(body)
      self.program.append(current)
      updated = UOp(node.arg if node.dtype.scalar != dtypes.bool else Ops.OR, node.dtype, (current, value))
    self.program.extend([updated, UOp(Ops.STORE, dtypes.void, (register, updated))])


def _is_zero(node: UOp) -> bool:
  if node.op is Ops.VECTORIZE: return all(_is_zero(source) for source in node.src)
  if node.op is not Ops.CONST: return False
  return all(value == 0 for value in (node.arg if isinstance(node.arg, tuple) else (node.arg,)))


# the arg of the DEFINE_GLOBAL that is a program's argument table (buffer DEFINE_GLOBALs count from 0)
ARGUMENT_TABLE = -1


def kernel_parameters(program: list[UOp]) -> tuple[list[UOp], list[UOp]]:
  """The buffers a program uses (in DEFINE_GLOBAL order) and its variables (by name): the order of its 8-byte
  argument words, in the argument block or, for a program with an argument table, in the table."""
  params = sorted(dict.fromkeys(u for u in program if u.op is Ops.DEFINE_GLOBAL and u.arg != ARGUMENT_TABLE),
                  key=lambda u: u.arg)
  variables = sorted({u for u in program if u.op is Ops.DEFINE_VAR}, key=lambda u: u.arg[0])
  return params, variables


def argument_table(program: list[UOp]) -> UOp | None:
  """The program's argument table, if it has one: a DEFINE_GLOBAL of 8-byte words (its buffers' addresses, then its
  variables' values, in kernel_parameters order) whose address is the argument block's only word."""
  return next((u for u in program if u.op is Ops.DEFINE_GLOBAL and u.arg == ARGUMENT_TABLE), None)


def with_argument_table(program: list[UOp]) -> list[UOp]:
  """The program taking its argument words from a table in device memory instead of its argument block."""
  params, variables = kernel_parameters(program)
  return [UOp(Ops.DEFINE_GLOBAL, dtypes.uint64.ptr(len(params) + len(variables)), arg=ARGUMENT_TABLE), *program]


def argument_block_words(program: list[UOp]) -> int:
  """How many 8-byte words the program's argument block holds: one (the table's address) for a program with an
  argument table, else one per buffer and variable."""
  if argument_table(program) is not None: return 1
  params, variables = kernel_parameters(program)
  return len(params) + len(variables)


def is_staging(node: UOp) -> bool:
  """A staged copy into a local buffer: AFTER(local, copies) on a CPU, BARRIER(local, copies, arg="stage") on a GPU
  (see opt/kernel.py: stage_load, stage_shared)."""
  return node.op is Ops.AFTER or (node.op is Ops.BARRIER and node.arg == "stage")


def _free_ranges(node: UOp) -> set[UOp]:
  """The ranges a node needs open around it: all it uses except the loops of reductions inside it and of the
  staged copies it reads (those run before it)."""
  nodes = node.reachable_without_entering(is_staging) if not is_staging(node) else list(node.toposort)
  used = {n for n in nodes if n.op is Ops.RANGE}
  own = {r for n in nodes if n.op is Ops.REDUCE for r in n.src[1:]}
  return used - own


def output_loops(node: UOp) -> tuple[UOp, ...]:
  """The loops around a store (or all stores of a SINK): every range used outside a reduction, in loop order (by id;
  the parallel loop, if any, has the lowest)."""
  return _in_loop_order(_loops_outside_reductions(node)[node])


def _loops_outside_reductions(root: UOp) -> dict[UOp, frozenset[UOp]]:
  """For every node under root, the ranges it uses outside its reductions (not the copy loops of a staged buffer),
  from one walk: the stores of a scattered vector are hundreds over one shared subgraph."""
  free: dict[UOp, frozenset[UOp]] = {}
  for node in root.toposort:
    ranges = frozenset().union(*(free[source] for source in node.src)) if node.src else frozenset()
    if node.op is Ops.RANGE and node.arg[1] != "stage": ranges |= {node}
    if node.op is Ops.REDUCE: ranges -= set(node.src[1:])
    free[node] = ranges
  return free


def _in_loop_order(ranges: frozenset[UOp]) -> tuple[UOp, ...]:
  return tuple(sorted(ranges, key=lambda r: r.arg[0]))


def linearize(ast: UOp) -> list[UOp]:
  """The linear program of a kernel: a SINK of STOREs, each inside its output loops. Consecutive stores over the same
  loops share one loop nest; stores over different loops (a peeled remainder) share the loops their nests begin
  with."""
  linearizer = _Linearizer(ast)
  stagings = [node for node in ast.toposort if is_staging(node)]
  linearizer.pending_stagings = [node for node in stagings if node.op is Ops.BARRIER]
  linearizer.emit_ready_stagings(stagings)
  free = _loops_outside_reductions(ast)
  loops_of = {store: _in_loop_order(free[store]) for store in ast.src}
  parallel = [node for node in ast.toposort if node.op is Ops.RANGE and node.arg[1] == "parallel"]
  if parallel and not _barriers(list(ast.src)):
    last_slice = UOp.range(1, max(node.arg[0] for node in ast.toposort if node.op is Ops.RANGE) + 1, "last")
    loops_of = {store: loops if parallel[0] in loops else (last_slice, *loops) for store, loops in loops_of.items()}
  nests = [(loops, [store for store in ast.src if loops_of[store] == loops])
           for loops in dict.fromkeys(loops_of.values())]
  for loops, stores in nests:
    # what this nest's stores compute, the partials its barriers wait on included (their REDUCEs share loops)
    linearizer.nest_nodes = set(UOp.sink(*stores).toposort)
    for barrier in _barriers(stores):
      if linearizer.lookup(barrier) is not None: continue
      # the slices meet with no loop open; everything after the barrier runs in one slice
      for loop in reversed(linearizer.open_loops): linearizer.close_loop(loop)
      linearizer.emit(barrier)
    shared = 0
    while shared < min(len(loops), len(linearizer.open_loops)) and linearizer.open_loops[shared] is loops[shared]:
      shared += 1
    for loop in reversed(linearizer.open_loops[shared:]): linearizer.close_loop(loop)
    # a staged copy made inside loops this nest reopens is made again, as soon as they are open
    pending = list(stagings)
    for loop in loops[shared:]:
      linearizer.open_loop(loop)
      linearizer.emit_ready_stagings(pending)
    for store in stores: linearizer.emit(store)
  for loop in reversed(linearizer.open_loops): linearizer.close_loop(loop)
  return linearizer.program


def _barriers(stores: list[UOp]) -> list[UOp]:
  """The meetings of a split reduction (GROUP's slices, BLOCK_REDUCE's threads), not the barriers of staged tiles."""
  return [node for node in UOp.sink(*stores).toposort if node.op is Ops.BARRIER and not is_staging(node)]


MEAN_LENGTH_POINTS = 4096  # outer loop values a variable loop length is averaged over (beyond: its largest)


@dataclass(frozen=True)
class KernelCost:
  flops: int
  bytes_moved: int


def estimate_cost(program: list[UOp], var_values: dict[UOp, int] | None = None) -> KernelCost:
  """ALU operations executed (each counted once per loop iteration, once per vector lane, twice for a fused
  multiply-add) and bytes of global memory touched. It walks the whole program: a runner remembers its costs."""
  var_values = var_values or {}
  multipliers, flops, touched = [1], 0, {}
  for instruction in program:
    if instruction.op is Ops.RANGE: multipliers.append(multipliers[-1] * _evaluate_size(instruction.src[0], var_values))
    elif instruction.op is Ops.END: multipliers.pop()
    elif instruction.op in GroupOp.ALU and instruction.dtype.scalar != dtypes.index and not _is_index_math(instruction):
      flops += multipliers[-1] * instruction.dtype.count * (2 if instruction.op is Ops.MULACC else 1)
    elif instruction.op is Ops.DEFINE_GLOBAL and instruction.arg != ARGUMENT_TABLE:
      touched[instruction.arg] = instruction.dtype.size * instruction.dtype.base.itemsize
  return KernelCost(round(flops), sum(touched.values()))


def _is_index_math(instruction: UOp) -> bool:
  return instruction.op in GroupOp.Comparison and any(s.dtype.scalar == dtypes.index for s in instruction.src)


def _evaluate_size(node: UOp, var_values: dict[UOp, int]) -> float:
  """A loop's length; for a loop whose length depends on the loops outside it (bounds.py), its mean over them."""
  ranges = [n for n in node.toposort if n.op in (Ops.RANGE, Ops.SPECIAL)]  # loops, or a GPU's thread indices
  if not ranges: return int(evaluate(node, var_values))
  sizes = [int(evaluate(r.src[0], var_values)) for r in ranges]
  if math.prod(sizes) > MEAN_LENGTH_POINTS: return int(node.vmax)
  lengths = [evaluate(node, {**var_values, **dict(zip(ranges, point))})
             for point in itertools.product(*(range(size) for size in sizes))]
  return sum(lengths) / max(1, len(lengths))
