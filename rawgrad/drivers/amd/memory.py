"""GPU memory through KFD, at one virtual address for the CPU and the GPU.

Each allocation first reserves CPU address space (an anonymous PROT_NONE mapping), then asks KFD for a buffer object
at that same GPU virtual address (ALLOC_MEMORY_OF_GPU), maps it into the GPU's page tables (MAP_MEMORY_TO_GPU) and,
for memory the host touches, maps it for the CPU over the reservation (mmap of the render node at the offset KFD
returns). VRAM the host never maps keeps its PROT_NONE reservation, so the CPU never hands that address to anything
else. GTT is system memory the GPU reaches over PCIe: rings, signals, kernel arguments, staging.
"""
from __future__ import annotations

import ctypes
import threading
from collections import deque
from dataclasses import dataclass

import numpy as np

from rawgrad.autogen.amd import kfd
from rawgrad.drivers.amd.kfd import KFD, GPUNode
from rawgrad.drivers.os import (MAP_ANONYMOUS, MAP_FIXED, MAP_NORESERVE, MAP_PRIVATE, MAP_SHARED, PROT_NONE, PROT_READ,
                                PROT_WRITE, KernelInterface, host_view)
from rawgrad.helpers import round_up

PAGE = 4096
HUGE_PAGE = 2 << 20
VRAM_FLAGS = (kfd.KFD_IOC_ALLOC_MEM_FLAGS_VRAM | kfd.KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE
              | kfd.KFD_IOC_ALLOC_MEM_FLAGS_EXECUTABLE | kfd.KFD_IOC_ALLOC_MEM_FLAGS_NO_SUBSTITUTE)
# host memory both sides read and write while the other runs: coherent (snooped) system memory
GTT_FLAGS = (kfd.KFD_IOC_ALLOC_MEM_FLAGS_GTT | kfd.KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE
             | kfd.KFD_IOC_ALLOC_MEM_FLAGS_EXECUTABLE | kfd.KFD_IOC_ALLOC_MEM_FLAGS_NO_SUBSTITUTE
             | kfd.KFD_IOC_ALLOC_MEM_FLAGS_COHERENT)



@dataclass
class Allocation:
  """A buffer object at `address` for the GPU (and for the CPU when `host` is set)."""
  address: int
  nbytes: int
  handle: int
  kind: str                        # "vram" or "gtt"
  host: np.ndarray | None = None   # uint8 view where the CPU maps it
  freed: bool = False


