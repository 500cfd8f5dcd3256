"""engine/jit.py: capturing launches and copies, refusing host reads inside a capture, and the CommandGraph that
replays them as prebuilt queues with patched argument blocks. (tests/test_tensor_jit.py tests the decorator.)"""
from typing import Callable

import numpy as np
import pytest

from rawgrad import Tensor
from rawgrad.compiler.rangeify import buffer_base
from rawgrad.dtype import dtypes
from rawgrad.engine.jit import (CapturedCopy, CapturedKernel, CommandGraph, JitError, capturing, refuse_host_read,
                                replan_temporaries, start_capture, stop_capture)
from rawgrad.helpers import GlobalCounters
from rawgrad.runtime.device import Buffer, buffer_for


def _captured(build: Callable[..., Tensor], *inputs: Tensor) -> tuple[list, Tensor]:
  capture = start_capture()
  try:
    assert capturing() is capture
    result = build(*inputs).realize()
  finally:
    stop_capture()
  assert capturing() is None
  return capture.items, result


def _buffer(tensor: Tensor) -> Buffer:
  return buffer_for(buffer_base(tensor.uop))


def test_a_capture_records_each_launch_with_its_buffers() -> None:
  x = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3)).realize()
  items, result = _captured(lambda t: (t * 2).sum(1) + 1, x)
  assert items and all(isinstance(item, CapturedKernel) for item in items)
  assert items[-1].buffers[0] is _buffer(result) and any(_buffer(x) in item.buffers for item in items)
  np.testing.assert_array_equal(result.numpy(), [7, 25])


def test_host_reads_are_refused_only_while_capturing() -> None:
  refuse_host_read("reading")
  start_capture()
  try:
    with pytest.raises(JitError, match="item\\(\\) inside a jit-captured function: replay would skip"):
      refuse_host_read("item()")
  finally:
    stop_capture()


def test_the_graph_replays_with_a_swapped_input() -> None:
  x = Tensor(np.arange(4, dtype=np.float32)).realize()
  items, result = _captured(lambda t: t * t + 1, x)
  graph = CommandGraph(items)
  other = Tensor(np.full(4, 3, np.float32)).realize()
  for index, item in enumerate(items):
    for position, buffer in enumerate(item.buffers):
      if buffer is _buffer(x): graph.patch_buffer(index, position, _buffer(other))
  kernels = GlobalCounters.kernel_count
  graph.run()
  graph.wait_for_last_run()
  assert GlobalCounters.kernel_count == kernels + len(items)
  np.testing.assert_array_equal(_buffer(result).numpy(), np.full(4, 10, np.float32))


def test_segments_split_by_device_and_engine() -> None:
  x = Tensor(np.arange(8, dtype=np.float32), device="CPU").realize()
  items, result = _captured(lambda t: (t + 1).to("SIM") * 2, x)
  graph = CommandGraph(items)
  engines = [(segment.device, segment.engine) for segment in graph.segments]
  assert ("SIM", "host") in engines and engines[0] == ("CPU", "compute") and engines[-1] == ("SIM", "compute")
  copies = [item for item in items if isinstance(item, CapturedCopy)]
  assert len(copies) == 1 and copies[0].dest.device == "SIM" and copies[0].src.device == "CPU"
  x_again = np.full(8, 5, np.float32)
  _buffer(x).copyin(memoryview(x_again.view(np.uint8)))
  graph.run()
  np.testing.assert_array_equal(result.numpy(), (x_again + 1) * 2)


def test_a_copy_item_swaps_its_buffers() -> None:
  a, b, c = (Buffer("CPU", 4, dtypes.float32) for _ in range(3))
  copy = CapturedCopy(a, b)
  assert copy.buffers == [a, b]
  copy.buffers = [c, b]
  assert copy.dest is c and copy.src is b


def test_replanning_leaves_a_capture_without_temporaries_alone() -> None:
  x = Tensor(np.ones(4, np.float32)).realize()
  items, _ = _captured(lambda t: t + 1, x)
  assert replan_temporaries(items, set()) is items
