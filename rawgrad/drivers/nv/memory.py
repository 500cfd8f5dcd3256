"""GPU memory at one virtual address for the CPU and the GPU (docs/nv-driver-notes.md 3 and 4).

The device reserves an arena of CPU address space (PROT_NONE, below 2^40 so QMDs, pushbuffers and GPFIFO rings are
reachable by the 40-bit fields that point at them) and hands out addresses from it. UVM owns the GPU page tables of
the VA space: each allocation becomes an external range at its address, mapped to an RM memory object. The CPU sees
the same bytes at the same address where it can: pinned host memory is the process's own pages (an OS descriptor
object), video memory is mmap'd through BAR1 when asked for. GPU-only video memory keeps its PROT_NONE reservation,
so the CPU never reuses the address.

Small allocations share 2 MiB slabs (one RM object, one UVM range each), so a tensor's buffer costs no ioctl.
"""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from rawgrad.autogen.nv import nv_rm as rm
from rawgrad.drivers.nv.rm import UVM, RMClient
from rawgrad.drivers.nv.rm import field as bits
from rawgrad.drivers.os import (MAP_ANONYMOUS, MAP_FIXED, MAP_FIXED_NOREPLACE, MAP_NORESERVE, MAP_PRIVATE, MAP_SHARED,
                                PROT_NONE, PROT_READ, PROT_WRITE, KernelInterface, host_view)
from rawgrad.helpers import round_up
from rawgrad.runtime.hcq import Release, on_collect
from rawgrad.runtime.memory import release_range

