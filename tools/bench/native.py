"""Overheads of the native CPU runtime (rawgrad/runtime/native.py) on a tiny kernel (a 16-element vector add):

  replay  one prebuilt command buffer of 64 EXECs + a SIGNAL, submitted and waited for from Python: time per kernel
  eager   one submit of EXEC + SIGNAL and the Python wait for it: the round trip of launching a compiled kernel
  cores   the same with the kernel split over 2 cores: what handing a slice to the second thread costs, with the
          threads still spinning from the previous launch and with threads asleep (spin_us=0: futex wake-ups)

Reference beside each: a direct ctypes call of the same kernel from Python. Figures are medians over many runs (the
machines are shared and noisy). Never fails: any error is printed and the exit code is 0.
"""
from __future__ import annotations

import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from rawgrad.drivers.cpu import CPUProgram  # noqa: E402
from rawgrad.runtime.compile import LLVMCompiler  # noqa: E402
from rawgrad.drivers.cpu.native import CommandBuffer, NativeRuntime, Signal, kernel_args  # noqa: E402

VECTOR_ADD = r"""
define void @vector_add(ptr %args, i64 %core, i64 %cores) {
entry:
  %a = load ptr, ptr %args
  %pb = getelementptr i64, ptr %args, i64 1
  %b = load ptr, ptr %pb
  %po = getelementptr i64, ptr %args, i64 2
  %out = load ptr, ptr %po
  %pn = getelementptr i64, ptr %args, i64 3
  %n = load i64, ptr %pn
  %scaled = mul i64 %n, %core
  %start = udiv i64 %scaled, %cores
  %next = add i64 %core, 1
  %scaled_end = mul i64 %n, %next
  %end = udiv i64 %scaled_end, %cores
  %nonempty = icmp ult i64 %start, %end
  br i1 %nonempty, label %loop, label %exit
loop:
  %i = phi i64 [%start, %entry], [%i_next, %loop]
  %pa_i = getelementptr float, ptr %a, i64 %i
  %pb_i = getelementptr float, ptr %b, i64 %i
  %po_i = getelementptr float, ptr %out, i64 %i
  %va = load float, ptr %pa_i
  %vb = load float, ptr %pb_i
  %sum = fadd float %va, %vb
  store float %sum, ptr %po_i
  %i_next = add i64 %i, 1
  %done = icmp eq i64 %i_next, %end
  br i1 %done, label %exit, label %loop
exit:
  ret void
}
"""
KERNELS, N = 64, 16


def median_us(fn: Callable[[], None], repeats: int, per: int = 1) -> float:
  for _ in range(min(repeats // 10, 200)):  # warm up
    fn()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times) / per * 1e6


class Launcher:
  """A prebuilt EXEC + SIGNAL whose timeline value is bumped per launch, as an HCQ queue would do it."""

  def __init__(self, runtime: NativeRuntime, kernel: CPUProgram, args: np.ndarray, cores: int, count: int) -> None:
    self.runtime, self.signal, self.commands = runtime, Signal(name="timeline"), CommandBuffer()
    for _ in range(count):
      self.commands.exec(kernel, args, cores)
    self.signal_at, self.value = self.commands.signal(self.signal, 0), 0

  def __call__(self) -> None:
    self.value += 1
    self.commands.words[self.signal_at + 2] = self.value
    self.runtime.submit(self.commands)
    self.runtime.wait_signal(self.signal, self.value, 5.0)


def fresh_launch(runtime: NativeRuntime, kernel: CPUProgram, args: np.ndarray, signal: Signal) -> Callable[[], None]:
  """A command buffer built from scratch for every launch: what an eager launch pays without caching."""
  def launch() -> None:
    value = signal.value + 1
    commands = CommandBuffer()
    commands.exec(kernel, args, 1)
    commands.signal(signal, value)
    runtime.submit(commands)
    runtime.wait_signal(signal, value, 5.0)
  return launch


def main() -> None:
  kernel = CPUProgram("vector_add", LLVMCompiler().compile(VECTOR_ADD))
  a, b, out = np.arange(N, dtype=np.float32), np.ones(N, np.float32), np.zeros(N, np.float32)
  args = kernel_args([a.ctypes.data, b.ctypes.data, out.ctypes.data, N])
  direct = median_us(lambda: kernel(args.ctypes.data, 0, 1), 20000)
  with NativeRuntime() as runtime:
    print(f"native runtime: {runtime.threads} threads, tiny kernel = {N}-element float32 vector add, "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"reference: direct ctypes call of the kernel from Python: {direct:.2f} us")
    for cores in (1, 2):
      replay = median_us(Launcher(runtime, kernel, args, cores, KERNELS), 2000, per=KERNELS)
      print(f"jit replay, {KERNELS} EXECs cores={cores}: {replay:.3f} us per kernel (target <= 1 us) "
            f"vs direct call {direct:.2f} us = {direct / replay:.1f}x faster")
    eager = {cores: median_us(Launcher(runtime, kernel, args, cores, 1), 5000) for cores in (1, 2)}
    for cores, us in eager.items():
      print(f"eager launch round trip (prebuilt EXEC+SIGNAL, submit, Python wait), cores={cores}: {us:.2f} us "
            f"(target <= 50 us) vs direct call {direct:.2f} us = {us / direct:.1f}x")
    print(f"second core on a tiny kernel: cores=2 {eager[2]:.2f} us vs cores=1 {eager[1]:.2f} us = "
          f"{eager[2] / eager[1]:.2f}x")
    fresh = median_us(fresh_launch(runtime, kernel, args, Signal()), 5000)
    print(f"eager launch round trip with a freshly built command buffer: {fresh:.2f} us vs prebuilt "
          f"{eager[1]:.2f} us = {fresh / eager[1]:.2f}x")
  with NativeRuntime(spin_us=0) as cold:  # threads sleep at once: every launch pays the futex wake-ups
    asleep = {cores: median_us(Launcher(cold, kernel, args, cores, 1), 3000) for cores in (1, 2)}
    print(f"eager launch with sleeping threads (spin_us=0): cores=2 {asleep[2]:.2f} us vs cores=1 {asleep[1]:.2f} us "
          f"= {asleep[2] / asleep[1]:.2f}x; vs spinning threads {asleep[1] / eager[1]:.1f}x")
    np.testing.assert_array_equal(out, a + b)


if __name__ == "__main__":
  try:
    main()
  except Exception:
    traceback.print_exc()
  sys.exit(0)
