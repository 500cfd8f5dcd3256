"""Environment/context variables and small utilities shared by every part of rawgrad."""
from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import os
import weakref
from collections import OrderedDict
from typing import Any, Callable, Generic, Hashable, Iterable, Iterator, TypeVar, overload

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@functools.cache
def getenv(key: str, default: Any = 0) -> Any:
  """An environment variable converted to the type of `default`."""
  return type(default)(os.getenv(key, default))


class ContextVar:
  """A setting read from the environment once, changeable in code with `Context(NAME=value)`."""
  registry: dict[str, ContextVar] = {}

  def __init__(self, key: str, default: int):
    if key in ContextVar.registry: raise RuntimeError(f"context variable {key} is defined twice")
    self.key, self.value = key, getenv(key, default)
    ContextVar.registry[key] = self

  def __bool__(self) -> bool:
    return bool(self.value)

  def __ge__(self, other: int) -> bool:
    return self.value >= other

  def __gt__(self, other: int) -> bool:
    return self.value > other

  def __lt__(self, other: int) -> bool:
    return self.value < other

  def __le__(self, other: int) -> bool:
    return self.value <= other

  def __repr__(self) -> str:
    return f"{self.key}={self.value}"


@contextlib.contextmanager
def Context(**settings: int) -> Iterator[None]:
  """Temporarily change context variables: `with Context(DEBUG=2): ...`."""
  unknown = [key for key in settings if key not in ContextVar.registry]
  if unknown: raise KeyError(f"unknown context variables {unknown}; known: {sorted(ContextVar.registry)}")
  saved = {key: ContextVar.registry[key].value for key in settings}
  for key, value in settings.items(): ContextVar.registry[key].value = value
  try:
    yield
  finally:
    for key, value in saved.items(): ContextVar.registry[key].value = value


DEBUG = ContextVar("DEBUG", 0)
SPEC = ContextVar("SPEC", 0)
TRACK_REWRITES = ContextVar("TRACK_REWRITES", 0)
PROFILE = ContextVar("PROFILE", 0)


def prod(values: Iterable[T], start: Any = 1) -> Any:
  """The product of values; works for ints and symbolic sizes alike."""
  result = start
  for value in values: result = result * value
  return result


def all_same(items: Iterable[Any]) -> bool:
  items = list(items)
  return all(item == items[0] for item in items)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
  """Python's cyclic garbage collector held off for a burst of allocation: scheduling and lowering a step build and
  drop hundreds of thousands of graph nodes, and the collections that set off (each full one walking every object
  alive) were a tenth of MNIST's first step. What became garbage meanwhile is collected after, as usual."""
  if not gc.isenabled():
    yield
    return
  gc.disable()
  try: yield
  finally: gc.enable()


def usable_cores() -> int:
  """The cores this process may run on."""
  return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cpu_threads() -> int:
  """The threads the CPU runtime runs kernels on: CPU_THREADS from the environment, else the usable cores."""
  if (text := os.environ.get("CPU_THREADS", "")) != "":
    if not text.isdigit() or int(text) < 1:
      raise ValueError(f"CPU_THREADS must be a positive integer, not {text!r}")
    return int(text)
  return usable_cores()


