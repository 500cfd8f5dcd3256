"""Our own loader for relocatable ELF objects: lays the allocatable sections out into one flat image and relocates it.

Formulas follow the x86-64 psABI and ARM's "ELF for the Arm 64-bit Architecture": S is the symbol's address (for a
call to an external symbol, its stub in the image), A the addend, P the address being patched, G the address of the
symbol's GOT slot. External symbols are only looked up by address through a resolver; no code is loaded for them.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import io
import mmap
import struct
from dataclasses import dataclass
from typing import Callable, Hashable, TypeVar

from elftools.elf.descriptions import describe_reloc_type
from elftools.elf.elffile import ELFFile

from rawgrad.autogen.amd import kernel_descriptor as descriptors

Resolver = Callable[[str], int]
PAGE_SIZE = mmap.PAGESIZE
GOT_SLOT = 8
Key = TypeVar("Key", bound=Hashable)


class RelocationError(ValueError):
  """A relocation this loader cannot apply: an unknown type, or a value that does not fit its field."""


@dataclass(frozen=True)
class SymRef:
  """What a relocation points at: an offset into the image, or (offset None) an external symbol."""
  name: str
  offset: int | None


@dataclass(frozen=True)
class Reloc:
  offset: int   # where to patch, in the image
  type: int
  target: SymRef
  addend: int
  section: str  # the patched section, for error messages


@dataclass(frozen=True)
class ElfImage:
  """Allocatable sections laid out in one image (offsets from its start), with what is needed to relocate it."""
  machine: str                # e_machine, "EM_X86_64" or "EM_AARCH64"
  data: bytes                 # sections at their image offsets, .bss zeroed; GOT and stubs are filled by relocate
  functions: dict[str, int]   # global function name -> image offset
  objects: dict[str, int]     # global data symbol name -> image offset (an AMD kernel descriptor, say)
  relocs: tuple[Reloc, ...]
  got: dict[SymRef, int]      # symbol -> offset of its GOT slot
  stubs: dict[str, int]       # external function -> offset of the stub that jumps to it
  exec_size: int              # [0, exec_size) becomes read+execute; writable sections follow on their own pages


# *** field writers: each checks the value fits, since a silently truncated address is a wild jump later

def _put_u64(buf: bytearray, off: int, v: int) -> None:
  struct.pack_into("<Q", buf, off, v & (2**64 - 1))


def _check(v: int, lo: int, hi: int) -> int:
  if not lo <= v < hi:
    raise RelocationError(f"value {v:#x} does not fit in [{lo:#x}, {hi:#x})")
  return v


def _put_s32(buf: bytearray, off: int, v: int) -> None:
  struct.pack_into("<i", buf, off, _check(v, -2**31, 2**31))


def _put_u32(buf: bytearray, off: int, v: int) -> None:
  struct.pack_into("<I", buf, off, _check(v, 0, 2**32))


def _put_any32(buf: bytearray, off: int, v: int) -> None:
  # aarch64 ABS32/PREL32 accept both signed and unsigned interpretations
  struct.pack_into("<I", buf, off, _check(v, -2**31, 2**32) & 0xFFFFFFFF)


def _patch_insn(buf: bytearray, off: int, mask: int, bits: int) -> None:
  insn = struct.unpack_from("<I", buf, off)[0]
  struct.pack_into("<I", buf, off, (insn & ~mask) | (bits & mask))


def _put_branch26(buf: bytearray, off: int, v: int) -> None:
  if v % 4:
    raise RelocationError(f"branch offset {v:#x} is not a multiple of 4")
  _patch_insn(buf, off, 0x3FFFFFF, _check(v, -2**27, 2**27) >> 2)


def _put_adrp_nc(buf: bytearray, off: int, v: int) -> None:
  imm = v >> 12
  _patch_insn(buf, off, (3 << 29) | (0x7FFFF << 5), ((imm & 3) << 29) | (((imm >> 2) & 0x7FFFF) << 5))


def _put_adrp(buf: bytearray, off: int, v: int) -> None:
  _put_adrp_nc(buf, off, _check(v, -2**32, 2**32))


def _put_lo12(shift: int) -> Callable[[bytearray, int, int], None]:
  def put(buf: bytearray, off: int, v: int) -> None:
    lo = v & 0xFFF
    if lo % (1 << shift):
      raise RelocationError(f"address {v:#x} is not aligned to {1 << shift} bytes for this access")
    _patch_insn(buf, off, 0xFFF << 10, (lo >> shift) << 10)
  return put


def _page(x: int) -> int:
  return x & ~0xFFF


ValueFn = Callable[[int, int, int, int], int]  # (S, A, P, G) -> value to write
Writer = Callable[[bytearray, int, int], None]
_S_A: ValueFn = lambda s, a, p, g: s + a
_S_A_P: ValueFn = lambda s, a, p, g: s + a - p
_G_A_P: ValueFn = lambda s, a, p, g: g + a - p


@dataclass(frozen=True)
class Arch:
  relocs: dict[int, tuple[str, ValueFn, Writer]]
  call_relocs: frozenset[int]    # PC-relative calls/jumps: to an external symbol they go through a stub
  got_relocs: frozenset[int]     # relocations that need a GOT slot for their symbol
  stub: Callable[[int], bytes]   # code that jumps to an absolute address, any distance away
  stub_size: int
  got_slot_has_addend: bool      # the ABI puts S + A in the slot; we only build slots holding S, so A must be 0


X86_64 = Arch(
  relocs={
    1: ("R_X86_64_64", _S_A, _put_u64),
    2: ("R_X86_64_PC32", _S_A_P, _put_s32),
    4: ("R_X86_64_PLT32", _S_A_P, _put_s32),
    9: ("R_X86_64_GOTPCREL", _G_A_P, _put_s32),
    10: ("R_X86_64_32", _S_A, _put_u32),
    11: ("R_X86_64_32S", _S_A, _put_s32),
    24: ("R_X86_64_PC64", _S_A_P, _put_u64),
    # the relaxable GOT forms stay valid unrelaxed: the instruction still loads the address from the slot
    41: ("R_X86_64_GOTPCRELX", _G_A_P, _put_s32),
    42: ("R_X86_64_REX_GOTPCRELX", _G_A_P, _put_s32),
  },
  call_relocs=frozenset({4}),
  got_relocs=frozenset({9, 41, 42}),
  stub=lambda addr: b"\xff\x25\x00\x00\x00\x00" + struct.pack("<Q", addr) + b"\xcc\xcc",  # jmp *0(%rip); .quad addr
  stub_size=16,
  got_slot_has_addend=False,
)

AARCH64 = Arch(
  relocs={
    257: ("R_AARCH64_ABS64", _S_A, _put_u64),
    258: ("R_AARCH64_ABS32", _S_A, _put_any32),
    260: ("R_AARCH64_PREL64", _S_A_P, _put_u64),
    261: ("R_AARCH64_PREL32", _S_A_P, _put_any32),
    275: ("R_AARCH64_ADR_PREL_PG_HI21", lambda s, a, p, g: _page(s + a) - _page(p), _put_adrp),
    276: ("R_AARCH64_ADR_PREL_PG_HI21_NC", lambda s, a, p, g: _page(s + a) - _page(p), _put_adrp_nc),
    277: ("R_AARCH64_ADD_ABS_LO12_NC", _S_A, _put_lo12(0)),
    278: ("R_AARCH64_LDST8_ABS_LO12_NC", _S_A, _put_lo12(0)),
    282: ("R_AARCH64_JUMP26", _S_A_P, _put_branch26),
    283: ("R_AARCH64_CALL26", _S_A_P, _put_branch26),
    284: ("R_AARCH64_LDST16_ABS_LO12_NC", _S_A, _put_lo12(1)),
    285: ("R_AARCH64_LDST32_ABS_LO12_NC", _S_A, _put_lo12(2)),
    286: ("R_AARCH64_LDST64_ABS_LO12_NC", _S_A, _put_lo12(3)),
    299: ("R_AARCH64_LDST128_ABS_LO12_NC", _S_A, _put_lo12(4)),
    311: ("R_AARCH64_ADR_GOT_PAGE", lambda s, a, p, g: _page(g) - _page(p), _put_adrp),
    312: ("R_AARCH64_LD64_GOT_LO12_NC", lambda s, a, p, g: g, _put_lo12(3)),
  },
  call_relocs=frozenset({282, 283}),
  got_relocs=frozenset({311, 312}),
  stub=lambda addr: struct.pack("<IIQ", 0x58000050, 0xD61F0200, addr),  # ldr x16, #8; br x16; .quad addr
  stub_size=16,
  got_slot_has_addend=True,
)

def _no_stub(addr: int) -> bytes:
  raise RelocationError(f"a GPU code object cannot call outside itself (to {addr:#x})")


# AMD GPU code objects: the kernel descriptor points at its code with a 64-bit self-relative offset
AMDGPU = Arch(
  relocs={
    3: ("R_AMDGPU_ABS64", _S_A, _put_u64),
    4: ("R_AMDGPU_REL32", _S_A_P, _put_s32),
    5: ("R_AMDGPU_REL64", _S_A_P, _put_u64),
    6: ("R_AMDGPU_ABS32", _S_A, _put_u32),
  },
  call_relocs=frozenset(),
  got_relocs=frozenset(),
  stub=_no_stub,
  stub_size=16,
  got_slot_has_addend=False,
)

ARCHES: dict[str, Arch] = {"EM_X86_64": X86_64, "EM_AARCH64": AARCH64, "EM_AMDGPU": AMDGPU}


def _align(x: int, a: int) -> int:
  return (x + a - 1) // a * a


# *** reading: the headers, symbols and relocations of a 64-bit little-endian object, with struct. pyelftools reads
# the same (and names what is wrong when a file is not such an object) but takes ~1 ms per kernel, on the thread that
# schedules and lowers the next kernels

SHF_WRITE, SHF_ALLOC = 0x1, 0x2
SHT_SYMTAB, SHT_RELA, SHT_NOBITS, SHT_REL = 2, 4, 8, 9
SHN_UNDEF = 0
STB_LOCAL, STT_OBJECT, STT_FUNC = 0, 1, 2
MACHINES = {62: "EM_X86_64", 183: "EM_AARCH64", 224: "EM_AMDGPU"}
_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")      # Elf64_Ehdr
_SECTION = struct.Struct("<IIQQQQIIQQ")           # Elf64_Shdr
_SYMBOL = struct.Struct("<IBBHQQ")                # Elf64_Sym
_RELA = struct.Struct("<QQq")                     # Elf64_Rela


@dataclass(frozen=True)
class Section:
  index: int
  name: str
  type: int
  flags: int
  offset: int
  size: int
  link: int
  info: int
  align: int


@dataclass(frozen=True)
class Symbol:
  name: str
  info: int   # binding in the high nibble, type in the low one
  section: int
  value: int


class ElfObject:
  """A relocatable object's sections, symbol tables and RELA relocations, read from its bytes."""

  def __init__(self, obj: bytes):
    self.obj = obj
    header = _HEADER.unpack_from(obj)
    ident, e_type, machine, shoff, shnum, shstrndx = header[0], header[1], header[2], header[6], header[12], header[13]
    if ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1 or e_type != 1 or machine not in MACHINES:
      _reject(obj)
    self.machine = MACHINES[machine]
    raw = [_SECTION.unpack_from(obj, shoff + i * _SECTION.size) for i in range(shnum)]
    names = raw[shstrndx][4]
    self.sections = [Section(i, self._string(names, h[0]), h[1], h[2], h[4], h[5], h[6], h[7], h[8])
                     for i, h in enumerate(raw)]

  def _string(self, table_offset: int, at: int) -> str:
    start = table_offset + at
    return self.obj[start:self.obj.index(b"\0", start)].decode()

  def data(self, section: Section) -> bytes:
    return self.obj[section.offset:section.offset + section.size]

  def symbols(self, symtab: Section) -> list[Symbol]:
    names = self.sections[symtab.link].offset
    return [Symbol(self._string(names, name), info, shndx, value)
            for name, info, _, shndx, value, _ in _SYMBOL.iter_unpack(self.data(symtab))]

  def relocations(self, section: Section) -> list[tuple[int, int, int, int]]:
    """(offset, type, symbol index, addend) of each relocation in a RELA section."""
    return [(offset, info & 0xFFFFFFFF, info >> 32, addend) for offset, info, addend in _RELA.iter_unpack(
      self.data(section))]


