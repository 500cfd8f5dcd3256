"""The facts a launch needs from a cubin (ptxas's ELF output), read with struct alone.

For kernel `k` (docs/nv-driver-notes.md section 8): its code is `.text.k` (the entry is symbol `k`), `.nv.info` holds
per-function records keyed by symbol index (register count, stack frame), `.nv.info.k` the kernel's own (parameter
offsets and sizes, where the parameters start in constant bank 0, barriers, thread limits), `.nv.shared.k` the static
shared memory (on sm_90 it includes the 1 KiB the system reserves), `.nv.constant0.k` the size of constant bank 0.
Kernels that need relocations or the banks for `.global`/`.const` data are refused: nothing here places them.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

EM_CUDA = 190
SHT_SYMTAB, SHT_NOBITS, SHT_RELA, SHT_REL, SHT_CUDA_INFO = 2, 8, 4, 9, 0x70000000
STT_FUNC = 2

# .nv.info record formats and the attributes read here
EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL, EIFMT_SVAL = 1, 2, 3, 4
EIATTR_MAX_THREADS, EIATTR_PARAM_CBANK, EIATTR_FRAME_SIZE, EIATTR_REQNTID = 0x05, 0x0A, 0x11, 0x10
EIATTR_KPARAM_INFO, EIATTR_CBANK_PARAM_SIZE, EIATTR_REGCOUNT = 0x17, 0x19, 0x2F
EIATTR_MIN_STACK_SIZE, EIATTR_NUM_BARRIERS, EIATTR_KPARAM_INFO_V2 = 0x12, 0x4C, 0x45


class CubinError(ValueError):
  """The binary is not a cubin this driver can launch; the message says what is missing or unsupported."""


@dataclass(frozen=True)
class Parameter:
  ordinal: int
  offset: int   # from the start of the parameters in constant bank 0
  size: int


@dataclass(frozen=True)
class KernelFacts:
  name: str
  sm: int                        # 90 for sm_90
  code: bytes                    # .text.<name>
  entry: int                     # offset of the entry point in code
  registers: int
  parameters: tuple[Parameter, ...]   # by ordinal
  parameter_base: int            # where the parameters start in constant bank 0 (0x210 on sm_90)
  parameter_bytes: int
  constant_bank_bytes: int       # size of constant bank 0 (base + parameters)
  shared_bytes: int              # static shared memory per block, the system's reserve included
  frame_bytes: int               # per-thread local memory (stack)
  barriers: int
  max_threads: tuple[int, int, int] | None   # from .maxntid / .reqntid


@dataclass(frozen=True)
class _Section:
  index: int
  name: str
  kind: int
  offset: int
  size: int
  link: int
  info: int
  data: bytes


def _sections(data: bytes) -> list[_Section]:
  if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
    raise CubinError("not a 64-bit little-endian ELF file (a cubin starts with \\x7fELF, class 2, data 1)")
  machine = struct.unpack_from("<H", data, 18)[0]
  if machine != EM_CUDA: raise CubinError(f"ELF machine {machine} is not EM_CUDA ({EM_CUDA}): not a cubin")
  section_offset = struct.unpack_from("<Q", data, 0x28)[0]
  entry_size, count, names_index = struct.unpack_from("<HHH", data, 0x3A)
  headers = [struct.unpack_from("<IIQQQQIIQQ", data, section_offset + i * entry_size) for i in range(count)]
  names = headers[names_index]
  string_table = data[names[4]:names[4] + names[5]]

  def name_at(offset: int) -> str:
    return string_table[offset:string_table.index(b"\0", offset)].decode()

  sections = []
  for index, (name, kind, _, _, offset, size, link, info, _, _) in enumerate(headers):
    body = b"" if kind == SHT_NOBITS else data[offset:offset + size]
    sections.append(_Section(index, name_at(name), kind, offset, size, link, info, body))
  return sections


def _symbols(sections: list[_Section]) -> list[tuple[str, int, int, int, int]]:
  """(name, type, section index, value, size) of every symbol."""
  table = next((s for s in sections if s.kind == SHT_SYMTAB), None)
  if table is None: raise CubinError("the cubin has no symbol table")
  strings = sections[table.link].data
  symbols = []
  for offset in range(0, len(table.data), 24):
    name, info, _, section, value, size = struct.unpack_from("<IBBHQQ", table.data, offset)
    symbols.append((strings[name:strings.index(b"\0", name)].decode(), info & 0xF, section, value, size))
  return symbols


def info_records(data: bytes) -> list[tuple[int, int, bytes]]:
  """(attribute, format, value) of each .nv.info record: the value is the payload for SVAL, else the 16-bit field."""
  records, position = [], 0
  while position + 4 <= len(data):
    form, attribute, value = struct.unpack_from("<BBH", data, position)
    position += 4
    if form == EIFMT_SVAL:
      records.append((attribute, form, data[position:position + value]))
      position += value
    elif form in (EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL):
      records.append((attribute, form, struct.pack("<H", value)))
    else:
      raise CubinError(f".nv.info record at byte {position - 4} has unknown format {form}")
  return records


def sm_version(data: bytes) -> int:
  """The SM of a cubin: e_flags bits 15:8 with ELF ABI version 8 (CUDA 12+), bits 7:0 before."""
  flags = struct.unpack_from("<I", data, 0x30)[0]
  return (flags >> 8) & 0xFF if data[8] >= 8 else flags & 0xFF


def kernel_names(data: bytes) -> list[str]:
  return [s.name[len(".text."):] for s in _sections(data) if s.name.startswith(".text.")]


def read_kernel(data: bytes, name: str) -> KernelFacts:
  """Everything a launch of kernel `name` needs from the cubin."""
  sections = _sections(data)
  by_name = {s.name: s for s in sections}
  text = by_name.get(f".text.{name}")
  if text is None:
    raise CubinError(f"the cubin has no kernel {name!r}; it has {', '.join(kernel_names(data)) or 'none'}")
  _refuse_unsupported(sections, name)
  symbols = _symbols(sections)
  symbol_index = next((i for i, s in enumerate(symbols) if s[0] == name and s[1] == STT_FUNC), None)
  if symbol_index is None: raise CubinError(f"the cubin has no function symbol {name!r}")
  function = _function_records(by_name.get(".nv.info"), symbol_index)
  kernel = _kernel_records(by_name.get(f".nv.info.{name}"), name)
  shared = by_name.get(f".nv.shared.{name}")
  constants = by_name.get(f".nv.constant0.{name}")
  bank_bytes = constants.size if constants is not None else kernel["parameter_base"] + kernel["parameter_bytes"]
  return KernelFacts(
    name=name, sm=sm_version(data), code=text.data, entry=symbols[symbol_index][3],
    registers=function.get("registers", 0), parameters=kernel["parameters"],
    parameter_base=kernel["parameter_base"], parameter_bytes=kernel["parameter_bytes"],
    constant_bank_bytes=bank_bytes,
    shared_bytes=shared.size if shared is not None else 0,
    frame_bytes=max(function.get("frame", 0), function.get("stack", 0)), barriers=kernel["barriers"],
    max_threads=kernel["max_threads"])


def _refuse_unsupported(sections: list[_Section], name: str) -> None:
  for section in sections:
    if section.kind in (SHT_RELA, SHT_REL) and section.size and section.name != ".rela.debug_frame" \
       and not section.name.endswith(".debug_frame"):
      raise CubinError(f"kernel {name}: the cubin needs relocations ({section.name}), which this driver does not apply")
    if section.name in (".nv.constant3", ".nv.constant4", ".nv.global", ".nv.global.init") and section.size:
      raise CubinError(f"kernel {name}: the cubin has {section.name} (.global or .const data), which this driver does "
                       "not place")


def _function_records(section: _Section | None, symbol_index: int) -> dict[str, int]:
  """Register count and stack frame of the function with this symbol index, from .nv.info."""
  found: dict[str, int] = {}
  if section is None: return found
  keys = {EIATTR_REGCOUNT: "registers", EIATTR_FRAME_SIZE: "frame", EIATTR_MIN_STACK_SIZE: "stack"}
  for attribute, form, value in info_records(section.data):
    if attribute in keys and form == EIFMT_SVAL and len(value) >= 8:
      symbol, number = struct.unpack_from("<II", value)
      if symbol == symbol_index: found[keys[attribute]] = number
  return found


def _kernel_records(section: _Section | None, name: str) -> dict:
  if section is None: raise CubinError(f"kernel {name}: the cubin has no .nv.info.{name} section")
  parameters, base, total, barriers, max_threads = [], None, None, 0, None
  for attribute, _, value in info_records(section.data):
    if attribute == EIATTR_KPARAM_INFO:
      _, ordinal, offset, flags = struct.unpack_from("<IHHI", value)
      parameters.append(Parameter(ordinal, offset, flags >> 18))
    elif attribute == EIATTR_KPARAM_INFO_V2:
      raise CubinError(f"kernel {name}: KPARAM_INFO_V2 records are not understood (made by a newer toolchain?)")
    elif attribute == EIATTR_PARAM_CBANK:
      _, base, size = struct.unpack_from("<IHH", value)
      total = size if total is None else total
    elif attribute == EIATTR_CBANK_PARAM_SIZE: total = struct.unpack_from("<H", value)[0]
    elif attribute == EIATTR_NUM_BARRIERS: barriers = struct.unpack_from("<H", value)[0]
    elif attribute in (EIATTR_MAX_THREADS, EIATTR_REQNTID): max_threads = struct.unpack_from("<III", value)
  if base is None: raise CubinError(f"kernel {name}: .nv.info.{name} says nowhere where its parameters start "
                                    "(no EIATTR_PARAM_CBANK)")
  parameters.sort(key=lambda p: p.ordinal)
  if [p.ordinal for p in parameters] != list(range(len(parameters))):
    raise CubinError(f"kernel {name}: parameter ordinals {[p.ordinal for p in parameters]} are not 0..n-1")
  return {"parameters": tuple(parameters), "parameter_base": base, "parameter_bytes": total or 0,
          "barriers": barriers, "max_threads": max_threads}
