"""Optimizations of a kernel's loops as explicit, named `Opt`s, each a rewrite of the kernel AST's RANGEs.

A kernel from rangeify loops over RANGEs of kind "loop" (its output) and "reduce" (inside a REDUCE). An opt splits a
range into an outer and an inner range (`r -> outer*amount + inner`), changes the kind of the inner part, or changes
the loop order. After any opt the AST is again a plain kernel AST; its ranges carry one of these kinds:

  parallel   the outermost output loop, split into `cores` slices by the kernel's core/cores arguments
  loop       an output loop
  reduce     a loop inside a REDUCE
  upcast     not a loop: the lanes of a vector (at most one per kernel, on an output or a reduce axis)
  unroll     not a loop: copies of the code (an output axis gets separate accumulators, a reduce axis too)
  accumulate an output loop over blocks of a reduce loop; each iteration adds its block's sum to the stored output
  stage      a loop that copies an input into a local buffer (made by LOCAL; no other opt touches it)
  thread     not a loop (GPUs): the threads of a block, one iteration each (made by THREADS and BLOCK_REDUCE)

GROUP splits a reduction across cores, and its kernel is no longer a single store. The reduce loop becomes
`group*chunk + inner` and the kernel holds two stores: inside the group loop (kind "parallel", one iteration per
chunk) the partial reduction of every output element is stored into a scratch array (DEFINE_SCRATCH: it lives in the
kernel's image, `chunks*outputs` accumulators); the second store reads the scratch through BARRIER(scratch), where
the slices meet and only the one that finishes last goes on: it combines the partials in chunk order (a REDUCE over a
"reduce" loop of `chunks` iterations), evaluates the rest of the stored expression and stores the outputs.

BLOCK_REDUCE splits a reduction across the threads of a GPU block. The reduce loop becomes `outer*threads + lane`:
every thread (lane) reduces its share over `outer`, stores the partial result into shared memory (DEFINE_LOCAL) at
its own place, all threads meet at BARRIER(local, partial store), and each reads the block's partials back and
combines them in lane order (a REDUCE over a new "reduce" loop); lane 0 stores the output.

ACCUMULATE cuts a sum's loop into blocks (`block*amount + inner`): the loop over the blocks becomes an output loop of
kind "accumulate" (inside the parallel one, outside the others) and the kernel stores `sum over the block + what the
output holds`, that load gated off for the first block. It applies where the kernel stores the sum itself and reads
nothing else of its output; the block loop can then only be swapped with other output loops.

The loop order is the order of the range ids (arg[0]): output loops first (the parallel one outermost), then the loops
of each REDUCE; upcast and unroll ranges come last. `loop_axes(ast)` lists the loops in that order and an opt names
the loop it acts on by its position there, so a kernel's optimization is a short printable list such as
`[Opt(UPCAST, 1, 16), Opt(UNROLL, 0, 8), Opt(PARALLEL, 0, 0)]`.

A split whose amount does not divide the size gets a validity condition `outer*amount + inner < size`: every access
that depends on the range is gated by it (a gated load reads nothing and yields 0, a gated store writes nothing) and a
REDUCE over the range adds its identity for invalid iterations, so every opt is correct for every size, including 1
and 0.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from enum import Enum, auto

from rawgrad.compiler.codegen.linearize import is_staging, reduce_identity
from rawgrad.compiler.ir import Ops, UOp
from rawgrad.compiler.rewrite import substitute
from rawgrad.compiler.symbolic import simplify, sum_terms
from rawgrad.dtype import DType, dtypes

PARALLEL, LOOP, REDUCE, UPCAST, UNROLL, STAGE, THREAD = "parallel", "loop", "reduce", "upcast", "unroll", "stage", \
  "thread"
ACCUMULATE = "accumulate"  # an output loop over blocks of a sum, each adding to the stored output (ACCUMULATE)
LAST = "last"  # one iteration in the last slice of a parallel launch, none in the others (see linearize.py)
LOOP_KINDS = (PARALLEL, LOOP, ACCUMULATE, REDUCE)
ALL_KINDS = (PARALLEL, LOOP, ACCUMULATE, REDUCE, UPCAST, UNROLL, STAGE, THREAD, LAST)
EXPANDED_KINDS = (UPCAST, UNROLL)
MAX_THREAD_AXES = 3  # a GPU block has three thread dimensions

MAX_UPCAST = 128   # lanes of the one vector axis
MAX_UNROLL = 256   # copies of the code, all unrolled axes together
MAX_LOCAL_BYTES = 1 << 20  # a local buffer lives on the stack of the thread that runs the kernel
MAX_GROUP_BYTES = 1 << 20  # a GROUP's partial results live in the kernel's image, for as long as the kernel


class OptOps(Enum):
  UPCAST = auto()    # split; the inner `amount` iterations become the lanes of a vector (0: the whole axis)
  UNROLL = auto()    # split; the inner `amount` iterations become copies of the code (0: the whole axis)
  TILE = auto()      # split; the outer part becomes the outermost loop of its kind (cache blocking)
  SWAP = auto()      # exchange the loop with loop `amount` (both output loops, or both loops of one REDUCE)
  PARALLEL = auto()  # the output loop becomes the outermost one and is split across cores
  LOCAL = auto()     # inside the loop, copy what the loops within it read of parameter `amount` to a local buffer
  STREAM = auto()    # vector stores bypass the cache (non-temporal): for outputs larger than the caches
  GROUP = auto()     # the reduce loop is cut into `amount` chunks reduced in parallel; the last slice combines them
  THREADS = auto()   # split; the inner `amount` iterations become threads of a GPU block
  BLOCK_REDUCE = auto()  # the reduce loop is shared by `amount` threads of a block, combined through shared memory
  ACCUMULATE = auto()  # split a sum's loop; the outer part becomes an output loop, each block added to the output

  def __repr__(self) -> str:
    return self.name


@dataclass(frozen=True)
class Opt:
  op: OptOps
  axis: int
  amount: int = 0

  def __repr__(self) -> str:
    return f"Opt({self.op.name}, {self.axis}, {self.amount})"


class OptError(ValueError):
  """The opt does not apply to this kernel (the message says why)."""


def range_kind(node: UOp) -> str:
  return node.arg[1]


def reduce_ranges(ast: UOp) -> set[UOp]:
  """The ranges some REDUCE loops over."""
  return set(_ranges(ast)[1])


def all_ranges(ast: UOp) -> list[UOp]:
  return list(_ranges(ast)[0])


def fresh_range_id(ast: UOp) -> int:
  """An id no range of the kernel has yet (one past the largest)."""
  return all_ranges(ast)[-1].arg[0] + 1


def loop_axes(ast: UOp) -> list[UOp]:
  """The kernel's loops in nesting order: output loops (parallel first), then reduce loops."""
  return list(_ranges(ast)[2])


