"""The scheduler: turn the tensor graph into kernels.

Movement ops never move data: they become index arithmetic. Every realized node gets fresh RANGEs, one per
dimension, and an index walks from it toward the inputs through every movement op. A node whose consumers ask for
it at different indices becomes a buffer when recomputing it would repeat a reduction; elementwise work is always
recomputed in place. See ARCHITECTURE.md, "The scheduler: rangeify", for the seven steps implemented below.
"""
from __future__ import annotations

import itertools
import re
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Iterator

from rawgrad.compiler.codegen.gates import clauses
from rawgrad.compiler.codegen.opt.kernel import ACCUMULATE, LOOP, renumber, stride as stride_along
from rawgrad.compiler.ir import GroupOp, Ops, UOp, all_int, as_index, origins
from rawgrad.compiler.rewrite import PatternMatcher, UPat, graph_rewrite, substitute
from rawgrad.compiler.spec import verify_kernel, verify_tensor_graph
from rawgrad.compiler.symbolic import simplify
from rawgrad.dtype import dtypes
from rawgrad.helpers import DEBUG, SPEC, prod, unique_id

# ops that start a tensor graph: they have no data sources to index
LEAVES = frozenset({Ops.BUFFER, Ops.CONST, Ops.IOTA, Ops.BIND, Ops.DEFINE_VAR, Ops.DEVICE, Ops.UNIQUE})
TRUE = UOp.const(dtypes.bool, True)
RANDOM_DRAW = "random_draw"  # the variable a random tensor's draw number is bound to
COSTLY_OPS = frozenset({Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.FDIV, Ops.RECIPROCAL})
RECOMPUTED_MIN = 16  # times a sum would recompute a costly value before it becomes a buffer


def is_value_parameter(variable: UOp) -> bool:
  """A kernel variable that carries a value (a parameterized constant, a random draw), not a size."""
  return re.fullmatch(r"_[cr]\d+", variable.arg[0]) is not None


def is_random_draw(variable: UOp) -> bool:
  """A kernel variable that carries a random draw's number (named by unbind())."""
  return re.fullmatch(r"_r\d+", variable.arg[0]) is not None

Index = tuple[UOp, ...]


@dataclass(frozen=True)
class ScheduleItem:
  """One kernel: its AST (a SINK of STOREs, one per output) and the BUFFER nodes bound to its parameters, outputs
  first."""
  ast: UOp
  buffers: tuple[UOp, ...]
  var_values: tuple[tuple[UOp, int | float], ...] = ()
  dims: tuple = ()                 # the shape of what the kernel stores
  operations: tuple[str, ...] = ()  # the tensor operations it computes, where the profiler recorded them
  binds: tuple[tuple[UOp, UOp], ...] = ()  # (variable, the tensor graph's BIND node it takes its value from)
  outputs: int = 1                  # how many of the buffers (the first) the kernel writes

  @property
  def name(self) -> str:
    return self.ast.arg


@dataclass
class Schedule:
  items: list[ScheduleItem]
  becomes_map: dict[UOp, UOp]
  reasons: dict[UOp, str] = field(default_factory=dict)


# *** step 1: clean up ***

pm_cleanup = PatternMatcher([
  # gradients and detaching do not change values
  (UPat((Ops.DETACH, Ops.CONTIGUOUS_BACKWARD), src=(UPat.var("x"),)), lambda x: x),
  # contiguous of something that already is a contiguous buffer is the buffer
  (UPat(Ops.CONTIGUOUS, src=(UPat.var("view"),)), lambda view: view if buffer_base(view) is not None else None),
])
"""After pm_cleanup: no DETACH or CONTIGUOUS_BACKWARD, no CONTIGUOUS of a buffer. (Few rules on purpose: every
rewrite rebuilds the nodes above it, and those lose the profiler's record of where they came from.)"""


# A reduction of few outputs on a GPU runs a block of threads per output (gpu_heuristic: BLOCK_REDUCE): a full sum
# is one block on one SM. Where the blocks would be too few for what it reads, the outermost reduce axis it can be
# is split: a first kernel sums chunks into partials (SPLIT_REDUCE_BLOCKS blocks or more), a second kernel the
# partials. H100, sum of 2^26 floats: 8.44 -> 0.78 ms (torch 0.12). A batch norm's channel sums (128x32x20x20) were
# 131 -> 47 us of kernel time, but the kernel added cost as much on MNIST's jitted step (5.84 -> 5.92 ms, 84 -> 105
# kernels) and more in eager calls (0.29 -> 0.54 ms): reductions reading fewer than SPLIT_REDUCE_MIN_ELEMENTS stay
# whole (a boundary between those two sizes, not measured at it).
GPU_DEVICES = ("NV", "AMD", "SIM")
SPLIT_REDUCE_BLOCKS = 512     # blocks a reduction should run at least (an H100 holds 132 SMs x 8 such blocks)
SPLIT_REDUCE_CHUNK = 2048     # elements each partial sums at least (8 per thread of a block of 256)
SPLIT_REDUCE_MIN_ELEMENTS = 1 << 22


