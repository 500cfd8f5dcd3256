"""Hardware command queues (HCQ): the one interface every device is driven through, the CPU included.

A device has its own memory (the CPU's is host memory), addressed by device addresses. A queue records commands
device-neutrally: `exec` a program over an argument block in device-visible memory with a launch size, `copy` between
device addresses, `signal` a timeline value, `wait` for one, write a `timestamp`, `memory_barrier`. `submit` hands
the queue to one of the device's engines ("compute" or "copy") and returns at once; each device encodes the commands
its own way (native words on the CPU, GPFIFO pushbuffers and QMDs on NVIDIA, AQL/SDMA packets on AMD, a byte format
for the test device).

A signal is a 64-bit value at a device address, with the device time it was last set at address + 8; the host and
every queue of the device read and write it. Every submission on a device ends by signalling the device's timeline
the next value, and one that runs on a different engine than the submission before it first waits for that
submission's value, so the device runs its submissions in order while each engine keeps its own stream. The host
waits only where it reads data or synchronizes; every wait polls with a timeout and raises naming the signal, the
value waited for and the value seen.

Kernel argument blocks and staging buffers for copies live in rings of device-visible host memory; a ring that wraps
around waits for the device to be done with what it overwrites.
"""
from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from rawgrad.compiler.target import Target
from rawgrad.helpers import round_up

COMPUTE, COPY = "compute", "copy"
KERNARGS_BYTES = 8 << 20      # argument blocks of the kernels in flight
STAGING_BYTES = 32 << 20      # host copies in flight for devices the host cannot write directly
SIGNAL_BYTES = 16             # the value, then the timestamp of the SIGNAL that set it


class DeviceFault(RuntimeError):
  """The device reported an error (a bad command, a channel error, a fault in a kernel)."""


# *** signals ***

class HCQSignal:
  """A timeline signal: the 64-bit value at `address`, the device time (ns) of the SIGNAL that last set it at +8."""

  def __init__(self, device: HCQDevice, words: np.ndarray, address: int, name: str, memory: Any = None):
    if words.dtype != np.uint64 or words.size < 2: raise ValueError("a signal needs two uint64 words of memory")
    self.device, self.words, self.address, self.name = device, words, address, name
    self.memory = memory   # what keeps the words alive, where a driver allocated them

  @property
  def value(self) -> int:
    return int(self.words[0])

  @property
  def timestamp_ns(self) -> int:
    return self.device.timestamp_ns(int(self.words[1]))

  def set(self, value: int) -> None:
    """Set the value from the host (a queue waiting for it goes on)."""
    self.device.set_signal(self, value)

  def wait(self, value: int, timeout_s: float = 30.0) -> None:
    """Return once the value is at least `value`; raise TimeoutError naming both values instead of hanging, and any
    fault the device recorded meanwhile."""
    self.device.wait_signal(self, value, timeout_s)

  def __repr__(self) -> str:
    return f"<HCQSignal {self.name} at {self.address:#x} = {self.value}>"


# *** queues ***

@dataclass(frozen=True)
class Command:
  kind: str        # "exec", "copy", "signal", "wait", "timestamp", "memory_barrier"
  operands: tuple


@dataclass
class HWQueue:
  """Commands recorded in order, device-neutrally; a device encodes them at submit. Methods chain:
  `HWQueue().exec(...).signal(...).submit(device)`."""
  commands: list[Command] = field(default_factory=list)

  def exec(self, program: Any, kernargs: int, global_size: tuple[int, int, int] = (1, 1, 1),
           local_size: tuple[int, int, int] = (1, 1, 1)) -> HWQueue:
    """Run `program` over the argument block at device address `kernargs` (from device.argument_block: the device
    may use the prefix before it): global_size blocks of local_size threads (on the CPU, global_size[0] slices of
    its parallel loop)."""
    if len(global_size) != 3 or len(local_size) != 3 or min(*global_size, *local_size) < 0:
      raise ValueError(f"a launch needs three non-negative sizes each, got {global_size} and {local_size}")
    self.commands.append(Command("exec", (program, kernargs, tuple(global_size), tuple(local_size))))
    return self

  def copy(self, dest: int, src: int, nbytes: int) -> HWQueue:
    if nbytes < 0: raise ValueError(f"a copy of {nbytes} bytes")
    self.commands.append(Command("copy", (dest, src, nbytes)))
    return self

  def signal(self, signal: HCQSignal, value: int) -> HWQueue:
    self.commands.append(Command("signal", (signal, value)))
    return self

  def wait(self, signal: HCQSignal, value: int) -> HWQueue:
    self.commands.append(Command("wait", (signal, value)))
    return self

  def timestamp(self, address: int) -> HWQueue:
    """Write the device clock (the device's ticks; HCQDevice.timestamp_ns converts) into the timestamp slot at
    `address`: device.timestamp_bytes long and aligned to them, the time in its last 8 bytes (a GPU's semaphore
    release writes a payload, then the time)."""
    if address % 8: raise ValueError(f"a timestamp slot must be 8-byte aligned, not {address:#x}")
    self.commands.append(Command("timestamp", (address,)))
    return self

  def memory_barrier(self) -> HWQueue:
    """Make the writes of earlier commands visible to later ones and to the host."""
    self.commands.append(Command("memory_barrier", ()))
    return self

  def submit(self, device: HCQDevice, engine: str = COMPUTE) -> int:
    """Hand the queue to one of the device's engines; returns the timeline value that marks its end."""
    return device.submit(self, engine)


