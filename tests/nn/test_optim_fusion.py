"""Optimizer steps fuse through the scheduler: kernels per step independent of the parameter count, values as
torch.optim's over several steps."""
from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

from rawgrad import GlobalCounters
from rawgrad.compiler.rangeify import create_schedule
from rawgrad.nn.optim import SGD, Adam, AdamW, Optimizer
from rawgrad.tensor import Tensor

torch = pytest.importorskip("torch")

STEPS = 10
SHAPES = [(16, 8), (8,), (4, 4, 2), (16, 8), (3,)]  # repeated and different element counts


def _run(make_ours: Callable[[list[Tensor]], Optimizer], make_torch: Callable[[list], object],
         shapes: list[tuple[int, ...]]) -> None:
  rng = np.random.default_rng(0)
  initial = [rng.standard_normal(shape).astype(np.float32) for shape in shapes]
  grads = [[rng.standard_normal(shape).astype(np.float32) for shape in shapes] for _ in range(STEPS)]
  ours = [Tensor(value.copy(), requires_grad=True) for value in initial]
  theirs = [torch.tensor(value.copy(), requires_grad=True) for value in initial]
  optimizer, reference = make_ours(ours), make_torch(theirs)
  for step_grads in grads:
    for param, reference_param, grad in zip(ours, theirs, step_grads):
      param.grad = Tensor(grad)
      reference_param.grad = torch.tensor(grad)
    optimizer.step()
    reference.step()
  for param, reference_param in zip(ours, theirs):
    np.testing.assert_allclose(param.numpy(), reference_param.detach().numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_adamw_matches_torch(weight_decay: float) -> None:
  _run(lambda ps: AdamW(ps, lr=0.01, weight_decay=weight_decay),
       lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=weight_decay, foreach=True), SHAPES)


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_adam_matches_torch(weight_decay: float) -> None:
  _run(lambda ps: Adam(ps, lr=0.01, betas=(0.8, 0.99), weight_decay=weight_decay),
       lambda ps: torch.optim.Adam(ps, lr=0.01, betas=(0.8, 0.99), weight_decay=weight_decay, amsgrad=False), SHAPES)


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_momentum_matches_torch(nesterov: bool) -> None:
  _run(lambda ps: SGD(ps, lr=0.05, momentum=0.9, weight_decay=0.01, nesterov=nesterov),
       lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=0.01, nesterov=nesterov), SHAPES)


class SignSGD(Optimizer):
  """A user's optimizer: plain tensor math in _update."""

  def _update(self, params: list[Tensor], grads: list[Tensor]) -> list[Tensor]:
    for param, grad in zip(params, grads): param.assign(param.detach() - self.lr * grad.sign())
    return []


def test_user_optimizer_fuses() -> None:
  params = [Tensor(np.ones((4, 4), np.float32), requires_grad=True) for _ in range(8)]
  optimizer = SignSGD(params, lr=0.5)
  for param in params: param.grad = Tensor(np.full((4, 4), -2, np.float32))
  GlobalCounters.reset()
  optimizer.step()
  assert GlobalCounters.kernel_count == 1
  for param in params: np.testing.assert_equal(param.numpy(), np.full((4, 4), 1.5, np.float32))


def _kernels_per_step(optimizer: Optimizer, params: list[Tensor]) -> int:
  for param in params: param.grad = Tensor.full(param.shape, 0.5, device=param.device).contiguous()
  Tensor.realize(*[param.grad for param in params])
  GlobalCounters.reset()
  optimizer.step()
  return GlobalCounters.kernel_count


MAKERS = {"AdamW": lambda ps: AdamW(ps, lr=0.01), "Adam": lambda ps: Adam(ps, lr=0.01),
          "SGD": lambda ps: SGD(ps, lr=0.01, momentum=0.9, nesterov=True)}


