"""Shared by the kernel benchmarks: time rawgrad's kernels and the references (numpy, torch when importable) in
turns of a fraction of a second in one run, best of several repetitions, and print one line per figure with the
ratio.

Our time is `run_schedule` of the tensor's kernels into buffers allocated once: the product path (compiled kernel,
launch through the device queue on all cores, wait for each), without scheduling the tensor graph again; the
kernels' own time (device timestamps, without the launch and the wait) is shown beside it. References write into
preallocated outputs too (`out=`). BENCH_SECONDS sets the time spent per figure. Not a benchmark itself: run by the
others.
"""
from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rawgrad.compiler.rangeify import create_schedule  # noqa: E402
from rawgrad.helpers import GlobalCounters, getenv  # noqa: E402
from rawgrad.engine.realize import run_schedule  # noqa: E402

BENCH_SECONDS = getenv("BENCH_SECONDS", 2.0)
BLOCK_SECONDS = 0.3     # one function's turn
SETTLE_SECONDS = 0.12   # runs that start earlier in a turn do not count: other libraries' threads still spin
MIN_COUNTED_RUNS = 3    # runs that count in every turn, however slow the function
KERNEL = "rawgrad kernels"  # best device time of our kernels, recorded by the `rawgrad` function

try:
  import torch
except ImportError:
  torch = None


def kernels_of(*tensors) -> Callable[[], float]:
  """A function that runs the tensors' kernels again into the same buffers and returns their device time; compiled
  and run once now."""
  items = create_schedule([tensor.uop for tensor in tensors]).items
  run_schedule(items, timed=True)

  def run() -> float:
    before = GlobalCounters.time_sum_s
    run_schedule(items, timed=True)  # every kernel waited for, as a user's realize-and-read would
    return GlobalCounters.time_sum_s - before
  return run


def best_times(functions: dict[str, Callable[[], object]], budget_s: float | None = None, min_rounds: int = 2,
               block_s: float = BLOCK_SECONDS) -> dict[str, float]:
  """Best wall time of each function; for `rawgrad`, also the best time its kernels reported. The functions take turns
  of at least `block_s` (so load on the machine hits all of them alike); runs that start in the first
  SETTLE_SECONDS of a turn do not count: a library's threads keep spinning for up to ~0.1 s after each call
  (OpenBLAS, OpenMP; measured: a rawgrad matmul right after numpy's runs at half speed), and whatever runs right
  after shares the cores with them."""
  budget_s = BENCH_SECONDS if budget_s is None else budget_s
  for function in functions.values(): function()  # warm up: compile, fault pages in, start threads
  best = {name: float("inf") for name in functions}
  best[KERNEL] = float("inf")
  start = time.perf_counter()
  rounds = 0
  while rounds < min_rounds or time.perf_counter() - start < budget_s:
    for name, function in functions.items():
      block_start, counted = time.perf_counter(), 0
      while counted < MIN_COUNTED_RUNS or time.perf_counter() - block_start < block_s:
        begin = time.perf_counter()
        result = function()
        if begin - block_start < SETTLE_SECONDS: continue
        counted += 1
        best[name] = min(best[name], time.perf_counter() - begin)
        if name == "rawgrad" and isinstance(result, float): best[KERNEL] = min(best[KERNEL], result)
    rounds += 1
  return best


def report(label: str, work: float, unit: str, times: dict[str, float]) -> None:
  """`label: 212.0 GFLOPS vs numpy 198.3 GFLOPS = 1.07x[, vs torch ...]`; work is flops or bytes per call."""
  ours = work / times["rawgrad"] / 1e9
  parts = [f"{label}: {ours:.1f} {unit}"]
  for reference in ("numpy", "torch"):
    if reference in times:
      theirs = work / times[reference] / 1e9
      parts.append(f"vs {reference} {theirs:.1f} {unit} = {ours / theirs:.2f}x")
  line = ", ".join(parts)
  if times.get(KERNEL, float("inf")) < float("inf"):
    kernels = work / times[KERNEL] / 1e9
    line += f" (kernels alone {kernels:.1f} {unit} = {kernels / (work / times['numpy'] / 1e9):.2f}x numpy)"
  print(line, flush=True)


def guarded(benchmark: Callable[[], None]) -> None:
  """Run one figure; a failure prints its traceback and the run goes on (benchmarks never fail)."""
  try:
    benchmark()
  except Exception:  # noqa: BLE001 - a broken figure must not stop the others
    traceback.print_exc()


if __name__ == "__main__":
  print("(helpers for the other benchmarks)")
