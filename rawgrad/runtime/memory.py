"""The memory planner: temporaries whose lifetimes do not overlap share storage in one arena."""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Sequence

from rawgrad.helpers import round_up

ALIGNMENT = 64


@dataclass(frozen=True)
class Placement:
  offset: int
  nbytes: int


def plan_arena(uses: list[list[object]], sizes: dict[object, int]) -> tuple[int, dict[object, Placement]]:
  """Place every buffer in `sizes` in one arena so that buffers live at the same time never overlap.

  uses[i] lists the buffers step i touches; a buffer lives from its first to its last step. Greedy best fit in
  order of first use: a block is free again after its buffer's last step. Returns the arena size and placements."""
  first, last = {}, {}
  for step, touched in enumerate(uses):
    for buffer in touched:
      if buffer not in sizes: continue
      first.setdefault(buffer, step)
      last[buffer] = step
  free: list[tuple[int, int]] = []  # (offset, nbytes) blocks, sorted by offset
  arena_end = 0
  placements: dict[object, Placement] = {}
  ending: dict[int, list[object]] = {}
  for buffer in sorted(first, key=lambda b: (first[b], -sizes[b])):
    for step in sorted(s for s in ending if s < first[buffer]):
      for done in ending.pop(step): release_range(free, placements[done].offset, placements[done].nbytes)
    nbytes = round_up(max(sizes[buffer], 1), ALIGNMENT)
    fits = [block for block in free if block[1] >= nbytes]
    if fits:
      offset, size = min(fits, key=lambda block: block[1])
      free.remove((offset, size))
      if size > nbytes: free = sorted(free + [(offset + nbytes, size - nbytes)])
    else:
      offset, arena_end = arena_end, arena_end + nbytes
    placements[buffer] = Placement(offset, nbytes)
    ending.setdefault(last[buffer], []).append(buffer)
  return arena_end, placements


def release_range(free: list[tuple[int, int]], offset: int, nbytes: int) -> None:
  """Put the block back into `free` ((offset, nbytes) blocks sorted by offset), merged with free neighbours."""
  i = bisect.bisect(free, (offset, 0))
  free.insert(i, (offset, nbytes))
  if i + 1 < len(free) and offset + nbytes == free[i + 1][0]: free[i:i + 2] = [(offset, nbytes + free[i + 1][1])]
  if i > 0 and free[i - 1][0] + free[i - 1][1] == free[i][0]:
    free[i - 1:i + 1] = [(free[i - 1][0], free[i - 1][1] + free[i][1])]


def order_for_memory(uses: list[list[object]], writes: list[Sequence[object]], sizes: dict[object, int]) -> list[int]:
  """An order of the steps that keeps the buffers in `sizes` alive for less time, respecting every dependency.

  Step i reads uses[i] and writes writes[i] (a kernel with several outputs writes several); a step runs after the
  last earlier writer of what it touches, and a writer after the earlier readers of what it overwrites, so every
  step sees the same values as in the given order. Greedy: among the ready steps, run the one that allocates the
  fewest and frees the most bytes of `sizes` (ties: the earliest in the given order)."""
  count = len(uses)
  deps: list[set[int]] = [set() for _ in range(count)]
  last_writer: dict[object, int] = {}
  readers: dict[object, list[int]] = {}
  remaining: dict[object, int] = {}
  for step in range(count):
    touched, written = set(uses[step]), writes[step]
    deps[step].update(last_writer[b] for b in touched if b in last_writer)
    for buffer in written: deps[step].update(readers.pop(buffer, []))
    for buffer in touched:
      if not any(buffer is w for w in written): readers.setdefault(buffer, []).append(step)
      if buffer in sizes: remaining[buffer] = remaining.get(buffer, 0) + 1
    for buffer in written: last_writer[buffer] = step
    deps[step].discard(step)
  children: list[list[int]] = [[] for _ in range(count)]
  for step, before in enumerate(deps):
    for parent in before: children[parent].append(step)
  waiting = [len(before) for before in deps]
  ready = [step for step in range(count) if not waiting[step]]
  live: set[object] = set()
  order: list[int] = []
  def score(step: int) -> tuple[int, int]:
    planned = {b for b in uses[step] if b in sizes}
    return (sum(sizes[b] for b in planned if b not in live) - sum(sizes[b] for b in planned if remaining[b] == 1), step)
  while ready:
    step = min(ready, key=score)
    ready.remove(step)
    order.append(step)
    for buffer in {b for b in uses[step] if b in sizes}:
      live.add(buffer)
      remaining[buffer] -= 1
      if not remaining[buffer]: live.discard(buffer)
    for child in children[step]:
      waiting[child] -= 1
      if not waiting[child]: ready.append(child)
  if len(order) != count: raise RuntimeError("order_for_memory: the dependencies have a cycle")
  return order
