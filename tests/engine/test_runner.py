"""engine/runner.py: a lowered kernel built into a runner (render, compile, load), its argument words, launch sizes
and costs, and copies between buffers on one device and across devices."""
import numpy as np
import pytest

from rawgrad import Tensor, Variable
from rawgrad.compiler.codegen.lower import lower_kernel
from rawgrad.compiler.codegen.opt.kernel import Opt, OptOps
from rawgrad.dtype import dtypes
from rawgrad.engine.runner import COSTS_PER_RUNNER, CompiledRunner, build_runner, copy_buffer
from rawgrad.runtime.device import Buffer, Device, buffer_for
from tests.compiler.codegen.kernels import last_kernel

pytestmark = pytest.mark.usefixtures("default_cpu")  # CPU runners over default-device tensors


def _runner(tensor: Tensor, opts: list[Opt] | None = None) -> tuple[CompiledRunner, list[Buffer], dict]:
  item = last_kernel(tensor)
  runner = build_runner("CPU", item.ast, lower_kernel(item.ast, opts or []))
  return runner, [buffer_for(node).ensure_allocated() for node in item.buffers], dict(item.var_values)


def test_a_runner_launches_its_kernel() -> None:
  x = np.arange(10, dtype=np.float32)
  runner, buffers, var_values = _runner(Tensor(x) * 2 + 1)
  assert runner.device == "CPU" and runner.name in runner.source and runner.cores == 1
  runner(buffers, var_values)
  np.testing.assert_array_equal(buffers[0].numpy(), x * 2 + 1)
  start, end = runner(buffers, var_values, timed=True)
  assert start <= end


def test_argument_words_are_the_used_buffers_then_the_variables() -> None:
  n = Variable("n", 1, 8)
  x = Tensor(np.arange(8, dtype=np.float32)).realize()
  runner, buffers, var_values = _runner(x.shrink(((0, n.bind(5)),)).sum())
  (variable,) = runner.variables
  assert runner.args(buffers, var_values) == [buffers[i].address for i in runner.buffer_slots] + [5]
  runner(buffers, var_values)
  assert buffers[0].numpy()[0] == sum(range(5))
  runner(buffers, {variable: 8})
  assert buffers[0].numpy()[0] == sum(range(8))


def test_a_parallel_cpu_kernel_launches_its_slices() -> None:
  runner, buffers, var_values = _runner(Tensor(np.ones((64, 16), np.float32)) + 1, [Opt(OptOps.PARALLEL, 0)])
  assert runner.launch_dims(var_values) == ((runner.cores, 1, 1), (1, 1, 1))
  assert runner.cores == runner.lowered.slices(Device["CPU"].cores) > 1
  runner(buffers, var_values)
  assert (buffers[0].numpy() == 2).all()


def test_costs_are_remembered_per_variable_values_within_a_limit() -> None:
  n = Variable("n", 1, 2 * COSTS_PER_RUNNER)
  x = Tensor(np.zeros(2 * COSTS_PER_RUNNER, np.float32)).realize()
  runner, _, _ = _runner(x.shrink(((0, n.bind(3)),)).sum())
  (variable,) = runner.variables
  assert runner.cost({variable: 3}).flops == 3 and runner.cost({variable: 3}) is runner.cost({variable: 3})
  for value in range(1, COSTS_PER_RUNNER + 10): runner.cost({variable: value})
  assert len(runner.costs) == COSTS_PER_RUNNER and runner.cost({variable: 700}).flops == 700


def test_copies_within_a_device_and_across_devices() -> None:
  data = np.arange(16, dtype=np.int32)
  source = Buffer("CPU", 16, dtypes.int32)
  source.copyin(memoryview(data.view(np.uint8)))
  for device in ("CPU", "SIM"):
    dest = Buffer(device, 16, dtypes.int32)
    copy_buffer(dest, source)
    np.testing.assert_array_equal(dest.numpy(), data)
  back = Buffer("CPU", 16, dtypes.int32)
  copy_buffer(back, dest)
  np.testing.assert_array_equal(back.numpy(), data)
  with pytest.raises(ValueError, match="copy of a 64-byte buffer into a 32-byte one"):
    copy_buffer(Buffer("CPU", 8, dtypes.int32), source)
