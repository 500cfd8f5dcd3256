"""NVDevice on the emulated H100: memory at one address for the CPU and the GPU, submissions, signals with GPU
timestamps, waits across the two channels, copy-engine copies, and waits that time out naming what they waited for."""
import os
import time

import numpy as np
import pytest

from rawgrad.drivers import os as seam
from rawgrad.drivers.nv.device import NVDevice
from rawgrad.drivers.nv.emulated import EmulatedKernel
from rawgrad.drivers.nv.rm import RMError
from rawgrad.dtype import dtypes
from rawgrad.runtime.device import Buffer
from rawgrad.runtime.hcq import COMPUTE, COPY, HWQueue
from tests.drivers.collected import buffer_after_a_collected_cycle


def test_the_seam_alone_switches_the_driver_to_the_emulation() -> None:
  kernel = EmulatedKernel()
  with seam.installed("nv", kernel):
    device = NVDevice("NV")
  try:
    assert device.kernel is kernel and device.target.arch == "sm_90"
    assert device.compiler.embed_program and device.renderer.embed_program
  finally:
    device.close()


def test_allocations_live_below_2_to_the_40_at_one_address(device: NVDevice) -> None:
  host = device.host_memory(3000)
  video = device.allocator.alloc(5 << 20)
  for memory in (host, video): assert 0 < memory.address and memory.address + memory.nbytes < 1 << 40
  assert host.address % 256 == 0 and video.address % 256 == 0 and video.host is None
  host.host[:] = 7
  found = device.kernel.channels[device.channels[COMPUTE].token].memory(host.address, 3000)   # the GPU's view
  assert (found == 7).all()


def test_an_empty_submission_is_seen_by_the_host_with_a_gpu_timestamp(device: NVDevice) -> None:
  for engine in (COMPUTE, COPY):
    before = time.monotonic_ns()
    value = device.submit(HWQueue(), engine)
    device.synchronize(5.0)
    after = time.monotonic_ns()
    assert device.timeline_signal.value == value
    # the GPU clock (2^40 ns ahead in the emulation) converted back to host time lies within the submission
    assert before - 5_000_000 <= device.timeline_signal.timestamp_ns <= after + 5_000_000


def test_a_copy_channel_waits_for_a_signal_the_host_sets(device: NVDevice) -> None:
  gate, done = device.new_signal(0, "gate"), device.new_signal(0, "done")
  device._submit(device.encode(HWQueue().wait(gate, 3).signal(done, 1), COPY), COPY)
  time.sleep(0.05)
  assert done.value == 0   # still waiting: 0 < 3
  gate.set(2)
  time.sleep(0.05)
  assert done.value == 0
  gate.set(3)
  done.wait(1, timeout_s=5.0)
  assert done.value == 1


def test_copies_on_the_copy_engine_round_trip(device: NVDevice) -> None:
  for nbytes in (1, 4093, 3 << 20):
    data = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    video = device.allocator.alloc(nbytes)
    device.copyin(video, memoryview(data))
    copy = device.allocator.alloc(nbytes)
    device.submit(HWQueue().copy(copy.address, video.address, nbytes), COPY)
    out = np.zeros(nbytes, np.uint8)
    device.copyout(memoryview(out), copy)
    assert np.array_equal(out, data)


def test_timestamps_around_a_copy_are_ordered_host_times(device: NVDevice) -> None:
  source, dest = device.host_memory(1 << 20), device.host_memory(1 << 20)
  source.host[:] = 5
  times = device.host_memory(2 * device.timestamp_bytes)
  before = time.monotonic_ns()
  queue = HWQueue().timestamp(times.address).copy(dest.address, source.address, 1 << 20)
  device.synchronize_after(device.submit(queue.timestamp(times.address + device.timestamp_bytes), COPY))
  start, end = device.read_timestamps(times)
  assert before - 5_000_000 <= start <= end <= time.monotonic_ns() + 5_000_000
  assert (dest.host == 5).all()
  with pytest.raises(ValueError, match="16 bytes and aligned"):
    device.encode(HWQueue().timestamp(times.address + 8), COPY)


def test_a_wait_that_never_ends_times_out_naming_the_signal_and_the_channels(fresh_device: NVDevice) -> None:
  never = fresh_device.new_signal(0, "never set")
  value = fresh_device.submit(HWQueue().wait(never, 1), COMPUTE)
  start = time.perf_counter()
  with pytest.raises(TimeoutError) as waited:
    fresh_device.synchronize(0.3)
  message = str(waited.value)
  assert time.perf_counter() - start < 2.0
  assert "NV timeline" in message and f"reach {value}; it is {value - 1}" in message
  assert "compute channel: GPGet" in message and "1 submission(s) not finished" in message
  never.set(1)   # let it finish, so the device closes cleanly
  fresh_device.synchronize(5.0)


