"""The memory planner never lets two buffers that are live at the same time overlap."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rawgrad import GlobalCounters, Tensor
from rawgrad.runtime.memory import ALIGNMENT, order_for_memory, plan_arena, release_range


@st.composite
def schedules(draw: st.DrawFn) -> tuple[list[list[int]], dict[int, int]]:
  count = draw(st.integers(1, 12))
  sizes = {b: draw(st.integers(0, 5000)) for b in range(count)}
  steps = draw(st.integers(1, 15))
  uses = [draw(st.lists(st.integers(0, count + 2), max_size=4)) for _ in range(steps)]  # ids >= count: not planned
  return uses, sizes


@settings(max_examples=300, deadline=None)
@given(schedules())
def test_live_buffers_never_overlap(case: tuple[list[list[int]], dict[int, int]]) -> None:
  uses, sizes = case
  arena, placements = plan_arena(uses, sizes)
  first, last = {}, {}
  for step, touched in enumerate(uses):
    for b in touched:
      if b in sizes: first.setdefault(b, step); last[b] = step
  assert set(placements) == set(first)
  for b, place in placements.items():
    assert place.offset % ALIGNMENT == 0 and place.nbytes >= sizes[b] and place.offset + place.nbytes <= arena
  for a in placements:
    for b in placements:
      if a >= b: continue
      live_together = not (last[a] < first[b] or last[b] < first[a])
      disjoint = placements[a].offset + placements[a].nbytes <= placements[b].offset or \
        placements[b].offset + placements[b].nbytes <= placements[a].offset
      assert disjoint or not live_together, (a, b, placements[a], placements[b])


def test_reuse_makes_the_arena_smaller_than_the_sum() -> None:
  uses = [["a"], ["a", "b"], ["b", "c"], ["c"]]
  arena, placements = plan_arena(uses, {"a": 1000, "b": 1000, "c": 1000})
  assert placements["a"].offset == placements["c"].offset  # a is dead before c is born
  assert arena == 2 * 1024


def test_planned_schedule_computes_the_same_values() -> None:
  rng = np.random.default_rng(1)
  x = rng.standard_normal((32, 32)).astype(np.float32)
  t = Tensor(x)
  out = t.softmax(1).softmax(0).sum(1).softmax(0)
  ref = np.exp(x - x.max(1, keepdims=True)); ref /= ref.sum(1, keepdims=True)
  ref = np.exp(ref - ref.max(0, keepdims=True)); ref /= ref.sum(0, keepdims=True)
  ref = ref.sum(1); ref = np.exp(ref - ref.max()); ref /= ref.sum()
  GlobalCounters.reset()
  np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5)
  assert GlobalCounters.kernel_count >= 5
  assert GlobalCounters.mem_peak > 0


@settings(max_examples=300, deadline=None)
@given(schedules(), st.data())
def test_reordering_keeps_every_dependency(case: tuple[list[list[int]], dict[int, int]], data: st.DataObject) -> None:
  uses, sizes = case
  writes = [data.draw(st.lists(st.sampled_from(touched), max_size=2, unique=True)) if touched else []
            for touched in uses]
  order = order_for_memory(uses, writes, sizes)
  assert sorted(order) == list(range(len(uses)))
  position = {step: index for index, step in enumerate(order)}
  for later in range(len(uses)):
    for earlier in range(later):
      conflict = any(w in uses[later] for w in writes[earlier]) or any(w in uses[earlier] for w in writes[later])
      if conflict: assert position[earlier] < position[later], (earlier, later, order)


def test_reordering_shortens_lifetimes() -> None:
  # steps 0 and 1 each make a big buffer; step 2 consumes a and step 3 consumes b: running 2 before 1 means a and b
  # are never alive together
  uses = [["a"], ["b"], ["a", "out_a"], ["b", "out_b"]]
  writes = [["a"], ["b"], ["out_a"], ["out_b"]]
  sizes = {"a": 1024, "b": 1024}
  order = order_for_memory(uses, writes, sizes)
  assert order == [0, 2, 1, 3]
  assert plan_arena([uses[i] for i in order], sizes)[0] == 1024 < plan_arena(uses, sizes)[0]


@given(st.lists(st.integers(1, 5), min_size=1, max_size=30), st.randoms(use_true_random=False))
@settings(max_examples=200, deadline=None)
def test_released_ranges_stay_sorted_and_merged(sizes: list[int], rng) -> None:
  # blocks laid end to end, released in a random order: the free list is always sorted, without touching
  # neighbours, and covers exactly what was released; at the end it is one block
  offsets = [sum(sizes[:i]) for i in range(len(sizes))]
  order = list(range(len(sizes)))
  rng.shuffle(order)
  free: list[tuple[int, int]] = []
  released: set[int] = set()
  for i in order:
    release_range(free, offsets[i], sizes[i])
    released.update(range(offsets[i], offsets[i] + sizes[i]))
    assert free == sorted(free)
    assert all(a + n < b for (a, n), (b, _) in zip(free, free[1:]))
    assert {byte for offset, n in free for byte in range(offset, offset + n)} == released
  assert free == [(0, sum(sizes))]
