"""GPU figures of BENCHMARKS.md, on a GPU device (DEVICE=NV python tools/bench/gpu.py) against torch on the same GPU:
`a+b` on 2^28 fp32 (GB/s of bytes read and written), a 4096 fp32 matmul (TFLOPS, torch with TF32 off), jit replay of
64 tiny kernels (us per kernel, the outputs ready), and the MNIST CNN train step (jit, against torch eager).

torch runs in a separate process (this one must load no CUDA library: rawgrad drives the GPU itself); where it is
not installed, or no GPU device opens, the figure says so and the run goes on. GPU_BENCH_SCALE divides the sizes
(e.g. 64 to try the script on the SIM device).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _timing import guarded  # noqa: E402

from rawgrad import Device, Tensor, jit  # noqa: E402
from rawgrad.compiler.rangeify import create_schedule  # noqa: E402
from rawgrad.engine.realize import run_schedule  # noqa: E402
from rawgrad.helpers import GlobalCounters  # noqa: E402

DEVICE = os.environ.get("GPU_DEVICE", os.environ.get("DEVICE", "NV"))
SCALE = int(os.environ.get("GPU_BENCH_SCALE", "1"))
REPEATS = 20

TORCH_SCRIPT = r"""
import json, sys, time
import torch
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
n, size, batch = (int(v) for v in sys.argv[1:4])
def best(function, repeats=20):
  function(); torch.cuda.synchronize()
  start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
  times = []
  for _ in range(repeats):
    start.record(); function(); end.record(); end.synchronize()
    times.append(start.elapsed_time(end) / 1e3)
  return min(times)
a, b, out = (torch.randn(n, device="cuda") for _ in range(3))
x, y = torch.randn(size, size, device="cuda"), torch.randn(size, size, device="cuda")
result = {"add_s": best(lambda: torch.add(a, b, out=out)), "matmul_s": best(lambda: torch.mm(x, y))}
model = torch.nn.Sequential(
  torch.nn.Conv2d(1, 32, 5), torch.nn.ReLU(), torch.nn.Conv2d(32, 32, 5), torch.nn.ReLU(), torch.nn.BatchNorm2d(32),
  torch.nn.MaxPool2d(2), torch.nn.Conv2d(32, 64, 3), torch.nn.ReLU(), torch.nn.Conv2d(64, 64, 3), torch.nn.ReLU(),
  torch.nn.BatchNorm2d(64), torch.nn.MaxPool2d(2), torch.nn.Flatten(1), torch.nn.Linear(576, 10)).cuda()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
images, labels = torch.rand(batch, 1, 28, 28, device="cuda"), torch.randint(0, 10, (batch,), device="cuda")
def step():
  optimizer.zero_grad()
  loss = torch.nn.functional.cross_entropy(model(images), labels)
  loss.backward(); optimizer.step(); loss.item()
for _ in range(3): step()
times = []
for _ in range(20):
  begin = time.perf_counter(); step(); times.append(time.perf_counter() - begin)
result["mnist_s"] = min(times)
print(json.dumps(result))
"""


def torch_reference(n: int, size: int, batch: int) -> dict[str, float] | None:
  try:
    run = subprocess.run([sys.executable, "-c", TORCH_SCRIPT, str(n), str(size), str(batch)], capture_output=True,
                         text=True, timeout=300)
  except (OSError, subprocess.TimeoutExpired) as error:
    print(f"torch reference: {error}")
    return None
  if run.returncode != 0:
    print(f"torch reference unavailable: {run.stderr.strip().splitlines()[-1] if run.stderr else run.returncode}")
    return None
  return json.loads(run.stdout.strip().splitlines()[-1])


def kernel_seconds(tensor: Tensor) -> tuple[float, float]:
  """Best device time of the tensor's kernels (timestamps) and best wall time of launching them and waiting."""
  items = create_schedule([tensor.uop]).items
  run_schedule(items, timed=True)
  device_best, wall_best = float("inf"), float("inf")
  for _ in range(REPEATS):
    before, begin = GlobalCounters.time_sum_s, time.perf_counter()
    run_schedule(items, timed=True)
    wall_best = min(wall_best, time.perf_counter() - begin)
    device_best = min(device_best, GlobalCounters.time_sum_s - before)
  return device_best, wall_best


