"""Long runs stay bounded (issue 18): an eager training loop frees each step's graph and buffers with one garbage
collection, and a runner the runner cache evicts takes its loaded program with it."""
from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import rawgrad.engine.realize as realize
from rawgrad import GlobalCounters, Tensor, nn
from rawgrad.compiler.ir import UOp
from rawgrad.helpers import LRUCache
from rawgrad.nn.optim import Adam

UOP_SLACK = 50  # nodes a step may leave behind in caches that stop growing (a constant, not a number per step)


class TinyCNN(nn.Module):
  def __init__(self) -> None:
    self.layers = [nn.Conv2d(1, 4, 3), Tensor.relu, nn.BatchNorm(4), lambda x: x.dropout(0.25),
                   lambda x: x.flatten(1), nn.Linear(4 * 6 * 6, 10)]

  def forward(self, x: Tensor) -> Tensor:
    for layer in self.layers: x = layer(x)
    return x


def live_uops() -> int:
  gc.collect()
  return sum(type(o) is UOp for o in gc.get_objects())


def test_an_eager_training_loop_keeps_no_graph_or_buffer_of_earlier_steps() -> None:
  Tensor.manual_seed(0)
  model = TinyCNN()
  optimizer = Adam(model.parameters(), lr=1e-3)
  rng = np.random.default_rng(0)
  images, labels = rng.random((4, 1, 8, 8), dtype=np.float32), rng.integers(0, 10, 4).astype(np.int32)
  losses = []

  def step(index: int) -> None:
    optimizer.set_lr(1e-3 / (1 + index))  # a new lr each step, as a schedule would
    optimizer.zero_grad()
    loss = model(Tensor(images)).sparse_categorical_crossentropy(Tensor(labels))
    loss.backward()
    losses.append(loss.realize(*optimizer.schedule_step()).item())

  for index in range(5): step(index)
  uops, mem_used = live_uops(), GlobalCounters.mem_used
  for index in range(5, 35): step(index)
  grown_uops, grown_bytes = live_uops() - uops, GlobalCounters.mem_used - mem_used
  assert grown_uops <= UOP_SLACK, f"{grown_uops} more live UOps after 30 steps"
  assert grown_bytes <= 0, f"{grown_bytes} more bytes of buffers after 30 steps"
  assert np.isfinite(losses).all() and losses[-1] < losses[0]


def _chain_gradient(w: np.ndarray, layers: int) -> np.ndarray:
  """d sum(relu(...relu(ones @ w)... @ w)) / dw, by hand."""
  inputs, hidden = [], np.ones((4, 8), np.float32)
  for _ in range(layers):
    inputs.append(hidden)
    hidden = np.maximum(hidden @ w, 0)
  flowing, gradient = np.ones_like(hidden), np.zeros_like(w)
  for layer_input in reversed(inputs):
    flowing = flowing * (layer_input @ w > 0)
    gradient += layer_input.T @ flowing
    flowing = flowing @ w.T
  return gradient


def test_a_realized_intermediate_keeps_no_graph_of_earlier_steps() -> None:
  # realized tensors that need a gradient remember the graph they came from, which reaches earlier results
  w = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
  weight = Tensor(w, requires_grad=True)
  expected = _chain_gradient(w, layers=4)

  def step() -> None:
    hidden = Tensor(np.ones((4, 8), np.float32))
    for _ in range(4): hidden = (hidden @ weight).relu().realize()
    loss = hidden.sum()
    loss.item()
    loss.backward()
    np.testing.assert_allclose(weight.grad.numpy(), expected, rtol=1e-5)
    weight.grad = None

  for _ in range(3): step()
  uops, mem_used = live_uops(), GlobalCounters.mem_used
  for _ in range(10): step()
  assert (grown := live_uops() - uops) <= UOP_SLACK, f"{grown} more live UOps after 10 steps"
  assert (grown := GlobalCounters.mem_used - mem_used) <= 0, f"{grown} more bytes of buffers after 10 steps"


def test_a_runner_evicted_from_the_cache_frees_its_program(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setattr(realize, "_runners", LRUCache(1))
  x = np.arange(16, dtype=np.float32)
  np.testing.assert_array_equal((Tensor(x) * 3 + 1).numpy(), x * 3 + 1)
  (runner,) = realize._runners.entries.values()
  program = weakref.ref(runner.kernel)
  del runner
  np.testing.assert_array_equal((Tensor(x) - 7).exp2().numpy(), np.exp2(x - 7))  # another kernel: the first goes
  gc.collect()
  assert program() is None


@pytest.mark.parametrize("changing_constant", [False, True])
def test_tensors_made_from_data_in_a_loop_reuse_memory_without_a_garbage_collection(changing_constant: bool) -> None:
  """Each step uploads new data and computes the same on it: once the first steps are done, every buffer comes from
  the allocator's cache (no fresh memory, whose pages fault in as the upload writes them), with no gc.collect()
  between steps. The graphs' toposorts used to be kept on their roots, a cycle that held each step's buffers until a
  collection. With a Python constant that changes every step, every step is scheduled anew (the constant is part of
  the graph's shape): the scheduler's walks used to leave such cycles too (a 16 MB input: 18 of 30 steps' buffers
  fresh, 659 MB at the peak; now none, 226 MB)."""
  from rawgrad.runtime.device import Device
  allocator = Device["CPU"].allocator
  fresh = []
  original = type(allocator)._alloc
  data = np.arange(1 << 16, dtype=np.float32)
  was_enabled = gc.isenabled()
  gc.disable()
  try:
    type(allocator)._alloc = lambda self, nbytes: fresh.append(nbytes) or original(self, nbytes)
    for step in range(12):
      if step == 6: fresh.clear()
      x = Tensor(data + step, device="CPU").realize()   # the same computation on new data each step
      factor = step + 1.5 if changing_constant else 2
      assert (x * factor).numpy()[3] == np.float32(3 + step) * np.float32(factor)
  finally:
    type(allocator)._alloc = original
    if was_enabled: gc.enable()
  assert fresh == [], f"{len(fresh)} fresh allocations in the last 6 steps"
