"""Sums of one-hot rows, which rawgrad runs as a scatter (rangeify.scatter_sum): an embedding's weight gradient and a
scatter_add, against torch's own kernels for them and numpy's np.add.at, each writing into an output allocated once
(torch and numpy start from a zeroed or copied output, as rawgrad's fill does). Times in ms, with ours / theirs."""
from __future__ import annotations

import _isa  # noqa: F401 - first: with CPU_ISA=avx2 the references run AVX2 code too
import numpy as np

from _timing import best_times, guarded, kernels_of, torch

from rawgrad.tensor import Tensor


def line(label: str, times: dict[str, float]) -> None:
  ours = times["rawgrad"]
  parts = [f"{name} {seconds * 1e3:.3f} ms = {ours / seconds:.2f}x" for name, seconds in times.items()
           if name not in ("rawgrad", "rawgrad kernels")]
  print(f"{label}: rawgrad {ours * 1e3:.3f} ms, vs " + ", vs ".join(parts), flush=True)


def embedding_gradient(rows: int, width: int, picks: int) -> None:
  rng = np.random.default_rng(0)
  index = rng.integers(0, rows, picks).astype(np.int32)
  upstream = rng.standard_normal((picks, width), dtype=np.float32)
  weight = Tensor(np.zeros((rows, width), np.float32), requires_grad=True)
  (weight[Tensor(index)] * Tensor(upstream)).sum().backward()
  expected = np.zeros((rows, width), np.float32)
  np.add.at(expected, index, upstream)
  functions = {"rawgrad": kernels_of(weight.grad)}
  np.testing.assert_array_equal(weight.grad.numpy(), expected)
  out = np.empty((rows, width), np.float32)
  def numpy_add_at() -> None:
    out.fill(0)
    np.add.at(out, index, upstream)
  if torch is not None:
    tindex, tupstream = torch.from_numpy(index).long(), torch.from_numpy(upstream)
    functions["torch embedding_dense_backward"] = \
      lambda: torch.ops.aten.embedding_dense_backward(tupstream, tindex, rows, -1, False)
  functions["numpy add.at"] = numpy_add_at
  line(f"embedding gradient {rows}x{width} of {picks} indices", best_times(functions))


def scatter_add(rows: int, width: int, picks: int) -> None:
  rng = np.random.default_rng(1)
  base = rng.standard_normal((rows, width), dtype=np.float32)
  source = rng.standard_normal((picks, width), dtype=np.float32)
  index = rng.integers(0, rows, (picks, width)).astype(np.int32)
  added = Tensor(base).scatter_add(0, Tensor(index), Tensor(source))
  functions = {"rawgrad": kernels_of(added)}
  expected = base.copy()
  columns = np.broadcast_to(np.arange(width), index.shape)
  np.add.at(expected, (index, columns), source)
  np.testing.assert_array_equal(added.numpy(), expected)
  out = np.empty_like(base)
  def numpy_add_at() -> None:
    np.copyto(out, base)
    np.add.at(out, (index, columns), source)
  if torch is not None:
    tbase, tsource, tindex = torch.from_numpy(base), torch.from_numpy(source), torch.from_numpy(index).long()
    tout = torch.empty_like(tbase)
    functions["torch scatter_add_"] = lambda: tout.copy_(tbase).scatter_add_(0, tindex, tsource)
  functions["numpy add.at"] = numpy_add_at
  line(f"scatter_add of {picks}x{width} into {rows}x{width}", best_times(functions))


if __name__ == "__main__":
  guarded(lambda: embedding_gradient(50000, 256, 8192))
  guarded(lambda: embedding_gradient(1000, 64, 512))
  guarded(lambda: scatter_add(4096, 128, 8192))
