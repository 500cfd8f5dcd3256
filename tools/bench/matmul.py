"""Matrix multiplication: square fp32 256/1024/2048, a batched matmul and x^T dy (a linear layer's weight gradient,
x read transposed), against numpy (OpenBLAS) and torch.

  python tools/bench/matmul.py            every figure
  python tools/bench/matmul.py 1024 2048  only these square sizes
"""
from __future__ import annotations

import _isa  # noqa: F401 - first: with CPU_ISA=avx2 the references run AVX2 code too
import sys

import numpy as np

from _timing import best_times, guarded, kernels_of, report, torch

from rawgrad.tensor import Tensor


def square(n: int) -> None:
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
  out = np.empty((n, n), np.float32)
  result = Tensor(a) @ Tensor(b)
  ours = kernels_of(result)
  np.testing.assert_allclose(result.numpy(), a @ b, rtol=1e-3, atol=1e-3 * np.sqrt(n))
  functions = {"rawgrad": ours, "numpy": lambda: np.matmul(a, b, out=out)}
  if torch is not None:
    ta, tb, tout = torch.from_numpy(a), torch.from_numpy(b), torch.empty((n, n))
    functions["torch"] = lambda: torch.matmul(ta, tb, out=tout)
  report(f"matmul {n} fp32", 2 * n ** 3, "GFLOPS", best_times(functions))


def batched(batch: int, m: int, k: int, n: int) -> None:
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal((batch, m, k), dtype=np.float32), rng.standard_normal((batch, k, n), dtype=np.float32)
  out = np.empty((batch, m, n), np.float32)
  result = Tensor(a) @ Tensor(b)
  ours = kernels_of(result)
  np.testing.assert_allclose(result.numpy(), a @ b, rtol=1e-3, atol=1e-3 * np.sqrt(k))
  functions = {"rawgrad": ours, "numpy": lambda: np.matmul(a, b, out=out)}
  if torch is not None:
    ta, tb, tout = torch.from_numpy(a), torch.from_numpy(b), torch.empty((batch, m, n))
    functions["torch"] = lambda: torch.matmul(ta, tb, out=tout)
  report(f"batched matmul {batch}x{m}x{k}x{n} fp32", 2 * batch * m * k * n, "GFLOPS", best_times(functions))


def transposed(batch: int, inputs: int, outputs: int) -> None:
  rng = np.random.default_rng(0)
  x = rng.standard_normal((batch, inputs), dtype=np.float32)
  dy = rng.standard_normal((batch, outputs), dtype=np.float32)
  out = np.empty((inputs, outputs), np.float32)
  result = Tensor(x).T @ Tensor(dy)
  ours = kernels_of(result)
  np.testing.assert_allclose(result.numpy(), x.T @ dy, rtol=1e-3, atol=1e-3 * np.sqrt(batch))
  functions = {"rawgrad": ours, "numpy": lambda: np.matmul(x.T, dy, out=out)}
  if torch is not None:
    tx, tdy, tout = torch.from_numpy(x), torch.from_numpy(dy), torch.empty((inputs, outputs))
    functions["torch"] = lambda: torch.matmul(tx.T, tdy, out=tout)
  report(f"matmul x^T dy {batch}x{inputs} by {batch}x{outputs} fp32", 2 * batch * inputs * outputs, "GFLOPS",
         best_times(functions))


if __name__ == "__main__":
  sizes = [int(arg) for arg in sys.argv[1:]] or [256, 1024, 2048]
  for size in sizes: guarded(lambda size=size: square(size))
  if not sys.argv[1:]:
    guarded(lambda: batched(64, 128, 128, 128))
    guarded(lambda: transposed(512, 1024, 1024))
