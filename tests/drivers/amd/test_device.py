"""AMDDevice on the emulated KFD: memory at one address for the CPU and the GPU, empty submissions the host sees with
GPU timestamps, waits across the two queues, SDMA copies, rings that wrap, and waits that time out naming what they
waited for."""
from __future__ import annotations

import time

import numpy as np
import pytest

from rawgrad.drivers.amd import queues
from rawgrad.drivers.amd.device import AMDDevice
from rawgrad.drivers.amd.emulated import EmulatedKernel
from rawgrad.drivers.amd.emulated_gpu import MemoryFault
from rawgrad.runtime.hcq import COMPUTE, COPY, HWQueue
from tests.drivers.collected import buffer_after_a_collected_cycle


def test_gtt_is_one_address_for_the_cpu_and_the_gpu(device: AMDDevice) -> None:
  host = device.host_memory(3000)
  assert host.host is not None and host.address % 4096 == 0
  host.host[:] = np.arange(3000) % 251
  seen_by_gpu = device.kernel.page_tables.resolve(host.address, 3000)
  assert np.array_equal(seen_by_gpu, np.arange(3000) % 251)
  seen_by_gpu[7] = 99                      # and a GPU write is what the CPU reads
  assert host.host[7] == 99


def test_vram_is_mapped_for_the_gpu_only(device: AMDDevice) -> None:
  memory = device.allocator.alloc(5 << 20)
  assert memory.host is None and memory.address % (2 << 20) == 0   # 2 MiB pieces are 2 MiB aligned
  allocation = memory.owner.allocation
  assert allocation.kind == "vram" and device.kernel.page_tables.find(memory.address, 5 << 20) is not None
  assert device.memory.gpuvm_base <= memory.address < device.memory.gpuvm_limit
  other = device.allocator.alloc(4096)
  assert other.address + 4096 <= memory.address or memory.address + (5 << 20) <= other.address


def test_freed_memory_leaves_the_gpu_page_tables_once_the_device_is_done(device: AMDDevice) -> None:
  memory = device.host_memory(4096)
  address = memory.address
  del memory
  device.synchronize()
  device.submit(HWQueue())        # past the submission that was being made when the memory was dropped
  device.synchronize()
  device.host_memory(64)          # allocating reclaims what the device is done with
  with pytest.raises(MemoryFault):
    device.kernel.page_tables.resolve(address, 8)


def test_an_empty_submission_is_seen_by_the_host_with_a_gpu_timestamp(device: AMDDevice) -> None:
  for engine in (COMPUTE, COPY):
    before = time.monotonic_ns()
    value = device.submit(HWQueue(), engine)
    device.synchronize(5.0)
    after = time.monotonic_ns()
    assert device.timeline_signal.value == value
    # the emulated GPU counter (100 MHz, far ahead of the host clock) converted back lies within the submission
    assert before - 5_000_000 <= device.timeline_signal.timestamp_ns <= after + 5_000_000


@pytest.mark.parametrize("engine", [COMPUTE, COPY])
def test_a_queue_waits_for_a_signal_the_host_sets(device: AMDDevice, engine: str) -> None:
  gate, done = device.new_signal(0, "gate"), device.new_signal(0, "done")
  device._submit(device.encode(HWQueue().wait(gate, 3).signal(done, 1), engine), engine)
  time.sleep(0.05)
  assert done.value == 0   # still waiting: 0 < 3
  gate.set(2)
  time.sleep(0.05)
  assert done.value == 0
  gate.set(3)
  done.wait(1, timeout_s=5.0)
  assert done.value == 1 and done.timestamp_ns > 0


def test_signals_written_by_one_queue_release_the_other(device: AMDDevice) -> None:
  signal = device.new_signal(0, "handoff")
  done = device.new_signal(0, "done")
  device._submit(device.encode(HWQueue().wait(signal, 1).signal(done, 7), COMPUTE), COMPUTE)
  device._submit(device.encode(HWQueue().signal(signal, 1), COPY), COPY)
  done.wait(7, timeout_s=5.0)


def test_signal_values_stay_below_2_to_the_32(device: AMDDevice) -> None:
  signal = device.new_signal(0, "wide")
  with pytest.raises(ValueError, match="value 4294967296 does not fit 32 bits"):
    device.encode(HWQueue().signal(signal, 1 << 32), COPY)
  with pytest.raises(ValueError, match="wait on wide: value 4294967296"):
    device.encode(HWQueue().wait(signal, 1 << 32), COMPUTE)


