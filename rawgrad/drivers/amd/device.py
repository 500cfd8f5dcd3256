"""AMDDevice: an AMD GPU behind the HCQ interface, driven through KFD with no ROCm runtime.

Memory: buffers and kernel code are VRAM the CPU does not map (copies go through staging and the SDMA engine); rings,
signals, kernel argument blocks, indirect buffers and staging are GTT, at one address for the CPU and the GPU.

Queues: `exec` becomes an AQL kernel dispatch packet (kernel object = the uploaded code object's kernel descriptor;
grid in work-items; the argument block is the kernarg segment). `signal`, `wait`, `timestamp` and `memory_barrier` on
the compute queue become PM4 commands in an indirect buffer that a vendor-specific AQL packet jumps to: RELEASE_MEM
writes a value (or the GPU clock) once earlier work is done, WAIT_REG_MEM stalls until a value is reached. AQL's own
completion signals and barrier-AND packets cannot carry HCQ signals: the packet processor only decrements a
completion signal, and a barrier-AND waits for a value to become zero, while an HCQ signal is a timeline set to any
value and waited on for "at least". Every packet has the barrier bit, so the queue runs strictly in order. On the copy
queue the same commands are SDMA packets: linear copies, fences (a 64-bit value as two 32-bit fences), polls, and
global timestamps.

Every signal command also writes the device's KFD signal event slot and interrupts (RELEASE_MEM with INT_SEL, or an
SDMA TRAP), so a host wait sleeps in WAIT_EVENTS instead of spinning once the first moments pass. Waits compare the
low 32 bits (WAIT_REG_MEM and POLL_REGMEM poll 32-bit words), so signal values stay below 2^32.

Faults: the CP reports a bad packet in the AQL queue's queue_inactive_signal; KFD reports GPU memory faults and hangs
through memory and hardware exception events. The next wait or check raises DeviceFault with what they say.
"""
from __future__ import annotations

import ctypes
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rawgrad.autogen.amd import hsa, kfd
from rawgrad.compiler.render.llvmir import AMDGPURenderer
from rawgrad.compiler.target import Target, gpu_target
from rawgrad.drivers.amd import packets
from rawgrad.drivers.amd.kfd import EVENT_PAGE_BYTES, KFD, Events, GPUNode, gpu_node
from rawgrad.drivers.amd.memory import Allocation, GPUMemory
from rawgrad.drivers.amd.queues import AQLQueue, Doorbells, SDMAQueue, queue_error_text
from rawgrad.drivers.os import KernelInterface, kernel_interface
from rawgrad.helpers import round_up
from rawgrad.runtime.compile import LLVMCompiler, append_program, embedded_program_text, split_embedded_program
from rawgrad.runtime.device import Allocator
from rawgrad.runtime.elf import AMDKernel, load_amd_kernel
from rawgrad.runtime.hcq import COMPUTE, COPY, DeviceFault, DeviceMemory, HCQDevice, HCQSignal, \
  HostRing, HWQueue, Release, on_collect

INDIRECT_BUFFER_RING_BYTES = 4 << 20
SPIN_BEFORE_SLEEP_S = 2e-3        # host waits poll this long before sleeping on the KFD event
SLEEP_SLICE_S = 0.1               # the longest WAIT_EVENTS between looks at the signal and the faults
EXCEPTION_CHECK_INTERVAL_S = 5e-3
SETUP_TIMEOUT_S = 10.0
MAX_WAIT_VALUE = 1 << 32
NOMINAL_CLOCK_HZ = 100_000_000    # the GPU counter RELEASE_MEM and SDMA timestamps read runs at 100 MHz
CLOCK_RESAMPLE_S = 1.0


# *** compiling and loading ***

class AMDCompiler:
  """LLVM IR -> an AMD GPU code object (LLVMCompiler for the amdgcn target). With embed_program, the code object is
  followed by the kernel's linear program, which an emulated GPU runs in place of the machine code."""

  def __init__(self, target: Target, embed_program: bool = False):
    self.llvm, self.embed_program = LLVMCompiler(target), embed_program
    self.cache_key = f"{self.llvm.cache_key}|embed={embed_program}"

  def compile(self, src: str) -> bytes:
    code_object = self.llvm.compile(src)
    return append_program(code_object, embedded_program_text(src)) if self.embed_program else code_object

  def assembly(self, src: str) -> str:
    return self.llvm.assembly(src)