def _reject(obj: bytes) -> None:
  """Raise naming what the file is instead of a 64-bit little-endian relocatable object of a known machine."""
  elf = ELFFile(io.BytesIO(obj))
  if elf.elfclass != 64 or not elf.little_endian or elf["e_type"] != "ET_REL":
    raise ValueError(f"expected a 64-bit little-endian relocatable object, got ELFCLASS{elf.elfclass} "
                     f"{'LSB' if elf.little_endian else 'MSB'} {elf['e_type']}")
  raise ValueError(f"unsupported machine {elf['e_machine']}, expected one of {sorted(ARCHES)}")


# *** loading

def _place(sections: dict[int, Section], start: int, offsets: dict[int, int]) -> int:
  """Assigns each section (by index) an aligned image offset from start on; returns the end."""
  end = start
  for idx, s in sections.items():
    if s.align > PAGE_SIZE:  # the image itself is only page aligned
      raise ValueError(f"section {s.name} needs {s.align}-byte alignment, more than a page ({PAGE_SIZE})")
    end = _align(end, max(s.align, 1))
    offsets[idx] = end
    end += s.size
  return end


def _is_writable(s: Section) -> bool:
  # .data.rel.ro is only written by relocation, which happens before the image turns read-only
  return bool(s.flags & SHF_WRITE) and not s.name.startswith(".data.rel.ro")


