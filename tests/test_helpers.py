"""rawgrad/helpers.py: environment and context variables, small arithmetic, the LRU cache, the global counters."""
import itertools

import pytest

from rawgrad.compiler.ir import UOp
from rawgrad.compiler.symbolic import evaluate
from rawgrad.dtype import dtypes
from rawgrad.helpers import (DEBUG, Context, ContextVar, GlobalCounters, LRUCache, all_same, ceildiv, getenv, prod,
                             round_up, unique_id)


def test_getenv_converts_to_the_type_of_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setenv("RAWGRAD_TEST_NUMBER", "42")
  monkeypatch.setenv("RAWGRAD_TEST_TEXT", "avx2")
  getenv.cache_clear()
  try:
    assert getenv("RAWGRAD_TEST_NUMBER") == 42 and getenv("RAWGRAD_TEST_TEXT", "native") == "avx2"
    assert getenv("RAWGRAD_TEST_UNSET", 7) == 7 and getenv("RAWGRAD_TEST_UNSET", "x") == "x"
  finally:
    getenv.cache_clear()


def test_context_sets_and_restores() -> None:
  before = DEBUG.value
  with Context(DEBUG=3):
    assert DEBUG.value == 3 and DEBUG >= 3 and DEBUG > 2 and DEBUG < 4 and DEBUG <= 3 and bool(DEBUG)
    with Context(DEBUG=0):
      assert not DEBUG
    assert DEBUG.value == 3
  assert DEBUG.value == before


def test_context_restores_after_an_error() -> None:
  before = DEBUG.value
  with pytest.raises(ZeroDivisionError), Context(DEBUG=5):
    _ = 1 / 0
  assert DEBUG.value == before


def test_context_names_unknown_variables() -> None:
  with pytest.raises(KeyError, match="unknown context variables \\['NOT_A_SETTING'\\]"), Context(NOT_A_SETTING=1):
    pass


def test_a_context_variable_is_defined_once() -> None:
  with pytest.raises(RuntimeError, match="context variable DEBUG is defined twice"): ContextVar("DEBUG", 0)
  assert repr(DEBUG) == f"DEBUG={DEBUG.value}"


def test_prod_of_ints_and_of_symbolic_sizes() -> None:
  assert prod([2, 3, 4]) == 24 and prod([]) == 1 and prod([], start=5) == 5
  n = UOp.variable("n", 1, 10)
  size = prod([n, 3])
  assert isinstance(size, UOp) and size.dtype == dtypes.index
  assert evaluate(size, {n: 4}) == 12


def test_small_arithmetic() -> None:
  assert [ceildiv(n, 4) for n in range(9)] == [0, 1, 1, 1, 1, 2, 2, 2, 2]
  assert [round_up(n, 8) for n in (0, 1, 8, 9, 16)] == [0, 8, 8, 16, 16]
  assert all_same([3, 3, 3]) and all_same([]) and not all_same([1, 2])


def test_unique_ids_never_repeat() -> None:
  ids = [unique_id() for _ in range(100)]
  assert len(set(ids)) == 100 and ids == sorted(ids)


def test_lru_cache_drops_the_least_recently_used() -> None:
  cache: LRUCache[str, int] = LRUCache(2)
  assert cache.put("a", 1) == 1
  cache.put("b", 2)
  assert cache.get("a") == 1  # now "b" is the least recently used
  cache.put("c", 3)
  assert "b" not in cache and cache.get("b") is None
  assert cache.get("a") == 1 and cache.get("c") == 3 and len(cache) == 2
  cache.put("a", 10)  # overwriting refreshes too
  cache.put("d", 4)
  assert list(cache.entries) == ["a", "d"] and cache.get("a") == 10


def test_lru_cache_stays_within_its_limit() -> None:
  cache: LRUCache[int, int] = LRUCache(5)
  for key, value in zip(range(100), itertools.count()): cache.put(key, value)
  assert len(cache) == 5 and sorted(cache.entries) == [95, 96, 97, 98, 99]
  with pytest.raises(ValueError, match="limit of at least 1 entry, got 0"): LRUCache(0)


def test_global_counters_track_memory_and_reset() -> None:
  GlobalCounters.reset()
  used = GlobalCounters.mem_used
  GlobalCounters.track_memory(1000)
  GlobalCounters.track_memory(-600)
  assert GlobalCounters.mem_used == used + 400 and GlobalCounters.mem_peak == used + 1000
  GlobalCounters.kernel_count += 3
  GlobalCounters.reset()
  assert GlobalCounters.kernel_count == 0 and GlobalCounters.global_ops == 0 and GlobalCounters.time_sum_s == 0.0
  assert GlobalCounters.mem_peak == GlobalCounters.mem_used == used + 400
  GlobalCounters.track_memory(-400)


def test_weak_identity_set_holds_by_identity_and_not_alive() -> None:
  import gc
  from rawgrad.helpers import WeakIdentitySet

  class Equal:  # == builds something else (as Tensor's does): the set must never call it
    def __eq__(self, other: object) -> bool: raise AssertionError("compared with ==")
    __hash__ = object.__hash__
  members = WeakIdentitySet[Equal]()
  a, b = Equal(), Equal()
  members.add(a), members.add(b), members.add(a)
  assert len(members) == 2 and {id(m) for m in members} == {id(a), id(b)}
  members.discard(a)
  assert list(map(id, members)) == [id(b)]
  del b
  gc.collect()
  assert len(members) == 0 and list(members) == []



def test_weak_identity_set_move_carries_the_member_and_forgets_it_where_it_went() -> None:
  import gc
  from rawgrad.helpers import WeakIdentitySet

  class Member:
    pass
  first, second = WeakIdentitySet[Member](), WeakIdentitySet[Member]()
  a, b = Member(), Member()
  first.add(a)
  first.move(a, second)
  first.move(b, second)  # not in first: added to second
  assert len(first) == 0 and {id(m) for m in second} == {id(a), id(b)}
  second.move(a, first)
  assert list(map(id, first)) == [id(a)] and list(map(id, second)) == [id(b)]
  del a
  gc.collect()
  assert len(first) == 0 and list(map(id, second)) == [id(b)]
  del b
  gc.collect()
  assert len(second) == 0


def test_cached_property_computes_once_per_instance_and_keeps_its_value_in_the_instance() -> None:
  from rawgrad.helpers import cached_property

  class Node:
    def __init__(self, value: int):
      self.value, self.calls = value, 0

    @cached_property
    def doubled(self) -> int:
      """Twice the value."""
      self.calls += 1
      return self.value * 2
  a, b = Node(3), Node(5)
  assert (a.doubled, a.doubled, b.doubled) == (6, 6, 10) and (a.calls, b.calls) == (1, 1)
  assert a.__dict__["doubled"] == 6 and isinstance(Node.doubled, cached_property)
  assert Node.doubled.__doc__ == "Twice the value."
