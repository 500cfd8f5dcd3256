"""AdamW steps: rawgrad eager and jit beside torch's foreach and fused AdamW, in one run, with rawgrad's kernels per
step. Parameter sets: 64 of 64x64; the MNIST CNN's (tools/mnist.py); a 12-layer transformer's shapes (width 256, so
the figure runs in seconds on a small machine). Gradients are fixed tensors: the figure is the optimizer step alone.
"""
from __future__ import annotations

import _isa  # noqa: F401 - first: with CPU_ISA=avx2 the references run AVX2 code too
import functools
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rawgrad import GlobalCounters, Tensor, jit  # noqa: E402
from rawgrad.nn.optim import AdamW  # noqa: E402
from rawgrad.runtime.device import Device  # noqa: E402
from tools.bench._timing import best_times, guarded, torch  # noqa: E402
from tools.mnist import MnistCNN  # noqa: E402

WIDTH, LAYERS = 256, 12


def transformer_shapes() -> list[tuple[int, ...]]:
  layer = [(3 * WIDTH, WIDTH), (3 * WIDTH,), (WIDTH, WIDTH), (WIDTH,), (WIDTH,), (WIDTH,), (WIDTH,), (WIDTH,),
           (4 * WIDTH, WIDTH), (4 * WIDTH,), (WIDTH, 4 * WIDTH), (WIDTH,)]
  return layer * LAYERS + [(WIDTH,), (WIDTH,)]


def mnist_shapes() -> list[tuple[int, ...]]:
  return [tuple(p.shape) for p in MnistCNN().parameters()]


def rawgrad_steps(shapes: list[tuple[int, ...]]) -> tuple[Callable[[], None], Callable[[], None], int]:
  """An eager step, a jit step (over the same kind of state), and the kernels of one eager step."""
  rng = np.random.default_rng(0)
  def make() -> tuple[list[Tensor], AdamW]:
    params = [Tensor(rng.standard_normal(s).astype(np.float32), requires_grad=True) for s in shapes]
    for param in params: param.grad = Tensor(rng.standard_normal(param.shape).astype(np.float32)).realize()
    return params, AdamW(params, lr=1e-3)
  _, eager = make()
  jitted_params, jitted = make()

  @jit
  def step() -> Tensor:
    return Tensor.realize(*jitted.schedule_step())[0]
  device = Device[jitted_params[0].device]
  def eager_step() -> None:
    eager.step()
    device.synchronize()
  def jit_step() -> None:
    step()
    device.synchronize()
  for _ in range(3): eager_step(), jit_step()
  GlobalCounters.reset()
  eager_step()
  return eager_step, jit_step, GlobalCounters.kernel_count


def torch_step(shapes: list[tuple[int, ...]], **mode: bool) -> Callable[[], None]:
  params = [torch.randn(s, requires_grad=True) for s in shapes]
  for param in params: param.grad = torch.randn(param.shape)
  optimizer = torch.optim.AdamW(params, lr=1e-3, **mode)
  return optimizer.step


def torch_times(shapes: list[tuple[int, ...]]) -> dict[str, float]:
  if torch is None: return {}
  # one thread: torch's thread pool waits at its barriers by spinning, and on a small machine shared with rawgrad's
  # CPU workers (and other work) a step then takes hundreds of milliseconds
  torch.set_num_threads(1)
  times = best_times({"torch foreach": torch_step(shapes, foreach=True), "torch fused": torch_step(shapes, fused=True)})
  return {name: times[name] for name in ("torch foreach", "torch fused")}


def report(label: str, shapes: list[tuple[int, ...]], reference: dict[str, float]) -> None:
  eager_step, jit_step, kernels = rawgrad_steps(shapes)
  ours = best_times({"rawgrad eager": eager_step, "rawgrad jit": jit_step})
  times = {"rawgrad eager": ours["rawgrad eager"], "rawgrad jit": ours["rawgrad jit"], **reference}
  elements = sum(int(np.prod(s)) for s in shapes)
  line = f"AdamW {label} ({len(shapes)} params, {elements} elements, {kernels} kernels per step):"
  line += ",".join(f" {name} {seconds * 1e3:.3f} ms" for name, seconds in times.items())
  if reference:
    line += (f"; jit / torch fused = {times['rawgrad jit'] / times['torch fused']:.2f}x, "
             f"eager / torch foreach = {times['rawgrad eager'] / times['torch foreach']:.2f}x")
  print(line, flush=True)


def main() -> None:
  start = time.perf_counter()
  cases = {"64 x (64x64)": [(64, 64)] * 64, "MNIST CNN": mnist_shapes(),
           f"transformer {LAYERS} layers width {WIDTH}": transformer_shapes()}
  # torch first: once rawgrad's CPU worker threads exist, torch's thread pool shares the cores with them
  references = {label: torch_times(shapes) for label, shapes in cases.items()}
  for label, shapes in cases.items():
    guarded(functools.partial(report, label, shapes, references[label]))
  print(f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
  main()
