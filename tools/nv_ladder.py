"""The NVIDIA hardware ladder (issue 13): each rung a step further from "the driver answers" to "tensors compute",
each run in its own thread with a deadline, printed as one line with its result or its exact error, and written
with the machine's facts as JSON (--out).

  1. version check and the GPU's name, through RM
  2. allocate, map, write and read back video memory (256 MiB)
  3. an empty GPFIFO submission whose semaphore the host sees
  4. a copy-engine copy host -> device -> host (256 MiB) with its bandwidth
  5. a kernel launch (a + b) with correct results, through the Tensor API (5b: hand-written PTX through ptxas)
  6. (with --suite) the tensor test suite on NV

It never resets or reconfigures the GPU; every wait has a deadline of seconds. `EMULATE=1 python tools/nv_ladder.py`
climbs the same ladder on the emulated H100.

  python tools/nv_ladder.py --out ladder.json [--megabytes 256] [--suite]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import threading
import time
import traceback
from typing import Any, Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rawgrad.drivers.os import emulating, kernel_interface  # noqa: E402

WAIT_S = 10.0            # every GPU wait
RUNG_S = 120.0           # a whole rung, bring-up included (the first open may boot the GPU's firmware)
ADD_PTX = """.version 8.0
.target {arch}
.address_size 64
.visible .entry ladder_add(.param .u64 out, .param .u64 a, .param .u64 b, .param .u64 n)
{{
  .reg .b32 %r<5>;
  .reg .b64 %rd<10>;
  .reg .f32 %f<4>;
  .reg .pred %p<2>;
  mov.u32 %r1, %ctaid.x;
  mov.u32 %r2, %ntid.x;
  mov.u32 %r3, %tid.x;
  mad.lo.s32 %r4, %r1, %r2, %r3;
  cvt.u64.u32 %rd1, %r4;
  ld.param.u64 %rd2, [n];
  setp.ge.u64 %p1, %rd1, %rd2;
  @%p1 bra DONE;
  ld.param.u64 %rd3, [out];
  ld.param.u64 %rd4, [a];
  ld.param.u64 %rd5, [b];
  shl.b64 %rd6, %rd1, 2;
  add.s64 %rd7, %rd4, %rd6;
  add.s64 %rd8, %rd5, %rd6;
  add.s64 %rd9, %rd3, %rd6;
  ld.global.f32 %f1, [%rd7];
  ld.global.f32 %f2, [%rd8];
  add.f32 %f3, %f1, %f2;
  st.global.f32 [%rd9], %f3;
DONE:
  ret;
}}
"""


class Ladder:
  def __init__(self, megabytes: int):
    self.nbytes = megabytes << 20
    self.results: list[dict[str, Any]] = []
    self.kernel = kernel_interface("nv")
    self.device: Any = None

  def rung(self, number: str, name: str, body: Callable[[], dict[str, Any]], timeout_s: float = RUNG_S) -> bool:
    """Run one rung on a thread with a deadline; print one line; record it. Returns whether it passed."""
    outcome: dict[str, Any] = {}

    def run() -> None:
      try:
        outcome["result"] = body()
      except BaseException as error:  # noqa: BLE001 - every failure is the rung's result
        outcome["error"] = f"{type(error).__name__}: {error}"
        outcome["traceback"] = traceback.format_exc()

    start = time.perf_counter()
    thread = threading.Thread(target=run, name=f"rung {number}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    seconds = round(time.perf_counter() - start, 3)
    record: dict[str, Any] = {"rung": number, "name": name, "seconds": seconds}
    if thread.is_alive():
      record.update(ok=False, error=f"timed out after {timeout_s}s (the rung is still blocked; later rungs skipped)")
    elif "error" in outcome:
      record.update(ok=False, error=outcome["error"], traceback=outcome["traceback"])
    else:
      record.update(ok=True, result=outcome["result"])
    self.results.append(record)
    shown = json.dumps(record["result"], default=str) if record["ok"] else record["error"]
    print(f"rung {number} {'ok' if record['ok'] else 'FAILED'} ({seconds}s) {name}: {shown}", flush=True)
    return record["ok"] and not thread.is_alive()

  # ** the rungs

  def version_and_name(self) -> dict[str, Any]:
    from rawgrad.drivers.nv.gpu import NVGPU
    gpu = NVGPU(self.kernel)
    try:
      info = gpu.info
      return {"driver": info.driver_version, "name": info.name, "arch": info.arch, "uuid": info.uuid.hex(),
              "sms": info.sm_count, "tpcs": info.tpc_count,
              "video_memory_gib": round(info.video_memory_bytes / 2**30, 2),
              "bar1_gib": round(info.bar1_bytes / 2**30, 2),
              "classes": {"gpfifo": hex(info.gpfifo_class), "compute": hex(info.compute_class),
                          "copy": hex(info.copy_class), "usermode": hex(info.usermode_class)}}
    finally:
      gpu.close()

  def video_memory(self) -> dict[str, Any]:
    from rawgrad.drivers.nv.gpu import NVGPU
    gpu = NVGPU(self.kernel)
    try:
      allocation = gpu.memory.video(self.nbytes, cpu_access=True)
      pattern = np.arange(self.nbytes // 4, dtype=np.uint32) * np.uint32(2654435761)
      start = time.perf_counter()
      allocation.host.view(np.uint32)[:] = pattern
      written = time.perf_counter() - start
      start = time.perf_counter()
      back = allocation.host.view(np.uint32).copy()
      read = time.perf_counter() - start
      mismatches = int(np.count_nonzero(back != pattern))
      if mismatches: raise AssertionError(f"{mismatches} of {pattern.size} words read back differ "
                                          f"(first at word {int(np.argmax(back != pattern))})")
      gpu.memory.free(allocation)
      return {"address": hex(allocation.address), "bytes": self.nbytes, "cpu_write_gb_s": _rate(self.nbytes, written),
              "cpu_read_gb_s": _rate(self.nbytes, read)}
    finally:
      gpu.close()

  def empty_submission(self) -> dict[str, Any]:
    from rawgrad.drivers.nv.device import NVDevice
    from rawgrad.runtime.hcq import COMPUTE, COPY, HWQueue
    self.device = device = NVDevice("NV", self.kernel)
    signal = device.new_signal(0, "ladder signal")
    round_trips = {}
    for engine in (COMPUTE, COPY):
      times = []
      for _ in range(20):
        start = time.perf_counter()
        device.submit(HWQueue().signal(signal, signal.value + 1), engine)
        device.synchronize(WAIT_S)
        times.append(time.perf_counter() - start)
      round_trips[engine] = round(float(np.median(times)) * 1e6, 1)
    seen = time.monotonic_ns()
    stamp = signal.timestamp_ns
    return {"signal_value": signal.value, "submit_to_signal_us_median": round_trips,
            "gpu_timestamp_vs_host_ns": stamp - seen, "timeline": device.timeline_value}

  def copy_engine(self) -> dict[str, Any]:
    from rawgrad.runtime.hcq import COPY, HWQueue
    device = self.device
    source, back = device.host_memory(self.nbytes), device.host_memory(self.nbytes)
    video = device.allocator.alloc(self.nbytes)
    source.host.view(np.uint32)[:] = np.arange(self.nbytes // 4, dtype=np.uint32) ^ np.uint32(0x5A5A5A5A)
    back.host[:] = 0
    results = {}
    for direction, dest, src in (("host_to_device", video.address, source.address),
                                 ("device_to_host", back.address, video.address)):
      times = device.host_memory(2 * device.timestamp_bytes)
      queue = HWQueue().timestamp(times.address).copy(dest, src, self.nbytes)
      queue.timestamp(times.address + device.timestamp_bytes)
      start = time.perf_counter()
      device.submit(queue, COPY)
      device.synchronize(WAIT_S)
      wall = time.perf_counter() - start
      begin, end = device.read_timestamps(times)
      results[direction] = {"gpu_gb_s": _rate(self.nbytes, (end - begin) / 1e9), "wall_gb_s": _rate(self.nbytes, wall)}
    if not np.array_equal(back.host, source.host):
      differing = int(np.count_nonzero(back.host != source.host))
      raise AssertionError(f"{differing} of {self.nbytes} bytes differ after host -> device -> host")
    return {"bytes": self.nbytes, **results}

  def tensor_add(self) -> dict[str, Any]:
    from rawgrad import Tensor
    n = 1 << 20
    a, b = np.random.default_rng(0).random(n, dtype=np.float32), np.random.default_rng(1).random(n, dtype=np.float32)
    start = time.perf_counter()
    result = (Tensor(a, device="NV") + Tensor(b, device="NV")).numpy()
    seconds = time.perf_counter() - start
    if not np.array_equal(result, a + b):
      raise AssertionError(f"{int(np.count_nonzero(result != a + b))} of {n} sums are wrong")
    return {"elements": n, "seconds_with_compile": round(seconds, 3)}

  def ptx_add(self) -> dict[str, Any]:
    """a + b from hand-written PTX: the launch path without the compiler."""
    from rawgrad.drivers.nv.device import NVDevice
    if emulating(): return {"skipped": "the emulation runs registered programs, not hand-written machine code"}
    if self.device is None or self.device.fault is not None: self.device = NVDevice("NV", self.kernel)
    return self._launch_ptx_add(self.device)

  def _launch_ptx_add(self, device: Any) -> dict[str, Any]:
    from rawgrad.drivers.nv.device import NVProgram
    from rawgrad.runtime.compile import assemble_ptx
    cubin = assemble_ptx(ADD_PTX.format(arch=device.info.arch), device.info.arch)
    program = NVProgram(device, "ladder_add", cubin)
    n = 1 << 16
    a, b = np.full(n, 1.5, np.float32), np.arange(n, dtype=np.float32)
    memories = [device.allocator.alloc(4 * n) for _ in range(3)]
    device.copyin(memories[1], memoryview(a.view(np.uint8)))
    device.copyin(memories[2], memoryview(b.view(np.uint8)))
    arguments = [m.address for m in memories] + [n]
    start, end = device.launch(program, arguments, (n // 256, 1, 1), (256, 1, 1), timed=True)
    out = np.zeros(n, np.float32)
    device.copyout(memoryview(out.view(np.uint8)), memories[0])
    if not np.array_equal(out, a + b): raise AssertionError(f"{int(np.count_nonzero(out != a + b))} of {n} sums wrong")
    return {"elements": n, "registers": program.facts.registers, "kernel_us": round((end - start) / 1e3, 2)}

  def tensor_suite(self) -> dict[str, Any]:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    environment = {**os.environ, "DEVICE": "NV"}
    finished = subprocess.run([sys.executable, "-m", "pytest", "tests/tensor_ops", "-x", "-q"], cwd=root,
                              env=environment, capture_output=True, text=True, timeout=540)
    tail = (finished.stdout + finished.stderr).strip().splitlines()[-15:]
    if finished.returncode != 0: raise AssertionError("the suite failed:\n" + "\n".join(tail))
    return {"summary": tail[-1]}


def _rate(nbytes: int, seconds: float) -> float:
  return round(nbytes / max(seconds, 1e-9) / 1e9, 3)


def cuda_libraries_loaded() -> list[str]:
  with open("/proc/self/maps") as maps:
    return sorted({line.split()[-1] for line in maps if any(name in line for name in
                   ("libcuda.so", "libcudart", "libnvidia-ptxjitcompiler"))})


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", default="nv_ladder.json", help="where to write the JSON summary")
  parser.add_argument("--megabytes", type=int, default=256, help="size of the memory and copy rungs")
  parser.add_argument("--suite", action="store_true", help="also run the tensor test suite on NV (rung 6)")
  options = parser.parse_args()
  ladder = Ladder(options.megabytes)
  print(f"NV ladder on {platform.node()} ({'emulated GPU' if emulating() else 'real GPU'}), "
        f"{datetime.datetime.now().isoformat(timespec='seconds')}", flush=True)
  passed = ladder.rung("1", "version check and GPU name through RM", ladder.version_and_name)
  passed = passed and ladder.rung("2", f"allocate, map, write, read back {options.megabytes} MiB of video memory",
                                  ladder.video_memory)
  passed = passed and ladder.rung("3", "an empty GPFIFO submission whose semaphore the host sees",
                                  ladder.empty_submission)
  passed = passed and ladder.rung("4", f"copy engine host -> device -> host, {options.megabytes} MiB",
                                  ladder.copy_engine)
  if passed:
    ladder.rung("5b", "a + b from hand-written PTX through ptxas", ladder.ptx_add)
    passed = ladder.rung("5", "a + b through the Tensor API", ladder.tensor_add)
  if passed and options.suite: passed = ladder.rung("6", "tensor test suite on NV", ladder.tensor_suite, 600)
  loaded = cuda_libraries_loaded()
  print(f"CUDA libraries in this process: {', '.join(loaded) or 'none'}", flush=True)
  summary = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "host": platform.node(),
             "kernel": platform.release(), "python": platform.python_version(), "emulated": emulating(),
             "cuda_libraries_loaded": loaded, "rungs": ladder.results,
             "all_passed": all(r["ok"] for r in ladder.results) and not loaded}
  with open(options.out, "w") as file: json.dump(summary, file, indent=2, default=str)
  print(f"summary written to {options.out}", flush=True)
  sys.stdout.flush()
  os._exit(0 if summary["all_passed"] else 1)   # a rung still blocked in the driver must not hold the exit


if __name__ == "__main__":
  main()
