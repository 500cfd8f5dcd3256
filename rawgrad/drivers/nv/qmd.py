"""QMDs (queue meta data: the compute engine's launch descriptor) and constant bank 0, built from a cubin's facts.

Hopper (HOPPER_COMPUTE_A) takes QMD V04_00 (384 bytes), Ampere and Ada V03_00 (256 bytes); the field bit ranges come
from the generated bindings (rawgrad/autogen/nv/nv_qmd.py, from open-gpu-doc). A QMD is built from zero, setting only
the fields a plain grid launch needs (docs/nv-driver-notes.md 7.2).

Constant bank 0 holds what the driver provides (block and grid sizes at 0x00-0x14, the shared and local window
bases at 0x18 and 0x20, the initial stack pointer at 0x28, a zero global-memory descriptor at 0x208 on sm_90), then
the kernel's parameters from the offset the cubin names (0x210 on sm_90, 0x160 on Ampere/Ada).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from rawgrad.autogen.nv import nv_classes as classes
from rawgrad.autogen.nv import nv_qmd as layouts
from rawgrad.drivers.nv.cubin import KernelFacts
from rawgrad.helpers import round_up

QMD_ALIGNMENT = 256              # SEND_PCAS_A takes the address >> 8
CONSTANT_BANK_ALIGNMENT = 256    # V04 takes address >> 6; V03's unshifted field is kept at 256 to be safe
MAX_PARAMETER_BYTES = 0x7FFC     # ptxas's limit for sm_90 ("uses too much parameter space (..., 0x7ffc max)")
STACK_POINTER = 0x00FFFDC0       # initial R1 (c[0x0][0x28]): below the top of a 16 MiB local window
LOCAL_WINDOW_BYTES = 1 << 24


def stack_bytes(frame_bytes: int) -> int:
  """Per-thread local memory a kernel with this frame needs: the window's high part, from the stack's deepest point
  to the window's top (the stack starts STACK_POINTER bytes in and grows down)."""
  return round_up(frame_bytes + LOCAL_WINDOW_BYTES - STACK_POINTER, 16) if frame_bytes else 0
DRIVER_CONSTANTS = {"block": 0x00, "grid": 0x0C, "shared_window": 0x18, "local_window": 0x20, "stack": 0x28}
GLOBAL_DESCRIPTOR = 0x208        # sm_90 reads it before global accesses: zero means plain flat addresses
# Hopper's QMD_TYPE: libcuda sets GRID_CTA on an H100, Mesa's NVK leaves QUEUE (0); GRID_CTA runs on the H100
# (docs/hardware.md)
HOPPER_QMD_TYPE = layouts.NVCBC0_QMDV04_00_QMD_TYPE_GRID_CTA
# SM shared memory carve-outs in KiB (CUDA's lists); the QMD takes KiB / 4 + 1
CARVEOUTS_KIB = {9: (0, 8, 16, 32, 64, 100, 132, 164, 196, 228), 8: (0, 8, 16, 32, 64, 100)}


@dataclass(frozen=True)
class QMDFormat:
  version: str          # "V04_00"
  prefix: str           # "NVCBC0_QMDV04_00_"
  nbytes: int
  major: int

  def bits(self, name: str, *index: int) -> tuple[int, int]:
    found = getattr(layouts, self.prefix + name)
    return found(*index) if callable(found) else found


QMD_V04 = QMDFormat("V04_00", "NVCBC0_QMDV04_00_", 384, 4)
QMD_V03 = QMDFormat("V03_00", "NVC6C0_QMDV03_00_", 256, 3)


def qmd_format(compute_class: int) -> QMDFormat:
  return QMD_V04 if compute_class == classes.HOPPER_COMPUTE_A else QMD_V03


