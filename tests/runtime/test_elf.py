"""The ELF loader, checked on objects LLVM builds for x86-64 and aarch64 whatever the host.

Relocated images are not run here (tests/drivers does that on the host): instead the patched instructions are
decoded by hand and followed to the data they must reach.
"""
from __future__ import annotations

import io
import struct
import sys

import numpy as np
import pytest
from elftools.elf.elffile import ELFFile
from elftools.elf.enums import ENUM_ST_INFO_BIND, ENUM_ST_INFO_TYPE, ENUM_ST_SHNDX

from rawgrad.runtime.compile import LLVMCompiler
from rawgrad.runtime.elf import (ARCHES, PAGE_SIZE, ElfImage, ElfObject, Reloc, RelocationError, load_elf,
                                 relocate)

X86, A64 = "x86_64-unknown-linux-gnu", "aarch64-unknown-linux-gnu"
BASE = 0x7F12_3456_0000
# libraries far beyond any PC-relative reach of BASE: calls to them must go through the image's stubs
EXTERNALS = {"expf": 0x1000_0000_1230, "memset": 0x1000_0000_4560, "sinf": 0x1000_0000_7890}
TABLE = np.arange(8, dtype=np.float32) + np.float32(0.5)

SRC = """
@table = internal constant [8 x float] [float 0.5, float 1.5, float 2.5, float 3.5, float 4.5, float 5.5, float 6.5,
                                        float 7.5]
@counter = global i64 42
@fns = constant [2 x ptr] [ptr @lookup, ptr @bump]
@b8 = dso_local global i8 7
@h16 = dso_local global i16 300
@w32 = dso_local global float 2.5
@d64 = dso_local global i64 123456789
@q128 = dso_local global <4 x float> <float 1.0, float 2.0, float 3.0, float 4.0>
declare float @expf(float)
declare float @sinf(float)
declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)

define float @lookup(i64 %j, ptr %p, i64 %n) {
  %pt = getelementptr [8 x float], ptr @table, i64 0, i64 %j
  %t = load float, ptr %pt
  call void @llvm.memset.p0.i64(ptr %p, i8 0, i64 %n, i1 false)
  %e = call float @expf(float %t)
  %r = fadd float %e, %t
  ret float %r
}
define float @tail(float %x) {
  %s = tail call float @sinf(float %x)
  ret float %s
}
define i64 @bump() {
  %old = load i64, ptr @counter
  %new = add i64 %old, 1
  store i64 %new, ptr @counter
  ret i64 %new
}
define i8 @ld8() {
  %v = load i8, ptr @b8
  ret i8 %v
}
define i16 @ld16() {
  %v = load i16, ptr @h16
  ret i16 %v
}
define float @ld32() {
  %v = load float, ptr @w32
  ret float %v
}
define i64 @ld64() {
  %v = load i64, ptr @d64
  ret i64 %v
}
define <4 x float> @ld128() {
  %v = load <4 x float>, ptr @q128
  ret <4 x float> %v
}
"""


@pytest.fixture(scope="module", params=[X86, A64])
def loaded(request: pytest.FixtureRequest) -> tuple[ElfImage, bytes]:
  image = load_elf(LLVMCompiler(request.param).compile(SRC))
  return image, relocate(image, BASE, EXTERNALS.__getitem__)


def type_name(image: ElfImage, r: Reloc) -> str:
  return ARCHES[image.machine].relocs[r.type][0]


def relocs_in(image: ElfImage, fn: str) -> list[Reloc]:
  """The relocations inside function fn's code."""
  start = image.functions[fn]
  end = min([off for off in image.functions.values() if off > start] + [image.exec_size])
  return [r for r in image.relocs if start <= r.offset < end]


def read(buf: bytes, addr: int, fmt: str) -> tuple:
  return struct.unpack_from(fmt, buf, addr - BASE)


# *** decoding what the loader patched

def sext(v: int, bits: int) -> int:
  return v - (1 << bits) if (v >> (bits - 1)) & 1 else v


def insn(buf: bytes, off: int) -> int:
  return struct.unpack_from("<I", buf, off)[0]


def rip_target(buf: bytes, r: Reloc) -> int:
  """Where an x86-64 rel32 field points; in the code tested the field ends its instruction, so rip is the field + 4."""
  return BASE + r.offset + 4 + struct.unpack_from("<i", buf, r.offset)[0]


def adrp_target(buf: bytes, off: int) -> int:
  i = insn(buf, off)
  imm = sext((((i >> 5) & 0x7FFFF) << 2) | ((i >> 29) & 3), 21)
  return ((BASE + off) & ~0xFFF) + (imm << 12)