def test_commands_go_to_the_engine_that_runs_them(device: NVDevice) -> None:
  with pytest.raises(ValueError, match="copies run on the copy engine"):
    device.encode(HWQueue().copy(0, 0, 16), COMPUTE)
  with pytest.raises(ValueError, match="kernels run on the compute engine"):
    device.encode(HWQueue().exec(object(), 0), COPY)
  with pytest.raises(ValueError, match="16-byte alignment"):
    device.encode(HWQueue().signal(type("Odd", (), {"address": 0x1008})(), 1), COMPUTE)


def test_freed_host_memory_is_reused_only_after_the_gpu_is_done(device: NVDevice) -> None:
  heap = device.host_heap

  def free(address: int) -> bool:
    with heap.lock: heap.reclaim()
    return any(slab + offset <= address < slab + offset + size
               for slab, pieces in heap.free_pieces.items() for offset, size in pieces)

  device.synchronize()
  piece = device.host_memory(512)
  address = piece.address
  device.submit(HWQueue(), COPY)   # not waited for: work submitted before the free may still use the piece
  del piece
  assert not free(address)
  device.submit(HWQueue(), COPY)   # the one after the free, too: it may have been in the making when it was freed
  device.synchronize()
  assert free(address)


def test_a_failed_bring_up_gives_back_what_it_opened() -> None:
  class Unschedulable(EmulatedKernel):
    def _control_schedule(self, target, params) -> None:  # noqa: ANN001 - the emulation's control signature
      from rawgrad.autogen.nv import nv_rm as rm
      from rawgrad.drivers.nv.emulated import RMStatus
      raise RMStatus(rm.NV_ERR_INVALID_STATE, "refused for the test")

  kernel = Unschedulable()
  with pytest.raises(RMError, match=r"NVA06C_CTRL_CMD_GPFIFO_SCHEDULE .*NV_ERR_INVALID_STATE"):
    NVDevice("NV", kernel)
  assert kernel.files == {} and kernel.clients == {} and kernel.channels == {}


@pytest.mark.skipif(os.path.exists("/sys/module/nvidia/version"), reason="an NVIDIA driver is loaded here")
def test_without_a_driver_the_real_kernel_says_so() -> None:
  with pytest.raises(RMError, match="no NVIDIA kernel driver is loaded"):
    NVDevice("NV", seam.RealKernel())


def test_optional_controls_rm_refuses_have_fallbacks() -> None:
  """GSP may refuse controls the driver only wants: the SM order (then the chip's design numbers) and the GPU clock
  (then it is read off a semaphore's timestamp)."""
  from rawgrad.autogen.nv import nv_rm as rm
  from rawgrad.drivers.nv.emulated import RMStatus

  class Reticent(EmulatedKernel):
    def _control_sm_order(self, target, params) -> None:  # noqa: ANN001 - the emulation's control signature
      raise RMStatus(rm.NV_ERR_NOT_SUPPORTED)

    def _control_time(self, target, params) -> None:  # noqa: ANN001
      raise RMStatus(rm.NV_ERR_NOT_SUPPORTED)

  device = NVDevice("NV", Reticent())
  try:
    assert (device.info.sm_count, device.info.tpc_count) == (144, 72)   # 8 GPCs x 9 TPCs x 2 SMs
    assert abs(device.clock_offset_ns + (1 << 40)) < 50_000_000
    before = time.monotonic_ns()
    device.synchronize_after(device.submit(HWQueue(), COPY))
    assert before - 5_000_000 <= device.timeline_signal.timestamp_ns <= time.monotonic_ns() + 5_000_000
  finally:
    device.close()


def test_a_buffer_collected_with_its_memory_in_a_cycle_does_not_share_it_with_a_new_one(nv: NVDevice) -> None:
  """The collector runs the finalizer of the memory's piece (back to the heap once the device is done) before the
  cycle's Buffer.__del__, which put the memory into the allocator's cache too: the next buffer of that size and a
  new piece from the heap then shared bytes."""
  reused = buffer_after_a_collected_cycle("NV", 12345)
  others = [Buffer("NV", 12346, dtypes.uint8).ensure_allocated() for _ in range(8)]   # first fit: the lowest piece
  for other in others:
    assert other.address + other.nbytes <= reused.address or reused.address + reused.nbytes <= other.address
