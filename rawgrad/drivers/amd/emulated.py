"""An emulated amdkfd: the KFD ioctls of kernel 6.1 (interface 1.11) for one GPU, a sysfs topology, and a GPU that
runs what is submitted to it. `EMULATE=1` puts it behind the OS seam (drivers/os.py), so the AMD driver runs
unchanged without a GPU; `AMD_ARCH` picks the chip (gfx1100, an RX 7900 XTX, by default; gfx942, an MI300X). One
EmulatedKernel is one process's view of KFD: tests that want a fresh GPU make a fresh one.

What KFD checks, it checks the same way (kfd_chardev.c): an unknown ioctl number is ENOTTY; the argument is copied in
as long as the request's size field says and zero-extended to KFD's own structure, so a short argument leaves the
rest zero (KFD does not refuse a size; it trusts the number) - but a buffer smaller than that size would make the
kernel read past it, which here is EFAULT; a ring size that is not a power of two, a priority above 15, a queue
percentage above 100 are EINVAL; allocating needs ACQUIRE_VM first; a second render node for the same GPU is EBUSY;
freeing memory still mapped to the GPU is EBUSY. Beyond what 6.1 checks, it checks what newer KFD checks and what the
hardware would trip on: queue rings, pointers and save areas must be mapped to the GPU, and the context save area must
have the size the topology implies.

Memory: every buffer object is a memfd the emulator maps for itself; the driver's mmap of the render node at the
object's offset maps the same pages at the driver's address. The GPU reaches objects through this process's GPU page
tables (MAP_MEMORY_TO_GPU): anything else is a GPU memory fault, reported the way KFD reports one (the memory
exception event, with the address) and stopping the queue that faulted.

The GPU: a thread per queue (emulated_gpu.py), woken by a doorbell write, decodes AQL packets (kernel dispatch,
barrier-AND/OR, and the vendor-specific packet that runs a PM4 indirect buffer) or SDMA packets from the ring bytes.
Kernels run through the GPU program interpreter: the machine code cannot run here, so the program is found by the
SHA-256 of the code bytes at the dispatch's kernel descriptor, registered when the driver uploaded a code object that
carried its linear program.
"""
from __future__ import annotations

import bisect
import ctypes
import errno
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from rawgrad.autogen.amd import kfd
from rawgrad.drivers.amd.emulated_gpu import AQLEngine, MemoryFault, SDMAEngine, gpu_clock
from rawgrad.drivers.emulated_programs import PlacedPrograms
from rawgrad.drivers.os import (MAP_ANONYMOUS, MAP_FIXED, MAP_PRIVATE, MAP_SHARED, PROT_READ, PROT_WRITE,
                                KernelInterface, RealKernel, host_view, ioc_number, ioc_size)
from rawgrad.helpers import round_up

# *** the emulated chips ***

TOPOLOGY = "/sys/devices/virtual/kfd/kfd/topology"
GPU_ID, NODE = 0xBC6E, 1            # node 0 is the CPU
RENDER_MINOR = 128
FIRST_FAKE_FD = 1 << 21
KFD_VERSION = (1, 11)               # kfd_ioctl.h of kernel 6.1
PAGE = 4096
GPUVM_BASE, GPUVM_LIMIT = 0x3000, (1 << 47) - 1   # SVM_USER_BASE up to the 47-bit user half (kfd_flat_memory.c)
LDS_APERTURE, SCRATCH_APERTURE = 1 << 48, 2 << 48
DOORBELL_SLICE_BYTES = 8 * 1024
MMAP_TYPE_SHIFT, MMAP_GPU_ID_SHIFT = 62, 46
MMAP_DOORBELL, MMAP_EVENTS = 3 << MMAP_TYPE_SHIFT, 2 << MMAP_TYPE_SHIFT
UNSIGNALED_SLOT = (1 << 64) - 1
FIRST_OTHER_EVENT_ID = kfd.KFD_SIGNAL_EVENT_LIMIT   # events that are not signal events have no slot


@dataclass(frozen=True)
class Chip:
  arch: str
  gfx_target_version: int
  marketing_name: str
  device_id: int
  compute_units: int
  simd_per_cu: int
  array_count: int
  simd_arrays_per_engine: int
  max_waves_per_simd: int
  wave_front_size: int
  vram_bytes: int
  xcc_count: int = 1
  lds_kb: int = 64
  sdma_engines: int = 2