def lo12(buf: bytes, off: int) -> int:
  i = insn(buf, off)
  is_add = (i >> 24) & 0x1F == 0b10001
  scale = 0 if is_add else 4 if (i >> 26) & 1 and (i >> 23) & 1 else i >> 30  # 128-bit SIMD loads scale by 16
  return ((i >> 10) & 0xFFF) << scale


def branch_target(buf: bytes, off: int) -> int:
  return BASE + off + 4 * sext(insn(buf, off) & 0x3FFFFFF, 26)


def a64_addresses(image: ElfImage, buf: bytes, fn: str, page: str, low: tuple[str, ...]) -> list[int]:
  """Addresses that fn builds from an ADRP-type relocation and the low-12-bits one paired with it."""
  rs = relocs_in(image, fn)
  pages = {(r.target, r.addend): adrp_target(buf, r.offset) for r in rs if type_name(image, r) == page}
  return [pages[(r.target, r.addend)] + lo12(buf, r.offset) for r in rs if type_name(image, r).startswith(low)]


def data_address(image: ElfImage, buf: bytes, fn: str) -> int:
  """The one data address function fn computes PC-relatively, on either architecture."""
  if image.machine == "EM_X86_64":
    (addr,) = [rip_target(buf, r) for r in relocs_in(image, fn) if type_name(image, r) == "R_X86_64_PC32"]
  else:
    (addr,) = a64_addresses(image, buf, fn, "R_AARCH64_ADR_PREL_PG_HI21", ("R_AARCH64_ADD", "R_AARCH64_LDST"))
  return addr


def got_slot(image: ElfImage, buf: bytes, fn: str) -> int:
  if image.machine == "EM_X86_64":
    (addr,) = [rip_target(buf, r) for r in relocs_in(image, fn) if "GOTPCREL" in type_name(image, r)]
  else:
    (addr,) = a64_addresses(image, buf, fn, "R_AARCH64_ADR_GOT_PAGE", ("R_AARCH64_LD64_GOT_LO12_NC",))
  return addr


def call_targets(image: ElfImage, buf: bytes, fn: str) -> list[int]:
  calls = ARCHES[image.machine].call_relocs
  if image.machine == "EM_X86_64":
    return [rip_target(buf, r) for r in relocs_in(image, fn) if r.type in calls]
  return [branch_target(buf, r.offset) for r in relocs_in(image, fn) if r.type in calls]


def stub_destination(buf: bytes, machine: str, addr: int) -> int:
  code = buf[addr - BASE:addr - BASE + 16]
  if machine == "EM_X86_64":
    assert code[:6] == b"\xff\x25\x00\x00\x00\x00"  # jmp *0(%rip)
    return struct.unpack_from("<Q", code, 6)[0]
  assert struct.unpack_from("<II", code) == (0x58000050, 0xD61F0200)  # ldr x16, #8; br x16
  return struct.unpack_from("<Q", code, 8)[0]


# *** tests

def test_functions_are_found(loaded: tuple[ElfImage, bytes]) -> None:
  image, _ = loaded
  assert {"lookup", "bump", "ld8", "ld16", "ld32", "ld64", "ld128"} <= set(image.functions)
  assert all(off < image.exec_size for off in image.functions.values())


def test_constant_table_is_reached_pc_relative(loaded: tuple[ElfImage, bytes]) -> None:
  image, buf = loaded
  np.testing.assert_array_equal(read(buf, data_address(image, buf, "lookup"), "<8f"), TABLE)


@pytest.mark.parametrize("fn, fmt, want", [("ld8", "<B", (7,)), ("ld16", "<H", (300,)), ("ld32", "<f", (2.5,)),
                                           ("ld64", "<Q", (123456789,)), ("ld128", "<4f", (1, 2, 3, 4))])
def test_loads_of_each_width_reach_their_global(loaded: tuple[ElfImage, bytes], fn: str, fmt: str, want: tuple) -> None:
  image, buf = loaded
  assert read(buf, data_address(image, buf, fn), fmt) == want


def test_external_calls_go_through_stubs_to_far_addresses(loaded: tuple[ElfImage, bytes]) -> None:
  image, buf = loaded
  targets = call_targets(image, buf, "lookup") + call_targets(image, buf, "tail")  # a call, a jump (JUMP26 on arm)
  assert sorted(stub_destination(buf, image.machine, t) for t in targets) == sorted(EXTERNALS.values())
  assert all(BASE <= t < BASE + image.exec_size for t in targets)


