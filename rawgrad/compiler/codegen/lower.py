"""The codegen pipeline of one kernel: choose opts, apply them, expand vectors and copies, linearize.

    kernel AST (rangeify) -> simplify_gated_indices -> apply_opts -> peel_remainders -> expand -> linearize
      -> program (for a renderer)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from rawgrad.compiler.codegen.expand import expand
from rawgrad.compiler.codegen.gates import simplify_gated_indices
from rawgrad.compiler.codegen.linearize import linearize
from rawgrad.compiler.codegen.opt.kernel import PARALLEL, Opt, all_ranges, apply_opts, range_kind
from rawgrad.compiler.codegen.peel import peel_remainders
from rawgrad.compiler.ir import Ops, UOp


SLICES_PER_THREAD = 8  # threads claim slices as they finish: a thread slowed by other work takes fewer


@dataclass(frozen=True)
class LoweredKernel:
  """A kernel ready to render: its opts and its linear program."""
  name: str
  opts: tuple[Opt, ...]
  program: list[UOp]
  parallel: bool          # the kernel splits its outermost loop into the `cores` slices it is launched with
  parallel_size: int | None = None  # iterations of that loop (None: not known before the launch)

  def slices(self, threads: int) -> int:
    """How many slices to launch on `threads` threads: several per thread, at most one per iteration."""
    if not self.parallel or threads <= 1: return 1
    wanted = SLICES_PER_THREAD * threads
    return wanted if self.parallel_size is None else max(1, min(wanted, self.parallel_size))

  def __repr__(self) -> str:
    return f"LoweredKernel({self.name}, {list(self.opts)}, {len(self.program)} instructions)"


def lower_kernel(ast: UOp, opts: Sequence[Opt] | None = None) -> LoweredKernel:
  """The program of a kernel with the given opts (None: the heuristics' choice)."""
  if opts is None:
    from rawgrad.compiler.codegen.opt.heuristic import hand_coded_opts
    opts = hand_coded_opts(ast)
  optimized = apply_opts(simplify_gated_indices(ast), opts)
  parallel = [r for r in all_ranges(optimized) if range_kind(r) == PARALLEL]
  size = parallel[0].src[0].arg if parallel and parallel[0].src[0].op is Ops.CONST else None
  return LoweredKernel(ast.arg, tuple(opts), linearize(expand(peel_remainders(optimized))), bool(parallel), size)


def kernel_buffers(ast: UOp) -> list[UOp]:
  """The kernel's DEFINE_GLOBALs in parameter order."""
  return sorted({node for node in ast.toposort if node.op is Ops.DEFINE_GLOBAL}, key=lambda node: node.arg)
