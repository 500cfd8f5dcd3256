"""Bring-up on the emulated KFD: the version check, the sysfs topology and the chips the driver refuses, and the ioctl
rules KFD itself applies (kfd_chardev.c): sizes taken from the request and zero-extended, unknown numbers, a second
render node for one GPU, memory freed while still mapped."""
from __future__ import annotations

import ctypes
import errno
import os

import pytest

from rawgrad.autogen.amd import kfd
from rawgrad.drivers import os as seam
from rawgrad.drivers.amd.device import AMDDevice
from rawgrad.drivers.amd.emulated import GPU_ID, EmulatedKernel
from rawgrad.drivers.amd.kfd import KFD, arch_name, gpu_node, gpu_nodes, parse_properties


def test_bring_up_reads_the_version_and_the_topology(device: AMDDevice) -> None:
  assert device.kfd.version == (1, 11)
  node = device.node
  assert (node.index, node.gpu_id, node.arch, node.gfx_target_version) == (1, GPU_ID, "gfx1100", 110000)
  assert node.compute_units == 96 and node.render_node == "/dev/dri/renderD128" and node.vram_bytes == 24 << 30
  assert device.target.arch == "gfx1100" and device.target.warp_size == 32
  # the emulated GPU runs the linear program carried after the code object
  assert device.compiler.embed_program and device.renderer.embed_program


def test_the_seam_alone_switches_the_driver_to_the_emulation() -> None:
  kernel = EmulatedKernel(arch="gfx1100")
  with seam.installed("amd", kernel):
    opened = AMDDevice("AMD")
  try:
    assert opened.kernel is kernel
  finally:
    opened.close()


def test_topology_lists_gpu_nodes_only() -> None:
  kernel = EmulatedKernel(arch="gfx942")
  nodes = gpu_nodes(kernel)
  assert [node.index for node in nodes] == [1]   # node 0 is the CPU
  assert nodes[0].arch == "gfx942" and nodes[0].xcc_count == 8 and nodes[0].compute_units == 304
  assert parse_properties("simd_count 192\nname gfx1100\nlocation_id 768\n") == {"simd_count": 192,
                                                                                 "location_id": 768}
  assert [arch_name(v) for v in (110000, 90402, 90010, 100300)] == ["gfx1100", "gfx942", "gfx90a", "gfx1030"]


def test_a_chip_rawgrad_does_not_drive_is_refused_by_name() -> None:
  kernel = EmulatedKernel(arch="gfx1100")
  path = "/sys/devices/virtual/kfd/kfd/topology/nodes/1/properties"
  kernel.sysfs[path] = kernel.sysfs[path].replace("gfx_target_version 110000", "gfx_target_version 90010")
  with pytest.raises(RuntimeError, match=r"gfx90a \(gfx_target_version 90010\); .* gfx1100 \(110000\), gfx942"):
    gpu_node(kernel, 0)
  with pytest.raises(RuntimeError, match="AMD:1 asked for, but KFD lists 1 GPU"):
    gpu_node(EmulatedKernel(arch="gfx1100"), 1)


@pytest.mark.skipif(os.path.exists("/dev/kfd"), reason="this machine has amdkfd")
def test_without_amdkfd_the_error_says_what_to_do() -> None:
  with pytest.raises(RuntimeError, match="/dev/kfd does not exist: no amdkfd driver on this machine .*EMULATE=1"):
    AMDDevice("AMD", seam.RealKernel())


def test_a_failed_bring_up_closes_kfd() -> None:
  kernel = EmulatedKernel(arch="gfx1100")
  path = "/sys/devices/virtual/kfd/kfd/topology/nodes/1/properties"
  kernel.sysfs[path] = kernel.sysfs[path].replace("gfx_target_version 110000", "gfx_target_version 100300")
  with pytest.raises(RuntimeError, match="gfx1030"):
    AMDDevice("AMD", kernel)
  assert kernel.files == {}


def test_another_kfd_major_version_is_refused() -> None:
  with pytest.raises(RuntimeError, match=r"KFD interface is 2\.0; rawgrad's bindings are for 1\.x"):
    KFD(EmulatedKernel(arch="gfx1100", version=(2, 0)))


def test_an_unknown_amd_arch_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setenv("AMD_ARCH", "gfx90a")
  with pytest.raises(ValueError, match="AMD_ARCH=gfx90a: the emulated KFD has gfx1100, gfx942"):
    EmulatedKernel()


def request(number: int, size: int) -> int:
  return seam.ioc(seam.IOC_READ | seam.IOC_WRITE, ord("K"), number, size)


