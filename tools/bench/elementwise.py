"""Memory-bound kernels: `a+b` on 2^24 floats, a row-wise softmax, sums over rows and over columns, the sum of 2^24
floats, in GB/s of the bytes each must read and write, against numpy and torch."""
from __future__ import annotations

import _isa  # noqa: F401 - first: with CPU_ISA=avx2 the references run AVX2 code too
import numpy as np

from _timing import best_times, guarded, kernels_of, report, torch

from rawgrad.runtime.device import Device
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


def user_add(n: int = 1 << 24) -> None:
  """`a+b` as a user writes it: a new output tensor each call, realized (and waited for), and then also read back,
  against numpy's allocating `a + b` (and `(a + b).copy()` for the read back)."""
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
  ta, tb = Tensor(a).realize(), Tensor(b).realize()
  device = Device[ta.device]
  np.testing.assert_array_equal((ta + tb).numpy(), a + b)
  functions = {"rawgrad": lambda: ((ta + tb).realize(), device.synchronize()), "numpy": lambda: a + b}
  if torch is not None:
    tta, ttb = torch.from_numpy(a), torch.from_numpy(b)
    functions["torch"] = lambda: tta + ttb
  report(f"a+b 2^{n.bit_length() - 1} fp32, user path (new output, realize)", 3 * 4 * n, "GB/s",
         best_times(functions))
  functions = {"rawgrad": lambda: (ta + tb).numpy(), "numpy": lambda: (a + b).copy()}
  report(f"a+b 2^{n.bit_length() - 1} fp32, user path with read back (.numpy())", 3 * 4 * n, "GB/s",
         best_times(functions))


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
  guarded(user_add)
  guarded(softmax)
  guarded(sums)
  guarded(full_sum)
