"""Run a schedule: lower each kernel for its device, compile and load it once (a runner), launch it; run copies.

Launches return at once: the device runs them in order and the host waits only where it reads a buffer. With
DEBUG >= 2 or PROFILE each kernel is timed on the device (and waited for) and reported.
"""
from __future__ import annotations

import sys
from concurrent.futures import Future, ThreadPoolExecutor

from rawgrad.compiler.codegen.linearize import KernelCost
from rawgrad.compiler.codegen.lower import LoweredKernel, lower_kernel
from rawgrad.compiler.ir import Ops, UOp
from rawgrad.compiler.rangeify import ScheduleItem
from rawgrad.dtype import dtypes
from rawgrad.engine.jit import CapturedCopy, CapturedKernel, capturing
from rawgrad.engine.runner import CompiledRunner, build_runner, copy_buffer
from rawgrad.engine.search import searched_opts
from rawgrad.helpers import DEBUG, PROFILE, GlobalCounters, LRUCache
from rawgrad.runtime.compile import compile_cached, parallel_compiles, save_objects
from rawgrad.runtime.device import Buffer, Device, bind_buffer, buffer_for
from rawgrad.runtime.memory import plan_arena
from rawgrad.runtime.profile import KernelEvent, record_kernel

RUNNER_CACHE_SIZE = 4096  # compiled kernels kept loaded; the least recently used go first


_runners: LRUCache[tuple[str, UOp], CompiledRunner] = LRUCache(RUNNER_CACHE_SIZE)


def get_runner(device: str, ast: UOp) -> CompiledRunner:
  """The compiled kernel for an AST, from the in-memory cache (ASTs are hash-consed) or compiled now."""
  with KernelCompiler() as compiler:
    return compiler.runner(device, ast)


class KernelCompiler:
  """Compiles kernels on other threads. `start` lowers and renders a kernel here and hands its source to a compiler
  thread, which compiles it in a worker process (one thread per worker, see runtime/compile_worker.py) or in this
  process without holding the GIL: compiling overlaps lowering the next kernels (and scheduling the rest). `runner`
  waits for a kernel's machine code and loads it. The new machine code goes to the disk cache in one transaction at
  the end, not one (and one wait for the disk) per kernel."""

  def __init__(self) -> None:
    self.compiling: dict[tuple[str, UOp], tuple[LoweredKernel, str, Future[bytes]]] = {}
    self.thread: ThreadPoolExecutor | None = None  # started with the first kernel to compile: most realizes have none
    self.unsaved: dict[str, bytes] = {}  # new machine code by cache key, written to the disk cache on exit
    self.interval = 0.0

  def __enter__(self) -> KernelCompiler:
    return self

  def __exit__(self, *exc_info: object) -> None:
    if self.thread is None: return
    self.thread.shutdown(wait=True, cancel_futures=True)
    sys.setswitchinterval(self.interval)
    save_objects(self.unsaved)

  def _compiler_thread(self) -> ThreadPoolExecutor:
    if self.thread is None:
      self.thread = ThreadPoolExecutor(parallel_compiles(), thread_name_prefix="rawgrad-compile")
      # a compiler thread needs the GIL back between its many short LLVM calls; at Python's default switch
      # interval (5 ms) it waits that long after each while this thread runs Python, and compiling takes half as
      # long again
      self.interval = sys.getswitchinterval()
      sys.setswitchinterval(min(self.interval, 50e-6))
    return self.thread

  def start(self, device: str, ast: UOp) -> None:
    if ast.op is Ops.COPY: return
    key = (device, ast)
    if key in _runners or key in self.compiling: return
    compiled = Device[device]
    lowered = lower_kernel(ast, searched_opts(ast, device), compiled.target)
    if DEBUG >= 3: print(f"kernel {ast.arg}: {list(lowered.opts)}")
    source = compiled.renderer.render(ast.arg, lowered.program)
    if DEBUG >= 6: print(source)
    if DEBUG >= 7: print(compiled.compiler.assembly(source))
    compiling = self._compiler_thread().submit(compile_cached, compiled.compiler, source, self.unsaved)
    self.compiling[key] = lowered, source, compiling

  def runner(self, device: str, ast: UOp) -> CompiledRunner:
    key = (device, ast)
    if (runner := _runners.get(key)) is not None: return runner
    self.start(device, ast)
    lowered, source, lib = self.compiling.pop(key)
    return _runners.put(key, build_runner(device, ast, lowered, source, lib.result()))