CHIPS = {
  "gfx1100": Chip("gfx1100", 110000, "AMD Radeon RX 7900 XTX (emulated)", 0x744C, compute_units=96, simd_per_cu=2,
                  array_count=12, simd_arrays_per_engine=2, max_waves_per_simd=16, wave_front_size=32,
                  vram_bytes=24 << 30),
  "gfx942": Chip("gfx942", 90402, "AMD Instinct MI300X (emulated)", 0x74A1, compute_units=304, simd_per_cu=4,
                 array_count=32, simd_arrays_per_engine=1, max_waves_per_simd=8, wave_front_size=64,
                 vram_bytes=192 << 30, xcc_count=8, sdma_engines=16),
}
VGPR_BYTES_PER_CU = {"gfx1100": 0x60000, "gfx942": 0x80000}


def chip_from_environment() -> Chip:
  arch = os.environ.get("AMD_ARCH", "gfx1100") or "gfx1100"
  if arch not in CHIPS:
    raise ValueError(f"AMD_ARCH={arch}: the emulated KFD has {', '.join(sorted(CHIPS))}")
  return CHIPS[arch]


def properties_text(values: dict[str, int]) -> str:
  return "".join(f"{name} {value}\n" for name, value in values.items())


def topology_files(chip: Chip) -> dict[str, str]:
  """The sysfs files KFD publishes for a machine with one CPU node and this GPU."""
  nodes = f"{TOPOLOGY}/nodes"
  cpu = {"cpu_cores_count": 16, "simd_count": 0, "mem_banks_count": 1, "caches_count": 0, "io_links_count": 1,
         "cpu_core_id_base": 0, "simd_id_base": 0, "gfx_target_version": 0, "drm_render_minor": 0}
  gpu = {"cpu_cores_count": 0, "simd_count": chip.compute_units * chip.simd_per_cu, "mem_banks_count": 1,
         "caches_count": 0, "io_links_count": 1, "cpu_core_id_base": 0, "simd_id_base": 0x80001000,
         "max_waves_per_simd": chip.max_waves_per_simd, "lds_size_in_kb": chip.lds_kb, "gds_size_in_kb": 0,
         "num_gws": 64, "wave_front_size": chip.wave_front_size, "array_count": chip.array_count,
         "simd_arrays_per_engine": chip.simd_arrays_per_engine,
         "cu_per_simd_array": chip.compute_units // chip.array_count, "simd_per_cu": chip.simd_per_cu,
         "max_slots_scratch_cu": 32, "gfx_target_version": chip.gfx_target_version, "vendor_id": 0x1002,
         "device_id": chip.device_id, "location_id": 0x300, "domain": 0, "drm_render_minor": RENDER_MINOR,
         "hive_id": 0, "num_sdma_engines": chip.sdma_engines, "num_sdma_xgmi_engines": 0,
         "num_sdma_queues_per_engine": 6, "num_cp_queues": 8, "max_engine_clk_fcompute": 2500, "local_mem_size": 0,
         "fw_version": 2000, "capability": 0, "sdma_fw_version": 20, "unique_id": 0x1234, "num_xcc": chip.xcc_count,
         "max_engine_clk_ccompute": 3000}
  return {f"{TOPOLOGY}/generation_id": "1\n", f"{TOPOLOGY}/system_properties": "platform_oem 0\nplatform_id 0\n",
          f"{nodes}/0/properties": properties_text(cpu), f"{nodes}/0/gpu_id": "0\n", f"{nodes}/0/name": "\n",
          f"{nodes}/0/mem_banks/0/properties": properties_text({"heap_type": 0, "size_in_bytes": 64 << 30}),
          f"{nodes}/{NODE}/properties": properties_text(gpu), f"{nodes}/{NODE}/gpu_id": f"{GPU_ID}\n",
          f"{nodes}/{NODE}/name": f"{chip.arch}\n",
          f"{nodes}/{NODE}/mem_banks/0/properties": properties_text({"heap_type": 1, "size_in_bytes": chip.vram_bytes,
                                                                    "flags": 0, "width": 4096})}


