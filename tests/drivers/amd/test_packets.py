"""The packet encoders, word by word: the layouts amdgpu itself emits (RELEASE_MEM, WAIT_REG_MEM, ACQUIRE_MEM, SDMA
fences and copies), AQL dispatch and vendor packets, the scratch ring register, and the values they refuse."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from rawgrad.autogen.amd import hsa
from rawgrad.drivers.amd import packets
from rawgrad.drivers.amd.emulated import CHIPS, EmulatedKernel, context_save_bytes
from rawgrad.drivers.amd.kfd import gpu_node
from rawgrad.drivers.amd.queues import context_save_sizes, queue_error_text

GFX9, GFX11 = packets.family("gfx942"), packets.family("gfx1100")


@pytest.mark.parametrize("family", [GFX9, GFX11])
def test_release_mem_writes_a_64_bit_value_and_interrupts(family: packets.Family) -> None:
  words = packets.release_mem(family, 0x1234_5678_9A00, 0x1_0000_0007, packets.DATA_64, interrupt=True)
  assert len(words) == 8 and words[0] == 0xC0064900                     # PACKET3(RELEASE_MEM, 6)
  assert words[1] & 0x3F == 0x14 and (words[1] >> 8) & 0xF == 5         # CACHE_FLUSH_AND_INV_TS_EVENT, index 5
  assert (words[2] >> 29, (words[2] >> 24) & 7) == (2, 2)                # 64-bit data, interrupt after the write
  assert words[3:7] == [0x5678_9A00, 0x1234, 7, 1] and words[7] == 7     # the context carries the data's low word
  timestamp = packets.release_mem(family, 0x1000, 0, packets.DATA_GPU_CLOCK, timestamp_event=True)
  assert timestamp[1] & 0x3F == 0x28 and timestamp[2] >> 29 == 3 and timestamp[7] == 0   # BOTTOM_OF_PIPE_TS
  with pytest.raises(ValueError, match="8-byte aligned memory, not 0x1004"):
    packets.release_mem(family, 0x1004, 0, packets.DATA_64)


def test_release_mem_flushes_each_familys_caches() -> None:
  gfx9 = packets.release_mem(GFX9, 0x1000, 1, packets.DATA_64)[1]
  gfx11 = packets.release_mem(GFX11, 0x1000, 1, packets.DATA_64)[1]
  assert gfx9 & (1 << 17) and gfx9 & (1 << 15)         # EOP_TC_ACTION_EN, EOP_TC_WB_ACTION_EN
  assert gfx11 & (1 << 21) and gfx11 & (1 << 22)       # GCR_GL2_WB, GCR_SEQ


@pytest.mark.parametrize("family", [GFX9, GFX11])
def test_wait_reg_mem_polls_memory_for_greater_or_equal(family: packets.Family) -> None:
  words = packets.wait_memory(family, 0xABC0, 42)
  assert words == [0xC0053C00, 5 | 1 << 4, 0xABC0, 0, 42, 0xFFFFFFFF, packets.POLL_INTERVAL]


def test_acquire_mem_per_family() -> None:
  assert len(packets.acquire_memory(GFX9)) == 7 and packets.acquire_memory(GFX9)[0] == 0xC0055800
  assert len(packets.acquire_memory(GFX11)) == 8 and packets.acquire_memory(GFX11)[0] == 0xC0065800


@pytest.mark.parametrize("family", [GFX9, GFX11])
def test_sdma_linear_copies_count_bytes_minus_one_in_4_mib_pieces(family: packets.Family) -> None:
  words = packets.sdma_copy(family, 0x2000_0000, 0x1000_0000, (4 << 20) + 10)
  assert len(words) == 14
  assert words[:7] == [1, (4 << 20) - 1, 0, 0x1000_0000, 0, 0x2000_0000, 0]
  assert words[7:] == [1, 9, 0, 0x1040_0000, 0, 0x2040_0000, 0]


@pytest.mark.parametrize("family", [GFX9, GFX11])
def test_sdma_fences_write_64_bits_low_word_first(family: packets.Family) -> None:
  words = packets.sdma_fence64(family, 0x3000, 0x5_0000_0009)
  assert [w & 0xFF for w in (words[0], words[4])] == [5, 5]
  assert (words[1], words[3]) == (0x3000, 9) and (words[5], words[7]) == (0x3004, 5)
  uncached = (words[0] >> 16) & 7
  assert uncached == (packets.SDMA_UNCACHED if family is GFX11 else 0)   # MTYPE exists from SDMA 6
  with pytest.raises(ValueError, match="dword-aligned memory, not 0x3002"):
    packets.sdma_fence(family, 0x3002, 1)


@pytest.mark.parametrize("family", [GFX9, GFX11])
def test_sdma_poll_trap_and_timestamp(family: packets.Family) -> None:
  poll = packets.sdma_wait_memory(family, 0x4000, 77)
  assert poll[0] == 8 | 5 << 28 | 1 << 31 and poll[1:5] == [0x4000, 0, 77, 0xFFFFFFFF]
  assert poll[5] == packets.SDMA_POLL_INTERVAL | packets.SDMA_POLL_FOREVER << 16
  assert packets.sdma_trap(family, 0xABCDEF) == [6, 0xABCDEF]
  assert packets.sdma_timestamp(family, 0x5008) == [13 | 2 << 8, 0x5008, 0]
  with pytest.raises(ValueError, match="does not fit the 28-bit field"):
    packets.sdma_trap(family, 1 << 28)


def test_a_dispatch_packet_counts_work_items() -> None:
  packet = packets.dispatch_packet(0x7000, 0x8000, (256, 3, 1), (64, 1, 1), 1024, 0)
  assert ctypes.sizeof(packet) == 64 and packet.header == 0   # the queue writes the header last
  assert (packet.setup, packet.grid_size_x, packet.grid_size_y, packet.workgroup_size_x) == (2, 256, 3, 64)
  assert (packet.kernel_object, packet.kernarg_address, packet.group_segment_size) == (0x7000, 0x8000, 1024)
  assert packets.dimensions((1, 1, 1), (1, 1, 1)) == 1 and packets.dimensions((4, 1, 2), (1, 1, 1)) == 3
  with pytest.raises(ValueError, match=r"workgroup of \(65536, 1, 1\)"):
    packets.dispatch_packet(0, 0, (65536, 1, 1), (65536, 1, 1), 0, 0)


@pytest.mark.parametrize("family", [GFX9, GFX11])
def test_a_vendor_packet_jumps_to_a_pm4_indirect_buffer(family: packets.Family) -> None:
  packet = packets.pm4_ib_packet(family, 0x1_2345_6700, 24)
  words = np.frombuffer(bytes(packet), dtype=np.uint32)
  assert int(words[0]) >> 16 == packets.AQL_FORMAT_PM4_IB
  assert [int(w) for w in words[1:6]] == [0xC0023F00, 0x2345_6700, 1, 24 | 1 << 23, 10]
  assert ctypes.sizeof(packet) == 64 and packet.completion_signal.handle == 0
  assert packets.aql_header(hsa.HSA_PACKET_TYPE_VENDOR_SPECIFIC) == 1 << 8 | 2 << 9 | 2 << 11


def test_scratch_ring_sizes_per_family() -> None:
  # gfx11 counts a wave's scratch in 256-byte units, gfx9 in KiB (13 bits of them)
  assert packets.tmpring_size(GFX11, 3072, 4096) == 3072 | 16 << 12
  assert packets.tmpring_size(GFX9, 1216, 4096) == 1216 | 4 << 12
  with pytest.raises(ValueError, match="do not fit COMPUTE_TMPRING_SIZE"):
    packets.tmpring_size(GFX9, 5000, 1024)


@pytest.mark.parametrize("arch", ["gfx1100", "gfx942"])
def test_the_driver_sizes_the_context_save_area_as_kfd_expects(arch: str) -> None:
  node = gpu_node(EmulatedKernel(arch=arch), 0)
  save, control, debugger = context_save_sizes(node, arch)
  assert (save, control) == context_save_bytes(CHIPS[arch]) and save % 4096 == 0 and debugger > 0


def test_queue_errors_read_as_rocr_reads_them() -> None:
  assert queue_error_text(0x20) == "invalid packet format"
  assert queue_error_text(0x2 | 0x40) == "invalid dimensions; workgroup too large"
  assert queue_error_text(0x10000) == "an unknown error"
