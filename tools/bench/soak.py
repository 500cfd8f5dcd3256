"""Long runs stay fast and bounded: the MNIST CNN step with dropout and a learning rate that changes every step,
eagerly for SOAK_EAGER steps (2,000) and jitted for SOAK_JIT steps (10,000). For each: kernels built after the
warm-up (goal 0), resident memory at 10%, 50% and 100% of the run (goal: flat within 5%), and the step time over
the first and the last tenth of the run after the warm-up (goal: equal within noise). Batch 16, 8 channels: the run
measures what happens around the kernels, not the kernels."""
import _isa  # noqa: F401 - first: with CPU_ISA=avx2 the references run AVX2 code too
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from mnist import MnistCNN, make_train_step  # noqa: E402

from rawgrad import GlobalCounters, Tensor, jit  # noqa: E402
from rawgrad.nn.optim import Adam  # noqa: E402

BATCH, CHANNELS, WARM_UP = 16, 8, 20
EAGER_STEPS = int(os.environ.get("SOAK_EAGER", 2000))
JIT_STEPS = int(os.environ.get("SOAK_JIT", 10000))


def resident_mb() -> float:
  with open("/proc/self/statm") as statm: return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


class DropoutCNN(MnistCNN):
  def __init__(self) -> None:
    super().__init__(CHANNELS)
    self.layers.insert(-1, lambda x: x.dropout(0.25))


def soak(label: str, steps: int, jitted: bool) -> None:
  if steps <= WARM_UP: return
  Tensor.manual_seed(0)
  model = DropoutCNN()
  optimizer = Adam(model.parameters(), lr=1e-3)
  step = make_train_step(model, optimizer)
  if jitted: step = jit(step)
  rng = np.random.default_rng(0)
  data = [(rng.random((BATCH, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, BATCH).astype(np.int32))
          for _ in range(8)]
  marks = {max(WARM_UP, steps // 10): "10%", steps // 2: "50%", steps - 1: "100%"}
  times, resident, built, losses = [], {}, 0, []
  for index in range(steps):
    if index == WARM_UP: built = GlobalCounters.kernels_built
    start = time.perf_counter()
    optimizer.set_lr(1e-3 * 0.5 * (1 + math.cos(math.pi * index / steps)))  # a cosine schedule: a new lr each step
    images, labels = data[index % len(data)]
    loss = step(Tensor(images), Tensor(labels))
    if index % 50 == 0: losses.append(loss.item())
    times.append(time.perf_counter() - start)
    if index in marks: resident[marks[index]] = resident_mb()
  built = GlobalCounters.kernels_built - built
  window = max((steps - WARM_UP) // 10, 1)
  first, last = np.median(times[WARM_UP:WARM_UP + window]), np.median(times[-window:])
  growth = (resident["100%"] - resident["10%"]) / resident["10%"]
  print(f"soak {label} ({steps} steps): kernels built after warm-up {built} (goal 0); resident memory "
        f"{resident['10%']:.0f} / {resident['50%']:.0f} / {resident['100%']:.0f} MB at 10/50/100% "
        f"= {growth * 100:+.1f}% (goal within 5%); step time {first * 1e3:.2f} ms at the start, "
        f"{last * 1e3:.2f} ms at the end = {last / first:.2f}x; loss {losses[0]:.3f} -> {losses[-1]:.3f}")


def main() -> None:
  soak("eager", EAGER_STEPS, jitted=False)
  soak("jit", JIT_STEPS, jitted=True)


if __name__ == "__main__":
  main()
