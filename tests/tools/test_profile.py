"""rawgrad/tools/profile.py: a trace summarized per kernel (calls, time, share, GFLOPS, GB/s, operations)."""
import json
import subprocess
import sys
from pathlib import Path

from rawgrad.tools.profile import summarize


def _event(name: str, us: float, flops: int, nbytes: int, operations: list[str], category: str = "kernel") -> dict:
  return {"ph": "X", "cat": category, "name": name, "dur": us,
          "args": {"flops": flops, "bytes": nbytes, "operations": operations}}


TRACE = {"traceEvents": [
  _event("r_64_64", 300.0, 3_000_000, 600_000, ["sum at a.py:1"]),
  _event("r_64_64", 100.0, 1_000_000, 200_000, ["sum at a.py:1", "exp at a.py:2"]),
  _event("E_1024", 100.0, 0, 1_000_000, ["add at b.py:3", "mul at b.py:4", "neg at b.py:5", "sub at b.py:6"]),
  _event("copy", 999.0, 0, 0, [], category="copy"),
  {"ph": "M", "name": "process_name"},
]}


def test_kernels_are_listed_by_total_time_with_their_rates() -> None:
  lines = summarize(TRACE)
  assert lines[0].split() == ["kernel", "calls", "total", "ms", "share", "GFLOPS", "GB/s", "operations"]
  first, second = lines[1].split(), lines[2].split()
  # r_64_64: 2 calls, 0.4 ms, 80% of 0.5 ms, 4e6 flops / 400 us = 10 GFLOPS, 8e5 bytes / 400 us = 2 GB/s
  assert first[:7] == ["r_64_64", "2", "0.400", "80.0%", "10.00", "2.00", "exp"]
  assert lines[1].endswith("exp at a.py:2, sum at a.py:1")
  assert second[:6] == ["E_1024", "1", "0.100", "20.0%", "0.00", "10.00"] and lines[2].endswith(" ...")
  assert len(lines) == 3  # the copy and the metadata event are not kernels


def test_top_limits_the_list_and_an_empty_trace_has_only_the_header() -> None:
  assert len(summarize(TRACE, top=1)) == 2
  assert len(summarize({"traceEvents": []})) == 1


def test_the_command_line_prints_the_summary(tmp_path: Path) -> None:
  trace = tmp_path / "trace.json"
  trace.write_text(json.dumps(TRACE))
  done = subprocess.run([sys.executable, "-m", "rawgrad.tools.profile", str(trace), "--top", "1"], capture_output=True,
                        text=True, timeout=60)
  assert done.returncode == 0 and done.stdout.splitlines()[1].startswith("r_64_64")
  assert len(done.stdout.splitlines()) == 2
