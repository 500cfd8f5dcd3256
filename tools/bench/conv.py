"""2-D convolutions with the MNIST CNN's shapes (batch 128: conv5 1->32 at 28x28, conv5 32->32 at 24x24, conv3 32->64
at 10x10, conv3 64->64 at 8x8), forward and backward (the input and weight gradients), in GFLOPS, against numpy
(windows and tensordot, which calls BLAS) and torch."""
from __future__ import annotations

import _isa  # noqa: F401 - first: with CPU_ISA=avx2 the references run AVX2 code too
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from _timing import best_times, guarded, kernels_of, report, torch

from rawgrad.tensor import Tensor

BATCH = 128
LAYERS = [(1, 32, 28, 5), (32, 32, 24, 5), (32, 64, 10, 3), (64, 64, 8, 3)]  # in, out, input size, kernel size


def numpy_conv(x: np.ndarray, w: np.ndarray) -> np.ndarray:
  windows = sliding_window_view(x, w.shape[2:], axis=(2, 3))  # n, cin, oh, ow, kh, kw
  return np.tensordot(windows, w, axes=([1, 4, 5], [1, 2, 3])).transpose(0, 3, 1, 2)


def numpy_conv_backward(x: np.ndarray, w: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  k = w.shape[2]
  windows = sliding_window_view(x, (k, k), axis=(2, 3))
  grad_w = np.tensordot(g, windows, axes=([0, 2, 3], [0, 2, 3]))  # cout, cin, kh, kw
  padded = np.pad(g, ((0, 0), (0, 0), (k - 1, k - 1), (k - 1, k - 1)))
  grad_x = numpy_conv(padded, w[:, :, ::-1, ::-1].transpose(1, 0, 2, 3))
  return grad_x, grad_w


def layer(cin: int, cout: int, size: int, k: int) -> None:
  rng = np.random.default_rng(0)
  x = rng.standard_normal((BATCH, cin, size, size), dtype=np.float32)
  w = (rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k)).astype(np.float32)
  out_size = size - k + 1
  g = rng.standard_normal((BATCH, cout, out_size, out_size), dtype=np.float32)
  flops = 2 * BATCH * cout * out_size * out_size * cin * k * k
  name = f"conv2d {BATCH}x{cin}x{size}x{size} k{k} ->{cout}"

  forward = Tensor(x).conv2d(Tensor(w))
  functions = {"rawgrad": kernels_of(forward), "numpy": lambda: numpy_conv(x, w)}
  np.testing.assert_allclose(forward.numpy(), numpy_conv(x, w), rtol=1e-3, atol=1e-3)
  if torch is not None:
    tx, tw = torch.from_numpy(x), torch.from_numpy(w)
    functions["torch"] = lambda: torch.nn.functional.conv2d(tx, tw)
  report(f"{name} forward", flops, "GFLOPS", best_times(functions))

  tx_, tw_ = Tensor(x), Tensor(w)
  grad_x, grad_w = tx_.conv2d(tw_).gradient(tx_, tw_, gradient=Tensor(g))
  functions = {"rawgrad": kernels_of(grad_x, grad_w), "numpy": lambda: numpy_conv_backward(x, w, g)}
  want_x, want_w = numpy_conv_backward(x, w, g)
  np.testing.assert_allclose(grad_x.numpy(), want_x, rtol=1e-3, atol=1e-3)
  np.testing.assert_allclose(grad_w.numpy(), want_w, rtol=1e-3, atol=1e-2)
  if torch is not None:
    px, pw, pg = torch.from_numpy(x).requires_grad_(), torch.from_numpy(w).requires_grad_(), torch.from_numpy(g)
    functions["torch"] = lambda: torch.autograd.grad(torch.nn.functional.conv2d(px, pw), (px, pw), pg)
  report(f"{name} backward", 2 * flops, "GFLOPS", best_times(functions))


if __name__ == "__main__":
  for shape in LAYERS: guarded(lambda shape=shape: layer(*shape))