@dataclass(frozen=True)
class Launch:
  """One grid launch: what the QMD and constant bank 0 are built from."""
  facts: KernelFacts
  program_address: int                  # the entry point's GPU address
  grid: tuple[int, int, int]
  block: tuple[int, int, int]
  constant_bank_address: int
  shared_window: int
  local_window: int

  @property
  def constant_bank_bytes(self) -> int:
    return round_up(self.facts.parameter_base + self.facts.parameter_bytes, 16)



# *** bit fields over a QMD ***

def set_field(qmd: bytearray, bits: tuple[int, int], value: int, name: str = "") -> None:
  """Write `value` into bits hi:lo of the QMD seen as one little-endian number; refuses a value that does not fit."""
  high, low = bits
  width = high - low + 1
  if not 0 <= value < 1 << width:
    raise ValueError(f"QMD field {name or bits} takes {width} bits; {value:#x} does not fit")
  first, last = low // 8, high // 8 + 1
  current = int.from_bytes(qmd[first:last], "little")
  shift = low - first * 8
  current = (current & ~(((1 << width) - 1) << shift)) | (value << shift)
  qmd[first:last] = current.to_bytes(last - first, "little")


def get_field(qmd: bytes, bits: tuple[int, int]) -> int:
  high, low = bits
  first, last = low // 8, high // 8 + 1
  return (int.from_bytes(qmd[first:last], "little") >> (low - first * 8)) & ((1 << (high - low + 1)) - 1)


# *** building ***

def check_launch(launch: Launch, max_threads: int = 1024) -> None:
  """Refuse what the hardware cannot launch, naming the values."""
  threads = launch.block[0] * launch.block[1] * launch.block[2]
  if not 0 < threads <= max_threads:
    raise ValueError(f"kernel {launch.facts.name}: a block of {launch.block} = {threads} threads (1..{max_threads})")
  if launch.facts.max_threads is not None and any(b > m for b, m in zip(launch.block, launch.facts.max_threads)):
    raise ValueError(f"kernel {launch.facts.name}: block {launch.block} exceeds its .maxntid/.reqntid "
                     f"{launch.facts.max_threads}")
  if min(launch.grid) <= 0 or launch.grid[0] >= 1 << 31 or max(launch.grid[1:]) >= 1 << 16:
    raise ValueError(f"kernel {launch.facts.name}: grid {launch.grid} (x < 2^31, y and z < 2^16, none 0)")
  if launch.facts.parameter_bytes > MAX_PARAMETER_BYTES:
    raise ValueError(f"kernel {launch.facts.name}: {launch.facts.parameter_bytes} bytes of kernel arguments exceed the "
                     f"limit of {MAX_PARAMETER_BYTES}")
  if launch.constant_bank_address % CONSTANT_BANK_ALIGNMENT:
    raise ValueError(f"constant bank 0 at {launch.constant_bank_address:#x} is not {CONSTANT_BANK_ALIGNMENT}-aligned")


def shared_bytes(facts: KernelFacts) -> int:
  """Shared memory per block: the cubin's (on sm_90 that includes the 1 KiB reserve, kept even when 0) in 256s."""
  reserve = 0x400 if facts.sm >= 90 else 0
  return round_up(max(facts.shared_bytes, reserve), 256)


def carveout_code(needed: int, sm: int) -> tuple[int, int]:
  """(smallest carve-out holding `needed` bytes, largest carve-out) as QMD codes: KiB / 4 + 1."""
  carveouts = CARVEOUTS_KIB[9 if sm >= 90 else 8]
  smallest = next((kib for kib in carveouts if kib * 1024 >= needed), None)
  if smallest is None:
    raise ValueError(f"{needed} bytes of shared memory exceed the largest carve-out ({carveouts[-1]} KiB)")
  return smallest // 4 + 1, carveouts[-1] // 4 + 1


def build_qmd(qmd_format: QMDFormat, launch: Launch) -> bytearray:
  check_launch(launch)
  return _build_v04(launch) if qmd_format is QMD_V04 else _build_v03(launch)