@dataclass(frozen=True)
class _RawReloc:
  section: int       # index of the patched section
  section_name: str
  offset: int        # within that section
  type: int
  sym_index: int
  sym: Symbol
  addend: int


def _raw_relocs(elf: ElfObject, arch: Arch, alloc: dict[int, Section]) -> list[_RawReloc]:
  out = []
  for rs in elf.sections:
    if rs.type == SHT_REL:
      raise RelocationError(f"{rs.name}: SHT_REL (no addends) is not supported, only RELA")
    if rs.type != SHT_RELA or rs.info not in alloc:
      continue
    target, symbols = alloc[rs.info], elf.symbols(elf.sections[rs.link])
    for offset, rtype, sym_index, addend in elf.relocations(rs):
      raw = _RawReloc(rs.info, target.name, offset, rtype, sym_index, symbols[sym_index], addend)
      _check_supported(elf, arch, raw)
      out.append(raw)
  return out


def _check_supported(elf: ElfObject, arch: Arch, r: _RawReloc) -> None:
  where = f"in {r.section_name} at {r.offset:#x} against {r.sym.name!r}"
  if r.type not in arch.relocs:
    name = describe_reloc_type(r.type, ELFFile(io.BytesIO(elf.obj)))
    raise RelocationError(f"unsupported relocation {name} (type {r.type}) {where}")
  if r.type in arch.got_relocs and arch.got_slot_has_addend and r.addend:
    raise RelocationError(f"{arch.relocs[r.type][0]} with nonzero addend {r.addend} {where}")


