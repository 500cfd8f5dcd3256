"""The MNIST training step (tools/mnist.py's CNN and Adam step, under jit) on the emulated AMD GPU, gfx1100 and
gfx942, against the same model on the CPU: the losses agree to 1e-4 after 5 steps."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from rawgrad import jit
from rawgrad.drivers import os as seam
from rawgrad.drivers.amd.emulated import EmulatedKernel
from rawgrad.nn.optim import Adam
from rawgrad.nn.state import get_parameters, get_state_dict
from rawgrad.runtime.device import Device
from rawgrad.tensor import Tensor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "tools"))
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


def losses(device: str, images: np.ndarray, labels: np.ndarray) -> list[float]:
  Tensor.manual_seed(0)
  model = move_to(MnistCNN(CHANNELS), device)
  step = jit(make_train_step(model, Adam(get_parameters(model), lr=1e-3)))
  return [float(step(Tensor(images[i], device=device), Tensor(labels[i], device=device)).numpy())
          for i in range(STEPS)]


@pytest.mark.parametrize("arch", ["gfx1100", "gfx942"])
def test_the_mnist_training_step_matches_the_cpu(arch: str) -> None:
  rng = np.random.default_rng(0)
  images = rng.random((STEPS, BATCH, 1, 28, 28), dtype=np.float32)
  labels = rng.integers(0, 10, (STEPS, BATCH)).astype(np.int32)
  name = "AMD:0" if arch == "gfx942" else "AMD"
  with seam.installed("amd", EmulatedKernel(arch=arch)):
    opened = Device[name]
  if opened.arch != arch: pytest.skip(f"{name} was opened for {opened.arch} earlier in this process")
  on_cpu, on_amd = losses("CPU", images, labels), losses(name, images, labels)
  assert on_cpu[-1] < on_cpu[0]          # the model learns, so the comparison means something
  assert abs(on_amd[-1] - on_cpu[-1]) <= 1e-4, (on_amd, on_cpu)
  np.testing.assert_allclose(on_amd, on_cpu, atol=1e-4)