def _build_v04(launch: Launch) -> bytearray:
  f, facts = QMD_V04, launch.facts
  qmd = bytearray(f.nbytes)
  shared = shared_bytes(facts)
  smallest, largest = carveout_code(shared, facts.sm)
  values = {
    "QMD_GROUP_ID": 0x3F, "QMD_TYPE": HOPPER_QMD_TYPE,
    "API_VISIBLE_CALL_LIMIT": layouts.NVCBC0_QMDV04_00_API_VISIBLE_CALL_LIMIT_NO_CHECK,
    "SAMPLER_INDEX": layouts.NVCBC0_QMDV04_00_SAMPLER_INDEX_INDEPENDENTLY,
    "QMD_MAJOR_VERSION": f.major, "QMD_MINOR_VERSION": 0, "SASS_VERSION": _sass_version(facts.sm),
    "SHARED_MEMORY_SIZE": shared, "MIN_SM_CONFIG_SHARED_MEM_SIZE": smallest,
    "MAX_SM_CONFIG_SHARED_MEM_SIZE": largest, "TARGET_SM_CONFIG_SHARED_MEM_SIZE": smallest,
    # every launch reads a freshly written constant bank, and code memory is reused: drop what caches hold
    "INVALIDATE_TEXTURE_HEADER_CACHE": 1, "INVALIDATE_TEXTURE_SAMPLER_CACHE": 1, "INVALIDATE_TEXTURE_DATA_CACHE": 1,
    "INVALIDATE_SHADER_DATA_CACHE": 1, "INVALIDATE_INSTRUCTION_CACHE": 1, "INVALIDATE_SHADER_CONSTANT_CACHE": 1,
    "GRID_WIDTH": launch.grid[0], "GRID_HEIGHT": launch.grid[1], "GRID_DEPTH": launch.grid[2],
    "CTA_THREAD_DIMENSION0": launch.block[0], "CTA_THREAD_DIMENSION1": launch.block[1],
    "CTA_THREAD_DIMENSION2": launch.block[2],
    # each block's writes reach L2 when it ends; the host sees them after the semaphore release, which waits for
    # idle and orders memory at system scope itself: no block needs a system-wide barrier of its own (measured on
    # the H100: a+b runs at the same speed with either, docs/hardware.md)
    "CWD_MEMBAR_TYPE": layouts.NVCBC0_QMDV04_00_CWD_MEMBAR_TYPE_L1_MEMBAR,
    "REGISTER_COUNT": facts.registers, "BARRIER_COUNT": max(facts.barriers, 1),
    # the stack grows down from STACK_POINTER, near the top of the local window: it is the window's high part
    "SHADER_LOCAL_MEMORY_HIGH_SIZE": stack_bytes(facts.frame_bytes),
    "PROGRAM_ADDRESS_LOWER": launch.program_address & 0xFFFFFFFF, "PROGRAM_ADDRESS_UPPER": launch.program_address >> 32,
  }
  for name, value in values.items(): set_field(qmd, f.bits(name), value, name)
  shifted = launch.constant_bank_address >> 6
  for name, value in (("CONSTANT_BUFFER_VALID", 1), ("CONSTANT_BUFFER_INVALIDATE", 1),
                      ("CONSTANT_BUFFER_ADDR_LOWER_SHIFTED6", shifted & 0xFFFFFFFF),
                      ("CONSTANT_BUFFER_ADDR_UPPER_SHIFTED6", shifted >> 32),
                      ("CONSTANT_BUFFER_SIZE_SHIFTED4", launch.constant_bank_bytes >> 4)):
    set_field(qmd, f.bits(name, 0), value, f"{name}(0)")
  return qmd


