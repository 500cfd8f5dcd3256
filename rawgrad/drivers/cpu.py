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
from rawgrad.runtime.hcq import HCQDevice, HCQSignal, HWQueue
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


class CPUSignal(HCQSignal):
  """A timeline signal in host memory, set by the native command processor."""

  def __init__(self, runtime: Any, name: str):
    from rawgrad.runtime.native import Signal
    self.runtime, self.native = runtime, Signal(0, name)

  @property
  def value(self) -> int:
    return self.native.value

  @property
  def timestamp_ns(self) -> int:
    return self.native.timestamp

  def wait(self, value: int, timeout_s: float = 30.0) -> None:
    self.runtime.wait_signal(self.native, value, timeout_s)


class CPUDevice(Compiled, HCQDevice):
  """The CPU as an HCQ device: queues become native command buffers, run by the native command processor and its
  worker pool (rawgrad/runtime/native.py) with no Python between commands."""

  def __init__(self, name: str):
    from rawgrad.compiler.render.llvmir import LLVMRenderer
    from rawgrad.runtime.compile import LLVMCompiler
    super().__init__(name, CPUAllocator(), LLVMCompiler(), CPUProgram, LLVMRenderer())
    self._runtime: Any = None
    self._signal: CPUSignal | None = None
    self.timeline_value = 0

  @property
  def runtime(self) -> Any:
    if self._runtime is None:
      from rawgrad.runtime.native import NativeRuntime
      self._runtime = NativeRuntime()
    return self._runtime

  @property
  def cores(self) -> int:
    return self.runtime.threads

  @property
  def timeline_signal(self) -> CPUSignal:
    if self._signal is None: self._signal = CPUSignal(self.runtime, f"{self.name} timeline")
    return self._signal

  def encode(self, queue: HWQueue) -> Any:
    from rawgrad.runtime.native import CommandBuffer
    commands = CommandBuffer()
    for command in queue.commands:
      if command.kind == "exec":
        program, kernargs, cores = command.operands
        commands.exec(program, kernargs, cores)
      elif command.kind == "copy": commands.copy(*command.operands)
      elif command.kind in ("signal", "wait"):
        signal, value = command.operands
        getattr(commands, command.kind)(signal.native, value)
      elif command.kind == "timestamp":
        slots, index = command.operands
        commands.timestamp(slots[index:index + 1])
      else: raise ValueError(f"the CPU queue has no command {command.kind!r}")
    return commands

  def submit(self, encoded: Any) -> Any:
    return self.runtime.submit(encoded)

  def synchronize(self, timeout_s: float = 30.0) -> None:
    if self._signal is not None: self.timeline_signal.wait(self.timeline_value, timeout_s)


def open_device(name: str) -> Compiled:
  return CPUDevice(name)
