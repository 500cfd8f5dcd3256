"""The MNIST CNN of BENCHMARKS.md (conv5-conv5-bn-pool-conv3-conv3-bn-pool-linear, Adam) and its data, shared by
the demo (tools/demo.py) and the benchmark (tools/bench/mnist.py).

Data: real MNIST IDX files when a directory holding them is given; otherwise scikit-learn's bundled handwritten
digits (8x8, 1797 images), upscaled to 28x28 so the network sees MNIST's shape.
"""
from __future__ import annotations

import gzip
import os
import struct

import numpy as np

from rawgrad import Tensor, nn
from rawgrad.nn.optim import Adam


class MnistCNN(nn.Module):
  """conv5-conv5-bn-pool-conv3-conv3-bn-pool-linear with ReLU activations, for (N, 1, 28, 28) inputs."""

  def __init__(self, channels: int = 32):
    wide = channels * 2
    self.layers = [
      nn.Conv2d(1, channels, 5), Tensor.relu, nn.Conv2d(channels, channels, 5), Tensor.relu,
      nn.BatchNorm(channels), lambda x: x.max_pool2d(2),
      nn.Conv2d(channels, wide, 3), Tensor.relu, nn.Conv2d(wide, wide, 3), Tensor.relu,
      nn.BatchNorm(wide), lambda x: x.max_pool2d(2),
      lambda x: x.flatten(1), nn.Linear(wide * 3 * 3, 10),
    ]

  def forward(self, x: Tensor) -> Tensor:
    for layer in self.layers: x = layer(x)
    return x


def make_train_step(model: MnistCNN, optimizer: Adam):
  """One Adam step on a batch; returns the loss. Written to be wrapped in `jit`: all state lives in tensors."""
  def step(images: Tensor, labels: Tensor) -> Tensor:
    optimizer.zero_grad()
    loss = model(images).sparse_categorical_crossentropy(labels)
    loss.backward()
    return loss.realize(*optimizer.schedule_step())
  return step


def accuracy(model: MnistCNN, images: np.ndarray, labels: np.ndarray, batch: int = 256) -> float:
  model.eval()
  correct = 0
  for start in range(0, len(images), batch):
    logits = model(Tensor(images[start:start + batch])).numpy()
    correct += int((logits.argmax(1) == labels[start:start + batch]).sum())
  model.train()
  return correct / len(images)


# *** data ***

def _read_idx(path: str) -> np.ndarray:
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rb") as file:
    data = file.read()
  zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
  if zero != 0 or dtype_code != 0x08: raise ValueError(f"{path} is not an unsigned-byte IDX file")
  shape = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
  return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def _find(directory: str, stem: str) -> str:
  for name in (stem, stem + ".gz", stem.replace("-idx", ".idx"), stem.replace("-idx", ".idx") + ".gz"):
    if os.path.exists(path := os.path.join(directory, name)): return path
  raise FileNotFoundError(f"no {stem}[.gz] in {directory}")


def load_idx_mnist(directory: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """Real MNIST from the four IDX files (gzipped or not) in `directory`, scaled to [0, 1]."""
  def images(stem: str) -> np.ndarray:
    return (_read_idx(_find(directory, stem)).astype(np.float32) / 255.0)[:, None]
  def labels(stem: str) -> np.ndarray:
    return _read_idx(_find(directory, stem)).astype(np.int32)
  return (images("train-images-idx3-ubyte"), labels("train-labels-idx1-ubyte"),
          images("t10k-images-idx3-ubyte"), labels("t10k-labels-idx1-ubyte"))


def load_digits_28(test_fraction: float = 0.2, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """scikit-learn's 8x8 digits, upscaled 3x (nearest) and padded to 28x28, scaled to [0, 1], split at random."""
  from sklearn.datasets import load_digits
  digits = load_digits()
  small = digits.images.astype(np.float32) / 16.0
  large = np.pad(np.kron(small, np.ones((3, 3), np.float32)), ((0, 0), (2, 2), (2, 2)))[:, None]
  order = np.random.default_rng(seed).permutation(len(large))
  cut = int(len(large) * (1 - test_fraction))
  labels = digits.target.astype(np.int32)
  return large[order[:cut]], labels[order[:cut]], large[order[cut:]], labels[order[cut:]]


def load_data(directory: str | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  return load_idx_mnist(directory) if directory else load_digits_28()
