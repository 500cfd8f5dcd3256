"""jit: replay matches eager, and everything replay would get silently wrong raises instead."""
import gc
import weakref

import numpy as np
import pytest

from rawgrad import GlobalCounters, Tensor, Variable, jit
from rawgrad.runtime.device import Device
from rawgrad.tensor_jit import JitError

rng = np.random.default_rng(0)


def _inputs(count: int, shape: tuple = (3, 4)) -> list[np.ndarray]:
  return [rng.standard_normal(shape).astype(np.float32) for _ in range(count)]


def test_replay_is_bit_identical_to_eager() -> None:
  weight = Tensor(rng.standard_normal((4, 5)).astype(np.float32))

  def forward(x: Tensor) -> Tensor:
    return (x @ weight).relu().sum(1)

  jitted = jit(forward)
  for x in _inputs(5):
    eager = forward(Tensor(x)).numpy()
    np.testing.assert_array_equal(jitted(Tensor(x)).numpy(), eager)
    np.testing.assert_allclose(eager, np.maximum(x @ weight.numpy(), 0).sum(1), rtol=1e-5)


def test_replay_launches_the_captured_kernels_without_scheduling(monkeypatch: pytest.MonkeyPatch) -> None:
  @jit
  def double_then_sum(x: Tensor, y: Tensor) -> Tensor:
    return (x * 2 + y).sum(0) + x.max()

  xs, ys = _inputs(4), _inputs(4)
  for x, y in zip(xs[:2], ys[:2]): double_then_sum(Tensor(x), Tensor(y))
  inputs = Tensor(xs[2]), Tensor(ys[2])
  Tensor.realize(*inputs)

  def refuse(*_: object) -> None:
    raise AssertionError("replay must not schedule")

  monkeypatch.setattr("rawgrad.tensor.cached_schedule", refuse)
  GlobalCounters.reset()
  out = double_then_sum(*inputs)
  assert GlobalCounters.kernel_count == len(double_then_sum.kernels) == 2
  np.testing.assert_allclose(out.numpy(), (xs[2] * 2 + ys[2]).sum(0) + xs[2].max(), rtol=1e-6)


def test_inputs_are_swapped_by_position() -> None:
  @jit
  def subtract(a: Tensor, b: Tensor) -> Tensor:
    return a - b

  a, b = _inputs(2)
  for _ in range(2): subtract(Tensor(a), Tensor(b))
  np.testing.assert_array_equal(subtract(Tensor(b), Tensor(a)).numpy(), b - a)


def test_gradient_accumulation_across_replays_matches_eager() -> None:
  start = rng.standard_normal((4, 3)).astype(np.float32)

  def step(x: Tensor, weight: Tensor) -> Tensor:
    ((x @ weight) * (x @ weight)).sum().backward()
    return weight.grad

  xs = _inputs(5)
  weight = Tensor(start, requires_grad=True)
  eager = [step(Tensor(x), weight).numpy().copy() for x in xs]
  weight = Tensor(start, requires_grad=True)
  jitted_step = jit(lambda x: step(x, weight))
  jitted = [jitted_step(Tensor(x)).numpy().copy() for x in xs]
  for want, got in zip(eager, jitted): np.testing.assert_allclose(got, want, rtol=1e-5)
  expected = sum(2 * x.T @ (x @ start) for x in xs)
  np.testing.assert_allclose(jitted[-1], expected, rtol=1e-4)


def test_variables_are_rebound_on_replay() -> None:
  n = Variable("n", 1, 10)

  @jit
  def prefix_sum(x: Tensor, count) -> Tensor:
    return x.shrink(((0, count),)).sum()  # the kernel's loop bound is the variable

  x = Tensor(np.arange(10, dtype=np.float32)).realize()
  for value in (3, 4, 5, 6, 2, 10):
    assert prefix_sum(x, n.bind(value)).item() == sum(range(value))
  assert len(prefix_sum.kernels) == 1


# *** what replay would get wrong raises ***

def test_changed_input_shape_dtype_or_count_raises() -> None:
  jitted = jit(lambda x: x + 1)
  for _ in range(2): jitted(Tensor(_inputs(1)[0]))
  with pytest.raises(JitError, match=r"captured as shape \(3, 4\).*now it is shape \(2, 4\)"):
    jitted(Tensor(_inputs(1, (2, 4))[0]))
  with pytest.raises(JitError, match="int32"):
    jitted(Tensor(np.ones((3, 4), np.int32)))
  with pytest.raises(JitError, match="called with 2"):
    jitted(Tensor(_inputs(1)[0]), Tensor(_inputs(1)[0]))