class GPUMemory:
  """KFD buffer objects of one GPU, in this process's GPU virtual address space."""

  def __init__(self, kernel: KernelInterface, device_kfd: KFD, node: GPUNode, uncached_host: bool = False):
    self.kernel, self.kfd, self.node = kernel, device_kfd, node
    self.render_fd = kernel.open(node.render_node)
    self.kfd.call(kfd.AMDKFD_IOC_ACQUIRE_VM, kfd.kfd_ioctl_acquire_vm_args(drm_fd=self.render_fd,
                                                                          gpu_id=node.gpu_id))
    self.gpuvm_base, self.gpuvm_limit, self.lds_base, self.scratch_base = self._apertures()
    # MI300 (gfx942) keeps host memory the host polls out of the GPU caches altogether
    self.gtt_flags = GTT_FLAGS | (kfd.KFD_IOC_ALLOC_MEM_FLAGS_UNCACHED if uncached_host else 0)
    self.device_ids = (ctypes.c_uint32 * 1)(node.gpu_id)   # the MAP/UNMAP ioctls' device list
    self.lock = threading.Lock()
    self.pending: deque[tuple[int, Allocation]] = deque()   # (timeline value, allocation) to free once it is done

  def _apertures(self) -> tuple[int, int, int, int]:
    """(gpuvm base, gpuvm limit, LDS aperture base, scratch aperture base) of this GPU for this process."""
    count = kfd.kfd_ioctl_get_process_apertures_new_args(num_of_nodes=0)
    self.kfd.call(kfd.AMDKFD_IOC_GET_PROCESS_APERTURES_NEW, count)
    apertures = (kfd.kfd_process_device_apertures * max(count.num_of_nodes, 1))()
    args = kfd.kfd_ioctl_get_process_apertures_new_args(kfd_process_device_apertures_ptr=ctypes.addressof(apertures),
                                                         num_of_nodes=len(apertures))
    self.kfd.call(kfd.AMDKFD_IOC_GET_PROCESS_APERTURES_NEW, args)
    for aperture in apertures[:args.num_of_nodes]:
      if aperture.gpu_id == self.node.gpu_id:
        return aperture.gpuvm_base, aperture.gpuvm_limit, aperture.lds_base, aperture.scratch_base
    raise RuntimeError(f"KFD gave no apertures for gpu_id {self.node.gpu_id:#x} "
                       f"(it listed {[a.gpu_id for a in apertures[:args.num_of_nodes]]})")

  # ** allocating

  def vram(self, nbytes: int) -> Allocation:
    """Device memory the GPU reads and writes; the CPU does not map it."""
    return self._allocate(nbytes, VRAM_FLAGS, "vram", host_mapped=False)

  def gtt(self, nbytes: int) -> Allocation:
    """System memory mapped for both the CPU and the GPU at the same address."""
    return self._allocate(nbytes, self.gtt_flags, "gtt", host_mapped=True)

  def _allocate(self, nbytes: int, flags: int, kind: str, host_mapped: bool) -> Allocation:
    size = round_up(max(nbytes, 1), PAGE)
    address = self._reserve(size, HUGE_PAGE if size >= HUGE_PAGE else PAGE)
    args = kfd.kfd_ioctl_alloc_memory_of_gpu_args(va_addr=address, size=size, gpu_id=self.node.gpu_id, flags=flags)
    try:
      self.kfd.call(kfd.AMDKFD_IOC_ALLOC_MEMORY_OF_GPU, args)
    except OSError as error:
      self.kernel.munmap(address, size)
      raise MemoryError(f"KFD could not allocate {size:#x} bytes of {kind.upper()} on gpu {self.node.gpu_id:#x}: "
                        f"{error}") from None
    allocation = Allocation(address, size, args.handle, kind)
    self._map_for_gpu(allocation)
    if host_mapped:
      self.kernel.mmap(address, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, self.render_fd,
                       args.mmap_offset)
      allocation.host = host_view(address, size)
    return allocation

  def _map_for_gpu(self, allocation: Allocation) -> None:
    args = kfd.kfd_ioctl_map_memory_to_gpu_args(handle=allocation.handle,
                                                device_ids_array_ptr=ctypes.addressof(self.device_ids), n_devices=1)
    self.kfd.call(kfd.AMDKFD_IOC_MAP_MEMORY_TO_GPU, args)
    if args.n_success != 1:
      raise RuntimeError(f"MAP_MEMORY_TO_GPU mapped {allocation.kind} at {allocation.address:#x} on "
                         f"{args.n_success} of 1 GPU")

  def _reserve(self, size: int, alignment: int) -> int:
    """CPU (and so GPU) virtual address space: size bytes aligned to `alignment`, inside the GPUVM aperture."""
    span = size + alignment
    raw = self.kernel.mmap(0, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
    address = round_up(raw, alignment)
    if address > raw: self.kernel.munmap(raw, address - raw)
    if raw + span > address + size: self.kernel.munmap(address + size, raw + span - address - size)
    if not (self.gpuvm_base <= address and address + size - 1 <= self.gpuvm_limit):
      self.kernel.munmap(address, size)
      raise MemoryError(f"the CPU placed {size:#x} bytes at {address:#x}, outside the GPU's virtual address range "
                        f"{self.gpuvm_base:#x}-{self.gpuvm_limit:#x}")
    return address

  # ** freeing

  def free(self, allocation: Allocation) -> None:
    """Unmap from the GPU, free the buffer object, give the address space back (the GPU must be done with it)."""
    if allocation.freed: return
    allocation.freed = True
    args = kfd.kfd_ioctl_unmap_memory_from_gpu_args(handle=allocation.handle,
                                                    device_ids_array_ptr=ctypes.addressof(self.device_ids), n_devices=1)
    self.kfd.call(kfd.AMDKFD_IOC_UNMAP_MEMORY_FROM_GPU, args)
    self.kfd.call(kfd.AMDKFD_IOC_FREE_MEMORY_OF_GPU, kfd.kfd_ioctl_free_memory_of_gpu_args(handle=allocation.handle))
    allocation.host = None
    self.kernel.munmap(allocation.address, allocation.nbytes)

  def free_after(self, allocation: Allocation, timeline_value: int) -> None:
    """Free once the device's timeline reaches the value (work submitted before may still use the memory). Safe to
    call from a finalizer on any thread: it only appends."""
    self.pending.append((timeline_value, allocation))

  def reclaim(self, completed: int) -> None:
    """Free what the device is done with."""
    with self.lock:
      for _ in range(len(self.pending)):
        entry = self.pending.popleft()
        if entry[0] <= completed: self.free(entry[1])
        else: self.pending.append(entry)

  def close(self) -> None:
    self.kernel.close(self.render_fd)
