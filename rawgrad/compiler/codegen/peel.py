"""Peel the last iteration off output loops whose gates hold on every other iteration.

A split whose amount does not divide the size (`r -> outer*amount + inner`, amount 12 on a size of 1024) gates every
access that depends on `r` with `outer*amount + inner < size`. Inside a matmul's reduction that gate is tested on
every load, and the loads become masked. It only ever fails on the last iteration of `outer`, so `peel_remainders`
writes each such store twice: once over `outer` in [0, n-1), where the gates simplify away, and once for
`outer = n-1` alone, where they are constants. After it, a kernel's SINK may hold stores over different output loops;
the linearizer runs each store in its own loop nest, sharing the loops they have in common. A parallel loop's peeled
iteration runs in the last slice of the launch only.
"""
from __future__ import annotations

from rawgrad.compiler.codegen.opt.kernel import LOOP, PARALLEL, all_ranges, range_kind, simplify_addresses
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
  stores: list[UOp] = []
  for store in ast.src:
    if loop not in store.toposort:
      stores.append(store)
      continue
    main = simplify_addresses(substitute(store, {loop: shorter}))
    if gated_by(main, shorter): return None
    stores += [main, simplify_addresses(substitute(store, {loop: UOp.const(loop.dtype, last)}))]
  return tuple(stores)


def gated_by(node: UOp, loop: UOp) -> bool:
  """Some access under `node` is gated on the loop."""
  return any(index.op is Ops.INDEX and len(index.src) == 3 and loop in index.src[2].toposort
             for index in node.toposort)
