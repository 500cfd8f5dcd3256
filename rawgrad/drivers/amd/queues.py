"""The two hardware queues an AMD device gets from KFD (CREATE_QUEUE): an AQL compute queue and an SDMA copy queue.

AQL: a ring of 64-byte packets in GTT. The ring's write index (amd_queue_t.write_dispatch_id, which the CP polls) and
read index (read_dispatch_id, which the CP reports) live in an amd_queue_t, as ROCr lays it out: the CP finds the
structure from the read pointer's address. A packet is written body first and header last, the write index moves
past it, and the doorbell gets the index of the last packet written (the HSA convention). The CP reports a queue
error (a malformed packet, a bad dispatch) in queue_inactive_signal, an amd_signal_t whose value it sets to the error
code, and interrupts through that signal's event.

SDMA: a ring of 32-bit words in GTT; the read and write pointers are 64-bit byte counts that only grow, and the
doorbell gets the write pointer. No packet wraps around the ring's end: the tail is padded with NOPs.
"""
from __future__ import annotations

import ctypes
import time
from typing import Callable

import numpy as np

from rawgrad.autogen.amd import hsa, kfd
from rawgrad.drivers.amd import packets
from rawgrad.drivers.amd.kfd import KFD, GPUNode
from rawgrad.drivers.amd.memory import PAGE, Allocation, GPUMemory
from rawgrad.drivers.os import MAP_SHARED, PROT_READ, PROT_WRITE, KernelInterface
from rawgrad.helpers import round_up

AQL_RING_PACKETS = 4096
SDMA_RING_BYTES = 1 << 20
EOP_BUFFER_BYTES = 4096            # the CP's end-of-pipe buffer of a compute queue, in VRAM (libhsakmt's size)
DOORBELL_SLICE_BYTES = 1024 * 8    # a process's doorbells on a GPU: 1024 queues of 8-byte (SOC15) doorbells
RING_FULL_TIMEOUT_S = 30.0
QUEUE_PRIORITY = 7                 # the middle of KFD's 0-15 (ROCr's normal priority)
# what the control stack and context save area need (libhsakmt's update_ctx_save_restore_size)
CONTEXT_SAVE_HEADER_BYTES = 40     # HsaUserContextSaveAreaHeader
SGPR_BYTES_PER_CU, HWREG_BYTES_PER_CU = 0x4000, 0x1000
DEBUGGER_BYTES_PER_WAVE, DEBUGGER_ALIGNMENT = 32, 64
VGPR_BYTES_PER_CU = {"gfx1100": 0x60000, "gfx942": 0x80000}
# CP queue error codes in queue_inactive_signal, as ROCr's queue error handler reads them
QUEUE_ERRORS = {0x1: "the kernel needs scratch memory (wave64) and the queue has none",
                0x400: "the kernel needs scratch memory (wave32) and the queue has none",
                0x2: "invalid dimensions", 0x4: "invalid group (LDS) memory size", 0x8: "invalid (or null) code object",
                0x20: "invalid packet format", 0x40: "workgroup too large", 0x80: "out of VGPRs",
                0x100: "invalid vendor-specific packet", 0x20000000: "memory violation (address beyond 48 bits)",
                0x40000000: "illegal instruction", 0x80000000: "debug trap"}


def queue_error_text(code: int) -> str:
  reasons = [text for bit, text in QUEUE_ERRORS.items() if code & bit]
  return "; ".join(reasons) if reasons else "an unknown error"


class Doorbells:
  """The process's doorbell slice on one GPU, mapped from /dev/kfd once the first queue names its offset."""

  def __init__(self, kernel: KernelInterface, device_kfd: KFD):
    self.kernel, self.kfd = kernel, device_kfd
    self.base: int | None = None
    self.mapped_offset = 0

  def address(self, doorbell_offset: int) -> int:
    """The CPU address of a queue's doorbell (CREATE_QUEUE's doorbell_offset: the slice's mmap offset, plus the
    doorbell's byte offset in the slice on SOC15 chips)."""
    offset = doorbell_offset & ~(DOORBELL_SLICE_BYTES - 1)
    if self.base is None:
      self.base = self.kernel.mmap(0, DOORBELL_SLICE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, self.kfd.fd, offset)
      self.mapped_offset = offset
    elif offset != self.mapped_offset:
      raise RuntimeError(f"a queue's doorbell is in slice {offset:#x}, the device's queues so far in "
                         f"{self.mapped_offset:#x}")
    return self.base + (doorbell_offset & (DOORBELL_SLICE_BYTES - 1))

  def close(self) -> None:
    if self.base is not None: self.kernel.munmap(self.base, DOORBELL_SLICE_BYTES)
    self.base = None


