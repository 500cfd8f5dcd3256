"""runtime/device.py: the allocator's cache, the device registry, buffers (lazy, initial data, views) and the map
from BUFFER nodes to buffers."""
import gc

import numpy as np
import pytest

from rawgrad.compiler.ir import Ops, UOp
from rawgrad.dtype import dtypes
from rawgrad.helpers import GlobalCounters, getenv
from rawgrad.runtime.device import Allocator, Buffer, Device, bind_buffer, buffer_for
from rawgrad.runtime.hcq import DeviceMemory


class _CountingAllocator(Allocator):
  """Hands out numbered fake memories (at address 1, 2, ...) and records what it really frees."""

  def __init__(self, cache_limit_bytes: int) -> None:
    super().__init__(cache_limit_bytes)
    self.made, self.released = 0, []

  def _alloc(self, nbytes: int) -> DeviceMemory:
    self.made += 1
    return DeviceMemory(self.made, nbytes)

  def _free(self, memory: DeviceMemory, nbytes: int) -> None:
    self.released.append(memory)


class _Synchronizing:
  def __init__(self) -> None:
    self.synchronized = 0

  def synchronize(self) -> None:
    self.synchronized += 1


def test_freed_memory_is_handed_out_again_by_size_most_recent_first() -> None:
  allocator = _CountingAllocator(1 << 20)
  a, b, c = allocator.alloc(64), allocator.alloc(64), allocator.alloc(128)
  allocator.free(a, 64)
  allocator.free(b, 64)
  assert allocator.cached_bytes == 128 and allocator.alloc(64) == b and allocator.alloc(64) == a
  assert allocator.alloc(128) != c and allocator.made == 4 and allocator.released == []


def test_memory_beyond_the_cache_limit_is_released_after_the_device_finishes() -> None:
  allocator = _CountingAllocator(100)
  allocator.device = device = _Synchronizing()
  small, large = allocator.alloc(64), allocator.alloc(64)
  allocator.free(small, 64)
  allocator.free(large, 64)  # 128 cached bytes would pass the limit
  assert allocator.released == [large] and device.synchronized == 1 and allocator.cached_bytes == 64
  allocator.clear_cache()
  assert allocator.released == [large, small] and allocator.cached_bytes == 0 and device.synchronized == 2


def test_an_allocator_without_a_device_part_says_so() -> None:
  with pytest.raises(NotImplementedError): Allocator().alloc(8)


def test_device_names() -> None:
  assert Device.canonicalize("cpu") == "CPU" and Device.canonicalize("Cpu:1") == "CPU:1"
  assert Device.canonicalize(None) == Device.DEFAULT
  with pytest.raises(ValueError, match="unknown device .TPU.; known devices: AMD, CPU, NV, SIM"):
    Device.canonicalize("TPU")
  with pytest.raises(TypeError, match="a device name is a string like 'CPU', not 3"): Device.canonicalize(3)


def test_the_default_device_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setenv("DEVICE", "sim")
  getenv.cache_clear()
  try:
    assert Device.DEFAULT == "SIM"
  finally:
    monkeypatch.undo()
    getenv.cache_clear()


def test_a_device_is_opened_once_and_knows_its_allocator() -> None:
  cpu = Device["cpu"]
  assert Device["CPU"] is cpu and cpu.allocator.device is cpu


def test_a_buffer_is_lazy_and_reads_its_initial_data() -> None:
  buffer = Buffer("CPU", 6, dtypes.int32)
  data = np.arange(6, dtype=np.int32)
  buffer.set_initial(data)
  assert not buffer.is_allocated and np.array_equal(buffer.numpy(), data) and not buffer.is_allocated
  assert repr(buffer) == "<Buffer CPU 6 x dtypes.int32 lazy>"
  buffer.ensure_allocated()
  assert buffer.is_allocated and buffer.address != 0 and np.array_equal(buffer.numpy(), data)
  assert repr(buffer) == "<Buffer CPU 6 x dtypes.int32 allocated>"


def test_buffer_sizes_are_checked() -> None:
  with pytest.raises(ValueError, match="buffer size must be non-negative, got -1"): Buffer("CPU", -1, dtypes.float32)
  buffer = Buffer("CPU", 4, dtypes.float32)
  assert buffer.nbytes == 16
  with pytest.raises(ValueError, match="initial data has 3 elements, the buffer holds 4"):
    buffer.set_initial(np.zeros(3, np.float32))
  with pytest.raises(ValueError, match="copyin of 8 bytes into a 16-byte buffer"):
    buffer.copyin(memoryview(np.zeros(2, np.float32).view(np.uint8)))
  with pytest.raises(ValueError, match="a view of 16 bytes at offset 4 does not fit in 16 bytes"):
    Buffer("CPU", 4, dtypes.float32, base=buffer, offset=4)


def test_a_view_shares_its_base_memory() -> None:
  base = Buffer("CPU", 8, dtypes.float32)
  base.copyin(memoryview(np.arange(8, dtype=np.float32).view(np.uint8)))
  view = Buffer("CPU", 3, dtypes.float32, base=base, offset=8)
  assert view.address == base.address + 8 and np.array_equal(view.numpy(), [2, 3, 4])
  view.copyin(memoryview(np.full(3, -1, np.float32).view(np.uint8)))
  assert np.array_equal(base.numpy(), [0, 1, -1, -1, -1, 5, 6, 7])


def test_memory_in_use_is_counted_until_the_buffer_goes() -> None:
  gc.collect()
  gc.disable()  # a collection in between could free other tests' buffers and move the count
  try:
    before = GlobalCounters.mem_used
    buffer = Buffer("CPU", 1000, dtypes.float32).ensure_allocated()
    assert GlobalCounters.mem_used == before + 4000
    del buffer
    assert GlobalCounters.mem_used == before
  finally:
    gc.enable()


def _buffer_node(size: int) -> UOp:
  return UOp(Ops.BUFFER, dtypes.float32, (UOp(Ops.UNIQUE, arg=-size), UOp(Ops.DEVICE, arg="CPU")), size)


def test_a_buffer_node_has_one_buffer() -> None:
  node = _buffer_node(5)
  buffer = buffer_for(node)
  assert buffer_for(node) is buffer and (buffer.device, buffer.size, buffer.dtype) == ("CPU", 5, dtypes.float32)
  with pytest.raises(TypeError, match="Ops.CONST is not a buffer node"): buffer_for(UOp.const(dtypes.int32, 1))


def test_a_node_is_bound_to_a_planned_buffer_only_before_use() -> None:
  node = _buffer_node(7)
  planned = Buffer("CPU", 7, dtypes.float32)
  bind_buffer(node, planned)
  assert buffer_for(node) is planned
  planned.ensure_allocated()
  with pytest.raises(RuntimeError, match="already has allocated memory; it cannot be re-planned"):
    bind_buffer(node, Buffer("CPU", 7, dtypes.float32))
  bind_buffer(node, planned)  # the same buffer again is fine