def test_changed_device_raises() -> None:
  jitted = jit(lambda x: x + 1)
  for _ in range(2): jitted(Tensor(_inputs(1)[0]))
  with pytest.raises(JitError, match="on CPU:1"):
    jitted(Tensor(_inputs(1)[0], device="CPU:1"))


def test_changed_non_tensor_argument_raises() -> None:
  jitted = jit(lambda x, factor: x * factor)
  x = Tensor(_inputs(1)[0])
  jitted(x, 2)
  jitted(x, 2)
  np.testing.assert_allclose(jitted(x, 2).numpy(), x.numpy() * 2)
  with pytest.raises(JitError, match="non-Tensor argument changed"):
    jitted(x, 3)


@pytest.mark.parametrize("read", ["item", "tolist", "numpy"])
def test_host_read_inside_capture_raises(read: str) -> None:
  def function(x: Tensor):
    total = x.sum()
    getattr(total, read)()
    return total

  jitted = jit(function)
  jitted(Tensor([1.0, 2.0]))
  with pytest.raises(JitError, match="host read"):
    jitted(Tensor([1.0, 2.0]))


def test_same_buffer_twice_raises() -> None:
  jitted = jit(lambda a, b: a + b)
  x = Tensor(_inputs(1)[0])
  jitted(x, x)
  with pytest.raises(JitError, match="same buffer"):
    jitted(x, x)


def test_output_aliasing_an_input_raises() -> None:
  def update(x: Tensor) -> Tensor:
    return x.assign(x + 1)

  jitted = jit(update)
  jitted(Tensor([1.0]))
  with pytest.raises(JitError, match="aliases input 0"):
    jitted(Tensor([1.0]))


def test_jit_inside_jit_raises() -> None:
  inner = jit(lambda x: x * 2)
  outer = jit(lambda x: inner(x) + 1)
  outer(Tensor([1.0]))
  with pytest.raises(JitError, match="another jit function is capturing"):
    outer(Tensor([1.0]))


def test_nothing_launched_raises() -> None:
  jitted = jit(lambda x: x)
  jitted(Tensor([1.0]))
  with pytest.raises(JitError, match="launched no kernels"):
    jitted(Tensor([1.0]))


def test_training_step_replay_is_bit_identical_to_eager() -> None:
  from rawgrad import nn
  from rawgrad.nn.optim import Adam

  def train(use_jit: bool) -> list[np.ndarray]:
    Tensor.manual_seed(0)
    model = [nn.Conv2d(1, 4, 3), nn.BatchNorm(4), nn.Linear(4 * 6 * 6, 3)]
    optimizer = Adam([p for layer in model for p in layer.parameters()] + [model[1].running_mean], lr=1e-2)

    def step(images: Tensor, labels: Tensor) -> Tensor:
      optimizer.zero_grad()
      hidden = model[1](model[0](images).relu()).flatten(1)
      loss = model[2](hidden).sparse_categorical_crossentropy(labels)
      loss.backward()
      return loss.realize(*optimizer.schedule_step())

    run = jit(step) if use_jit else step
    data = np.random.default_rng(5)
    for _ in range(5):
      images = Tensor(data.standard_normal((8, 1, 8, 8)).astype(np.float32))
      run(images, Tensor(data.integers(0, 3, 8).astype(np.int32)))
    return [p.numpy() for layer in model for p in layer.parameters()] + [model[1].running_mean.numpy()]

  for eager, replayed in zip(train(False), train(True)):
    np.testing.assert_array_equal(replayed, eager)


def test_capture_replans_temporaries_into_one_arena() -> None:
  weight = Tensor(rng.standard_normal((64, 64)).astype(np.float32))

  def part(x: Tensor) -> Tensor:
    hidden = (x @ weight).relu()
    hidden = hidden - hidden.max(1, keepdim=True)
    return ((hidden.exp() / hidden.exp().sum(1, keepdim=True)) @ weight).softmax(1).sum(1)

  def two_schedules(x: Tensor) -> tuple[Tensor, Tensor]:
    return part(x).realize(), part(x * 2).realize()   # two schedules, each planned into an arena of its own

  jitted = jit(two_schedules)
  for x in _inputs(2, (64, 64)): jitted(Tensor(x))
  views = [b for k in jitted.kernels for b in k.buffers if b.base is not None]
  assert len({id(b.base) for b in views}) == 1
  assert views[0].base.nbytes < 2 * 64 * 64 * 4 * 2   # each schedule alone needs more than 64 * 64 * 4 * 2
  for x in _inputs(3, (64, 64)):
    eager = [t.numpy() for t in two_schedules(Tensor(x))]
    for replayed, expected in zip(jitted(Tensor(x)), eager): np.testing.assert_array_equal(replayed.numpy(), expected)


