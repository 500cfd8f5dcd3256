"""The device registry, buffers of device memory and their allocators."""
from __future__ import annotations

import importlib
import weakref
from collections import defaultdict
from typing import Any

import numpy as np

from rawgrad.compiler.ir import Ops, UOp
from rawgrad.dtype import DType, dtypes
from rawgrad.errors import ArgumentError, OutOfMemoryError
from rawgrad.helpers import GlobalCounters, getenv
from rawgrad.runtime.hcq import DeviceMemory


class Allocator:
  """Allocates device memory as DeviceMemory; freed allocations are kept by size and handed out again (most recent
  first), so a training loop stops asking the device for memory after its first step. Reusing memory is safe without
  waiting: the device runs its submissions in order. Memory really given back waits for the device first.
  `capacity_bytes` is the device's memory where the driver knows it: no allocation can be larger."""

  def __init__(self, cache_limit_bytes: int = 1 << 30, capacity_bytes: int | None = None):
    self.cache: dict[int, list[DeviceMemory]] = defaultdict(list)
    self.cached_bytes, self.cache_limit_bytes = 0, cache_limit_bytes
    self.capacity_bytes = capacity_bytes
    self.device: Any = None  # the HCQDevice, set when it is made

  def alloc(self, nbytes: int) -> DeviceMemory:
    if self.capacity_bytes is not None and nbytes > self.capacity_bytes:
      name = "a device" if self.device is None else self.device.name
      raise OutOfMemoryError(f"cannot allocate {nbytes} bytes on {name}, which has {self.capacity_bytes} bytes of "
                             "memory")
    if self.cache[nbytes]:
      self.cached_bytes -= nbytes
      return self.cache[nbytes].pop()
    return self._alloc(nbytes)

  def free(self, memory: DeviceMemory, nbytes: int) -> None:
    # a buffer collected in one garbage cycle with its memory's owner: the driver is freeing the memory already
    if memory.released: return
    if self.cached_bytes + nbytes > self.cache_limit_bytes:
      self._release(memory, nbytes)
      return
    self.cached_bytes += nbytes
    self.cache[nbytes].append(memory)

  def clear_cache(self) -> None:
    for nbytes, memories in self.cache.items():
      for memory in memories: self._release(memory, nbytes)
    self.cache.clear()
    self.cached_bytes = 0

  def _release(self, memory: DeviceMemory, nbytes: int) -> None:
    if self.device is not None: self.device.synchronize()
    self._free(memory, nbytes)

  # device-specific
  def _alloc(self, nbytes: int) -> DeviceMemory:
    raise NotImplementedError

  def _free(self, memory: DeviceMemory, nbytes: int) -> None:
    raise NotImplementedError


class _DeviceRegistry:
  """`Device["CPU"]` opens a device by name (case-insensitive; `NAME:n` is the n-th device of a driver);
  `Device.DEFAULT` is the default device (DEVICE in the environment, else CPU)."""
  _drivers = {"CPU": "rawgrad.drivers.cpu", "SIM": "rawgrad.drivers.sim", "NV": "rawgrad.drivers.nv",
              "AMD": "rawgrad.drivers.amd"}

  def __init__(self) -> None:
    self._opened: dict[str, Any] = {}

  @property
  def DEFAULT(self) -> str:
    return self.canonicalize(getenv("DEVICE", "CPU"))

  def canonicalize(self, name: str | None) -> str:
    if name is None: return self.DEFAULT
    if not isinstance(name, str): raise TypeError(f"a device name is a string like 'CPU', not {name!r}")
    base = name.split(":")[0].upper()
    if base not in self._drivers:
      raise ArgumentError(f"unknown device {name!r}; known devices: {', '.join(sorted(self._drivers))}")
    return base + name[len(base):]

  def memory_bytes(self, name: str) -> int | None:
    """The memory of a device in bytes, None where its driver cannot tell. An open device is asked; otherwise its
    driver, if it can tell without opening a device (the CPU's is the host's physical memory)."""
    name = self.canonicalize(name)
    if name in self._opened: return self._opened[name].allocator.capacity_bytes
    driver = importlib.import_module(self._drivers[name.split(":")[0]])
    return driver.memory_bytes() if hasattr(driver, "memory_bytes") else None

  def opened(self) -> list[Any]:
    """The devices opened so far."""
    return list(self._opened.values())

  def __getitem__(self, name: str) -> Any:
    if (opened := self._opened.get(name)) is not None: return opened  # a canonical name, asked on every launch
    name = self.canonicalize(name)
    if name not in self._opened:
      module = importlib.import_module(self._drivers[name.split(":")[0]])
      device = module.open_device(name)
      self._opened[name] = device
    return self._opened[name]


Device = _DeviceRegistry()


