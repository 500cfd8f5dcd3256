"""Memory-bound kernels: `a+b` on 2^24 floats, a row-wise softmax, sums over rows and over columns, the sum of 2^24
floats, in GB/s of the bytes each must read and write, against numpy and torch."""
from __future__ import annotations

import numpy as np

from _timing import best_times, guarded, kernels_of, report, torch

from rawgrad.tensor import Tensor


def add(n: int = 1 << 24) -> None:
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
  out = np.empty(n, np.float32)
  result = Tensor(a) + Tensor(b)
  functions = {"rawgrad": kernels_of(result), "numpy": lambda: np.add(a, b, out=out)}
  np.testing.assert_array_equal(result.numpy(), a + b)
  if torch is not None:
    ta, tb, tout = torch.from_numpy(a), torch.from_numpy(b), torch.empty(n)
    functions["torch"] = lambda: torch.add(ta, tb, out=tout)
  report(f"a+b 2^{n.bit_length() - 1} fp32", 3 * 4 * n, "GB/s", best_times(functions))


def softmax(rows: int = 4096, columns: int = 1024) -> None:
  x = np.random.default_rng(0).standard_normal((rows, columns), dtype=np.float32)
  result = Tensor(x).softmax(1)

  def reference() -> np.ndarray:
    shifted = np.exp(x - x.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)

  functions = {"rawgrad": kernels_of(result), "numpy": reference}
  np.testing.assert_allclose(result.numpy(), reference(), rtol=1e-4, atol=1e-6)
  if torch is not None:
    tx = torch.from_numpy(x)
    functions["torch"] = lambda: torch.softmax(tx, 1)
  report(f"softmax {rows}x{columns} fp32 (rows)", 2 * 4 * x.size, "GB/s", best_times(functions))


def sums(rows: int = 4096, columns: int = 4096) -> None:
  x = np.random.default_rng(0).standard_normal((rows, columns), dtype=np.float32)
  for axis, name in ((1, "rows"), (0, "columns")):
    result = Tensor(x).sum(axis)
    functions = {"rawgrad": kernels_of(result), "numpy": lambda axis=axis: x.sum(axis)}
    np.testing.assert_allclose(result.numpy(), x.sum(axis), rtol=1e-3, atol=1e-2)
    if torch is not None:
      tx = torch.from_numpy(x)
      functions["torch"] = lambda axis=axis, tx=tx: tx.sum(axis)
    report(f"sum over {name} {rows}x{columns} fp32", 4 * x.size, "GB/s", best_times(functions))


def full_sum(n: int = 1 << 24) -> None:
  x = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
  result = Tensor(x).sum()
  functions = {"rawgrad": kernels_of(result), "numpy": lambda: x.sum()}
  np.testing.assert_allclose(result.numpy(), x.sum(dtype=np.float64), rtol=1e-4, atol=1e-2)
  if torch is not None:
    tx = torch.from_numpy(x)
    functions["torch"] = lambda: tx.sum()
  report(f"sum of 2^{n.bit_length() - 1} fp32", 4 * n, "GB/s", best_times(functions))


if __name__ == "__main__":
  guarded(add)
  guarded(softmax)
  guarded(sums)
  guarded(full_sum)