def test_kfd_takes_the_size_the_request_says_and_zero_extends_it() -> None:
  kernel = EmulatedKernel(arch="gfx1100")
  fd = kernel.open("/dev/kfd")
  render = kernel.open("/dev/dri/renderD128")
  args = kfd.kfd_ioctl_acquire_vm_args(drm_fd=render, gpu_id=GPU_ID)
  # the request claims 4 bytes: KFD reads drm_fd only, and gpu_id arrives as zero
  with pytest.raises(OSError, match="gpu_id 0x0 is not a GPU") as refused:
    kernel.ioctl(fd, request(0x15, 4), args)
  assert refused.value.errno == errno.EINVAL
  kernel.ioctl(fd, kfd.AMDKFD_IOC_ACQUIRE_VM, args)   # the full size works
  # a buffer smaller than the request says would make the kernel read past it
  with pytest.raises(OSError) as short:
    kernel.ioctl(fd, request(0x16, 40), kfd.kfd_ioctl_acquire_vm_args())
  assert short.value.errno == errno.EFAULT and "says 40 bytes" in str(short.value)
  with pytest.raises(OSError) as unknown:
    kernel.ioctl(fd, request(0x7F, 8), kfd.kfd_ioctl_get_version_args())
  assert unknown.value.errno == errno.ENOTTY


def test_kfd_ioctl_errors_name_the_request_and_its_arguments() -> None:
  device_kfd = KFD(EmulatedKernel(arch="gfx1100"))
  args = kfd.kfd_ioctl_alloc_memory_of_gpu_args(va_addr=0x10_0000_0000, size=4096, gpu_id=GPU_ID,
                                                flags=kfd.KFD_IOC_ALLOC_MEM_FLAGS_GTT)
  with pytest.raises(OSError, match=r"AMDKFD_IOC_ALLOC_MEMORY_OF_GPU failed: ALLOC_MEMORY_OF_GPU before ACQUIRE_VM "
                                    r"\(va_addr=0x1000000000, size=0x1000, .*gpu_id=0xbc6e"):
    device_kfd.call(kfd.AMDKFD_IOC_ALLOC_MEMORY_OF_GPU, args)


def test_a_second_render_node_for_the_gpu_is_busy() -> None:
  kernel = EmulatedKernel(arch="gfx1100")
  fd = kernel.open("/dev/kfd")
  first, second = kernel.open("/dev/dri/renderD128"), kernel.open("/dev/dri/renderD128")
  kernel.ioctl(fd, kfd.AMDKFD_IOC_ACQUIRE_VM, kfd.kfd_ioctl_acquire_vm_args(drm_fd=first, gpu_id=GPU_ID))
  with pytest.raises(OSError) as busy:
    kernel.ioctl(fd, kfd.AMDKFD_IOC_ACQUIRE_VM, kfd.kfd_ioctl_acquire_vm_args(drm_fd=second, gpu_id=GPU_ID))
  assert busy.value.errno == errno.EBUSY


def test_memory_still_mapped_to_the_gpu_cannot_be_freed(device: AMDDevice) -> None:
  allocation = device.memory.gtt(4096)
  with pytest.raises(OSError, match="still mapped to the GPU") as busy:
    device.kfd.call(kfd.AMDKFD_IOC_FREE_MEMORY_OF_GPU, kfd.kfd_ioctl_free_memory_of_gpu_args(handle=allocation.handle))
  assert busy.value.errno == errno.EBUSY
  device.memory.free(allocation)   # unmap, then free
  assert allocation.handle not in device.kernel.process.objects


def test_queue_arguments_are_checked_as_kfd_checks_them(device: AMDDevice) -> None:
  ring = device.memory.gtt(8192)
  base = kfd.kfd_ioctl_create_queue_args(ring_base_address=ring.address, ring_size=3000, gpu_id=GPU_ID,
                                         queue_type=kfd.KFD_IOC_QUEUE_TYPE_SDMA, read_pointer_address=ring.address,
                                         write_pointer_address=ring.address + 8)
  with pytest.raises(OSError, match="ring_size 0xbb8 is not a power of two"):
    device.kfd.call(kfd.AMDKFD_IOC_CREATE_QUEUE, base)
  base.ring_size, base.queue_priority = 4096, 16
  with pytest.raises(OSError, match="queue_priority 16 is above 15"):
    device.kfd.call(kfd.AMDKFD_IOC_CREATE_QUEUE, base)
  base.queue_priority, base.ring_base_address = 7, 0x7000_0000_0000
  with pytest.raises(OSError, match="ring .* at 0x700000000000\\) is not mapped to the GPU"):
    device.kfd.call(kfd.AMDKFD_IOC_CREATE_QUEUE, base)
  base.ring_base_address, base.queue_type = ring.address, kfd.KFD_IOC_QUEUE_TYPE_COMPUTE_AQL
  with pytest.raises(OSError, match="eop_buffer_size 0 < 4096"):
    device.kfd.call(kfd.AMDKFD_IOC_CREATE_QUEUE, base)
  assert ctypes.sizeof(base) == 88