PAGE = 4096
HUGE_PAGE = 2 << 20
ARENA_BYTES = 1 << 38               # 256 GiB of address space per device: all of an H100's memory, and pinned memory
ARENA_CANDIDATES = tuple(range(0x10_0000_0000, 0x100_0000_0000 - ARENA_BYTES + 1, ARENA_BYTES // 4))
SLAB_BYTES = 2 << 20
_recycled_arenas: list[int] = []    # bases of arenas closed devices gave back
SUBALLOCATION_ALIGNMENT = 256       # QMDs and constant banks need 256 bytes on Ampere; buffers like it too



class VirtualArena:
  """A reserved range of CPU address space, handed out first-fit; freed ranges are reserved again (PROT_NONE)."""

  def __init__(self, kernel: KernelInterface):
    self.kernel = kernel
    self.base = self._reserve()
    self.free_ranges: list[tuple[int, int]] = [(self.base, ARENA_BYTES)]   # (address, bytes), by address
    self.lock = threading.Lock()

  def _reserve(self) -> int:
    if _recycled_arenas:
      base = _recycled_arenas.pop()
      return self.kernel.mmap(base, ARENA_BYTES, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
                              -1, 0)
    failures = []
    for candidate in ARENA_CANDIDATES:
      try:
        return self.kernel.mmap(candidate, ARENA_BYTES, PROT_NONE,
                                MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0)
      except OSError as error:
        failures.append(f"{candidate:#x}: {error.strerror}")
    raise MemoryError(f"no room for a {ARENA_BYTES >> 30} GiB GPU address arena below 2^40 in this process "
                      f"({'; '.join(failures)})")

  def allocate(self, nbytes: int, alignment: int) -> int:
    with self.lock:
      for i, (start, size) in enumerate(self.free_ranges):
        address = round_up(start, alignment)
        if address + nbytes <= start + size:
          pieces = [(start, address - start), (address + nbytes, start + size - address - nbytes)]
          self.free_ranges[i:i + 1] = [piece for piece in pieces if piece[1] > 0]
          return address
    raise MemoryError(f"the GPU address arena ({ARENA_BYTES >> 30} GiB at {self.base:#x}) has no free {nbytes:#x} "
                      f"bytes aligned to {alignment:#x}")

  def close(self) -> None:
    """Drop every mapping in the arena for zero pages, so what still points into it (a signal, a view) reads zeros
    instead of crashing the process; the next arena of this process reuses the address space."""
    self.kernel.mmap(self.base, ARENA_BYTES, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0)
    _recycled_arenas.append(self.base)

  def release(self, address: int, nbytes: int) -> None:
    """Give the range back, reserved again for no one but us."""
    self.kernel.mmap(address, nbytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0)
    with self.lock: release_range(self.free_ranges, address, nbytes)


@dataclass
class Allocation:
  """An RM memory object at `address` for the GPU (and the CPU when `host` is set)."""
  address: int
  nbytes: int
  handle: int
  kind: str                        # "video", "host" or "system" (RM-allocated, CPU only: error notifiers)
  host: np.ndarray | None = None   # uint8 view where the CPU maps it
  gpu_mapped: bool = True


class GPUMemory:
  """Allocates RM memory objects and maps them at arena addresses for the GPU (UVM) and the CPU."""

  def __init__(self, kernel: KernelInterface, client: RMClient, device: int, device_path: str, device_fd: int,
               uvm: UVM, uuid: bytes):
    self.kernel, self.client, self.device, self.device_path = kernel, client, device, device_path
    self.uvm, self.uuid = uvm, uuid
    self.arena = VirtualArena(kernel)
    self.device_fd = device_fd  # the GPU's node, opened (and registered to the control fd) by NVGPU

  def video(self, nbytes: int, cpu_access: bool = False, contiguous: bool = False) -> Allocation:
    """Video memory mapped for the GPU; also mapped for the CPU (through BAR1, write-combined) with cpu_access."""
    huge = nbytes >= HUGE_PAGE
    size = round_up(nbytes, HUGE_PAGE if huge else 64 << 10)
    address = self.arena.allocate(size, HUGE_PAGE if huge else 64 << 10)
    handle = self.client.alloc(self.device, rm.NV01_MEMORY_LOCAL_USER, self._video_params(size, huge, contiguous),
                               what=f"{size:#x} bytes of video memory")
    allocation = Allocation(address, size, handle, "video")
    self.uvm.map_external(self.uuid, self.client.control_fd, self.client.handle, handle, address, size)
    if cpu_access: allocation.host = self._map_for_cpu(handle, address, size, self.device_path)
    return allocation

  def host(self, nbytes: int) -> Allocation:
    """Pinned host memory: this process's pages at an arena address, the GPU mapping them at the same address."""
    size = round_up(nbytes, PAGE)
    address = self.arena.allocate(size, HUGE_PAGE if size >= HUGE_PAGE else PAGE)
    self.kernel.mmap(address, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED, -1, 0)
    handle = self.client.alloc_os_descriptor(self.device_fd, self.device, address, size)
    self.uvm.map_external(self.uuid, self.client.control_fd, self.client.handle, handle, address, size)
    return Allocation(address, size, handle, "host", host_view(address, size))

  def system(self, nbytes: int) -> Allocation:
    """RM-allocated system memory the CPU maps (not the GPU): for what RM itself writes, like error notifiers."""
    size = round_up(nbytes, PAGE)
    params = rm.NV_MEMORY_ALLOCATION_PARAMS(
      owner=self.client.handle, type=rm.NVOS32_TYPE_IMAGE, size=size, limit=size - 1,
      flags=rm.NVOS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED,
      attr=(bits(rm.NVOS32_ATTR_LOCATION, rm.NVOS32_ATTR_LOCATION_PCI)
            | bits(rm.NVOS32_ATTR_PHYSICALITY, rm.NVOS32_ATTR_PHYSICALITY_NONCONTIGUOUS)
            | bits(rm.NVOS32_ATTR_COHERENCY, rm.NVOS32_ATTR_COHERENCY_CACHED)),
      attr2=bits(rm.NVOS32_ATTR2_GPU_CACHEABLE, rm.NVOS32_ATTR2_GPU_CACHEABLE_NO))
    handle = self.client.alloc(self.device, rm.NV01_MEMORY_SYSTEM, params, what=f"{size:#x} bytes of system memory")
    address = self.arena.allocate(size, PAGE)
    host = self._map_for_cpu(handle, address, size, "/dev/nvidiactl")
    return Allocation(address, size, handle, "system", host, gpu_mapped=False)

  def free(self, allocation: Allocation) -> None:
    if allocation.gpu_mapped: self.uvm.free(allocation.address, allocation.nbytes)
    self.client.free(self.device, allocation.handle)
    allocation.host = None
    self.arena.release(allocation.address, allocation.nbytes)

  def _video_params(self, size: int, huge: bool, contiguous: bool) -> rm.NV_MEMORY_ALLOCATION_PARAMS:
    page = rm.NVOS32_ATTR_PAGE_SIZE_HUGE if huge else rm.NVOS32_ATTR_PAGE_SIZE_DEFAULT
    physicality = rm.NVOS32_ATTR_PHYSICALITY_CONTIGUOUS if contiguous else \
      rm.NVOS32_ATTR_PHYSICALITY_ALLOW_NONCONTIGUOUS
    attr2 = (bits(rm.NVOS32_ATTR2_ZBC, rm.NVOS32_ATTR2_ZBC_PREFER_NO_ZBC)
             | bits(rm.NVOS32_ATTR2_GPU_CACHEABLE, rm.NVOS32_ATTR2_GPU_CACHEABLE_YES))
    if huge: attr2 |= bits(rm.NVOS32_ATTR2_PAGE_SIZE_HUGE, rm.NVOS32_ATTR2_PAGE_SIZE_HUGE_2MB)
    flags = (rm.NVOS32_ALLOC_FLAGS_ALIGNMENT_FORCE | rm.NVOS32_ALLOC_FLAGS_PERSISTENT_VIDMEM
             | rm.NVOS32_ALLOC_FLAGS_MAP_NOT_REQUIRED | rm.NVOS32_ALLOC_FLAGS_IGNORE_BANK_PLACEMENT
             | rm.NVOS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED)
    return rm.NV_MEMORY_ALLOCATION_PARAMS(
      owner=self.client.handle, type=rm.NVOS32_TYPE_IMAGE, flags=flags, format=6, size=size, limit=size - 1,
      alignment=HUGE_PAGE if huge else 64 << 10,
      attr=bits(rm.NVOS32_ATTR_PAGE_SIZE, page) | bits(rm.NVOS32_ATTR_PHYSICALITY, physicality)
      | bits(rm.NVOS32_ATTR_LOCATION, rm.NVOS32_ATTR_LOCATION_VIDMEM), attr2=attr2)

  def _map_for_cpu(self, handle: int, address: int, nbytes: int, path: str) -> np.ndarray:
    """RM_MAP_MEMORY on a fresh fd (one mapping context per open file), then mmap at exactly `address`."""
    fd = self.kernel.open(path)
    try:
      self.client.map_memory(self.device, handle, nbytes, fd)
      self.kernel.mmap(address, nbytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0)
    finally:
      self.kernel.close(fd)  # the mapping holds the file
    return host_view(address, nbytes)


# *** sub-allocation ***

@dataclass
class Block:
  """A piece of an allocation; it goes back to its heap when collected (after the device is done with it)."""
  allocation: Allocation
  offset: int
  nbytes: int
  heap: SlabHeap | None = field(default=None, repr=False)
  release: Release | None = field(default=None, repr=False)   # set by on_collect

  @property
  def address(self) -> int:
    return self.allocation.address + self.offset

  @property
  def host(self) -> np.ndarray | None:
    host = self.allocation.host
    return None if host is None else host[self.offset:self.offset + self.nbytes]


class SlabHeap:
  """Sub-allocates small pieces from slabs (one allocation each), first fit; large requests get their own
  allocation. A collected piece is reused only once the device has finished everything submitted before it was
  collected, since that work may still touch it."""

  def __init__(self, make: Callable[[int], Allocation], release: Callable[[Allocation], None],
               completed: Callable[[], int], submitted: Callable[[], int]):
    self.make, self.release, self.completed, self.submitted = make, release, completed, submitted
    self.slabs: list[Allocation] = []
    self.free_pieces: dict[int, list[tuple[int, int]]] = {}   # slab address -> [(offset, bytes)], by offset
    # (timeline value, allocation, offset or -1 for a whole allocation, bytes); appended by finalizers, which may run
    # on any thread in the middle of anything, so only a deque's atomic append is done there
    self.pending: deque[tuple[int, Allocation, int, int]] = deque()
    self.lock = threading.Lock()

  def alloc(self, nbytes: int) -> Block:
    size = round_up(max(nbytes, 1), SUBALLOCATION_ALIGNMENT)
    if size > SLAB_BYTES // 2:
      block = Block(self.make(size), 0, nbytes)
      on_collect(block, self._collected, block.allocation, -1, block.allocation.nbytes)
      return block
    with self.lock:
      self.reclaim()
      found = self._first_fit(size)
      if found is None:
        slab = self.make(SLAB_BYTES)
        self.slabs.append(slab)
        self.free_pieces[slab.address] = [(0, slab.nbytes)]
        found = self._first_fit(size)
    slab, offset = found
    block = Block(slab, offset, nbytes, self)
    on_collect(block, self._collected, slab, offset, size)
    return block

  def _first_fit(self, size: int) -> tuple[Allocation, int] | None:
    for slab in self.slabs:
      pieces = self.free_pieces[slab.address]
      for i, (offset, free) in enumerate(pieces):
        if free >= size:
          pieces[i:i + 1] = [(offset + size, free - size)] if free > size else []
          return slab, offset
    return None

  def _collected(self, allocation: Allocation, offset: int, size: int) -> None:
    # the submission being made right now may still name the piece: wait for the one after it too
    self.pending.append((self.submitted() + 1, allocation, offset, size))

  def reclaim(self) -> None:
    """Take back the pieces the device is done with (alloc does this; callers hold the lock)."""
    done = self.completed()
    for _ in range(len(self.pending)):
      entry = self.pending.popleft()
      value, allocation, offset, size = entry
      if value > done: self.pending.append(entry)
      elif offset < 0: self.release(allocation)
      else: self._insert(allocation, offset, size)

  def _insert(self, slab: Allocation, offset: int, size: int) -> None:
    release_range(self.free_pieces[slab.address], offset, size)
