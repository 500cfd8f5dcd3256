"""The hardware ladder (tools/nv_ladder.py) climbs the emulated H100 to the top: the script the real GPU runs works."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rawgrad.runtime.compile import CompileError, find_ptxas

ROOT = Path(__file__).resolve().parents[3]


def test_the_ladder_runs_on_the_emulation(tmp_path: Path) -> None:
  try:
    find_ptxas()
  except CompileError as missing:
    pytest.skip(str(missing))
  out = tmp_path / "ladder.json"
  environment = {**os.environ, "EMULATE": "1", "PYTHONPATH": str(ROOT)}
  finished = subprocess.run([sys.executable, str(ROOT / "tools" / "nv_ladder.py"), "--out", str(out), "--megabytes",
                             "8"], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=300)
  assert finished.returncode == 0, finished.stdout + finished.stderr
  summary = json.loads(out.read_text())
  rungs = {rung["rung"]: rung for rung in summary["rungs"]}
  assert all(rungs[number]["ok"] for number in ("1", "2", "3", "4", "5")), finished.stdout
  assert rungs["1"]["result"]["name"].startswith("NVIDIA H100") and rungs["4"]["result"]["bytes"] == 8 << 20
  assert summary["emulated"] and summary["cuda_libraries_loaded"] == [] and summary["all_passed"]
  assert finished.stdout.count("\nrung ") + finished.stdout.startswith("rung ") == len(summary["rungs"])