def _symref(sym: Symbol, offsets: dict[int, int]) -> SymRef:
  if sym.section == SHN_UNDEF:
    return SymRef(sym.name, None)
  if sym.section not in offsets:
    raise RelocationError(f"symbol {sym.name!r} is in section {sym.section}, which is not part of the image")
  return SymRef(sym.name, offsets[sym.section] + sym.value)


def _symbols(symbols: list[Symbol], offsets: dict[int, int], kind: int) -> dict[str, int]:
  """Global symbols of a type (STT_FUNC, STT_OBJECT) in the image, by name."""
  return {s.name: offsets[s.section] + s.value for s in symbols
          if s.info & 0xF == kind and s.info >> 4 != STB_LOCAL and s.section in offsets}


def _contents(elf: ElfObject, size: int, offsets: dict[int, int]) -> bytes:
  buf = bytearray(size)
  for idx, off in offsets.items():
    s = elf.sections[idx]
    if s.type != SHT_NOBITS:
      buf[off:off + s.size] = elf.data(s)
  return bytes(buf)


def _slots(keys: list[Key], start: int, size: int) -> tuple[dict[Key, int], int]:
  """Gives each key a slot of size bytes from start on; returns the slot offsets and the end."""
  return {k: start + i * size for i, k in enumerate(keys)}, start + size * len(keys)


def load_elf(obj: bytes) -> ElfImage:
  """Lays out obj's SHF_ALLOC sections, then the GOT and the external-call stubs, then the writable sections."""
  elf = ElfObject(obj)
  arch = ARCHES[elf.machine]
  alloc = {s.index: s for s in elf.sections if s.flags & SHF_ALLOC}
  offsets: dict[int, int] = {}
  end = _place({i: s for i, s in alloc.items() if not _is_writable(s)}, 0, offsets)
  raws = _raw_relocs(elf, arch, alloc)
  got_syms = {r.sym_index: r.sym for r in raws if r.type in arch.got_relocs}
  externs = [r.sym.name for r in raws if r.type in arch.call_relocs and r.sym.section == SHN_UNDEF]
  got_at, end = _slots(list(got_syms), _align(end, GOT_SLOT), GOT_SLOT)
  stubs, exec_size = _slots(list(dict.fromkeys(externs)), _align(end, arch.stub_size), arch.stub_size)
  writable = {i: s for i, s in alloc.items() if _is_writable(s)}
  size = _place(writable, _align(exec_size, PAGE_SIZE), offsets) if writable else exec_size
  relocs = tuple(Reloc(offsets[r.section] + r.offset, r.type, _symref(r.sym, offsets), r.addend, r.section_name)
                 for r in raws)
  got = {_symref(got_syms[i], offsets): off for i, off in got_at.items()}
  symtab = next((s for s in elf.sections if s.type == SHT_SYMTAB and s.name == ".symtab"), None)
  symbols = elf.symbols(symtab) if symtab is not None else []
  return ElfImage(elf.machine, _contents(elf, size, offsets), _symbols(symbols, offsets, STT_FUNC),
                  _symbols(symbols, offsets, STT_OBJECT), relocs, got, stubs, exec_size)


