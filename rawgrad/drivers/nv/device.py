"""NVDevice: an NVIDIA GPU behind the HCQ interface, driven through RM and UVM with no vendor runtime.

Memory: buffers are video memory the CPU does not map (copies go through pinned staging and the copy engine);
pinned host memory (signals, argument blocks, pushbuffers, QMDs, constant banks, staging) sits at the same address
for the CPU and the GPU. Queues become pushbuffer words: `exec` a QMD launch on the compute channel, `copy` the copy
engine on the copy channel, `signal`/`timestamp` a host semaphore release that writes the value and the GPU clock,
`wait` a semaphore acquire. A launch's QMD and the driver's constants sit in the prefix HCQ reserves before each
argument block (kernargs_prefix_bytes), so constant bank 0 is the driver's constants followed by the argument block
itself: the QMD is written once, when the queue is encoded, and a replayed queue reads the arguments as they are
patched. (A kernel whose parameters are not the 8-byte slots rawgrad passes gets its QMD and a copied constant bank
written into a ring at submit instead.)
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from rawgrad.autogen.nv import nv_classes as classes
from rawgrad.compiler.render.llvmir import NVPTXRenderer
from rawgrad.compiler.target import gpu_target
from rawgrad.drivers.nv.channel import (SUBCHANNEL_COMPUTE, SUBCHANNEL_COPY, Channel, ChannelGroup, Pushbuffer,
                                        xid_name)
from rawgrad.drivers.nv.cubin import KernelFacts, read_kernel
from rawgrad.drivers.nv.gpu import NVGPU, GPUInfo
from rawgrad.drivers.nv.memory import Block, SlabHeap
from rawgrad.drivers.nv.rm import RMError
from rawgrad.drivers.nv.qmd import (QMD_ALIGNMENT, Launch, build_qmd, driver_constants, qmd_format, stack_bytes)
from rawgrad.drivers.os import KernelInterface, host_view, kernel_interface
from rawgrad.helpers import round_up
from rawgrad.runtime.compile import PTXCompiler, split_embedded_program
from rawgrad.runtime.device import Allocator
from rawgrad.runtime.hcq import COMPUTE, COPY, DeviceFault, DeviceMemory, HCQDevice, HostRing, HWQueue

PUSHBUFFER_BYTES = 4 << 20
QMD_SLOT_BYTES = 512              # a QMD (384 bytes on Hopper), then constant bank 0 at the next 256-byte boundary
CODE_PREFETCH_BYTES = 4096        # instruction prefetch reads past a kernel's end: keep it mapped
COPY_CHUNK_BYTES = 1 << 31        # LINE_LENGTH_IN is 32 bits
SETUP_TIMEOUT_S = 10.0
# the windows through which generic addresses reach shared and local memory: 4 GiB aligned, far from every
# allocation (our arena is below 2^40)
SHARED_WINDOW, LOCAL_WINDOW = 0x7000_0000_0000, 0x7001_0000_0000
# how SEND_SIGNALING_PCAS2_B starts a launch: an INVALIDATE variant, as QMD memory is reused (NVK uses this one,
# libcuda on an H100 INVALIDATE_PREFETCH_COPY_SCHEDULE; this one runs on the H100, docs/hardware.md)
PCAS_ACTION = classes.NVCBC0_SEND_SIGNALING_PCAS2_B_PCAS_ACTION_INVALIDATE_COPY_SCHEDULE


def compute_method(compute_class: int, name: str) -> int:
  """A compute-class method's address (identical from Ampere to Hopper; looked up under the chip's own class)."""
  return getattr(classes, f"NV{compute_class:04X}_{name}")


def copy_method(name: str) -> int:
  return getattr(classes, f"NVC8B5_{name}")  # the copy classes share their method offsets (notes 6.4)


# *** programs ***

class NVProgram:
  """A kernel uploaded to video memory: its code (the cubin's .text) and the facts its launches need."""

  def __init__(self, device: NVDevice, name: str, lib: bytes):
    cubin, program_text = split_embedded_program(lib)
    self.device, self.name = device, name
    self.facts: KernelFacts = read_kernel(cubin, name)
    check_argument_layout(self.facts, device.parameter_base)
    code = self.facts.code
    self.memory = device.video_heap.alloc(len(code) + CODE_PREFETCH_BYTES)
    device.copyin(DeviceMemory(self.memory.address, len(code), None, self.memory), memoryview(code))
    self.address = self.memory.address + self.facts.entry
    if program_text is not None:   # an emulated GPU runs this program when a QMD names the entry point
      device.kernel.register_program(self.address, code[self.facts.entry:], program_text, self.facts)
    device.ensure_local_memory(stack_bytes(self.facts.frame_bytes))

  def __repr__(self) -> str:
    return f"<NVProgram {self.name} at {self.address:#x}, {self.facts.registers} registers>"


def check_argument_layout(facts: KernelFacts, parameter_base: int) -> None:
  """A launch's constant bank 0 is the driver's constants followed by the argument block itself, so parameter n must
  be the 8 bytes at 8*n after the chip's parameter base (as the NVPTX renderer lays them out)."""
  if facts.parameter_base != parameter_base:
    raise ValueError(f"kernel {facts.name}: parameters start at {facts.parameter_base:#x} of constant bank 0; "
                     f"this GPU's driver constants end at {parameter_base:#x}")
  for parameter in facts.parameters:
    if (parameter.size, parameter.offset) != (8, 8 * parameter.ordinal):
      raise ValueError(f"kernel {facts.name}: parameter {parameter.ordinal} is {parameter.size} bytes at offset "
                       f"{parameter.offset}; rawgrad passes parameter n as the 8 bytes at offset 8*n")


# *** encoded queues ***

@dataclass
class EncodedQueue:
  engine: str
  words: np.ndarray
  kernels: tuple[str, ...] = ()   # every kernel the queue launches, for fault messages


class NVAllocator(Allocator):
  """Video memory from the device's heap; a piece goes back to the heap once no view of it is left."""

  def __init__(self, heap: SlabHeap):
    super().__init__()
    self.heap = heap

  def _alloc(self, nbytes: int) -> DeviceMemory:
    block = self.heap.alloc(nbytes)
    return DeviceMemory(block.address, nbytes, None, block)

  def _free(self, memory: DeviceMemory, nbytes: int) -> None:
    del memory  # its block's finalizer returns it


# *** the device ***

# where kernel parameters start in constant bank 0, by architecture (notes 7: the bytes before are the driver's)
PARAMETER_BASE = {"sm_90": 0x210, "sm_89": 0x160, "sm_86": 0x160, "sm_80": 0x160}


class NVDevice(HCQDevice):
  timestamp_bytes = 16   # a semaphore release writes the payload, then the GPU clock at +8
  kernargs_alignment = QMD_ALIGNMENT

  def __init__(self, name: str, kernel: KernelInterface | None = None):
    self.kernel = kernel or kernel_interface("nv")
    index = int(name.split(":")[1]) if ":" in name else 0
    self.gpu = NVGPU(self.kernel, index)
    self.fault: str | None = None
    try:
      self._open(name)
    except BaseException:
      self.gpu.close()   # a half-opened device gives its objects and fds back
      raise

  def _open(self, name: str) -> None:
    memory = self.gpu.memory
    self.video_heap = SlabHeap(memory.video, memory.free, self._completed, self._submitted)
    self.host_heap = SlabHeap(memory.host, memory.free, self._completed, self._submitted)
    self.group = ChannelGroup(self.gpu)
    self.channels: dict[str, Channel] = {COMPUTE: self.group.compute, COPY: self.group.copy}
    self.clock_offset_ns = 0   # calibrated once the channels run (below)
    self.qmd_format = qmd_format(self.gpu.info.compute_class)
    self.local_memory: Block | None = None
    self.local_bytes_per_thread = 0
    self.setup: dict[str, list[int]] = {COMPUTE: self._compute_setup(), COPY: self._copy_setup()}
    target = gpu_target(self.gpu.info.arch)
    self.parameter_base = PARAMETER_BASE[self.gpu.info.arch]
    self.kernargs_prefix_bytes = QMD_SLOT_BYTES + self.parameter_base   # the QMD, then constant bank 0
    embed = self.kernel.runs_programs   # an emulated GPU runs the linear program carried after the cubin
    super().__init__(name, target, NVAllocator(self.video_heap), PTXCompiler(target, embed_program=embed),
                     NVPTXRenderer(target, embed_program=embed), NVProgram)
    self.allocator.capacity_bytes = self.gpu.info.video_memory_bytes or None   # no allocation can be larger
    self.pushbuffers = {engine: HostRing(self, PUSHBUFFER_BYTES, f"{engine} pushbuffer") for engine in self.channels}
    for engine in self.channels: self.submit(HWQueue(), engine)   # binds the engine classes
    self.synchronize(SETUP_TIMEOUT_S)
    self.clock_offset_ns = self._calibrate_clock()

  def _calibrate_clock(self) -> int:
    """host monotonic ns - GPU ns: asked of RM, else measured from a semaphore's timestamp between two host times."""
    try:
      return self.gpu.clock_offset_ns()
    except RMError:
      best = None
      for _ in range(5):
        before = time.monotonic_ns()
        self.synchronize_after(self.submit(HWQueue(), COMPUTE))
        after = time.monotonic_ns()
        if best is None or after - before < best[0]:
          best = (after - before, (before + after) // 2 - int(self.timeline_signal.words[1]))
      return best[1]

  @property
  def info(self) -> GPUInfo:
    return self.gpu.info

  def close(self, timeout_s: float = 5.0) -> None:
    """Wait for the GPU (unless a fault stopped it) and let it go; the device is unusable afterwards."""
    try:
      if self.fault is None: self.synchronize(timeout_s)
    finally:
      self.fault = f"{self.name} is closed"
      self.gpu.close()

  # ** memory

  def host_memory(self, nbytes: int) -> DeviceMemory:
    block = self.host_heap.alloc(nbytes)
    return DeviceMemory(block.address, nbytes, block.host, block)

  def ensure_local_memory(self, bytes_per_thread: int) -> None:
    """Back the local window (stacks, spills) for kernels needing up to bytes_per_thread; the next compute submission
    points the engine at it. Sizing per TPC as public drivers do: every warp slot of its SMs gets room."""
    if bytes_per_thread <= self.local_bytes_per_thread: return
    info = self.gpu.info
    per_thread = round_up(bytes_per_thread, 32)
    per_tpc = round_up(round_up(per_thread * 32, 0x200) * info.max_warps_per_sm * info.sms_per_tpc, 0x8000)
    # a TPC finds its part by its hardware id, which counts the design's TPCs (an H100 SXM has 66 of 72 enabled)
    self.local_memory = self.video_heap.alloc(round_up(per_tpc * info.design_tpc_count, 0x20000))
    self.local_bytes_per_thread = per_thread
    address, compute = self.local_memory.address, self.gpu.info.compute_class
    setup = Pushbuffer()
    setup.method(SUBCHANNEL_COMPUTE, compute_method(compute, "SET_SHADER_LOCAL_MEMORY_A"), address >> 32,
                 address & 0xFFFFFFFF)
    setup.method(SUBCHANNEL_COMPUTE, compute_method(compute, "SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_A"), per_tpc >> 32,
                 per_tpc & 0xFFFFFFFF, 0xFF)
    self.setup[COMPUTE] = self.setup.get(COMPUTE, []) + setup.words

  def _compute_setup(self) -> list[int]:
    compute = self.gpu.info.compute_class
    setup = Pushbuffer()
    setup.method(SUBCHANNEL_COMPUTE, classes.NVC86F_SET_OBJECT, compute)
    setup.method(SUBCHANNEL_COMPUTE, compute_method(compute, "SET_SHADER_SHARED_MEMORY_WINDOW_A"),
                 SHARED_WINDOW >> 32, SHARED_WINDOW & 0xFFFFFFFF)
    setup.method(SUBCHANNEL_COMPUTE, compute_method(compute, "SET_SHADER_LOCAL_MEMORY_WINDOW_A"),
                 LOCAL_WINDOW >> 32, LOCAL_WINDOW & 0xFFFFFFFF)
    return setup.words

  def _copy_setup(self) -> list[int]:
    setup = Pushbuffer()
    setup.method(SUBCHANNEL_COPY, classes.NVC86F_SET_OBJECT, self.gpu.info.copy_class)
    return setup.words

  # ** encoding

  def encode(self, queue: HWQueue, engine: str) -> EncodedQueue:
    pushbuffer, kernels = Pushbuffer(), []
    for command in queue.commands:
      operands = command.operands
      if command.kind == "exec":
        if engine != COMPUTE: raise ValueError(f"{self.name}: kernels run on the {COMPUTE} engine, not {engine}")
        if kernels: pushbuffer.wait_for_idle()   # the next kernel may read what this one wrote
        kernels.append(operands[0].name)
        self._encode_launch(pushbuffer, *operands)
      elif command.kind == "copy":
        if engine != COPY: raise ValueError(f"{self.name}: copies run on the {COPY} engine, not {engine}")
        self._encode_copy(pushbuffer, *operands)
      elif command.kind == "signal": pushbuffer.release(operands[0].address, operands[1])
      elif command.kind == "wait": pushbuffer.acquire(operands[0].address, operands[1])
      elif command.kind == "timestamp": pushbuffer.release(self._timestamp_slot(operands[0]), 0)
      elif command.kind == "memory_barrier":
        pushbuffer.wait_for_idle()
        pushbuffer.membar()
      else: raise ValueError(f"the NV queue has no command {command.kind!r}")
    return EncodedQueue(engine, pushbuffer.array(), tuple(kernels))

  def _timestamp_slot(self, address: int) -> int:
    if address % self.timestamp_bytes:
      raise ValueError(f"{self.name}: a timestamp slot is {self.timestamp_bytes} bytes and aligned to them; "
                       f"{address:#x} is not")
    return address

  def _encode_launch(self, pushbuffer: Pushbuffer, program: NVProgram, kernargs: int, grid: tuple[int, int, int],
                     block: tuple[int, int, int]) -> None:
    """SEND_PCAS_A with the launch's QMD, written now into the argument block's prefix: the QMD, then constant bank
    0 as the driver's constants followed by the argument block in place."""
    if not isinstance(program, NVProgram):
      raise TypeError(f"{self.name} launches NVProgram kernels, not {type(program).__name__}")
    qmd_address = kernargs - self.kernargs_prefix_bytes
    bank_address = qmd_address + QMD_SLOT_BYTES
    launch = Launch(program.facts, program.address, tuple(grid), tuple(block), bank_address, SHARED_WINDOW,
                    LOCAL_WINDOW)
    qmd = build_qmd(self.qmd_format, launch)
    host_view(qmd_address, len(qmd))[:] = np.frombuffer(qmd, dtype=np.uint8)
    host_view(bank_address, self.parameter_base)[:] = np.frombuffer(driver_constants(launch), dtype=np.uint8)
    compute = self.gpu.info.compute_class
    pushbuffer.method(SUBCHANNEL_COMPUTE, compute_method(compute, "SEND_PCAS_A"), qmd_address >> 8)
    pushbuffer.method(SUBCHANNEL_COMPUTE, compute_method(compute, "SEND_SIGNALING_PCAS2_B"), PCAS_ACTION)

  def _encode_copy(self, pushbuffer: Pushbuffer, dest: int, source: int, nbytes: int) -> None:
    """A linear copy, in pieces LINE_LENGTH_IN can hold; the first waits for earlier copies (non-pipelined)."""
    for start in range(0, nbytes, COPY_CHUNK_BYTES):
      length = min(COPY_CHUNK_BYTES, nbytes - start)
      pipelined = classes.NVC8B5_LAUNCH_DMA_DATA_TRANSFER_TYPE_PIPELINED if start else \
        classes.NVC8B5_LAUNCH_DMA_DATA_TRANSFER_TYPE_NON_PIPELINED
      launch = (pipelined << classes.NVC8B5_LAUNCH_DMA_DATA_TRANSFER_TYPE[1]
                | classes.NVC8B5_LAUNCH_DMA_SRC_MEMORY_LAYOUT_PITCH << classes.NVC8B5_LAUNCH_DMA_SRC_MEMORY_LAYOUT[1]
                | classes.NVC8B5_LAUNCH_DMA_DST_MEMORY_LAYOUT_PITCH << classes.NVC8B5_LAUNCH_DMA_DST_MEMORY_LAYOUT[1]
                | 1 << classes.NVC8B5_LAUNCH_DMA_DISABLE_PLC[1])
      pushbuffer.method(SUBCHANNEL_COPY, copy_method("OFFSET_IN_UPPER"), (source + start) >> 32,
                        (source + start) & 0xFFFFFFFF, (dest + start) >> 32, (dest + start) & 0xFFFFFFFF)
      pushbuffer.method(SUBCHANNEL_COPY, copy_method("LINE_LENGTH_IN"), length)
      pushbuffer.method(SUBCHANNEL_COPY, copy_method("LAUNCH_DMA"), launch)

  # ** submitting

  def _submit(self, encoded: EncodedQueue, engine: str) -> None:
    self.check_faults()
    if encoded.engine != engine:
      raise ValueError(f"a queue encoded for the {encoded.engine} engine was submitted to the {engine} engine")
    words = encoded.words
    setup = self.setup.pop(engine, None)
    if setup: words = np.concatenate([np.array(setup, dtype=np.uint32), words])
    if len(words) == 0: return
    segment = self.pushbuffers[engine].alloc(words.nbytes, alignment=4)
    segment.host[:] = words.view(np.uint8)
    self.channels[engine].submit(segment.address, len(words), self.timeline_value + 1, encoded.kernels,
                                 lambda value: self.timeline_signal.wait(value))

  # ** faults, waits and time

  def check_faults(self) -> None:
    if self.fault is not None: raise DeviceFault(self.fault)
    for channel in self.channels.values():
      if (error := channel.error()) is None: continue
      code, engine, _ = error
      unfinished = channel.in_flight(self._completed())
      kernels = sorted({kernel for submission in unfinished for kernel in submission.kernels})
      running = f" while running kernel(s) {', '.join(kernels)}" if kernels else ""
      self.fault = (f"{self.name} ({self.gpu.info.name}): the GPU stopped the {channel.name} channel with "
                    f"{xid_name(code)} on engine type {engine}{running} (timeline at {self._completed()} of "
                    f"{self.timeline_value}); the channel takes no more work: open the device again")
      raise DeviceFault(self.fault)

  def describe_state(self) -> str:
    completed = self._completed()
    return "; " + "; ".join(channel.describe(completed) for channel in self.channels.values())

  def timestamp_ns(self, ticks: int) -> int:
    return ticks + self.clock_offset_ns


def open_device(name: str) -> NVDevice:
  return NVDevice(name)
