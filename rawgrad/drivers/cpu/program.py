"""Machine code for the CPU: a relocatable ELF object loaded by our own loader into mmap'd memory."""
from __future__ import annotations

import ctypes
import functools
import mmap
import platform
from collections.abc import Sequence
from typing import Any

from rawgrad.runtime.elf import PAGE_SIZE, find_process_symbol, load_elf, relocate

CType = Any  # a ctypes type such as ctypes.c_void_p; ctypes gives them no common public base class


def _round_up(x: int, a: int) -> int:
  return (x + a - 1) // a * a


@functools.cache
def _mprotect() -> Any:
  fn = ctypes.CDLL(None, use_errno=True).mprotect
  fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
  return fn


def _make_executable(addr: int, size: int) -> None:
  if platform.machine() in ("aarch64", "arm64"):
    # the data cache may still hold what we wrote while the instruction cache holds what was there before
    clear_cache = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(find_process_symbol("__clear_cache"))
    clear_cache(addr, addr + size)
  if _mprotect()(addr, size, mmap.PROT_READ | mmap.PROT_EXEC) != 0:
    err = ctypes.get_errno()
    raise OSError(err, f"mprotect({addr:#x}, {size:#x}, PROT_READ|PROT_EXEC) failed")


class CPUProgram:
  """Function `name` of a relocatable ELF object, loaded into anonymous memory that lives as long as this object.

  Without argtypes every argument is passed as int64, which also carries buffer addresses: on the 64-bit ABIs we
  run on, pointers and 64-bit integers travel in the same registers. Float arguments need argtypes.
  """

  def __init__(self, name: str, obj: bytes, argtypes: Sequence[CType] | None = None, restype: CType = None) -> None:
    image = load_elf(obj)
    if name not in image.functions:
      raise KeyError(f"function {name!r} is not in the object, which defines {sorted(image.functions)}")
    self.name, self.argtypes, self.restype = name, None if argtypes is None else tuple(argtypes), restype
    # the image holds at least one byte of code, so the mapping is never empty
    self._mem = mmap.mmap(-1, _round_up(len(image.data), PAGE_SIZE), flags=mmap.MAP_PRIVATE,
                          prot=mmap.PROT_READ | mmap.PROT_WRITE)
    self.base = ctypes.addressof(ctypes.c_char.from_buffer(self._mem))  # the temporary releases the buffer at once
    self._mem[:len(image.data)] = relocate(image, self.base, find_process_symbol)
    # writable sections (rare: globals a kernel updates) sit on their own pages after exec_size and stay read+write
    _make_executable(self.base, _round_up(image.exec_size, PAGE_SIZE))
    self.address = self.base + image.functions[name]
    self._fxn = None if self.argtypes is None else ctypes.CFUNCTYPE(restype, *self.argtypes)(self.address)

  def __call__(self, *args: Any) -> Any:
    if self._fxn is not None:
      return self._fxn(*args)
    return ctypes.CFUNCTYPE(self.restype, *(ctypes.c_int64,) * len(args))(self.address)(*args)




class CPUKernel:
  """A compiled kernel of a CPU device: `void name(ptr args, i64 core, i64 cores)` (see native.py), loaded into
  executable memory. An EXEC runs it over an argument block."""

  def __init__(self, device: object, name: str, lib: bytes):
    self.device, self.name = device, name
    self.program = CPUProgram(name, lib)
    self.address = self.program.address

  def __repr__(self) -> str:
    return f"<CPUKernel {self.name} at {self.address:#x}>"