def ratio_line(label: str, ours: float, theirs: float | None, unit: str, higher_is_better: bool = True) -> str:
  if theirs is None: return f"{label}: {ours:.2f} {unit} (no torch reference)"
  ratio = ours / theirs if higher_is_better else theirs / ours
  return f"{label}: {ours:.2f} {unit} vs torch {theirs:.2f} {unit} = {ratio:.2f}x"


def add(reference: dict | None, n: int) -> None:
  rng = np.random.default_rng(0)
  a, b = (Tensor(rng.standard_normal(n, dtype=np.float32), device=DEVICE).realize() for _ in range(2))
  result = a + b
  kernel, wall = kernel_seconds(result)
  np.testing.assert_array_equal(result.numpy()[:1000], (a.numpy() + b.numpy())[:1000])
  theirs = 12 * n / reference["add_s"] / 1e9 if reference else None
  print(ratio_line(f"{DEVICE} a+b 2^{n.bit_length() - 1} fp32", 12 * n / kernel / 1e9, theirs, "GB/s") +
        f" (launch and wait {12 * n / wall / 1e9:.1f} GB/s)")


def matmul(reference: dict | None, size: int) -> None:
  rng = np.random.default_rng(0)
  x, y = (rng.standard_normal((size, size), dtype=np.float32) for _ in range(2))
  tx, ty = Tensor(x, device=DEVICE).realize(), Tensor(y, device=DEVICE).realize()
  result = tx @ ty
  kernel, _ = kernel_seconds(result)
  np.testing.assert_allclose(result.numpy()[:8], x[:8] @ y, rtol=2e-3, atol=2e-3)
  flops = 2 * size ** 3
  theirs = flops / reference["matmul_s"] / 1e12 if reference else None
  print(ratio_line(f"{DEVICE} matmul {size} fp32", flops / kernel / 1e12, theirs, "TFLOPS"))


def jit_replay(kernels: int = 64) -> None:
  def chain(x: Tensor) -> Tensor:
    for _ in range(kernels): x = (x + 1).contiguous()
    return x
  x = Tensor(np.zeros(16, np.float32), device=DEVICE).realize()
  replayed = jit(chain)
  for _ in range(3): replayed(x)
  device = Device[DEVICE]
  best = float("inf")
  for _ in range(REPEATS):
    begin = time.perf_counter()
    replayed(x)
    device.synchronize()
    best = min(best, time.perf_counter() - begin)
  assert replayed(x).numpy()[0] == kernels
  print(f"{DEVICE} jit replay of {kernels} tiny kernels: {best / kernels * 1e6:.2f} us per kernel "
        f"({best * 1e6:.1f} us per call, outputs ready; target <= 2 us per kernel)")


def mnist(reference: dict | None, batch: int) -> None:
  from mnist import MnistCNN, make_train_step
  from rawgrad.nn.optim import Adam
  from rawgrad.nn.state import get_parameters
  if Device.DEFAULT != DEVICE:
    print(f"{DEVICE} mnist train step: run with DEVICE={DEVICE} (the model is made on the default device)")
    return
  rng = np.random.default_rng(0)
  model = MnistCNN()
  step = jit(make_train_step(model, Adam(get_parameters(model), lr=1e-3)))
  images = rng.random((batch, 1, 28, 28), dtype=np.float32)
  labels = rng.integers(0, 10, batch).astype(np.int32)
  times = []
  for _ in range(8):
    x, y = Tensor(images, device=DEVICE), Tensor(labels, device=DEVICE)
    begin = time.perf_counter()
    step(x, y).item()
    times.append(time.perf_counter() - begin)
  ours = min(times[3:]) * 1e3
  theirs = reference["mnist_s"] * 1e3 if reference else None
  print(ratio_line(f"{DEVICE} mnist train step (batch {batch}, jit)", ours, theirs, "ms", higher_is_better=False) +
        f"; {len(step.kernels)} kernels per step")


def device_opens() -> bool:
  try:
    Device[DEVICE]
    return True
  except Exception as error:  # noqa: BLE001 - no GPU here is an answer, not a failure
    print(f"GPU benchmarks skipped: device {DEVICE} does not open here ({type(error).__name__}: {error})")
    return False


if __name__ == "__main__":
  if not device_opens(): sys.exit(0)
  n, size, batch = (1 << 28) // SCALE, max(64, 4096 // SCALE), max(8, 128 // SCALE)
  reference = torch_reference(n, size, batch) if SCALE == 1 else None
  guarded(lambda: add(reference, n))
  guarded(lambda: matmul(reference, size))
  guarded(jit_replay)
  guarded(lambda: mnist(reference, batch))