# 1000 parameters take seconds to schedule the first time: Adam's kernels are AdamW's without the decay
@pytest.mark.parametrize("name, count", [(name, count) for name in MAKERS for count in (1, 64, 1000)
                                         if not (name == "Adam" and count == 1000)])
def test_kernels_per_step_independent_of_parameter_count(name: str, count: int) -> None:
  make = MAKERS[name]
  params = [Tensor(np.full((8, 4), i, np.float32), requires_grad=True) for i in range(count)]
  optimizer = make(params)
  _kernels_per_step(optimizer, params)  # the first step may realize lazily initialized state
  assert _kernels_per_step(optimizer, params) <= 3


@pytest.mark.parametrize("name", list(MAKERS))
def test_small_parameters_of_different_sizes_share_a_kernel(name: str) -> None:
  params = [Tensor(np.full(shape, 1.0, np.float32), requires_grad=True) for shape in SHAPES * 20]
  optimizer = MAKERS[name](params)
  _kernels_per_step(optimizer, params)
  assert _kernels_per_step(optimizer, params) <= 3


def _outputs_per_kernel(optimizer: Optimizer, params: list[Tensor]) -> list[int]:
  for param in params: param.grad = Tensor.full(param.shape, 0.5, device=param.device).contiguous()
  Tensor.realize(*[param.grad for param in params])
  return sorted(item.outputs for item in create_schedule([t.uop for t in optimizer.schedule_step()]).items)


def test_a_large_parameter_gets_a_kernel_of_its_own_beside_small_ones() -> None:
  """MNIST's 5x5 weight (25600 elements) beside parameters of 800, 32 and 1: in one kernel every element would
  compute every parameter's update, gated off outside its part (four times the work); the small ones share one."""
  shapes = [(32, 32, 5, 5), (32, 1, 5, 5), (32,), (1,)]
  params = [Tensor(np.ones(shape, np.float32), requires_grad=True) for shape in shapes]
  optimizer = AdamW(params, lr=0.01)
  _kernels_per_step(optimizer, params)
  outputs = _outputs_per_kernel(optimizer, params)
  assert outputs[-2:] == [3, 9], outputs  # the weight, its m and v; the others' (beside the step's own counters)
  _run(lambda ps: AdamW(ps, lr=0.01), lambda ps: torch.optim.AdamW(ps, lr=0.01, foreach=True), shapes)


def test_parameters_larger_than_the_caches_are_updated_a_few_at_a_time() -> None:
  """Eight parameters of 1 MB: AdamW reads and writes 32 buffers of them at the same index; kernels of at most 16
  (four parameters) keep the streams through memory few enough to run at full bandwidth."""
  shapes = [(512, 512)] * 8   # a CPU rule (STREAMED_DEVICES): on the CPU whatever DEVICE says
  params = [Tensor(np.ones(shape, np.float32), requires_grad=True, device="CPU") for shape in shapes]
  optimizer = AdamW(params, lr=0.01)
  _kernels_per_step(optimizer, params)
  assert [n for n in _outputs_per_kernel(optimizer, params) if n > 1] == [12, 12]
  # small parameters stay in one kernel however many buffers they have
  small = [Tensor(np.ones((8, 4), np.float32), requires_grad=True, device="CPU") for _ in range(8)]
  small_optimizer = AdamW(small, lr=0.01)
  _kernels_per_step(small_optimizer, small)
  assert max(_outputs_per_kernel(small_optimizer, small)) == 24
  # measured on CPUs only: on a GPU (here the simulated one) the large group stays one kernel
  on_gpu = [Tensor(np.ones(shape, np.float32), device="SIM", requires_grad=True) for shape in shapes]
  assert max(_outputs_per_kernel(AdamW(on_gpu, lr=0.01), on_gpu)) == 24
  _run(lambda ps: AdamW(ps, lr=0.01), lambda ps: torch.optim.AdamW(ps, lr=0.01, foreach=True), shapes)
