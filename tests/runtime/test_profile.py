"""The profiler writes a valid trace with one event per launched kernel, naming its operations."""
import json
import os
import subprocess
import sys


def test_trace_has_one_event_per_kernel(tmp_path) -> None:
  trace = tmp_path / "trace.json"
  script = (
    "import numpy as np\n"
    "from rawgrad import Tensor, GlobalCounters, jit\n"
    "x = Tensor(np.arange(64, dtype=np.float32).reshape(8, 8))\n"
    "y = (x @ x).relu().softmax(1)\n"
    "GlobalCounters.reset()\n"
    "y.realize()\n"
    "step = jit(lambda t: (t * 2).sum(0))\n"
    "for _ in range(3): step(x)\n"
    "print(GlobalCounters.kernel_count)\n")
  env = dict(os.environ, PROFILE="1", PROFILE_PATH=str(trace))
  done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
  assert done.returncode == 0, done.stderr
  launched = int(done.stdout.strip().splitlines()[-1])
  assert str(trace) in done.stderr
  events = json.loads(trace.read_text())["traceEvents"]
  kernels = [e for e in events if e.get("cat") == "kernel"]
  assert len(kernels) == launched
  assert all(e["dur"] >= 0 and e["name"] and isinstance(e["args"]["dims"], list) for e in kernels)
  assert any("softmax at <string>:4" in op for e in kernels for op in e["args"]["operations"])
  summary = subprocess.run([sys.executable, "-m", "rawgrad.tools.profile", str(trace)], capture_output=True, text=True,
                           timeout=60)
  assert summary.returncode == 0 and "GFLOPS" in summary.stdout