def test_replayed_inputs_free_their_memory_when_they_go() -> None:
  """A replay checks each input tensor's device: that must not leave its node in a reference cycle (a cached
  toposort holds the node itself), which would keep its buffer until the garbage collector runs, so that every
  step's input took fresh memory. The captured launches hold the last input's buffer until the next replay."""
  import gc
  import weakref
  from rawgrad.runtime.device import buffer_for
  step = jit(lambda x: (x * 2).sum())
  data = np.arange(64, dtype=np.float32).reshape(8, 8)  # the tensor is a reshape of its buffer
  for _ in range(2): step(Tensor(data))  # run, then capture
  gc.disable()
  try:
    previous = None
    for _ in range(4):
      x = Tensor(data)
      assert step(x).item() == float(data.sum() * 2)
      assert previous is None or previous() is None, "the last replay's input is still allocated"
      previous = weakref.ref(buffer_for(x.uop.src[0]))
      del x
  finally:
    gc.enable()


def test_an_output_passed_back_in_is_read_before_it_is_overwritten() -> None:
  """x = step(x): from the third call the input is the buffer the replay writes its output into. A kernel reading
  across elements (a transpose, a sum) read values it had already overwritten: wrong from the third call, silently."""
  @jit
  def step(x: Tensor) -> Tensor:
    return x.T + x.sum()
  x, expected = Tensor(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)), np.array([[1.0, 2.0], [3.0, 4.0]])
  for _ in range(5):
    x, expected = step(x), expected.T + expected.sum()
    np.testing.assert_allclose(x.numpy(), expected, rtol=1e-6)


def test_a_new_seed_between_replays_draws_what_an_eager_call_draws() -> None:
  """The captured kernels held the seed as a constant: after manual_seed(3) a replay still drew seed 2's numbers."""
  @jit
  def noisy(x: Tensor) -> Tensor:
    return x + Tensor.rand(3)

  def eager(seed: int) -> list:
    Tensor.manual_seed(seed)
    return (Tensor.zeros(3) + Tensor.rand(3)).tolist()
  for seed in (1, 2, 3, 1, 1, 5):
    Tensor.manual_seed(seed)
    assert noisy(Tensor.zeros(3)).tolist() == eager(seed), f"seed {seed}"


def test_tensors_inside_lists_and_dicts_are_inputs() -> None:
  """They were compared as settings: with one-element truth values they raised 'a non-Tensor argument changed', and
  before that equal-looking graphs passed, so a replay read the tensors of the capture."""
  @jit
  def combine(pair: list, extra: dict, scale: float = 1.0) -> Tensor:
    return pair[0] * scale + pair[1] + extra["bias"]
  for step in range(5):
    got = combine([Tensor([float(step)] * 2), Tensor([1.0, 2.0])], {"bias": Tensor([10.0, 20.0 + step])}, scale=2.0)
    assert got.tolist() == [2 * step + 11.0, 2 * step + 22.0 + step]
  with pytest.raises(JitError, match="captured with 3 tensor inputs, called with 2"):
    combine([Tensor([1.0, 1.0])], {"bias": Tensor([1.0, 1.0])}, scale=2.0)


def test_a_dropped_jit_waits_for_its_last_replay_before_its_arguments_are_freed() -> None:
  """The replayed kernels read their argument blocks from the graph's memory: dropped (the function collected, the
  program exiting) while the last replay still runs, the graph frees that memory only after the device is past it."""
  def chain(x: Tensor) -> Tensor:
    for _ in range(32): x = (x * 1.0001 + 1).contiguous()
    return x
  replayed = jit(chain)
  # on the CPU, 32 kernels over 16 MB: tens of ms, long enough to still run at the check without the wait (the GPU
  # emulators run them in numpy: a small tensor keeps the suite quick)
  x = Tensor(np.zeros(1 << 22 if Device.DEFAULT == "CPU" else 1 << 10, np.float32)).realize()
  for _ in range(3): replayed(x)
  graph = weakref.ref(replayed.graph)
  last_run = dict(replayed.graph.last_run)
  assert last_run
  del replayed
  if graph() is not None: gc.collect()
  assert graph() is None
  for device, value in last_run.items(): assert Device[device].timeline_signal.value >= value
