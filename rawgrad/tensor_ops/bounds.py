"""Checks of index values against the size they index: tensor indexing, gather, scatter, index_select, embedding,
one_hot and the class labels of the losses. An out-of-range value raises IndexOutOfRange naming the value and the
size, as PyTorch raises, instead of silently selecting nothing.

Values the host has already (a tensor made from a list or an array, or one whose buffer the host can read without
waiting for the device) are checked at once. Other values exist only once the device has computed them, and waiting
for them at every op would stall it, so their check is deferred:

1. the op registers a lazy (min, max) of the index values beside its result (`pending`): one small reduction;
2. the next realize computes the pending checks in the same schedule as what it realizes, without waiting for them
   (`computed`);
3. the next host read (`numpy`, `tolist`, `item`, `Tensor.synchronize`), which waits for the device anyway, first
   realizes what is still pending, then reads the computed checks and raises for the first that failed.

So the path without errors costs one small reduction per check and no extra wait, and an error surfaces at the next
point where the program looks at values, as a device error would.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rawgrad.compiler.rangeify import buffer_base
from rawgrad.dtype import dtypes
from rawgrad.errors import IndexOutOfRange
from rawgrad.runtime.device import buffer_for


@dataclass(eq=False)
class DeferredCheck:
  extremes: Any   # a Tensor of two int64: the smallest index value bitwise inverted, and the largest
  low: int        # the values must lie in [low, high)
  high: int
  message: str    # names the op and the size; "{value}" is replaced by the offending value


_pending: list[DeferredCheck] = []
_computed: list[DeferredCheck] = []


def check_index_values(index: Any, low: int, high: int, message: str, ignored: int | None = None) -> None:
  """Raise IndexOutOfRange (now, or at the next host read) if a value of the integer tensor `index` other than
  `ignored` lies outside [low, high). `message` names the op and the size and holds "{value}"."""
  if not all(isinstance(size, int) for size in index.shape) or index.numel() == 0: return
  if (values := _host_values(index)) is not None:
    if ignored is not None: values = values[values != ignored]
    outside = values[(values < low) | (values >= high)]
    if outside.size: raise IndexOutOfRange(message.format(value=int(outside[0])))
    return
  if ignored is not None: index = (index == ignored).where(low, index)
  values = index.flatten().cast(dtypes.int64)
  # one reduction for both ends: max(~v) is ~min(v) (no overflow, unlike -v)
  extremes = values.bitwise_not().stack(values).max(1)
  _pending.append(DeferredCheck(extremes, low, high, message))


def _host_values(index: Any) -> np.ndarray | None:
  """The values of a tensor that is a plain view of a buffer, if the host can read them without waiting."""
  base = buffer_base(index.uop)
  return None if base is None else buffer_for(base).host_values()


def take_pending() -> list[DeferredCheck]:
  """The checks for the realize about to run to compute; if it fails, they are dropped with it."""
  checks = list(_pending)
  _pending.clear()
  return checks


def mark_computed(checks: list[DeferredCheck]) -> None:
  """`checks` were realized (their kernels launched), or run again by a jit replay: the next host read reads them."""
  _computed.extend(checks)


def computed_count() -> int:
  return len(_computed)


def computed_since(count: int) -> list[DeferredCheck]:
  """The checks computed after computed_count() returned `count` (a jit capture keeps them to read after replays)."""
  return _computed[count:]


def raise_failed_checks() -> None:
  """Read the computed checks (each read waits for the device: call this where the host waits anyway) and raise
  IndexOutOfRange for the first whose values were out of range; the checks after it are dropped with it, so an
  error is raised once."""
  checks = list(_computed)
  _computed.clear()
  for check in checks:
    inverted_smallest, largest = (int(v) for v in buffer_for(buffer_base(check.extremes.uop)).numpy())
    smallest = ~inverted_smallest
    if smallest < check.low: raise IndexOutOfRange(check.message.format(value=smallest))
    if largest >= check.high: raise IndexOutOfRange(check.message.format(value=largest))
