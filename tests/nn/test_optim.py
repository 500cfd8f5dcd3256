"""Optimizers against numpy re-implementations of torch.optim's update formulas, over several steps of a small
least-squares problem. The gradients come from rawgrad's autograd; the references get them in closed form."""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import numpy as np
import pytest

from rawgrad import GlobalCounters, jit
from rawgrad.compiler.rangeify import buffer_base
from rawgrad.nn.optim import LAMB, SGD, Adam, AdamW, Optimizer
from rawgrad import tensor as tensor_module
from rawgrad.engine import realize as realize_module
from rawgrad.tensor import Tensor

STEPS = 5
RNG = np.random.default_rng(0)
X = RNG.standard_normal((8, 4)).astype(np.float32)
Y = RNG.standard_normal((8, 3)).astype(np.float32)
W0 = RNG.standard_normal((3, 4)).astype(np.float32)
B0 = RNG.standard_normal(3).astype(np.float32)


def numpy_grads(w: np.ndarray, b: np.ndarray) -> list[np.ndarray]:
  """Gradients of mean((x @ w.T + b - y)**2) in float64."""
  residual = X.astype(np.float64) @ w.T + b - Y
  scale = 2 / residual.size
  return [scale * residual.T @ X, scale * residual.sum(0)]


def loss_of(w: Tensor, b: Tensor) -> Tensor:
  residual = Tensor(X) @ w.T + b - Tensor(Y)
  return (residual * residual).mean()


# *** numpy references: torch.optim's formulas (and LAMB's paper), one step over all parameters ***

def sgd_reference(lr: float, momentum: float = 0.0, dampening: float = 0.0, weight_decay: float = 0.0,
                  nesterov: bool = False, maximize: bool = False) -> Callable:
  buffers: dict[int, np.ndarray] = {}

  def step(params: list[np.ndarray], grads: list[np.ndarray]) -> None:
    for i, (p, g) in enumerate(zip(params, grads)):
      g = -g if maximize else g
      g = g + weight_decay * p
      if momentum:
        buffers[i] = g.copy() if i not in buffers else momentum * buffers[i] + (1 - dampening) * g
        g = g + momentum * buffers[i] if nesterov else buffers[i]
      p -= lr * g
  return step


def adam_reference(lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                   weight_decay: float = 0.0, decoupled: bool = False) -> Callable:
  m: dict[int, np.ndarray] = {}
  v: dict[int, np.ndarray] = {}
  count = [0]

  def step(params: list[np.ndarray], grads: list[np.ndarray]) -> None:
    count[0] += 1
    t = count[0]
    for i, (p, g) in enumerate(zip(params, grads)):
      if decoupled: p *= 1 - lr * weight_decay
      else: g = g + weight_decay * p
      m[i] = betas[0] * m.get(i, 0) + (1 - betas[0]) * g
      v[i] = betas[1] * v.get(i, 0) + (1 - betas[1]) * g * g
      correction1, correction2 = 1 - betas[0] ** t, 1 - betas[1] ** t
      p -= lr / correction1 * m[i] / (np.sqrt(v[i]) / np.sqrt(correction2) + eps)
  return step


def lamb_reference(lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                   weight_decay: float = 0.0) -> Callable:
  m: dict[int, np.ndarray] = {}
  v: dict[int, np.ndarray] = {}
  count = [0]

  def step(params: list[np.ndarray], grads: list[np.ndarray]) -> None:
    count[0] += 1
    t = count[0]
    for i, (p, g) in enumerate(zip(params, grads)):
      m[i] = betas[0] * m.get(i, 0) + (1 - betas[0]) * g
      v[i] = betas[1] * v.get(i, 0) + (1 - betas[1]) * g * g
      direction = (m[i] / (1 - betas[0] ** t)) / (np.sqrt(v[i] / (1 - betas[1] ** t)) + eps) + weight_decay * p
      weight_norm, direction_norm = np.linalg.norm(p), np.linalg.norm(direction)
      trust = weight_norm / direction_norm if weight_norm > 0 and direction_norm > 0 else 1.0
      p -= lr * trust * direction
  return step


