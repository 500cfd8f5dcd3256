"""Acceptance test: the MNIST CNN of BENCHMARKS.md (conv5-conv5-bn-pool-conv3-conv3-bn-pool-linear, Adam) learns
scikit-learn's bundled 8x8 digits, upscaled to 28x28, to at least 97% test accuracy within a minute.

Every training step is one schedule: forward, backward, the Adam update and BatchNorm's running statistics, run by
`jit` (scheduled on the first two calls, replayed after). The learning rate follows a cosine decay through `set_lr`,
which writes the lr buffer the replayed kernels read. MNIST_TIME_BUDGET (seconds) raises the time limit, to check the
accuracy on a slow build.
"""
from __future__ import annotations

import math
import os
import time

import numpy as np
import pytest

from rawgrad import jit, nn
from rawgrad.nn.optim import Adam
from rawgrad.tensor import Tensor

datasets = pytest.importorskip("sklearn.datasets", reason="scikit-learn provides the digits data set")

CHANNELS = (8, 16)
BATCH, STEPS, LEARNING_RATE = 64, 100, 5e-3
TRAIN_SIZE = 1437  # of 1797 digits; the other 360 are the test set
TIME_BUDGET_S = float(os.environ.get("MNIST_TIME_BUDGET", 60))
TARGET_ACCURACY = 0.97


class DigitsCNN(nn.Module):
  def __init__(self, channels: tuple[int, int] = CHANNELS) -> None:
    first, second = channels
    self.conv1, self.conv2, self.norm1 = nn.Conv2d(1, first, 5), nn.Conv2d(first, first, 5), nn.BatchNorm2d(first)
    self.conv3, self.conv4 = nn.Conv2d(first, second, 3), nn.Conv2d(second, second, 3)
    self.norm2 = nn.BatchNorm2d(second)
    self.head = nn.Linear(second * 3 * 3, 10)

  def forward(self, x: Tensor) -> Tensor:
    x = self.norm1(self.conv2(self.conv1(x).relu()).relu()).max_pool2d(2)  # 28 -> 24 -> 20 -> 10
    x = self.norm2(self.conv4(self.conv3(x).relu()).relu()).max_pool2d(2)  # 10 -> 8 -> 6 -> 3
    return self.head(x.flatten(1))


def bilinear_matrix(source: int, target: int) -> np.ndarray:
  """The (target, source) matrix of linear interpolation with aligned pixel centres."""
  position = np.clip((np.arange(target) + 0.5) * source / target - 0.5, 0, source - 1)
  low = np.floor(position).astype(int)
  high, fraction = np.minimum(low + 1, source - 1), position - low
  matrix = np.zeros((target, source))
  np.add.at(matrix, (np.arange(target), low), 1 - fraction)
  np.add.at(matrix, (np.arange(target), high), fraction)
  return matrix


def load_digits_28() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  digits = datasets.load_digits()
  scale = bilinear_matrix(8, 28)
  images = (scale @ (digits.images / 16.0) @ scale.T).astype(np.float32)[:, None]
  images = (images - images.mean()) / images.std()
  order = np.random.default_rng(0).permutation(len(images))
  images, labels = images[order], digits.target[order].astype(np.int32)
  return images[:TRAIN_SIZE], labels[:TRAIN_SIZE], images[TRAIN_SIZE:], labels[TRAIN_SIZE:]


def test_digits_cnn_reaches_97_percent_within_a_minute() -> None:
  train_x, train_y, test_x, test_y = load_digits_28()
  Tensor.manual_seed(0)
  model = DigitsCNN()
  optimizer = Adam(model.parameters(), lr=LEARNING_RATE)

  @jit
  def train_step(images: Tensor, labels: Tensor) -> Tensor:
    optimizer.zero_grad()
    loss = model(images).cross_entropy(labels)
    loss.backward()
    Tensor.realize(loss, *optimizer.schedule_step())
    return loss

  rng = np.random.default_rng(1)
  order = np.concatenate([rng.permutation(TRAIN_SIZE) for _ in range(STEPS * BATCH // TRAIN_SIZE + 1)])
  start = time.perf_counter()
  for step in range(STEPS):
    optimizer.set_lr(LEARNING_RATE * 0.5 * (1 + math.cos(math.pi * step / STEPS)))
    batch = order[step * BATCH:(step + 1) * BATCH]
    loss = train_step(Tensor(train_x[batch]), Tensor(train_y[batch]))
    elapsed = time.perf_counter() - start
    if elapsed > TIME_BUDGET_S:
      pytest.fail(f"too slow: {step + 1} of {STEPS} steps took {elapsed:.1f} s (budget {TIME_BUDGET_S:.0f} s), "
                  f"loss {loss.item():.3f}")
  assert math.isfinite(loss.item()) and loss.item() < 0.5, f"training loss {loss.item():.3f} after {STEPS} steps"
  model.eval()
  predictions = model(Tensor(test_x)).argmax(-1).numpy()
  accuracy = float((predictions == test_y).mean())
  elapsed = time.perf_counter() - start
  print(f"digits CNN: {accuracy:.1%} test accuracy after {STEPS} steps of {BATCH} in {elapsed:.1f} s")
  assert accuracy >= TARGET_ACCURACY, f"test accuracy {accuracy:.1%} after {STEPS} steps ({elapsed:.1f} s)"
  assert elapsed <= TIME_BUDGET_S, f"{accuracy:.1%} reached, but in {elapsed:.1f} s (budget {TIME_BUDGET_S:.0f} s)"
