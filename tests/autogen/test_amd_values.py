"""Well-known AMD values, checked against what the generated bindings say (numbers from the KFD, HSA and amdgpu
headers; the ioctl numbers are _IOWR('K', nr, struct), so they also pin the structures' sizes)."""
from __future__ import annotations

import ctypes

import rawgrad.autogen.amd as amd
from rawgrad.autogen.amd import hsa, kernel_descriptor, kfd, pm4_gfx9, pm4_gfx11, sdma_v4, sdma_v6


def request(direction: int, number: int, size: int) -> int:
  return (direction << 30) | (size << 16) | (ord("K") << 8) | number


def test_generated_from_kfd_interface_1_x():
  assert amd.KFD_IOCTL_VERSION[0] == 1 and amd.KFD_IOCTL_VERSION == (kfd.KFD_IOCTL_MAJOR_VERSION,
                                                                       kfd.KFD_IOCTL_MINOR_VERSION)
  assert amd.SOURCE_PACKAGES["linux-libc-dev"].startswith("6.1.")


def test_kfd_requests_encode_their_argument_sizes():
  read, read_write = 2, 3
  assert kfd.AMDKFD_IOC_GET_VERSION == request(read, 0x01, 8) == 0x80084B01
  assert kfd.AMDKFD_IOC_CREATE_QUEUE == request(read_write, 0x02, ctypes.sizeof(kfd.kfd_ioctl_create_queue_args))
  assert ctypes.sizeof(kfd.kfd_ioctl_create_queue_args) == 88
  assert kfd.AMDKFD_IOC_ACQUIRE_VM == request(1, 0x15, 8)
  assert kfd.AMDKFD_IOC_ALLOC_MEMORY_OF_GPU == request(read_write, 0x16, 40)
  assert kfd.AMDKFD_IOC_MAP_MEMORY_TO_GPU == request(read_write, 0x18, 24)
  assert kfd.AMDKFD_IOC_WAIT_EVENTS == request(read_write, 0x0C, 24)
  assert kfd.AMDKFD_IOC_GET_CLOCK_COUNTERS == request(read_write, 0x05, 40)


def test_kfd_flags_and_types():
  assert (kfd.KFD_IOC_ALLOC_MEM_FLAGS_VRAM, kfd.KFD_IOC_ALLOC_MEM_FLAGS_GTT) == (1, 2)
  assert kfd.KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE == 1 << 31 and kfd.KFD_IOC_ALLOC_MEM_FLAGS_COHERENT == 1 << 26
  assert (kfd.KFD_IOC_QUEUE_TYPE_SDMA, kfd.KFD_IOC_QUEUE_TYPE_COMPUTE_AQL) == (1, 2)
  assert (kfd.KFD_IOC_EVENT_SIGNAL, kfd.KFD_IOC_EVENT_MEMORY, kfd.KFD_IOC_WAIT_RESULT_TIMEOUT) == (0, 8, 1)
  assert kfd.kfd_event_data.memory_exception_data.offset == 0 and ctypes.sizeof(kfd.kfd_event_data) == 48


def test_aql_packets_are_64_bytes():
  for packet in (hsa.hsa_kernel_dispatch_packet_t, hsa.hsa_barrier_and_packet_t, hsa.hsa_agent_dispatch_packet_t):
    assert ctypes.sizeof(packet) == 64
  dispatch = hsa.hsa_kernel_dispatch_packet_t
  assert (dispatch.grid_size_x.offset, dispatch.kernel_object.offset, dispatch.kernarg_address.offset,
          dispatch.completion_signal.offset) == (12, 32, 40, 56)
  assert hsa.hsa_barrier_and_packet_t.dep_signal.offset == 8
  assert (hsa.HSA_PACKET_TYPE_INVALID, hsa.HSA_PACKET_TYPE_KERNEL_DISPATCH,
          hsa.HSA_PACKET_TYPE_BARRIER_AND) == (1, 2, 3)
  assert (hsa.HSA_PACKET_HEADER_BARRIER, hsa.HSA_PACKET_HEADER_ACQUIRE_FENCE_SCOPE,
          hsa.HSA_PACKET_HEADER_RELEASE_FENCE_SCOPE, hsa.HSA_FENCE_SCOPE_SYSTEM) == (8, 9, 11, 2)


