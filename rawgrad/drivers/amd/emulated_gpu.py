"""The emulated GPU (under emulated.py's KFD): its packet processors, one thread per queue, woken by the doorbell and
reading packets from the ring bytes in GPU memory exactly as the driver wrote them; the faults that stop a queue; the
GPU clock. Kernels' programs come from ../emulated_programs.py.

The AQL processor (the CP's MEC) runs kernel dispatch packets through the GPU program interpreter, waits out
barrier-AND/OR packets, and runs the PM4 indirect buffer of a vendor-specific packet (RELEASE_MEM, WAIT_REG_MEM,
ACQUIRE_MEM, NOP). A packet it refuses sets the queue's error code in amd_queue_t.queue_inactive_signal (the bits
ROCr's queue error handler reads), interrupts through that signal's event, and stops the queue. The SDMA processor
runs linear copies, fences, traps, polls and timestamps; a packet it cannot decode hangs the engine, which KFD reports
as a hardware exception. A GPU access to unmapped memory is a memory fault either way.

Packets are decoded with the generated layouts (hsa_kernel_dispatch_packet_t, kernel_descriptor_t, the SDMA (hi, lo)
fields), independently of how the driver built them.
"""
from __future__ import annotations

import ctypes
import math
import threading
import time
from typing import Any, Callable

import numpy as np

from rawgrad.autogen.amd import hsa
from rawgrad.autogen.amd import kernel_descriptor as descriptors
from rawgrad.drivers.amd import packets
from rawgrad.compiler.codegen.linearize import argument_block_words
from rawgrad.runtime.interpreter import InterpreterError, run_program

WAIT_LIMIT_S = 60.0                  # a wait packet gives up (as a hang) after this; host waits time out sooner
PUBLISH_WAIT_S = 1.0                 # how long a packet below the write index may stay INVALID
POLL_S = 20e-6
MAX_WORKGROUP_ITEMS = 1024
MAX_GROUP_SEGMENT_BYTES = 64 << 10
# queue error bits (what ROCr's handler decodes from queue_inactive_signal)
INVALID_DIMENSIONS, INVALID_GROUP_MEMORY, INVALID_CODE, INVALID_PACKET = 0x2, 0x4, 0x8, 0x20
WORKGROUP_TOO_LARGE, INVALID_VENDOR_PACKET, ILLEGAL_INSTRUCTION = 0x40, 0x100, 0x40000000
SCRATCH_WAVE64, SCRATCH_WAVE32 = 0x1, 0x400
# PM4 (both families share the opcodes and the type-3 header)
PM4_NOP, PM4_WAIT_REG_MEM, PM4_INDIRECT_BUFFER, PM4_RELEASE_MEM, PM4_ACQUIRE_MEM = 0x10, 0x3C, 0x3F, 0x49, 0x58
COMPARE = {0: lambda value, reference: True, 1: lambda value, reference: value < reference,
           2: lambda value, reference: value <= reference, 3: lambda value, reference: value == reference,
           4: lambda value, reference: value != reference, 5: lambda value, reference: value >= reference,
           6: lambda value, reference: value > reference}
CLOCK_BASE_TICKS = 1 << 36          # the emulated 100 MHz GPU counter is ahead of the host clock


def gpu_clock() -> int:
  """The GPU's 100 MHz counter (what RELEASE_MEM and SDMA timestamps write)."""
  return time.clock_gettime_ns(time.CLOCK_MONOTONIC_RAW) // 10 + CLOCK_BASE_TICKS


# *** faults ***

class GPUFault(Exception):
  """What stops a queue."""


class QueueError(GPUFault):
  """A packet the CP refuses: it writes `code` (ROCr's queue error bits) to the queue's inactive signal."""

  def __init__(self, code: int, why: str):
    super().__init__(why)
    self.code = code


class MemoryFault(GPUFault, InterpreterError):
  """A GPU access to an address this process's GPU page tables do not map."""

  def __init__(self, address: int, nbytes: int, what: str = "access"):
    super().__init__(f"GPU {what} of {nbytes} bytes at {address:#x}: not mapped")
    self.address = address


