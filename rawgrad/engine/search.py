"""BEAM search: time candidate opt lists of a kernel on the device, keep the fastest few, extend them by one opt,
repeat; the winner is cached on disk per kernel.

Candidates run in this process on scratch buffers (random inputs), never on the user's data, so kernels that update a
buffer in place can be timed freely. Guards: a candidate whose first run is far slower than the best so far is not
run again, one whose output differs from the heuristics' is dropped, and the whole search stops after a time budget.
The heuristics' opts always compete, so a search never ends slower than them.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import sqlite3
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rawgrad.compiler.codegen.lower import LoweredKernel, lower_kernel
from rawgrad.compiler.codegen.opt.heuristic import hand_coded_opts
from rawgrad.compiler.codegen.opt.kernel import Opt, OptError, OptOps, apply_opt, loop_axes, reduce_ranges
from rawgrad.compiler.ir import Ops, UOp
from rawgrad.compiler.rangeify import is_value_parameter
from rawgrad.dtype import dtypes
from rawgrad.engine.runner import build_runner
from rawgrad.helpers import DEBUG, ContextVar, getenv
from rawgrad.runtime.compile import cache_path
from rawgrad.runtime.device import Buffer, Device

BEAM = ContextVar("BEAM", 0)               # beam width; 0: the heuristics choose the opts

BUDGET_S = getenv("BEAM_BUDGET", 120.0)   # the whole search of one kernel
MAX_STEPS = 8                             # opts added to the empty list at most
SLOWER_FACTOR = 4.0                       # a first run this much slower than the best is not repeated
RUNS = 3                                  # timed runs of a promising candidate; the fastest counts
UPCAST_AMOUNTS, UNROLL_AMOUNTS, TILE_AMOUNTS = (4, 8, 16), (2, 3, 4, 8), (2, 4, 8, 16, 32)
GROUP_AMOUNTS = (4, 16, 64)                # chunks of a reduction split across cores
ACCUMULATE_AMOUNTS = (8, 32, 128)          # iterations of a sum's loop per block added to the output


def actions(ast: UOp) -> list[Opt]:
  """Every opt worth trying next on this kernel (many will not apply; apply_opt says which)."""
  axes = loop_axes(ast)
  inner = reduce_ranges(ast)
  found: list[Opt] = []
  for axis, r in enumerate(axes):
    found += [Opt(OptOps.UPCAST, axis, amount) for amount in UPCAST_AMOUNTS]
    found += [Opt(OptOps.UNROLL, axis, amount) for amount in UNROLL_AMOUNTS]
    found += [Opt(OptOps.TILE, axis, amount) for amount in TILE_AMOUNTS]
    if r not in inner: found.append(Opt(OptOps.PARALLEL, axis))
    if r in inner: found += [Opt(OptOps.GROUP, axis, amount) for amount in GROUP_AMOUNTS]
    if r in inner: found += [Opt(OptOps.ACCUMULATE, axis, amount) for amount in ACCUMULATE_AMOUNTS]
    found += [Opt(OptOps.SWAP, axis, other) for other in range(axis + 1, len(axes))]
    parameters = sorted({node.arg for node in ast.toposort if node.op is Ops.DEFINE_GLOBAL and node.arg != 0})
    if r not in inner: found += [Opt(OptOps.LOCAL, axis, parameter) for parameter in parameters]
  found.append(Opt(OptOps.STREAM, 0))
  return found


@dataclass
class Candidate:
  opts: tuple[Opt, ...]
  ast: UOp
  seconds: float = math.inf


class _Timer:
  """Compiles candidates for a device and times them on scratch buffers shaped like the kernel's parameters."""

  def __init__(self, ast: UOp, device: str, var_values: dict[UOp, int]):
    self.ast, self.device, self.var_values = ast, device, var_values
    self.compiled = Device[device]
    parameters = sorted({node for node in ast.toposort if node.op is Ops.DEFINE_GLOBAL}, key=lambda node: node.arg)
    self.buffers = [_scratch_buffer(device, node, seed) for seed, node in enumerate(parameters)]
    self.reference: np.ndarray | None = None
    # a kernel that adds to what its output holds (a scatter) starts every run from the same output
    self.start = self.buffers[0].numpy() if any(node.op is Ops.LOAD and node.src[0].src[0] is parameters[0]
                                                for node in ast.toposort) else None

  def time(self, opts: tuple[Opt, ...], best: float) -> float:
    """The candidate's fastest run in seconds (inf when it does not compile, is far too slow, or is wrong)."""
    try:
      runner = self.runner(lower_kernel(self.ast, opts, self.compiled.target))
    except Exception as error:  # noqa: BLE001 - a candidate the compiler rejects is simply not a candidate
      if DEBUG >= 4: print(f"BEAM: {list(opts)} does not compile: {error}")
      return math.inf
    seconds = math.inf
    for run in range(RUNS):
      if self.start is not None: self.buffers[0].copyin(memoryview(self.start.view(np.uint8)))
      start_ns, end_ns = runner(self.buffers, self.var_values, timed=True)
      seconds = min(seconds, (end_ns - start_ns) / 1e9)
      if run == 0 and seconds > SLOWER_FACTOR * best: return seconds
    output = self.buffers[0].numpy()
    if self.reference is None: self.reference = output
    elif not _close(output, self.reference):
      warnings.warn(f"BEAM: opts {list(opts)} of {self.ast.arg} compute different values; not used", RuntimeWarning,
                    stacklevel=2)
      return math.inf
    return seconds

  def runner(self, lowered: LoweredKernel) -> Any:
    return build_runner(self.device, self.ast, lowered)