def test_amd_signal_and_queue():
  assert ctypes.sizeof(hsa.amd_signal_t) == 64 and ctypes.sizeof(hsa.amd_queue_t) == 256
  assert (hsa.amd_signal_t.value.offset, hsa.amd_signal_t.event_mailbox_ptr.offset, hsa.amd_signal_t.event_id.offset,
          hsa.amd_signal_t.start_ts.offset, hsa.amd_signal_t.end_ts.offset) == (8, 16, 24, 32, 40)
  assert hsa.amd_queue_t.write_dispatch_id.offset == 56 and hsa.amd_queue_t.read_dispatch_id.offset == 128
  assert hsa.AMD_KERNEL_CODE_PROPERTIES_ENABLE_SGPR_KERNARG_SEGMENT_PTR == 1 << 3


def test_sdma_fields_are_hi_lo_over_the_packet():
  for sdma in (sdma_v4, sdma_v6):
    assert (sdma.SDMA_OP_COPY, sdma.SDMA_OP_FENCE, sdma.SDMA_OP_TRAP, sdma.SDMA_OP_POLL_REGMEM) == (1, 5, 6, 8)
    assert sdma.SDMA_PKT_COPY_LINEAR_HEADER_op == (7, 0) and sdma.SDMA_PKT_COPY_LINEAR_HEADER_sub_op == (15, 8)
    assert sdma.SDMA_PKT_FENCE_DATA_data == (127, 96)
    assert sdma.SDMA_PKT_COPY_LINEAR_DST_ADDR_HI_dst_addr_63_32 == (223, 192)
    assert sdma.SDMA_PKT_POLL_REGMEM_HEADER_mem_poll == (31, 31) and sdma.SDMA_PKT_POLL_REGMEM_HEADER_func == (30, 28)
    assert sdma.SDMA_PKT_COPY_LINEAR_HEADER_SUB_OP(3) == 3 << 8   # the header's builder functions, too
  # SDMA 4 counts 22 bits of bytes per linear copy, SDMA 6 30 bits
  assert sdma_v4.SDMA_PKT_COPY_LINEAR_COUNT_count == (53, 32) and sdma_v6.SDMA_PKT_COPY_LINEAR_COUNT_count == (61, 32)


def test_pm4_packets():
  for pm4 in (pm4_gfx9, pm4_gfx11):
    assert pm4.PACKET3(pm4.PACKET3_RELEASE_MEM, 6) == 0xC0064900   # bit 31 set: kept as the unsigned word
    assert (pm4.PACKET3_INDIRECT_BUFFER, pm4.PACKET3_WAIT_REG_MEM, pm4.PACKET3_ACQUIRE_MEM) == (0x3F, 0x3C, 0x58)
    assert (pm4.CACHE_FLUSH_AND_INV_TS_EVENT, pm4.BOTTOM_OF_PIPE_TS) == (0x14, 0x28)
  assert pm4_gfx9.DATA_SEL(3) == 3 << 29 and pm4_gfx11.PACKET3_RELEASE_MEM_DATA_SEL(3) == 3 << 29
  assert pm4_gfx11.PACKET3_WAIT_REG_MEM64 == 0x93


def test_kernel_descriptor_layout_matches_what_the_loader_reads():
  # runtime/elf.py's load_amd_kernel reads the descriptor through this class; LLVM's header defines the offsets
  descriptor = kernel_descriptor.kernel_descriptor_t
  assert ctypes.sizeof(descriptor) == 64
  assert (descriptor.group_segment_fixed_size.offset, descriptor.private_segment_fixed_size.offset,
          descriptor.kernarg_size.offset, descriptor.kernel_code_entry_byte_offset.offset) == (0, 4, 8, 16)
  assert (descriptor.compute_pgm_rsrc3.offset, descriptor.compute_pgm_rsrc1.offset, descriptor.compute_pgm_rsrc2.offset,
          descriptor.kernel_code_properties.offset) == (44, 48, 52, 56)
  assert kernel_descriptor.KERNEL_CODE_PROPERTY_ENABLE_WAVEFRONT_SIZE32 == 1 << 10
  assert kernel_descriptor.KERNEL_CODE_PROPERTY_ENABLE_SGPR_KERNARG_SEGMENT_PTR == 1 << 3
  assert kernel_descriptor.KERNEL_CODE_ENTRY_BYTE_OFFSET_OFFSET == 16
