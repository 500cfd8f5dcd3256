"""The OS seam: request encoding, the real kernel's mmap, and how EMULATE=1 and install() choose the interface."""
import ctypes
import os

import numpy as np
import pytest

from rawgrad.autogen.nv import nv_rm as rm
from rawgrad.drivers import os as seam
from rawgrad.drivers.nv.emulated import EmulatedKernel
from rawgrad.drivers.nv.rm import escape_request


def test_escape_requests_are_iowr_f_with_the_struct_size() -> None:
  # numbers from docs/nv-driver-notes.md 1.2 (the kernel decodes only the number and the size)
  assert escape_request(rm.NV_ESC_RM_ALLOC, rm.NVOS21_PARAMETERS()) == 0xC020462B
  assert escape_request(rm.NV_ESC_RM_CONTROL, rm.NVOS54_PARAMETERS()) == 0xC020462A
  assert escape_request(rm.NV_ESC_RM_MAP_MEMORY, rm.nv_ioctl_nvos33_parameters_with_fd()) == 0xC038464E
  assert escape_request(rm.NV_ESC_CARD_INFO, (rm.nv_ioctl_card_info_t * 1)()) == 0xC04846C8
  assert seam.ioc_size(0xC038464E) == 56 and seam.ioc_number(0xC038464E) == 0x4E
  with pytest.raises(ValueError, match="14-bit"):
    seam.ioc(3, 0x46, 1, 1 << 14)


def test_real_kernel_maps_at_a_fixed_address_and_views_the_bytes() -> None:
  kernel = seam.RealKernel()
  reserved = kernel.mmap(0, 1 << 20, seam.PROT_NONE, seam.MAP_PRIVATE | seam.MAP_ANONYMOUS | seam.MAP_NORESERVE, -1)
  try:
    inside = reserved + (256 << 10)
    mapped = kernel.mmap(inside, 8192, seam.PROT_READ | seam.PROT_WRITE,
                         seam.MAP_PRIVATE | seam.MAP_ANONYMOUS | seam.MAP_FIXED, -1)
    assert mapped == inside
    view = seam.host_view(mapped, 8192)
    view[:] = np.arange(8192) % 251
    assert ctypes.c_uint8.from_address(mapped + 300).value == 300 % 251
    kernel.write32(mapped + 8, 0xDEADBEEF)
    assert kernel.read32(mapped + 8) == 0xDEADBEEF
  finally:
    kernel.munmap(reserved, 1 << 20)


def test_real_kernel_errors_carry_the_errno() -> None:
  with pytest.raises(OSError) as refused:
    seam.RealKernel().mmap(0, 4096, seam.PROT_READ, seam.MAP_SHARED, 1 << 20)   # no such fd
  assert refused.value.errno == 9  # EBADF


def test_emulate_chooses_the_emulation_and_install_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setenv("EMULATE", "0")
  assert isinstance(seam.kernel_interface("nv"), seam.RealKernel)
  monkeypatch.setenv("EMULATE", "1")
  emulated = seam.kernel_interface("nv")
  assert isinstance(emulated, EmulatedKernel) and seam.kernel_interface("nv") is emulated   # one per process
  mine = EmulatedKernel(version="580.1.2")
  with seam.installed("nv", mine):
    assert seam.kernel_interface("nv") is mine
  assert seam.kernel_interface("nv") is emulated


def test_emulated_files_refuse_what_the_machine_lacks(kernel: EmulatedKernel) -> None:
  with pytest.raises(FileNotFoundError):
    kernel.open("/dev/nvidia3")
  with pytest.raises(OSError) as refused:
    kernel.close(12345)
  assert refused.value.errno == 9
  assert kernel.read_text("/sys/module/nvidia/version").strip() == "580.159.04"
  assert os.path.basename("/dev/nvidia-uvm") and kernel.exists("/dev/nvidia-uvm")