def test_got_slot_holds_the_address_of_a_preemptible_global(loaded: tuple[ElfImage, bytes]) -> None:
  image, buf = loaded
  (counter,) = read(buf, got_slot(image, buf, "bump"), "<Q")
  assert read(buf, counter, "<q") == (42,)
  # the counter is written at run time, so it lives on a page of its own past the read+execute part
  assert counter - BASE >= (image.exec_size + PAGE_SIZE - 1) // PAGE_SIZE * PAGE_SIZE


def test_absolute_pointers_in_relro_data(loaded: tuple[ElfImage, bytes]) -> None:
  image, buf = loaded
  abs64 = [r for r in image.relocs if type_name(image, r) in ("R_X86_64_64", "R_AARCH64_ABS64")]
  assert [read(buf, BASE + r.offset, "<Q")[0] for r in abs64] == [BASE + image.functions[f] for f in ("lookup", "bump")]
  assert all(r.offset < image.exec_size for r in abs64)  # relocated first, read-only after


def test_pc32_overflow_names_the_relocation() -> None:
  src = """
@ext = external dso_local global i32
define i32 @get() {
  %v = load i32, ptr @ext
  ret i32 %v
}
"""
  image = load_elf(LLVMCompiler(X86).compile(src))
  message = r"R_X86_64_PC32 in \.text at image offset 0x[0-9a-f]+ against 'ext'.*does not fit"
  with pytest.raises(RelocationError, match=message):
    relocate(image, BASE, {"ext": 0x1000_0000_0000}.__getitem__)


def test_unresolved_external_raises() -> None:
  image = load_elf(LLVMCompiler(X86).compile(SRC))
  with pytest.raises(LookupError, match="memset"):
    relocate(image, BASE, {"expf": 1}.__getitem__)


def with_reloc_type(obj: bytes, section: str, new_type: int) -> bytes:
  """obj with the type of the first relocation in section changed, as if LLVM had emitted another kind."""
  elf = ELFFile(io.BytesIO(obj))
  info_at = elf.get_section_by_name(section)["sh_offset"] + 8  # Elf64_Rela: r_offset, then r_info
  out = bytearray(obj)
  sym = struct.unpack_from("<Q", out, info_at)[0] >> 32
  struct.pack_into("<Q", out, info_at, (sym << 32) | new_type)
  return bytes(out)


@pytest.mark.parametrize("triple, rtype, name", [(X86, 25, "R_X86_64_GOTOFF64"), (A64, 263, "R_AARCH64_MOVW_UABS_G0")])
def test_unknown_relocation_type_raises(triple: str, rtype: int, name: str) -> None:
  obj = with_reloc_type(LLVMCompiler(triple).compile(SRC), ".rela.text", rtype)
  with pytest.raises(RelocationError, match=rf"unsupported relocation {name} \(type {rtype}\) in \.text at 0x"):
    load_elf(obj)


def test_rejects_other_machines_and_non_relocatable_files() -> None:
  with pytest.raises(ValueError, match="unsupported machine EM_RISCV"):
    load_elf(LLVMCompiler("riscv64-unknown-linux-gnu").compile(SRC))
  with open(sys.executable, "rb") as f:
    with pytest.raises(ValueError, match="relocatable object, got .*ET_(EXEC|DYN)"):
      load_elf(f.read())


@pytest.mark.parametrize("triple", [X86, A64])
def test_reader_agrees_with_pyelftools(triple: str) -> None:
  """The struct-based reader sees the sections, symbols and relocations pyelftools sees in the same object."""
  obj = LLVMCompiler(triple).compile(SRC)
  reference, ours = ELFFile(io.BytesIO(obj)), ElfObject(obj)
  assert ours.machine == reference["e_machine"]
  sections = list(reference.iter_sections())
  assert [(s.name, s.offset, s.size, s.flags, s.info, s.link, s.align) for s in ours.sections] == \
    [(s.name, s["sh_offset"], s["sh_size"], s["sh_flags"], s["sh_info"], s["sh_link"], s["sh_addralign"])
     for s in sections]
  symtab = next(s for s in ours.sections if s.name == ".symtab")
  assert [(s.name, s.value, s.info >> 4, s.info & 0xF, s.section) for s in ours.symbols(symtab)] == \
    [(s.name, s["st_value"], ENUM_ST_INFO_BIND[s["st_info"]["bind"]], ENUM_ST_INFO_TYPE[s["st_info"]["type"]],
      ENUM_ST_SHNDX.get(s["st_shndx"], s["st_shndx"])) for s in reference.get_section_by_name(".symtab").iter_symbols()]
  for ours_section, section in zip(ours.sections, sections):
    if section["sh_type"] != "SHT_RELA": continue
    assert ours.relocations(ours_section) == [(r["r_offset"], r["r_info_type"], r["r_info_sym"], r["r_addend"])
                                              for r in section.iter_relocations()]
