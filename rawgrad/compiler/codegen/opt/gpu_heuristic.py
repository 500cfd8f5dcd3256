"""The default opts of a kernel on a GPU, from its shape and the target's numbers.

1. A reduction with few outputs and a long reduce loop is shared by the threads of a block (BLOCK_REDUCE): each
   thread reduces a strided share (consecutive threads read consecutive elements) and the block combines them.
   Where two loads each stay put along an output loop the other moves along (a weight gradient: the image is the
   same for every output channel, the output's gradient for every input channel), each thread first takes a
   register block of those two loops' outputs (UNROLL; of one of them where the other's size takes no block), so
   that every value loaded feeds several accumulators.
2. Otherwise each thread computes a few outputs: a vector of them along the loop the store is contiguous along (one
   16-byte access each, when there are outputs enough to keep the GPU busy), times a few rows when a loaded vector
   is reused across another output loop (a matmul's register block); outputs that cannot be vectors still take a
   block of rows when a loaded value is reused across them (a convolution's channels). The loop the store is
   contiguous along is split into the threads of a block (THREADS), topped up from the next loop out when it is
   short; the rest of the output loops become the grid (codegen/gpu.py). Reduce loops run inside each thread.
3. Loads that several threads of a block read (a matmul's rows and columns) are staged in shared memory a tile at a
   time: the reduce loop is tiled, and in each tile the block copies them in together (LOCAL), then reads them from
   there, while they fit the target's shared memory.
"""
from __future__ import annotations

import math

from rawgrad.compiler.codegen.opt.kernel import THREAD, Opt, OptOps, all_ranges, range_kind, size_of, stride
from rawgrad.compiler.codegen.opt.planner import Access, Planner, accesses, constant
from rawgrad.compiler.ir import Ops, UOp
from rawgrad.compiler.target import Target

WARPS_PER_BLOCK = 8          # a block of 8 warps: enough to hide memory latency, small enough to fit many per core
SHARED_REDUCE_MIN = 256      # reduce loops at least this long are worth sharing by a block
OUTPUT_SHARE = 2             # fewer outputs than the GPU's threads in flight / this is too few for a thread each
REDUCE_PER_OUTPUT_SHARE = 16  # a reduction at least outputs / this long is shared by a block (else outputs are many)
ROW_BLOCK = 8                # rows of a register block: each loaded vector feeds this many accumulators
REDUCE_TILE = 16             # reduce iterations per staged tile
SHARED_ACCUMULATORS = 64     # outputs of a register block in a shared reduction (one partial each per thread)
SHARED_BLOCK_THREADS = 32    # ... taken while the threads left are at least the GPU's threads in flight / this


def gpu_opts(ast: UOp, target: Target) -> list[Opt]:
  """The opts for a kernel on a GPU."""
  if not any(node.op is Ops.STORE for node in ast.src): return []
  plan = Planner(ast)
  if not plan.loops: return []
  block = target.warp_size * WARPS_PER_BLOCK
  if _share_reduction(plan, block, target): return plan.opts
  _vectorize_outputs(plan, target, block)
  _thread_outputs(plan, block)
  _stage_shared_tiles(plan, target)
  return plan.opts


def _stage_shared_tiles(plan: Planner, target: Target) -> None:
  """Tile the innermost reduce loop and stage in shared memory each load that threads of the block share (its
  index does not move along some thread range), while the tiles fit the target's shared memory."""
  threads = [r for r in all_ranges(plan.ast) if range_kind(r) == THREAD]
  if not threads or not plan.reduce_loops: return
  loop = plan.reduce_loops[-1]
  size = constant(size_of(loop))
  if size is None or size < 2 * REDUCE_TILE or size % REDUCE_TILE: return
  loads = [a for a in accesses(plan.ast) if not a.is_store]
  shared = sorted({a.buffer for a in loads if any(stride(a.index, r) == 0 for r in threads) and
                   any(stride(a.index, r) != 0 for r in threads) and stride(a.index, loop) != 0})
  if not shared: return
  count = len(plan.opts)
  plan.apply(OptOps.TILE, loop, REDUCE_TILE)
  if len(plan.opts) == count: return
  tile_loop = plan.loops.index(plan.reduce_loops[-2])
  budget = target.shared_memory_bytes
  for buffer in shared:
    before = plan.ast
    plan.apply_local_at(tile_loop, buffer)
    if plan.ast is before: continue
    used = sum(u.dtype.size * u.dtype.base.itemsize for u in plan.ast.toposort if u.op is Ops.DEFINE_LOCAL)
    if used > budget:  # undo: this tile does not fit beside the others
      plan.opts.pop()
      plan.ast = before


