"""drivers/cpu/device.py: the CPU behind the HCQ interface: aligned host memory, signals with addresses, queues
encoded as native command buffers, kernels launched (and timed) through the argument ring."""
import time

import numpy as np
import pytest

from rawgrad import Tensor
from rawgrad.compiler.codegen.linearize import kernel_parameters
from rawgrad.compiler.codegen.lower import lower_kernel
from rawgrad.compiler.render.llvmir import kernel_symbol
from rawgrad.drivers.cpu.device import ALIGNMENT, CPUDevice, host_allocation
from rawgrad.engine.runner import variable_slot
from rawgrad.runtime.device import Device, buffer_for
from rawgrad.runtime.hcq import COMPUTE, COPY, Command, HWQueue
from tests.compiler.codegen.kernels import last_kernel


@pytest.fixture(scope="module")
def cpu() -> CPUDevice:
  return Device["CPU"]


def test_host_allocations_are_aligned_and_writable() -> None:
  for nbytes in (1, 63, 4096):
    memory = host_allocation(nbytes)
    assert memory.address % ALIGNMENT == 0 and memory.nbytes == nbytes and memory.host.size == nbytes
    memory.host[:] = 7
    assert memory.host.ctypes.data == memory.address and memory.host.sum() == 7 * nbytes


def test_the_allocator_hands_out_host_memory(cpu: CPUDevice) -> None:
  memory = cpu.allocator.alloc(100)
  assert memory.address % ALIGNMENT == 0 and memory.host is not None
  cpu.allocator.free(memory, 100)


def test_signals_live_at_aligned_addresses(cpu: CPUDevice) -> None:
  signal = cpu.new_signal(5, "test signal")
  assert signal.value == 5 and signal.address % ALIGNMENT == 0
  cpu.set_signal(signal, 9)
  assert signal.value == 9
  signal.wait(9, timeout_s=1)  # reached: returns at once
  with pytest.raises(TimeoutError, match="test signal at 0x[0-9a-f]+ is 9, waited for 10"):
    signal.wait(10, timeout_s=0.05)


def test_both_engines_feed_one_processor(cpu: CPUDevice) -> None:
  assert cpu.shared_engines and not cpu._must_wait(COPY) and not cpu._must_wait(COMPUTE) and cpu.cores >= 1


def test_the_queue_encodes_every_command_and_refuses_others(cpu: CPUDevice) -> None:
  source, dest = cpu.host_memory(64), cpu.host_memory(64)
  source.host[:] = np.arange(64, dtype=np.uint8)
  signal = cpu.new_signal(0, "copied")
  cpu.submit(HWQueue().memory_barrier().copy(dest.address, source.address, 64).signal(signal, 1), COPY)
  signal.wait(1, timeout_s=10)
  assert np.array_equal(dest.host, source.host)
  with pytest.raises(ValueError, match="the CPU queue has no command 'teleport'"):
    cpu.encode(HWQueue([Command("teleport", ())]), COMPUTE)


def test_a_kernel_launched_through_the_argument_ring(cpu: CPUDevice) -> None:
  x = np.arange(12, dtype=np.float32)
  item = last_kernel(Tensor(x) * 3 - 1)
  lowered = lower_kernel(item.ast, [])
  kernel = cpu.program_class(cpu, kernel_symbol(item.ast.arg),
                             cpu.compiler.compile(cpu.renderer.render(item.ast.arg, lowered.program)))
  buffers = [buffer_for(node).ensure_allocated() for node in item.buffers]
  # the constants 3 and -1: 3 is a parameter (its value travels in the argument block), -1 stays in the code
  _, variables = kernel_parameters(lowered.program)
  args = [b.address for b in buffers] + [variable_slot(v, dict(item.var_values)[v]) for v in variables]
  assert [v.arg[0] for v in variables] == ["_c0"]
  assert cpu.launch(kernel, args, (1, 1, 1), (1, 1, 1)) is None
  cpu.synchronize()
  np.testing.assert_array_equal(buffers[0].numpy(), x * 3 - 1)
  buffers[0].copyin(memoryview(np.zeros(12, np.float32).view(np.uint8)))
  before = time.monotonic_ns()
  start, end = cpu.launch(kernel, args, (1, 1, 1), (1, 1, 1), timed=True)  # waits: the times are the EXEC's
  assert before <= start <= end <= time.monotonic_ns()
  np.testing.assert_array_equal(buffers[0].numpy(), x * 3 - 1)
  assert cpu.timeline_signal.value == cpu.timeline_value  # the launch's own SIGNAL ended it


def test_the_state_names_the_runtime(cpu: CPUDevice) -> None:
  _ = cpu.runtime
  assert cpu.describe_state().startswith("; NativeRuntime(threads=")
  cpu.check_faults()  # nothing went wrong
