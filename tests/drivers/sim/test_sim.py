"""SIM, the pure-Python test device: memory the host cannot map, two engines decoding command words, faults that
raise instead of hanging, and tensors moving between it and the CPU."""
import numpy as np
import pytest

from rawgrad import Tensor, jit
from rawgrad.drivers.sim import ARENA_BASE, EXEC, SimDevice
from rawgrad.drivers.sim import WAIT as sim_wait
from rawgrad.runtime import hcq
from rawgrad.runtime.device import Buffer, Device
from rawgrad.runtime.hcq import COMPUTE, COPY, DeviceFault, HWQueue


@pytest.fixture(scope="module")
def sim() -> SimDevice:
  return Device["SIM"]


def test_device_memory_is_not_host_mapped_and_copies_round_trip(sim: SimDevice) -> None:
  buffer = Buffer("SIM", 1000, __import__("rawgrad").dtypes.int32).ensure_allocated()
  assert buffer.raw.host is None and buffer.address >= ARENA_BASE
  values = np.arange(1000, dtype=np.int32) * 7 - 3
  buffer.copyin(memoryview(values.view(np.uint8)))
  np.testing.assert_array_equal(buffer.numpy(), values)


def test_large_copies_go_through_the_staging_ring_in_chunks(sim: SimDevice, monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setattr(hcq, "STAGING_BYTES", 4096)
  fresh = SimDevice("SIM:test")  # its staging ring is made with the smaller size
  memory = fresh.allocator.alloc(40000)
  data = np.random.default_rng(0).integers(0, 255, 40000, dtype=np.uint8)
  fresh.copyin(memory, memoryview(data))
  out = np.empty_like(data)
  fresh.copyout(memoryview(out), memory)
  np.testing.assert_array_equal(out, data)


def test_engines_are_ordered_by_the_timeline(sim: SimDevice, monkeypatch: pytest.MonkeyPatch) -> None:
  """A submission on the copy engine after one on the compute engine first waits for it (and back); one on the same
  engine does not (the engine runs its queue in order)."""
  submitted: list[tuple[list[int], str]] = []
  real_submit = sim._submit
  monkeypatch.setattr(sim, "_submit", lambda words, engine: (submitted.append((words.tolist(), engine)),
                                                              real_submit(words, engine)))
  sim.synchronize()
  start, timeline = sim.timeline_value, sim.timeline_signal.address
  for engine in (COMPUTE, COMPUTE, COPY, COMPUTE): sim.submit(HWQueue(), engine)
  sim.synchronize()
  assert sim.timeline_signal.value == start + 4
  starts = [words[:3] for words, _ in submitted]
  assert starts[2] == [sim_wait, timeline, start + 2] and starts[3] == [sim_wait, timeline, start + 3]
  assert starts[1][0] != sim_wait   # compute after compute
  assert [engine for _, engine in submitted] == [COMPUTE, COMPUTE, COPY, COMPUTE]


def test_a_bad_program_address_faults_and_raises(sim: SimDevice) -> None:
  class Nowhere:
    address = ARENA_BASE + (1 << 40)
  block = sim.kernargs.alloc(8)
  sim.submit(HWQueue().exec(Nowhere(), block.address))
  with pytest.raises(DeviceFault, match="SIM compute engine: EXEC at word .*not mapped on SIM"):
    sim.synchronize(timeout_s=5)
  sim.timeline_signal.set(sim.timeline_value)  # the faulted buffer never signalled: move on


def test_an_unknown_opcode_faults(sim: SimDevice) -> None:
  sim._submit(np.array([99, 1, 2], np.uint64), COMPUTE)
  with pytest.raises(DeviceFault, match="unknown opcode 99"):
    for _ in range(1000):
      sim.check_faults()
      __import__("time").sleep(0.002)


def test_waits_time_out_naming_the_signal_and_values(sim: SimDevice) -> None:
  signal = sim.new_signal(3, "never set")
  with pytest.raises(TimeoutError, match=r"never set at 0x[0-9a-f]+ to reach 5; it is 3"):
    signal.wait(5, timeout_s=0.05)


def test_exec_encoding_is_opcode_program_args_and_sizes(sim: SimDevice) -> None:
  class Program:
    address = 0x1234
  words = sim.encode(HWQueue().exec(Program(), 0x40, (2, 3, 4), (5, 6, 7)), COMPUTE)
  assert [int(w) for w in words] == [EXEC, 0x1234, 0x40, 2, 3, 4, 5, 6, 7]


def test_tensors_move_between_cpu_and_sim_both_ways_and_in_a_jit() -> None:
  a = np.random.default_rng(1).standard_normal((6, 5)).astype(np.float32)
  on_sim = Tensor(a).to("SIM")
  assert on_sim.device == "SIM"
  back = (on_sim.permute(1, 0) * 2).to("CPU")
  assert back.device == "CPU"
  np.testing.assert_allclose(back.numpy(), a.T * 2, rtol=1e-6)

  @jit
  def there_and_back(x: Tensor) -> Tensor:
    return (x.to("SIM").exp().sum(0)).to("CPU")
  for seed in range(4):
    x = np.random.default_rng(seed).standard_normal((6, 5)).astype(np.float32)
    np.testing.assert_allclose(there_and_back(Tensor(x)).numpy(), np.exp(x).sum(0), rtol=1e-5)


def test_gradients_come_back_through_a_copy() -> None:
  a = np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32)
  x = Tensor(a, requires_grad=True)
  (x.to("SIM") ** 2).sum().backward()
  assert x.grad.device == "CPU"
  np.testing.assert_allclose(x.grad.numpy(), 2 * a, rtol=1e-6)
