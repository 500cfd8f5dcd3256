"""Kernels whose arguments exceed their target's kernel-argument limit read them from an argument table in device
memory: one launch for any number of buffers. Runs on the default device (the Makefile runs it on each GPU path)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import rawgrad.engine.realize as realize
from rawgrad import GlobalCounters, Tensor, Variable, jit
from rawgrad.compiler.codegen.linearize import argument_block_words, argument_table
from rawgrad.compiler.codegen.lower import lower_kernel
from rawgrad.compiler.ir import UOp
from rawgrad.compiler.rangeify import create_schedule
from rawgrad.compiler.target import Target
from rawgrad.engine.jit import CapturedKernel, start_capture, stop_capture
from rawgrad.helpers import LRUCache
from rawgrad.runtime.device import Device

rng = np.random.default_rng(16)


def _target() -> Target:
  return Device[Device.DEFAULT].target


def _words_of(kernel: CapturedKernel) -> int:
  return len(kernel.runner.buffer_slots) + len(kernel.runner.variables)


def _check(outputs: list[Tensor], expected: list[np.ndarray]) -> None:
  assert len(outputs) == len(expected)
  for output, values in zip(outputs, expected): np.testing.assert_allclose(output.numpy(), values, rtol=1e-6)


def _launched(*tensors: Tensor) -> list[CapturedKernel]:
  """Realize the tensors together; the kernels that ran."""
  capture = start_capture()
  try:
    Tensor.realize(*tensors)
  finally:
    stop_capture()
  return capture.kernels


def _scaled(count: int, size: int = 6) -> tuple[list[np.ndarray], list[float]]:
  """Inputs and scales for outputs x * scale: each output takes three argument words (its buffer's address, its
  input's, and its scale: a parameterized constant)."""
  return [rng.standard_normal(size).astype(np.float32) for _ in range(count)], [i + 0.5 for i in range(count)]


@pytest.fixture
def two_words(monkeypatch: pytest.MonkeyPatch) -> None:
  """The default device's target passes two argument words at most; no runner built for the real limit is reused."""
  device = Device[Device.DEFAULT]
  monkeypatch.setattr(device, "target", dataclasses.replace(device.target, kernarg_bytes=16))
  monkeypatch.setattr(realize, "_runners", LRUCache(realize.RUNNER_CACHE_SIZE))


# *** codegen decides from the target ***

def test_a_program_past_the_limit_takes_the_table_alone() -> None:
  tensors = [Tensor(x) * scale for x, scale in zip(*_scaled(4))]
  (item,) = create_schedule([t.uop for t in tensors]).items

  def program_with_room_for(words: int) -> list[UOp]:
    return lower_kernel(item.ast, [], dataclasses.replace(_target(), kernarg_bytes=8 * words)).program

  # four outputs, four inputs and four scales: twelve words
  assert argument_table(program_with_room_for(12)) is None
  program = program_with_room_for(11)
  table = argument_table(program)
  assert table is not None and table.dtype.size == 12 and argument_block_words(program) == 1


# *** more buffers than the target's real limit ***

def test_more_arguments_than_the_target_takes_run_as_one_launch() -> None:
  limit = _target().kernarg_bytes // 8
  inputs, scales = _scaled(limit // 2 + 1)
  outputs = [Tensor(x) * scale for x, scale in zip(inputs, scales)]
  GlobalCounters.reset()
  (kernel,) = _launched(*outputs)
  assert GlobalCounters.kernel_count == 1
  assert kernel.runner.has_table and _words_of(kernel) > limit and kernel.outputs == len(inputs)
  _check(outputs, [x * scale for x, scale in zip(inputs, scales)])


def test_jit_writes_the_table_once_and_again_only_when_a_buffer_changes() -> None:
  inputs, scales = _scaled(_target().kernarg_bytes // 16 + 1)

  @jit
  def scale_all(*xs: Tensor) -> list[Tensor]:
    return [x * scale + 1 for x, scale in zip(xs, scales)]

  for _ in range(3):
    inputs = [x + 1 for x in inputs]
    _check(scale_all(*[Tensor(x) for x in inputs]), [x * scale + 1 for x, scale in zip(inputs, scales)])
  (kernel,) = scale_all.kernels
  (table,) = scale_all.graph.tables.values()
  assert kernel.runner.has_table and _words_of(kernel) > _target().kernarg_bytes // 8
  same = [Tensor(x).realize() for x in inputs]
  scale_all(*same)
  written = table.written
  outputs = scale_all(*same)
  assert table.written is written  # replayed on the same buffers: nothing copied
  _check(outputs, [x * scale + 1 for x, scale in zip(inputs, scales)])
  outputs = scale_all(*[Tensor(-x) for x in inputs])
  assert table.written is not written
  _check(outputs, [1 - x * scale for x, scale in zip(inputs, scales)])


# *** a lowered limit sends ordinary kernels through the table ***

def test_kernels_of_every_kind_read_the_table(two_words: None) -> None:
  a = rng.standard_normal((5, 7)).astype(np.float32)
  b = rng.standard_normal((7, 3)).astype(np.float32)
  sums, product, shifted = Tensor(a).sum(1), Tensor(a) @ Tensor(b), Tensor(a) * 1.5 - Tensor(a).exp()
  kernels = _launched(sums, product, shifted)
  assert kernels and all(kernel.runner.has_table for kernel in kernels if _words_of(kernel) > 2)
  assert any(kernel.runner.has_table for kernel in kernels)
  np.testing.assert_allclose(sums.numpy(), a.sum(1), rtol=1e-5)
  np.testing.assert_allclose(product.numpy(), a @ b, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(shifted.numpy(), a * 1.5 - np.exp(a), rtol=1e-5)


def test_eager_launches_rewrite_the_table_for_new_buffers_and_values(two_words: None) -> None:
  x = rng.standard_normal(9).astype(np.float32)
  for scale in (2.5, 3.5, 2.5):
    (kernel,) = _launched(out := Tensor(x + scale) * scale)
    assert kernel.runner.has_table
    np.testing.assert_allclose(out.numpy(), (x + scale) * scale, rtol=1e-6)


def test_jit_rebinds_a_variable_in_the_table(two_words: None) -> None:
  n = Variable("n", 1, 10)

  @jit
  def prefix_sum(x: Tensor, count: object) -> Tensor:
    return x.shrink(((0, count),)).sum()

  x = Tensor(np.arange(10, dtype=np.float32)).realize()
  for value in (3, 4, 5, 6, 2, 10):
    assert prefix_sum(x, n.bind(value)).item() == sum(range(value))
  (kernel,) = prefix_sum.kernels
  assert kernel.runner.has_table and len(prefix_sum.graph.tables) == 1