def _split_reduce(node: UOp) -> UOp | None:
  """REDUCE_AXIS over few outputs on a GPU as a sum of partial sums (see SPLIT_REDUCE_BLOCKS)."""
  source, (op, axes) = node.src[0], node.arg
  if _kind(node.device) not in GPU_DEVICES or not all_int(source.shape): return None
  outputs, length = prod(node.shape), prod(source.shape[a] for a in axes)
  if outputs == 0 or outputs >= SPLIT_REDUCE_BLOCKS or outputs * length < SPLIT_REDUCE_MIN_ELEMENTS: return None
  wanted = (SPLIT_REDUCE_BLOCKS // outputs - 1).bit_length()   # log2 of the partials per output that fill the blocks
  allowed = max(length // SPLIT_REDUCE_CHUNK, 1).bit_length() - 1   # log2 of the chunks the reduction has room for
  split = 1 << min(wanted, allowed)
  while split > 1 and not any(source.shape[a] % split == 0 for a in axes): split //= 2
  if split < 2: return None
  axis = next(a for a in sorted(axes) if source.shape[a] % split == 0)
  shape = source.shape
  chunks = source.reshape(shape[:axis] + (split, shape[axis] // split) + shape[axis + 1:])
  inner = tuple(sorted([a + (a > axis) for a in axes if a != axis] + [axis + 1]))
  partials = UOp(Ops.CONTIGUOUS, node.dtype, (UOp(Ops.REDUCE_AXIS, node.dtype, (chunks,), (op, inner)),))
  return UOp(Ops.REDUCE_AXIS, node.dtype, (partials,), (op, (axis,))).reshape(node.shape)


pm_split_reduce = PatternMatcher([(UPat(Ops.REDUCE_AXIS, name="node"), _split_reduce)])


def read_contiguous_copies(sink: UOp) -> UOp:
  """Where contiguous() of a computed value makes it a buffer, the value's other readers read that buffer: the same
  values, computed once, and what the value is computed from need not stay a buffer for them. (A ReLU's gradient
  reads the ReLU that the next convolution makes contiguous: the convolution before it then stores the ReLU alone,
  not its input for the gradient and the ReLU again.) The sink's own outputs stay as they are: each is its buffer.
  A rebuilt node keeps the profiler's record of the operation that made it."""
  copies = {node.src[0]: node for node in sink.toposort if node.op is Ops.CONTIGUOUS and node.src[0].op in GroupOp.ALU}
  if not copies: return sink
  rebuilt: dict[UOp, UOp] = {}

  def read(source: UOp) -> UOp:
    if source not in copies: return rebuilt[source]
    copy = copies[source]
    return copy if rebuilt[source] is source else copy.replace(src=(rebuilt[source],))

  for node in sink.toposort:
    readers_of_copies = node.op not in (Ops.CONTIGUOUS, Ops.SINK)
    sources = tuple(read(s) if readers_of_copies else rebuilt[s] for s in node.src)
    rebuilt[node] = node if sources == node.src else node.replace(src=sources)
    if rebuilt[node] is not node and node in origins: origins[rebuilt[node]] = origins[node]
  return rebuilt[sink]


def buffer_base(node: UOp) -> UOp | None:
  """The BUFFER a node is a plain (reshaped) view of, if it is one."""
  while node.op is Ops.RESHAPE: node = node.src[0]
  return node if node.op is Ops.BUFFER else None


# *** step 2: mark realizes ***

def mark_realizes(sink: UOp) -> dict[UOp, str]:
  """The nodes that must become buffers, each with the reason."""
  realizes: dict[UOp, str] = {}
  for output in sink.src:
    if buffer_base(output) is None: realizes[output] = "output"
  for node in sink.toposort:
    if node.op is Ops.CONTIGUOUS: realizes[node] = "contiguous requested"
    if node.op is Ops.COPY:
      realizes[node] = f"copied to {node.src[1].arg}"
      if buffer_base(node.src[0]) is None: realizes[node.src[0]] = f"it is copied to {node.src[1].arg}"
    if node.op is Ops.ASSIGN:
      realizes[node] = "assign"
      target, value = node.src
      if _reads_at_other_indices(value, target):
        realizes[value] = "it reads the buffer it is assigned into at other indices"
  return realizes


def assign_target_buffer(target: UOp) -> UOp:
  """The BUFFER under an assign target (a view made of movement ops)."""
  while target.op in GroupOp.Movement or target.op is Ops.ASSIGN: target = target.src[0]
  if target.op is not Ops.BUFFER: raise ValueError(f"cannot assign into {target.op}: the target must be a buffer view")
  return target


def _reads_at_other_indices(value: UOp, target: UOp) -> bool:
  """Could computing `value` in place read an element of target's buffer that the same kernel already overwrote?
  Conservatively yes whenever it reaches the buffer through a view other than the target itself."""
  buffer = assign_target_buffer(target)
  reaches_buffer: set[UOp] = set()  # filled sources first, in one walk
  for node in value.toposort:
    if node is buffer or any(source in reaches_buffer for source in node.src): reaches_buffer.add(node)
  return any(node is not target and node.op in GroupOp.Movement for node in reaches_buffer)


# *** steps 3 and 4: push indices up the graph, in reverse toposort order: all of a node's consumers ask first ***

def _strides(shape: tuple) -> list:
  strides, running = [], 1
  for size in reversed(shape):
    strides.append(running)
    running = running * size
  return list(reversed(strides))


def linear_index(idx: Index, shape: tuple) -> UOp:
  """sum(i * stride) in row-major order, without the terms of zero indices or the multiplications by 1 (fewer nodes
  to build and to simplify: most indices are a few ranges)."""
  terms = [i if _is_one(stride) else i * stride for i, stride in zip(idx, _strides(shape))
           if not (i.op is Ops.CONST and i.arg == 0)]
  if not terms: return as_index(0)
  total = terms[0]
  for term in terms[1:]: total = total + term
  return total


def _simplified(idx: Index, valid: UOp) -> tuple[Index, UOp]:
  both = simplify(UOp.sink(*idx, valid))
  return both.src[:-1], both.src[-1]


def index_through(node: UOp, idx: Index, valid: UOp) -> tuple[Index, UOp, UOp | None]:
  """Index a movement op at `idx`: the index into its source, the validity of that access, and for a pad the
  in-bounds condition (the value outside it is 0)."""
  op, source_shape = node.op, node.src[0].shape
  if op is Ops.RESHAPE:
    if (moved := _reshape_of_ones(idx, node.shape, source_shape)) is not None: return moved, valid, None
    new = _reshape_index(idx, node.shape, source_shape)
  elif op is Ops.EXPAND:
    # expand and permute only rearrange simplified expressions: nothing to simplify
    return tuple(as_index(0) if _is_one(old) else i for i, old in zip(idx, source_shape)), valid, None
  elif op is Ops.PERMUTE:
    return tuple(idx[node.arg.index(axis)] for axis in range(len(idx))), valid, None
  elif op is Ops.SHRINK:
    begins = node.src[1:1 + len(idx)]
    new = tuple(i + begin for i, begin in zip(idx, begins))
  elif op is Ops.FLIP:
    new = tuple((as_index(size) - 1 - i) if axis in node.arg else i
                for axis, (i, size) in enumerate(zip(idx, source_shape)))
  elif op is Ops.PAD:
    begins = node.src[1:1 + len(idx)]
    in_bounds = TRUE
    for i, begin, size in zip(idx, begins, source_shape):
      in_bounds = in_bounds & (i < begin).logical_not() & (i < begin + size)
    new, in_bounds = _simplified(tuple(i - begin for i, begin in zip(idx, begins)), in_bounds)
    return new, simplify(valid & in_bounds), in_bounds
  else:
    raise ValueError(f"{op} is not a movement op")
  new, valid = _simplified(new, valid)
  return new, valid, None


class IndexMemo:
  """index_through's results within one schedule. decide_buffers runs again in every round of drop_cheap_buffers and
  kernels index their shared producers alike, so a movement op is asked for the same index many times, and
  simplifying the new index is the expensive part."""

  def __init__(self) -> None:
    self.results: dict[tuple[UOp, Index, UOp], tuple[Index, UOp, UOp | None]] = {}

  def through(self, node: UOp, idx: Index, valid: UOp) -> tuple[Index, UOp, UOp | None]:
    key = (node, idx, valid)
    if key not in self.results: self.results[key] = index_through(node, idx, valid)
    return self.results[key]


def _reshape_index(idx: Index, shape: tuple, source_shape: tuple) -> Index:
  """The source index of a reshape, group by group: consecutive axes whose sizes multiply to the same product on both
  sides map onto each other alone (merging axes is a sum, splitting one is a division and a remainder), so the
  expressions stay as small as the axes they involve. Symbolic or zero sizes flatten the whole index."""
  groups = _reshape_groups(shape, source_shape)
  if groups is None: groups = [(list(range(len(shape))), list(range(len(source_shape))))]
  new: list[UOp] = [as_index(0)] * len(source_shape)
  for axes, source_axes in groups:
    flat = linear_index(tuple(idx[a] for a in axes), tuple(shape[a] for a in axes))
    sizes = tuple(source_shape[a] for a in source_axes)
    for position, (stride, size) in enumerate(zip(_strides(sizes), sizes)):
      # the outermost axis of a group needs no remainder: the flat index is already below the group's size
      new[source_axes[position]] = flat // stride if position == 0 else (flat // stride) % size
  return tuple(new)


def _reshape_groups(shape: tuple, source_shape: tuple) -> list[tuple[list[int], list[int]]] | None:
  """Pairs (axes, source axes) of the smallest runs of consecutive axes with equal products, covering both shapes;
  None when a size is symbolic or zero."""
  if not all(isinstance(size, int) and size > 0 for size in shape + source_shape): return None
  groups: list[tuple[list[int], list[int]]] = []
  i = j = 0
  while i < len(shape) and j < len(source_shape):
    axes, source_axes, product, source_product = [i], [j], shape[i], source_shape[j]
    i, j = i + 1, j + 1
    while product != source_product:
      if product < source_product:
        axes.append(i)
        product *= shape[i]
        i += 1
      else:
        source_axes.append(j)
        source_product *= source_shape[j]
        j += 1
    groups.append((axes, source_axes))
  # what is left on either side is axes of size 1 (the products are equal): they join the last group
  if groups:
    groups[-1][0].extend(range(i, len(shape)))
    groups[-1][1].extend(range(j, len(source_shape)))
  elif shape or source_shape:
    groups.append((list(range(len(shape))), list(range(len(source_shape)))))
  return groups


def _reshape_of_ones(idx: Index, shape: tuple, source_shape: tuple) -> Index | None:
  """A reshape that only adds or removes axes of size 1 (unsqueeze, squeeze, broadcasting's reshapes) moves the
  indices of the other axes unchanged: no flattening and unflattening to simplify."""
  kept = [i for i, size in zip(idx, shape) if not _is_one(size)]
  if [s for s in shape if not _is_one(s)] != [s for s in source_shape if not _is_one(s)]: return None
  kept_iter = iter(kept)
  return tuple(as_index(0) if _is_one(size) else next(kept_iter) for size in source_shape)


def _is_one(size: object) -> bool:
  return isinstance(size, int) and size == 1


def fresh_ranges(shape: tuple, axes: Iterator[int], kind: str = "loop") -> Index:
  return tuple(UOp.range(size, next(axes), kind) if not _is_one(size) else as_index(0) for size in shape)


@dataclass(frozen=True)
class Request:
  """A consumer's demand: the node's value at `idx` where `valid` holds, inside loops over `scope`."""
  idx: Index
  valid: UOp
  scope: frozenset


def source_requests(node: UOp, request: Request, axes: Iterator[int], memo: IndexMemo) -> list[tuple[UOp, Request]]:
  """The requests a node makes of its sources to produce its value at `request`."""
  if node.op in LEAVES or node.op is Ops.COPY: return []  # a copy reads its source's whole buffer
  if node.op in GroupOp.Movement:
    idx, valid, _ = memo.through(node, request.idx, request.valid)
    return [(node.src[0], Request(idx, valid, request.scope))]
  if node.op is Ops.REDUCE_AXIS:
    source_shape = node.src[0].shape
    reduce_ranges = {axis: fresh_ranges((source_shape[axis],), axes, "reduce")[0] for axis in node.arg[1]}
    idx = tuple(reduce_ranges.get(axis, i) for axis, i in enumerate(request.idx))
    scope = request.scope | {r for r in reduce_ranges.values() if r.op is Ops.RANGE}
    return [(node.src[0], Request(idx, request.valid, scope))]
  return [(source, request) for source in node.src if source.op not in (Ops.DEVICE, Ops.UNIQUE)]


def _ranges_in(idx: Index) -> set[UOp]:
  return {node for i in idx for node in i.toposort if node.op is Ops.RANGE}


def _has_unrealized_reduce(node: UOp, realizes: dict[UOp, str]) -> bool:
  return _has_unrealized(node, realizes, frozenset({Ops.REDUCE_AXIS}))


def _has_unrealized(node: UOp, realizes: dict[UOp, str], ops: frozenset[Ops]) -> bool:
  stack, seen = [node], set()
  while stack:
    current = stack.pop()
    if current in seen: continue
    seen.add(current)
    if current.op in ops: return True
    stack.extend(s for s in current.src if s not in realizes)
  return False


def _reason_to_bufferize(node: UOp, requests: list[Request], realizes: dict[UOp, str],
                         inline: set[UOp]) -> str | None:
  if node.op is Ops.REDUCE_AXIS:
    for request in requests:
      if missing := request.scope - _ranges_in(request.idx):
        names = ", ".join(sorted(f"r{r.arg[0]}" for r in missing))
        return f"its reduction would be recomputed for every value of {names} (the consumer broadcasts it)"
  # a movement op is only index arithmetic: let the differing requests reach its source, which then decides
  if node.op in GroupOp.Movement: return None
  # so is a widening cast, exactly: its source, narrower, is the buffer if one is needed (a float32 matmul's output
  # that float64 GELU math reads in the forward and the backward: stored as float64, it was twice the bytes, and the
  # matmul that stored it ran at half the vector width)
  if node.op is Ops.CAST and node.dtype.itemsize > node.src[0].dtype.itemsize: return None
  # read along a sum's loop and broadcast along an output loop (a softmax's gradient in a linear layer's gradients,
  # x^T dy and dy W), an exponential or a division would run once per multiply-add, where a buffer computes it once
  # per element (a value the sum's loop does not move, a batch norm's scale, LLVM computes once per output anyway)
  for request in requests:
    used = _ranges_in(request.idx)
    broadcast = [r for r in request.scope - used if r.arg[1] != "reduce"]
    repeats = prod(r.src[0].arg if r.src[0].op is Ops.CONST else RECOMPUTED_MIN for r in broadcast)
    if repeats >= RECOMPUTED_MIN and any(r.arg[1] == "reduce" for r in used):
      if not _has_unrealized(node, realizes, COSTLY_OPS): break  # the same for every request
      names = ", ".join(sorted(f"r{r.arg[0]}" for r in broadcast))
      return f"a sum would compute its exponentials or divisions again for every value of {names}"
  if len({(r.idx, r.valid) for r in requests}) > 1 and node not in inline and _has_unrealized_reduce(node, realizes):
    return f"{len(requests)} consumers index it differently and recomputing it repeats a reduction"
  return None


def decide_buffers(sink: UOp, realizes: dict[UOp, str], inline: set[UOp], memo: IndexMemo) -> dict[UOp, str]:
  """Walk from consumers to producers collecting what each node is asked for; decide which become buffers."""
  realizes = dict(realizes)
  axes = itertools.count()
  requests: dict[UOp, dict[tuple, Request]] = defaultdict(dict)
  for node in reversed(list(sink.toposort)):
    if node.op in LEAVES or node is sink: continue
    if node in realizes:
      mine = [Request(fresh_ranges(node.shape, axes), TRUE, frozenset())]
    elif node in requests:
      mine = list(requests[node].values())
      if reason := _reason_to_bufferize(node, mine, realizes, inline):
        realizes[node] = reason
        mine = [Request(fresh_ranges(node.shape, axes), TRUE, frozenset())]
    else:
      continue
    if node in realizes: mine = [Request(r.idx, r.valid, frozenset(_ranges_in(r.idx))) for r in mine]
    for request in mine:
      for source, source_request in source_requests(node, request, axes, memo):
        requests[source].setdefault((source_request.idx, source_request.valid), source_request)
  return realizes


# *** step 5: cost decisions ***

def drop_cheap_buffers(sink: UOp, realizes: dict[UOp, str], required: dict[UOp, str],
                       memo: IndexMemo) -> dict[UOp, str]:
  """Buffers were inserted generously; recompute instead where no reduction would repeat. Repeat the index walk
  with those nodes forced inline until nothing changes (the forced set only grows, so this ends)."""
  inline: set[UOp] = set()
  while True:
    cheap = {node for node, reason in realizes.items()
             if node not in required and "index it differently" in reason and
             not _has_unrealized_reduce(node, realizes)}
    if not cheap - inline: return realizes
    inline |= cheap
    realizes = decide_buffers(sink, required, inline, memo)


# *** step 6: emit kernels ***

class KernelBuilder:
  """Builds the kernel that stores each of `roots` into its buffer (`outputs`, in the same order): every other
  realized node is read from its buffer. Roots of one shape share its ranges; roots of different shapes (of one
  element count) share one flat range, each unflattening it to its own shape. A root that another root reads at the
  same index is computed once and stored, not read back from its buffer."""

  def __init__(self, roots: list[UOp], outputs: list[UOp], buffers_of: dict[UOp, UOp], memo: IndexMemo):
    self.roots, self.outputs, self.buffers_of, self.memo = roots, outputs, buffers_of, memo
    self.params: dict[UOp, UOp] = {}
    self.var_values: dict[UOp, int | float] = {}
    self.binds: dict[UOp, UOp] = {}
    self.axes = itertools.count()
    self.cache: dict[tuple, UOp] = {}
    self.reduce_loops: dict[tuple, tuple[UOp, ...]] = {}  # (sizes, output index, valid) -> the loops reduced there
    self.operations: dict[str, None] = {}
    self.computed_at: dict[UOp, Index] = {}  # root -> the index this kernel computes it at
    self.scattered_inside: list[UOp] = []  # sums that are not roots but would be scattered (see ScatteredApart)

  def param(self, buffer: UOp) -> UOp:
    if buffer not in self.params:
      self.params[buffer] = UOp(Ops.DEFINE_GLOBAL, buffer.dtype.ptr(buffer.arg), arg=len(self.params))
    return self.params[buffer]

  def load(self, buffer: UOp, shape: tuple, idx: Index, valid: UOp) -> UOp:
    index = simplify(linear_index(idx, shape))
    gate = (valid,) if valid is not TRUE else ()
    return UOp(Ops.LOAD, buffer.dtype, (UOp(Ops.INDEX, buffer.dtype.ptr(buffer.arg), (self.param(buffer), index,
                                                                                     *gate)),))

  @property
  def dims(self) -> tuple:
    if len({root.shape for root in self.roots}) == 1: return self.roots[0].shape
    return (sum(dict.fromkeys(prod(root.shape) for root in self.roots)),)

  def layout(self) -> None:
    """Where each root is computed: the shared ranges of one shape; or the flat range, each element count a part of
    it from its offset on (roots of one count share a part), the other parts gated off."""
    shared = fresh_ranges(self.dims, self.axes)
    offsets: dict[int, int] = {}
    for root in self.roots: offsets.setdefault(prod(root.shape), sum(offsets))
    for root in self.roots:
      if root.shape == self.dims:
        self.computed_at[root] = (shared, TRUE)
        continue
      offset, size = offsets[prod(root.shape)], prod(root.shape)
      flat, valid = shared[0] - offset, TRUE
      if len(offsets) > 1: valid = (shared[0] < offset).logical_not() & (shared[0] < offset + size)
      self.computed_at[root] = _simplified(_reshape_index((flat,), (size,), root.shape), valid)

  def build(self) -> UOp:
    for output in self.outputs: self.param(output)
    self.layout()
    stores = []
    for root, output in zip(self.roots, self.outputs):
      idx, valid = self.computed_at[root]
      value = self.lower(root, idx, valid)
      gate = (valid,) if valid is not TRUE else ()
      store_index = UOp(Ops.INDEX, output.dtype.ptr(output.arg),
                        (self.params[output], self.store_index(root, idx), *gate))
      stores.append(UOp(Ops.STORE, dtypes.void, (store_index, value.cast(output.dtype))))
    sink = merge_loops(collapse_selections(simplify(self.unbind(UOp.sink(*stores)))))
    name = kernel_name(self.dims, sink)
    if len(self.roots) > 1: name = f"{name}_{len(self.roots)}outputs"
    return UOp(Ops.SINK, dtypes.void, parameterize(sink, self.var_values).src, name)

  def unbind(self, sink: UOp) -> UOp:
    """Bound variables (in sizes, hence in indices, or random draws' keys) become kernel parameters: the kernel is
    compiled once for every value, and the values travel in the argument block. Random draws' keys are renamed by
    order of appearance (`_r0`, `_r1`, ...), as one kernel may hold several draws."""
    binds = {node: node.src[0] for node in sink.toposort if node.op is Ops.BIND}
    draws = itertools.count()
    for bind, variable in binds.items():
      if variable.arg[0] == RANDOM_DRAW:
        variable = binds[bind] = UOp.variable(f"_r{next(draws)}", *variable.arg[1:], variable.dtype)
      self.var_values[variable] = bind.src[1].arg
      self.binds[variable] = bind
    return substitute(sink, binds)

  def store_index(self, root: UOp, idx: Index) -> UOp:
    """Where element `idx` of the root goes: the plain layout, or through the view an assign writes into."""
    if root.op is not Ops.ASSIGN: return simplify(linear_index(idx, root.shape))
    view = root.src[0]
    while view.op is not Ops.BUFFER:
      if view.op is Ops.ASSIGN: view = view.src[0]
      elif view.op is Ops.EXPAND: raise ValueError("cannot assign into an expanded view: elements would alias")
      else:
        idx, valid, _ = self.memo.through(view, idx, TRUE)
        # a strided slice pads and then cuts the padding away again; padding that is really written to is an error
        if valid is not TRUE: raise ValueError("cannot assign into the padding of a padded view")
        view = view.src[0]
    return simplify(idx[0])

  def lower(self, node: UOp, idx: Index, valid: UOp) -> UOp:
    key = (node, idx, valid)
    if key not in self.cache: self.cache[key] = self._lower(node, idx, valid)
    return self.cache[key]

  def _lower(self, node: UOp, idx: Index, valid: UOp) -> UOp:
    if node in origins: self.operations[origins[node]] = None
    op = node.op
    if node in self.buffers_of and self.computed_at.get(node) != (idx, valid):
      return self.load(self.buffers_of[node], node.shape, idx, valid)
    if op is Ops.BUFFER: return self.load(node, node.shape, idx, valid)
    if op is Ops.CONST: return UOp.const(node.dtype, node.arg)
    if op is Ops.IOTA: return idx[0].cast(node.dtype)
    if op in (Ops.BIND, Ops.DEFINE_VAR): return node  # unbind() turns bound ones into parameters
    if op in GroupOp.Movement:
      source_idx, source_valid, in_bounds = self.memo.through(node, idx, valid)
      value = self.lower(node.src[0], source_idx, source_valid)
      if in_bounds is None or in_bounds is TRUE: return value
      return UOp(Ops.WHERE, node.dtype, (in_bounds, value, UOp.const(node.dtype, 0)))
    if op is Ops.REDUCE_AXIS:
      reduce_op, axes = node.arg
      source_shape = node.src[0].shape
      ranges = {axis: fresh_ranges((source_shape[axis],), self.axes, "reduce")[0] for axis in axes}
      source_idx = tuple(ranges.get(axis, i) for axis, i in enumerate(idx))
      body = self.lower(node.src[0], source_idx, valid)
      loop_ranges = tuple(r for r in ranges.values() if r.op is Ops.RANGE)
      # a sibling reduction over the same loops at the same place shares them: one pass over memory computes both
      # (a mean and a mean of squares); not one this body reads, which must be complete before it starts
      key = (tuple(r.src[0] for r in loop_ranges), idx, valid)
      shared = self.reduce_loops.setdefault(key, loop_ranges)
      if shared is not loop_ranges and not any(r in body.toposort for r in shared):
        body, loop_ranges = substitute(body, dict(zip(loop_ranges, shared))), shared
      total = UOp(Ops.REDUCE, node.dtype, (body, *loop_ranges), reduce_op)
      # (the cheap test first: only a sum of a selection is simplified and looked at further)
      if node not in self.roots and _summed_selection(total) is not None and _scatters(node.device) and \
         _scattered_row(simplify(total), [i for i in idx if i.op is Ops.RANGE]) is not None:
        self.scattered_inside.append(node)
      return total
    if op in (Ops.CONTIGUOUS, Ops.REALIZE): return self.lower(node.src[0], idx, valid)
    if op is Ops.ASSIGN: return self.lower(node.src[1], idx, valid)
    if op in GroupOp.ALU or op in (Ops.CAST, Ops.BITCAST):
      return UOp(op, node.dtype, tuple(self.lower(source, idx, valid) for source in node.src))
    raise NotImplementedError(f"rangeify cannot lower {op} yet")


# *** values that change between calls become parameters ***

# ops whose constant operand shapes the code, not only the value: shift amounts, divisors (strength-reduced)
_STRUCTURAL_OPERAND = frozenset({Ops.SHL, Ops.SHR, Ops.IDIV, Ops.MOD})
_VALUE_USERS = frozenset({*GroupOp.ALU, Ops.CAST})


def parameterize(store: UOp, var_values: dict[UOp, int | float]) -> UOp:
  """Constants in the value math become kernel parameters, so that a kernel is compiled once for every value of a
  Python scalar, a random draw's key or a loss scale: `y * float(i)` for any i, and every `Tensor.rand(16)`, run
  one compiled program. The rule for what stays folded into the code, because it changes what code is generated:
  - index arithmetic and booleans (sizes, strides, masks);
  - shift amounts and integer divisors (shifts and divisions by constants are strength-reduced);
  - 0, 1 and -1 (identities the simplifier removes), infinities and NaN (reduction identities, masking fills), and
    integer powers of two in multiplications (become shifts).
  The parameters are named by order of appearance (`_c0`, `_c1`, ...), so kernels of one structure share a name
  and a program; their values go to `var_values`. Floats travel as float64, integers as 64-bit index values."""
  replaced: dict[UOp, UOp] = {}
  count = itertools.count()
  for node in store.toposort:
    sources = tuple(replaced.get(source, source) for source in node.src)
    if node.op in _VALUE_USERS:
      sources = tuple(_parameter(source, var_values, count) if _changes_between_calls(source, node.op)
                      else source for source in sources)
    if sources != node.src: replaced[node] = node.replace(src=sources)
  return replaced.get(store, store)


def _changes_between_calls(node: UOp, user: Ops) -> bool:
  if node.op is not Ops.CONST or node.dtype.count != 1 or node.dtype in (dtypes.index, dtypes.bool): return False
  if user in _STRUCTURAL_OPERAND: return False
  value = node.arg
  if dtypes.is_float(node.dtype): return math.isfinite(value) and value not in (0.0, 1.0, -1.0)
  if value in (0, 1, -1) or not -2**63 <= value < 2**63: return False
  return not (user is Ops.MUL and value & (value - 1) == 0)


def _parameter(const: UOp, var_values: dict[UOp, int | float], count: Iterator[int]) -> UOp:
  name = f"_c{next(count)}"
  if dtypes.is_float(const.dtype):
    variable = UOp.variable(name, -math.inf, math.inf, dtypes.float64)
  else:
    variable = UOp.variable(name, -2**63, 2**63 - 1, dtypes.index)
  var_values[variable] = const.arg
  return variable.cast(const.dtype)


def collapse_selections(sink: UOp) -> UOp:
  """A sum over a loop r of `where(r == e & rest, value, 0)`, e not depending on r, has one term: value at r = e
  (an embedding's rows picked by index, gather, index_select, the class a cross entropy reads: each written as a
  one-hot mask summed). It becomes `where(0 <= e < size & rest, value, 0)` with r = e throughout: a gather of N
  rows, not N times every row (an embedding of 8192 indices into 50000 rows of 256: 1.3 s -> 0.2 ms). Where e is
  out of range (an ignored class label, or an index whose range check is deferred to the next read, see
  tensor_ops/bounds.py) r is 0 instead, so no load leaves its buffer: the value is dropped anyway."""
  while (found := next((found for node in sink.toposort if (found := _selection(node)) is not None), None)):
    reduce, replacement = found
    sink = simplify(substitute(sink, {reduce: replacement}))
  return sink


def _selection(reduce: UOp) -> tuple[UOp, UOp] | None:
  """(reduce, what it collapses to) when `reduce` sums a selection by one of its loops."""
  if (selection := _summed_selection(reduce)) is None: return None
  for loop in reduce.src[1:]:
    if (picked := _picked(*selection, loop)) is None: continue
    condition, value, _ = picked
    collapsed = condition.where(value, UOp.const(reduce.dtype, 0))
    others = tuple(r for r in reduce.src[1:] if r is not loop)
    return reduce, (UOp(Ops.REDUCE, reduce.dtype, (collapsed, *others), Ops.ADD) if others else collapsed)
  return None


def _summed_selection(reduce: UOp) -> tuple[UOp, UOp] | None:
  """(condition, value) where `reduce` sums `where(condition, value, 0)`, or a condition cast to a number (value 1:
  a count)."""
  if reduce.op is not Ops.REDUCE or reduce.arg is not Ops.ADD: return None
  body = reduce.src[0]
  if body.op is Ops.WHERE and body.src[2].op is Ops.CONST and body.src[2].arg == 0: return body.src[0], body.src[1]
  if body.op is Ops.CAST and body.src[0].dtype == dtypes.bool: return body.src[0], UOp.const(body.dtype, 1)
  return None


def _picked(condition: UOp, value: UOp, loop: UOp) -> tuple[UOp, UOp, UOp] | None:
  """Where condition = `loop == e & rest`, e free of the loop: the condition and the value at loop = e, and `at`, the
  loop's value there. Where e is out of the loop's range the condition is false and at is 0 (so an address computed
  from it stays in its buffer)."""
  if loop.src[0].op is not Ops.CONST or loop.src[0].arg < 1: return None
  terms = clauses(condition)
  for term in terms:
    if (picked := _equals_loop(term, loop)) is None: continue
    in_range = (picked < UOp.const(picked.dtype, 0)).logical_not() & \
      (picked < UOp.const(picked.dtype, loop.src[0].arg))
    at = in_range.where(picked if picked.dtype == dtypes.index else picked.cast(dtypes.index), 0)
    picked_condition = in_range
    for other in terms:
      if other is not term: picked_condition = picked_condition & substitute(other, {loop: at})
    return picked_condition, substitute(value, {loop: at}), at
  return None


def _equals_loop(term: UOp, loop: UOp) -> UOp | None:
  """e where term is `loop == e` (the loop maybe cast to integer types that hold all of it), e free of the loop."""
  if term.op is not Ops.XOR or term.src[1].op is not Ops.CONST or term.src[1].arg is not True: return None
  unequal = term.src[0]
  if unequal.op is not Ops.CMPNE: return None
  for side, other in (unequal.src, unequal.src[::-1]):
    while side.op is Ops.CAST and dtypes.is_int(side.dtype) and dtypes.max(side.dtype) >= loop.src[0].arg - 1:
      side = side.src[0]
    if side is loop and loop not in other.toposort: return other
  return None


SCATTER_DEVICES = ("CPU",)  # where it was measured (see scatter_sum)
SCATTER_MIN_SAVING = 8       # times less work than the one-hot sum it replaces, at least
SCATTER_MIN_WORK = 1 << 20   # element-operations of the one-hot sum below which it is as quick as two launches
                             # (0.4M: 12 us as a sum, 14 scattered; 1M: 19-22 us, 14-15 scattered)


def scatter_sum(kernel: UOp) -> tuple[UOp, UOp] | None:
  """(fill, scatter), two kernels that store what `kernel` does, where it stores a sum over loops p of
  `where(v == e & rest, value, 0)` (or that plus a start), v an output loop and e free of it: each term lands in the
  one row v = e (an embedding's, index_select's or gather's weight gradient, scatter_add, a count by index). The fill
  stores the start (zeros); the scatter runs the loops p in order (ACCUMULATE loops: never split, parallel or
  expanded) and adds each term to the row it lands in, read back from the output. Each element gets the same terms in
  the same order as the sum did (after the start, where the sum added them up first), for work (rows + terms) x the
  other outputs instead of rows x terms x them (an embedding's gradient of 8192 indices into 50000 rows of 256:
  621 -> 0.92 ms). An index out of range adds nothing, as in the sum. Only on CPUs (SCATTER_DEVICES): on a GPU the
  loops p would run one after another in every thread, and only the other outputs would make threads."""
  if len(kernel.src) != 1: return None
  store = kernel.src[0]
  place, stored = store.src[0], store.src[1]
  total, base = stored, UOp.const(stored.dtype, 0)
  if stored.op is Ops.ADD and Ops.REDUCE in (stored.src[0].op, stored.src[1].op):
    total, base = stored.src if stored.src[0].op is Ops.REDUCE else stored.src[::-1]
  if len(place.src) != 2 or _summed_selection(total) is None or any(r in base.toposort for r in total.src[1:]):
    return None
  outputs = sorted((r for r in place.src[1].toposort if r.op is Ops.RANGE), key=lambda r: r.arg[0])
  if (found := _scattered_row(total, outputs)) is None: return None
  output = place.src[0]
  if any(node.op is Ops.INDEX and node.src[0] is output and node is not place for node in kernel.toposort): return None
  row, condition, value, at = found
  target = UOp(Ops.INDEX, place.dtype, (output, substitute(place.src[1], {row: at}), condition))
  adds = store.replace(src=(target, UOp(Ops.LOAD, total.dtype, (target,)) + value))
  sequential = {r: r.replace(arg=(r.arg[0], ACCUMULATE)) for r in total.src[1:]}
  scatter = simplify(substitute(kernel.replace(src=(adds,)), sequential))
  # any order of the loops adds each element's terms in order: the loops the terms' reads move far along go outside
  loads = [node.src[0].src[1] for node in scatter.toposort if node.op is Ops.LOAD and node.src[0].src[0] is not output]
  def reach(loop: UOp) -> int:
    return max((1 << 62 if (jump := stride_along(i, loop)) is None else abs(jump) for i in loads), default=0)
  loops = sorted([*sequential.values(), *(r for r in outputs if r is not row)], key=reach, reverse=True)
  return kernel.replace(src=(store.replace(src=(place, base)),)), renumber(scatter, loops)


def _scattered_row(total: UOp, outputs: list[UOp]) -> tuple[UOp, UOp, UOp, UOp] | None:
  """(the row loop, and the condition, value and row of a term at it) where the sum `total`, computed inside the
  output loops `outputs` (RANGEs), sums a selection of one of them, and scattering it saves enough."""
  if (selection := _summed_selection(total)) is None: return None
  terms = total.src[1:]
  if any(r.src[0].op is not Ops.CONST for r in terms): return None
  count = prod(r.src[0].arg for r in terms)
  for row in outputs:
    if (picked := _picked(*selection, row)) is None: continue
    rows, others = row.src[0].arg, prod(r.src[0].arg for r in outputs if r is not row and r.src[0].op is Ops.CONST)
    if rows * count < SCATTER_MIN_SAVING * (rows + count) or rows * count * others < SCATTER_MIN_WORK: return None
    return row, *picked
  return None


def _scatters(device: str) -> bool:
  return _kind(device) in SCATTER_DEVICES


def _kind(device: str) -> str:
  """"CPU" of "CPU:1": the device kind the CPU-only rules (SCATTER_DEVICES, STREAMED_DEVICES, ...) name."""
  return device.split(":")[0]


class ScatteredApart(Exception):
  """A sum that would be scattered, computed inside a kernel that stores something else (a gradient an SGD step
  subtracts right away): it becomes a buffer of its own, and the schedule is built again."""

  def __init__(self, total: UOp):
    super().__init__(f"a scattered sum of shape {total.shape} becomes a buffer")
    self.total = total


def merge_loops(sink: UOp) -> UOp:
  """Two nested loops, both output loops or both loops of one REDUCE, that every access walks as one loop, the outer
  moving exactly the inner's length times as far (the rows and columns of a contiguous image), become one: its
  vectors and register blocks then see the whole run (a 20x20 image is 400 contiguous floats, not 20 rows of 20 that
  fill 32 lanes; an update of a 64x32x3x3 weight is 18432 floats, not rows of 3 padded to a vector of 4). Loops a gate
  or a computed value reads stay as they are (merging them would be as right, but leave a division in the loop)."""
  while (pair := next((pair for pair in _nested_pairs(sink) if _walked_as_one(sink, *pair)), None)) is not None:
    outer, inner = pair
    size = inner.src[0].arg
    merged = UOp.range(outer.src[0].arg * size, outer.arg[0], outer.arg[1])
    new: dict[UOp, UOp] = {outer: merged // size, inner: merged % size}
    for node in sink.toposort:
      if node in new: continue
      sources = tuple(new.get(source, source) for source in node.src)
      if node.op is Ops.REDUCE and outer in node.src[1:]:
        sources = (sources[0], *(merged if r is outer else r for r in node.src[1:] if r is not inner))
      new[node] = node if sources == node.src else node.replace(src=sources)
    sink = simplify(new[sink])
  return sink


def _nested_pairs(sink: UOp) -> Iterator[tuple[UOp, UOp]]:
  """(outer, inner) of constant sizes, consecutive output loops or consecutive loops of a REDUCE."""
  outputs = [node for node in sink.toposort if node.op is Ops.RANGE and node.arg[1] == LOOP]
  reduces = [node.src[1:] for node in sink.toposort if node.op is Ops.REDUCE]
  for group in (sorted(loops, key=lambda r: r.arg[0]) for loops in (outputs, *reduces)):
    for outer, inner in zip(group, group[1:]):
      if outer.src[0].op is Ops.CONST and inner.src[0].op is Ops.CONST and inner.src[0].arg > 1:
        yield outer, inner


def _walked_as_one(sink: UOp, outer: UOp, inner: UOp) -> bool:
  """Every use of the two loops is in an address that moves inner's size times as far along outer as along inner,
  and every REDUCE over one of them loops over both, one right inside the other."""
  for node in sink.toposort:
    if node.op is Ops.REDUCE and (outer in node.src[1:]) != (inner in node.src[1:]): return False
    if node.op is Ops.INDEX:
      if any(r in gate.toposort for gate in node.src[2:] for r in (outer, inner)): return False
      along_outer, along_inner = stride_along(node.src[1], outer), stride_along(node.src[1], inner)
      if along_outer is None or along_inner is None or along_outer != along_inner * inner.src[0].arg: return False
    elif node.op not in (Ops.ADD, Ops.MUL, Ops.REDUCE, Ops.SINK) and any(r in node.src for r in (outer, inner)):
      return False
  return True


def kernel_name(shape: tuple, kernel: UOp) -> str:
  """E_ for elementwise kernels, r_ for reductions, then the output shape (and the reduced sizes)."""
  reduces = [node for node in kernel.toposort if node.op is Ops.REDUCE]
  sizes = "_".join(_size_name(as_index(s)) for s in shape) or "1"
  if not reduces: return f"E_{sizes}"
  reduced = "_".join(_size_name(r.src[0]) for node in reduces for r in node.src[1:])
  return f"r_{sizes}_{reduced}" if reduced else f"r_{sizes}"


def _size_name(size: UOp) -> str:
  return str(size.arg) if size.op is Ops.CONST else size.render()


# *** the pipeline ***

def create_schedule(outputs: list[UOp], on_kernel: Callable[[ScheduleItem], None] | None = None) -> Schedule:
  """Kernels that realize `outputs` (in dependency order) and the becomes map for the tensor graph. `on_kernel` is
  called with each kernel as soon as it is built (in build order), so a caller can start compiling it. A kernel
  may take any number of buffers: past its target's argument limit, codegen passes them in an argument table."""
  sink = read_contiguous_copies(graph_rewrite(UOp.sink(*outputs), pm_cleanup, name="pm_cleanup"))
  # (the walk for the devices is the one the scheduler caches next; a rewritten sink drops it: it would hold the sink)
  if any(node.op is Ops.DEVICE and _kind(node.arg) in GPU_DEVICES for node in sink.toposort):
    if (split := graph_rewrite(sink, pm_split_reduce, name="pm_split_reduce")) is not sink:
      sink.__dict__.pop("toposort", None)
      sink = split
  if SPEC: verify_tensor_graph(sink)
  cleaned = dict(zip(outputs, sink.src))
  required = mark_realizes(sink)
  memo = IndexMemo()
  realizes = drop_cheap_buffers(sink, decide_buffers(sink, required, set(), memo), required, memo)
  while True:
    try:
      ordered, buffers_of = _kernels(sink, realizes, memo, on_kernel)
      break
    except ScatteredApart as apart:
      realizes[apart.total] = "a sum scattered into its rows (rangeify.scatter_sum) is a kernel of its own"
  sink.__dict__.pop("toposort", None)   # it holds the sink: a cycle that would keep the graph's buffers until a gc
  return Schedule(ordered, make_becomes_map(cleaned, buffers_of), realizes)


def _kernels(sink: UOp, realizes: dict[UOp, str], memo: IndexMemo, on_kernel: Callable[[ScheduleItem], None] | None
             ) -> tuple[list[ScheduleItem], dict[UOp, UOp]]:
  """The kernels that realize `realizes`, in the order they run, and the buffer of each realized node."""
  buffers_of: dict[UOp, UOp] = {}
  for node in sink.toposort:
    if node not in realizes: continue
    if node.op is Ops.ASSIGN: buffers_of[node] = assign_target_buffer(node.src[0])
    else:
      buffers_of[node] = UOp(Ops.BUFFER, node.dtype, (UOp(Ops.UNIQUE, arg=unique_id()),
                                                      UOp(Ops.DEVICE, arg=node.device)), prod(node.shape))
  groups = group_kernels([node for node in buffers_of if prod(node.shape) != 0], realizes, set(sink.src))
  kernels = KernelEmitter(buffers_of, memo, realizes, on_kernel)
  try:
    items, roots = kernels.emit(groups)
    return order_for_assigns(items, roots), buffers_of
  except KernelCycle:
    if DEBUG >= 2: print("kernel groups: fusing would make two kernels each wait for the other; not fusing")
    items, roots = kernels.emit([[node] for group in groups for node in group])
    return order_for_assigns(items, roots), buffers_of


class KernelEmitter:
  """Builds the schedule items of the kernel groups: a copy item for a COPY, one kernel for the others. A group whose
  kernel would write a buffer it also reads at another index is split into its members."""

  def __init__(self, buffers_of: dict[UOp, UOp], memo: IndexMemo, realizes: dict[UOp, str],
               on_kernel: Callable[[ScheduleItem], None] | None):
    self.buffers_of, self.memo, self.realizes = buffers_of, memo, realizes
    self.on_kernel = on_kernel

  def emit(self, groups: list[list[UOp]]) -> tuple[list[ScheduleItem], list[tuple[UOp, ...]]]:
    items: list[ScheduleItem] = []
    roots: list[tuple[UOp, ...]] = []
    for group in groups:
      for item, members in self.build(group):
        items.append(item)
        roots.append(members)
        if self.on_kernel is not None and item.ast.op is not Ops.COPY: self.on_kernel(item)
    return items, roots

  def build(self, group: list[UOp]) -> list[tuple[ScheduleItem, tuple[UOp, ...]]]:
    node = group[0]
    if node.op is Ops.COPY:
      source = self.buffers_of.get(node.src[0]) or buffer_base(node.src[0])
      return [(copy_item(node, self.buffers_of[node], source), (node,))]
    builder = KernelBuilder(group, [self.buffers_of[member] for member in group], self.buffers_of, self.memo)
    ast = builder.build()
    # (not into an assign's buffer: its old contents may still be read by a kernel the fill must wait for)
    if len(group) == 1 and node.op is not Ops.ASSIGN and _scatters(node.device) and (scattered := scatter_sum(ast)):
      fill, scatter = scattered
      if DEBUG >= 3: print(f"kernel {ast.arg}: a sum of terms that each land in one row, scattered after a fill")
      # the fill has no roots: nothing orders it but its place in the list, before the scatter that reads its stores
      return [(self.part_item(fill.replace(arg=kernel_name(builder.dims, fill)), builder, ()), ()),
              (self.part_item(scatter, builder, tuple(builder.operations)), tuple(group))]
    if builder.scattered_inside: raise ScatteredApart(builder.scattered_inside[0])
    if len(group) > 1:
      if (problem := self.unfusable(ast, builder)) is not None:
        if DEBUG >= 2: print(f"kernel group of {len(group)} outputs split: {problem}")
        return [built for member in group for built in self.build([member])]
      if DEBUG >= 2:
        counts = sorted({prod(member.shape) for member in group})
        how = "over as many elements" if len(counts) == 1 else f"small, over their concatenated ranges {counts}"
        what = "sums reading the same memory" if node.op is Ops.REDUCE_AXIS else "elementwise kernels realized together"
        print(f"kernel {ast.arg}: {len(group)} outputs {[member.op.name for member in group]} in one kernel: "
              f"{what} at one depth of the graph, {how}")
    if SPEC: verify_kernel(ast)
    if DEBUG >= 3:
      reasons = "; ".join(f"{member.op} because {self.realizes[member]}" for member in group)
      print(f"kernel {ast.arg}: buffer for {reasons}\n{ast}")
    item = ScheduleItem(ast, tuple(builder.params), tuple(builder.var_values.items()), tuple(builder.dims),
                        tuple(builder.operations), tuple(builder.binds.items()), len(group))
    return [(item, tuple(group))]

  def part_item(self, kernel: UOp, builder: KernelBuilder, operations: tuple[str, ...]) -> ScheduleItem:
    """The item of one of the kernels a scatter is built as: the builder's parameters and variables it uses."""
    used = set(kernel.toposort)
    params = [(buffer, define) for buffer, define in builder.params.items() if define in used]
    kernel = substitute(kernel, {define: define.replace(arg=i) for i, (_, define) in enumerate(params)})
    if SPEC: verify_kernel(kernel)
    if DEBUG >= 3: print(f"kernel {kernel.arg}:\n{kernel}")
    return ScheduleItem(kernel, tuple(buffer for buffer, _ in params),
                        tuple((v, x) for v, x in builder.var_values.items() if v in used), tuple(builder.dims),
                        operations, tuple((v, b) for v, b in builder.binds.items() if v in used))

  def unfusable(self, ast: UOp, builder: KernelBuilder) -> str | None:
    """Why this multi-output kernel cannot run as one (None if it can)."""
    if len(set(builder.outputs)) < len(builder.outputs): return "two outputs write one buffer"
    stored = {store.src[0].src[0]: store.src[0].src[1] for store in ast.src}
    for node in ast.toposort:
      if node.op is Ops.LOAD and (index := node.src[0]).src[0] in stored and stored[index.src[0]] is not index.src[1]:
        return f"it reads parameter {index.src[0].arg} at another index than it writes it"
    return None


# *** step 6a: group kernels: the elementwise kernels of one depth and element count become one ***

ELEMENTWISE = frozenset({*GroupOp.ALU, Ops.CAST, Ops.BITCAST, Ops.CONTIGUOUS, Ops.REALIZE})
CONCATENATED_WASTE = 1 << 16  # outputs times the elements they are computed at outside their part (AdamW: ~30 us)
MAX_STREAMS = 16               # buffers one kernel of a group reads and writes, when the group's buffers
STREAMED_BYTES = 16 << 20      # come to this much at least (more than the caches hold: each is a stream from DRAM)
STREAMED_DEVICES = ("CPU",)    # where that was measured
# where sums that stream the same memory share a kernel (_streaming_sum): a GPU gives each sum of few outputs a block
# of threads (BLOCK_REDUCE) when it is alone, but a kernel of sums over loops of their own gets a thread per output:
# a batch norm's three sums over 128x20x20 for 32 channels, 32 threads, ran 11.8 ms on the H100 (docs/hardware.md)
SHARED_SUM_DEVICES = ("CPU",)


class KernelCycle(RuntimeError):
  pass


def kernel_reads(root: UOp, realizes: dict[UOp, str]) -> tuple[dict[UOp, bool], bool]:
  """The realized nodes the kernel of `root` reads, each True where every path to it is elementwise (it is read at
  the index the root is computed at), and whether the kernel reduces."""
  reads: dict[UOp, bool] = {}
  reduces, seen = False, set()
  stack = _walk_sources(root, True)
  while stack:
    node, same_index = stack.pop()
    if (node, same_index) in seen: continue
    seen.add((node, same_index))
    if node in realizes:
      reads[node] = reads.get(node, True) and same_index and node.shape == root.shape
      continue
    reduces = reduces or node.op is Ops.REDUCE_AXIS
    stack.extend(_walk_sources(node, same_index))
  return reads, reduces


def _walk_sources(node: UOp, same_index: bool) -> list[tuple[UOp, bool]]:
  if node.op is Ops.ASSIGN: return [(node.src[0], False), (node.src[1], same_index)]
  return [(source, same_index and node.op in ELEMENTWISE) for source in node.src]


def group_kernels(nodes: list[UOp], realizes: dict[UOp, str], outputs: set[UOp]) -> list[list[UOp]]:
  """The realized nodes (in toposort order) in groups that become one kernel each, in dependency order.

  Fusable nodes are the outputs and assigns realized together that are elementwise and constant-sized. A fusable
  node read at the same index by a fusable node of its shape is computed in the consumer's kernel (a cluster: an
  Adam update's `m`, `v` and parameter). A cluster's depth is the longest chain of kernels it waits for; fusable
  clusters of one depth, device and element count are one group, as launches are what such kernels cost.
  Sums that stream their inputs (see _streaming_sum) of one depth, shape and reduction share a kernel too; other
  reductions keep one of their own (their opts are chosen for them alone), and so do the buffers the scheduler or a
  contiguous() asks for, which are boundaries on purpose."""
  reads: dict[UOp, dict[UOp, bool]] = {}
  fusable: dict[UOp, bool] = {}
  for node in nodes:
    reads[node], reduces = kernel_reads(node, realizes)
    fusable[node] = (node in outputs or node.op is Ops.ASSIGN) and node.op is not Ops.COPY and not reduces and \
      all(isinstance(size, int) for size in node.shape)
  inline = {(node, m) for node in nodes for m, same_index in reads[node].items()
            if same_index and fusable[node] and fusable.get(m, False) and m.device == node.device}
  clusters = _clusters(nodes, inline)
  while True:
    depth = _cluster_depths(nodes, reads, clusters)
    if len(depth) == len(set(clusters.values())): break
    # clusters on a cycle (a member waits for a kernel that waits for another member) are taken apart
    clusters = {node: cluster if cluster in depth else (node,) for node, cluster in clusters.items()}
  groups: dict[tuple, list[tuple[UOp, ...]]] = {}
  for cluster in sorted(depth, key=lambda c: (depth[c], nodes.index(c[0]))):
    head = cluster[0]
    if fusable[head]: key: tuple = ("fusable", depth[cluster], head.device, prod(head.shape))
    elif _kind(head.device) in SHARED_SUM_DEVICES and (summed := _streaming_sum(head, realizes)) is not None:
      key = ("sums", depth[cluster], head.device, head.shape, summed.src[0].shape, summed.arg)
    else: key = cluster
    groups.setdefault(key, []).append(cluster)
  return [[node for cluster in part for node in cluster] for group in _concatenate_small(groups)
          for part in _split_streams(group, realizes)]


def _split_streams(clusters: list[tuple[UOp, ...]], realizes: dict[UOp, str]) -> list[list[tuple[UOp, ...]]]:
  """A large group's clusters in kernels of at most MAX_STREAMS buffers each. A kernel reads and writes all its
  buffers at the same index, each a stream through memory, and too many of them defeat the prefetchers and the DRAM's
  open pages. AdamW steps (4 buffers per parameter), jit: 32 parameters of 65536 elements 55 -> 93 GB/s in kernels of
  16 buffers, the 12-layer transformer's 146 parameters 6.2 -> 3.6 ms; 64 of 4096 (7 MB, in the caches) ran 158 us
  in one kernel and 199 us split, hence STREAMED_BYTES. Measured on CPUs only: a GPU's memory serves many streams,
  and each of its launches costs more (a jit replay on an H100: 7.3 us per kernel, docs/hardware.md), so GPU
  groups stay whole."""
  if len(clusters) == 1 or _kind(clusters[0][0].device) not in STREAMED_DEVICES: return [clusters]
  streams = [_buffers_of_cluster(cluster, realizes) for cluster in clusters]
  if sum(prod(b.shape) * b.dtype.itemsize for b in set().union(*streams)) < STREAMED_BYTES: return [clusters]
  parts: list[list[tuple[UOp, ...]]] = [[]]
  used: set[UOp] = set()
  for cluster, buffers in zip(clusters, streams):
    if parts[-1] and len(used | buffers) > MAX_STREAMS: parts, used = parts + [[]], set()
    parts[-1].append(cluster)
    used |= buffers
  return parts


def _buffers_of_cluster(cluster: tuple[UOp, ...], realizes: dict[UOp, str]) -> set[UOp]:
  """The buffers (or realized nodes) of more than one element that the cluster's kernel writes or reads."""
  members = set(cluster)
  found = {assign_target_buffer(node.src[0]) if node.op is Ops.ASSIGN else node for node in cluster}
  stack, seen = [source for node in cluster for source in node.src], set()
  while stack:
    node = stack.pop()
    if node in seen or node in members: continue
    seen.add(node)
    if node.op is Ops.BUFFER or node in realizes:
      if prod(node.shape) != 1: found.add(node)
      continue
    stack.extend(node.src)
  return found


def _streaming_sum(node: UOp, realizes: dict[UOp, str]) -> UOp | None:
  """The reduction (under reshapes) a realized node is, when it reads each element of its inputs once (a batch
  norm's sums over a batch), not a product of broadcast inputs (a matmul's, whose register blocks are planned for one
  output). Such sums of one depth over the same axes of the same shape share one kernel: one pass over the memory
  they all read, one accumulator each."""
  while node.op is Ops.RESHAPE: node = node.src[0]
  if node.op is not Ops.REDUCE_AXIS or not all(isinstance(size, int) for size in node.src[0].shape): return None
  inputs, stack, seen = [], [node.src[0]], set()
  while stack:
    current = stack.pop()
    if current in seen: continue
    seen.add(current)
    if current in realizes or current.op is Ops.BUFFER: inputs.append(current)
    elif current.op is Ops.REDUCE_AXIS: return None  # a sum of a sum
    else: stack.extend(current.src)
  sizes = [prod(m.shape) if m.op is not Ops.BUFFER else m.arg for m in inputs]
  return node if sizes and all(isinstance(n, int) for n in sizes) and prod(node.src[0].shape) <= max(sizes) else None


def _concatenate_small(groups: dict[tuple, list[tuple[UOp, ...]]]) -> list[list[tuple[UOp, ...]]]:
  """Fusable groups of one depth and device with few elements in all become one kernel over their concatenated
  ranges. Every element of such a kernel computes every output (those of the other parts gated off), so groups are
  joined, the smallest first, only while that wasted work stays below what a launch costs: outputs times the
  elements outside their own part up to CONCATENATED_WASTE. (MNIST's AdamW once joined its 25600-element weight with
  parameters of 1, 32 and 800 elements: 30 outputs over 26433 elements, 90-120 us instead of 6 us apart.)"""
  places: dict[tuple, list[tuple]] = {}
  for key in groups:
    if key[0] == "fusable": places.setdefault(key[1:3], []).append(key)
  joined_at: dict[tuple, tuple] = {}
  for place, keys in places.items():
    members: list[tuple] = []
    for key in sorted(keys, key=lambda key: key[3]):
      elements = sum(member[3] for member in members) + key[3]
      waste = sum((elements - member[3]) * sum(map(len, groups[member])) for member in [*members, key])
      if waste <= CONCATENATED_WASTE: members.append(key)
    if len(members) > 1: joined_at.update((member, ("small", *place)) for member in members)
  merged: dict[tuple, list[tuple[UOp, ...]]] = {}
  for key, group in groups.items(): merged.setdefault(joined_at.get(key, key), []).extend(group)
  return list(merged.values())


def _clusters(nodes: list[UOp], inline: set[tuple[UOp, UOp]]) -> dict[UOp, tuple[UOp, ...]]:
  """Each node's cluster: the nodes joined to it by inline reads, in toposort order."""
  parent = {node: node for node in nodes}
  def find(node: UOp) -> UOp:
    while parent[node] is not node: node = parent[node]
    return node
  for consumer, producer in inline: parent[find(consumer)] = find(producer)
  members: dict[UOp, list[UOp]] = defaultdict(list)
  for node in nodes: members[find(node)].append(node)
  clusters = {root: tuple(cluster) for root, cluster in members.items()}
  return {node: clusters[find(node)] for node in nodes}


def _cluster_depths(nodes: list[UOp], reads: dict[UOp, dict[UOp, bool]],
                    clusters: dict[UOp, tuple[UOp, ...]]) -> dict[tuple[UOp, ...], int]:
  """The depth of every cluster not on a cycle of the clusters' dependencies."""
  waits_for: dict[tuple, set[tuple]] = defaultdict(set)
  for node in nodes:
    waits_for[clusters[node]].update(clusters[m] for m in reads[node] if clusters[m] != clusters[node])
  depth: dict[tuple, int] = {}
  pending = list(dict.fromkeys(clusters.values()))
  progress = True
  while progress:
    progress = False
    for cluster in pending:
      if cluster not in depth and waits_for[cluster] <= depth.keys():
        depth[cluster] = max((depth[d] + 1 for d in waits_for[cluster]), default=0)
        progress = True
  return depth


def copy_item(node: UOp, dest: UOp, source: UOp) -> ScheduleItem:
  """A COPY between devices (or within one): its AST names it, its buffers are the destination and the source."""
  nbytes = prod(node.shape) * node.dtype.itemsize
  name = f"copy_{nbytes}_{source.src[1].arg}_to_{dest.src[1].arg}"
  return ScheduleItem(UOp(Ops.COPY, node.dtype, (), name), (dest, source), (), tuple(node.shape))


def make_becomes_map(cleaned: dict[UOp, UOp], buffers_of: dict[UOp, UOp]) -> dict[UOp, UOp]:
  """Every realized node (and every output, by its original node) now reads from its buffer."""
  def view_of(node: UOp) -> UOp:
    if node.op is not Ops.ASSIGN: return buffers_of[node].reshape(node.shape)
    while node.op is Ops.ASSIGN: node = node.src[0]
    return node
  becomes_map: dict[UOp, UOp] = {}
  for original, cleaned_output in cleaned.items():
    if cleaned_output in buffers_of: becomes_map[original] = view_of(cleaned_output)
    elif cleaned_output is not original: becomes_map[original] = cleaned_output
  for node in buffers_of:
    if node not in cleaned.values(): becomes_map[node] = view_of(node)
  return becomes_map


def order_for_assigns(items: list[ScheduleItem], roots: list[tuple[UOp, ...]]) -> list[ScheduleItem]:
  """Dependency order, plus: a kernel that reads a buffer's old value runs before the assign that overwrites it."""
  below = [set().union(*(root.walked() for root in group)) for group in roots]
  must_precede: dict[int, set[int]] = {i: set() for i in range(len(items))}
  for i in range(len(items)):
    for j, other in enumerate(roots):
      if i != j and any(root in below[i] for root in other): must_precede[i].add(j)
  for i, group in enumerate(roots):
    for root, target in zip(group, items[i].buffers):
      if root.op is not Ops.ASSIGN: continue
      for j, item in enumerate(items):
        if j != i and target in item.buffers[item.outputs:] and root not in below[j]: must_precede[i].add(j)
  ordered, done = [], set()
  while len(ordered) < len(items):
    ready = [i for i in range(len(items)) if i not in done and must_precede[i] <= done]
    if not ready: raise KernelCycle("assigns form a cycle: two kernels each need the other's old buffer contents")
    done.add(ready[0])
    ordered.append(items[ready[0]])
  return ordered
