"""The MNIST training step (tools/mnist.py), jitted, on the emulated H100: its losses over five steps match the CPU's
(the acceptance asks 1e-4; the emulated GPU's interpreter rounds as the CPU's code does, so they agree exactly)."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from rawgrad import Tensor, jit, nn
from rawgrad.drivers.nv.device import NVDevice
from rawgrad.nn.optim import Adam

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "tools"))
from mnist import MnistCNN, make_train_step  # noqa: E402


def _losses(steps: int = 5, channels: int = 4, batch: int = 8) -> list[float]:
  Tensor.manual_seed(0)
  model = MnistCNN(channels)
  step = jit(make_train_step(model, Adam(nn.state.get_parameters(model), lr=1e-3)))
  rng = np.random.default_rng(0)
  losses = []
  for _ in range(steps):
    images = Tensor(rng.random((batch, 1, 28, 28), dtype=np.float32))
    labels = Tensor(rng.integers(0, 10, batch).astype(np.int32))
    losses.append(float(step(images, labels).item()))
  return losses


def test_five_mnist_steps_on_nv_match_the_cpu(nv: NVDevice, monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setenv("DEVICE", "CPU")
  cpu = _losses()
  monkeypatch.setenv("DEVICE", "NV")
  on_nv = _losses()
  assert cpu[0] > cpu[-1] * 1.1   # it learns
  np.testing.assert_allclose(on_nv, cpu, atol=1e-4, rtol=0)
