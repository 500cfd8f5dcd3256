"""The linear programs behind kernels' machine code, for the emulated GPUs (EMULATE=1).

An emulated GPU cannot run SASS or AMDGPU code, so a driver that compiled a kernel with its program embedded hands
the program over as it uploads the code (`KernelInterface.register_program`, with the address it put the code at).
A launch finds the program placed at the address it names, if the bytes there still hash to the code placed: code
overwritten, freed or never uploaded finds nothing, as it would fault on hardware. (Kernels that differ only in
their buffers' sizes can compile to the same bytes, so the bytes alone do not name a program.)
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
  digest: bytes   # SHA-256 of the code
  facts: Any      # what the loader read from the code (a cubin's KernelFacts, an AMDKernel), checked at launch


class PlacedPrograms:
  """The programs one emulated kernel's driver placed, by GPU address."""

  def __init__(self) -> None:
    self.placed: dict[int, RegisteredProgram] = {}
    self.lock = threading.Lock()

  def register(self, address: int, code: bytes, program_text: str, facts: Any) -> None:
    entry = RegisteredProgram(deserialize_program(program_text), len(code), hashlib.sha256(code).digest(), facts)
    with self.lock: self.placed[address] = entry

  def find(self, address: int, read: Callable[[int], bytes], fault: type[Exception]) -> RegisteredProgram | None:
    """The program placed at `address` if the bytes there (`read(n)`, raising `fault` where they are not mapped)
    are still its code."""
    with self.lock: entry = self.placed.get(address)
    if entry is None: return None
    try:
      return entry if hashlib.sha256(read(entry.code_bytes)).digest() == entry.digest else None
    except fault:
      return None
