"""Channels: pushbuffer method encoding, GPFIFO rings with their USERD, error notifiers, and the channel group
(TSG) that holds a compute channel and a copy channel (docs/nv-driver-notes.md 5 and 6).

A channel's commands are 32-bit pushbuffer words: a method header (incrementing: `SEC_OP=1 | count | subchannel |
method >> 2`) followed by its data words. Host methods (semaphores, WFI, membar) work on every subchannel; the
compute class sits on subchannel 1, the copy engine on subchannel 4. A submission is one GPFIFO entry pointing at a
pushbuffer segment; writing GPPut in USERD and the channel's token to the usermode doorbell makes the GPU fetch it.

Both channels live in one TSG on the graphics runlist (the copy channel runs on the GR copy engine): two GPFIFO
channels rather than one with both engines bound, as NVIDIA's and public drivers do.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from rawgrad.autogen.nv import nv_classes as classes
from rawgrad.autogen.nv import nv_rm as rm
from rawgrad.drivers.nv.gpu import NVGPU
from rawgrad.drivers.nv.memory import Allocation
from rawgrad.drivers.nv.rm import class_name
from rawgrad.drivers.nv.rm import field as bits

SUBCHANNEL_HOST, SUBCHANNEL_COMPUTE, SUBCHANNEL_COPY = 0, classes.NVA06F_SUBCHANNEL_COMPUTE, \
  classes.NVA06F_SUBCHANNEL_COPY_ENGINE
GPFIFO_ENTRIES = 4096            # a power of two (GP_BASE_HI_LIMIT2 is log2 of it)
USERD_BYTES = 512
USERD_GP_GET, USERD_GP_PUT = 0x88 // 4, 0x8C // 4   # word indices in USERD (dev_ram.h NV_RAMUSERD_GP_GET/PUT)
CHANNEL_MEMORY_BYTES = 2 << 20   # both rings and both USERDs, one contiguous video memory object
UVM_CHANNEL_BYTES = 64 << 20     # VA UVM maps each channel's RM-owned context buffers into
MAX_SEGMENT_WORDS = (1 << 21) - 1
NOTIFIER_BYTES = 4096

# host (GPFIFO class) methods and fields: the same offsets on Ampere (C56F) and Hopper (C86F)
SEM_ADDR_LO, SEM_EXECUTE, WFI, MEM_OP_A = classes.NVC56F_SEM_ADDR_LO, classes.NVC56F_SEM_EXECUTE, classes.NVC56F_WFI, \
  classes.NVC56F_MEM_OP_A
SEM_RELEASE = (bits(classes.NVC56F_SEM_EXECUTE_OPERATION, classes.NVC56F_SEM_EXECUTE_OPERATION_RELEASE)
               | bits(classes.NVC56F_SEM_EXECUTE_RELEASE_WFI, classes.NVC56F_SEM_EXECUTE_RELEASE_WFI_EN)
               | bits(classes.NVC56F_SEM_EXECUTE_PAYLOAD_SIZE, classes.NVC56F_SEM_EXECUTE_PAYLOAD_SIZE_64BIT)
               | bits(classes.NVC56F_SEM_EXECUTE_RELEASE_TIMESTAMP, classes.NVC56F_SEM_EXECUTE_RELEASE_TIMESTAMP_EN))
SEM_ACQUIRE_GEQ = (bits(classes.NVC56F_SEM_EXECUTE_OPERATION, classes.NVC56F_SEM_EXECUTE_OPERATION_ACQ_CIRC_GEQ)
                   | bits(classes.NVC56F_SEM_EXECUTE_ACQUIRE_SWITCH_TSG,
                          classes.NVC56F_SEM_EXECUTE_ACQUIRE_SWITCH_TSG_EN)
                   | bits(classes.NVC56F_SEM_EXECUTE_PAYLOAD_SIZE, classes.NVC56F_SEM_EXECUTE_PAYLOAD_SIZE_64BIT))
MEMBAR_SYS = (bits(classes.NVC56F_MEM_OP_C_MEMBAR_TYPE, classes.NVC56F_MEM_OP_C_MEMBAR_TYPE_SYS_MEMBAR),
              bits(classes.NVC56F_MEM_OP_D_OPERATION, classes.NVC56F_MEM_OP_D_OPERATION_MEMBAR))

# robust-channel error codes an error notifier reports (nverror.h; the kernel log calls them Xid N)
XID_NAMES = {13: "ROBUST_CHANNEL_GR_EXCEPTION (an SM exception: illegal address, instruction or launch)",
             31: "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT (a GPU access to unmapped memory)",
             32: "ROBUST_CHANNEL_PBDMA_ERROR (a bad method, GPFIFO entry or semaphore)",
             43: "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", 45: "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL (channel torn down)",
             48: "ROBUST_CHANNEL_GPU_ECC_DBE", 69: "ROBUST_CHANNEL_GR_CLASS_ERROR (a method the class does not know)",
             79: "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", 94: "ROBUST_CHANNEL_CONTAINED_ERROR",
             95: "ROBUST_CHANNEL_UNCONTAINED_ERROR"}


def xid_name(code: int) -> str:
  if 39 <= code <= 41 or code in (70, 71, 72, 75, 76, 77, 85):
    return f"ROBUST_CHANNEL_CE_ERROR (copy engine, Xid {code})"
  return f"{XID_NAMES.get(code, 'robust-channel error')} (Xid {code})"


# *** pushbuffers ***

def method_header(subchannel: int, method: int, count: int) -> int:
  """An incrementing method header: `count` data words follow, to method, method + 4, ..."""
  if not 0 < count <= 0x1FFF: raise ValueError(f"a method header carries 1..8191 data words, not {count}")
  if method % 4 or method >= 1 << 14: raise ValueError(f"method address {method:#x} is not a dword address < 0x4000")
  return (bits(classes.NVC36F_DMA_SEC_OP, classes.NVC36F_DMA_SEC_OP_INC_METHOD)
          | bits(classes.NVC36F_DMA_METHOD_COUNT, count) | bits(classes.NVC36F_DMA_METHOD_SUBCHANNEL, subchannel)
          | bits(classes.NVC36F_DMA_METHOD_ADDRESS, method >> 2))


@dataclass
class Pushbuffer:
  """Method words for one channel, built in order."""
  words: list[int] = field(default_factory=list)

  def method(self, subchannel: int, method: int, *data: int) -> int:
    """Append a method with its data; returns the index of its first data word (to patch later)."""
    self.words.append(method_header(subchannel, method, len(data)))
    self.words.extend(word & 0xFFFFFFFF for word in data)
    return len(self.words) - len(data)

  def release(self, address: int, value: int) -> None:
    """After everything before it is done (RELEASE_WFI), write the 64-bit value at address and the GPU's clock (ns)
    at address + 8 (the timestamp is written first). The address must be 16-byte aligned."""
    if address % 16:
      raise ValueError(f"a semaphore released with a timestamp needs 16-byte alignment, not {address:#x}")
    self.method(SUBCHANNEL_HOST, SEM_ADDR_LO, address & 0xFFFFFFFF, address >> 32, value & 0xFFFFFFFF,
                (value >> 32) & 0xFFFFFFFF, SEM_RELEASE)

  def acquire(self, address: int, value: int) -> None:
    """Stall the channel until the 64-bit value at address is at least `value` (as a wrapping difference)."""
    if address % 8: raise ValueError(f"a 64-bit semaphore needs 8-byte alignment, not {address:#x}")
    self.method(SUBCHANNEL_HOST, SEM_ADDR_LO, address & 0xFFFFFFFF, address >> 32, value & 0xFFFFFFFF,
                (value >> 32) & 0xFFFFFFFF, SEM_ACQUIRE_GEQ)

  def wait_for_idle(self) -> None:
    self.method(SUBCHANNEL_HOST, WFI, bits(classes.NVC56F_WFI_SCOPE, classes.NVC56F_WFI_SCOPE_ALL))

  def membar(self) -> None:
    """A system memory barrier: earlier writes are visible to the host and to other engines."""
    self.method(SUBCHANNEL_HOST, MEM_OP_A, 0, 0, *MEMBAR_SYS)

  def array(self) -> np.ndarray:
    return np.array(self.words, dtype=np.uint32)


def gpfifo_entry(address: int, dwords: int) -> int:
  """A GPFIFO entry fetching `dwords` pushbuffer words at `address` (main level, no sync)."""
  if address % 4 or address >= 1 << 40:
    raise ValueError(f"a pushbuffer segment at {address:#x} must be dword aligned and below 2^40")
  if not 0 < dwords <= MAX_SEGMENT_WORDS: raise ValueError(f"a pushbuffer segment of {dwords} words (1..2^21-1)")
  entry0 = bits(classes.NVC86F_GP_ENTRY0_GET, (address & 0xFFFFFFFF) >> 2)
  entry1 = bits(classes.NVC86F_GP_ENTRY1_GET_HI, address >> 32) | bits(classes.NVC86F_GP_ENTRY1_LENGTH, dwords)
  return entry0 | entry1 << 32


# *** channels ***

@dataclass
class Submission:
  value: int                 # the timeline value that marks it done
  kernels: tuple[str, ...]   # the kernels it launches, to name in errors


class Channel:
  """One GPFIFO channel: its ring and USERD (video memory the CPU maps), its error notifier, its doorbell token."""

  def __init__(self, gpu: NVGPU, name: str, handle: int, engine_class: int, ring: np.ndarray, ring_address: int,
               userd: np.ndarray, token: int, notifier: Allocation):
    self.gpu, self.name, self.handle, self.engine_class = gpu, name, handle, engine_class
    self.ring, self.ring_address, self.userd, self.token, self.notifier = ring, ring_address, userd, token, notifier
    self.put = 0
    self.entry_values = [0] * len(ring)   # the timeline value that frees each entry
    self.submissions: list[Submission] = []

  def submit(self, segment_address: int, dwords: int, value: int, kernels: tuple[str, ...],
             wait_until: Callable[[int], None]) -> None:
    """Point the next GPFIFO entry at a pushbuffer segment and ring the doorbell."""
    slot = self.put % len(self.ring)
    wait_until(self.entry_values[slot])
    self.ring[slot] = gpfifo_entry(segment_address, dwords)
    self.entry_values[slot] = value
    self.put += 1
    # the ring and USERD are write-combined BAR1 memory: reading back makes the posted writes land before the
    # doorbell (NVIDIA's own order: GP entry, flush, GPPut, barrier, doorbell); the doorbell itself is uncached
    int(self.ring[slot])
    self.userd[USERD_GP_PUT] = self.put % len(self.ring)
    int(self.userd[USERD_GP_PUT])
    self.submissions.append(Submission(value, kernels))
    if len(self.submissions) > 64: del self.submissions[:32]
    self.gpu.doorbell(self.token)

  def error(self) -> tuple[int, int, int] | None:
    """(Xid code, engine type, GPU time) from the error notifier, or None while the channel is healthy."""
    words = self.notifier.host[:16].view(np.uint32)
    if int(words[3]) >> 16 == 0: return None
    return int(words[2]), int(words[3]) & 0xFFFF, (int(words[0]) << 32) | int(words[1])

  def in_flight(self, completed: int) -> list[Submission]:
    return [s for s in self.submissions if s.value > completed]

  def describe(self, completed: int) -> str:
    get, put = int(self.userd[USERD_GP_GET]), int(self.userd[USERD_GP_PUT])
    waiting = self.in_flight(completed)
    kernels = sorted({k for s in waiting for k in s.kernels})
    return (f"{self.name} channel: GPGet {get}, GPPut {put}, {len(waiting)} submission(s) not finished"
            + (f" (kernels {', '.join(kernels)})" if kernels else ""))


class ChannelGroup:
  """A TSG on the graphics runlist holding a compute channel and a copy channel, scheduled and ready."""

  def __init__(self, gpu: NVGPU):
    self.gpu = gpu
    client, memory = gpu.client, gpu.memory
    self.notifiers = {name: memory.system(NOTIFIER_BYTES) for name in ("group", "compute", "copy")}
    for notifier in self.notifiers.values(): notifier.host[:] = 0
    self.handle = client.alloc(gpu.device, rm.KEPLER_CHANNEL_GROUP_A, rm.NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS(
      hObjectError=self.notifiers["group"].handle, hVASpace=gpu.vaspace, engineType=rm.NV2080_ENGINE_TYPE_GR0))
    self.context_share = client.alloc(self.handle, rm.FERMI_CONTEXT_SHARE_A, rm.NV_CTXSHARE_ALLOCATION_PARAMETERS(
      hVASpace=gpu.vaspace, flags=rm.NV_CTXSHARE_ALLOCATION_FLAGS_SUBCONTEXT_ASYNC))
    self.memory = memory.video(CHANNEL_MEMORY_BYTES, cpu_access=True, contiguous=True)
    self.memory.host[:] = 0
    half = CHANNEL_MEMORY_BYTES // 2
    self.compute = self._channel("compute", 0, gpu.info.compute_class)
    self.copy = self._channel("copy", half, gpu.info.copy_class)
    client.control(self.handle, rm.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE, rm.NVA06C_CTRL_GPFIFO_SCHEDULE_PARAMS(bEnable=1))

  def _channel(self, name: str, offset: int, engine_class: int) -> Channel:
    gpu, client = self.gpu, self.gpu.client
    ring_address = self.memory.address + offset
    userd_offset = offset + GPFIFO_ENTRIES * 8
    params = rm.NV_CHANNEL_ALLOC_PARAMS(
      hObjectError=self.notifiers[name].handle, hObjectBuffer=self.memory.handle, gpFifoOffset=ring_address,
      gpFifoEntries=GPFIFO_ENTRIES, hContextShare=self.context_share)
    params.hUserdMemory[0] = self.memory.handle
    params.userdOffset[0] = userd_offset
    handle = client.alloc(self.handle, gpu.info.gpfifo_class, params, what=f"the {name} channel")
    client.alloc(handle, engine_class, what=f"{class_name(engine_class)} on the {name} channel")
    token = client.control(handle, rm.NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN,
                           rm.NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN_PARAMS()).workSubmitToken
    uvm_range = gpu.memory.arena.allocate(UVM_CHANNEL_BYTES, 2 << 20)
    gpu.uvm.register_channel(gpu.info.uuid, gpu.control_fd, client.handle, handle, uvm_range, UVM_CHANNEL_BYTES)
    ring = self.memory.host[offset:offset + GPFIFO_ENTRIES * 8].view(np.uint64)
    userd = self.memory.host[userd_offset:userd_offset + USERD_BYTES].view(np.uint32)
    return Channel(gpu, name, handle, engine_class, ring, ring_address, userd, token, self.notifiers[name])

