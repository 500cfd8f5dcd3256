"""Map a kernel's output loops and thread ranges to a GPU launch: the grid of blocks and the threads of a block.

After the opts, a GPU kernel has output loops (kind "loop"), thread ranges (kind "thread", made by THREADS and
BLOCK_REDUCE) and reduce loops. `map_to_gpu` replaces every output loop by a grid index and every thread range by a
thread index, SPECIAL nodes named `gidx0..2` and `lidx0..2` whose source is their size. The last thread range (the
most recent opt) and the innermost output loop become dimension 0 (x), which the hardware counts fastest, so
consecutive threads touch consecutive elements. A kernel with more than three output loops folds the outer ones
into one grid dimension (each recovered with `//` and `%`); so does one whose y or z size would pass the limit.

After this pass: no RANGE of kind "loop" or "thread" is left; the kernel runs as grid x block threads, each doing
its reduce loops; `launch_dims` reads the sizes back off the SPECIALs.
"""
from __future__ import annotations

import math

from rawgrad.compiler.codegen.opt.kernel import LOOP, PARALLEL, THREAD, OptError, all_ranges, range_kind, size_of
from rawgrad.compiler.ir import Ops, UOp, as_index
from rawgrad.compiler.rewrite import substitute
from rawgrad.compiler.symbolic import simplify
from rawgrad.compiler.target import Target
from rawgrad.dtype import dtypes

GRID_NAMES, THREAD_NAMES = ("gidx0", "gidx1", "gidx2"), ("lidx0", "lidx1", "lidx2")


def special(name: str, size: UOp) -> UOp:
  return UOp(Ops.SPECIAL, dtypes.index, (size,), name)


def map_to_gpu(ast: UOp, target: Target) -> UOp:
  """The kernel with its output loops on the grid and its thread ranges on the threads of a block."""
  ranges = all_ranges(ast)
  if any(range_kind(r) == PARALLEL for r in ranges):
    raise OptError(f"kernel {ast.arg}: a PARALLEL loop splits work across CPU cores; {target.arch} uses the grid")
  threads = [r for r in ranges if range_kind(r) == THREAD]
  loops = [r for r in ranges if range_kind(r) == LOOP]
  mapping = {**_thread_indices(ast, threads, target), **_grid_indices(loops, target)}
  return substitute(ast, mapping) if mapping else ast


def _thread_indices(ast: UOp, threads: list[UOp], target: Target) -> dict[UOp, UOp]:
  sizes = [size_of(r) for r in threads]
  if not all(isinstance(size, int) for size in sizes):
    raise OptError(f"kernel {ast.arg}: thread counts must be constants, got {sizes}")
  if math.prod(sizes) > target.max_threads_per_block:
    raise OptError(f"kernel {ast.arg}: a block of {' x '.join(map(str, sizes))} threads is more than "
                   f"{target.arch}'s {target.max_threads_per_block}")
  # the most recently made thread range counts fastest
  return {r: special(name, r.src[0]) for r, name in zip(reversed(threads), THREAD_NAMES)}


def _grid_indices(loops: list[UOp], target: Target) -> dict[UOp, UOp]:
  """Innermost loop on x; with more than three loops, or a y/z size past the limit, the outer loops fold into one."""
  loops = list(reversed(loops))  # innermost first
  dims: list[list[UOp]] = [[r] for r in loops[:2]]
  if len(loops) > 2: dims.append(loops[2:])
  if any(not _fits(_dim_size(dim), limit) for dim, limit in zip(dims[1:], target.max_grid[1:])):
    dims = [loops] if loops else []
  mapping: dict[UOp, UOp] = {}
  for dim, name in zip(dims, GRID_NAMES):
    index = special(name, _dim_size(dim))
    if len(dim) == 1:
      mapping[dim[0]] = index
      continue
    # dim lists loops innermost first: the innermost moves fastest in the folded index
    stride: UOp = as_index(1)
    for r in dim:
      mapping[r] = simplify((index // stride) % r.src[0]) if r is not dim[-1] else simplify(index // stride)
      stride = simplify(stride * r.src[0])
  return mapping


def _dim_size(dim: list[UOp]) -> UOp:
  size = as_index(1)
  for r in dim: size = size * r.src[0]
  return simplify(size)


def _fits(size: UOp, limit: int) -> bool:
  return size.vmax <= limit


def launch_dims(program: list[UOp]) -> tuple[tuple[UOp, ...], tuple[UOp, ...]]:
  """The grid and block sizes (three each, as index expressions) a program's SPECIALs ask for."""
  sizes = {node.arg: node.src[0] for node in program if node.op is Ops.SPECIAL and node.src}
  one = as_index(1)
  return tuple(sizes.get(n, one) for n in GRID_NAMES), tuple(sizes.get(n, one) for n in THREAD_NAMES)