def run_schedule(items: list[ScheduleItem], compiler: KernelCompiler | None = None, timed: bool | None = None) -> None:
  """Run the kernels and copies in order. Kernels the compiler has not started yet are all started first, so that
  running the first kernels overlaps compiling the last. Timed (with DEBUG >= 2 or PROFILE unless given), every
  kernel is waited for and its device time counted in GlobalCounters.time_sum_s."""
  if compiler is None:
    with KernelCompiler() as compiler: return run_schedule(items, compiler, timed)
  for item in items: compiler.start(item_device(item), item.ast)
  if timed is None: timed = DEBUG >= 2 or bool(PROFILE)
  capture = capturing()
  for item in items:
    buffers = [buffer_for(node).ensure_allocated() for node in item.buffers]
    if item.ast.op is Ops.COPY:
      if capture is not None: capture.items.append(CapturedCopy(buffers[0], buffers[1]))
      copy_buffer(buffers[0], buffers[1])
      continue
    runner = compiler.runner(item_device(item), item.ast)
    var_values = dict(item.var_values)
    if capture is not None:
      capture.items.append(CapturedKernel(runner, buffers, var_values, item.dims, item.operations, item.outputs))
    times = runner(buffers, var_values, timed)
    cost = runner.cost(var_values)
    GlobalCounters.kernel_count += 1
    GlobalCounters.global_ops += cost.flops
    GlobalCounters.global_mem += cost.bytes_moved
    if times is None: continue
    start_ns, end_ns = times
    GlobalCounters.time_sum_s += (end_ns - start_ns) / 1e9
    if PROFILE:
      record_kernel(KernelEvent(runner.name, runner.device, start_ns, end_ns, item.dims, cost.flops,
                                cost.bytes_moved, item.operations))
    if DEBUG >= 2: print(_kernel_line(runner.name, runner.device, (end_ns - start_ns) / 1e9, cost))


def item_device(item: ScheduleItem) -> str:
  return item.buffers[0].src[1].arg  # the output BUFFER node's DEVICE


def _kernel_line(name: str, device: str, seconds: float, cost: KernelCost) -> str:
  gflops = cost.flops / seconds / 1e9 if seconds else 0.0
  gbs = cost.bytes_moved / seconds / 1e9 if seconds else 0.0
  return (f"*** {device:<6} {GlobalCounters.kernel_count:4d} {name:<32} {seconds * 1e6:9.2f} us "
          f"{gflops:9.2f} GFLOPS {gbs:8.2f} GB/s")


def plan_temporaries(items: list[ScheduleItem], kept: set[UOp]) -> None:
  """Buffers a schedule creates and no tensor keeps are temporaries: pack them into one arena per device. (The
  buffers of one kernel are all in use at once: only a schedule of several kernels can share memory.)"""
  if len(items) < 2: return
  temporaries = {output: output.arg * output.dtype.itemsize for item in items for output in item.buffers[:item.outputs]
                 if output not in kept and not buffer_for(output).is_allocated}
  for device in sorted({node.src[1].arg for node in temporaries}):
    on_device = {node: nbytes for node, nbytes in temporaries.items() if node.src[1].arg == device}
    if len(on_device) < 2: continue
    arena_bytes, placements = plan_arena([list(item.buffers) for item in items], on_device)
    arena = Buffer(device, arena_bytes, dtypes.uint8)
    for node, placement in placements.items():
      bind_buffer(node, Buffer(device, node.arg, node.dtype, base=arena, offset=placement.offset))