CASES: dict[str, tuple[Callable[[list[Tensor]], Optimizer], Callable[[], Callable]]] = {
  "sgd": (lambda ps: SGD(ps, lr=0.1), lambda: sgd_reference(0.1)),
  "sgd_momentum": (lambda ps: SGD(ps, lr=0.05, momentum=0.9), lambda: sgd_reference(0.05, momentum=0.9)),
  "sgd_dampening_decay": (lambda ps: SGD(ps, lr=0.05, momentum=0.8, dampening=0.3, weight_decay=0.1),
                          lambda: sgd_reference(0.05, momentum=0.8, dampening=0.3, weight_decay=0.1)),
  "sgd_nesterov": (lambda ps: SGD(ps, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
                   lambda: sgd_reference(0.05, momentum=0.9, nesterov=True, weight_decay=0.01)),
  "sgd_maximize": (lambda ps: SGD(ps, lr=0.01, maximize=True), lambda: sgd_reference(0.01, maximize=True)),
  "adam": (lambda ps: Adam(ps, lr=0.1), lambda: adam_reference(0.1)),
  "adam_l2": (lambda ps: Adam(ps, lr=0.05, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
              lambda: adam_reference(0.05, (0.8, 0.99), 1e-6, 0.1)),
  "adamw": (lambda ps: AdamW(ps, lr=0.1, weight_decay=0.1),
            lambda: adam_reference(0.1, weight_decay=0.1, decoupled=True)),
  "adamw_default": (lambda ps: AdamW(ps), lambda: adam_reference(1e-3, weight_decay=1e-2, decoupled=True)),
  "lamb": (lambda ps: LAMB(ps, lr=0.1), lambda: lamb_reference(0.1)),
  "lamb_decay": (lambda ps: LAMB(ps, lr=0.05, betas=(0.85, 0.98), weight_decay=0.1),
                 lambda: lamb_reference(0.05, (0.85, 0.98), 1e-6, 0.1)),
}


def train(make_optimizer: Callable[[list[Tensor]], Optimizer], steps: int = STEPS) -> tuple[list, list, Optimizer]:
  """Run `steps` steps in rawgrad, each in one schedule; return the parameters after each step and the losses."""
  w, b = Tensor(W0.copy(), requires_grad=True), Tensor(B0.copy(), requires_grad=True)
  optimizer = make_optimizer([w, b])
  history, losses = [], []
  for _ in range(steps):
    optimizer.zero_grad()
    loss = loss_of(w, b)
    loss.backward()
    Tensor.realize(loss, *optimizer.schedule_step())
    history.append((w.numpy().copy(), b.numpy().copy()))
    losses.append(loss.item())
  return history, losses, optimizer


def reference_history(step: Callable, steps: int = STEPS) -> list:
  w, b = W0.astype(np.float64), B0.astype(np.float64)
  history = []
  for _ in range(steps):
    step([w, b], numpy_grads(w, b))
    history.append((w.copy(), b.copy()))
  return history


@pytest.mark.parametrize("case", list(CASES))
def test_matches_torch_formulas(case: str) -> None:
  make_optimizer, make_reference = CASES[case]
  history, _, _ = train(make_optimizer)
  for step, ((w, b), (w_ref, b_ref)) in enumerate(zip(history, reference_history(make_reference()))):
    np.testing.assert_allclose(w, w_ref, rtol=1e-4, atol=1e-5, err_msg=f"{case}: weight after step {step + 1}")
    np.testing.assert_allclose(b, b_ref, rtol=1e-4, atol=1e-5, err_msg=f"{case}: bias after step {step + 1}")


@pytest.mark.parametrize("case", ["sgd_momentum", "adam", "lamb"])
def test_loss_decreases(case: str) -> None:
  _, losses, _ = train(CASES[case][0], steps=8)
  assert losses[-1] < losses[0] * 0.8, losses


def test_adam_moments_after_one_step() -> None:
  w, b = Tensor(W0.copy(), requires_grad=True), Tensor(B0.copy(), requires_grad=True)
  optimizer = Adam([w, b], lr=0.1, betas=(0.9, 0.99))
  loss_of(w, b).backward()
  optimizer.step()
  for first, second, grad in zip(optimizer.exp_avgs, optimizer.exp_avg_sqs, numpy_grads(W0, B0)):
    np.testing.assert_allclose(first.numpy(), 0.1 * grad, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(second.numpy(), 0.01 * grad * grad, rtol=1e-4, atol=1e-9)


def test_parameters_and_state_keep_their_buffers() -> None:
  w, b = Tensor(W0.copy(), requires_grad=True), Tensor(B0.copy(), requires_grad=True)
  optimizer = Adam([w, b], lr=0.1)
  tracked = [w, b, *optimizer.moments, optimizer.beta_powers]
  for _ in range(2):  # the first step may realize lazily initialized tensors
    optimizer.zero_grad()
    loss_of(w, b).backward()
    optimizer.step()
  before = [buffer_base(t.uop) for t in tracked]
  for _ in range(2):
    optimizer.zero_grad()
    loss_of(w, b).backward()
    optimizer.step()
  assert [buffer_base(t.uop) for t in tracked] == before


@contextlib.contextmanager
def counted_realizes() -> Iterator[list[int]]:
  """The realizes made inside: how many tensors each was asked for."""
  calls: list[int] = []
  original = tensor_module.realize_tensors

  def counting(tensors: list) -> None:
    calls.append(len(tensors))
    original(tensors)
  tensor_module.realize_tensors = counting
  try:
    yield calls
  finally:
    tensor_module.realize_tensors = original


def test_step_is_one_schedule_and_compiles_once() -> None:
  w, b = Tensor(W0.copy(), requires_grad=True), Tensor(B0.copy(), requires_grad=True)
  optimizer = SGD([w, b], lr=0.1, momentum=0.9)
  with counted_realizes() as calls:
    for _ in range(3):
      optimizer.zero_grad()
      loss = loss_of(w, b)
      loss.backward()
      Tensor.realize(loss, *optimizer.schedule_step())
      if len(calls) == 2: compiled = len(realize_module._runners)
  assert len(calls) == 3, f"expected one realize per step, got {calls}"
  assert len(realize_module._runners) == compiled, "later steps compiled new kernels"


def test_parameters_still_to_initialize_are_realized_together() -> None:
  """Lazily initialized parameters become buffers in one schedule before the update is assigned into them (one
  realize each would wait for one compile each), with the values they were initialized to."""
  w, b = Tensor(W0.copy()) * 2, Tensor(B0.copy()) + 1
  w.requires_grad = b.requires_grad = True
  optimizer = SGD([w, b], lr=0.1)
  optimizer.zero_grad()
  loss_of(w, b).backward()
  with counted_realizes() as calls:
    pending = optimizer.schedule_step()
  assert calls == [2], calls
  Tensor.realize(*pending)
  grads = numpy_grads(W0.astype(np.float64) * 2, B0.astype(np.float64) + 1)
  np.testing.assert_allclose(w.numpy(), W0 * 2 - 0.1 * grads[0], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(b.numpy(), B0 + 1 - 0.1 * grads[1], rtol=1e-5, atol=1e-6)


def test_set_lr_changes_the_update_without_recompiling() -> None:
  history, _, _ = train(lambda ps: SGD(ps, lr=0.1), steps=1)
  w, b = Tensor(W0.copy(), requires_grad=True), Tensor(B0.copy(), requires_grad=True)
  optimizer = SGD([w, b], lr=0.5)
  optimizer.set_lr(0.2)
  optimizer.set_lr(0.1)
  loss_of(w, b).backward()
  optimizer.step()
  np.testing.assert_allclose(w.numpy(), history[0][0], rtol=1e-6)
  assert optimizer.lr.item() == pytest.approx(0.1)
  compiled = len(realize_module._runners)
  optimizer.set_lr(0.05)
  assert len(realize_module._runners) == compiled
  assert optimizer.lr.item() == pytest.approx(0.05)


def test_set_lr_reaches_jit_replays() -> None:
  w = Tensor(W0.copy(), requires_grad=True)
  optimizer = SGD([w], lr=0.1)

  @jit
  def step(x: Tensor) -> Tensor:
    optimizer.zero_grad()
    loss = (w * x).sum()
    loss.backward()
    Tensor.realize(loss, *optimizer.schedule_step())
    return loss

  expected = W0.astype(np.float64)
  for i, lr in enumerate([0.1, 0.1, 0.5, 0.25, 2.0]):  # the first two calls run eagerly and capture; then replays
    optimizer.set_lr(lr)
    x = np.full(W0.shape, i + 1, np.float32)
    step(Tensor(x))
    expected -= lr * x
  assert step.calls == 5
  np.testing.assert_allclose(w.numpy(), expected, rtol=1e-6)


def test_parameter_without_gradient_is_skipped() -> None:
  w, b = Tensor(W0.copy(), requires_grad=True), Tensor(B0.copy(), requires_grad=True)
  unused = Tensor(np.ones((2, 2), np.float32), requires_grad=True)
  optimizer = Adam([w, b, unused], lr=0.1)
  optimizer.zero_grad()
  loss_of(w, b).backward()
  assert unused.grad is None
  optimizer.step()
  np.testing.assert_array_equal(unused.numpy(), np.ones((2, 2), np.float32))
  assert not np.allclose(w.numpy(), W0)


def test_requires_grad_none_becomes_true_and_false_is_a_buffer() -> None:
  trained, frozen = Tensor(np.ones(3, np.float32)), Tensor(np.ones(3, np.float32), requires_grad=False)
  optimizer = SGD([trained, frozen, trained], lr=0.1)
  assert trained.requires_grad is True
  assert len(optimizer.params) == 1 and optimizer.params[0] is trained
  assert len(optimizer.buffers) == 1 and optimizer.buffers[0] is frozen
  # a pending in-place update of a buffer runs in the optimizer's schedule
  frozen.assign(frozen * 3)
  (trained * trained).sum().backward()
  Tensor.realize(*optimizer.schedule_step())
  np.testing.assert_allclose(frozen.numpy(), [3, 3, 3])
  np.testing.assert_allclose(trained.numpy(), [0.8, 0.8, 0.8], rtol=1e-6)


@pytest.mark.parametrize("make, message", [
  (lambda ps: SGD(ps, lr=-1.0), "learning rate"),
  (lambda ps: SGD(ps, lr=0.1, nesterov=True), "Nesterov"),
  (lambda ps: Adam(ps, betas=(1.0, 0.999)), "betas"),
  (lambda ps: SGD([], lr=0.1), "no parameters"),
  (lambda ps: SGD([np.ones(3)], lr=0.1), "must be Tensors"),
])
def test_bad_arguments_raise(make: Callable, message: str) -> None:
  params: list[Any] = [Tensor(np.ones(3, np.float32))]
  with pytest.raises((ValueError, TypeError), match=message): make(params)


@pytest.mark.parametrize("case", list(CASES))
def test_eager_steps_replay_and_match_torch_formulas(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
  """step() builds the update's graph on the first two steps (run, capture) and replays the capture after."""
  make_optimizer, make_reference = CASES[case]
  built = []
  original = Optimizer.schedule_step
  monkeypatch.setattr(Optimizer, "schedule_step", lambda self: built.append(1) or original(self))
  w, b = Tensor(W0.copy(), requires_grad=True), Tensor(B0.copy(), requires_grad=True)
  optimizer = make_optimizer([w, b])
  steps = 8
  for (w_ref, b_ref), step in zip(reference_history(make_reference(), steps), range(steps)):
    optimizer.zero_grad()
    loss_of(w, b).backward()
    optimizer.step()
    np.testing.assert_allclose(w.numpy(), w_ref, rtol=1e-4, atol=1e-5, err_msg=f"{case}: weight after step {step}")
    np.testing.assert_allclose(b.numpy(), b_ref, rtol=1e-4, atol=1e-5, err_msg=f"{case}: bias after step {step}")
  assert len(built) == 2, f"{case}: the update's graph was built in {len(built)} of {steps} steps"


def test_replayed_steps_follow_lr_settings_skipped_gradients_and_pending_buffers() -> None:
  w = Tensor(W0.copy(), requires_grad=True)
  extra = Tensor(np.ones(3, np.float32), requires_grad=True)
  frozen = Tensor(np.ones(3, np.float32), requires_grad=False)
  optimizer = SGD([w, extra, frozen], lr=0.1, momentum=0.5)
  expected_w, velocity_w = W0.astype(np.float64), np.zeros_like(W0, np.float64)
  expected_extra, velocity_extra = np.ones(3), np.zeros(3)
  for step in range(12):
    if step == 6: optimizer.set_lr(0.05)    # read from its buffer by the replayed kernels
    if step == 8: optimizer.momentum = 0.8  # a setting is a constant of the capture: a new one is captured
    lr, momentum = (0.1 if step < 6 else 0.05), (0.5 if step < 8 else 0.8)
    x = np.full(W0.shape, step + 1, np.float32)
    optimizer.zero_grad()
    uses_extra = step % 4 != 3  # some steps leave extra without a gradient: skipped, as in torch
    loss = (w * Tensor(x)).sum() + ((extra * extra).sum() if uses_extra else 0)
    loss.backward()
    frozen.assign(frozen + 1)  # pending work of a buffer runs with the step
    optimizer.step()
    velocity_w = momentum * velocity_w + x if step else x.astype(np.float64)
    expected_w -= lr * velocity_w
    if uses_extra:
      grad = 2 * expected_extra
      velocity_extra = momentum * velocity_extra + grad if velocity_extra.any() else grad
      expected_extra = expected_extra - lr * velocity_extra
    np.testing.assert_allclose(w.numpy(), expected_w, rtol=1e-5, err_msg=f"weight after step {step}")
    np.testing.assert_allclose(extra.numpy(), expected_extra, rtol=1e-5, err_msg=f"extra after step {step}")
    np.testing.assert_array_equal(frozen.numpy(), np.full(3, step + 2, np.float32))


@pytest.mark.parametrize("jitted", [False, True])
def test_a_lazy_loss_shares_the_gradients_forward_pass(jitted: bool) -> None:
  """`loss.backward(); opt.step()` with the loss still lazy: the step realizes the loss in one schedule with the
  gradients, so the forward pass runs once. Realized apart, it ran once for the loss and again for the gradients
  (a language model's step: 206 kernels and 108 ms, now 192 and 79-85). Here the layer's matmul is most of the work:
  a step is two of them (the forward, the weight's gradient) and its elementwise work (2.6 matmuls of operations),
  not three (3.5); and the loss is still that of the weights before the step, in eager steps, replayed ones and a
  jitted whole step."""
  rng = np.random.default_rng(9)
  x, y = rng.standard_normal((128, 256)).astype(np.float32), rng.standard_normal((128, 4)).astype(np.float32)
  w = Tensor(rng.standard_normal((256, 256)).astype(np.float32) / 16, requires_grad=True)
  head = Tensor(rng.standard_normal((4, 256)).astype(np.float32) / 16)
  optimizer = SGD([w], lr=0.01)

  def step() -> Tensor:
    optimizer.zero_grad()
    loss = (((Tensor(x) @ w.T).tanh() @ head.T - Tensor(y)) ** 2).mean()
    loss.backward()
    optimizer.step()
    return loss
  run = jit(step) if jitted else step
  matmul = 2 * 128 * 256 * 256
  for _ in range(4):
    weights = w.numpy().astype(np.float64)
    expected = float(((np.tanh(x @ weights.T) @ head.numpy().T - y) ** 2).mean())
    before = GlobalCounters.global_ops
    loss = run()
    assert GlobalCounters.global_ops - before < 3 * matmul, (GlobalCounters.global_ops - before) / matmul
    assert loss.item() == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("make", [lambda params: SGD(params, lr=0.1, momentum=0.9),
                                  lambda params: Adam(params, lr=0.1)])
def test_a_loss_read_after_the_step_is_the_loss_before_it(make: Callable) -> None:
  """As in PyTorch, where the loss is computed when it is made: `loss.backward(); opt.step(); loss.item()` is the loss
  of the weights before the step. The lazy loss was computed after the step wrote the weights (each printed loss was
  the next step's), in eager steps and in replayed ones."""
  w, b = Tensor(W0.copy(), requires_grad=True), Tensor(B0.copy(), requires_grad=True)
  optimizer = make([w, b])
  for step in range(5):
    expected_w, expected_b = w.numpy().astype(np.float64), b.numpy().astype(np.float64)
    residual = X.astype(np.float64) @ expected_w.T + expected_b - Y
    optimizer.zero_grad()
    loss = loss_of(w, b)
    loss.backward()
    optimizer.step()
    assert loss.item() == pytest.approx(float((residual ** 2).mean()), rel=1e-5), f"step {step}"
