"""The words an AMD GPU reads: AQL packets (hsa.h), PM4 type-3 packets of the command processor (soc15d.h for gfx9,
nvd.h for gfx10/11) and SDMA packets (vega10_sdma_pkt_open.h for SDMA 4, sdma_v6_0_0_pkt_open.h for SDMA 6), built
from the generated bindings. Pure functions: numbers in, 32-bit words (or the 64 bytes of an AQL packet) out.

The PM4 layouts are the ones amdgpu itself emits (gfx_v9_0.c / gfx_v11_0.c: ring_emit_fence, wait_reg_mem,
emit_mem_sync); the SDMA ones are the headers' field tables, whose NAME = (hi, lo) ranges count bits over a packet.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from types import ModuleType

from rawgrad.autogen.amd import hsa, pm4_gfx9, pm4_gfx11, sdma_v4, sdma_v6

AQL_PACKET_BYTES = 64
# ROCr's format code for a vendor-specific AQL packet whose body is a PM4 INDIRECT_BUFFER (AMD_AQL_FORMAT_PM4_IB);
# the CP firmware of gfx9 and later runs it. The body after the 4-word jump: its length in dwords, then reserved.
AQL_FORMAT_PM4_IB = 1
PM4_IB_REMAINING_DWORDS = 10
# WAIT_REG_MEM / POLL_REGMEM compare functions (soc15d.h's comment; the SDMA headers use the same codes)
FUNCTION_GREATER_OR_EQUAL = 5
# RELEASE_MEM: what it writes (DATA_SEL) and whether it interrupts (INT_SEL), from soc15d.h's comments
DATA_LOW_32, DATA_64, DATA_GPU_CLOCK = 1, 2, 3
INTERRUPT_AFTER_WRITE = 2
EOP_EVENT_INDEX = 5            # end-of-pipe timestamp events take index 5
POLL_INTERVAL = 4              # clocks between polls of a WAIT_REG_MEM
SDMA_POLL_INTERVAL = 10
SDMA_POLL_FOREVER = 0xFFF      # retry count: poll until the condition holds
SDMA_UNCACHED = 3              # MTYPE UC for fence writes the host polls (sdma_v6_0.c)
# amdgpu copies at most 4 MiB with one linear-copy packet on both SDMA 4 and 6 (copy_max_bytes)
SDMA_COPY_MAX_BYTES = 1 << 22


@dataclass(frozen=True)
class Family:
  """Which packet headers a chip's engines speak."""
  name: str
  pm4: ModuleType
  sdma: ModuleType
  wave32: bool        # the kernels run 32 lanes to a wave
  scratch_granule: int  # COMPUTE_TMPRING_SIZE.WAVESIZE counts scratch per wave in these bytes (ROCr's tmpring fill)


FAMILIES = {"gfx1100": Family("gfx11", pm4_gfx11, sdma_v6, True, 256),
            "gfx942": Family("gfx9", pm4_gfx9, sdma_v4, False, 1024)}


def family(arch: str) -> Family:
  if arch not in FAMILIES:
    raise ValueError(f"no AMD packet family for {arch}; rawgrad drives {', '.join(sorted(FAMILIES))}")
  return FAMILIES[arch]


