"""The OS seam: the only place drivers touch the kernel. Every open, close, ioctl, mmap, munmap, sysfs read and MMIO
access of a driver goes through a KernelInterface, so a test (or a user without the hardware) can put an emulated
kernel behind it without changing a line of driver code.

`kernel_interface(driver)` hands a driver its interface: the real kernel, or, with EMULATE=1 in the environment, the
emulation in `rawgrad/drivers/<driver>/emulated.py` (its `EmulatedKernel`, one per process). Tests may `install` an
interface of their own for a while.

Mapped memory is ordinary memory of this process either way (an emulation maps real pages), so drivers read and write
it through numpy views (`host_view`); only MMIO registers (doorbells) go through `write32`/`write64`/`read32`, where an
emulation notices them.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import importlib
import os
import threading
from typing import Iterator

import numpy as np

PROT_NONE, PROT_READ, PROT_WRITE = 0, 1, 2
MAP_SHARED, MAP_PRIVATE, MAP_FIXED, MAP_ANONYMOUS = 0x01, 0x02, 0x10, 0x20
MAP_NORESERVE, MAP_POPULATE, MAP_FIXED_NOREPLACE = 0x4000, 0x8000, 0x100000
MAP_FAILED = ctypes.c_void_p(-1).value


# *** ioctl request numbers (Linux asm-generic/ioctl.h) ***

IOC_WRITE, IOC_READ = 1, 2


def ioc(direction: int, kind: int, number: int, size: int) -> int:
  """An ioctl request number: direction (2 bits), argument size (14 bits), type (8 bits), number (8 bits)."""
  if not 0 <= size < 1 << 14: raise ValueError(f"an ioctl argument of {size} bytes does not fit the 14-bit size field")
  return (direction << 30) | (size << 16) | (kind << 8) | number


def ioc_size(request: int) -> int:
  return (request >> 16) & 0x3FFF


def ioc_number(request: int) -> int:
  return request & 0xFF


# *** the interface ***

class KernelInterface:
  """What a driver asks of the operating system. Failures raise OSError with the errno the kernel returned."""
  name = "kernel"
  runs_programs = False   # an emulated GPU runs kernels' linear programs, registered with register_program

  def open(self, path: str, flags: int = os.O_RDWR | os.O_CLOEXEC) -> int:
    raise NotImplementedError

  def close(self, fd: int) -> None:
    raise NotImplementedError

  def ioctl(self, fd: int, request: int, argument: ctypes.Structure | ctypes.Array | None) -> None:
    """The ioctl with a pointer to `argument` (which the kernel may write back)."""
    raise NotImplementedError

  def mmap(self, address: int, length: int, prot: int, flags: int, fd: int, offset: int = 0) -> int:
    """Map memory; returns its address."""
    raise NotImplementedError

  def munmap(self, address: int, length: int) -> None:
    raise NotImplementedError

  def read_text(self, path: str) -> str:
    """A small text file (sysfs, procfs); FileNotFoundError when it does not exist."""
    raise NotImplementedError

  def exists(self, path: str) -> bool:
    raise NotImplementedError

  def write32(self, address: int, value: int) -> None:
    """Store 32 bits to a mapped register (a doorbell)."""
    ctypes.c_uint32.from_address(address).value = value & 0xFFFFFFFF

  def write64(self, address: int, value: int) -> None:
    """Store 64 bits in one access (AMD doorbells are 64 bits wide)."""
    ctypes.c_uint64.from_address(address).value = value & (2**64 - 1)

  def read32(self, address: int) -> int:
    return ctypes.c_uint32.from_address(address).value

  def register_program(self, address: int, code: bytes, program_text: str, facts: object) -> None:
    """An emulated GPU learns the linear program behind the machine code placed at a GPU address; the real kernel
    ignores it."""


def host_view(address: int, nbytes: int) -> np.ndarray:
  """A writable uint8 numpy view of `nbytes` of mapped memory at `address` (it does not keep the mapping alive)."""
  if nbytes == 0: return np.zeros(0, dtype=np.uint8)
  return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address))


# *** the real kernel ***

class _LibC:
  """libc's mmap, munmap and ioctl through ctypes: mmap needs an fd and a fixed address, which Python's mmap module
  cannot take, and ioctl gets a plain pointer whatever the argument's size."""

  def __init__(self) -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    self.mmap = libc.mmap
    self.mmap.restype = ctypes.c_void_p
    self.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    self.munmap = libc.munmap
    self.munmap.restype = ctypes.c_int
    self.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    self.ioctl = libc.ioctl
    self.ioctl.restype = ctypes.c_int
    self.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]


_libc: _LibC | None = None


def libc() -> _LibC:
  global _libc
  if _libc is None: _libc = _LibC()
  return _libc


def _raise_errno(what: str) -> None:
  error = ctypes.get_errno()
  raise OSError(error, f"{what}: {os.strerror(error)}")


class RealKernel(KernelInterface):
  """The running Linux kernel."""
  name = "linux"

  def open(self, path: str, flags: int = os.O_RDWR | os.O_CLOEXEC) -> int:
    return os.open(path, flags)

  def close(self, fd: int) -> None:
    os.close(fd)

  def ioctl(self, fd: int, request: int, argument: ctypes.Structure | ctypes.Array | None) -> None:
    pointer = None if argument is None else ctypes.addressof(argument)
    if libc().ioctl(fd, request, pointer) < 0: _raise_errno(f"ioctl {request:#x} on fd {fd}")

  def mmap(self, address: int, length: int, prot: int, flags: int, fd: int, offset: int = 0) -> int:
    mapped = libc().mmap(address or None, length, prot, flags, fd, offset)
    if mapped is None or mapped == MAP_FAILED:
      _raise_errno(f"mmap of {length:#x} bytes at {address:#x} (fd {fd}, flags {flags:#x})")
    return mapped

  def munmap(self, address: int, length: int) -> None:
    if libc().munmap(address, length) < 0: _raise_errno(f"munmap of {length:#x} bytes at {address:#x}")

  def read_text(self, path: str) -> str:
    with open(path) as file: return file.read()

  def exists(self, path: str) -> bool:
    return os.path.exists(path)


# *** choosing the interface ***

_lock = threading.Lock()
_real = RealKernel()
_emulations: dict[str, KernelInterface] = {}
_installed: dict[str, KernelInterface] = {}


def emulating() -> bool:
  return os.environ.get("EMULATE", "0") not in ("", "0")


def kernel_interface(driver: str) -> KernelInterface:
  """The interface a driver talks to: one a test installed, the driver's emulation under EMULATE=1, else the kernel."""
  with _lock:
    if driver in _installed: return _installed[driver]
    if not emulating(): return _real
    if driver not in _emulations:
      module = importlib.import_module(f"rawgrad.drivers.{driver}.emulated")
      _emulations[driver] = module.EmulatedKernel()
    return _emulations[driver]


@contextlib.contextmanager
def installed(driver: str, interface: KernelInterface) -> Iterator[KernelInterface]:
  """Within the block, `driver` talks to `interface` (devices opened meanwhile keep it for their life)."""
  with _lock:
    previous = _installed.get(driver)
    _installed[driver] = interface
  try:
    yield interface
  finally:
    with _lock:
      if previous is None: _installed.pop(driver, None)
      else: _installed[driver] = previous