@functools.lru_cache(maxsize=4096)
def _ranges(ast: UOp) -> tuple[tuple[UOp, ...], frozenset[UOp], tuple[UOp, ...]]:
  """The kernel's ranges by id, the ones some REDUCE loops over, and its loops in nesting order. Remembered as
  apply_opt's results are: the opts, the heuristics and the lowering ask for them thousands of times per step of a
  model, each a walk of the kernel (an eighth of the time MNIST's step took to lower)."""
  ranges = tuple(sorted((node for node in ast.toposort if node.op is Ops.RANGE), key=lambda r: r.arg[0]))
  inner = frozenset(r for node in ast.toposort if node.op is Ops.REDUCE for r in node.src[1:])
  loops = [r for r in ranges if range_kind(r) in LOOP_KINDS]
  return ranges, inner, tuple([r for r in loops if r not in inner] + [r for r in loops if r in inner])


def apply_opts(ast: UOp, opts: list[Opt] | tuple[Opt, ...]) -> UOp:
  """The kernel with the opts applied in order."""
  for opt in opts: ast = apply_opt(ast, opt)
  return ast


@functools.lru_cache(maxsize=4096)
def apply_opt(ast: UOp, opt: Opt) -> UOp:
  """The kernel with one more opt applied; raises OptError when it does not apply. Remembered: the heuristics, the
  search and the lowering apply the same opts to the same kernels."""
  axes = loop_axes(ast)
  if opt.op is not OptOps.STREAM and is_grouped(ast):
    raise OptError(f"{opt}: only STREAM can follow a GROUP (its group loop is the kernel's parallel loop)")
  if not 0 <= opt.axis < len(axes) and opt.op is not OptOps.STREAM:
    raise OptError(f"{opt}: the kernel has {len(axes)} loops")
  if opt.op not in (OptOps.LOCAL, OptOps.STREAM) and any(range_kind(r) == STAGE for r in all_ranges(ast)):
    raise OptError(f"{opt}: only LOCAL can follow a LOCAL")
  if opt.op in (OptOps.GROUP, OptOps.THREADS, OptOps.BLOCK_REDUCE, OptOps.STREAM) and \
     any(range_kind(r) == ACCUMULATE for r in all_ranges(ast)):
    raise OptError(f"{opt}: the kernel adds to its output one block at a time (ACCUMULATE)")
  if opt.op is OptOps.LOCAL:
    return stage_shared(ast, axes, opt) if _threads(all_ranges(ast)) else stage_load(ast, axes, opt)
  if opt.op is OptOps.STREAM: return stream_stores(ast, opt)
  if opt.op is OptOps.GROUP: return group_reduce(ast, axes, opt)
  if opt.op is OptOps.BLOCK_REDUCE: return block_reduce(ast, axes, opt)
  if opt.op is OptOps.ACCUMULATE: return accumulate_blocks(ast, axes, opt)
  target = axes[opt.axis]
  if range_kind(target) == ACCUMULATE and opt.op is not OptOps.SWAP:
    # a split's past-the-end iterations would store what they read of the output gated off: 0
    raise OptError(f"{opt}: loop {opt.axis} adds to the output one block at a time; it can only be swapped")
  inner = reduce_ranges(ast)
  ranges = all_ranges(ast)
  if opt.op in (OptOps.UPCAST, OptOps.UNROLL):
    kind = UPCAST if opt.op is OptOps.UPCAST else UNROLL
    amount = _whole_axis(target, opt) if opt.amount == 0 else opt.amount
    _check_expansion(ranges, kind, amount, opt)
    ast, outer, split = split_range(ast, target, amount, kind)
    order = _replace(axes, target, [outer] if outer is not None else []) + _expanded(ranges) + [split]
  elif opt.op is OptOps.THREADS:
    if target in inner: raise OptError(f"{opt}: threads split an output loop, not a reduce loop")
    if any(range_kind(r) == PARALLEL for r in axes):
      raise OptError(f"{opt}: a kernel runs on cores or on GPU threads, not both")
    if opt.amount < 1: raise OptError(f"{opt}: a block needs a positive number of threads")
    if len(_threads(ranges)) >= MAX_THREAD_AXES: raise OptError(f"{opt}: a block has {MAX_THREAD_AXES} thread axes")
    ast, outer, split = split_range(ast, target, opt.amount, THREAD)
    order = _replace(axes, target, [outer] if outer is not None else [])
  elif opt.op is OptOps.TILE:
    if opt.amount < 1: raise OptError(f"{opt}: a tile needs a positive amount")
    # the outer part of the parallel loop stays parallel, its inner part is an ordinary loop
    inner_kind = LOOP if range_kind(target) == PARALLEL else range_kind(target)
    ast, outer, split = split_range(ast, target, opt.amount, inner_kind)
    order = _replace(axes, target, [split])
    if outer is not None: order.insert(_first_movable(ast, order, split), outer)
  elif opt.op is OptOps.SWAP:
    if not 0 <= opt.amount < len(axes): raise OptError(f"{opt}: the kernel has {len(axes)} loops")
    other = axes[opt.amount]
    _check_swappable(ast, target, other, opt)
    order = list(axes)
    order[opt.axis], order[opt.amount] = other, target
    if range_kind(target) == REDUCE: ast = _swap_in_sums(ast, target, other)
  elif opt.op is OptOps.PARALLEL:
    if target in inner: raise OptError(f"{opt}: a reduce loop cannot run in parallel")
    if any(range_kind(r) == PARALLEL for r in axes): raise OptError(f"{opt}: the kernel already has a parallel loop")
    if _threads(ranges): raise OptError(f"{opt}: a kernel runs on cores or on GPU threads, not both")
    parallel = target.replace(arg=(target.arg[0], PARALLEL))
    ast = _substitute_ranges(ast, {target: parallel})
    order = [parallel] + [r for r in axes if r is not target]
  else:
    raise OptError(f"unknown opt {opt}")
  return renumber(ast, order + [r for r in _placed_after_loops(all_ranges(ast)) if r not in order])