def context_save_bytes(chip: Chip) -> tuple[int, int]:
  """(context save area, control stack) bytes per compute die, as newer KFD computes them (kfd_queue.c)."""
  cu_count = chip.compute_units // chip.xcc_count
  gfx9 = chip.gfx_target_version < 100000
  waves = min(cu_count * 40, chip.array_count // chip.simd_arrays_per_engine * 512) if gfx9 else cu_count * 32
  control = round_up(40 + waves * (8 if gfx9 else 12) + 8, PAGE)
  per_cu = VGPR_BYTES_PER_CU[chip.arch] + 0x4000 + (chip.lds_kb << 10) + 0x1000
  return control + round_up(cu_count * per_cu, PAGE), control


# *** memory ***

@dataclass(eq=False)
class BufferObject:
  handle: int
  va: int
  size: int
  kind: str                 # "vram" or "gtt"
  flags: int
  fd: int                   # the memfd behind it
  address: int              # where the emulator maps it
  mmap_offset: int
  gpu_mapped: bool = False

  def view(self, va: int, nbytes: int) -> np.ndarray:
    return host_view(self.address + va - self.va, nbytes)


class GPUPageTables:
  """This process's GPU virtual address space: buffer objects mapped with MAP_MEMORY_TO_GPU. Readers take a
  snapshot, so the packet processors never lock against the ioctls that change it."""

  def __init__(self) -> None:
    self.starts: tuple[int, ...] = ()
    self.objects: tuple[BufferObject, ...] = ()

  def map(self, bo: BufferObject) -> None:
    objects = sorted([*self.objects, bo], key=lambda b: b.va)
    self.starts, self.objects = tuple(b.va for b in objects), tuple(objects)

  def unmap(self, bo: BufferObject) -> None:
    objects = [b for b in self.objects if b is not bo]
    self.starts, self.objects = tuple(b.va for b in objects), tuple(objects)

  def find(self, address: int, nbytes: int) -> BufferObject | None:
    starts, objects = self.starts, self.objects
    i = bisect.bisect_right(starts, address) - 1
    if i >= 0 and address + max(nbytes, 1) <= objects[i].va + objects[i].size: return objects[i]
    return None

  def resolve(self, address: int, nbytes: int, what: str = "access") -> np.ndarray:
    """The bytes at a GPU virtual address (a MemoryFault where nothing is mapped)."""
    bo = self.find(address, nbytes)
    if bo is None: raise MemoryFault(address, nbytes, what)
    return bo.view(address, nbytes)


# *** events ***

@dataclass(eq=False)
class Event:
  event_id: int
  event_type: int
  auto_reset: bool
  signaled: bool = False
  memory_fault: tuple[int, int] | None = None   # (address, gpu id) of a memory exception


@dataclass(eq=False)
class File:
  fd: int
  kind: str   # "kfd" or "render"


@dataclass
class ProcessDevice:
  """KFD's per-process state for the GPU: its VM, buffer objects, queues, events."""
  vm_fd: int | None = None
  objects: dict[int, BufferObject] = field(default_factory=dict)
  next_object: int = 1
  vram_used: int = 0
  queues: dict[int, Any] = field(default_factory=dict)      # queue id -> its engine
  event_page: BufferObject | None = None
  events: dict[int, Event] = field(default_factory=dict)
  doorbell_pages: list[tuple[int, int]] = field(default_factory=list)   # CPU (address, bytes) of doorbell slices


# *** the interface ***

class EmulatedKernel(KernelInterface):
  """The kernel side of the AMD driver, emulated: /dev/kfd, the render node, sysfs, and the GPU's queues."""
  name = "emulated amdkfd"
  runs_programs = True

  def __init__(self, arch: str | None = None, version: tuple[int, int] = KFD_VERSION):
    self.chip = CHIPS[arch] if arch is not None else chip_from_environment()
    self.version = version
    self.real = RealKernel()
    self.files: dict[int, File] = {}
    self.next_fd = FIRST_FAKE_FD
    self.sysfs = topology_files(self.chip)
    self.process = ProcessDevice()
    self.page_tables = GPUPageTables()
    self.lock = threading.RLock()
    self.event_change = threading.Condition()
    self.faults: list[str] = []     # what each fault was, in the emulator's words (for tests and debugging)
    self.programs = PlacedPrograms()
    self.handlers = self._handlers()

  # ** files and sysfs

  def open(self, path: str, flags: int = os.O_RDWR | os.O_CLOEXEC) -> int:
    kinds = {"/dev/kfd": "kfd", f"/dev/dri/renderD{RENDER_MINOR}": "render"}
    if path not in kinds: raise FileNotFoundError(errno.ENOENT, f"{path}: no such device on the emulated machine")
    with self.lock:
      fd, self.next_fd = self.next_fd, self.next_fd + 1
      self.files[fd] = File(fd, kinds[path])
    return fd

  def close(self, fd: int) -> None:
    with self.lock:
      file = self.files.pop(fd, None)
      if file is None: raise OSError(errno.EBADF, f"close of fd {fd}, which is not open")
      if file.kind == "kfd" and not any(f.kind == "kfd" for f in self.files.values()):
        for queue in list(self.process.queues.values()): queue.stop()
        self.process.queues.clear()

  def read_text(self, path: str) -> str:
    if path not in self.sysfs: raise FileNotFoundError(errno.ENOENT, f"{path}: not on the emulated machine")
    return self.sysfs[path]

  def exists(self, path: str) -> bool:
    return path in self.sysfs or path in ("/dev/kfd", f"/dev/dri/renderD{RENDER_MINOR}")

  def _file(self, fd: int, kind: str) -> File:
    file = self.files.get(fd)
    if file is None: raise OSError(errno.EBADF, f"fd {fd} is not open on the emulated KFD")
    if file.kind != kind: raise OSError(errno.ENOTTY, f"fd {fd} is the {file.kind} node, not {kind}")
    return file

  # ** mappings and doorbells

  def mmap(self, address: int, length: int, prot: int, flags: int, fd: int, offset: int = 0) -> int:
    if fd < 0: return self.real.mmap(address, length, prot, flags, fd, offset)
    file = self.files.get(fd)
    if file is None: raise OSError(errno.EBADF, f"mmap of fd {fd}, which is not open")
    if file.kind == "kfd": return self._map_doorbells(address, length, prot, flags, offset)
    with self.lock:
      bo = next((b for b in self.process.objects.values() if b.mmap_offset == offset), None)
    if bo is None: raise OSError(errno.EINVAL, f"mmap of the render node at offset {offset:#x}: no buffer object there")
    if bo.kind == "vram" and not bo.flags & kfd.KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC:
      raise OSError(errno.EINVAL, f"mmap of VRAM at {bo.va:#x}, which was not allocated host-visible (PUBLIC)")
    if length > bo.size: raise OSError(errno.EINVAL, f"mmap of {length:#x} bytes of a {bo.size:#x}-byte object")
    return self.real.mmap(address, length, prot, flags, bo.fd, 0)

  def _map_doorbells(self, address: int, length: int, prot: int, flags: int, offset: int) -> int:
    if offset != MMAP_DOORBELL | GPU_ID << MMAP_GPU_ID_SHIFT:
      raise OSError(errno.EINVAL, f"mmap of /dev/kfd at offset {offset:#x}: not this GPU's doorbells")
    if length != DOORBELL_SLICE_BYTES:   # kfd_doorbell_mmap maps a process's whole slice or nothing
      raise OSError(errno.EINVAL, f"mmap of {length:#x} bytes of doorbells; the slice is {DOORBELL_SLICE_BYTES:#x}")
    mapped = self.real.mmap(address, length, prot, MAP_PRIVATE | MAP_ANONYMOUS | (flags & MAP_FIXED), -1, 0)
    with self.lock: self.process.doorbell_pages.append((mapped, length))
    return mapped

  def munmap(self, address: int, length: int) -> None:
    with self.lock:
      self.process.doorbell_pages = [(a, n) for a, n in self.process.doorbell_pages
                                     if a + n <= address or address + length <= a]
    self.real.munmap(address, length)

  def write64(self, address: int, value: int) -> None:
    """A 64-bit store; one into a doorbell slice wakes the queue behind that doorbell."""
    super().write64(address, value)
    for page, length in self.process.doorbell_pages:
      if page <= address < page + length:
        index = (address - page) // 8
        queue = next((q for q in self.process.queues.values() if q.doorbell_index == index), None)
        if queue is not None: queue.ring(value)

  def register_program(self, address: int, code: bytes, program_text: str, facts: object) -> None:
    self.programs.register(address, code, program_text, facts)

  # ** ioctl

  def _handlers(self) -> dict[int, tuple[type, Callable[[Any], None]]]:
    table = {
      kfd.AMDKFD_IOC_GET_VERSION: (kfd.kfd_ioctl_get_version_args, self._get_version),
      kfd.AMDKFD_IOC_ACQUIRE_VM: (kfd.kfd_ioctl_acquire_vm_args, self._acquire_vm),
      kfd.AMDKFD_IOC_GET_PROCESS_APERTURES_NEW: (kfd.kfd_ioctl_get_process_apertures_new_args, self._apertures),
      kfd.AMDKFD_IOC_ALLOC_MEMORY_OF_GPU: (kfd.kfd_ioctl_alloc_memory_of_gpu_args, self._alloc_memory),
      kfd.AMDKFD_IOC_FREE_MEMORY_OF_GPU: (kfd.kfd_ioctl_free_memory_of_gpu_args, self._free_memory),
      kfd.AMDKFD_IOC_MAP_MEMORY_TO_GPU: (kfd.kfd_ioctl_map_memory_to_gpu_args, self._map_memory),
      kfd.AMDKFD_IOC_UNMAP_MEMORY_FROM_GPU: (kfd.kfd_ioctl_unmap_memory_from_gpu_args, self._unmap_memory),
      kfd.AMDKFD_IOC_CREATE_QUEUE: (kfd.kfd_ioctl_create_queue_args, self._create_queue),
      kfd.AMDKFD_IOC_DESTROY_QUEUE: (kfd.kfd_ioctl_destroy_queue_args, self._destroy_queue),
      kfd.AMDKFD_IOC_CREATE_EVENT: (kfd.kfd_ioctl_create_event_args, self._create_event),
      kfd.AMDKFD_IOC_DESTROY_EVENT: (kfd.kfd_ioctl_destroy_event_args, self._destroy_event),
      kfd.AMDKFD_IOC_SET_EVENT: (kfd.kfd_ioctl_set_event_args, self._set_event),
      kfd.AMDKFD_IOC_RESET_EVENT: (kfd.kfd_ioctl_reset_event_args, self._reset_event),
      kfd.AMDKFD_IOC_WAIT_EVENTS: (kfd.kfd_ioctl_wait_events_args, self._wait_events),
      kfd.AMDKFD_IOC_GET_CLOCK_COUNTERS: (kfd.kfd_ioctl_get_clock_counters_args, self._clock_counters),
    }
    return {ioc_number(request): entry for request, entry in table.items()}

  def ioctl(self, fd: int, request: int, argument: ctypes.Structure | ctypes.Array | None) -> None:
    self._file(fd, "kfd")
    number, size = ioc_number(request), ioc_size(request)
    if not kfd.AMDKFD_COMMAND_START <= number < kfd.AMDKFD_COMMAND_END:
      raise OSError(errno.ENOTTY, f"KFD has no ioctl number {number:#x}")
    if number not in self.handlers:
      raise OSError(errno.EINVAL, f"KFD ioctl {number:#x} is not emulated")
    structure, handler = self.handlers[number]
    if size and (argument is None or ctypes.sizeof(argument) < size):
      given = 0 if argument is None else ctypes.sizeof(argument)
      raise OSError(errno.EFAULT, f"the request says {size} bytes of argument, the buffer has {given}")
    # KFD copies in what the request's size says and zero-extends it to its own structure (kfd_ioctl)
    data = bytearray(max(size, ctypes.sizeof(structure)))
    if size: data[:size] = ctypes.string_at(ctypes.addressof(argument), size)
    handler(structure.from_buffer(data))
    if size and request >> 30 & 2: ctypes.memmove(ctypes.addressof(argument), bytes(data[:size]), size)

  # ** version, VM, apertures, clocks

  def _get_version(self, args: kfd.kfd_ioctl_get_version_args) -> None:
    args.major_version, args.minor_version = self.version

  def _check_gpu(self, gpu_id: int) -> None:
    if gpu_id != GPU_ID: raise OSError(errno.EINVAL, f"gpu_id {gpu_id:#x} is not a GPU (this machine has {GPU_ID:#x})")

  def _acquire_vm(self, args: kfd.kfd_ioctl_acquire_vm_args) -> None:
    self._check_gpu(args.gpu_id)
    file = self.files.get(args.drm_fd)
    if file is None or file.kind != "render":
      raise OSError(errno.EINVAL, f"ACQUIRE_VM: drm_fd {args.drm_fd} is not an open render node of this GPU")
    with self.lock:
      if self.process.vm_fd not in (None, args.drm_fd):
        raise OSError(errno.EBUSY, f"the GPU's VM was acquired through render fd {self.process.vm_fd} already")
      self.process.vm_fd = args.drm_fd

  def _apertures(self, args: kfd.kfd_ioctl_get_process_apertures_new_args) -> None:
    if args.num_of_nodes == 0:
      args.num_of_nodes = 1   # tells the caller how many entries to make room for
      return
    entry = kfd.kfd_process_device_apertures.from_address(args.kfd_process_device_apertures_ptr)
    entry.lds_base, entry.lds_limit = LDS_APERTURE, LDS_APERTURE | 0xFFFFFFFF
    entry.scratch_base, entry.scratch_limit = SCRATCH_APERTURE, SCRATCH_APERTURE | 0xFFFFFFFF
    entry.gpuvm_base, entry.gpuvm_limit, entry.gpu_id = GPUVM_BASE, GPUVM_LIMIT, GPU_ID
    args.num_of_nodes = 1

  def _clock_counters(self, args: kfd.kfd_ioctl_get_clock_counters_args) -> None:
    self._check_gpu(args.gpu_id)
    args.cpu_clock_counter = time.clock_gettime_ns(time.CLOCK_MONOTONIC_RAW)
    args.gpu_clock_counter = gpu_clock()
    args.system_clock_counter = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
    args.system_clock_freq = 1_000_000_000

  # ** memory

  def _alloc_memory(self, args: kfd.kfd_ioctl_alloc_memory_of_gpu_args) -> None:
    self._check_gpu(args.gpu_id)
    if args.size == 0: raise OSError(errno.EINVAL, "ALLOC_MEMORY_OF_GPU of 0 bytes")
    kinds = {kfd.KFD_IOC_ALLOC_MEM_FLAGS_VRAM: "vram", kfd.KFD_IOC_ALLOC_MEM_FLAGS_GTT: "gtt"}
    kind = kinds.get(args.flags & 0x1F)
    if kind is None:
      raise OSError(errno.EINVAL, f"flags {args.flags:#x}: the emulated KFD allocates VRAM or GTT (one of them)")
    size = round_up(args.size, PAGE)
    if args.va_addr % PAGE or not GPUVM_BASE <= args.va_addr <= GPUVM_LIMIT - size + 1:
      raise OSError(errno.EINVAL, f"va_addr {args.va_addr:#x} is not a page-aligned address in the GPUVM aperture")
    with self.lock:
      process = self.process
      if process.vm_fd is None: raise OSError(errno.EINVAL, "ALLOC_MEMORY_OF_GPU before ACQUIRE_VM")
      for other in process.objects.values():
        if other.va < args.va_addr + size and args.va_addr < other.va + other.size:
          raise OSError(errno.EINVAL, f"{size:#x} bytes at {args.va_addr:#x} overlap the object at {other.va:#x}")
      if kind == "vram" and process.vram_used + size > self.chip.vram_bytes:
        raise OSError(errno.ENOMEM, f"{size:#x} bytes of VRAM asked for, {self.chip.vram_bytes - process.vram_used:#x}"
                                    " free")
      fd = os.memfd_create(f"rawgrad-emulated-amd-{kind}", os.MFD_CLOEXEC)
      os.ftruncate(fd, size)
      address = self.real.mmap(0, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
      handle = GPU_ID << 32 | process.next_object
      bo = BufferObject(handle, args.va_addr, size, kind, args.flags, fd, address, process.next_object << 32)
      process.next_object += 1
      process.objects[handle] = bo
      process.vram_used += size if kind == "vram" else 0
    args.handle, args.mmap_offset = handle, bo.mmap_offset

  def _object(self, handle: int) -> BufferObject:
    bo = self.process.objects.get(handle)
    if bo is None: raise OSError(errno.EINVAL, f"no buffer object with handle {handle:#x}")
    return bo

  def _free_memory(self, args: kfd.kfd_ioctl_free_memory_of_gpu_args) -> None:
    with self.lock:
      bo = self._object(args.handle)
      if bo.gpu_mapped: raise OSError(errno.EBUSY, f"the object at {bo.va:#x} is still mapped to the GPU")
      del self.process.objects[args.handle]
      self.process.vram_used -= bo.size if bo.kind == "vram" else 0
    # the pages stay while the driver's own mapping of them does; the emulator's goes now
    self.real.munmap(bo.address, bo.size)
    os.close(bo.fd)

  def _device_ids(self, pointer: int, count: int) -> list[int]:
    if count == 0 or pointer == 0: raise OSError(errno.EINVAL, "no devices to map to")
    return list((ctypes.c_uint32 * count).from_address(pointer))

  def _map_memory(self, args: kfd.kfd_ioctl_map_memory_to_gpu_args) -> None:
    with self.lock:
      bo = self._object(args.handle)
      for gpu_id in self._device_ids(args.device_ids_array_ptr, args.n_devices)[args.n_success:]:
        self._check_gpu(gpu_id)
      if not bo.gpu_mapped:
        bo.gpu_mapped = True
        self.page_tables.map(bo)
      args.n_success = args.n_devices

  def _unmap_memory(self, args: kfd.kfd_ioctl_unmap_memory_from_gpu_args) -> None:
    with self.lock:
      bo = self._object(args.handle)
      for gpu_id in self._device_ids(args.device_ids_array_ptr, args.n_devices)[args.n_success:]:
        self._check_gpu(gpu_id)
      if not bo.gpu_mapped: raise OSError(errno.EINVAL, f"the object at {bo.va:#x} is not mapped to the GPU")
      bo.gpu_mapped = False
      self.page_tables.unmap(bo)
      args.n_success = args.n_devices

  # ** queues

  def _create_queue(self, args: kfd.kfd_ioctl_create_queue_args) -> None:
    self._check_gpu(args.gpu_id)
    if args.queue_percentage > kfd.KFD_MAX_QUEUE_PERCENTAGE:
      raise OSError(errno.EINVAL, f"queue_percentage {args.queue_percentage} is above {kfd.KFD_MAX_QUEUE_PERCENTAGE}")
    if args.queue_priority > kfd.KFD_MAX_QUEUE_PRIORITY:
      raise OSError(errno.EINVAL, f"queue_priority {args.queue_priority} is above {kfd.KFD_MAX_QUEUE_PRIORITY}")
    if args.ring_size & (args.ring_size - 1):
      raise OSError(errno.EINVAL, f"ring_size {args.ring_size:#x} is not a power of two")
    args.ring_size = max(args.ring_size, kfd.KFD_MIN_QUEUE_RING_SIZE)
    if self.process.vm_fd is None: raise OSError(errno.EINVAL, "CREATE_QUEUE before ACQUIRE_VM")
    self._check_mapped(args.ring_base_address, args.ring_size, "ring")
    self._check_mapped(args.read_pointer_address, 8, "read pointer")
    self._check_mapped(args.write_pointer_address, 8, "write pointer")
    if args.queue_type == kfd.KFD_IOC_QUEUE_TYPE_COMPUTE_AQL: self._check_compute_buffers(args)
    elif args.queue_type != kfd.KFD_IOC_QUEUE_TYPE_SDMA:
      raise OSError(errno.EINVAL, f"queue_type {args.queue_type}: the emulated GPU runs AQL compute and SDMA queues")
    with self.lock:
      queue_id = next(i for i in range(1024) if i not in self.process.queues)
      engine = AQLEngine if args.queue_type == kfd.KFD_IOC_QUEUE_TYPE_COMPUTE_AQL else SDMAEngine
      self.process.queues[queue_id] = engine(self, queue_id, args)
    args.queue_id = queue_id
    args.doorbell_offset = MMAP_DOORBELL | GPU_ID << MMAP_GPU_ID_SHIFT | 8 * queue_id

  def _check_mapped(self, address: int, nbytes: int, what: str) -> None:
    if self.page_tables.find(address, nbytes) is None:
      raise OSError(errno.EFAULT, f"the queue's {what} ({nbytes:#x} bytes at {address:#x}) is not mapped to the GPU")

  def _check_compute_buffers(self, args: kfd.kfd_ioctl_create_queue_args) -> None:
    if args.ring_size % 64: raise OSError(errno.EINVAL, f"an AQL ring of {args.ring_size} bytes is not whole packets")
    if args.eop_buffer_size < 4096: raise OSError(errno.EINVAL, f"eop_buffer_size {args.eop_buffer_size} < 4096")
    self._check_mapped(args.eop_buffer_address, args.eop_buffer_size, "end-of-pipe buffer")
    save, control = context_save_bytes(self.chip)
    if (args.ctx_save_restore_size, args.ctl_stack_size) != (save, control):
      raise OSError(errno.EINVAL, f"ctx_save_restore_size {args.ctx_save_restore_size:#x} and ctl_stack_size "
                                  f"{args.ctl_stack_size:#x}; this GPU needs {save:#x} and {control:#x}")
    self._check_mapped(args.ctx_save_restore_address, save * self.chip.xcc_count, "context save area")

  def _destroy_queue(self, args: kfd.kfd_ioctl_destroy_queue_args) -> None:
    with self.lock:
      queue = self.process.queues.pop(args.queue_id, None)
    if queue is None: raise OSError(errno.EINVAL, f"no queue {args.queue_id}")
    queue.stop()

  # ** events

  def _create_event(self, args: kfd.kfd_ioctl_create_event_args) -> None:
    with self.event_change:
      process = self.process
      if args.event_page_offset:
        self._set_event_page(args.event_page_offset)
      if args.event_type == kfd.KFD_IOC_EVENT_SIGNAL:
        if process.event_page is None:
          raise OSError(errno.EINVAL, "a signal event needs the event page: pass its buffer handle in "
                                      "event_page_offset with the first CREATE_EVENT")
        event_id = next(i for i in range(1, kfd.KFD_SIGNAL_EVENT_LIMIT) if i not in process.events)
        self._slots()[event_id] = UNSIGNALED_SLOT
        args.event_page_offset, args.event_slot_index = MMAP_EVENTS, event_id
      else:
        event_id = next(i for i in range(FIRST_OTHER_EVENT_ID, 1 << 30) if i not in process.events)
      process.events[event_id] = Event(event_id, args.event_type, bool(args.auto_reset))
      args.event_id, args.event_trigger_data = event_id, event_id

  def _set_event_page(self, handle: int) -> None:
    if self.process.event_page is not None: raise OSError(errno.EINVAL, "the event page is set already")
    bo = self.process.objects.get(handle)
    if bo is None or bo.kind != "gtt" or bo.size < kfd.KFD_SIGNAL_EVENT_LIMIT * 8:
      raise OSError(errno.EINVAL, f"event page handle {handle:#x}: not a GTT object of at least "
                                  f"{kfd.KFD_SIGNAL_EVENT_LIMIT * 8:#x} bytes")
    self.process.event_page = bo
    self._slots()[:] = UNSIGNALED_SLOT

  def _slots(self) -> np.ndarray:
    page = self.process.event_page
    return host_view(page.address, kfd.KFD_SIGNAL_EVENT_LIMIT * 8).view(np.uint64)

  def _event(self, event_id: int) -> Event:
    event = self.process.events.get(event_id)
    if event is None: raise OSError(errno.EINVAL, f"no event {event_id}")
    return event

  def _destroy_event(self, args: kfd.kfd_ioctl_destroy_event_args) -> None:
    with self.event_change:
      self._event(args.event_id)
      del self.process.events[args.event_id]

  def _set_event(self, args: kfd.kfd_ioctl_set_event_args) -> None:
    with self.event_change:
      self._event(args.event_id).signaled = True
      self.event_change.notify_all()

  def _reset_event(self, args: kfd.kfd_ioctl_reset_event_args) -> None:
    with self.event_change:
      self._event(args.event_id).signaled = False

  def _wait_events(self, args: kfd.kfd_ioctl_wait_events_args) -> None:
    entries = (kfd.kfd_event_data * args.num_events).from_address(args.events_ptr)
    with self.event_change:
      events = [self._event(entry.event_id) for entry in entries]
      done = all if args.wait_for_all else any
      deadline = time.monotonic() + args.timeout / 1000
      while not done(event.signaled for event in events):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
          args.wait_result = kfd.KFD_IOC_WAIT_RESULT_TIMEOUT
          return
        self.event_change.wait(remaining)
      for entry, event in zip(entries, events):
        if not event.signaled: continue
        if event.memory_fault is not None:
          data = entry.memory_exception_data
          data.va, data.gpu_id, data.failure.NotPresent = event.memory_fault[0], event.memory_fault[1], 1
        if event.auto_reset: event.signaled = False
      args.wait_result = kfd.KFD_IOC_WAIT_RESULT_COMPLETE

  # ** what the GPU raises

  def interrupt(self, context: int) -> None:
    """An end-of-pipe or SDMA trap interrupt: signal the event named by the context when its slot is written, else
    every signal event whose slot is (kfd_signal_event_interrupt)."""
    with self.event_change:
      if self.process.event_page is None: return
      slots = self._slots()
      named = self.process.events.get(context)
      candidates = [named] if named is not None and int(slots[context]) != UNSIGNALED_SLOT else \
        [e for e in self.process.events.values() if e.event_type == kfd.KFD_IOC_EVENT_SIGNAL
         and int(slots[e.event_id]) != UNSIGNALED_SLOT]
      for event in candidates:
        slots[event.event_id] = UNSIGNALED_SLOT
        event.signaled = True
      self.event_change.notify_all()

  def memory_fault(self, address: int, why: str) -> None:
    """A GPU memory fault: the memory exception events get the address (as kfd_signal_vm_fault_event does)."""
    self.record_fault(why)
    with self.event_change:
      for event in self.process.events.values():
        if event.event_type == kfd.KFD_IOC_EVENT_MEMORY:
          event.signaled, event.memory_fault = True, (address, GPU_ID)
      self.event_change.notify_all()

  def hardware_exception(self, why: str) -> None:
    """An engine hang: the hardware exception events fire (KFD resets the engine)."""
    self.record_fault(why)
    with self.event_change:
      for event in self.process.events.values():
        if event.event_type == kfd.KFD_IOC_EVENT_HW_EXCEPTION: event.signaled = True
      self.event_change.notify_all()

  def record_fault(self, message: str) -> None:
    self.faults.append(message)
