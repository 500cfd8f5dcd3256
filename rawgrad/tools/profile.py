"""Summarize a rawgrad trace: `python -m rawgrad.tools.profile TRACE [--top N]` prints the kernels that took the
most total time, with their call counts, GFLOPS, GB/s and the tensor operations they came from."""
from __future__ import annotations

import argparse
import json
from collections import defaultdict


def summarize(trace: dict, top: int = 20) -> list[str]:
  totals: dict[str, dict] = defaultdict(lambda: {"calls": 0, "us": 0.0, "flops": 0, "bytes": 0, "operations": set()})
  for event in trace.get("traceEvents", []):
    if event.get("ph") != "X" or event.get("cat") != "kernel": continue
    entry = totals[event["name"]]
    entry["calls"] += 1
    entry["us"] += event["dur"]
    entry["flops"] += event["args"]["flops"]
    entry["bytes"] += event["args"]["bytes"]
    entry["operations"].update(event["args"].get("operations", []))
  total_us = sum(entry["us"] for entry in totals.values()) or 1.0
  lines = [f"{'kernel':<36} {'calls':>6} {'total ms':>10} {'share':>6} {'GFLOPS':>9} {'GB/s':>8}  operations"]
  for name, entry in sorted(totals.items(), key=lambda item: -item[1]["us"])[:top]:
    seconds = max(entry["us"], 1e-3) / 1e6
    operations = ", ".join(sorted(entry["operations"])[:3]) + (" ..." if len(entry["operations"]) > 3 else "")
    lines.append(f"{name:<36} {entry['calls']:>6} {entry['us'] / 1e3:>10.3f} {entry['us'] / total_us:>6.1%} "
                 f"{entry['flops'] / seconds / 1e9:>9.2f} {entry['bytes'] / seconds / 1e9:>8.2f}  {operations}")
  return lines


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("trace", help="a trace JSON written with PROFILE=1")
  parser.add_argument("--top", type=int, default=20, help="how many kernels to list")
  arguments = parser.parse_args()
  with open(arguments.trace) as file:
    trace = json.load(file)
  print("\n".join(summarize(trace, arguments.top)))


if __name__ == "__main__":
  main()
