"""The profiler (PROFILE=1): a timestamp before and after every kernel, written as a Chrome/Perfetto trace.

Each kernel event names its kernel, its launch dimensions, its GFLOPS and GB/s, and the tensor operations (with the
user's source file:line) it computes. The trace is written when the process exits; its path is printed.
"""
from __future__ import annotations

import atexit
import json
import os
import sys
import tempfile
from dataclasses import dataclass

from rawgrad.compiler.ir import UOp, origins
from rawgrad.helpers import getenv

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def record_origin(node: UOp) -> None:
  """Remember which Tensor operation, called from where in the user's code, made this node."""
  if node in origins: return
  frame, operation = sys._getframe(1), None
  while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR):
    # the outermost public operation names it best: conv2d rather than the mul inside it or the module around it
    name = frame.f_code.co_name
    if not name.startswith("_") and name not in ("forward", "train", "eval", "<lambda>"): operation = name
    frame = frame.f_back
  if frame is None: return
  origins[node] = f"{operation or node.op.name.lower()} at {os.path.basename(frame.f_code.co_filename)}:" \
                  f"{frame.f_lineno}"


@dataclass(frozen=True)
class KernelEvent:
  name: str
  device: str
  start_ns: int
  end_ns: int
  dims: tuple
  flops: int
  bytes_moved: int
  operations: tuple[str, ...]


events: list[KernelEvent] = []


_written = [0]  # how many events the last write_trace saw


def record_kernel(event: KernelEvent) -> None:
  if not events: atexit.register(_write_at_exit)
  events.append(event)


def _write_at_exit() -> None:
  if len(events) > _written[0]: write_trace()


def trace_json(kernel_events: list[KernelEvent]) -> dict:
  trace = []
  for event in kernel_events:
    seconds = max(event.end_ns - event.start_ns, 1) / 1e9
    trace.append({"name": event.name, "ph": "X", "pid": event.device, "tid": "queue 0", "cat": "kernel",
                  "ts": event.start_ns / 1e3, "dur": (event.end_ns - event.start_ns) / 1e3,
                  "args": {"dims": list(event.dims), "flops": event.flops, "bytes": event.bytes_moved,
                           "GFLOPS": round(event.flops / seconds / 1e9, 3),
                           "GB/s": round(event.bytes_moved / seconds / 1e9, 3),
                           "operations": list(event.operations)}})
  return {"traceEvents": trace, "displayTimeUnit": "ns"}


def trace_path() -> str:
  return getenv("PROFILE_PATH", os.path.join(tempfile.gettempdir(), f"rawgrad_profile_{os.getpid()}.json"))


def write_trace(path: str | None = None) -> str:
  """Write the recorded events as trace JSON (atomically) and return the path."""
  path = path or trace_path()
  temporary = f"{path}.tmp"
  with open(temporary, "w") as file:
    json.dump(trace_json(events), file)
  os.replace(temporary, path)
  _written[0] = len(events)
  print(f"rawgrad profile: {len(events)} kernel events written to {path}", file=sys.stderr)
  return path