# *** device memory ***

@dataclass(eq=False)
class Release:
  """Whether the finalizer of what keeps an allocation alive has run (see on_collect)."""
  done: bool = False


def on_collect(owner: Any, callback: Callable[..., None], *args: Any) -> None:
  """Run callback(*args) once `owner` (what every DeviceMemory of an allocation holds) is collected, and record on it
  that this happened (owner.release). The collector runs such finalizers of a garbage cycle before the cycle's
  __del__ methods: a Buffer collected in the same cycle as its memory's owner then hands that memory to its
  allocator's cache (bringing the owner back) after the driver began to free it. Allocator.free drops memory whose
  release is done."""
  release = owner.release = Release()
  weakref.finalize(owner, _collected, release, callback, args)


def _collected(release: Release, callback: Callable[..., None], args: tuple) -> None:
  release.done = True
  callback(*args)


@dataclass(frozen=True)
class DeviceMemory:
  """An allocation (or a view of one): its device address and size, and its host mapping where the host can reach
  it directly (None where it cannot: then copies go through staging and the copy engine)."""
  address: int
  nbytes: int
  host: np.ndarray | None = None   # uint8 view of the same bytes
  owner: Any = None                # whatever keeps the memory alive

  @property
  def released(self) -> bool:
    """Its allocation's owner was collected (on_collect): the driver frees it once the device is done with it."""
    release = getattr(self.owner, "release", None)
    return isinstance(release, Release) and release.done

  def view(self, offset: int, nbytes: int) -> DeviceMemory:
    if offset < 0 or offset + nbytes > self.nbytes:
      raise ValueError(f"a view of {nbytes} bytes at offset {offset} does not fit in {self.nbytes} bytes")
    host = None if self.host is None else self.host[offset:offset + nbytes]
    return DeviceMemory(self.address + offset, nbytes, host, self.owner if self.owner is not None else self)


class HostRing:
  """A ring of device-visible host memory handing out short-lived blocks (argument blocks, staging). Wrapping
  around waits until the device has finished every submission made before the wrap."""

  def __init__(self, device: HCQDevice, nbytes: int, name: str):
    self.device, self.name = device, name
    self.memory = device.host_memory(nbytes)
    self.offset = 0

  def alloc(self, nbytes: int, alignment: int = 64) -> DeviceMemory:
    return self.memory.view(self.reserve(nbytes, alignment), nbytes)

  def reserve(self, nbytes: int, alignment: int = 64) -> int:
    """The offset in the ring of a new block of `nbytes` (alloc without making a view of it: a launch's path)."""
    if nbytes > self.memory.nbytes:
      raise ValueError(f"{nbytes} bytes do not fit in the {self.name} ring of {self.memory.nbytes} bytes")
    start = round_up(self.offset, alignment)
    if start + nbytes > self.memory.nbytes:
      self.device.timeline_signal.wait(self.device.timeline_value)
      start = 0
    self.offset = start + nbytes
    return start


# *** devices ***