class EngineHang(GPUFault):
  """An SDMA packet the engine cannot decode: it hangs, and KFD reports a hardware exception (reset)."""


class QueueStopped(Exception):
  """The queue was destroyed while its processor ran."""


class QueueEngine:
  """A queue's packet processor: a thread that runs after each doorbell until the ring is drained."""

  def __init__(self, kernel: Any, queue_id: int, args: Any):
    self.kernel, self.queue_id = kernel, queue_id
    self.family = packets.family(kernel.chip.arch)
    self.ring_address, self.ring_bytes = args.ring_base_address, args.ring_size
    self.read_pointer_address, self.write_pointer_address = args.read_pointer_address, args.write_pointer_address
    self.doorbell_index = queue_id
    self.wakeup = threading.Event()
    self.stopped = False
    self.dead: str | None = None      # why the queue stopped taking work
    self.position = "idle"
    self.thread = threading.Thread(target=self._run, name=f"emulated AMD {type(self).__name__} {queue_id}",
                                   daemon=True)
    self.thread.start()

  def ring(self, value: int) -> None:
    self.wakeup.set()

  def stop(self, timeout_s: float = 10.0) -> None:
    self.stopped = True
    self.wakeup.set()
    if threading.current_thread() is not self.thread: self.thread.join(timeout_s)

  def memory(self, address: int, nbytes: int, what: str = "access") -> np.ndarray:
    if self.stopped: raise QueueStopped()
    return self.kernel.page_tables.resolve(address, nbytes, what)

  def word64(self, address: int) -> np.ndarray:
    return self.memory(address, 8).view(np.uint64)

  def _run(self) -> None:
    while not self.stopped:
      self.wakeup.wait(0.5)
      self.wakeup.clear()
      if self.stopped or self.dead is not None: continue
      try:
        self.drain()
      except QueueStopped:
        return
      except GPUFault as fault:
        self.fail(fault)
      except Exception as error:  # noqa: BLE001 - an emulator bug must stop the queue visibly, never hang a wait
        self.fail(QueueError(ILLEGAL_INSTRUCTION, f"emulator error: {type(error).__name__}: {error}"))

  def fail(self, fault: GPUFault) -> None:
    self.dead = f"{self.position}: {fault}"
    message = f"emulated {type(self).__name__} {self.queue_id}: {self.dead}"
    if isinstance(fault, MemoryFault): self.kernel.memory_fault(fault.address, message)
    else: self.report(fault, message)

  def report(self, fault: GPUFault, message: str) -> None:
    self.kernel.hardware_exception(message)

  def drain(self) -> None:
    raise NotImplementedError

  def wait_until(self, condition: Callable[[], bool], what: str) -> None:
    """A wait packet: poll memory until the condition holds (a hang, reported, after WAIT_LIMIT_S)."""
    deadline = time.monotonic() + WAIT_LIMIT_S
    while not condition():
      if self.stopped: raise QueueStopped()
      if time.monotonic() > deadline: raise EngineHang(f"{what} was still not met after {WAIT_LIMIT_S}s")
      time.sleep(POLL_S)


# *** AQL ***