def wait_for_room(name: str, free: Callable[[], int], needed: int, check: Callable[[], None]) -> None:
  """Until the ring has `needed` free entries; bounded, and stopped by a device fault."""
  deadline = time.monotonic() + RING_FULL_TIMEOUT_S
  while (room := free()) < needed:
    check()
    if time.monotonic() > deadline:
      raise TimeoutError(f"the {name} ring stayed full for {RING_FULL_TIMEOUT_S}s: {room} free, {needed} needed")
    time.sleep(50e-6)


def create_queue(device_kfd: KFD, node: GPUNode, **fields: int) -> kfd.kfd_ioctl_create_queue_args:
  args = kfd.kfd_ioctl_create_queue_args(gpu_id=node.gpu_id, queue_percentage=kfd.KFD_MAX_QUEUE_PERCENTAGE,
                                         queue_priority=QUEUE_PRIORITY, **fields)
  return device_kfd.call(kfd.AMDKFD_IOC_CREATE_QUEUE, args)


def context_save_sizes(node: GPUNode, arch: str) -> tuple[int, int, int]:
  """(context save area, control stack, debugger area) bytes per compute die, for wave save/restore (CWSR)."""
  cu_count = node.compute_units // node.xcc_count
  if arch.startswith("gfx9"):
    waves = min(cu_count * 40, node.properties.get("num_shader_banks", 0) // max(node["array_count"], 1) * 512)
    waves, stack_bytes_per_wave = (waves or cu_count * 40), 8
  else:
    waves, stack_bytes_per_wave = cu_count * 32, 12
  control_stack = round_up(CONTEXT_SAVE_HEADER_BYTES + waves * stack_bytes_per_wave + 8, PAGE)
  per_cu = VGPR_BYTES_PER_CU[arch] + SGPR_BYTES_PER_CU + (node["lds_size_in_kb"] << 10) + HWREG_BYTES_PER_CU
  debugger = round_up(waves * DEBUGGER_BYTES_PER_WAVE, DEBUGGER_ALIGNMENT)
  return control_stack + round_up(cu_count * per_cu, PAGE), control_stack, debugger


class AQLQueue:
  """The compute queue: AQL packets in, kernels and PM4 indirect buffers run by the CP."""

  def __init__(self, kernel: KernelInterface, device_kfd: KFD, memory: GPUMemory, node: GPUNode, arch: str,
               doorbells: Doorbells, inactive_signal: Allocation):
    self.kernel, self.kfd = kernel, device_kfd
    self.entries = AQL_RING_PACKETS
    self.ring = memory.gtt(self.entries * packets.AQL_PACKET_BYTES)
    self.ring_words = self.ring.host.view(np.uint32)
    # every slot starts INVALID: the CP stops at a packet until its producer writes the header
    self.ring_words[::packets.AQL_PACKET_BYTES // 4] = hsa.HSA_PACKET_TYPE_INVALID
    self.state_memory = memory.gtt(ctypes.sizeof(hsa.amd_queue_t))
    self.state = hsa.amd_queue_t.from_address(self.state_memory.address)
    self.eop = memory.vram(EOP_BUFFER_BYTES)
    save_bytes, control_stack, debugger = context_save_sizes(node, arch)
    self.context_save = memory.gtt((save_bytes + debugger) * node.xcc_count)
    self.inactive = hsa.amd_signal_t.from_address(inactive_signal.address)
    self._fill_state(node, memory, inactive_signal)
    state = self.state_memory.address
    created = create_queue(
      device_kfd, node, queue_type=kfd.KFD_IOC_QUEUE_TYPE_COMPUTE_AQL, ring_base_address=self.ring.address,
      ring_size=self.entries * packets.AQL_PACKET_BYTES,
      write_pointer_address=state + hsa.amd_queue_t.write_dispatch_id.offset,
      read_pointer_address=state + hsa.amd_queue_t.read_dispatch_id.offset,
      eop_buffer_address=self.eop.address, eop_buffer_size=self.eop.nbytes,
      ctx_save_restore_address=self.context_save.address, ctx_save_restore_size=save_bytes,
      ctl_stack_size=control_stack)
    self.queue_id = created.queue_id
    self.doorbell = doorbells.address(created.doorbell_offset)
    self.state.hsa_queue.id = created.queue_id
    self.write_index = 0

  def _fill_state(self, node: GPUNode, memory: GPUMemory, inactive_signal: Allocation) -> None:
    state = self.state
    state.hsa_queue.type = hsa.HSA_QUEUE_TYPE_SINGLE
    state.hsa_queue.features = hsa.HSA_QUEUE_FEATURE_KERNEL_DISPATCH
    state.hsa_queue.base_address = self.ring.address
    state.hsa_queue.size = self.entries
    state.read_dispatch_id_field_base_byte_offset = hsa.amd_queue_t.read_dispatch_id.offset
    state.group_segment_aperture_base_hi = memory.lds_base >> 32
    state.private_segment_aperture_base_hi = memory.scratch_base >> 32
    state.max_cu_id = node.compute_units - 1
    state.max_wave_id = node.properties.get("max_waves_per_simd", 1) * node.properties.get("simd_per_cu", 1) - 1
    state.queue_properties = hsa.AMD_QUEUE_PROPERTIES_IS_PTR64
    state.queue_inactive_signal.handle = inactive_signal.address

  @property
  def read_index(self) -> int:
    return self.state.read_dispatch_id

  def set_scratch(self, scratch: Allocation, lane_bytes: int, tmpring_size: int) -> None:
    """Point the CP at scratch memory (it reads these fields when a dispatch needs private segment memory). gfx11 and
    gfx940+ have architected flat scratch: kernels reach scratch through the base the CP programs, not through the
    resource descriptor, which is filled with the base and size for the kernels of other chips."""
    state = self.state
    state.scratch_backing_memory_location = scratch.address
    state.scratch_backing_memory_byte_size = scratch.nbytes
    state.scratch_wave64_lane_byte_size = lane_bytes
    state.compute_tmpring_size = tmpring_size
    state.scratch_resource_descriptor[:] = [scratch.address & 0xFFFFFFFF, (scratch.address >> 32) & 0xFFFF,
                                            min(scratch.nbytes, 0xFFFFFFFF), 0]

  def error_code(self) -> int:
    """The CP's queue error code (0 while the queue runs)."""
    return self.inactive.value

  def submit(self, packet_list: list[ctypes.Structure], check: Callable[[], None]) -> tuple[int, int]:
    """Write the packets and ring the doorbell; returns the range of their indices [first, last]."""
    first = self.write_index
    for packet in packet_list:
      wait_for_room("AQL", lambda: self.entries - (self.write_index - self.read_index), 1, check)
      self._write(self.write_index % self.entries, packet)
      self.write_index += 1
    self.state.write_dispatch_id = self.write_index
    self.kernel.write64(self.doorbell, self.write_index - 1)
    return first, self.write_index - 1

  def _write(self, slot: int, packet: ctypes.Structure) -> None:
    words = np.frombuffer(bytes(packet), dtype=np.uint32)
    start = slot * packets.AQL_PACKET_BYTES // 4
    self.ring_words[start + 1:start + 16] = words[1:]
    self.ring_words[start] = words[0]   # header and setup last, in one 32-bit store: the packet is now valid

  def destroy(self) -> None:
    self.kfd.call(kfd.AMDKFD_IOC_DESTROY_QUEUE, kfd.kfd_ioctl_destroy_queue_args(queue_id=self.queue_id))


class SDMAQueue:
  """The copy queue: SDMA packets in a ring of words."""

  def __init__(self, kernel: KernelInterface, device_kfd: KFD, memory: GPUMemory, node: GPUNode,
               family: packets.Family, doorbells: Doorbells):
    self.kernel, self.kfd, self.family = kernel, device_kfd, family
    self.ring = memory.gtt(SDMA_RING_BYTES)
    self.ring_words = self.ring.host.view(np.uint32)
    self.pointers = memory.gtt(PAGE)
    self.pointer_words = self.pointers.host.view(np.uint64)   # [read pointer, write pointer], bytes
    created = create_queue(device_kfd, node, queue_type=kfd.KFD_IOC_QUEUE_TYPE_SDMA,
                           ring_base_address=self.ring.address, ring_size=self.ring.nbytes,
                           read_pointer_address=self.pointers.address, write_pointer_address=self.pointers.address + 8)
    self.queue_id = created.queue_id
    self.doorbell = doorbells.address(created.doorbell_offset)
    self.write_pointer = 0

  @property
  def read_pointer(self) -> int:
    return int(self.pointer_words[0])

  def submit(self, words: list[int], check: Callable[[], None]) -> None:
    if len(words) * 4 > self.ring.nbytes // 2:
      raise ValueError(f"{len(words)} SDMA words do not fit half the {self.ring.nbytes}-byte ring; submit less at once")
    position = (self.write_pointer % self.ring.nbytes) // 4
    # packets that would run past the ring's end start at its beginning; NOPs fill the tail
    padding = len(self.ring_words) - position if position + len(words) > len(self.ring_words) else 0
    needed = 4 * (padding + len(words))
    wait_for_room("SDMA", lambda: self.ring.nbytes - (self.write_pointer - self.read_pointer), needed, check)
    if padding:
      self.ring_words[position:] = packets.sdma_nop(self.family)[0]
      self.write_pointer += 4 * padding
    start = (self.write_pointer % self.ring.nbytes) // 4
    self.ring_words[start:start + len(words)] = words
    self.write_pointer += 4 * len(words)
    self.pointer_words[1] = self.write_pointer
    self.kernel.write64(self.doorbell, self.write_pointer)

  def destroy(self) -> None:
    self.kfd.call(kfd.AMDKFD_IOC_DESTROY_QUEUE, kfd.kfd_ioctl_destroy_queue_args(queue_id=self.queue_id))
