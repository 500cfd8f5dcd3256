"""Capture and replay: the kernels and copies a step launches, recorded once and replayed as prebuilt queues.

While a `Capture` is active, run_schedule records every launch (runner, buffers, variable values) and every copy.
A `CommandGraph` turns the recorded items into one prebuilt queue per device and engine: every kernel's argument
block lives in device-visible memory of its own, so a replay patches input addresses and variable values in place
and submits the same encoded queues again. Copies within a device are copy-engine commands of the graph; copies
between devices go through the host at their place in the order.

The tensor-level `jit` decorator (rawgrad/tensor_jit.py) decides what is captured and what an input is.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rawgrad.compiler.ir import UOp
from rawgrad.engine.runner import ArgumentTable, copy_buffer
from rawgrad.helpers import PROFILE, GlobalCounters
from rawgrad.runtime.device import Buffer, Device, _buffers
from rawgrad.runtime.hcq import COMPUTE, COPY, HWQueue
from rawgrad.runtime.memory import order_for_memory, plan_arena
from rawgrad.runtime.profile import KernelEvent, record_kernel


class JitError(RuntimeError):
  pass


@dataclass
class CapturedKernel:
  runner: Any                       # engine.realize.CompiledRunner
  buffers: list[Buffer]
  var_values: dict[UOp, int]
  dims: tuple = ()
  operations: tuple[str, ...] = ()
  outputs: int = 1                  # how many of the buffers (the first) the kernel writes


@dataclass
class CapturedCopy:
  dest: Buffer
  src: Buffer

  @property
  def buffers(self) -> list[Buffer]:
    return [self.dest, self.src]

  @buffers.setter
  def buffers(self, new: list[Buffer]) -> None:
    self.dest, self.src = new


@dataclass
class Capture:
  items: list[CapturedKernel | CapturedCopy] = field(default_factory=list)

  @property
  def kernels(self) -> list[CapturedKernel]:
    return [item for item in self.items if isinstance(item, CapturedKernel)]


_capturing: list[Capture] = []


def capturing() -> Capture | None:
  return _capturing[-1] if _capturing else None


def start_capture() -> Capture:
  capture = Capture()
  _capturing.append(capture)
  return capture


def stop_capture() -> None:
  _capturing.pop()


def refuse_host_read(what: str) -> None:
  """Called by host reads (numpy(), item(), tolist()): inside a capture the replay would skip them."""
  if _capturing:
    raise JitError(f"{what} inside a jit-captured function: replay would skip this host read and return stale "
                   "values; return the tensor from the function and read it outside")


def replan_temporaries(items: list[Any], protected: set[int]) -> list[Any]:
  """Re-plan the capture's temporaries (arena views that no input, output or live tensor holds: `protected` are the
  ids of the buffers that are held) across the whole item list: reorder the items (dependencies kept, so replay
  computes the same bits) to shorten the temporaries' lifetimes, pack them by lifetime into one arena per device,
  and drop the arenas they lived in before (each schedule planned its own, by its own order). Kept as captured when
  that would not use fewer bytes."""
  from rawgrad.dtype import dtypes
  views: dict[int, Buffer] = {id(b): b for item in items for b in item.buffers if b.base is not None}
  bases: dict[int, Buffer] = {id(b.base): b.base for b in views.values()}
  # an arena is re-planned only if nothing outside the capture's temporaries still holds one of its views
  shared = {id(b.base) for b in views.values() if id(b) in protected or b.base.base is not None}
  internal = [b for b in views.values() if id(b.base) not in shared]
  if len(internal) < 2: return items
  sizes: dict[object, int] = {b: b.nbytes for b in internal}
  uses = [list(item.buffers) for item in items]
  # reordering is only safe when every arena view is re-placed: views of a kept arena may share bytes, and their
  # placements were only checked for the order the items were captured in
  if shared: order = list(range(len(items)))
  else: order = order_for_memory(uses, [_written(item) for item in items], sizes)
  new_items = [items[i] for i in order]
  old_bytes = sum(bases[i].nbytes for i in {id(b.base) for b in internal})
  new_views: dict[int, Buffer] = {}
  new_bytes = 0
  for device in sorted({b.device for b in internal}):
    on_device = {b: n for b, n in sizes.items() if b.device == device}  # type: ignore[attr-defined]
    arena_bytes, placements = plan_arena([list(item.buffers) for item in new_items], on_device)
    new_bytes += arena_bytes
    arena = Buffer(device, arena_bytes, dtypes.uint8)
    for old, placement in placements.items():
      new_views[id(old)] = Buffer(device, old.size, old.dtype, base=arena, offset=placement.offset)  # type: ignore
  if new_bytes >= old_bytes: return items
  for item in new_items: item.buffers = [new_views.get(id(b), b) for b in item.buffers]
  for node, buffer in list(_buffers.items()):
    if id(buffer) in new_views: _buffers[node] = new_views[id(buffer)]
  return new_items


def _written(item: Any) -> list[Buffer]:
  if isinstance(item, CapturedCopy): return [item.dest]
  return item.buffers[:item.outputs]


@dataclass
class _Segment:
  """Consecutive items of one device and engine, as one prebuilt queue; or one copy between devices."""
  device: str
  engine: str
  items: list[int]
  encoded: Any = None


_UNFINISHED: list[Any] = []  # the memory of graphs whose devices did not finish their last replay: never freed


def _release_after_runs(last_run: dict[str, int], memory: Any) -> None:
  """Wait until every device has run a dropped graph's last replay, so its memory can go."""
  try:
    for device, value in last_run.items(): Device[device].synchronize_after(value)
  except Exception:  # a faulted or stuck device may still read the memory: keep it
    _UNFINISHED.append(memory)