# *** relocation

def relocate(image: ElfImage, base: int, resolve_external: Resolver) -> bytes:
  """The image's bytes as they must be at address base: GOT and stubs filled in, every relocation applied."""
  arch, buf = ARCHES[image.machine], bytearray(image.data)
  addr = _addresser(base, resolve_external)
  for ref, off in image.got.items():
    _put_u64(buf, off, addr(ref))
  for name, off in image.stubs.items():
    buf[off:off + arch.stub_size] = arch.stub(addr(SymRef(name, None)))
  for r in image.relocs:
    name, value, put = arch.relocs[r.type]
    stubbed = r.type in arch.call_relocs and r.target.offset is None
    s = base + image.stubs[r.target.name] if stubbed else addr(r.target)
    g = base + image.got[r.target] if r.type in arch.got_relocs else 0
    try:
      put(buf, r.offset, value(s, r.addend, base + r.offset, g))
    except RelocationError as e:
      raise RelocationError(f"{name} in {r.section} at image offset {r.offset:#x} against {r.target.name!r} "
                            f"(image base {base:#x}): {e}") from None
  return bytes(buf)


def _addresser(base: int, resolve_external: Resolver) -> Callable[[SymRef], int]:
  @functools.cache
  def addr(ref: SymRef) -> int:
    return base + ref.offset if ref.offset is not None else resolve_external(ref.name)
  return addr


@functools.cache
def _libraries() -> tuple[ctypes.CDLL, ...]:
  # the process itself first (libc, and libm when python links it), then the libraries LLVM's libcalls live in
  paths = (ctypes.util.find_library(name) for name in ("m", "gcc_s"))
  return (ctypes.CDLL(None),) + tuple(ctypes.CDLL(p) for p in paths if p is not None)


@functools.cache
def find_process_symbol(name: str) -> int:
  """The address of a function in the running process, libm or libgcc_s; raises LookupError if none has it."""
  for lib in _libraries():
    try:
      fn = lib[name]
    except AttributeError:
      continue
    return int(ctypes.cast(fn, ctypes.c_void_p).value)
  raise LookupError(f"undefined symbol {name!r} is in neither the process, libm nor libgcc_s")


# *** AMD GPU code objects

@dataclass(frozen=True)
class AMDKernel:
  """A kernel of an AMD code object, laid out and relocated: the image to upload, where its kernel descriptor and its
  code start, and the descriptor's facts a dispatch packet needs (from the AMDGPU kernel descriptor layout)."""
  name: str
  image: bytes
  descriptor_offset: int         # the dispatch packet's kernel_object points here
  code_offset: int
  group_segment_size: int        # LDS (shared memory) bytes
  private_segment_size: int      # scratch bytes per work-item
  kernarg_size: int
  rsrc1: int
  rsrc2: int
  rsrc3: int
  properties: int


def load_amd_kernel(obj: bytes, name: str) -> AMDKernel:
  """Lay out an AMD code object (a relocatable ELF from LLVM), apply its relocations (all relative, so the image is
  position independent) and read the kernel descriptor `name.kd`."""
  image = load_elf(obj)
  if image.machine != "EM_AMDGPU": raise ValueError(f"{name}: expected an AMDGPU code object, got {image.machine}")
  if f"{name}.kd" not in image.objects:
    raise KeyError(f"the code object has no kernel descriptor {name}.kd (it has {sorted(image.objects)})")
  data = relocate(image, 0, lambda symbol: _no_stub(0))
  at = image.objects[f"{name}.kd"]
  kd = descriptors.kernel_descriptor_t.from_buffer_copy(data, at)
  code = at + kd.kernel_code_entry_byte_offset
  if code != image.functions.get(name, code):
    raise RelocationError(f"{name}.kd points at {code:#x}, but {name} starts at {image.functions[name]:#x}")
  return AMDKernel(name, data, at, code, kd.group_segment_fixed_size, kd.private_segment_fixed_size, kd.kernarg_size,
                   kd.compute_pgm_rsrc1, kd.compute_pgm_rsrc2, kd.compute_pgm_rsrc3, kd.kernel_code_properties)
