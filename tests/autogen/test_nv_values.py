"""Well-known NVIDIA values, checked against what the generated bindings say (numbers from the 580 headers and
from gcc's sizeof of them; GPU-FACTS.md lists the escapes and classes)."""
from __future__ import annotations

import ctypes

import rawgrad.autogen.nv as nv
from rawgrad.autogen.nv import nv_classes, nv_qmd, nv_rm, nv_uvm


def test_generated_for_the_580_branch():
  assert (nv.DRIVER_BRANCH, nv.SOURCE_TAG) == ("580", "580.142")


def test_rm_escapes():
  assert (nv_rm.NV_IOCTL_MAGIC, nv_rm.NV_IOCTL_BASE) == (ord("F"), 200)
  assert (nv_rm.NV_ESC_RM_FREE, nv_rm.NV_ESC_RM_CONTROL, nv_rm.NV_ESC_RM_ALLOC) == (0x29, 0x2A, 0x2B)
  assert (nv_rm.NV_ESC_RM_MAP_MEMORY, nv_rm.NV_ESC_RM_MAP_MEMORY_DMA) == (0x4E, 0x57)
  assert (nv_rm.NV_ESC_CARD_INFO, nv_rm.NV_ESC_REGISTER_FD) == (200, 201)


def test_ioctl_argument_sizes():
  # the kernel module rejects an escape whose size field differs from these (escape.c)
  assert ctypes.sizeof(nv_rm.NVOS21_PARAMETERS) == 32
  assert ctypes.sizeof(nv_rm.NVOS54_PARAMETERS) == 32
  assert ctypes.sizeof(nv_rm.NVOS00_PARAMETERS) == 16
  assert ctypes.sizeof(nv_rm.nv_ioctl_nvos33_parameters_with_fd) == 56
  assert nv_rm.NVOS54_PARAMETERS.params.offset == 16 and nv_rm.NVOS21_PARAMETERS.pAllocParms.offset == 16


def test_rm_object_classes():
  assert (nv_rm.NV01_ROOT_CLIENT, nv_rm.NV01_DEVICE_0, nv_rm.NV20_SUBDEVICE_0) == (0x41, 0x80, 0x2080)
  assert (nv_rm.FERMI_VASPACE_A, nv_rm.KEPLER_CHANNEL_GROUP_A, nv_rm.FERMI_CONTEXT_SHARE_A) == (0x90F1, 0xA06C, 0x9067)
  assert (nv_rm.NV01_MEMORY_SYSTEM, nv_rm.NV01_MEMORY_LOCAL_USER) == (0x3E, 0x40)


def test_hopper_engine_classes():
  assert nv_classes.HOPPER_COMPUTE_A == 0xCBC0
  assert nv_classes.HOPPER_DMA_COPY_A == 0xC8B5
  assert nv_classes.HOPPER_CHANNEL_GPFIFO_A == 0xC86F
  assert nv_classes.HOPPER_USERMODE_A == 0xC661
  assert nv_classes.NVC361_NOTIFY_CHANNEL_PENDING == 0x90  # the doorbell
  assert nv_classes.Nvc86fControl.GPPut.offset == 0x8C


def test_uvm_ioctl_numbers():
  assert nv_uvm.UVM_INITIALIZE == 0x30000001
  assert (nv_uvm.UVM_REGISTER_GPU, nv_uvm.UVM_REGISTER_GPU_VASPACE, nv_uvm.UVM_REGISTER_CHANNEL) == (37, 25, 27)
  assert (nv_uvm.UVM_CREATE_EXTERNAL_RANGE, nv_uvm.UVM_MAP_EXTERNAL_ALLOCATION) == (73, 33)


def test_status_codes():
  assert (nv_rm.NV_OK, nv_rm.NV_ERR_GENERIC, nv_rm.NV_ERR_INVALID_ARGUMENT) == (0, 0xFFFF, 0x1F)


def test_bit_ranges_are_hi_lo():
  assert nv_classes.NVC86F_GP_ENTRY0_GET == (31, 2)
  assert nv_rm.NVOS32_ATTR_LOCATION == (26, 25)
  assert nv_qmd.NVCBC0_QMDV04_00_QMD_MAJOR_VERSION == (583, 580)
  assert nv_qmd.NVC6C0_QMDV03_00_CTA_RASTER_WIDTH == (415, 384)


def test_indexed_ranges_are_functions():
  assert nv_qmd.NVCBC0_QMDV04_00_CONSTANT_BUFFER_ADDR_LOWER_SHIFTED6(0) == (1567, 1536)
  assert nv_qmd.NVCBC0_QMDV04_00_CONSTANT_BUFFER_ADDR_LOWER_SHIFTED6(1) == (1631, 1600)
  assert nv_uvm.UVM_IOCTL_BASE(37) == nv_uvm.UVM_REGISTER_GPU
