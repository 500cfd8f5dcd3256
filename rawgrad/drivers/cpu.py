"""Runs LLVM-compiled kernels on the CPU: our own ELF loader into mmap'd memory, called through ctypes."""
from __future__ import annotations

import ctypes
import functools
import mmap
import platform
from collections.abc import Sequence
from typing import Any

import numpy as np

from rawgrad.runtime.device import Allocator, Compiled
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


class CPUAllocator(Allocator):
  """Host memory from numpy, aligned to 64 bytes so vector loads never straddle a cache line needlessly."""

  def _alloc(self, nbytes: int) -> np.ndarray:
    backing = np.empty(nbytes + 64, dtype=np.uint8)
    offset = (-backing.ctypes.data) % 64
    return backing[offset:offset + nbytes]

  def _free(self, raw: np.ndarray, nbytes: int) -> None:
    del raw  # numpy owns the memory

  def address(self, raw: np.ndarray) -> int:
    return raw.ctypes.data

  def copyin(self, raw: np.ndarray, data: memoryview) -> None:
    raw[:data.nbytes] = np.frombuffer(data, dtype=np.uint8)

  def copyout(self, dest: memoryview, raw: np.ndarray) -> None:
    np.frombuffer(dest, dtype=np.uint8)[:] = raw[:dest.nbytes]

  def view(self, raw: np.ndarray, offset: int, nbytes: int) -> np.ndarray:
    return raw[offset:offset + nbytes]


def open_device(name: str) -> Compiled:
  from rawgrad.compiler.render.llvmir import LLVMRenderer
  from rawgrad.runtime.compile import LLVMCompiler
  return Compiled(name, CPUAllocator(), LLVMCompiler(), CPUProgram, LLVMRenderer())