def _vectorize_outputs(plan: Planner, target: Target, block: int) -> None:
  """UPCAST the loop the store is contiguous along into vectors of the target's width (sizes it divides only, so no
  lane is masked), when each of a grid's worth of threads still gets its own. Then, for a reduction whose vector
  loads are reused across another output loop (a matmul), a register block: UNROLL that loop (the rows), and where
  outputs are plenty the vector loop once more, so each thread computes ROW_BLOCK x 2 vectors."""
  store = next(a for a in accesses(plan.ast) if a.is_store)
  lanes = target.vector_bytes // max(a.itemsize for a in accesses(plan.ast))
  outputs = math.prod(constant(size_of(r)) or 0 for r in plan.output_loops)
  if lanes < 2 or outputs < lanes * block * WARPS_PER_BLOCK: return
  contiguous = [r for r in plan.output_loops
                if stride(store.index, r) == 1 and (constant(size_of(r)) or 1) % lanes == 0]
  if not contiguous: return _unroll_rows(plan, store, outputs, block)
  count = len(plan.opts)
  column = plan.apply(OptOps.UPCAST, contiguous[-1], lanes)
  if len(plan.opts) == count or not plan.reduce_loops: return
  vector_loads = [a for a in accesses(plan.ast) if not a.is_store and plan.uses_lanes(a.index)]
  rows = [r for r in plan.output_loops if (constant(size_of(r)) or 1) % ROW_BLOCK == 0 and
          any(stride(a.index, r) == 0 for a in vector_loads)]
  if not rows: return
  if column is not None and (constant(size_of(column)) or 1) % 2 == 0 and \
     outputs // (lanes * 2 * ROW_BLOCK) >= target.threads_in_flight // OUTPUT_SHARE:
    row_position = plan.loops.index(rows[-1])
    plan.apply(OptOps.UNROLL, column, 2)
    rows = [plan.loops[row_position]]
  plan.apply(OptOps.UNROLL, rows[-1], ROW_BLOCK)


def _unroll_rows(plan: Planner, store: Access, outputs: int, block: int) -> None:
  """Outputs that cannot be vectors (a 10 x 10 image's columns): a register block of ROW_BLOCK rows of an output
  loop along which a load that moves with the store's contiguous loop stays put (a convolution's channels: each
  image value loaded feeds ROW_BLOCK accumulators), when outputs are plenty for a thread per block."""
  if not plan.reduce_loops or outputs < ROW_BLOCK * block * WARPS_PER_BLOCK: return
  column = next((r for r in reversed(plan.output_loops) if stride(store.index, r) == 1), None)
  if column is None: return
  moving = [a for a in accesses(plan.ast) if not a.is_store and stride(a.index, column) != 0]
  rows = [r for r in plan.output_loops if r is not column and (constant(size_of(r)) or 1) % ROW_BLOCK == 0 and
          any(stride(a.index, r) == 0 for a in moving)]
  if rows: plan.apply(OptOps.UNROLL, rows[-1], ROW_BLOCK)


def _power_of_two_at_least(size: int) -> int:
  return 1 << max(0, (size - 1).bit_length())