def ceildiv(num: int, amount: int) -> int:
  return -(-num // amount)


def round_up(num: int, multiple: int) -> int:
  return ceildiv(num, multiple) * multiple


_unique_ids = itertools.count()


def unique_id() -> int:
  """A number never handed out before in this process (names fresh buffers)."""
  return next(_unique_ids)


class LRUCache(Generic[K, V]):
  """A cache that keeps its `limit` most recently used entries: reading or writing an entry makes it the most recent,
  and an entry beyond the limit drops the least recent one. Values are never None (None means "not cached")."""

  def __init__(self, limit: int):
    if limit < 1: raise ValueError(f"an LRU cache needs a limit of at least 1 entry, got {limit}")
    self.limit = limit
    self.entries: OrderedDict[K, V] = OrderedDict()

  def __len__(self) -> int:
    return len(self.entries)

  def __contains__(self, key: K) -> bool:
    return key in self.entries

  def get(self, key: K) -> V | None:
    """The value for `key`, or None when it is not cached."""
    value = self.entries.get(key)
    if value is not None: self.entries.move_to_end(key)
    return value

  def put(self, key: K, value: V) -> V:
    """Remember `value` for `key`; returns it."""
    self.entries[key] = value
    self.entries.move_to_end(key)
    if len(self.entries) > self.limit: self.entries.popitem(last=False)
    return value


class cached_property(Generic[T, V]):
  """functools.cached_property without its lock: before Python 3.12 it takes a lock on every first access, which
  costs more than most of the values it caches (a node's shape, device, toposort, built on every operation). The
  value goes into the instance's __dict__, where later lookups find it before this descriptor."""

  def __init__(self, function: Callable[[T], V]):
    self.function, self.name, self.__doc__ = function, function.__name__, function.__doc__

  def __set_name__(self, owner: type, name: str) -> None:
    self.name = name

  @overload
  def __get__(self, instance: None, owner: type | None = None) -> cached_property[T, V]: ...
  @overload
  def __get__(self, instance: T, owner: type | None = None) -> V: ...
  def __get__(self, instance: T | None, owner: type | None = None) -> V | cached_property[T, V]:
    if instance is None: return self
    value = instance.__dict__[self.name] = self.function(instance)
    return value


class WeakIdentitySet(Generic[T]):
  """A set of live objects, by identity, that does not keep them alive. (weakref.WeakSet compares members with ==,
  which a Tensor overloads to build a graph.) A member moves to another set with its weak reference."""

  def __init__(self) -> None:
    self.refs: dict[int, _MemberReference] = {}

  def add(self, item: T) -> None:
    if (key := id(item)) in self.refs: return
    ref = self.refs[key] = _MemberReference(item, _forget_member)
    ref.key, ref.owner = key, self

  def discard(self, item: T) -> None:
    self.refs.pop(id(item), None)

  def move(self, item: T, to: WeakIdentitySet[T]) -> None:
    """Take `item` out of this set into `to` (where it is not in this set, add it to `to`)."""
    if (ref := self.refs.pop(id(item), None)) is None: return to.add(item)
    if ref.key in to.refs: return
    ref.owner = to
    to.refs[ref.key] = ref

  def __iter__(self) -> Iterator[T]:
    return (item for ref in list(self.refs.values()) if (item := ref()) is not None)

  def __len__(self) -> int:
    return len(self.refs)


class _MemberReference(weakref.ref):
  """A weak reference to a member of a WeakIdentitySet, carrying its key and the set that holds it now."""
  __slots__ = ("key", "owner")


def _forget_member(ref: _MemberReference) -> None:
  if ref.owner.refs.get(ref.key) is ref: del ref.owner.refs[ref.key]  # the id may name a newer object by now


class GlobalCounters:
  """Totals since the last reset(): kernels launched, kernels built (lowered, compiled or read from the disk cache,
  and loaded), ALU operations, bytes moved, kernel time; and the bytes of device memory held by buffers now
  (mem_used) and at most since the reset (mem_peak)."""
  kernel_count = 0
  kernels_built = 0
  global_ops = 0
  global_mem = 0
  time_sum_s = 0.0
  mem_used = 0
  mem_peak = 0

  @staticmethod
  def reset() -> None:
    GlobalCounters.kernel_count, GlobalCounters.global_ops, GlobalCounters.global_mem = 0, 0, 0
    GlobalCounters.kernels_built = 0
    GlobalCounters.time_sum_s = 0.0
    GlobalCounters.mem_peak = GlobalCounters.mem_used

  @staticmethod
  def track_memory(delta: int) -> None:
    GlobalCounters.mem_used += delta
    GlobalCounters.mem_peak = max(GlobalCounters.mem_peak, GlobalCounters.mem_used)
