"""Hardware command queues (HCQ): the one interface every device is driven through.

A queue records commands — `exec` a program with its kernel-argument block and launch size, `copy`, `signal` a
timeline value, `wait` for one, `timestamp` — and `submit`s them to the device in one go. Signals are 64-bit
timeline values in memory both host and device see; the host waits by polling, with a timeout and a clear error.

A device implements `HCQDevice`: how a queue's commands are encoded (native words on the CPU; GPFIFO entries and
QMDs on NVIDIA; AQL packets and PM4 on AMD) and how they reach the device. Commands are recorded device-neutrally
first, so a prebuilt queue (a jit capture) can be encoded once and its kernel-argument blocks patched in place.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


class HCQSignal:
  """A timeline signal: a 64-bit value the device sets, plus the device time when it was set."""

  @property
  def value(self) -> int:
    raise NotImplementedError

  @property
  def timestamp_ns(self) -> int:
    raise NotImplementedError

  def wait(self, value: int, timeout_s: float = 30.0) -> None:
    """Return once the signal reached value; raise TimeoutError (naming both values) instead of hanging."""
    raise NotImplementedError


@dataclass(frozen=True)
class Command:
  kind: str        # "exec", "copy", "signal", "wait", "timestamp"
  operands: tuple


@dataclass
class HWQueue:
  """Commands recorded in order; encoded and submitted by the device. Methods chain: q.exec(...).signal(...)."""
  commands: list[Command] = field(default_factory=list)

  def exec(self, program: Any, kernargs: np.ndarray, cores: int = 1) -> HWQueue:
    """Run `program` over its argument block; `cores` slices of its parallel loop (1 for serial kernels)."""
    self.commands.append(Command("exec", (program, kernargs, cores)))
    return self

  def copy(self, dest: int, src: int, nbytes: int) -> HWQueue:
    self.commands.append(Command("copy", (dest, src, nbytes)))
    return self

  def signal(self, signal: HCQSignal, value: int) -> HWQueue:
    self.commands.append(Command("signal", (signal, value)))
    return self

  def wait(self, signal: HCQSignal, value: int) -> HWQueue:
    self.commands.append(Command("wait", (signal, value)))
    return self

  def timestamp(self, slots: np.ndarray, index: int) -> HWQueue:
    """Write the device clock (ns) into slots[index] (a uint64 array) when the queue reaches this point."""
    self.commands.append(Command("timestamp", (slots, index)))
    return self

  def submit(self, device: HCQDevice) -> Any:
    return device.submit(device.encode(self))


class HCQDevice:
  """What a device provides to run queues: a timeline signal, encoding and submission."""
  timeline_signal: HCQSignal
  timeline_value: int

  def next_timeline_value(self) -> int:
    self.timeline_value += 1
    return self.timeline_value

  def encode(self, queue: HWQueue) -> Any:
    raise NotImplementedError

  def submit(self, encoded: Any) -> Any:
    raise NotImplementedError

  def synchronize(self, timeout_s: float = 30.0) -> None:
    self.timeline_signal.wait(self.timeline_value, timeout_s)


def timestamp_slots(count: int) -> np.ndarray:
  """Zeroed, 8-byte aligned uint64 slots for timestamps."""
  return np.zeros(count, dtype=np.uint64)