class AMDProgram:
  """A kernel uploaded to VRAM: its relocated code object image, and the kernel descriptor a dispatch points at."""

  def __init__(self, device: AMDDevice, name: str, lib: bytes):
    code_object, program_text = split_embedded_program(lib)
    self.device, self.name = device, name
    self.kernel: AMDKernel = load_amd_kernel(code_object, name)
    check_kernel(self.kernel, device.target)
    device.ensure_scratch(self.kernel.private_segment_size)
    image = self.kernel.image
    self.memory = device.vram_memory(len(image))
    device.copyin(self.memory, memoryview(image))
    self.descriptor_address = self.memory.address + self.kernel.descriptor_offset
    if program_text is not None:   # an emulated GPU runs this program when a dispatch names the code
      device.kernel.register_program(self.memory.address + self.kernel.code_offset, image[self.kernel.code_offset:],
                                     program_text, self.kernel)

  def __repr__(self) -> str:
    return f"<AMDProgram {self.name} at {self.descriptor_address:#x}>"


def check_kernel(kernel: AMDKernel, target: Target) -> None:
  """Refuse what the device would fault on."""
  if kernel.group_segment_size > target.shared_memory_bytes:
    raise ValueError(f"kernel {kernel.name} needs {kernel.group_segment_size} bytes of LDS; {target.arch} has "
                     f"{target.shared_memory_bytes}")


class AMDAllocator(Allocator):
  """Buffers in VRAM, one KFD buffer object each; the base Allocator caches freed ones for reuse."""

  def _alloc(self, nbytes: int) -> DeviceMemory:
    return self.device.vram_memory(nbytes)

  def _free(self, memory: DeviceMemory, nbytes: int) -> None:
    del memory   # the allocation's finalizer frees it once the device is done


# *** time ***

class GPUClock:
  """GPU clock ticks as host monotonic ns, by pairs of (GPU counter, CPU raw monotonic ns) samples from KFD's
  GET_CLOCK_COUNTERS: the first pair and a recent one give the counter's rate."""

  def __init__(self, device_kfd: KFD, gpu_id: int):
    self.kfd, self.gpu_id = device_kfd, gpu_id
    self.first = self.latest = self.sample()
    self.sampled_at = time.monotonic()

  def sample(self) -> tuple[int, int]:
    args = self.kfd.call(kfd.AMDKFD_IOC_GET_CLOCK_COUNTERS, kfd.kfd_ioctl_get_clock_counters_args(gpu_id=self.gpu_id))
    return args.gpu_clock_counter, args.cpu_clock_counter

  def ns(self, ticks: int) -> int:
    if time.monotonic() - self.sampled_at > CLOCK_RESAMPLE_S:
      self.latest, self.sampled_at = self.sample(), time.monotonic()
    (gpu0, cpu0), (gpu1, cpu1) = self.first, self.latest
    measured = gpu1 - gpu0 > NOMINAL_CLOCK_HZ // 1000   # a millisecond of ticks gives a usable rate
    ns_per_tick = (cpu1 - cpu0) / (gpu1 - gpu0) if measured else 1e9 / NOMINAL_CLOCK_HZ
    raw_ns = cpu1 + (ticks - gpu1) * ns_per_tick
    # KFD's CPU counter is CLOCK_MONOTONIC_RAW; the runtime's clock is CLOCK_MONOTONIC
    return int(raw_ns + time.monotonic_ns() - time.clock_gettime_ns(time.CLOCK_MONOTONIC_RAW))


@dataclass(eq=False)
class MemoryOwner:
  """Keeps a buffer object alive while some DeviceMemory refers to it."""
  allocation: Allocation
  release: Release | None = None   # set by on_collect


# *** encoded queues ***

@dataclass(frozen=True)
class Dispatch:
  program: AMDProgram
  packet: ctypes.Structure   # the kernel dispatch packet, header in place, built once at encode


@dataclass
class EncodedQueue:
  """What submit writes: for the compute engine, dispatches and runs of PM4 words (each becomes an indirect buffer
  behind one vendor AQL packet); for the copy engine, SDMA words. Position independent, so a jit replays it."""
  engine: str
  items: list[Dispatch | list[int]] = field(default_factory=list)

  def add_words(self, words: list[int]) -> None:
    if self.items and isinstance(self.items[-1], list): self.items[-1].extend(words)
    else: self.items.append(list(words))


# *** the device ***