class CommandGraph:
  """A capture as prebuilt queues: every kernel's EXEC over its own argument block, copies on the copy engine.
  Replays patch the argument blocks in place (new input addresses, new variable values) and submit again. A kernel
  past its target's argument limit has an argument table of its own in device memory, written when the graph is
  built; a replay that patched one of its words copies it again before submitting."""

  def __init__(self, items: list[Any]):
    self.items = items
    self.kernargs: dict[int, np.ndarray] = {}   # item -> its argument words (uint64 view of device-visible memory,
                                                # or of its argument table's words)
    self.tables: dict[int, ArgumentTable] = {}  # item -> its argument table, for programs that have one
    self.times: dict[int, Any] = {}             # item -> its two timestamp slots, with PROFILE
    self.dims: dict[int, Any] = {}              # item -> the launch size encoded
    self._memory: list[Any] = []                # keeps the argument blocks alive
    self.last_run: dict[str, int] = {}         # device -> the timeline value that ends the last replay there
    # dropped while its last replay still runs (the jit function collected, a program exiting), the graph's argument
    # blocks are freed only after the devices are past it: a kernel read its arguments from freed memory
    weakref.finalize(self, _release_after_runs, self.last_run, (self._memory, self.times))
    self.segments = self._segments()
    for segment in self.segments:
      if segment.engine != "host": segment.encoded = self._encode(segment)
    self.costs = {i: item.runner.cost(item.var_values) for i, item in enumerate(items)
                  if isinstance(item, CapturedKernel)}

  def _segments(self) -> list[_Segment]:
    segments: list[_Segment] = []
    for index, item in enumerate(self.items):
      if isinstance(item, CapturedCopy) and item.dest.device != item.src.device:
        segments.append(_Segment(item.dest.device, "host", [index]))
        continue
      device = item.runner.device if isinstance(item, CapturedKernel) else item.dest.device
      engine = COMPUTE if isinstance(item, CapturedKernel) else COPY
      if segments and segments[-1].device == device and segments[-1].engine == engine:
        segments[-1].items.append(index)
      else:
        segments.append(_Segment(device, engine, [index]))
    return segments

  def _encode(self, segment: _Segment) -> Any:
    device = Device[segment.device]
    queue = HWQueue()
    for index in segment.items:
      item = self.items[index]
      if isinstance(item, CapturedCopy):
        queue.copy(item.dest.address, item.src.address, item.src.nbytes)
        continue
      args = item.runner.args(item.buffers, item.var_values)
      if item.runner.has_table:
        # written once here; a replay copies it again only if a patch changed a word
        table = self.tables[index] = ArgumentTable(segment.device, len(args))
        table.write(args)
        self.kernargs[index] = table.words
        args = [table.address]
      memory = device.argument_block(len(args), persistent=True)
      self._memory.append(memory)
      block = memory.host.view(np.uint64)
      block[:len(args)] = [arg & (2**64 - 1) for arg in args]
      if not item.runner.has_table: self.kernargs[index] = block
      global_size, local_size = self.dims[index] = item.runner.launch_dims(item.var_values)
      if PROFILE:
        self.times[index] = times = device.host_memory(2 * device.timestamp_bytes)
        queue.timestamp(times.address)
      queue.exec(item.runner.kernel, memory.address, global_size, local_size)
      if PROFILE: queue.timestamp(times.address + device.timestamp_bytes)
    return device.encode(queue, segment.engine)

  def wait_for_last_run(self) -> None:
    """The argument blocks are patched in place: the last replay must have read them first."""
    for device, value in self.last_run.items(): Device[device].synchronize_after(value)

  def patch_buffer(self, index: int, position: int, buffer: Buffer) -> None:
    item = self.items[index]
    if isinstance(item, CapturedCopy):
      if item.dest.device == item.src.device:
        raise JitError("jit: an input is copied within its device inside the function; replay cannot swap it")
      buffers = item.buffers
      buffers[position] = buffer
      item.buffers = buffers  # a copy between devices runs through the host: it reads the item at replay
      return
    if position in item.runner.buffer_slots:
      self.kernargs[index][item.runner.buffer_slots.index(position)] = buffer.address

  def patch_variable(self, index: int, variable: UOp, value: int) -> None:
    item = self.items[index]
    runner = item.runner
    if variable in runner.variables:
      self.kernargs[index][len(runner.buffer_slots) + runner.variables.index(variable)] = value & (2**64 - 1)
    if runner.launch_dims(item.var_values) != self.dims[index]:
      raise JitError(f"jit: variable {variable.arg[0]}={value} changes the launch size of {runner.name}, which a "
                     "captured queue cannot change")
    self.costs[index] = runner.cost(item.var_values)

  def run(self) -> None:
    for table in self.tables.values(): table.write()
    for segment in self.segments:
      if segment.engine == "host":
        item = self.items[segment.items[0]]
        copy_buffer(item.dest, item.src)
      else:
        self.last_run[segment.device] = Device[segment.device].submit_encoded(segment.encoded, segment.engine)
    GlobalCounters.kernel_count += len(self.costs)
    GlobalCounters.global_ops += sum(cost.flops for cost in self.costs.values())
    GlobalCounters.global_mem += sum(cost.bytes_moved for cost in self.costs.values())
    if self.times: self._record_profile()

  def _record_profile(self) -> None:
    for index, times in self.times.items():
      item = self.items[index]
      device = Device[item.runner.device]
      device.synchronize()
      start, end = device.read_timestamps(times)
      cost = self.costs[index]
      record_kernel(KernelEvent(item.runner.name, item.runner.device, start, end, item.dims, cost.flops,
                                cost.bytes_moved, item.operations))
