"""Five jitted steps of the MNIST training step (tools/mnist.py's CNN and Adam) on a device, for the drivers' tests
that compare them with the CPU."""
from __future__ import annotations

import os
import sys

import numpy as np

from rawgrad import jit
from rawgrad.engine.realize import _runners
from rawgrad.nn.optim import Adam
from rawgrad.nn.state import get_parameters, get_state_dict
from rawgrad.tensor import Tensor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
from mnist import MnistCNN, make_train_step  # noqa: E402

STEPS, BATCH, CHANNELS = 5, 2, 2


def move_to(model: MnistCNN, device: str) -> MnistCNN:
  """The model with each of its tensors replaced by a copy on `device` (parameters stay parameters)."""
  for key, tensor in get_state_dict(model).items():
    *path, name = key.split(".")
    owner = model
    for part in path: owner = owner[int(part)] if part.isdigit() else getattr(owner, part)
    moved = Tensor(tensor.numpy(), device=device, requires_grad=tensor.requires_grad)
    if isinstance(owner, list): owner[int(name)] = moved
    else: setattr(owner, name, moved)
  return model


def losses(device: str) -> list[float]:
  """The losses of five steps on `device`, from the same initial weights and data every time."""
  rng = np.random.default_rng(0)
  images = rng.random((STEPS, BATCH, 1, 28, 28), dtype=np.float32)
  labels = rng.integers(0, 10, (STEPS, BATCH)).astype(np.int32)
  Tensor.manual_seed(0)
  model = move_to(MnistCNN(CHANNELS), device)
  step = jit(make_train_step(model, Adam(get_parameters(model), lr=1e-3)))
  return [float(step(Tensor(images[i], device=device), Tensor(labels[i], device=device)).numpy())
          for i in range(STEPS)]


def assert_steps_match_the_cpu(device: str) -> None:
  kernels_before = sum(1 for name, _ in _runners.entries if name == device)
  on_cpu, on_device = losses("CPU"), losses(device)
  assert sum(1 for name, _ in _runners.entries if name == device) > kernels_before, f"no kernel was built for {device}"
  assert on_cpu[-1] < on_cpu[0]          # the model learns, so the comparison means something
  np.testing.assert_allclose(on_device, on_cpu, atol=1e-4, rtol=0)