def _scratch_buffer(device: str, node: UOp, seed: int) -> Any:
  dtype, size = node.dtype.base, node.dtype.size
  buffer = Buffer(device, size, dtype)
  rng = np.random.default_rng(seed)
  # floats get values, everything else zeros: an integer input may be an index, and zeros are always in range
  values = rng.uniform(-1, 1, size) if dtypes.is_float(dtype) else np.zeros(size)
  data = values.astype(dtypes.to_numpy(dtype)) if dtype != dtypes.bfloat16 else values.astype(np.float32)
  if dtype == dtypes.bfloat16: data = (data.view(np.uint32) >> 16).astype(np.uint16)
  buffer.ensure_allocated().copyin(memoryview(np.ascontiguousarray(data).view(np.uint8)))
  return buffer


def _close(a: np.ndarray, b: np.ndarray) -> bool:
  if a.dtype.kind in "fc": return bool(np.allclose(a, b, rtol=1e-2, atol=1e-3, equal_nan=True))
  return bool(np.array_equal(a, b))


def beam_search(ast: UOp, device: str, width: int, var_values: dict[UOp, int] | None = None) -> tuple[Opt, ...]:
  """The fastest opts found for the kernel by a beam of `width`, from the disk cache when searched before."""
  key = _cache_key(ast, device, width)
  if (cached := _cache_get(key)) is not None: return cached
  started = time.perf_counter()
  timer = _Timer(ast, device, var_values or {})
  heuristic = tuple(hand_coded_opts(ast, Device[device].target))
  best = Candidate(heuristic, ast, timer.time(heuristic, math.inf))
  beam = [Candidate((), ast, timer.time((), best.seconds))]
  seen: set[UOp] = {candidate.ast for candidate in beam}
  for step in range(MAX_STEPS):
    grown: list[Candidate] = []
    for parent in beam:
      for opt in actions(parent.ast):
        if time.perf_counter() - started > BUDGET_S: break
        try:
          child_ast = apply_opt(parent.ast, opt)
        except OptError:
          continue
        if child_ast in seen: continue
        seen.add(child_ast)
        child = Candidate(parent.opts + (opt,), child_ast)
        child.seconds = timer.time(child.opts, min([best.seconds] + [c.seconds for c in grown]))
        grown.append(child)
    grown = sorted((c for c in grown if math.isfinite(c.seconds)), key=lambda c: c.seconds)[:width]
    if DEBUG >= 2 and grown:
      print(f"BEAM {ast.arg} step {step}: {grown[0].seconds * 1e6:.1f} us {list(grown[0].opts)}")
    if not grown or grown[0].seconds >= min(c.seconds for c in beam): break
    beam = grown
    if beam[0].seconds < best.seconds: best = beam[0]
    if time.perf_counter() - started > BUDGET_S: break
  if DEBUG >= 1:
    print(f"BEAM {ast.arg}: {best.seconds * 1e6:.1f} us with {list(best.opts)} ({time.perf_counter() - started:.1f} s)")
  _cache_put(key, best.opts)
  return best.opts


# *** the disk cache of winners, next to the compile cache ***

def _cache_file() -> Path | None:
  path = cache_path()
  return None if path is None else path.parent / "beam_cache.db"


def _cache_key(ast: UOp, device: str, width: int) -> str:
  compiler = getattr(Device[device], "compiler", None)
  parts = (repr(ast), device, str(width), getattr(compiler, "cache_key", ""), "search v1")
  return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _connect(path: Path) -> sqlite3.Connection:
  path.parent.mkdir(parents=True, exist_ok=True)
  connection = sqlite3.connect(path, timeout=30)
  connection.execute("CREATE TABLE IF NOT EXISTS winners (key TEXT PRIMARY KEY, opts TEXT NOT NULL)")
  return connection


def _cache_get(key: str) -> tuple[Opt, ...] | None:
  if (path := _cache_file()) is None: return None
  try:
    with contextlib.closing(_connect(path)) as connection:
      row = connection.execute("SELECT opts FROM winners WHERE key = ?", (key,)).fetchone()
  except (sqlite3.Error, OSError) as error:
    warnings.warn(f"BEAM cache {path} is unusable ({error}); searching again", RuntimeWarning, stacklevel=3)
    return None
  return None if row is None else tuple(Opt(OptOps[op], axis, amount) for op, axis, amount in json.loads(row[0]))


def _cache_put(key: str, opts: tuple[Opt, ...]) -> None:
  if (path := _cache_file()) is None: return
  try:
    with contextlib.closing(_connect(path)) as connection, connection:
      connection.execute("INSERT OR REPLACE INTO winners (key, opts) VALUES (?, ?)",
                         (key, json.dumps([[opt.op.name, opt.axis, opt.amount] for opt in opts])))
  except (sqlite3.Error, OSError) as error:
    warnings.warn(f"BEAM cache {path} is unusable ({error}); the winner is not kept", RuntimeWarning, stacklevel=3)


def searched_opts(ast: UOp, device: str) -> tuple[Opt, ...] | None:
  """With BEAM=n, the searched opts of a kernel (kernels with symbolic sizes keep the heuristics: their timing would
  depend on values not known yet); None means the heuristics' choice. Value parameters (constants, random draws)
  are timed with a stand-in value: the code is the same for every value."""
  variables = [node for node in ast.toposort if node.op is Ops.DEFINE_VAR]
  if BEAM.value < 1 or not all(is_value_parameter(v) for v in variables): return None
  return beam_search(ast, device, BEAM.value, {v: 1 for v in variables})