@pytest.mark.parametrize("nbytes", [1, 4093, (4 << 20) + 12])   # the last takes two linear-copy packets
def test_sdma_copies_round_trip(device: AMDDevice, nbytes: int) -> None:
  data = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
  vram = device.allocator.alloc(nbytes)
  device.copyin(vram, memoryview(data))
  copy = device.allocator.alloc(nbytes)
  device.submit(HWQueue().copy(copy.address, vram.address, nbytes), COPY)
  out = np.zeros(nbytes, np.uint8)
  device.copyout(memoryview(out), copy)
  assert np.array_equal(out, data)


def test_engines_refuse_commands_of_the_other(device: AMDDevice) -> None:
  with pytest.raises(ValueError, match="copies run on the copy engine"):
    device.encode(HWQueue().copy(0, 0, 8), COMPUTE)
  with pytest.raises(ValueError, match="kernels run on the compute engine"):
    device.encode(HWQueue().exec(object(), 0, (1, 1, 1), (1, 1, 1)), COPY)


@pytest.mark.parametrize("engine", [COMPUTE, COPY])
def test_timestamps_are_ordered_host_times(device: AMDDevice, engine: str) -> None:
  source, dest = device.host_memory(1 << 16), device.host_memory(1 << 16)
  source.host[:] = 5
  times = device.host_memory(16)
  before = time.monotonic_ns()
  queue = HWQueue().timestamp(times.address)
  if engine == COPY: queue.copy(dest.address, source.address, 1 << 16)
  device.synchronize_after(device.submit(queue.memory_barrier().timestamp(times.address + 8), engine))
  start, end = device.read_timestamps(times)
  assert before - 5_000_000 <= start <= end <= time.monotonic_ns() + 5_000_000


def test_a_wait_times_out_naming_the_signal_the_values_and_the_queues(device: AMDDevice) -> None:
  signal = device.new_signal(2, "never")
  started = time.monotonic()
  with pytest.raises(TimeoutError, match=r"timed out after 0.3s waiting for never at 0x[0-9a-f]+ to reach 5; it is 2; "
                                         r"compute queue: packet \d+ of \d+ read; copy queue: byte \d+ of \d+ read"):
    signal.wait(5, timeout_s=0.3)
  assert time.monotonic() - started < 2.0


def test_a_queue_stuck_on_a_wait_times_the_host_out_and_goes_on_when_released(fresh_device: AMDDevice) -> None:
  gate = fresh_device.new_signal(0, "gate")
  value = fresh_device.submit(HWQueue().wait(gate, 1))
  with pytest.raises(TimeoutError, match=f"AMD timeline at 0x[0-9a-f]+ to reach {value}; it is {value - 1}"):
    fresh_device.synchronize(0.3)
  gate.set(1)
  fresh_device.synchronize(5.0)


def test_rings_wrap_around(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setattr(queues, "AQL_RING_PACKETS", 16)
  monkeypatch.setattr(queues, "SDMA_RING_BYTES", 1024)
  small = AMDDevice("AMD", EmulatedKernel(arch="gfx1100"))
  try:
    assert small.compute_queue.entries == 16 and small.copy_queue.ring.nbytes == 4096   # GTT is whole pages
    source, dest = small.host_memory(256), small.host_memory(256)
    for round_ in range(60):
      source.host[:] = round_
      small.submit(HWQueue(), COMPUTE)
      small.synchronize_after(small.submit(HWQueue().copy(dest.address, source.address, 256), COPY))
      assert (dest.host == round_).all()
    assert small.compute_queue.write_index > 16 and small.copy_queue.write_pointer > 4096
  finally:
    small.close()


def test_a_buffer_collected_with_its_memory_in_a_cycle_does_not_hand_the_memory_out_again(amd: AMDDevice) -> None:
  """The collector runs the finalizer of the memory's owner (the driver starts freeing it) before the cycle's
  Buffer.__del__, which put the memory into the allocator's cache: the next buffer of that size got memory unmapped
  under it (a GPU memory fault in an optimizer's replayed steps, whenever a collection came at that moment)."""
  reused = buffer_after_a_collected_cycle("AMD", 12345)
  data = np.arange(12345, dtype=np.uint8)
  reused.copyin(memoryview(data))
  np.testing.assert_array_equal(reused.numpy(), data)