class AQLEngine(QueueEngine):
  """The compute queue's packet processor."""

  def __init__(self, kernel: Any, queue_id: int, args: Any):
    # the CP finds amd_queue_t from the read pointer, which ROCr places at read_dispatch_id
    self.queue_state = args.read_pointer_address - hsa.amd_queue_t.read_dispatch_id.offset
    self.entries = args.ring_size // packets.AQL_PACKET_BYTES
    super().__init__(kernel, queue_id, args)

  def drain(self) -> None:
    while True:
      read = int(self.word64(self.read_pointer_address)[0])
      if read >= int(self.word64(self.write_pointer_address)[0]): return
      self.position = f"AQL packet {read}"
      slot = self.ring_address + (read % self.entries) * packets.AQL_PACKET_BYTES
      self.process(slot, read)
      self.memory(slot, 2).view(np.uint16)[0] = hsa.HSA_PACKET_TYPE_INVALID   # the slot is free again
      self.word64(self.read_pointer_address)[0] = read + 1

  def packet_bytes(self, slot: int, index: int) -> bytes:
    """The packet once its producer has published it (its header is no longer INVALID)."""
    header = self.memory(slot, 2).view(np.uint16)
    deadline = time.monotonic() + PUBLISH_WAIT_S
    while header[0] & 0xFF == hsa.HSA_PACKET_TYPE_INVALID:
      if time.monotonic() > deadline:
        raise QueueError(INVALID_PACKET, f"packet {index} is INVALID although the write index is past it")
      time.sleep(POLL_S)
    return self.memory(slot, packets.AQL_PACKET_BYTES).tobytes()

  def process(self, slot: int, index: int) -> None:
    data = self.packet_bytes(slot, index)
    header = int.from_bytes(data[:2], "little")
    kind = header & ((1 << hsa.HSA_PACKET_HEADER_WIDTH_TYPE) - 1)
    if header >> 13:
      raise QueueError(INVALID_PACKET, f"packet {index}: header {header:#06x} sets reserved bits 13-15")
    if kind == hsa.HSA_PACKET_TYPE_KERNEL_DISPATCH:
      self.dispatch(hsa.hsa_kernel_dispatch_packet_t.from_buffer_copy(data))
    elif kind in (hsa.HSA_PACKET_TYPE_BARRIER_AND, hsa.HSA_PACKET_TYPE_BARRIER_OR):
      self.barrier(hsa.hsa_barrier_and_packet_t.from_buffer_copy(data), kind == hsa.HSA_PACKET_TYPE_BARRIER_AND)
    elif kind == hsa.HSA_PACKET_TYPE_VENDOR_SPECIFIC: self.vendor(data)
    else: raise QueueError(INVALID_PACKET, f"packet {index}: type {kind} is not one this packet processor runs")
    self.complete(int.from_bytes(data[56:64], "little"))

  def complete(self, signal_address: int) -> None:
    """A completion signal: decrement its value, and interrupt through its event mailbox if it has one."""
    if signal_address == 0: return
    signal = hsa.amd_signal_t.from_address(self.memory(signal_address, 64).ctypes.data)
    with self.kernel.lock: signal.value -= 1
    signal.end_ts = gpu_clock()
    self.notify(signal)

  def notify(self, signal: Any) -> None:
    if signal.event_mailbox_ptr:
      self.memory(signal.event_mailbox_ptr, 8).view(np.uint64)[0] = signal.event_id
      self.kernel.interrupt(signal.event_id)

  def report(self, fault: GPUFault, message: str) -> None:
    """A refused packet: the error code goes to queue_inactive_signal, whose event wakes the host."""
    self.kernel.record_fault(message)
    code = fault.code if isinstance(fault, QueueError) else ILLEGAL_INSTRUCTION
    state = hsa.amd_queue_t.from_address(self.memory(self.queue_state, ctypes.sizeof(hsa.amd_queue_t)).ctypes.data)
    if state.queue_inactive_signal.handle:
      signal = hsa.amd_signal_t.from_address(self.memory(state.queue_inactive_signal.handle, 64).ctypes.data)
      signal.value = code
      self.notify(signal)

  # ** kernel dispatch

  def dispatch(self, packet: hsa.hsa_kernel_dispatch_packet_t) -> None:
    workgroup, grid = self.launch_sizes(packet)
    descriptor = self.kernel_descriptor(packet)
    code_address = packet.kernel_object + descriptor.kernel_code_entry_byte_offset
    read = lambda n: self.memory(code_address, n, "instruction fetch").tobytes()  # noqa: E731
    found = self.kernel.programs.find(code_address, read, MemoryFault)
    if found is None:
      raise QueueError(INVALID_CODE, f"no program is registered for the code at {code_address:#x} (kernel object "
                                     f"{packet.kernel_object:#x}): was the code object uploaded by the driver?")
    count = argument_block_words(found.program)
    if descriptor.kernarg_size or count:
      if packet.kernarg_address % 16:
        raise QueueError(INVALID_PACKET, f"kernarg_address {packet.kernarg_address:#x} is not 16-byte aligned")
      self.memory(packet.kernarg_address, max(descriptor.kernarg_size, 8 * count), "kernel argument read")
    arguments = [int(word) for word in self.memory(packet.kernarg_address, 8 * count).view(np.uint64)] if count else []
    blocks = tuple(g // w for g, w in zip(grid, workgroup))
    self.position = f"{self.position} (kernel at {code_address:#x}, {blocks} workgroups of {workgroup})"
    try:
      run_program(found.program, blocks, workgroup, arguments, self.memory)
    except MemoryFault:
      raise
    except InterpreterError as error:
      raise QueueError(ILLEGAL_INSTRUCTION, f"the kernel cannot run: {error}") from None

  def launch_sizes(self, packet: hsa.hsa_kernel_dispatch_packet_t) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(workgroup, grid) sizes, checked as the CP checks them."""
    dims = (packet.setup >> hsa.HSA_KERNEL_DISPATCH_PACKET_SETUP_DIMENSIONS) & 3
    workgroup = (packet.workgroup_size_x, packet.workgroup_size_y, packet.workgroup_size_z)
    grid = (packet.grid_size_x, packet.grid_size_y, packet.grid_size_z)
    if dims not in (1, 2, 3): raise QueueError(INVALID_DIMENSIONS, f"setup says {dims} dimensions")
    if any(workgroup[d] != 1 or grid[d] != 1 for d in range(dims, 3)):
      raise QueueError(INVALID_DIMENSIONS, f"a {dims}-dimensional dispatch with workgroup {workgroup} and grid {grid}")
    if 0 in workgroup or 0 in grid:
      raise QueueError(INVALID_DIMENSIONS, f"workgroup {workgroup} or grid {grid} is empty")
    if math.prod(workgroup) > MAX_WORKGROUP_ITEMS:
      raise QueueError(WORKGROUP_TOO_LARGE, f"workgroup {workgroup} has {math.prod(workgroup)} work-items, more than "
                                            f"{MAX_WORKGROUP_ITEMS}")
    for axis, (items, size) in enumerate(zip(grid, workgroup)):
      if items % size:   # rawgrad's kernels (and this interpreter) run whole workgroups only
        raise QueueError(INVALID_DIMENSIONS, f"grid_size_{'xyz'[axis]} {items} is not a multiple of "
                                             f"workgroup_size_{'xyz'[axis]} {size}")
    if packet.group_segment_size > MAX_GROUP_SEGMENT_BYTES:
      raise QueueError(INVALID_GROUP_MEMORY, f"group_segment_size {packet.group_segment_size} is above "
                                             f"{MAX_GROUP_SEGMENT_BYTES}")
    return workgroup, grid

  def kernel_descriptor(self, packet: hsa.hsa_kernel_dispatch_packet_t) -> Any:
    if packet.kernel_object == 0 or packet.kernel_object % 64:
      raise QueueError(INVALID_CODE, f"kernel_object {packet.kernel_object:#x} is not a 64-byte aligned descriptor")
    raw = self.memory(packet.kernel_object, ctypes.sizeof(descriptors.kernel_descriptor_t), "kernel descriptor read")
    descriptor = descriptors.kernel_descriptor_t.from_buffer_copy(raw.tobytes())
    if descriptor.group_segment_fixed_size > packet.group_segment_size:
      raise QueueError(INVALID_GROUP_MEMORY, f"the kernel needs {descriptor.group_segment_fixed_size} bytes of LDS, "
                                             f"the packet gives {packet.group_segment_size}")
    wave32 = bool(descriptor.kernel_code_properties & descriptors.KERNEL_CODE_PROPERTY_ENABLE_WAVEFRONT_SIZE32)
    if descriptor.private_segment_fixed_size or packet.private_segment_size:
      self.check_scratch(max(descriptor.private_segment_fixed_size, packet.private_segment_size), wave32)
    if wave32 != self.family.wave32:
      raise QueueError(INVALID_CODE, f"the kernel is compiled for wave{32 if wave32 else 64}; "
                                     f"{self.kernel.chip.arch} runs wave{32 if self.family.wave32 else 64}")
    return descriptor

  def check_scratch(self, lane_bytes: int, wave32: bool) -> None:
    """What the CP checks before a dispatch that needs scratch: the queue's scratch (amd_queue_t) is mapped and
    holds this many bytes for each lane; short of that it stops with the insufficient-scratch error."""
    state = hsa.amd_queue_t.from_buffer_copy(self.memory(self.queue_state, ctypes.sizeof(hsa.amd_queue_t)).tobytes())
    if state.scratch_wave64_lane_byte_size < lane_bytes or not state.scratch_backing_memory_location:
      raise QueueError(SCRATCH_WAVE32 if wave32 else SCRATCH_WAVE64,
                       f"the kernel needs {lane_bytes} bytes of scratch per work-item; the queue has "
                       f"{state.scratch_wave64_lane_byte_size} at {state.scratch_backing_memory_location:#x}")
    self.memory(state.scratch_backing_memory_location, state.scratch_backing_memory_byte_size, "scratch")

  # ** barriers and PM4

  def barrier(self, packet: hsa.hsa_barrier_and_packet_t, wait_for_all: bool) -> None:
    signals = [handle for handle in packet.dep_signal if handle.handle]
    values = [self.memory(s.handle + hsa.amd_signal_t.value.offset, 8).view(np.int64) for s in signals]
    done = all if wait_for_all else any
    if values: self.wait_until(lambda: done(v[0] == 0 for v in values), f"barrier on signals {signals}")

  def vendor(self, data: bytes) -> None:
    """AMD's PM4-IB packet: the body is an INDIRECT_BUFFER command the CP jumps to."""
    words = np.frombuffer(data, dtype=np.uint32)
    pm4 = self.family.pm4
    if int.from_bytes(data[2:4], "little") != packets.AQL_FORMAT_PM4_IB:
      raise QueueError(INVALID_VENDOR_PACKET, f"vendor packet format {int.from_bytes(data[2:4], 'little')}")
    jump, low, high, size, remaining = (int(w) for w in words[1:6])
    if jump != pm4.PACKET3(pm4.PACKET3_INDIRECT_BUFFER, 2) or not size & pm4.INDIRECT_BUFFER_VALID \
       or remaining != packets.PM4_IB_REMAINING_DWORDS:
      raise QueueError(INVALID_VENDOR_PACKET, f"vendor packet words {[hex(int(w)) for w in words[1:6]]} are not an "
                                              "INDIRECT_BUFFER jump")
    dwords = size & 0xFFFFF
    address = low | high << 32
    self.run_pm4(self.memory(address, 4 * dwords, "indirect buffer read").view(np.uint32).copy(), address)

  def run_pm4(self, words: np.ndarray, address: int) -> None:
    position = 0
    while position < len(words):
      header = int(words[position])
      if header >> 30 != 3:
        raise QueueError(INVALID_VENDOR_PACKET, f"PM4 word {header:#010x} at {address + 4 * position:#x} is not a "
                                                "type-3 packet")
      opcode, count = (header >> 8) & 0xFF, (header >> 16) & 0x3FFF
      body = [int(w) for w in words[position + 1:position + 2 + count]]
      if len(body) != count + 1:
        raise QueueError(INVALID_VENDOR_PACKET, f"PM4 packet {opcode:#x} runs past the indirect buffer's end")
      self.pm4_packet(opcode, body)
      position += count + 2

  def pm4_packet(self, opcode: int, body: list[int]) -> None:
    if opcode == PM4_RELEASE_MEM: self.release_mem(body)
    elif opcode == PM4_WAIT_REG_MEM: self.wait_reg_mem(body)
    elif opcode not in (PM4_NOP, PM4_ACQUIRE_MEM):   # emulated memory needs no cache maintenance
      raise QueueError(INVALID_VENDOR_PACKET, f"PM4 opcode {opcode:#x} is not one this emulation runs")

  def release_mem(self, body: list[int]) -> None:
    if len(body) != 7: raise QueueError(INVALID_VENDOR_PACKET, f"RELEASE_MEM with {len(body)} words, not 7")
    pm4 = self.family.pm4
    event = body[0] & 0x3F
    if event not in (pm4.CACHE_FLUSH_AND_INV_TS_EVENT, pm4.BOTTOM_OF_PIPE_TS):
      raise QueueError(INVALID_VENDOR_PACKET, f"RELEASE_MEM on event {event:#x}, not an end-of-pipe event")
    data_select, interrupt_select = (body[1] >> 29) & 7, (body[1] >> 24) & 7
    address, data = body[2] | body[3] << 32, body[4] | body[5] << 32
    if data_select == packets.DATA_LOW_32: self.memory(address, 4, "RELEASE_MEM write").view(np.uint32)[0] = body[4]
    elif data_select in (packets.DATA_64, packets.DATA_GPU_CLOCK):
      if address % 8: raise QueueError(INVALID_VENDOR_PACKET, f"a 64-bit RELEASE_MEM write to {address:#x}")
      value = data if data_select == packets.DATA_64 else gpu_clock()
      self.memory(address, 8, "RELEASE_MEM write").view(np.uint64)[0] = value
    elif data_select != 0:
      raise QueueError(INVALID_VENDOR_PACKET, f"RELEASE_MEM data select {data_select} is not emulated")
    if interrupt_select: self.kernel.interrupt(body[6])

  def wait_reg_mem(self, body: list[int]) -> None:
    if len(body) != 6: raise QueueError(INVALID_VENDOR_PACKET, f"WAIT_REG_MEM with {len(body)} words, not 6")
    function, memory_space = body[0] & 7, (body[0] >> 4) & 1
    if not memory_space: raise QueueError(INVALID_VENDOR_PACKET, "WAIT_REG_MEM on a register is not emulated")
    address, reference, mask = body[1] | body[2] << 32, body[3], body[4]
    word = self.memory(address, 4, "WAIT_REG_MEM read").view(np.uint32)
    compare = COMPARE.get(function)
    if compare is None: raise QueueError(INVALID_VENDOR_PACKET, f"WAIT_REG_MEM function {function}")
    self.wait_until(lambda: compare(int(word[0]) & mask, reference),
                    f"WAIT_REG_MEM for the word at {address:#x} (function {function}, reference {reference})")


# *** SDMA ***

class SDMAEngine(QueueEngine):
  """The copy queue's packet processor."""

  def drain(self) -> None:
    ring = self.memory(self.ring_address, self.ring_bytes).view(np.uint32)
    while True:
      read = int(self.word64(self.read_pointer_address)[0])
      if read >= int(self.word64(self.write_pointer_address)[0]): return
      self.position = f"SDMA packet at byte {read}"
      length = self.packet(ring, (read % self.ring_bytes) // 4)
      self.word64(self.read_pointer_address)[0] = read + 4 * length

  def words(self, ring: np.ndarray, start: int, count: int) -> list[int]:
    return [int(ring[(start + i) % len(ring)]) for i in range(count)]

  def packet(self, ring: np.ndarray, start: int) -> int:
    """Run the packet at word `start`; returns its length in words."""
    sdma = self.family.sdma
    header = int(ring[start])
    opcode, sub_opcode = header & 0xFF, (header >> 8) & 0xFF
    if opcode == sdma.SDMA_OP_NOP: return 1 + packets.get_field([header], sdma.SDMA_PKT_NOP_HEADER_count)
    if opcode == sdma.SDMA_OP_COPY and sub_opcode == sdma.SDMA_SUBOP_COPY_LINEAR:
      self.copy(self.words(ring, start, 7))
      return 7
    if opcode == sdma.SDMA_OP_FENCE:
      words = self.words(ring, start, 4)
      address = packets.get_field(words, sdma.SDMA_PKT_FENCE_ADDR_LO_addr_31_0) | \
        packets.get_field(words, sdma.SDMA_PKT_FENCE_ADDR_HI_addr_63_32) << 32
      if address % 4: raise EngineHang(f"a fence to {address:#x}, which is not dword aligned")
      value = packets.get_field(words, sdma.SDMA_PKT_FENCE_DATA_data)
      self.memory(address, 4, "fence write").view(np.uint32)[0] = value
      return 4
    if opcode == sdma.SDMA_OP_TRAP:
      self.kernel.interrupt(packets.get_field(self.words(ring, start, 2), sdma.SDMA_PKT_TRAP_INT_CONTEXT_int_context))
      return 2
    if opcode == sdma.SDMA_OP_POLL_REGMEM:
      self.poll(self.words(ring, start, 6))
      return 6
    if opcode == sdma.SDMA_OP_TIMESTAMP and sub_opcode == sdma.SDMA_SUBOP_TIMESTAMP_GET_GLOBAL:
      words = self.words(ring, start, 3)
      address = packets.get_field(words, sdma.SDMA_PKT_TIMESTAMP_GET_GLOBAL_WRITE_ADDR_LO_write_addr_31_3) << 3 | \
        packets.get_field(words, sdma.SDMA_PKT_TIMESTAMP_GET_GLOBAL_WRITE_ADDR_HI_write_addr_63_32) << 32
      self.memory(address, 8, "timestamp write").view(np.uint64)[0] = gpu_clock()
      return 3
    raise EngineHang(f"SDMA header {header:#010x} (opcode {opcode}, sub-opcode {sub_opcode}) is not a packet this "
                     "engine runs")

  def copy(self, words: list[int]) -> None:
    sdma = self.family.sdma
    nbytes = packets.get_field(words, sdma.SDMA_PKT_COPY_LINEAR_COUNT_count) + 1
    source = packets.get_field(words, sdma.SDMA_PKT_COPY_LINEAR_SRC_ADDR_LO_src_addr_31_0) | \
      packets.get_field(words, sdma.SDMA_PKT_COPY_LINEAR_SRC_ADDR_HI_src_addr_63_32) << 32
    dest = packets.get_field(words, sdma.SDMA_PKT_COPY_LINEAR_DST_ADDR_LO_dst_addr_31_0) | \
      packets.get_field(words, sdma.SDMA_PKT_COPY_LINEAR_DST_ADDR_HI_dst_addr_63_32) << 32
    data = self.memory(source, nbytes, "copy read").copy()
    self.memory(dest, nbytes, "copy write")[:] = data

  def poll(self, words: list[int]) -> None:
    sdma = self.family.sdma
    if not packets.get_field(words, sdma.SDMA_PKT_POLL_REGMEM_HEADER_mem_poll):
      raise EngineHang("POLL_REGMEM on a register is not emulated")
    function = packets.get_field(words, sdma.SDMA_PKT_POLL_REGMEM_HEADER_func)
    compare = COMPARE.get(function)
    if compare is None: raise EngineHang(f"POLL_REGMEM function {function}")
    address = packets.get_field(words, sdma.SDMA_PKT_POLL_REGMEM_ADDR_LO_addr_31_0) | \
      packets.get_field(words, sdma.SDMA_PKT_POLL_REGMEM_ADDR_HI_addr_63_32) << 32
    reference = packets.get_field(words, sdma.SDMA_PKT_POLL_REGMEM_VALUE_value)
    mask = packets.get_field(words, sdma.SDMA_PKT_POLL_REGMEM_MASK_mask)
    word = self.memory(address, 4, "poll read").view(np.uint32)
    self.wait_until(lambda: compare(int(word[0]) & mask, reference),
                    f"POLL_REGMEM for the word at {address:#x} (function {function}, reference {reference})")
