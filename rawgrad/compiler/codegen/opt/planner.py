"""What the heuristics of every target share: the accesses of a kernel, and a planner that applies opts one by one."""
from __future__ import annotations

from dataclasses import dataclass

from rawgrad.compiler.codegen.opt.kernel import UPCAST, Opt, OptError, OptOps, apply_opt, loop_axes, reduce_ranges
from rawgrad.compiler.ir import Ops, UOp


@dataclass(frozen=True)
class Access:
  """A load or store of a kernel: which parameter, at which index, with which element type."""
  buffer: int
  index: UOp
  itemsize: int
  is_store: bool


def accesses(ast: UOp) -> list[Access]:
  """Every load from and store to a kernel parameter."""
  found = []
  for node in ast.toposort:
    if node.op is Ops.LOAD and node.src[0].op is Ops.INDEX:
      index = node.src[0]
      found.append(Access(index.src[0].arg, index.src[1], node.dtype.itemsize, False))
    if node.op is Ops.STORE:
      index, value = node.src
      found.append(Access(index.src[0].arg, index.src[1], value.dtype.itemsize, True))
  return found


def constant(size: int | UOp) -> int | None:
  return size if isinstance(size, int) else None


def vector_amount(size: int | None, lanes: int) -> int:
  """How many lanes to give an axis of this size (0: do not vectorize it): a machine vector, or the power of two
  that holds a smaller axis. LLVM splits vectors of other widths badly (spilling them to the stack); masked lanes
  cost far less."""
  if size is None or size >= lanes: return lanes
  if size < 2: return 0
  return 1 << (size - 1).bit_length()


def unroll_amount(size: int | None, limit: int) -> int:
  """The largest useful number of copies of an axis of this size, at most `limit` (0: none)."""
  if limit < 2: return 0
  if size is None: return limit
  if size < 2: return 0
  if size <= limit: return size
  for amount in range(limit, 1, -1):
    if size % amount == 0 and amount * 2 > limit: return amount
  return limit


class Planner:
  """Applies opts one by one, re-reading the kernel after each (an opt renumbers the loops)."""

  def __init__(self, ast: UOp):
    self.ast, self.opts = ast, []

  def apply(self, op: OptOps, target: UOp, amount: int = 0) -> UOp | None:
    """Apply the opt to the loop `target`. For a split, the outer loop that keeps the target's place (None when the
    whole loop was used up, or the opt did not apply)."""
    before = loop_axes(self.ast)
    position = before.index(target)
    opt = Opt(op, position, amount)
    try:
      self.ast = apply_opt(self.ast, opt)
    except OptError:
      return None
    self.opts.append(opt)
    after = loop_axes(self.ast)
    return after[position] if len(after) == len(before) else None

  def apply_local(self, buffer: int) -> None:
    """Stage the parameter inside the outermost loop."""
    self.apply_local_at(0, buffer)

  def apply_local_at(self, axis: int, buffer: int) -> None:
    """Stage the parameter inside loop `axis` (when that applies)."""
    opt = Opt(OptOps.LOCAL, axis, buffer)
    try:
      self.ast = apply_opt(self.ast, opt)
    except OptError:
      return
    self.opts.append(opt)

  def apply_stream(self) -> None:
    """Make the stores stream past the caches."""
    self.ast = apply_opt(self.ast, Opt(OptOps.STREAM, 0))
    self.opts.append(Opt(OptOps.STREAM, 0))

  @property
  def loops(self) -> list[UOp]:
    return loop_axes(self.ast)

  @property
  def reduce_loops(self) -> list[UOp]:
    inner = reduce_ranges(self.ast)
    return [r for r in self.loops if r in inner]

  @property
  def output_loops(self) -> list[UOp]:
    inner = reduce_ranges(self.ast)
    return [r for r in self.loops if r not in inner]

  def uses_lanes(self, index: UOp) -> bool:
    """The index moves with the vector lanes (a vector load, or a gather)."""
    return any(node.op is Ops.RANGE and node.arg[1] == UPCAST for node in index.toposort)