def tmpring_size(family_: Family, waves: int, wave_bytes: int) -> int:
  """COMPUTE_TMPRING_SIZE: how many waves may hold scratch at once, and each one's scratch in the family's granule."""
  pm4 = family_.pm4
  units = -(-wave_bytes // family_.scratch_granule)
  waves_field = waves << pm4.COMPUTE_TMPRING_SIZE__WAVES__SHIFT
  size_field = units << pm4.COMPUTE_TMPRING_SIZE__WAVESIZE__SHIFT
  if waves_field & ~pm4.COMPUTE_TMPRING_SIZE__WAVES_MASK or size_field & ~pm4.COMPUTE_TMPRING_SIZE__WAVESIZE_MASK:
    raise ValueError(f"{waves} waves of {wave_bytes} scratch bytes do not fit COMPUTE_TMPRING_SIZE")
  return waves_field | size_field


def split64(value: int) -> tuple[int, int]:
  return value & 0xFFFFFFFF, (value >> 32) & 0xFFFFFFFF


# *** packets as words with (hi, lo) fields ***

def put_fields(dwords: int, fields: dict[tuple[int, int], int]) -> list[int]:
  """A packet of `dwords` words with each (hi, lo) range (bits over the whole packet) set to its value."""
  words = [0] * dwords
  for (hi, lo), value in fields.items():
    width = hi - lo + 1
    if not 0 <= value < 1 << width:
      raise ValueError(f"{value:#x} does not fit the {width}-bit field at bits {hi}:{lo}")
    if lo // 32 != hi // 32: raise ValueError(f"field {hi}:{lo} crosses a dword")
    words[lo // 32] |= value << (lo % 32)
  return words


def get_field(words: list[int], bits: tuple[int, int]) -> int:
  hi, lo = bits
  return (words[lo // 32] >> (lo % 32)) & ((1 << (hi - lo + 1)) - 1)


# *** AQL ***

def aql_header(packet_type: int, barrier: bool = True, acquire: int = hsa.HSA_FENCE_SCOPE_SYSTEM,
               release: int = hsa.HSA_FENCE_SCOPE_SYSTEM) -> int:
  """The 16-bit AQL header: type, barrier (wait for every packet before), acquire and release fence scopes."""
  return (packet_type << hsa.HSA_PACKET_HEADER_TYPE | int(barrier) << hsa.HSA_PACKET_HEADER_BARRIER
          | acquire << hsa.HSA_PACKET_HEADER_ACQUIRE_FENCE_SCOPE | release << hsa.HSA_PACKET_HEADER_RELEASE_FENCE_SCOPE)


def dimensions(grid: tuple[int, int, int], workgroup: tuple[int, int, int]) -> int:
  """How many dimensions a launch uses (an AQL packet's setup); the ones past it must be 1."""
  used = [d for d in range(3) if grid[d] > 1 or workgroup[d] > 1]
  return max(used, default=0) + 1


def dispatch_packet(kernel_object: int, kernarg_address: int, grid: tuple[int, int, int],
                    workgroup: tuple[int, int, int], group_segment_bytes: int,
                    private_segment_bytes: int) -> hsa.hsa_kernel_dispatch_packet_t:
  """A kernel dispatch packet; `grid` counts work-items (AQL's grid is work-items, not workgroups). Its header stays
  0 (INVALID): the queue writes it last, so the packet processor never sees half a packet."""
  if any(not 0 < size < 1 << 16 for size in workgroup):
    raise ValueError(f"a workgroup of {workgroup} work-items does not fit AQL's 16-bit sizes")
  if any(not 0 < size < 1 << 32 for size in grid):
    raise ValueError(f"a grid of {grid} work-items does not fit AQL's 32-bit sizes")
  packet = hsa.hsa_kernel_dispatch_packet_t(
    setup=dimensions(grid, workgroup) << hsa.HSA_KERNEL_DISPATCH_PACKET_SETUP_DIMENSIONS,
    workgroup_size_x=workgroup[0], workgroup_size_y=workgroup[1], workgroup_size_z=workgroup[2],
    grid_size_x=grid[0], grid_size_y=grid[1], grid_size_z=grid[2], private_segment_size=private_segment_bytes,
    group_segment_size=group_segment_bytes, kernel_object=kernel_object, kernarg_address=kernarg_address)
  return packet


def pm4_ib_packet(family_: Family, ib_address: int, ib_dwords: int) -> hsa.hsa_ext_amd_aql_pm4_packet_t:
  """A vendor-specific AQL packet that makes the CP run `ib_dwords` PM4 words at `ib_address` (header left 0)."""
  if ib_address % 4: raise ValueError(f"a PM4 indirect buffer must be dword aligned, not at {ib_address:#x}")
  pm4 = family_.pm4
  low, high = split64(ib_address)
  words = [pm4.PACKET3(pm4.PACKET3_INDIRECT_BUFFER, 2), low, high, ib_dwords | pm4.INDIRECT_BUFFER_VALID,
           PM4_IB_REMAINING_DWORDS]
  packet = hsa.hsa_ext_amd_aql_pm4_packet_t()
  body = (ctypes.c_uint32 * 13).from_buffer(packet, 4)   # after the header and the format's 16 bits
  packet.pm4_command[0] = AQL_FORMAT_PM4_IB
  body[:len(words)] = words
  return packet


# *** PM4 (compute queue, inside indirect buffers) ***

def release_mem(family_: Family, address: int, data: int, data_select: int, interrupt: bool = False,
                timestamp_event: bool = False) -> list[int]:
  """RELEASE_MEM: once earlier work is done, write data (DATA_LOW_32, DATA_64) or the GPU clock (DATA_GPU_CLOCK) to
  address, flushing caches first so the host sees every earlier write; optionally interrupt."""
  pm4 = family_.pm4
  alignment = 4 if data_select == DATA_LOW_32 else 8
  if address % alignment: raise ValueError(f"RELEASE_MEM writes to {alignment}-byte aligned memory, not {address:#x}")
  event = pm4.BOTTOM_OF_PIPE_TS if timestamp_event else pm4.CACHE_FLUSH_AND_INV_TS_EVENT
  interrupt_select = INTERRUPT_AFTER_WRITE if interrupt else 0
  if family_.name == "gfx9":
    event_control = (pm4.EOP_TCL1_ACTION_EN | pm4.EOP_TC_ACTION_EN | pm4.EOP_TC_WB_ACTION_EN | pm4.EOP_TC_MD_ACTION_EN
                     | pm4.EVENT_TYPE(event) | pm4.EVENT_INDEX(EOP_EVENT_INDEX))
    data_control = pm4.DATA_SEL(data_select) | pm4.INT_SEL(interrupt_select)
  else:
    event_control = (pm4.PACKET3_RELEASE_MEM_GCR_SEQ | pm4.PACKET3_RELEASE_MEM_GCR_GL2_WB
                     | pm4.PACKET3_RELEASE_MEM_GCR_GL2_INV | pm4.PACKET3_RELEASE_MEM_GCR_GL2_US
                     | pm4.PACKET3_RELEASE_MEM_GCR_GL1_INV | pm4.PACKET3_RELEASE_MEM_GCR_GLV_INV
                     | pm4.PACKET3_RELEASE_MEM_GCR_GLM_INV | pm4.PACKET3_RELEASE_MEM_GCR_GLM_WB
                     | pm4.PACKET3_RELEASE_MEM_CACHE_POLICY(3) | pm4.PACKET3_RELEASE_MEM_EVENT_TYPE(event)
                     | pm4.PACKET3_RELEASE_MEM_EVENT_INDEX(EOP_EVENT_INDEX))
    data_control = pm4.PACKET3_RELEASE_MEM_DATA_SEL(data_select) | pm4.PACKET3_RELEASE_MEM_INT_SEL(interrupt_select)
  # the last word is the interrupt's context id: KFD takes it as the event id to signal (kfd_int_process_v*.c)
  return [pm4.PACKET3(pm4.PACKET3_RELEASE_MEM, 6), event_control, data_control, *split64(address), *split64(data),
          data & 0xFFFFFFFF if interrupt else 0]


def wait_memory(family_: Family, address: int, value: int) -> list[int]:
  """WAIT_REG_MEM: stall the queue until the 32-bit word at address is at least value."""
  pm4 = family_.pm4
  if address % 4: raise ValueError(f"WAIT_REG_MEM polls dword-aligned memory, not {address:#x}")
  control = (pm4.WAIT_REG_MEM_MEM_SPACE(1) | pm4.WAIT_REG_MEM_OPERATION(0)
             | pm4.WAIT_REG_MEM_FUNCTION(FUNCTION_GREATER_OR_EQUAL) | pm4.WAIT_REG_MEM_ENGINE(0))
  return [pm4.PACKET3(pm4.PACKET3_WAIT_REG_MEM, 5), control, *split64(address), value, 0xFFFFFFFF, POLL_INTERVAL]


def acquire_memory(family_: Family) -> list[int]:
  """ACQUIRE_MEM over all memory: write back and invalidate the GPU caches, so later work and the host agree."""
  pm4 = family_.pm4
  if family_.name == "gfx9":
    control = (pm4.PACKET3_ACQUIRE_MEM_CP_COHER_CNTL_SH_ICACHE_ACTION_ENA(1)
               | pm4.PACKET3_ACQUIRE_MEM_CP_COHER_CNTL_SH_KCACHE_ACTION_ENA(1)
               | pm4.PACKET3_ACQUIRE_MEM_CP_COHER_CNTL_TC_ACTION_ENA(1)
               | pm4.PACKET3_ACQUIRE_MEM_CP_COHER_CNTL_TCL1_ACTION_ENA(1)
               | pm4.PACKET3_ACQUIRE_MEM_CP_COHER_CNTL_TC_WB_ACTION_ENA(1))
    return [pm4.PACKET3(pm4.PACKET3_ACQUIRE_MEM, 5), control, 0xFFFFFFFF, 0xFFFFFF, 0, 0, 0xA]
  gcr = (pm4.PACKET3_ACQUIRE_MEM_GCR_CNTL_GL2_INV(1) | pm4.PACKET3_ACQUIRE_MEM_GCR_CNTL_GL2_WB(1)
         | pm4.PACKET3_ACQUIRE_MEM_GCR_CNTL_GLM_INV(1) | pm4.PACKET3_ACQUIRE_MEM_GCR_CNTL_GLM_WB(1)
         | pm4.PACKET3_ACQUIRE_MEM_GCR_CNTL_GL1_INV(1) | pm4.PACKET3_ACQUIRE_MEM_GCR_CNTL_GLV_INV(1)
         | pm4.PACKET3_ACQUIRE_MEM_GCR_CNTL_GLK_INV(1) | pm4.PACKET3_ACQUIRE_MEM_GCR_CNTL_GLI_INV(1))
  return [pm4.PACKET3(pm4.PACKET3_ACQUIRE_MEM, 6), 0, 0xFFFFFFFF, 0xFFFFFF, 0, 0, 0xA, gcr]


# *** SDMA (copy queue) ***

def sdma_copy(family_: Family, dest: int, source: int, nbytes: int) -> list[int]:
  """Linear copies of nbytes, in pieces one packet can count (COUNT is bytes - 1 from SDMA 4 on)."""
  sdma = family_.sdma
  count_bits = sdma.SDMA_PKT_COPY_LINEAR_COUNT_count
  chunk = min(SDMA_COPY_MAX_BYTES, 1 << (count_bits[0] - count_bits[1] + 1))
  words: list[int] = []
  for start in range(0, nbytes, chunk):
    length = min(chunk, nbytes - start)
    source_low, source_high = split64(source + start)
    dest_low, dest_high = split64(dest + start)
    words += put_fields(7, {sdma.SDMA_PKT_COPY_LINEAR_HEADER_op: sdma.SDMA_OP_COPY,
                            sdma.SDMA_PKT_COPY_LINEAR_HEADER_sub_op: sdma.SDMA_SUBOP_COPY_LINEAR,
                            count_bits: length - 1,
                            sdma.SDMA_PKT_COPY_LINEAR_SRC_ADDR_LO_src_addr_31_0: source_low,
                            sdma.SDMA_PKT_COPY_LINEAR_SRC_ADDR_HI_src_addr_63_32: source_high,
                            sdma.SDMA_PKT_COPY_LINEAR_DST_ADDR_LO_dst_addr_31_0: dest_low,
                            sdma.SDMA_PKT_COPY_LINEAR_DST_ADDR_HI_dst_addr_63_32: dest_high})
  return words


def sdma_fence(family_: Family, address: int, value: int) -> list[int]:
  """FENCE: write a 32-bit value to dword-aligned memory once earlier packets are done."""
  sdma = family_.sdma
  if address % 4: raise ValueError(f"an SDMA fence writes dword-aligned memory, not {address:#x}")
  low, high = split64(address)
  fields = {sdma.SDMA_PKT_FENCE_HEADER_op: sdma.SDMA_OP_FENCE, sdma.SDMA_PKT_FENCE_ADDR_LO_addr_31_0: low,
            sdma.SDMA_PKT_FENCE_ADDR_HI_addr_63_32: high, sdma.SDMA_PKT_FENCE_DATA_data: value}
  if hasattr(sdma, "SDMA_PKT_FENCE_HEADER_mtype"): fields[sdma.SDMA_PKT_FENCE_HEADER_mtype] = SDMA_UNCACHED
  return put_fields(4, fields)


def sdma_fence64(family_: Family, address: int, value: int) -> list[int]:
  """A 64-bit value as two fences, low word first (as amdgpu writes 64-bit fences): a reader between the two sees
  the new low word under the old high one, which for a growing timeline is never more than the old value."""
  low, high = split64(value)
  return sdma_fence(family_, address, low) + sdma_fence(family_, address + 4, high)


def sdma_trap(family_: Family, context: int) -> list[int]:
  """TRAP: an interrupt whose context KFD takes as the event id to signal (28 bits)."""
  sdma = family_.sdma
  return put_fields(2, {sdma.SDMA_PKT_TRAP_HEADER_op: sdma.SDMA_OP_TRAP,
                        sdma.SDMA_PKT_TRAP_INT_CONTEXT_int_context: context})


def sdma_wait_memory(family_: Family, address: int, value: int) -> list[int]:
  """POLL_REGMEM on memory: stall the queue until the 32-bit word at address is at least value."""
  sdma = family_.sdma
  if address % 4: raise ValueError(f"SDMA polls dword-aligned memory, not {address:#x}")
  low, high = split64(address)
  return put_fields(6, {sdma.SDMA_PKT_POLL_REGMEM_HEADER_op: sdma.SDMA_OP_POLL_REGMEM,
                        sdma.SDMA_PKT_POLL_REGMEM_HEADER_func: FUNCTION_GREATER_OR_EQUAL,
                        sdma.SDMA_PKT_POLL_REGMEM_HEADER_mem_poll: 1,
                        sdma.SDMA_PKT_POLL_REGMEM_ADDR_LO_addr_31_0: low,
                        sdma.SDMA_PKT_POLL_REGMEM_ADDR_HI_addr_63_32: high,
                        sdma.SDMA_PKT_POLL_REGMEM_VALUE_value: value, sdma.SDMA_PKT_POLL_REGMEM_MASK_mask: 0xFFFFFFFF,
                        sdma.SDMA_PKT_POLL_REGMEM_DW5_interval: SDMA_POLL_INTERVAL,
                        sdma.SDMA_PKT_POLL_REGMEM_DW5_retry_count: SDMA_POLL_FOREVER})


def sdma_timestamp(family_: Family, address: int) -> list[int]:
  """TIMESTAMP (get global): write the 64-bit GPU clock to 8-byte aligned memory."""
  sdma = family_.sdma
  if address % 8: raise ValueError(f"an SDMA timestamp goes to 8-byte aligned memory, not {address:#x}")
  low, high = split64(address)
  return put_fields(3, {sdma.SDMA_PKT_TIMESTAMP_GET_GLOBAL_HEADER_op: sdma.SDMA_OP_TIMESTAMP,
                        sdma.SDMA_PKT_TIMESTAMP_GET_GLOBAL_HEADER_sub_op: sdma.SDMA_SUBOP_TIMESTAMP_GET_GLOBAL,
                        sdma.SDMA_PKT_TIMESTAMP_GET_GLOBAL_WRITE_ADDR_LO_write_addr_31_3: low >> 3,
                        sdma.SDMA_PKT_TIMESTAMP_GET_GLOBAL_WRITE_ADDR_HI_write_addr_63_32: high})


def sdma_nop(family_: Family) -> list[int]:
  """A one-word NOP (pads the ring so no packet wraps around its end)."""
  return put_fields(1, {family_.sdma.SDMA_PKT_NOP_HEADER_op: family_.sdma.SDMA_OP_NOP})
