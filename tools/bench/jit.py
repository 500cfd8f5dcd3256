"""jit replay and eager launch overhead on the CPU, against the targets in BENCHMARKS.md (these are counts of time
per kernel, with no reference library to compare: the targets are <= 1 us per replayed kernel and <= 50 us per
eager launch of an already compiled kernel)."""
import time

import numpy as np

from rawgrad import GlobalCounters, Tensor, jit
from rawgrad.compiler.rangeify import create_schedule
from rawgrad.runtime.device import Device, buffer_for
from rawgrad.engine.realize import get_runner

KERNELS = 64


def chain(x: Tensor) -> Tensor:
  for _ in range(KERNELS):
    x = (x + 1).contiguous()
  return x


def best_of(function, repeats: int = 20) -> float:
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    function()
    times.append(time.perf_counter() - start)
  return min(times)


def main() -> None:
  x = Tensor(np.zeros(16, np.float32)).realize()
  replayed = jit(chain)
  for _ in range(3): replayed(x)
  assert len(replayed.kernels) == KERNELS, len(replayed.kernels)
  device = Device["CPU"]
  replay = best_of(lambda: (replayed(x), device.synchronize()))  # until the outputs are there
  print(f"jit replay of {KERNELS} tiny kernels: {replay / KERNELS * 1e6:.2f} us per kernel "
        f"({replay * 1e6:.1f} us per call; target <= 1 us per kernel)")

  outputs = jit(lambda x: [(x + i).contiguous() for i in range(KERNELS)])
  for _ in range(3): outputs(x)
  with_outputs = best_of(lambda: (outputs(x), device.synchronize()))
  print(f"jit replay of {KERNELS} tiny kernels returning their {KERNELS} outputs: "
        f"{with_outputs / KERNELS * 1e6:.2f} us per kernel (target <= 1 us per kernel)")

  for _ in range(3): (x * 2 + 1).realize()
  eager = best_of(lambda: [(x * 2 + 1).realize() for _ in range(KERNELS)], repeats=10) / KERNELS
  print(f"eager (x*2+1).realize() on 16 elements, repeated: {eager * 1e6:.1f} us per realize (target <= 50 us)")

  for _ in range(3): Tensor.rand(16).realize()
  built = GlobalCounters.kernels_built
  draw = best_of(lambda: [Tensor.rand(16).realize() for _ in range(KERNELS)], repeats=10) / KERNELS
  print(f"Tensor.rand(16).realize(), repeated: {draw * 1e3:.3f} ms per call (target <= 0.3 ms), "
        f"{GlobalCounters.kernels_built - built} kernels built after the first (goal 0)")

  y = x + 1
  item = create_schedule([y.uop]).items[0]
  buffers = [buffer_for(node).ensure_allocated() for node in item.buffers]
  runner = get_runner("CPU", item.ast)
  launch = best_of(lambda: (runner(buffers, {}), device.synchronize()), repeats=200)
  print(f"eager launch of a compiled kernel: {launch * 1e6:.1f} us (target <= 50 us)")

  a, b = Tensor(np.ones(16, np.float32)).realize(), Tensor(np.ones(16, np.float32)).realize()
  (a + b).realize()
  end_to_end = best_of(lambda: (a + b).realize(), repeats=200)
  print(f"16-element add, end to end (schedule + launch): {end_to_end * 1e6:.1f} us")


if __name__ == "__main__":
  main()
