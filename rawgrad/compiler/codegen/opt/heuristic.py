"""The default opts of a kernel, chosen from its shape and memory accesses without any search.

1. The vector axis: the output loop along which the store is contiguous, unless the loads are contiguous only along a
   reduce loop (a sum over rows), then that reduce loop. Its lanes fill one machine vector (AVX-512: 16 floats).
2. Register blocking for reductions over an output vector axis (matmul, convolution, sums over columns): unroll the
   output loops along which a vector load does not move (each loaded vector then feeds several accumulators) and the
   vector axis itself once more (each broadcast scalar then feeds two vectors). The block's shape comes from the
   target: its accumulators, loaded vectors and broadcasts fit the vector registers, its rows (streams through memory
   that may share one L1 set) the L1 cache's ways, and among the shapes that fit, one with enough accumulators to keep
   the FMA units busy (units x latency) that loads the least per multiply-add. When the rows' loop is compared with
   a reduce loop in a gate (pixels of a padded window), the rows are images instead, so every window loop can be
   bounded to the image.
3. Separate accumulators for a reduction along the vector axis (sums over rows), so additions do not wait on each
   other.
4. Packing (matmul's B): a loaded vector that jumps through memory from one reduce iteration to the next and is
   reused across an output loop is staged in a local buffer, a tile of it at a time, in the order it is read; the
   tile's loop becomes the outermost one so each core packs its own tiles, and the tiles are sized so the cores get
   even shares of them (where no size does, the load is read as it is). With such a tile, the rows the register
   block broadcasts are packed too (inside the loop over row blocks) where each step of the sum reads them from a
   new cache line and uses less than half of it (x^T dy with AVX2's 6 rows).
   Packing also lets a reduction vectorize an output loop the store is not contiguous along (a convolution's output
   channels) when that fills the vectors better than the contiguous one (its narrow image rows), or than a reduce
   loop (x @ W.T, both read along the sum, would be dot products): the loads that move with the lanes are packed
   whole in lane order once per core, and the stores scatter their lanes, which costs little beside a long
   reduction.
   Where the sum is too short to pay for packing (attention's q @ k.T over heads of 32), the lanes still go along
   an output loop when each vector gathered there serves a register block's rows: short dot products spend more on
   adding up their lanes than on the sum.
5. Parallel: the outermost output loop runs on all cores when the kernel does enough work to pay for waking them.
   A reduction with too few outputs to share out (a full sum, a max over 3 rows) is split across the cores instead
   (GROUP): its outermost reduce loop long enough is cut into a few large chunks per core.
6. Streaming stores for elementwise kernels whose output is larger than the caches: the cache lines need not be
   read before they are written.
7. Blocking a long sum (ACCUMULATE): where a load reads more than fits the L2 share over the reduce loops and is read
   again for every iteration of an output loop it does not move along (a convolution's weight gradient reads the
   whole batch of images for every output channel; x^T dy reads x's column block for every tile of dy's), the
   outermost reduce loop is cut into blocks that fit, and the loop over the blocks goes outside the output loops:
   each block is read from the L2 cache by every output, and the outputs add up the blocks' sums in memory. A block
   spans BLOCK_MIN_ITERATIONS of the sum at least, and a sum is cut into MIN_BLOCKS or more. A packed load is already
   read a tile at a time, and one that each core reads from memory only once (one tile of columns a core) gains
   nothing from blocks.
8. A scatter (rangeify.scatter_sum: its terms' loops are accumulate loops from the start) keeps its loop order (the
   terms in order, each adding its row). An outermost output loop (rows whose terms are contiguous: scatter_add along
   dim 1) runs on all cores; else the row the terms add to is a vector and, where it is long, two halves of it run
   on two cores, each walking all the terms (more slices would walk them more often). Its speed is the memory's: an
   embedding gradient of 8192 rows of 256 into 50000 0.56-0.65 ms as it is, 0.38 in halves, 0.53 in 8 slices, 0.64
   with each core walking the terms once per vector of the row; 65536 rows of 32 into 100000: 0.35-0.38 ms as it is,
   0.51 in halves; scatter_add of 1024x1024 along dim 1: 0.37 ms, 0.20 on both cores.
"""
from __future__ import annotations

import math

from rawgrad.compiler.codegen.expand import MAX_INTERLEAVED, transpose_block
from rawgrad.compiler.codegen.gates import clauses, simplify_gated_indices
from rawgrad.compiler.codegen.opt.gpu_heuristic import gpu_opts
from rawgrad.compiler.codegen.opt.kernel import (ACCUMULATE, EXPANDED_KINDS, LOOP, MAX_LOCAL_BYTES, PARALLEL,
                                                 UPCAST, Opt, OptOps, all_ranges, loop_axes, range_kind,
                                                 reduce_ranges, size_of, stride)
from rawgrad.compiler.codegen.opt.planner import Access, Planner, accesses, constant, unroll_amount, vector_amount
from rawgrad.compiler.ir import GroupOp, Ops, UOp
from rawgrad.compiler.target import Target, host_target
from rawgrad.helpers import ceildiv

BROADCASTS_IN_FLIGHT = 2        # registers a register block leaves for broadcast scalars (LLVM loads the next early)
LONG_RUN = 8                    # vectors of a row read in a run before jumping to the next row
PARALLEL_MIN_WORK = 1 << 17     # element-operations below which waking other cores costs more than it saves
PARALLEL_MIN_SLICES = 8         # iterations a parallel loop should have, so slices balance between busy cores
STAGE_SHARE = 0.5              # of the L2 cache one packed tile may use (and at most what a local buffer holds)
STREAM_BYTES = 16 << 20         # outputs at least this large are not read back from the caches anyway
GROUP_CHUNKS = 32               # chunks of a GROUP: several per core on machines up to 32 cores, so they balance;
                                # fixed, so a reduction rounds the same way on every machine
PACKED_MIN_REDUCE = 64          # multiply-adds per stored element before a vector axis the store scatters pays
PACKED_BETTER_FILL = 1.1        # how much better another axis must fill the lanes to be packed for
PACKED_MIN_REUSE = 32           # outputs a packed copy serves at least (MNIST's last layer, 128 images by 10 classes:
                                # its images packed for 10 classes, 12 us; as dot products 7 us)
