"""The linear programs behind kernels' machine code, for the emulated GPUs (EMULATE=1).

An emulated GPU cannot run SASS or AMDGPU code, so a driver that compiled a kernel with its program embedded hands
the program over as it uploads the code (`KernelInterface.register_program`). A launch finds it again from the
bytes at the address it names, by their SHA-256: code overwritten or never uploaded finds nothing, as it would
fault on hardware. The registry is shared by every emulated kernel of the process.
"""
from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from typing import Any, Callable

from rawgrad.compiler.ir import UOp
from rawgrad.compiler.program_text import deserialize_program


@dataclass(frozen=True)
class RegisteredProgram:
  program: list[UOp]
  code_bytes: int
  facts: Any      # what the loader read from the code (a cubin's KernelFacts, an AMDKernel), checked at launch


Placed = tuple[bytes, RegisteredProgram]   # the digest of code put at an address, and its program

_programs: dict[bytes, RegisteredProgram] = {}     # SHA-256 of the code -> the first program registered with it
_lock = threading.Lock()


def register_program(code: bytes, program_text: str, facts: Any) -> Placed:
  """Remember the linear program behind these code bytes; returns the code's digest and the entry."""
  digest = hashlib.sha256(code).digest()
  entry = RegisteredProgram(deserialize_program(program_text), len(code), facts)
  with _lock: _programs.setdefault(digest, entry)
  return digest, entry   # this program, even where other code with the same bytes came first


def find_program(read: Callable[[int], bytes], fault: type[Exception], placed: Placed | None = None
                 ) -> RegisteredProgram | None:
  """The program whose code is at an address (`read(n)` gives the n bytes there, or raises `fault` where they are
  not mapped): the one placed there if the bytes still hash to it, else any registered with those bytes."""
  if placed is not None:
    digest, entry = placed
    try:
      if hashlib.sha256(read(entry.code_bytes)).digest() == digest: return entry
    except fault:
      pass
  with _lock: lengths = sorted({entry.code_bytes for entry in _programs.values()})
  for length in lengths:
    try:
      code = read(length)
    except fault:
      continue
    if (found := _programs.get(hashlib.sha256(code).digest())) is not None: return found
  return None