def _build_v03(launch: Launch) -> bytearray:
  f, facts = QMD_V03, launch.facts
  qmd = bytearray(f.nbytes)
  shared = shared_bytes(facts)
  smallest, largest = carveout_code(shared, facts.sm)
  values = {
    "QMD_GROUP_ID": 0x3F, "SM_GLOBAL_CACHING_ENABLE": 1,
    "API_VISIBLE_CALL_LIMIT": layouts.NVC6C0_QMDV03_00_API_VISIBLE_CALL_LIMIT_NO_CHECK,
    "SAMPLER_INDEX": layouts.NVC6C0_QMDV03_00_SAMPLER_INDEX_INDEPENDENTLY,
    "QMD_MAJOR_VERSION": f.major, "QMD_VERSION": 0, "SASS_VERSION": _sass_version(facts.sm),
    "SHARED_MEMORY_SIZE": shared, "MIN_SM_CONFIG_SHARED_MEM_SIZE": smallest,
    "MAX_SM_CONFIG_SHARED_MEM_SIZE": largest, "TARGET_SM_CONFIG_SHARED_MEM_SIZE": smallest,
    "INVALIDATE_TEXTURE_HEADER_CACHE": 1, "INVALIDATE_TEXTURE_SAMPLER_CACHE": 1, "INVALIDATE_TEXTURE_DATA_CACHE": 1,
    "INVALIDATE_SHADER_DATA_CACHE": 1, "INVALIDATE_INSTRUCTION_CACHE": 1, "INVALIDATE_SHADER_CONSTANT_CACHE": 1,
    "CTA_RASTER_WIDTH": launch.grid[0], "CTA_RASTER_HEIGHT": launch.grid[1], "CTA_RASTER_DEPTH": launch.grid[2],
    "CTA_THREAD_DIMENSION0": launch.block[0], "CTA_THREAD_DIMENSION1": launch.block[1],
    "CTA_THREAD_DIMENSION2": launch.block[2],
    "CWD_MEMBAR_TYPE": layouts.NVC6C0_QMDV03_00_CWD_MEMBAR_TYPE_L1_MEMBAR,
    "REGISTER_COUNT_V": facts.registers, "BARRIER_COUNT": max(facts.barriers, 1),
    "SHADER_LOCAL_MEMORY_HIGH_SIZE": stack_bytes(facts.frame_bytes),
    "PROGRAM_ADDRESS_LOWER": launch.program_address & 0xFFFFFFFF, "PROGRAM_ADDRESS_UPPER": launch.program_address >> 32,
  }
  for name, value in values.items(): set_field(qmd, f.bits(name), value, name)
  address = launch.constant_bank_address
  for name, value in (("CONSTANT_BUFFER_VALID", 1), ("CONSTANT_BUFFER_INVALIDATE", 1),
                      ("CONSTANT_BUFFER_ADDR_LOWER", address & 0xFFFFFFFF),
                      ("CONSTANT_BUFFER_ADDR_UPPER", address >> 32),
                      ("CONSTANT_BUFFER_SIZE_SHIFTED4", launch.constant_bank_bytes >> 4)):
    set_field(qmd, f.bits(name, 0), value, f"{name}(0)")
  return qmd


def _sass_version(sm: int) -> int:
  return ((sm // 10) << 4) | (sm % 10)


def driver_constants(launch: Launch) -> bytes:
  """The bytes of constant bank 0 before the parameters."""
  base = launch.facts.parameter_base
  constants = bytearray(base)
  struct.pack_into("<3I", constants, DRIVER_CONSTANTS["block"], *launch.block)
  struct.pack_into("<3I", constants, DRIVER_CONSTANTS["grid"], *launch.grid)
  struct.pack_into("<Q", constants, DRIVER_CONSTANTS["shared_window"], launch.shared_window)
  struct.pack_into("<Q", constants, DRIVER_CONSTANTS["local_window"], launch.local_window)
  struct.pack_into("<I", constants, DRIVER_CONSTANTS["stack"], STACK_POINTER)
  if base >= GLOBAL_DESCRIPTOR + 8: struct.pack_into("<Q", constants, GLOBAL_DESCRIPTOR, 0)
  return bytes(constants)