SMALL_BUFFER = 32 << 10         # bytes of a parameter small enough to stay in the L1 cache while a kernel gathers it
PEEL_MIN_BLOCKS = 8             # blocks a loop should have before a shorter last one, peeled off, is a small share
UNROLLED_WINDOW = 16            # iterations of a reduction small enough to unroll whole (a pooling window)
SMALL_WORK = 1 << 26            # element-operations below which compiling a kernel costs more than a few % of its run
TRANSPOSED_COPIES = 2           # copies a transposing load's block spans (see _unroll_transposed)
LONG_TRANSPOSE = 64             # iterations of both loops of a transposed copy for a square block
CACHE_LINE = 64                 # bytes
GROUP_MIN_CHUNK = 4096          # reduced elements per chunk at least, so a chunk's work dwarfs its partial's store
BLOCK_MIN_ITERATIONS = 256      # iterations of a sum per block at least (ACCUMULATE): they pay for one more read and
                                # write of the output (blocks of 32 of a transposed matmul's K ran 6% slower)
MIN_BLOCKS = 4                  # blocks worth cutting a sum into: with fewer, most of its reads stay as they were
SHARE_SLACK = 1.1               # how much more than an even share of a tiled loop its busiest core may run


def hand_coded_opts(ast: UOp, target: Target | None = None) -> list[Opt]:
  """The opts the heuristics choose for a kernel on a target (the host CPU by default)."""
  target = target or host_target()
  ast = simplify_gated_indices(ast)
  if target.is_gpu: return gpu_opts(ast, target)
  if not any(node.op is Ops.STORE for node in ast.src): return []
  plan = Planner(ast)
  if not plan.loops: return []
  store = next(a for a in accesses(ast) if a.is_store)
  itemsize = max(a.itemsize for a in accesses(ast))
  lanes = max(1, target.vector_bytes // itemsize)
  work = _work(ast)
  if _blocks_loop(plan) is not None: return _scatter_opts(plan, store, lanes, work)
  vector_axis, across_reduce = _choose_vector_axis(plan, store)
  stage_bytes = min(int(target.l2_bytes * STAGE_SHARE), MAX_LOCAL_BYTES)
  packed = _packed_vector_axis(plan, store, vector_axis, across_reduce, lanes, stage_bytes)
  if packed: vector_axis, across_reduce = packed.pop(0), False
  elif across_reduce and (gathered := _gathered_vector_axis(plan, store, vector_axis, lanes)) is not None:
    vector_axis, across_reduce = gathered, False
  if vector_axis is not None:
    _vectorize(plan, vector_axis, across_reduce, lanes, target, work)
    _unroll_transposed(plan)
  candidates = _staging_candidates(plan) if vector_axis is not None and not across_reduce and not packed else []
  staged = None
  if candidates and len(plan.reduce_loops) == 1 and _broadcast_rows(plan) is not None:
    staged = _blocked_tile(plan, stage_bytes, candidates[0][0].buffer, target.threads_in_flight)
  k_blocked = staged is not None
  unshared: set[int] = set()  # loads read as they are: their tiles would not share out fairly between the cores
  if staged is None and candidates:
    staged = _tile_for_staging(plan, stage_bytes, candidates, target.threads_in_flight, unshared)
  if staged is None and packed:  # a packed load larger than the stage: a tile of its lanes' loop at a time
    loads = [(a, _moving(plan, a)) for a in accesses(plan.ast) if not a.is_store and a.buffer in packed]
    if (staged := _tile_for_staging(plan, stage_bytes, loads, target.threads_in_flight)) is not None:
      packed.remove(staged)
  _constant_loop_innermost(plan)
  # with a packed tile, the tile loop (first) runs in parallel: each core packs and uses its own tiles
  _parallelize(plan, work, outermost=staged is not None)
  if not k_blocked: _block_reduction(plan, stage_bytes, {staged, *packed, *unshared}, target.threads_in_flight)
  # packed inside the parallel loop (once per core), or inside the loop over a matmul's blocks of K (once per block)
  if staged is not None: plan.apply_local_at((_blocks_loop(plan) or 0) if k_blocked else 0, staged)
  for buffer in packed: plan.apply_local(buffer)
  if staged is not None: _stage_broadcast_rows(plan)
  if not plan.reduce_loops and vector_axis is not None and _output_bytes(ast) >= STREAM_BYTES:
    plan.apply_stream()
  return plan.opts


def _output_bytes(ast: UOp) -> int:
  output = next(node for node in ast.toposort if node.op is Ops.DEFINE_GLOBAL and node.arg == 0)
  return output.dtype.size * output.dtype.base.itemsize


def _choose_vector_axis(plan: Planner, store: Access) -> tuple[UOp | None, bool]:
  """The loop whose iterations become vector lanes: among the output loops the store is contiguous along and the
  reduce loops some load is contiguous along, the one that leaves the fewest accesses to gather lane by lane, a
  gather from a small buffer (a convolution's weights, which stay in the L1 cache) counting less than one from a
  large one (ties: an output loop, so no lanes need combining; then the innermost)."""
  loads = [a for a in accesses(plan.ast) if not a.is_store]
  inner = set(plan.reduce_loops)
  candidates = [r for r in plan.output_loops if stride(store.index, r) == 1]
  candidates += [r for r in plan.reduce_loops if any(stride(a.index, r) == 1 for a in loads)]
  if not candidates: return None, False
  sizes = {node.arg: node.dtype.size for node in plan.ast.toposort if node.op is Ops.DEFINE_GLOBAL}

  def gathered(r: UOp) -> tuple[int, int]:
    jumping = [a for a in loads + ([] if r in inner else [store])
               if stride(a.index, r) not in (0, 1) and not _interleaved(plan, a, r)]
    return sum(1 for a in jumping if sizes[a.buffer] * a.itemsize > SMALL_BUFFER), len(jumping)

  best = min(candidates, key=lambda r: (gathered(r), r in inner, -plan.loops.index(r)))
  return best, best in inner


def _interleaved(plan: Planner, access: Access, axis: UOp) -> bool:
  """The access jumps by a few elements along the axis (a pooling window's stride) and is contiguous along a reduce
  loop at least that long, in a small reduction (a pooling window): with the window unrolled, the lanes of its copies
  read one run of memory, loaded whole and shuffled into lanes (expand.py). MNIST's 2x2 max pooling over 20x20
  images, AVX2: the window's 2 columns as lanes, 334 us; the 10 outputs of a row as lanes, 188 us."""
  jump = stride(access.index, axis)
  if jump is None or not 2 <= jump <= MAX_INTERLEAVED or not _small_reduction(plan): return False
  return any(stride(access.index, r) == 1 and (constant(size_of(r)) or 0) >= jump for r in plan.reduce_loops)


def _small_reduction(plan: Planner) -> bool:
  sizes = [constant(size_of(r)) or 0 for r in plan.reduce_loops]  # 0: not known before the launch
  return bool(sizes) and 0 not in sizes and math.prod(sizes) <= UNROLLED_WINDOW


def _lane_fill(size: int | None, lanes: int) -> float:
  """The share of the vector lanes an axis of this size keeps busy (a machine vector per `lanes` iterations)."""
  return 0.0 if not size else size / (math.ceil(size / lanes) * lanes)


def _packed_vector_axis(plan: Planner, store: Access, chosen: UOp | None, across: bool, lanes: int,
                        stage_bytes: int) -> list:
  """[axis, parameters to pack...]: an output loop of a long reduction whose lanes fill the vectors clearly better
  than the chosen axis's (`across`: a reduce loop), when every load that moves with it is contiguous along it or can
  be packed (it does not move along some other output loop, so one packed copy serves them all, and all of it fits
  stage_bytes); [] when there is none."""
  reduced = math.prod(constant(size_of(r)) or 0 for r in plan.reduce_loops) if plan.reduce_loops else 0
  if reduced < PACKED_MIN_REDUCE: return []
  chosen_fill = _lane_fill(constant(size_of(chosen)), lanes) if chosen is not None else 0.0
  loads = [a for a in accesses(plan.ast) if not a.is_store]
  best: list = []
  best_key: tuple = ()
  # vectors that slide by part of a vector from one reduce iteration to the next (a convolution's window moving one
  # pixel) mostly straddle two cache lines, and a load that jumps along the chosen axis is gathered lane by lane (an
  # output gradient with its channels last): an axis that fills as well is better then
  # and lanes along a reduce loop are dot products: each output sums its vector's lanes, and what the kernel computes
  # from the sum is computed one output at a time (x @ W.T, a linear layer with its weight as stored, 2048x128 by
  # 512x128: 1.60 ms as dot products, 0.54 with W packed and the lanes along its rows; with a GELU after it 5.4 and
  # 3.0 ms)
  costly = chosen is not None and (across or _sliding(plan, chosen, loads, lanes) or
                                   any(stride(a.index, chosen) not in (0, 1) for a in loads))
  best_fill = chosen_fill * (1.0 if costly else PACKED_BETTER_FILL)
  for r in plan.output_loops:
    if r is chosen or (fill := _lane_fill(constant(size_of(r)), lanes)) < best_fill or fill == 0: continue
    packs, packed_bytes = [], 0
    for access in loads:
      if (jump := stride(access.index, r)) in (0, 1): continue
      others = [o for o in plan.output_loops if o is not r and constant(size_of(o)) not in (None, 1)]
      reuse = math.prod(constant(size_of(o)) for o in others if stride(access.index, o) == 0)
      if jump is None or reuse < PACKED_MIN_REUSE: break
      read = [constant(size_of(loop)) for loop in plan.loops if stride(access.index, loop) != 0]
      if None in read: break
      # instead of dot products, more than the stage holds is packed a tile of the lanes' loop at a time, a vector of
      # them at least (a language model's head, 2048x128 by 2048x128: 6.4 -> 2.3 ms; not for other axes: a 1000x1000
      # matmul, whose B slides along the sum, ran 18 ms so instead of 11)
      whole = access.itemsize * math.prod(read)
      if whole > stage_bytes and (not across or whole // (constant(size_of(r)) or 1) * lanes > stage_bytes): break
      packs.append(access.buffer)
      packed_bytes += access.itemsize * math.prod(read)
    else:
      # of two axes that fill the lanes as well: instead of dot products, one the store is contiguous along (x @ W.T,
      # 48x128 by 2048x128: lanes along W's rows 0.08 ms, along x's, which packs less, 0.18); then the one that packs
      # less (a convolution's weights, not its images)
      key = (fill, across and stride(store.index, r) == 1, -packed_bytes)
      if packs and key > best_key: best, best_fill, best_key = [r, *sorted(set(packs))], fill, key
  return best


def _gathered_vector_axis(plan: Planner, store: Access, chosen: UOp | None, lanes: int) -> UOp | None:
  """Instead of dot products over a short sum (fewer than PACKED_MIN_REDUCE multiply-adds per output, each output
  then adding up its vector's lanes), too short to pack anything for: an output loop the store is contiguous along that
  fills the lanes as well, when every load that jumps along it stays put along another output loop, so that each
  vector gathered serves a register block's rows. Attention's scores, q @ k.T over heads of 32 (q and k rows of one
  buffer, which cannot be packed apart), 16x4 heads of 128x128: 0.65 ms so, 1.79 as dot products (AVX-512)."""
  reduced = math.prod(constant(size_of(r)) or 0 for r in plan.reduce_loops)
  if chosen is None or not 0 < reduced < PACKED_MIN_REDUCE: return None
  chosen_fill = _lane_fill(constant(size_of(chosen)), lanes)
  loads = [a for a in accesses(plan.ast) if not a.is_store]
  for r in reversed(plan.output_loops):
    if stride(store.index, r) != 1 or _lane_fill(constant(size_of(r)), lanes) < chosen_fill: continue
    rows = [o for o in plan.output_loops if o is not r and (constant(size_of(o)) or 0) > 1]
    jumping = [a for a in loads if stride(a.index, r) not in (0, 1)]
    if all(any(stride(a.index, o) == 0 for o in rows) for a in jumping): return r
  return None


def _sliding(plan: Planner, axis: UOp | None, loads: list[Access], lanes: int) -> bool:
  """Some load that is contiguous along the axis moves by a part of a vector along a reduce loop."""
  if axis is None: return False
  return any(stride(a.index, axis) == 1 and any((jump := stride(a.index, r)) is not None and jump % lanes != 0
                                               for r in plan.reduce_loops) for a in loads)


def _vectorize(plan: Planner, axis: UOp, across_reduce: bool, lanes: int, target: Target, work: int | None) -> None:
  """Upcast the axis, then give the reduction its accumulators (several vectors, or register blocks)."""
  amount = vector_amount(constant(size_of(axis)), lanes)
  if amount == 0: return
  interleaved = any(_interleaved(plan, a, axis) for a in accesses(plan.ast) if not a.is_store)
  count = len(plan.opts)
  remaining = plan.apply(OptOps.UPCAST, axis, amount)
  if len(plan.opts) == count: return
  vectors = math.ceil(amount / lanes)
  if not across_reduce and interleaved:
    while plan.reduce_loops:  # the whole window, loop by loop
      count = len(plan.opts)
      plan.apply(OptOps.UNROLL, plan.reduce_loops[-1], 0)
      if len(plan.opts) == count: break
    return
  if across_reduce:
    if _rows_across(plan, remaining, vectors, target): return
    if remaining is not None:
      # separate accumulators so consecutive additions do not wait for each other; up to twice as many when that
      # many divide the loop (25 vectors of a 20x20 image: 5), since a share that does not divide gates every load
      wanted, size = max(1, 4 // vectors), constant(size_of(remaining))
      dividing = next((n for n in range(wanted, 2 * wanted + 1) if size and size % n == 0 and n > 1), None)
      plan.apply(OptOps.UNROLL, remaining, dividing or unroll_amount(size, wanted))
    return
  if plan.reduce_loops: _block_registers(plan, remaining, vectors, target, work)


def _unroll_transposed(plan: Planner) -> None:
  """A copy without a reduction whose store is contiguous along the vector lanes while a load jumps far along them
  and is contiguous along another output loop (to channels last): unroll that loop by a block that expand.py
  transposes, so the load reads each lane's neighbours as one vector and shuffles them into lanes instead of
  gathering lane by lane. MNIST's four such copies in the step, both ISAs: 2 copies (pairs) did as well as or better
  than 4 or 8, whose rows of a longer run, for the largest (128x24x24x32), were slower than gathering. Where both the
  lanes' loop and the unrolled one are long (a matrix transposed), a square block of a vector of copies: 4096x4096
  28-30 -> 3.9 ms, 1024x1024 1.0 -> 0.13 ms, 4096x64 0.16 -> 0.03 ms (numpy's 4096x4096: 114 ms)."""
  vector = next((r for r in all_ranges(plan.ast) if range_kind(r) == UPCAST), None)
  if vector is None or plan.reduce_loops: return
  width = constant(size_of(vector)) or 1
  store = next(a for a in accesses(plan.ast) if a.is_store)
  rest = next((r for r in plan.output_loops if stride(store.index, r) == width), None)
  lanes_run = width * ((constant(size_of(rest)) or 1) if rest is not None else 1)
  for load in (a for a in accesses(plan.ast) if not a.is_store):
    if (jump := stride(load.index, vector)) is None or abs(jump) <= MAX_INTERLEAVED: continue
    for loop in plan.output_loops:
      size = constant(size_of(loop)) or 1
      square = lanes_run >= LONG_TRANSPOSE and size >= LONG_TRANSPOSE
      block = transpose_block(size, width if square else min(width, TRANSPOSED_COPIES))
      if stride(load.index, loop) == 1 and block > 1:
        plan.apply(OptOps.UNROLL, loop, block)
        return


def _rows_across(plan: Planner, remaining: UOp | None, vectors: int, target: Target) -> bool:
  """A reduction vectorized along a reduce loop where some loaded vector does not move along an output loop (the
  weights of a convolution whose channels are the lanes, a matrix-vector product's vector): unroll that output loop
  so each such vector feeds a block of rows, each row with two accumulators (one when the loop does not divide in
  two), as many rows as the registers hold beside those vectors. False when no load is shared so."""
  def known_rows() -> list[UOp]:  # found again after an unroll, which renumbers the loops
    return [r for r in _shared_rows(plan) if constant(size_of(r)) is not None]
  if not known_rows(): return False
  size = constant(size_of(remaining)) if remaining is not None else None
  accumulators = 2 if size and size % 2 == 0 else 1
  if accumulators == 2: plan.apply(OptOps.UNROLL, remaining, 2)
  per_row = vectors * accumulators
  budget = (target.vector_registers - per_row - BROADCASTS_IN_FLIGHT) // per_row
  loop = known_rows()[-1]
  rows = constant(size_of(loop))
  amount = _rows_dividing(rows, budget)
  if amount >= 2: plan.apply(OptOps.UNROLL, loop, unroll_amount(rows, amount))
  return True


def _shared_rows(plan: Planner) -> list[UOp]:
  """The output loops (of more than one iteration) along which some vector load does not move."""
  vector_loads = [a for a in accesses(plan.ast) if not a.is_store and plan.uses_lanes(a.index)]
  return [r for r in plan.output_loops
          if constant(size_of(r)) != 1 and any(stride(a.index, r) == 0 for a in vector_loads)]


def register_block(target: Target, vectors: int, rows_available: int | None, widen: tuple[int, ...],
                   one_run: bool = False) -> tuple[int, int]:
  """The shape of a register block, (rows, copies): `rows` rows (at most rows_available) of `vectors*copies` vector
  accumulators each, copies 1 or one of `widen` (copies of the vector axis possible). Live at once: the
  accumulators, one row's loaded vectors and the broadcasts in flight, within the vector registers; the rows are
  streams through memory that may all map to one L1 set, so at most its ways. When the rows' broadcasts are one run
  of memory instead (`one_run`: a convolution's neighbouring pixels under its window, which LLVM unrolls), no set
  limits them, but LLVM loads them all before the multiply-adds, so every row's broadcast is live too. Among the
  shapes that fit, the one with enough independent accumulators to keep the FMA units busy that loads the least per
  multiply-add (of two such, the one with more rows)."""
  shapes = []
  for copies in (1, *widen):
    columns = vectors * copies
    if one_run: rows = min((target.vector_registers - columns) // (columns + 1), rows_available or 1 << 30)
    else: rows = min((target.vector_registers - columns - BROADCASTS_IN_FLIGHT) // columns, target.l1_ways,
                     rows_available or target.l1_ways)
    if rows >= 1: shapes.append((*_block_score(target, rows, columns), rows, copies))
  if not shapes: return 1, 1
  _, _, rows, copies = max(shapes)
  return rows, copies


def _block_score(target: Target, rows: int, columns: int) -> tuple[int, float]:
  """How good a block of rows x columns accumulators is: enough independent accumulators to keep the FMA units busy
  (units x latency), then the fewest loads per multiply-add."""
  return min(rows * columns, target.fma_units * target.fma_latency), -(rows + columns) / (rows * columns)


def _block_registers(plan: Planner, vector_outer: UOp | None, vectors: int, target: Target, work: int | None) -> None:
  """Unroll output loops so each loaded value feeds several accumulators: the output loop along which a loaded vector
  does not move (a matmul's rows: each vector of B then feeds a block of rows), and the vector axis once more when
  some load is a broadcast scalar (each broadcast then feeds two vectors), in the register_block's shape. The rows
  are unrolled first so the copies run row by row: a broadcast is used as soon as it is loaded, and LLVM keeps the
  block in registers (column by column, all the broadcasts of a block are live at once and spill)."""
  loads = [a for a in accesses(plan.ast) if not a.is_store]
  vector_loads = [a for a in loads if plan.uses_lanes(a.index)]
  reuse = _shared_rows(plan)
  # rows along a padded window's loop (a convolution's columns x[x' + kx - p]) would each need their own bound of the
  # window: rows along a loop no gate compares (the batch's images) let bound_gated_loops cut every window loop to
  # the image, so no padding needs a buffer
  window_gated = _window_gated(plan)
  if reuse and reuse[-1] in window_gated and (free := [r for r in reuse if r not in window_gated]):
    reuse = [r for r in reuse if r is not free[-1]] + free[-1:]
  else: window_gated = set()
  if not reuse and vector_outer is not None and _jumps(plan, vector_loads):
    # nothing to reuse (a sum over columns): read longer runs of each row before jumping to the next
    free = (target.vector_registers - BROADCASTS_IN_FLIGHT) // vectors
    plan.apply(OptOps.UNROLL, vector_outer, unroll_amount(constant(size_of(vector_outer)), min(LONG_RUN, free)))
    return
  broadcasts = [a for a in loads if not plan.uses_lanes(a.index)]
  widen = _widening(constant(size_of(vector_outer))) if vector_outer is not None and broadcasts else ()
  rows_available = constant(size_of(reuse[-1])) if reuse else 1
  one_run = bool(reuse and broadcasts) and all(stride(a.index, reuse[-1]) in (0, 1) for a in broadcasts)
  # every row's broadcast is live at once where they slide along a window shorter than the rows (a convolution's
  # pixels: LLVM loads them all before the multiply-adds); along a longer loop (a weight gradient's window columns
  # over the image's) each is loaded next to its multiply-adds, as a matmul's. AVX2's 5x5 weight gradient of a
  # single-channel input, alone: 3 x 2 vectors 0.54 ms, 5 x 2 0.47 ms
  live = one_run and _short_window(plan, reuse[-1], broadcasts)
  amount, copies = register_block(target, vectors, rows_available, widen, live)
  if one_run and rows_available and amount >= 1:  # as many blocks as needed, all of one size (none peeled short)
    amount = -(-rows_available // -(-rows_available // amount))
  if one_run and len(reuse) >= 2 and _short_window(plan, reuse[-1], broadcasts):
    # the rows' broadcasts slide along a window shorter than the rows (a convolution's pixels): LLVM unrolls the
    # window and keeps all of them live, which limits the block. Rows along the next loop out (the image's rows)
    # are a matmul's rows instead; they take over when they make a better block (AVX2's 5x5 convolution over 20
    # pixels: 5 image rows x 2 vectors instead of 4 pixels x 2, 12.2 -> 11.0 ms; its 3x3 one over 6: 6 x 2
    # instead of 3 x 2, 1.86 -> 1.33 ms)
    outer = constant(size_of(reuse[-2]))
    rows, outer_copies = register_block(target, vectors, outer, widen)
    rows = _rows_dividing(outer, rows)
    if _block_score(target, rows, vectors * outer_copies) > _block_score(target, amount, vectors * copies):
      reuse, one_run, rows_available = [*reuse[:-2], reuse[-1], reuse[-2]], False, outer
      amount, copies = rows, outer_copies
  if window_gated and rows_available: amount = _rows_for_block(target, rows_available, amount, vectors * copies)
  elif work is not None and work < SMALL_WORK and rows_available and amount >= 2 and rows_available % amount:
    # a shorter last block peeled off doubles the code to lower and compile, which a small kernel's run does not
    # repay (the linear layer's input gradient, 128 rows: blocks of 8 run as fast as blocks of 12 and one of 8)
    amount = _rows_dividing(rows_available, amount)
  vector_position = plan.loops.index(vector_outer) if vector_outer is not None else None
  loops_before, outputs_before = len(plan.loops), plan.output_loops
  # a row count the size does not divide costs one shorter block at the end (codegen peels it off)
  if reuse and amount >= 2:
    rows_position = plan.loops.index(reuse[-1])
    plan.apply(OptOps.UNROLL, reuse[-1], amount)
    if len(plan.loops) < loops_before and vector_position is not None and rows_position < vector_position:
      vector_position -= 1
  if vector_position is not None and copies >= 2: plan.apply(OptOps.UNROLL, plan.loops[vector_position], copies)
  if one_run and amount == rows_available and len(reuse) >= 2:
    # the whole row fits with registers to spare (a 5x5 kernel's width): rows from the next loop out fill them, as a
    # matmul's rows do (LLVM loads their broadcasts next to the multiply-adds)
    columns = vectors * max(copies, 1)
    # the unrolls renumbered the loops: the ones still there are the same loops in the same order
    still = [r for r in outputs_before if r is not reuse[-1] and not (r is vector_outer and copies == size_of(r))]
    now = dict(zip(still, plan.output_loops)) if len(still) == len(plan.output_loops) else {}
    _unroll_spare_rows(plan, [now[r] for r in reuse[:-1] if r in now],
                       (target.vector_registers - columns - BROADCASTS_IN_FLIGHT) // columns // amount)


def _rows_for_block(target: Target, size: int, budget: int, columns: int) -> int:
  """The rows (at most the budget) of a block of `columns` vectors along a loop of `size`: a count that divides it,
  unless that leaves the FMA units no slack (at most units x latency accumulators) and the loop is long enough that
  a shorter last block, peeled off, is a small share of it. AVX2's 5x5 input gradient over 128 images: 4 x 2 vectors
  11.9 ms, 6 x 2 with 2 images peeled 10.7; AVX-512's: 8 x 2 5.8 ms, 12 x 2 6.3. AVX2's 3x3 convolution over 8 image
  rows: 4 x 2 1.36 ms, 6 x 2 with 2 rows peeled 2.28."""
  dividing = next(n for n in range(budget, 0, -1) if size % n == 0)
  no_slack = dividing * columns <= target.fma_units * target.fma_latency
  return budget if no_slack and size >= PEEL_MIN_BLOCKS * budget else dividing


def _rows_dividing(size: int | None, budget: int) -> int:
  """The largest row count up to the budget that divides size (no shorter block peeled off at the end), when one is
  at least 2/3 of the budget; else the budget."""
  return next((n for n in range(budget, 1, -1) if size and size % n == 0 and 3 * n >= 2 * budget), budget)


def _short_window(plan: Planner, rows: UOp, broadcasts: list[Access]) -> bool:
  """The broadcasts all slide along one reduce loop shorter than the rows' loop."""
  size = constant(size_of(rows))
  return size is not None and any(
    (length := constant(size_of(r))) is not None and length < size and all(stride(a.index, r) == 1 for a in broadcasts)
    for r in plan.reduce_loops)


def _widening(size: int | None) -> tuple[int, ...]:
  """Copies of the vector axis a register block may take: 2; where 3 divides its vectors and 2 does not, 3 instead
  when the vectors are few (an AVX2 row of 24 floats: three copies, not two and a third peeled off), else either,
  whichever makes the better block (AVX2's 1700x1700 matmul, 213 vectors a row: 3 x 3 vectors 176 GFLOPS, 6 x 2
  with one vector peeled off 193; AVX-512's 1000x1000, 63 vectors: 8 x 3 vectors)."""
  if size is not None and size % 2 and size % 3 == 0: return (3,) if size < 2 * PEEL_MIN_BLOCKS else (2, 3)
  return (copies,) if (copies := unroll_amount(size, 2)) >= 2 else ()


def _window_gated(plan: Planner) -> set[UOp]:
  """The output loops some comparison adds to a reduce loop: a padded window's gate `0 <= y + ky - p < h`."""
  return {r for ranges in _window_comparisons(plan) for r in ranges if r not in plan.reduce_loops}


def _window_comparisons(plan: Planner) -> list[set[UOp]]:
  """The loops of each comparison that involves a reduce loop."""
  reduced = set(plan.reduce_loops)
  return [ranges for node in plan.ast.toposort
          if node.op is Ops.CMPLT and (ranges := {r for r in node.src[0].toposort if r.op is Ops.RANGE}) & reduced]


def _constant_loop_innermost(plan: Planner) -> None:
  """When the innermost reduce loop is a padded window's (bound_gated_loops cuts it to the image: a bound LLVM can
  only unroll with a remainder), a reduce loop no gate bounds (the channels) goes innermost instead, the window's
  loops outside it, in their order: the block's multiply-adds then run as a matmul's do. A convolution's input
  gradient, AVX-512: 5x5 5.87 -> 5.45 ms, 3x3 0.80 -> 0.76 and 0.74 -> 0.64 ms."""
  windows = {r for ranges in _window_comparisons(plan) for r in ranges
             if r in plan.reduce_loops and ranges - set(plan.reduce_loops)}
  if not plan.reduce_loops or plan.reduce_loops[-1] not in windows: return
  free = [r for r in plan.reduce_loops if r not in windows and (constant(size_of(r)) or 0) > 1]
  if not free: return
  position, last = plan.loops.index(free[-1]), len(plan.loops) - 1
  while position < last:  # carried inward one swap at a time
    count = len(plan.opts)
    plan.apply(OptOps.SWAP, plan.loops[position], position + 1)
    if len(plan.opts) == count: return
    position += 1


def _unroll_spare_rows(plan: Planner, loops: list[UOp], spare: int) -> None:
  """Unroll the innermost of the loops that some copy count from 2 to `spare` divides, by the largest such count."""
  for loop in reversed(loops):
    size = constant(size_of(loop))
    amount = next((n for n in range(spare, 1, -1) if size and size % n == 0), 0)
    if amount:
      plan.apply(OptOps.UNROLL, loop, amount)
      return


def _jumps(plan: Planner, loads: list[Access]) -> bool:
  """Some load moves by more than a cache line from one iteration of the innermost reduce loop to the next."""
  innermost = plan.reduce_loops[-1]
  return any((jump := stride(a.index, innermost)) is None or abs(jump) * a.itemsize > CACHE_LINE for a in loads)


def _staging_candidates(plan: Planner) -> list[tuple[Access, list[UOp]]]:
  """The strided vector loads a packed tile could serve, each with the output loops it moves along: loads that jump
  more than a cache line from one reduce iteration to the next and are reused across an output loop."""
  if not plan.reduce_loops: return []
  innermost = plan.reduce_loops[-1]
  found = []
  for access in accesses(plan.ast):
    if access.is_store or not plan.uses_lanes(access.index): continue
    jump = stride(access.index, innermost)
    if jump is None or abs(jump) * access.itemsize <= CACHE_LINE: continue
    reused = [r for r in plan.output_loops if stride(access.index, r) == 0 and constant(size_of(r)) not in (None, 1)]
    if reused and (moving := _moving(plan, access)): found.append((access, moving))
  return found


def _moving(plan: Planner, access: Access) -> list[UOp]:
  """The output loops the access moves along (a tile of the last one is what a packed copy holds)."""
  return [r for r in plan.output_loops if stride(access.index, r) != 0 and range_kind(r) != ACCUMULATE]


def _blocked_tile(plan: Planner, stage_bytes: int, buffer: int, cores: int) -> int | None:
  """A matmul whose broadcast rows get packed (x^T dy on AVX2) is blocked along K before its packed tile is sized: the
  tile then holds one block of K and spans more columns, over which each packed row block is reused (AVX-512, whose
  rows are not packed, ran 443 instead of 469 GFLOPS with such wider tiles). The parameter to stage, or None with the
  plan as it was where the sum is not blocked or the tile not needed."""
  saved = plan.ast, list(plan.opts)
  _block_reduction(plan, stage_bytes, {buffer})
  if _blocks_loop(plan) is not None:
    if (staged := _tile_for_staging(plan, stage_bytes, _staging_candidates(plan), cores)) is not None: return staged
  plan.ast, plan.opts = saved
  return None


def _blocks_loop(plan: Planner) -> int | None:
  """The position of the loop over a blocked sum's blocks (ACCUMULATE); None where the sum is whole."""
  return next((i for i, r in enumerate(plan.loops) if range_kind(r) == ACCUMULATE), None)


def _tile_for_staging(plan: Planner, stage_bytes: int, candidates: list[tuple[Access, list[UOp]]], cores: int,
                      unshared: set[int] | None = None) -> int | None:
  """Tile the loop along which a candidate load (with the output loops it moves along) moves so one tile of it fits
  stage_bytes; the tile loop becomes the outermost, its tiles shared out between the cores. Given `unshared`, only
  where they share out fairly: the loads whose tiles would not are added to it. The parameter to stage (None when no
  load needs packing)."""
  for access, moving in candidates:
    if not moving: continue
    tile_bytes = access.itemsize * _expanded_elements(access.index)
    for r in plan.reduce_loops:
      if stride(access.index, r) != 0: tile_bytes *= constant(size_of(r)) or 1 << 30
    target = moving[-1]
    size = constant(size_of(target))
    if size is None or size * tile_bytes <= stage_bytes: continue  # all of it fits the cache already
    if (limit := stage_bytes // tile_bytes) < 1: continue
    if (amount := _tile_amount(size, limit, cores)) is None:
      if unshared is not None:
        unshared.add(access.buffer)
        continue
      amount = _divisor_at_most(size, limit)
    count = len(plan.opts)
    plan.apply(OptOps.TILE, target, amount)
    if len(plan.opts) > count: return access.buffer
  return None


def _tile_amount(size: int, limit: int, cores: int) -> int | None:
  """Iterations per tile of a loop of `size` whose tiles the cores share out, each running whole tiles: the largest
  amount up to the limit with which the busiest core does at most SHARE_SLACK times an even share, a divisor of size
  when one is at least half of it (no shorter last tile); None when none is fair. Matmuls on 2 cores: AVX2's
  1000x1000, 63 column blocks, 9 tiles of 7 (5 on one core, 4 on the other) 198 GFLOPS, 8 tiles of 8 (the last of 7)
  209 (numpy 214); its 500x500, 21 blocks, 4 tiles of 6 179, 21 tiles of 1 200 (numpy 210); AVX-512's 1000x1000,
  21 blocks, 11 tiles of 2 193, 21 of 1 208 (numpy 202)."""
  def busiest(amount: int) -> int: return ceildiv(ceildiv(size, amount), cores) * amount
  fair = [a for a in range(limit, 0, -1) if busiest(a) <= SHARE_SLACK * size / cores]
  return next((a for a in fair if size % a == 0 and 2 * a > fair[0]), fair[0]) if fair else None


def _broadcast_rows(plan: Planner) -> Access | None:
  """The load of the rows a register block broadcasts, where every reduce iteration reads them from a new cache line
  and uses less than half of it (x^T's in x^T dy, a linear layer's weight gradient, with AVX2's 6 rows)."""
  innermost = plan.reduce_loops[-1]
  for access in accesses(plan.ast):
    if access.is_store or plan.uses_lanes(access.index): continue
    jump = stride(access.index, innermost)
    if jump is None or abs(jump) * access.itemsize < CACHE_LINE: continue
    if 2 * _expanded_elements(access.index) * access.itemsize < CACHE_LINE: return access
  return None


def _stage_broadcast_rows(plan: Planner) -> None:
  """Pack the broadcast rows (_broadcast_rows) inside the loop over row blocks: the block's rows are copied k-major,
  and every column block inside reads them as one stream the prefetcher follows."""
  if (access := _broadcast_rows(plan)) is None: return
  # inside the row blocks' loop, when a loop inside it (the column blocks) reads the same rows again
  outputs = plan.output_loops
  for position, loop in enumerate(outputs):
    if range_kind(loop) == LOOP and stride(access.index, loop) and _read_again(access, outputs[position + 1:]):
      plan.apply_local_at(plan.loops.index(loop), access.buffer)
      return


def _divisor_at_most(size: int, limit: int) -> int:
  """The largest divisor of size up to limit when one is at least half of it (whole tiles), else limit."""
  for amount in range(limit, 0, -1):
    if size % amount == 0:
      return amount if amount * 2 > limit else limit
  return limit


def _expanded_elements(index: UOp) -> int:
  """How many elements one iteration of the loops reads through this index (its vector lanes times its copies)."""
  count = 1
  for node in index.toposort:
    if node.op is Ops.RANGE and node.arg[1] in ("upcast", "unroll"): count *= node.src[0].arg
  return count


THREEFRY_OPERATIONS = 130  # the 32-bit adds, shifts, ors and xors of its 20 rounds


def _work(ast: UOp) -> int | None:
  """Iterations of the innermost code times its operations, roughly; None when sizes are symbolic."""
  total = 1
  for r in loop_axes(ast):
    size = constant(size_of(r))
    if size is None: return None
    total *= size
  operations = sum(THREEFRY_OPERATIONS if node.op is Ops.THREEFRY else 1 for node in ast.toposort
                   if node.op in GroupOp.ALU or node.op in (Ops.LOAD, Ops.STORE))
  return total * max(1, operations)


def _group(plan: Planner) -> bool:
  """GROUP a reduce loop into GROUP_CHUNKS chunks, fewer when a chunk would reduce fewer than GROUP_MIN_CHUNK
  elements: the outermost loop that has that many iterations, else the longest. True when it applied."""
  sizes = [constant(size_of(r)) for r in reduce_ranges(plan.ast)]
  if None in sizes: return False
  wanted = min(GROUP_CHUNKS, math.prod(sizes) // GROUP_MIN_CHUNK)
  loops = {r: constant(size_of(r)) or 0 for r in plan.reduce_loops}
  target = next((r for r, size in loops.items() if size >= wanted), max(loops, key=lambda r: loops[r]))
  chunks = min(wanted, loops[target])
  if chunks < 2: return False
  count = len(plan.opts)
  plan.apply(OptOps.GROUP, target, chunks)
  return len(plan.opts) > count


SCATTER_HALF_BYTES = 512  # bytes of a scatter's row each of two cores adds to, at least (see 8.)


def _scatter_opts(plan: Planner, store: Access, lanes: int, work: int | None) -> list[Opt]:
  """The opts of a scatter (8.): its loops stay in order."""
  if work is not None and work < PARALLEL_MIN_WORK: return []
  if range_kind(plan.loops[0]) != ACCUMULATE:
    plan.apply(OptOps.PARALLEL, plan.loops[0])
    return plan.opts
  row = next((r for r in plan.output_loops if range_kind(r) != ACCUMULATE and stride(store.index, r) == 1), None)
  size = constant(size_of(row)) if row is not None else None
  # a short row is left to LLVM, which vectorizes the loop as well (65536 rows of 32: 0.44 ms as vectors of 16)
  if size is None or size % (2 * lanes) or size // 2 * store.itemsize < SCATTER_HALF_BYTES: return []
  vectors = plan.apply(OptOps.UPCAST, row, lanes)
  plan.apply(OptOps.TILE, vectors, size // lanes // 2)
  plan.apply(OptOps.PARALLEL, plan.loops[0])
  return plan.opts


def _parallelize(plan: Planner, work: int | None, outermost: bool) -> None:
  """Run an output loop on all cores: the outermost (always, when a packed tile must stay per core), else the first
  with enough iterations to share out, else the first that has more than one. A reduction whose output loops are all
  too short to share out is split into chunks instead, when that applies."""
  if work is not None and work < PARALLEL_MIN_WORK: return
  loops = [r for r in plan.output_loops if constant(size_of(r)) != 1 and range_kind(r) != ACCUMULATE]
  few_outputs = all((constant(size_of(r)) or PARALLEL_MIN_SLICES) < PARALLEL_MIN_SLICES for r in loops)
  if work is not None and not outermost and plan.reduce_loops and few_outputs and _group(plan): return
  if not loops: return
  if not outermost:
    # a loop with a shorter last block (peeled off) would leave it to the last slice, on top of its share; a packed
    # tile's loop runs in parallel all the same (a 2000x2000 matmul on AVX-512, 63 column blocks in tiles of 2: over
    # its tiles 214 GFLOPS, over its rows with B read unpacked 80)
    loops = [r for r in loops if not _has_remainder(plan, r)] or loops
    loops = [r for r in loops if (constant(size_of(r)) or PARALLEL_MIN_SLICES) >= PARALLEL_MIN_SLICES] or loops
  plan.apply(OptOps.PARALLEL, loops[0])


def _block_reduction(plan: Planner, block_bytes: int, packed: set, cores: int | None = None) -> None:
  """ACCUMULATE the outermost reduce loop in blocks whose reads fit block_bytes, when some load that is not packed
  reads more than that over the reduce loops and again for each iteration of an output loop (see 7. above); given
  the cores, again on each core from beyond the caches (_rereads_per_core)."""
  if not plan.reduce_loops: return
  outer = plan.reduce_loops[0]
  size = constant(size_of(outer))
  if size is None or size < 2: return
  loads = [a for a in accesses(plan.ast) if not a.is_store and a.buffer not in packed]
  if not any(_read_again(a, plan.output_loops) and (span := _span(a.index, plan.reduce_loops)) is not None
             and span * a.itemsize > block_bytes and (cores is None or _rereads_per_core(plan, a, cores) > 1)
             for a in loads): return
  # every load's block must fit beside the others', and a block must be long enough to pay for its read of the output
  per_iteration = sum(abs(stride(a.index, outer) or 0) * a.itemsize for a in loads)
  others = [constant(size_of(r)) for r in plan.reduce_loops[1:]]
  if not per_iteration or None in others: return
  fitting = _divisor_at_most(size, max(1, block_bytes // per_iteration))
  amount = max(fitting, -(-BLOCK_MIN_ITERATIONS // math.prod(others)))
  if -(-size // amount) >= MIN_BLOCKS: plan.apply(OptOps.ACCUMULATE, outer, amount)


def _rereads_per_core(plan: Planner, access: Access, cores: int) -> int:
  """How often each core reads the load anew from beyond its caches: the iterations (a core's share of a parallel
  loop's) of the output loops outside every loop it moves along. A loop inside one it moves along reads again a strip
  the caches still hold. Once per core, blocks of the sum only add passes over the output (a language model's head,
  x^T dy of 2048x2048 by 2048x128 in two tiles of columns, one a core, AVX-512: 8.6 ms in blocks of 256, 6.4 ms
  whole)."""
  count = 1
  for loop in plan.output_loops:
    if stride(access.index, loop) != 0: break
    iterations = constant(size_of(loop)) or 1
    count *= ceildiv(iterations, cores) if range_kind(loop) == PARALLEL else iterations
  return count


def _read_again(access: Access, loops: list[UOp]) -> bool:
  """The load reads the same elements for every iteration of one of the loops (of more than one iteration)."""
  return any(stride(access.index, r) == 0 and (constant(size_of(r)) or 0) > 1 for r in loops)


def _span(index: UOp, loops: list[UOp]) -> int | None:
  """How many elements apart the first and last element the index reads over the loops (and its vector lanes and
  copies) lie, plus one; None where it is not linear in them or their sizes are not constants."""
  varying = [r for r in index.toposort if r.op is Ops.RANGE and (r in loops or range_kind(r) in EXPANDED_KINDS)]
  total = 1
  for r in varying:
    jump, size = stride(index, r), constant(size_of(r))
    if jump is None or size is None: return None
    total += abs(jump) * (size - 1)
  return total


def _has_remainder(plan: Planner, loop: UOp) -> bool:
  """Some access is gated on the loop by a comparison no reduce loop enters: the loop was split by an amount that
  does not divide it (a padded window's gate `0 <= y + ky - p` is not a remainder: bound_gated_loops handles it)."""
  reduced = set(plan.reduce_loops)
  return any(loop in (ranges := {r for r in clause.toposort if r.op is Ops.RANGE}) and not ranges & reduced
             for index in plan.ast.toposort if index.op is Ops.INDEX and len(index.src) == 3
             for clause in clauses(index.src[2]))