# *** streaming stores ***

def stream_stores(ast: UOp, opt: Opt) -> UOp:
  """STREAM: mark the kernel's stores to its outputs (arg "stream"); vector stores become non-temporal where
  aligned. A GROUP's partial results are read back at once: they stay in the caches."""
  if any(store.arg == "stream" for store in ast.src): raise OptError(f"{opt}: the stores already stream")
  return ast.replace(src=tuple(store.replace(arg="stream") if store.src[0].src[0].op is Ops.DEFINE_GLOBAL else store
                               for store in ast.src))


# *** a reduction split across cores ***

def is_grouped(ast: UOp) -> bool:
  """The kernel's reduction is split across cores (GROUP) or a block's threads (BLOCK_REDUCE)."""
  return any(node.op is Ops.BARRIER and not is_staging(node) for node in ast.toposort)


def group_reduce(ast: UOp, axes: list[UOp], opt: Opt) -> UOp:
  """GROUP: cut reduce loop `axis` into `amount` contiguous chunks (fewer when the loop is shorter; the last one
  masked when they do not divide it) that the kernel's slices reduce in parallel, each chunk into its own place of a
  scratch array; the slice that finishes last combines the chunks in order, so the values do not depend on how many
  slices ran or in which order, and stores the outputs.

  The scratch array and the count of finished chunks live in the kernel's image (zeroed when it is loaded; the count
  is reset by the slice that finishes): one compiled kernel must not run two launches at the same time. A CPU queue
  runs its launches one after another, so it never does."""
  target = axes[opt.axis]
  reduces = [node for node in ast.toposort if node.op is Ops.REDUCE]
  if target not in reduce_ranges(ast): raise OptError(f"{opt}: loop {opt.axis} is not a reduce loop")
  if any(range_kind(r) == PARALLEL for r in axes):
    raise OptError(f"{opt}: the kernel already has a parallel loop (a GROUP's chunks run in parallel instead)")
  if len(reduces) != 1: raise OptError(f"{opt}: a GROUP needs exactly one REDUCE, the kernel has {len(reduces)}")
  if _threads(all_ranges(ast)): raise OptError(f"{opt}: a kernel runs on cores or on GPU threads, not both")
  if len(ast.src) != 1: raise OptError(f"{opt}: a GROUP needs exactly one store, the kernel has {len(ast.src)}")
  if opt.amount < 1: raise OptError(f"{opt}: the number of chunks must be positive")
  size = size_of(target)
  if not isinstance(size, int): raise OptError(f"{opt}: the reduce loop's size {size} is not a constant")
  inner_ranges = reduce_ranges(ast)
  outputs = [r for r in all_ranges(ast) if r not in inner_ranges and r in ast.src[0].toposort]
  sizes = [size_of(r) for r in outputs]
  if not all(isinstance(s, int) for s in sizes): raise OptError(f"{opt}: the output loops need constant sizes")
  reduction = reduces[0]
  chunk = max(1, -(-size // opt.amount))
  chunks = max(1, -(-size // chunk))
  count = math.prod(sizes)
  scratch_bytes = chunks * count * reduction.dtype.itemsize
  if scratch_bytes > MAX_GROUP_BYTES:
    raise OptError(f"{opt}: {chunks} chunks of {count} outputs need {scratch_bytes} bytes of scratch, more than "
                   f"{MAX_GROUP_BYTES}")
  fresh = fresh_range_id(ast)
  inner, combine = UOp.range(chunk, fresh, REDUCE), UOp.range(chunks, fresh + 1, REDUCE)
  # one chunk needs no group loop: the kernel runs as one slice
  group = UOp.range(chunks, fresh + 2, PARALLEL) if chunks > 1 else UOp.const(dtypes.index, 0)
  replacement = group * chunk + inner if chunks > 1 else inner
  split = _rebuild(ast, target, replacement, (inner,), simplify(replacement < size))
  partial = next(node for node in split.toposort if node.op is Ops.REDUCE)
  scratch = UOp(Ops.DEFINE_SCRATCH, reduction.dtype.ptr(max(1, chunks * count)), arg=0)
  # chunk-major: the partials of one chunk are next to each other, written by one slice
  position = _row_major(outputs, sizes)
  written = UOp(Ops.INDEX, scratch.dtype, (scratch, simplify(group * count + position)))
  partial_store = UOp(Ops.STORE, dtypes.void, (written, partial))
  met = UOp(Ops.BARRIER, scratch.dtype, (scratch,), arg=chunks)
  read = UOp(Ops.INDEX, scratch.dtype, (met, simplify(combine * count + position)))
  combined = UOp(Ops.REDUCE, reduction.dtype, (UOp(Ops.LOAD, reduction.dtype, (read,)), combine), reduction.arg)
  final_store = _substitute_ranges(ast.src[0], {reduction: combined})
  grouped = ast.replace(src=(partial_store, final_store))
  loops = ([group] if chunks > 1 else []) + _replace(axes, target, [inner]) + [combine]
  return renumber(grouped, loops + _placed_after_loops(all_ranges(grouped)))


# *** a reduction added to its output one block at a time ***

def accumulate_blocks(ast: UOp, axes: list[UOp], opt: Opt) -> UOp:
  """ACCUMULATE: split reduce loop `axis` into blocks of `amount`; the loop over the blocks becomes an output loop,
  inside the parallel one and outside the others, and each of its iterations adds its block's sum to the output
  (the first stores it). A convolution's weight gradient then reads one block of the batch's images from the L2
  cache for every output channel, where it read them all from farther away. The kernel must store the sum itself
  (not rounded to another dtype, not an expression of it) and read nothing else of that output."""
  target = axes[opt.axis]
  if target not in reduce_ranges(ast): raise OptError(f"{opt}: loop {opt.axis} is not a reduce loop")
  if len(ast.src) != 1: raise OptError(f"{opt}: ACCUMULATE needs exactly one store, the kernel has {len(ast.src)}")
  store = ast.src[0]
  place, value = store.src[0], store.src[1]
  output = place.src[0]
  if value.op is not Ops.REDUCE or value.arg is not Ops.ADD or target not in value.src[1:]:
    raise OptError(f"{opt}: the kernel must store the sum over loop {opt.axis} itself, not an expression of it")
  if any(node.op is Ops.INDEX and node.src[0] is output and node is not place for node in ast.toposort):
    raise OptError(f"{opt}: the kernel reads its output; adding to it block by block would change what it reads")
  if store.arg == "stream": raise OptError(f"{opt}: streamed stores would send the partial sums to memory")
  if _threads(all_ranges(ast)): raise OptError(f"{opt}: a GPU kernel's threads sum their outputs whole")
  if opt.amount < 1: raise OptError(f"{opt}: a block needs a positive amount")
  ast, outer, inner = split_range(ast, target, opt.amount, REDUCE)
  if outer is None: raise OptError(f"{opt}: loop {opt.axis} is not longer than one block of {opt.amount}")
  blocks = outer.replace(arg=(outer.arg[0], ACCUMULATE))
  store = ast.src[0]
  place, value = store.src[0], store.src[1]
  block_sum = value.replace(src=(value.src[0], *(r for r in value.src[1:] if r is not outer)))
  # the first block finds nothing in the output yet: its load is gated off and reads 0
  later = UOp.const(dtypes.index, 0) < blocks
  gate = later if len(place.src) == 2 else place.src[2] & later
  so_far = UOp(Ops.LOAD, value.dtype, (place.replace(src=(*place.src[:2], gate)),))
  ast = _substitute_ranges(ast.replace(src=(store.replace(src=(place, block_sum + so_far)),)), {outer: blocks})
  order = [r for r in loop_axes(ast) if range_kind(r) == PARALLEL] + [blocks]
  order += [r for r in _replace(axes, target, [inner]) if r not in order]
  return renumber(ast, order + _placed_after_loops(all_ranges(ast)))


# *** a reduction split across the threads of a GPU block ***

def block_reduce(ast: UOp, axes: list[UOp], opt: Opt) -> UOp:
  """BLOCK_REDUCE: reduce loop `axis` becomes `outer*amount + lane`; each of the `amount` lanes (threads of the block)
  reduces its share, stores its partial result into shared memory, and after a barrier every lane combines the
  block's partials in lane order; lane 0 stores the output. Consecutive lanes read consecutive elements, so the
  loads of a warp are coalesced. Several reductions over the same loops (a mean and a mean of squares) are shared
  alike, each with its own shared array."""
  target = axes[opt.axis]
  reduces = [node for node in ast.toposort if node.op is Ops.REDUCE]
  if target not in reduce_ranges(ast): raise OptError(f"{opt}: loop {opt.axis} is not a reduce loop")
  if len({frozenset(node.src[1:]) for node in reduces}) != 1:
    raise OptError(f"{opt}: a BLOCK_REDUCE needs every REDUCE over the same loops")
  if len(ast.src) != 1: raise OptError(f"{opt}: a BLOCK_REDUCE needs exactly one store, the kernel has {len(ast.src)}")
  if any(range_kind(r) == PARALLEL for r in axes): raise OptError(f"{opt}: a kernel runs on cores or on GPU threads")
  if opt.amount < 2: raise OptError(f"{opt}: a reduction shared by fewer than 2 threads is not shared")
  ranges = all_ranges(ast)
  if len(_threads(ranges)) >= MAX_THREAD_AXES: raise OptError(f"{opt}: a block has {MAX_THREAD_AXES} thread axes")
  if any(range_kind(r) in EXPANDED_KINDS and r in reduces[0].src[1:] for r in ranges):
    raise OptError(f"{opt}: the reduction's vector or unrolled axes would need combining per lane")
  if any(range_kind(r) == UPCAST for r in ranges):
    raise OptError(f"{opt}: vector outputs would need vectors of shared memory (unrolled outputs can be shared)")
  fresh = fresh_range_id(ast)
  lane = UOp.range(opt.amount, fresh, THREAD)
  outer = UOp.range(simplify((target.src[0] + (opt.amount - 1)) // opt.amount), fresh + 1, REDUCE)
  replacement = outer * opt.amount + lane
  split = _rebuild(ast, target, replacement, (outer,), simplify(replacement < target.src[0]))
  partials = [node for node in split.toposort if node.op is Ops.REDUCE]
  threads = [r for r in _threads(all_ranges(split)) if r is not lane] + [lane]
  # output loops made vectors or unrolled before: each of their outputs has partials of its own
  expanded = [r for r in all_ranges(split) if range_kind(r) in EXPANDED_KINDS]
  sizes = [size_of(r) for r in threads + expanded]
  if not all(isinstance(s, int) for s in sizes):
    raise OptError(f"{opt}: the block's thread counts and expanded outputs must be constants")
  combined: dict[UOp, UOp] = {}
  combines: list[UOp] = []
  locals_before = sum(1 for node in ast.toposort if node.op is Ops.DEFINE_LOCAL)
  for number, partial in enumerate(partials):
    local = UOp(Ops.DEFINE_LOCAL, partial.dtype.ptr(math.prod(sizes), local=True), arg=locals_before + number)
    written = UOp(Ops.INDEX, local.dtype, (local, simplify(_row_major(threads + expanded, sizes))))
    met = UOp(Ops.BARRIER, local.dtype, (local, UOp(Ops.STORE, dtypes.void, (written, partial))))
    combines.append(combine := UOp.range(opt.amount, fresh + 2 + number, REDUCE))
    read = UOp(Ops.INDEX, local.dtype, (met, simplify(_row_major(threads[:-1] + [combine] + expanded, sizes))))
    combined[partial] = UOp(Ops.REDUCE, partial.dtype, (UOp(Ops.LOAD, partial.dtype, (read,)), combine), partial.arg)
  store = _substitute_ranges(split.src[0], combined)
  target_index = store.src[0]
  gate = lane < 1 if len(target_index.src) == 2 else target_index.src[2] & (lane < 1)
  store = store.replace(src=(target_index.replace(src=(*target_index.src[:2], gate)), store.src[1]))
  shared = split.replace(src=(store,))
  return renumber(shared, _replace(axes, target, [outer]) + combines + _placed_after_loops(all_ranges(shared)))


# *** staging a load in a GPU block's shared memory ***

def _staged_load(ast: UOp, opt: Opt) -> UOp:
  """The one load of parameter `amount` a LOCAL stages (the load a staged copy makes is not one to stage again)."""
  loads = {node for node in ast.toposort if node.op is Ops.LOAD and node.src[0].op is Ops.INDEX
           and node.src[0].src[0].op is Ops.DEFINE_GLOBAL and node.src[0].src[0].arg == opt.amount}
  copying = {node for staging in ast.toposort if is_staging(staging) for node in staging.toposort if node in loads}
  if any(store.op is Ops.STORE and store.src[0].src[0].op is Ops.DEFINE_GLOBAL and store.src[0].src[0].arg == opt.amount
         for store in ast.src):
    raise OptError(f"{opt}: the kernel stores into parameter {opt.amount}; a staged copy would not see its stores")
  if copying: raise OptError(f"{opt}: parameter {opt.amount} is staged already")
  if len(loads) != 1: raise OptError(f"{opt}: the kernel has {len(loads)} different loads of parameter {opt.amount}")
  return loads.pop()


def stage_shared(ast: UOp, axes: list[UOp], opt: Opt) -> UOp:
  """LOCAL on a GPU kernel: at every iteration of reduce loop `axis`, the block's threads together copy the tile of
  parameter `amount` that all of them will read in it (the reduce loops inside it, the threads', unrolled and vector
  ranges the load moves with) into shared memory, then read it from there. The tile is laid out in the order of the
  source in memory (largest stride first), so consecutive threads copy consecutive elements; thread t copies
  elements t, t + threads, ... A barrier ends the copy (and one before it keeps the last tile until all have read
  it: the linearizer adds that)."""
  target = axes[opt.axis]
  if target not in reduce_ranges(ast): raise OptError(f"{opt}: on a GPU a tile is staged inside a reduce loop")
  load = _staged_load(ast, opt)
  index = load.src[0].src[1]
  used = {r for r in index.toposort if r.op is Ops.RANGE}
  ranges = all_ranges(ast)
  siblings = next(node.src[1:] for node in ast.toposort if node.op is Ops.REDUCE and target in node.src)
  inside = [r for r in siblings[list(siblings).index(target) + 1:] if r in used]
  if not inside: raise OptError(f"{opt}: nothing to stage: no reduce loop inside loop {opt.axis} moves the load")
  threads = _threads(ranges)
  layout = inside + [r for r in ranges if range_kind(r) in (THREAD, UNROLL, UPCAST) and r in used]
  layout = sorted(layout, key=lambda r: -abs(stride(index, r) or 0))
  # a thread copies elements for the others: a gate that differs between threads of one tile would leave holes
  gate_ranges = {r for r in load.src[0].src[2].toposort if r.op is Ops.RANGE} if len(load.src[0].src) > 2 else set()
  if private := sorted((r.arg[0] for r in gate_ranges - set(layout) if range_kind(r) in (THREAD, UNROLL, UPCAST))):
    raise OptError(f"{opt}: the load's gate depends on loops {private}, which the tile does not span")
  sizes = [size_of(r) for r in layout]
  if not all(isinstance(size, int) for size in sizes): raise OptError(f"{opt}: the staged loops need constant sizes")
  count, block = math.prod(sizes), math.prod(size_of(r) for r in threads)
  fresh = fresh_range_id(ast)
  rounds = UOp.range(-(-count // block), fresh, STAGE)
  element = simplify(rounds * block + _row_major(threads, [size_of(r) for r in threads]))
  # element -> the value of each staged range
  values, stride_ = {}, 1
  for r, size in reversed(list(zip(layout, sizes))):
    values[r] = simplify((element // stride_) % size) if stride_ * size < count else simplify(element // stride_)
    stride_ *= size
  valid = simplify(element < count)
  source = load.src[0]
  source_gate = simplify(substitute(source.src[2], values) & valid if len(source.src) > 2 else valid)
  gate = () if source_gate.op is Ops.CONST and source_gate.arg is True else (source_gate,)
  copied = UOp(Ops.LOAD, load.dtype, (source.replace(src=(source.src[0], simplify(substitute(index, values)), *gate)),))
  local = UOp(Ops.DEFINE_LOCAL, load.dtype.ptr(count, local=True),
              arg=sum(1 for node in ast.toposort if node.op is Ops.DEFINE_LOCAL))
  copy_gate = () if valid.op is Ops.CONST and valid.arg is True else (valid,)
  copy = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, local.dtype, (local, element, *copy_gate)), copied))
  staged = UOp(Ops.BARRIER, local.dtype, (local, copy), "stage")
  read = UOp(Ops.LOAD, load.dtype, (UOp(Ops.INDEX, local.dtype, (staged, simplify(_row_major(layout, sizes)))),))
  ast = _substitute_ranges(ast, {load: read})
  return renumber(ast, axes + _placed_after_loops(ranges) + [rounds])


# *** staging a load in a local buffer ***

def stage_load(ast: UOp, axes: list[UOp], opt: Opt) -> UOp:
  """LOCAL: at the start of every iteration of loop `axis`, copy the elements the loops inside it will read of
  parameter `amount` into a local buffer laid out in the order they are read (the loops in loop order, then the
  unrolled and the vector ranges, lanes last), then read them from there. A matmul's B panel becomes contiguous."""
  target = axes[opt.axis]
  if target in reduce_ranges(ast): raise OptError(f"{opt}: stage inside an output loop")
  load = _staged_load(ast, opt)
  used = {r for r in load.src[0].toposort if r.op is Ops.RANGE}
  ranges = all_ranges(ast)
  inside = [r for r in axes[opt.axis + 1:] if r in used]
  expanded = [r for r in ranges if range_kind(r) == UNROLL and r in used]
  expanded += [r for r in ranges if range_kind(r) == UPCAST and r in used]
  layout = inside + expanded
  sizes = [size_of(r) for r in layout]
  if not all(isinstance(size, int) for size in sizes): raise OptError(f"{opt}: the staged loops need constant sizes")
  count = 1
  for size in sizes: count *= size
  if count * load.dtype.itemsize > MAX_LOCAL_BYTES:
    raise OptError(f"{opt}: {count * load.dtype.itemsize} bytes is more than a local buffer holds ({MAX_LOCAL_BYTES})")
  if not inside: raise OptError(f"{opt}: nothing to stage: no loop inside loop {opt.axis} moves the load")
  fresh = fresh_range_id(ast)
  copies = {r: UOp.range(size_of(r), fresh + i, STAGE) for i, r in enumerate(inside)}
  locals_made = sum(1 for node in ast.toposort if node.op is Ops.DEFINE_LOCAL)
  local = UOp(Ops.DEFINE_LOCAL, load.dtype.ptr(count, local=True), arg=locals_made)
  copy_index = _row_major([copies.get(r, r) for r in layout], sizes)
  source = _substitute_ranges(load, copies)
  copy = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, local.dtype, (local, simplify(copy_index))), source))
  staged = UOp(Ops.AFTER, local.dtype, (local, copy))
  read = UOp(Ops.LOAD, load.dtype, (UOp(Ops.INDEX, local.dtype, (staged, simplify(_row_major(layout, sizes)))),))
  ast = _substitute_ranges(ast, {load: read})
  # the copy walks the source in memory order: the loop with the largest stride outermost
  copy_order = sorted(copies, key=lambda r: -(stride(load.src[0].src[1], r) or 0))
  order = axes + _placed_after_loops(ranges) + [copies[r] for r in copy_order]
  return renumber(ast, order)


def _row_major(ranges: list[UOp], sizes: list[int]) -> UOp:
  index, stride = UOp.const(dtypes.index, 0), 1
  for r, size in reversed(list(zip(ranges, sizes))):
    index = index + r * stride
    stride *= size
  return index


def stride(index: UOp, r: UOp) -> int | None:
  """How far the index moves when range r grows by one: 0 if it does not use r, None unless it is linear in r."""
  if r not in index.toposort: return 0
  total = 0
  for coefficient, term in sum_terms(index):
    if term is r: total += coefficient
    elif term is not None and r in term.toposort: return None
  return total


def _whole_axis(target: UOp, opt: Opt) -> int:
  size = target.src[0]
  if size.op is not Ops.CONST: raise OptError(f"{opt}: amount 0 (the whole axis) needs a constant size")
  return size.arg


def _check_expansion(ranges: list[UOp], kind: str, amount: int, opt: Opt) -> None:
  if amount < 1: raise OptError(f"{opt}: amount must be positive")
  if kind == UPCAST:
    if any(range_kind(r) == UPCAST for r in ranges): raise OptError(f"{opt}: the kernel already has a vector axis")
    if amount > MAX_UPCAST: raise OptError(f"{opt}: at most {MAX_UPCAST} lanes")
  else:
    copies = amount
    for r in ranges:
      if range_kind(r) == UNROLL: copies *= r.src[0].arg
    if copies > MAX_UNROLL: raise OptError(f"{opt}: {copies} copies of the code is more than {MAX_UNROLL}")


def _replace(order: list[UOp], target: UOp, replacement: list[UOp]) -> list[UOp]:
  position = order.index(target)
  return order[:position] + replacement + order[position + 1:]


def _expanded(ranges: list[UOp]) -> list[UOp]:
  return [r for r in ranges if range_kind(r) in EXPANDED_KINDS]


def _threads(ranges: list[UOp]) -> list[UOp]:
  return [r for r in ranges if range_kind(r) == THREAD]


def _placed_after_loops(ranges: list[UOp]) -> list[UOp]:
  """The ranges that are not loops (threads, vector lanes, copies, staging), in their current order."""
  return [r for r in ranges if range_kind(r) not in LOOP_KINDS]


def _first_movable(ast: UOp, order: list[UOp], split: UOp) -> int:
  """Where a tile's outer loop goes: before the other loops of its REDUCE, or before every output loop but the
  parallel one."""
  if range_kind(split) == REDUCE:
    siblings = next(node.src[1:] for node in ast.toposort if node.op is Ops.REDUCE and split in node.src)
    return min(order.index(r) for r in siblings if r in order)
  return 1 if order and range_kind(order[0]) == PARALLEL and order[0] is not split else 0


def _swap_in_sums(ast: UOp, a: UOp, b: UOp) -> UOp:
  """Every REDUCE over both loops loops over them in the other order (a REDUCE opens its loops in its own order)."""
  new: dict[UOp, UOp] = {}
  for node in ast.toposort:
    sources = tuple(new[source] for source in node.src)
    if node.op is Ops.REDUCE and a in node.src[1:] and b in node.src[1:]:
      sources = (sources[0], *(b if r is a else a if r is b else r for r in sources[1:]))
    new[node] = node if sources == node.src else node.replace(src=sources)
  return new[ast]


def _check_swappable(ast: UOp, a: UOp, b: UOp, opt: Opt) -> None:
  kinds = {range_kind(a), range_kind(b)}
  if PARALLEL in kinds: raise OptError(f"{opt}: the parallel loop stays outermost")
  if kinds <= {LOOP, ACCUMULATE}: return
  if kinds == {REDUCE} and any(node.op is Ops.REDUCE and a in node.src and b in node.src for node in ast.toposort):
    return
  raise OptError(f"{opt}: only two output loops or two loops of one reduction can swap")


# *** splitting a range ***

def split_range(ast: UOp, target: UOp, amount: int, inner_kind: str) -> tuple[UOp, UOp | None, UOp]:
  """Replace `target` by `outer*amount + inner`: the new AST, the outer range (None when it would have one
  iteration) and the inner range. Ids are temporary; renumber() orders the loops."""
  size = target.src[0]
  fresh = fresh_range_id(ast)
  inner = UOp.range(amount, fresh, inner_kind)
  outer_size = simplify((size + (amount - 1)) // amount)
  if outer_size.op is Ops.CONST and outer_size.arg <= 1:
    outer, replacement = None, inner
    if outer_size.arg == 0: inner = UOp.range(0, fresh, inner_kind)  # an empty range stays empty
  else:
    outer = UOp.range(outer_size, fresh + 1, range_kind(target))
    replacement = outer * amount + inner
  valid = simplify(replacement < size)
  new_reduce_ranges = (outer, inner) if outer is not None else (inner,)
  return _rebuild(ast, target, replacement, new_reduce_ranges, valid), outer, inner


def _rebuild(ast: UOp, target: UOp, replacement: UOp, new_reduce_ranges: tuple[UOp, ...], valid: UOp) -> UOp:
  """Substitute the range everywhere; a REDUCE over it loops over the new ranges; gate what depends on it."""
  gated = not (valid.op is Ops.CONST and valid.arg is True)
  depends: set[UOp] = set()
  new: dict[UOp, UOp] = {}
  for node in ast.toposort:
    if node is target:
      depends.add(node)
      new[node] = replacement
      continue
    if any(source in depends for source in node.src): depends.add(node)
    if node.op is Ops.REDUCE and target in node.src[1:]:
      body = new[node.src[0]]
      if gated: body = UOp(Ops.WHERE, body.dtype, (valid, body, identity_const(node.arg, body.dtype)))
      ranges = tuple(r for source in node.src[1:] for r in ((new_reduce_ranges) if source is target else (source,)))
      new[node] = UOp(Ops.REDUCE, node.dtype, (body, *ranges), node.arg)
      continue
    sources = tuple(new[source] for source in node.src)
    if node.op is Ops.INDEX and gated and node in depends:
      gate = valid if len(sources) == 2 else sources[2] & valid
      sources = (*sources[:2], gate)
    new[node] = node if sources == node.src else node.replace(src=sources)
  return simplify_addresses(new[ast])


def simplify_addresses(ast: UOp) -> UOp:
  """Simplify the index and gate of every memory access (what the vector analysis reads); the values computed stay
  as they are, LLVM folds those, and simplifying them all after every opt would cost more than the opts."""
  parts = list(dict.fromkeys(source for node in ast.toposort if node.op is Ops.INDEX for source in node.src[1:]))
  if not parts: return ast
  simplified = simplify(UOp.sink(*parts))
  return _substitute_ranges(ast, {old: new for old, new in zip(parts, simplified.src) if old is not new})


def identity_const(op: Ops, dtype: DType) -> UOp:
  """The value a reduction starts from: 0 for a sum, 1 for a product, the lowest value for a max."""
  return UOp.const(dtype, reduce_identity(op, dtype))


def _substitute_ranges(ast: UOp, mapping: dict[UOp, UOp]) -> UOp:
  return substitute(ast, mapping)


def renumber(ast: UOp, order: list[UOp]) -> UOp:
  """Give the ranges ids 0, 1, ... in `order` (so sorting by id is the loop order); sums stay in their order."""
  mapping = {r: UOp(Ops.RANGE, dtypes.index, r.src, (i, range_kind(r))) for i, r in enumerate(dict.fromkeys(order))}
  missing = [r for r in all_ranges(ast) if r not in mapping]
  if missing: raise RuntimeError(f"renumber: ranges {[r.arg for r in missing]} have no place in the loop order")
  return _substitute_ranges(ast, mapping)


def size_of(r: UOp) -> int | UOp:
  """A range's size: an int, or the symbolic expression."""
  size = r.src[0]
  return size.arg if size.op is Ops.CONST else size
