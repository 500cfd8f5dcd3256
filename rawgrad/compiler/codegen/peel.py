"""Peel the last iteration off output loops whose gates hold on every other iteration.

A split whose amount does not divide the size (`r -> outer*amount + inner`, amount 12 on a size of 1024) gates every
access that depends on `r` with `outer*amount + inner < size`. Inside a matmul's reduction that gate is tested on
every load, and the loads become masked. It only ever fails on the last iteration of `outer`, so `peel_remainders`
writes each such store twice: once over `outer` in [0, n-1), where the gates simplify away, and once for
`outer = n-1` alone, where they are constants. After it, a kernel's SINK may hold stores over different output loops;
the linearizer runs each store in its own loop nest, sharing the loops they have in common. A parallel loop's peeled
iteration runs in the last slice of the launch only. The peeled copy sums over loops of its own: where only one
iteration of the loop was left beside it (a tile of two column blocks), the linearizer would otherwise run both
copies' sums in one loop, with twice the accumulators the register block was sized for (AVX2's 4 x 3 vectors: 24
live in 16 registers, 135 instead of 200 GFLOPS).
"""
from __future__ import annotations

from rawgrad.compiler.codegen.opt.kernel import (LOOP, PARALLEL, REDUCE, all_ranges, fresh_range_id, range_kind,
                                                 reduce_ranges, simplify_addresses)
from rawgrad.compiler.ir import Ops, UOp
from rawgrad.compiler.rewrite import substitute

MAX_PEELED = 2  # loops peeled per kernel: each one doubles the code of the stores it touches


def peel_remainders(ast: UOp) -> UOp:
  """The kernel with the last iteration of up to MAX_PEELED gated output loops split off (innermost loops first)."""
  peeled = 0
  # a parallel loop's last iteration runs in the last slice (see linearize.py), unless the slices meet at a barrier
  # after it (a GROUP's): only one slice runs the program after that
  peelable = (LOOP,) if any(node.op is Ops.BARRIER for node in ast.toposort) else (LOOP, PARALLEL)
  for loop in reversed(all_ranges(ast)):
    if peeled == MAX_PEELED: break
    if range_kind(loop) not in peelable or loop.src[0].op is not Ops.CONST or loop.src[0].arg < 2: continue
    if (stores := _peel(ast, loop)) is not None:
      ast, peeled = ast.replace(src=stores), peeled + 1
  return ast


def _peel(ast: UOp, loop: UOp) -> tuple[UOp, ...] | None:
  """The stores with `loop` peeled, or None when its gates do not all go away (or a staged copy depends on it: both
  halves would fill the same local buffer)."""
  if not gated_by(ast, loop): return None
  if any(node.op is Ops.AFTER and loop in node.toposort for node in ast.toposort): return None
  last = loop.src[0].arg - 1
  shorter = UOp.range(last, loop.arg[0], range_kind(loop))
  first_free = fresh_range_id(ast)
  loops = sorted((r for r in reduce_ranges(ast) if range_kind(r) == REDUCE), key=lambda r: r.arg[0])
  own = {r: UOp.range(r.src[0], first_free + i, REDUCE) for i, r in enumerate(loops)}
  stores: list[UOp] = []
  for store in ast.src:
    if loop not in store.toposort:
      stores.append(store)
      continue
    main = simplify_addresses(substitute(store, {loop: shorter}))
    if gated_by(main, shorter): return None
    stores += [main, simplify_addresses(substitute(store, {loop: UOp.const(loop.dtype, last), **own}))]
  return tuple(stores)


def gated_by(node: UOp, loop: UOp) -> bool:
  """Some access under `node` is gated on the loop."""
  return any(index.op is Ops.INDEX and len(index.src) == 3 and loop in index.src[2].toposort
             for index in node.toposort)