def check_fits(nbytes: int, device: str) -> None:
  """Raise OutOfMemoryError now when `nbytes` can never fit in the device's memory."""
  capacity = Device.memory_bytes(device)
  if capacity is not None and nbytes > capacity:
    raise OutOfMemoryError(f"a tensor of {nbytes} bytes does not fit in the {capacity} bytes of memory of {device}")


class Buffer:
  """Memory on a device holding `size` elements of `dtype`; allocated on first use. A buffer with a `base` is a
  view of `nbytes` at byte `offset` inside the base (the memory planner packs temporaries that way)."""

  def __init__(self, device: str, size: int, dtype: DType, base: Buffer | None = None, offset: int = 0):
    if size < 0: raise ValueError(f"buffer size must be non-negative, got {size}")
    if base is not None and offset + size * dtype.itemsize > base.nbytes:
      raise ValueError(f"a view of {size * dtype.itemsize} bytes at offset {offset} does not fit in "
                       f"{base.nbytes} bytes")
    self.device, self.size, self.dtype, self.base, self.offset = device, size, dtype, base, offset
    self._raw: DeviceMemory | None = None
    self._initial: np.ndarray | None = None

  @property
  def nbytes(self) -> int:
    return self.size * self.dtype.itemsize

  @property
  def allocator(self) -> Allocator:
    return Device[self.device].allocator

  @property
  def hcq(self) -> Any:
    return Device[self.device]

  @property
  def is_allocated(self) -> bool:
    return self._raw is not None

  def set_initial(self, data: np.ndarray) -> None:
    """Data copied in when the buffer is allocated (keeps creation lazy)."""
    if data.size != self.size:
      raise ValueError(f"initial data has {data.size} elements, the buffer holds {self.size}")
    self._initial = data

  def ensure_allocated(self) -> Buffer:
    if self._raw is None:
      if self.base is not None: self._raw = self.base.raw.view(self.offset, self.nbytes)
      else:
        nbytes = max(self.nbytes, 1)
        self._raw = self.allocator.alloc(nbytes)
        GlobalCounters.track_memory(nbytes)
      if self._initial is not None:
        self.copyin(memoryview(self._initial.reshape(-1).view(np.uint8)))
        self._initial = None
    return self

  def host_values(self) -> np.ndarray | None:
    """The contents, flat, if the host can read them without waiting for the device (data not uploaded yet, or
    host-mapped memory of an idle device); None otherwise. The array may share memory with the buffer: read it at
    once, never write it."""
    if self._raw is None: return None if self._initial is None else self._initial.reshape(-1)
    if self._raw.host is None or not self.hcq.idle: return None
    return self._raw.host[:self.nbytes].view(dtypes.to_numpy(self.dtype))

  @property
  def raw(self) -> DeviceMemory:
    return self.ensure_allocated()._raw

  @property
  def address(self) -> int:
    """The buffer's device address."""
    return (self._raw if self._raw is not None else self.raw).address  # asked for every launch

  def copyin(self, data: memoryview) -> None:
    if data.nbytes != self.nbytes: raise ValueError(f"copyin of {data.nbytes} bytes into a {self.nbytes}-byte buffer")
    self.hcq.copyin(self.raw, data)

  def numpy(self) -> np.ndarray:
    """A copy of the contents as a flat numpy array."""
    if self._raw is None and self._initial is not None: return self._initial.reshape(-1).copy()
    out = np.empty(self.size, dtype=dtypes.to_numpy(self.dtype))
    if self.size: self.hcq.copyout(memoryview(out.view(np.uint8)), self.raw)
    return out

  def __del__(self) -> None:
    if getattr(self, "_raw", None) is not None and self.base is None:
      try:
        nbytes = max(self.nbytes, 1)
        GlobalCounters.track_memory(-nbytes)
        self.allocator.free(self._raw, nbytes)
      except Exception:  # noqa: BLE001 - at interpreter exit the device may already be gone
        pass

  def __repr__(self) -> str:
    state = "allocated" if self.is_allocated else "lazy"
    return f"<Buffer {self.device} {self.size} x {self.dtype!r} {state}>"


_buffers: weakref.WeakKeyDictionary[UOp, Buffer] = weakref.WeakKeyDictionary()


def buffer_for(node: UOp) -> Buffer:
  """The Buffer behind a BUFFER node; it lives as long as the node does."""
  if node.op is not Ops.BUFFER: raise TypeError(f"{node.op} is not a buffer node")
  if (found := _buffers.get(node)) is None:
    found = _buffers[node] = Buffer(node.src[1].arg, node.arg, node.dtype)
  return found


def bind_buffer(node: UOp, buffer: Buffer) -> None:
  """Back a BUFFER node by a given Buffer (a planned view) before it is first used."""
  if node in _buffers and _buffers[node] is not buffer and _buffers[node].is_allocated:
    raise RuntimeError(f"{node.op} already has allocated memory; it cannot be re-planned")
  _buffers[node] = buffer