class AMDDevice(HCQDevice):
  def __init__(self, name: str, kernel: KernelInterface | None = None):
    self.kernel = kernel or kernel_interface("amd")
    ordinal = int(name.split(":")[1]) if ":" in name else 0
    self.fault: str | None = None
    self.closed = False
    self.kfd = KFD(self.kernel)
    try:
      self.node: GPUNode = gpu_node(self.kernel, ordinal)
      self.arch = self.node.arch
      self.family = packets.family(self.arch)
      self.memory = GPUMemory(self.kernel, self.kfd, self.node, uncached_host=self.arch == "gfx942")
      self._open_queues()
      self.clock = GPUClock(self.kfd, self.node.gpu_id)
    except BaseException:
      # closing the files ends the process's queues; KFD frees what it gave when the process's last one goes
      if getattr(self, "memory", None) is not None: self.memory.close()
      self.kfd.close()
      raise
    self.in_flight: deque[tuple[int, str]] = deque()   # (AQL packet index, kernel name) of recent dispatches
    self.scratch: DeviceMemory | None = None
    self.scratch_lane_bytes = 0
    self.last_exception_check = 0.0
    target = gpu_target(self.arch)
    embed = self.kernel.runs_programs   # an emulated GPU runs the linear program carried after the code object
    super().__init__(name, target, AMDAllocator(), AMDCompiler(target, embed_program=embed),
                     AMDGPURenderer(target, embed_program=embed), AMDProgram)
    self.allocator.capacity_bytes = self.node.vram_bytes or None
    self.indirect_buffers = HostRing(self, INDIRECT_BUFFER_RING_BYTES, "PM4 indirect buffer")
    for engine in (COMPUTE, COPY): self.submit(HWQueue(), engine)
    self.synchronize(SETUP_TIMEOUT_S)

  def _open_queues(self) -> None:
    """Events (with their page), the compute queue's error signal, the doorbells and both queues."""
    self.event_page = self.memory.gtt(EVENT_PAGE_BYTES)
    self.events = Events(self.kfd, self.node, self.event_page.handle)
    self.event_slot = self.event_page.address + 8 * self.events.signal_slot
    self.inactive_signal = self.memory.gtt(ctypes.sizeof(hsa.amd_signal_t))
    signal = hsa.amd_signal_t.from_address(self.inactive_signal.address)
    signal.kind, signal.event_mailbox_ptr, signal.event_id = (hsa.AMD_SIGNAL_KIND_USER, self.event_slot,
                                                              self.events.signal_id)
    self.doorbells = Doorbells(self.kernel, self.kfd)
    self.compute_queue = AQLQueue(self.kernel, self.kfd, self.memory, self.node, self.arch, self.doorbells,
                                  self.inactive_signal)
    self.copy_queue = SDMAQueue(self.kernel, self.kfd, self.memory, self.node, self.family, self.doorbells)

  def close(self, timeout_s: float = 5.0) -> None:
    """Wait for the GPU (unless a fault stopped it), destroy the queues and let the GPU go."""
    if self.closed: return
    try:
      if self.fault is None: self.synchronize(timeout_s)
    finally:
      self.closed = True
      self.fault = f"{self.name} is closed"
      for queue in (self.compute_queue, self.copy_queue): queue.destroy()
      self.doorbells.close()
      self.memory.close()
      self.kfd.close()

  # ** memory

  def vram_memory(self, nbytes: int) -> DeviceMemory:
    """VRAM the host does not map; freed once nothing refers to it and the device is done with it."""
    self.memory.reclaim(self._completed())
    allocation = self.memory.vram(nbytes)
    return DeviceMemory(allocation.address, nbytes, None, self._owner(allocation))

  def host_memory(self, nbytes: int) -> DeviceMemory:
    self.memory.reclaim(self._completed())
    allocation = self.memory.gtt(nbytes)
    return DeviceMemory(allocation.address, nbytes, allocation.host[:nbytes], self._owner(allocation))

  def _owner(self, allocation: Allocation) -> MemoryOwner:
    """What a DeviceMemory (and its views) hold on to; when it goes, the allocation is freed after the submissions
    that may still use it."""
    owner = MemoryOwner(allocation)
    on_collect(owner, self._release, allocation)
    return owner

  def _release(self, allocation: Allocation) -> None:
    if not self.closed: self.memory.free_after(allocation, self._submitted() + 1)

  def ensure_scratch(self, bytes_per_item: int) -> None:
    """Give the compute queue scratch memory for kernels needing up to bytes_per_item of it: enough for every wave
    slot the CUs have for scratch (max_slots_scratch_cu), each lane of a wave64 (the CP sizes by wave64 lanes).
    Changing it waits for the queue, so no dispatch in flight uses the old memory."""
    if bytes_per_item <= self.scratch_lane_bytes: return
    lane_bytes = round_up(bytes_per_item, 16)
    waves = self.node.compute_units // self.node.xcc_count * self.node["max_slots_scratch_cu"]
    wave_bytes = round_up(lane_bytes * 64, self.family.scratch_granule)
    tmpring = packets.tmpring_size(self.family, waves, wave_bytes)
    scratch = self.vram_memory(wave_bytes * waves * self.node.xcc_count)
    if getattr(self, "timeline_signal", None) is not None: self.synchronize()
    owner: MemoryOwner = scratch.owner
    self.compute_queue.set_scratch(owner.allocation, lane_bytes, tmpring)
    self.scratch, self.scratch_lane_bytes = scratch, lane_bytes

  # ** encoding

  def encode(self, queue: HWQueue, engine: str) -> EncodedQueue:
    encoded = EncodedQueue(engine)
    for command in queue.commands:
      if command.kind == "exec": self._encode_exec(encoded, *command.operands)
      elif command.kind == "copy":
        if engine != COPY: raise ValueError(f"{self.name}: copies run on the {COPY} engine (SDMA), not {engine}")
        encoded.add_words(packets.sdma_copy(self.family, *command.operands))
      elif command.kind == "signal": encoded.add_words(self._signal_words(engine, *command.operands))
      elif command.kind == "wait": encoded.add_words(self._wait_words(engine, *command.operands))
      elif command.kind == "timestamp": encoded.add_words(self._timestamp_words(engine, command.operands[0]))
      elif command.kind == "memory_barrier":
        # SDMA runs its packets one after another and writes memory directly: only the CP has caches to flush
        if engine == COMPUTE: encoded.add_words(packets.acquire_memory(self.family))
      else: raise ValueError(f"the AMD queue has no command {command.kind!r}")
    return encoded

  def _encode_exec(self, encoded: EncodedQueue, program: AMDProgram, kernargs: int, global_size: tuple[int, int, int],
                   local_size: tuple[int, int, int]) -> None:
    if encoded.engine != COMPUTE: raise ValueError(f"{self.name}: kernels run on the {COMPUTE} engine, not "
                                                   f"{encoded.engine}")
    if not isinstance(program, AMDProgram):
      raise TypeError(f"{self.name} launches AMDProgram kernels, not {type(program).__name__}")
    if program.device is not self: raise ValueError(f"{program.name} was loaded on {program.device.name}, not here")
    if kernargs % 16: raise ValueError(f"a kernel argument block must be 16-byte aligned, not at {kernargs:#x}")
    grid = tuple(blocks * threads for blocks, threads in zip(global_size, local_size))
    if 0 in grid: return   # an empty launch does nothing
    kernel = program.kernel
    packet = packets.dispatch_packet(program.descriptor_address, kernargs, grid, tuple(local_size),
                                     kernel.group_segment_size, kernel.private_segment_size)
    packet.header = packets.aql_header(hsa.HSA_PACKET_TYPE_KERNEL_DISPATCH)
    encoded.items.append(Dispatch(program, packet))

  def _signal_words(self, engine: str, signal: HCQSignal, value: int) -> list[int]:
    """The device time at +8, the value, then the event slot and an interrupt for sleeping waiters."""
    check_wait_value(value, f"signal {signal.name}")
    if engine == COMPUTE:
      return (packets.release_mem(self.family, signal.address + 8, 0, packets.DATA_GPU_CLOCK, timestamp_event=True)
              + packets.release_mem(self.family, signal.address, value, packets.DATA_64)
              + packets.release_mem(self.family, self.event_slot, self.events.signal_id, packets.DATA_LOW_32,
                                    interrupt=True))
    return (packets.sdma_timestamp(self.family, signal.address + 8) + packets.sdma_fence64(self.family, signal.address,
                                                                                           value)
            + packets.sdma_fence(self.family, self.event_slot, self.events.signal_id)
            + packets.sdma_trap(self.family, self.events.signal_id))

  def _wait_words(self, engine: str, signal: HCQSignal, value: int) -> list[int]:
    check_wait_value(value, f"wait on {signal.name}")
    if engine == COMPUTE: return packets.wait_memory(self.family, signal.address, value)
    return packets.sdma_wait_memory(self.family, signal.address, value)

  def _timestamp_words(self, engine: str, address: int) -> list[int]:
    if engine == COMPUTE: return packets.release_mem(self.family, address, 0, packets.DATA_GPU_CLOCK,
                                                     timestamp_event=True)
    return packets.sdma_timestamp(self.family, address)

  # ** submitting

  def _submit(self, encoded: EncodedQueue, engine: str) -> None:
    self.check_faults()
    if encoded.engine != engine:
      raise ValueError(f"a queue encoded for the {encoded.engine} engine was submitted to the {engine} engine")
    self.memory.reclaim(self._completed())
    if engine == COPY:
      for words in encoded.items: self.copy_queue.submit(words, self.check_faults)
      return
    aql = [self._aql_packet(item) for item in encoded.items]
    if not aql: return
    first, _ = self.compute_queue.submit(aql, self.check_faults)
    for offset, item in enumerate(encoded.items):
      if isinstance(item, Dispatch): self.in_flight.append((first + offset, item.program.name))
    while len(self.in_flight) > 4096: self.in_flight.popleft()

  def _aql_packet(self, item: Dispatch | list[int]) -> ctypes.Structure:
    """The packet for an item, its header in place (AQLQueue writes the header word last)."""
    if isinstance(item, Dispatch): return item.packet
    words = np.array(item, dtype=np.uint32)
    buffer = self.indirect_buffers.alloc(words.nbytes, alignment=256)
    buffer.host[:] = words.view(np.uint8)
    packet = packets.pm4_ib_packet(self.family, buffer.address, len(words))
    packet.header = packets.aql_header(hsa.HSA_PACKET_TYPE_VENDOR_SPECIFIC)
    return packet

  # ** waits and faults

  def wait_signal(self, signal: HCQSignal, value: int, timeout_s: float) -> None:
    """Poll briefly, then sleep on the KFD signal event the packet processors interrupt, looking at the value and
    the faults between sleeps; a TimeoutError names the signal, both values and where the queues stand."""
    start = time.perf_counter()
    while signal.value < value:
      self.check_faults()
      elapsed = time.perf_counter() - start
      if elapsed > timeout_s:
        self.check_faults(force=True)
        raise TimeoutError(f"timed out after {timeout_s}s waiting for {signal.name} at {signal.address:#x} to reach "
                           f"{value}; it is {signal.value}{self.describe_state()}")
      if elapsed > SPIN_BEFORE_SLEEP_S:
        self.events.sleep_until_signaled(int(1000 * min(SLEEP_SLICE_S, max(timeout_s - elapsed, 1e-3))))
    self.check_faults()

  def check_faults(self, force: bool = False) -> None:
    if self.fault is not None: raise DeviceFault(self.fault)
    if (code := self.compute_queue.error_code()) != 0:
      self._record_fault(f"the compute queue stopped: {queue_error_text(code)} (queue error {code:#x})")
    now = time.monotonic()
    if force or now - self.last_exception_check > EXCEPTION_CHECK_INTERVAL_S:
      self.last_exception_check = now
      if (exception := self.events.exception()) is not None: self._record_fault(exception)

  def _record_fault(self, what: str) -> None:
    read = self.compute_queue.read_index
    kernels = sorted({name for index, name in self.in_flight if index >= read})
    running = f" while running kernel(s) {', '.join(kernels)}" if kernels else ""
    self.fault = (f"{self.name} ({self.arch}): {what}{running} (AQL packet {read} of {self.compute_queue.write_index}, "
                  f"timeline at {self._completed()} of {self.timeline_value}); the queues take no more work: open "
                  "the device again")
    raise DeviceFault(self.fault)

  def describe_state(self) -> str:
    compute, copy = self.compute_queue, self.copy_queue
    return (f"; compute queue: packet {compute.read_index} of {compute.write_index} read; copy queue: byte "
            f"{copy.read_pointer} of {copy.write_pointer} read")

  def timestamp_ns(self, ticks: int) -> int:
    return self.clock.ns(ticks)


def check_wait_value(value: int, what: str) -> None:
  if not 0 <= value < MAX_WAIT_VALUE:
    raise ValueError(f"{what}: value {value} does not fit 32 bits; AMD queues compare the low 32 bits of a signal")


def open_device(name: str) -> Any:
  return AMDDevice(name)