def _share_reduction(plan: Planner, block: int, target: Target) -> bool:
  """BLOCK_REDUCE a long reduce loop when there are too few outputs to keep a GPU busy with one thread each."""
  reduces = [node for node in plan.ast.toposort if node.op is Ops.REDUCE]
  if not reduces or len({frozenset(node.src[1:]) for node in reduces}) != 1 or not plan.reduce_loops: return False
  outputs = math.prod(constant(size_of(r)) or target.threads_in_flight for r in plan.output_loops)
  # one thread per output keeps the GPU busy only when there are outputs for every thread it can run at once
  if outputs >= target.threads_in_flight // OUTPUT_SHARE: return False
  sizes = {r: constant(size_of(r)) for r in plan.reduce_loops}
  # worth a block per output when the reduction is long beside the outputs (a weight gradient, not a small matmul)
  if all(size is not None for size in sizes.values()) and \
     math.prod(sizes.values()) < max(SHARED_REDUCE_MIN, outputs // REDUCE_PER_OUTPUT_SHARE): return False
  # the loop consecutive elements are read along, when it is long enough; else the longest
  loads = [a for a in accesses(plan.ast) if not a.is_store]
  contiguous = [r for r in plan.reduce_loops if any(stride(a.index, r) == 1 for a in loads)
                and (sizes[r] is None or sizes[r] >= SHARED_REDUCE_MIN)]
  loop = contiguous[-1] if contiguous else max(plan.reduce_loops, key=lambda r: sizes[r] or SHARED_REDUCE_MIN)
  size = sizes[loop]
  threads = min(block, _power_of_two_at_least(size)) if size is not None else block
  register_block = _register_block(plan, loads, outputs * threads, target)
  _apply_in_order(plan, [*register_block, (OptOps.BLOCK_REDUCE, loop, threads)])
  return any(opt.op is OptOps.BLOCK_REDUCE for opt in plan.opts)


def _apply_in_order(plan: Planner, opts: list[tuple[OptOps, UOp, int]]) -> None:
  """Apply opts to loops all named before the first is applied: by their places (an applied opt renumbers the
  loops), each place moving up one for every loop before it that an opt used up entirely."""
  places = [plan.loops.index(loop) for _, loop, _ in opts]
  for i, (op, _, amount) in enumerate(opts):
    loops_before = len(plan.loops)
    plan.apply(op, plan.loops[places[i]], amount)
    if len(plan.loops) < loops_before: places = [p - (p > places[i]) for p in places]


def _register_block(plan: Planner, loads: list[Access], threads: int, target: Target) -> list[tuple[OptOps, UOp, int]]:
  """The UNROLLs of two output loops into a register block where one load stays put along the first and moves along
  the second, and another the other way round, so each loaded value feeds as many accumulators as the other loop's
  block: the largest such block of at most SHARED_ACCUMULATORS that leaves `threads` / its size threads at least
  threads_in_flight / SHARED_BLOCK_THREADS ([] where there is none)."""
  def moves(load: Access, r: UOp) -> bool: return stride(load.index, r) != 0
  sizes = {r: constant(size_of(r)) or 1 for r in plan.output_loops}
  best: tuple[int, UOp, int, UOp, int] | None = None
  for first in plan.output_loops:
    for second in plan.output_loops:
      if first is second or not any(not moves(a, first) and moves(a, second) for a in loads) or \
         not any(not moves(a, second) and moves(a, first) for a in loads): continue
      a = next((f for f in (8, 4, 2) if sizes[first] % f == 0 and 2 * f <= SHARED_ACCUMULATORS), 1)
      b = next((f for f in (8, 4, 2) if sizes[second] % f == 0 and a * f <= SHARED_ACCUMULATORS), 1)
      if a * b > 1 and threads // (a * b) >= target.threads_in_flight // SHARED_BLOCK_THREADS and \
         (best is None or a * b > best[0]):
        best = (a * b, first, a, second, b)
  if best is None: return []
  _, first, a, second, b = best
  return [(OptOps.UNROLL, loop, amount) for loop, amount in ((first, a), (second, b)) if amount > 1]


def _thread_outputs(plan: Planner, block: int) -> None:
  """THREADS on the output loop the store is contiguous along (else the innermost), and on the next one out when
  that leaves the block short; the outer loop is split first so that the contiguous one becomes thread x."""
  store = next(a for a in accesses(plan.ast) if a.is_store)
  outputs = [r for r in plan.output_loops if constant(size_of(r)) != 1]
  if not outputs: return
  contiguous = [r for r in outputs if stride(store.index, r) == 1]
  inner = (contiguous or outputs)[-1]
  inner_size = constant(size_of(inner))
  inner_threads = min(block, _power_of_two_at_least(inner_size)) if inner_size is not None else block
  others = [r for r in outputs if r is not inner]
  if others and any(o.op is OptOps.UNROLL for o in plan.opts):
    # a register block's rows come from the other loop: a square block of threads shares each loaded tile most
    inner_threads = min(inner_threads, 1 << (block.bit_length() - 1) // 2)
  outer_threads = 0
  if inner_threads < block and others:
    outer_size = constant(size_of(others[-1]))
    outer_threads = min(block // inner_threads, _power_of_two_at_least(outer_size) if outer_size else block)
  split = [(others[-1], outer_threads), (inner, inner_threads)] if outer_threads > 1 else [(inner, inner_threads)]
  _apply_in_order(plan, [(OptOps.THREADS, loop, amount) for loop, amount in split if amount > 1])
