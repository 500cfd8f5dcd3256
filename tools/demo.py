"""rawgrad's demo: train the MNIST CNN of BENCHMARKS.md with `jit` on the default device.

  python tools/demo.py                 # scikit-learn's handwritten digits, upscaled to 28x28
  python tools/demo.py --data DIR      # real MNIST from the IDX files in DIR (gzipped or not)

Prints the test accuracy, the time per training step, the kernels per step and the peak buffer memory, and writes
a profile trace (summarize it with `python -m rawgrad.tools.profile TRACE`).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from mnist import MnistCNN, accuracy, load_data, make_train_step  # noqa: E402
from tqdm import trange  # noqa: E402

from rawgrad import Context, Device, GlobalCounters, Tensor, jit  # noqa: E402
from rawgrad.nn.optim import Adam  # noqa: E402
from rawgrad.runtime import profile  # noqa: E402


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--data", help="a directory with the four MNIST IDX files")
  parser.add_argument("--steps", type=int, default=250, help="training steps")
  parser.add_argument("--batch", type=int, default=128)
  parser.add_argument("--channels", type=int, default=32, help="channels of the first convolutions")
  parser.add_argument("--seed", type=int, default=0)
  arguments = parser.parse_args()

  train_x, train_y, test_x, test_y = load_data(arguments.data)
  source = f"MNIST from {arguments.data}" if arguments.data else "scikit-learn digits upscaled to 28x28"
  print(f"rawgrad demo on {Device.DEFAULT}: {source}, {len(train_x)} training / {len(test_x)} test images")
  Tensor.manual_seed(arguments.seed)
  model = MnistCNN(arguments.channels)
  optimizer = Adam(model.parameters(), lr=2e-3)
  step = jit(make_train_step(model, optimizer))
  order = np.random.default_rng(arguments.seed)

  step_times, first_step = [], None
  with Context(PROFILE=1):
    start = time.perf_counter()
    progress = trange(arguments.steps, desc="training", unit="step")
    for index in progress:
      batch = order.integers(0, len(train_x), arguments.batch)
      began = time.perf_counter()
      loss = step(Tensor(train_x[batch]), Tensor(train_y[batch])).item()
      step_times.append(time.perf_counter() - began)
      if first_step is None: first_step = time.perf_counter() - start
      if index == 2: GlobalCounters.reset()
      progress.set_postfix(loss=f"{loss:.3f}")
    trace = profile.write_trace()

  training_peak = GlobalCounters.mem_peak  # before evaluation, which allocates buffers of its own
  test_accuracy = accuracy(model, test_x, test_y)
  replay_times = sorted(step_times[3:]) or step_times
  print(f"test accuracy:        {test_accuracy:.2%}")
  print(f"time per train step:  {replay_times[len(replay_times) // 2] * 1e3:.1f} ms (median of jit replays, "
        f"batch {arguments.batch})")
  print(f"kernels per step:     {len(step.kernels)}")
  print(f"peak buffer memory:   {training_peak / 1e6:.1f} MB (training steps)")
  print(f"first step finished:  {first_step:.1f} s after start (compiles included)")
  print(f"profile trace:        {trace}")


if __name__ == "__main__":
  main()