class HCQDevice:
  """A device driven through hardware command queues: memory, programs, signals and two engines.

  A driver provides: `allocator` (device memory), `compiler`, `renderer`, `program_class(device, name, lib)`, a
  `target`; and implements `host_memory` (device-visible host memory), `new_signal`, `encode(queue, engine)` and
  `_submit(encoded, engine)`; `wait_signal`, `set_signal`, `check_faults` and `timestamp_ns` where the defaults do
  not fit."""
  shared_engines = False    # both engines feed one in-order stream (no waits needed between them)
  kernargs_prefix_bytes = 0  # room a launch needs just before its argument block (NV: the QMD, the driver constants)
  kernargs_alignment = 64
  timestamp_bytes = 8       # one TIMESTAMP's slot; the time is its last 8 bytes
  # the value the last submission signals, and the signal; class defaults as memory heaps ask before __init__ ends
  timeline_value = 0
  timeline_signal: Any = None

  def __init__(self, name: str, target: Target, allocator: Any, compiler: Any, renderer: Any, program_class: Any):
    self.name, self.target, self.allocator, self.compiler, self.renderer = name, target, allocator, compiler, renderer
    allocator.device = self   # its frees wait for this device's work
    self.program_class = program_class
    self.last_engine: str | None = None
    self.timeline_signal = self.new_signal(0, f"{name} timeline")
    self.kernargs = HostRing(self, KERNARGS_BYTES, "kernel argument")
    self._staging: HostRing | None = None

  # ** what a driver implements

  def host_memory(self, nbytes: int) -> DeviceMemory:
    """nbytes of host memory the device can read and write (pinned where the OS needs it)."""
    raise NotImplementedError

  def new_signal(self, value: int = 0, name: str = "signal") -> HCQSignal:
    """A signal in device-visible host memory."""
    memory = self.host_memory(SIGNAL_BYTES)
    words = memory.host.view(np.uint64)
    words[:] = [value, 0]
    return HCQSignal(self, words, memory.address, name, memory)

  def encode(self, queue: HWQueue, engine: str) -> Any:
    raise NotImplementedError

  def _submit(self, encoded: Any, engine: str) -> None:
    raise NotImplementedError

  def check_faults(self) -> None:
    """Raise DeviceFault for an error the device recorded since the last check."""

  def timestamp_ns(self, ticks: int) -> int:
    """A device timestamp as host monotonic nanoseconds."""
    return ticks

  def set_signal(self, signal: HCQSignal, value: int) -> None:
    signal.words[0] = value

  def wait_signal(self, signal: HCQSignal, value: int, timeout_s: float) -> None:
    """Poll (yielding, then sleeping up to 100 us between looks) until the signal reaches value."""
    start = time.perf_counter()
    delay = 10e-6
    while signal.value < value:
      self.check_faults()
      elapsed = time.perf_counter() - start
      if elapsed > timeout_s:
        raise TimeoutError(f"timed out after {timeout_s}s waiting for {signal.name} at {signal.address:#x} to reach "
                           f"{value}; it is {signal.value}{self.describe_state()}")
      if elapsed < 200e-6: continue
      time.sleep(delay)
      delay = min(delay * 2, 100e-6)
    self.check_faults()

  def describe_state(self) -> str:
    """More words for a timeout message: where the device's queues stand."""
    return ""

  # ** submitting

  def submit(self, queue: HWQueue, engine: str = COMPUTE) -> int:
    """Encode and submit the queue on an engine, ordered after every earlier submission; returns its end value."""
    if engine not in (COMPUTE, COPY): raise ValueError(f"unknown engine {engine!r}; devices have {COMPUTE} and {COPY}")
    value = self.timeline_value + 1
    commands = list(queue.commands)
    if self._must_wait(engine): commands.insert(0, Command("wait", (self.timeline_signal, self.timeline_value)))
    commands.append(Command("signal", (self.timeline_signal, value)))
    self._submit(self.encode(HWQueue(commands), engine), engine)
    self.timeline_value, self.last_engine = value, engine
    return value

  def submit_encoded(self, encoded: Any, engine: str = COMPUTE) -> int:
    """Submit a queue encoded before (a jit capture's), ordered like submit(); returns its end value."""
    if self._must_wait(engine): self._submit(self.encode(HWQueue().wait(self.timeline_signal, self.timeline_value),
                                                         engine), engine)
    self._submit(encoded, engine)
    self.last_engine = engine
    return self.submit(HWQueue(), engine)

  def _must_wait(self, engine: str) -> bool:
    return not self.shared_engines and self.last_engine not in (None, engine)

  def _completed(self) -> int:
    """The timeline value the device has reached (0 before the timeline exists)."""
    return 0 if self.timeline_signal is None else self.timeline_signal.value

  def _submitted(self) -> int:
    return self.timeline_value

  def synchronize(self, timeout_s: float = 30.0) -> None:
    """Wait for every submission so far."""
    self.timeline_signal.wait(self.timeline_value, timeout_s)

  @property
  def idle(self) -> bool:
    return self.timeline_signal.value >= self.timeline_value

  # ** launching

  def argument_block(self, slots: int, persistent: bool = False) -> DeviceMemory:
    """Room for a launch's argument block of 8-byte slots, with the device's prefix just before it: from the ring
    (reused once the device is past it), or of its own for a queue that is replayed (a jit capture)."""
    nbytes = self.kernargs_prefix_bytes + 16 * max(-(-slots // 2), 1)  # whole 16-byte rows (NV's banks read them)
    if not persistent:
      return self.kernargs.alloc(nbytes, self.kernargs_alignment).view(self.kernargs_prefix_bytes, nbytes -
                                                                         self.kernargs_prefix_bytes)
    memory = self.host_memory(nbytes + self.kernargs_alignment)
    start = (-memory.address) % self.kernargs_alignment + self.kernargs_prefix_bytes
    return memory.view(start, nbytes - self.kernargs_prefix_bytes)

  def launch(self, program: Any, args: list[int], global_size: tuple[int, int, int],
             local_size: tuple[int, int, int], timed: bool = False) -> tuple[int, int] | None:
    """Run a program once: its argument block (8-byte slots) goes into the ring, the launch onto the compute engine.
    With `timed`, waits for it and returns the device's start and end times in ns."""
    block = self.argument_block(len(args))
    block.host.view(np.uint64)[:len(args)] = [arg & (2**64 - 1) for arg in args]
    queue = HWQueue()
    if timed:
      times = self.kernargs.alloc(2 * self.timestamp_bytes, alignment=self.timestamp_bytes)
      queue.timestamp(times.address)
    queue.exec(program, block.address, global_size, local_size)
    if not timed:
      self.submit(queue)
      return None
    queue.timestamp(times.address + self.timestamp_bytes)
    self.synchronize_after(self.submit(queue))
    return self.read_timestamps(times)

  def read_timestamps(self, times: DeviceMemory) -> tuple[int, int]:
    """The two times (host ns) in a pair of timestamp slots, 2 * timestamp_bytes at times.address."""
    words = times.host.view(np.uint64)
    last = self.timestamp_bytes // 8 - 1
    return self.timestamp_ns(int(words[last])), self.timestamp_ns(int(words[last + self.timestamp_bytes // 8]))

  def synchronize_after(self, value: int) -> None:
    self.timeline_signal.wait(value)

  # ** copies between the host and device memory

  @property
  def staging(self) -> HostRing:
    if self._staging is None: self._staging = HostRing(self, STAGING_BYTES, "staging")
    return self._staging

  def copyin(self, dest: DeviceMemory, data: memoryview) -> None:
    """Write host bytes into device memory, after everything submitted before (directly when the device is idle
    and the memory is mapped; otherwise staged and copied by the copy engine)."""
    source = np.frombuffer(data, dtype=np.uint8)
    if dest.host is not None and self.idle:
      dest.host[:source.nbytes] = source
      return
    for start in range(0, source.nbytes, STAGING_BYTES):
      chunk = source[start:start + STAGING_BYTES]
      staged = self.staging.alloc(chunk.nbytes)
      staged.host[:] = chunk
      self.submit(HWQueue().copy(dest.address + start, staged.address, chunk.nbytes), COPY)

  def copyout(self, dest: memoryview, source: DeviceMemory) -> None:
    """Read device memory into host bytes, once everything submitted before has run."""
    out = np.frombuffer(dest, dtype=np.uint8)
    self.synchronize()
    if source.host is not None:
      out[:] = source.host[:out.nbytes]
      return
    for start in range(0, out.nbytes, STAGING_BYTES):
      nbytes = min(STAGING_BYTES, out.nbytes - start)
      staged = self.staging.alloc(nbytes)
      self.synchronize_after(self.submit(HWQueue().copy(staged.address, source.address + start, nbytes), COPY))
      out[start:start + nbytes] = staged.host
