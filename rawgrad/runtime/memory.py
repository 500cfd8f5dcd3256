"""The memory planner: temporaries whose lifetimes do not overlap share storage in one arena."""
from __future__ import annotations

from dataclasses import dataclass

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
      for done in ending.pop(step): free = _release(free, placements[done])
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


def _release(free: list[tuple[int, int]], placement: Placement) -> list[tuple[int, int]]:
  """Return a block to the free list, merging it with free neighbours."""
  blocks = sorted(free + [(placement.offset, placement.nbytes)])
  merged: list[tuple[int, int]] = []
  for offset, size in blocks:
    if merged and merged[-1][0] + merged[-1][1] == offset: merged[-1] = (merged[-1][0], merged[-1][1] + size)
    else: merged.append((offset, size))
  return merged
