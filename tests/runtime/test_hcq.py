"""The HCQ layer every device implements: queue commands, rings of device-visible memory, ordering, copies."""
import numpy as np
import pytest

from rawgrad.runtime.device import Device
from rawgrad.runtime.hcq import DeviceMemory, HostRing, HWQueue


@pytest.mark.parametrize("name", ["CPU", "SIM"])
def test_a_signal_command_sets_the_value_and_the_device_time(name: str) -> None:
  device = Device[name]
  signal = device.new_signal(0, "test")
  device.submit(HWQueue().signal(signal, 42))
  signal.wait(42, timeout_s=10)
  assert signal.value == 42 and signal.timestamp_ns > 0


@pytest.mark.parametrize("name", ["CPU", "SIM"])
def test_copies_and_timestamps_through_queues(name: str) -> None:
  device = Device[name]
  source, dest, times = device.host_memory(256), device.host_memory(256), device.host_memory(16)
  source.host[:] = np.arange(256, dtype=np.uint8)
  device.submit(HWQueue().timestamp(times.address).copy(dest.address, source.address, 256)
                .timestamp(times.address + 8).memory_barrier())
  device.synchronize()
  np.testing.assert_array_equal(dest.host, source.host)
  start, end = times.host.view(np.uint64)
  assert 0 < start <= end


def test_queue_arguments_are_checked() -> None:
  with pytest.raises(ValueError, match="three non-negative sizes"): HWQueue().exec(object(), 0, (1, 1), (1, 1, 1))
  with pytest.raises(ValueError, match="8-byte aligned"): HWQueue().timestamp(0x1004)
  with pytest.raises(ValueError, match="a copy of -1 bytes"): HWQueue().copy(0, 0, -1)
  with pytest.raises(ValueError, match="unknown engine 'dma'"): Device["CPU"].submit(HWQueue(), "dma")


def test_views_stay_inside_their_memory() -> None:
  memory = DeviceMemory(0x1000, 64, np.zeros(64, np.uint8))
  view = memory.view(16, 32)
  assert view.address == 0x1010 and view.nbytes == 32 and view.host.size == 32
  with pytest.raises(ValueError, match="32 bytes at offset 40 does not fit in 64"): memory.view(40, 32)


def test_a_ring_that_wraps_waits_for_the_device() -> None:
  device = Device["SIM"]
  ring = HostRing(device, 256, "test")
  first = ring.alloc(200)
  waited = []
  original = device.timeline_signal.wait
  device.timeline_signal.wait = lambda value, timeout_s=30.0: waited.append(value) or original(value, timeout_s)
  try:
    second = ring.alloc(100)  # does not fit after the first: back to the start, once the device is done
  finally:
    device.timeline_signal.wait = original
  assert waited == [device.timeline_value] and second.address == first.address
  with pytest.raises(ValueError, match="1000 bytes do not fit in the test ring of 256 bytes"): ring.alloc(1000)
