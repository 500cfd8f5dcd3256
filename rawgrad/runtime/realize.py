"""Run a schedule: lower each kernel to a compiled runner, execute it, count and report what it did."""
from __future__ import annotations

import sys
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from rawgrad.compiler.codegen.linearize import KernelCost, estimate_cost
from rawgrad.compiler.codegen.lower import LoweredKernel, lower_kernel
from rawgrad.compiler.codegen.opt.search import searched_opts
from rawgrad.compiler.ir import Ops, UOp
from rawgrad.compiler.spec import verify_program
from rawgrad.compiler.rangeify import ScheduleItem, buffer_base, create_schedule
from rawgrad.compiler.rewrite import substitute
from rawgrad.dtype import dtypes
from rawgrad.helpers import DEBUG, PROFILE, SPEC, GlobalCounters
from rawgrad.runtime.compile import compile_cached
from rawgrad.runtime.device import Buffer, Device, bind_buffer, buffer_for
from rawgrad.runtime.hcq import HWQueue, timestamp_slots
from rawgrad.runtime.jit import CapturedKernel, capturing, refuse_host_read
from rawgrad.compiler.gradient import autograd_origin
from rawgrad.runtime.memory import plan_arena
from rawgrad.runtime.profile import KernelEvent, record_kernel


@dataclass
class CompiledRunner:
  """A kernel ready to run on one device: its program, its source and the loaded machine code."""
  name: str
  device: str
  program: list[UOp]
  source: str
  runtime: object
  buffer_slots: tuple[int, ...]   # which of the schedule item's buffers the program uses, in argument order
  variables: tuple[UOp, ...]
  parallel: bool = False          # the kernel can be launched with cores > 1 (slice `core` of `cores` per call)
  cores: int = 1                  # slices of the parallel loop a launch runs on
  costs: dict = field(default_factory=dict)

  def cost(self, var_values: dict[UOp, int]) -> KernelCost:
    """Operations and bytes for these variable values; remembered, as every launch asks (walking the program each
    time would put the whole program on the launch path)."""
    key = tuple(sorted((v.arg[0], value) for v, value in var_values.items()))
    if key not in self.costs: self.costs[key] = estimate_cost(self.program, var_values)
    return self.costs[key]

  def kernargs(self, buffers: list[Buffer], var_values: dict[UOp, int]) -> np.ndarray:
    """The argument block: one 8-byte slot per used buffer address, then per variable value."""
    slots = [buffers[i].address for i in self.buffer_slots] + [var_values[v] for v in self.variables]
    return np.array(slots, dtype=np.uint64) if slots else np.zeros(1, dtype=np.uint64)

  def __call__(self, buffers: list[Buffer], var_values: dict[UOp, int]) -> tuple[int, int]:
    """Launch on the device's queue and wait; returns the device's start and end timestamps (ns)."""
    device = Device[self.device]
    times, value = timestamp_slots(2), device.next_timeline_value()
    queue = HWQueue().timestamp(times, 0).exec(self.runtime, self.kernargs(buffers, var_values), self.cores)
    queue.timestamp(times, 1).signal(device.timeline_signal, value).submit(device)
    device.timeline_signal.wait(value)
    return int(times[0]), int(times[1])


_runners: dict[tuple[str, UOp], CompiledRunner] = {}


def get_runner(device: str, ast: UOp) -> CompiledRunner:
  """The compiled kernel for an AST, from the in-memory cache (ASTs are hash-consed) or compiled now."""
  with KernelCompiler() as compiler:
    return compiler.runner(device, ast)


class KernelCompiler:
  """Compiles kernels on a second thread. `start` lowers and renders a kernel here and hands its source to the compiler
  thread: LLVM runs without holding the GIL, so compiling one kernel overlaps lowering the next (and scheduling the
  rest) on a second core. `runner` waits for a kernel's machine code and loads it."""

  def __init__(self) -> None:
    self.compiling: dict[tuple[str, UOp], tuple[LoweredKernel, str, Future[bytes]]] = {}
    self.thread: ThreadPoolExecutor | None = None  # started with the first kernel to compile: most realizes have none
    self.interval = 0.0

  def __enter__(self) -> KernelCompiler:
    return self

  def __exit__(self, *exc_info: object) -> None:
    if self.thread is None: return
    self.thread.shutdown(wait=True, cancel_futures=True)
    sys.setswitchinterval(self.interval)

  def _compiler_thread(self) -> ThreadPoolExecutor:
    if self.thread is None:
      self.thread = ThreadPoolExecutor(1, thread_name_prefix="rawgrad-compile")
      # the compiler thread needs the GIL back between its many short LLVM calls; at Python's default switch
      # interval (5 ms) it waits that long after each while this thread runs Python, and compiling takes half as
      # long again
      self.interval = sys.getswitchinterval()
      sys.setswitchinterval(min(self.interval, 50e-6))
    return self.thread

  def start(self, device: str, ast: UOp) -> None:
    key = (device, ast)
    if key in _runners or key in self.compiling: return
    lowered = lower_kernel(ast, searched_opts(ast, device))
    if DEBUG >= 3: print(f"kernel {ast.arg}: {list(lowered.opts)}")
    if SPEC: verify_program(ast.arg, lowered.program)
    compiled = Device[device]
    source = compiled.renderer.render(ast.arg, lowered.program)
    if DEBUG >= 4: print(source)
    self.compiling[key] = lowered, source, self._compiler_thread().submit(compile_cached, compiled.compiler, source)

  def runner(self, device: str, ast: UOp) -> CompiledRunner:
    key = (device, ast)
    if key in _runners: return _runners[key]
    self.start(device, ast)
    lowered, source, obj = self.compiling.pop(key)
    compiled, program = Device[device], lowered.program
    variables = tuple(sorted({u for u in program if u.op is Ops.DEFINE_VAR}, key=lambda u: u.arg[0]))
    buffer_slots = tuple(sorted({u.arg for u in program if u.op is Ops.DEFINE_GLOBAL}))
    runtime = compiled.program_class(_symbol(ast.arg), obj.result())
    _runners[key] = CompiledRunner(ast.arg, device, program, source, runtime, buffer_slots, variables,
                                   lowered.parallel, lowered.slices(compiled.cores))
    return _runners[key]


def _symbol(name: str) -> str:
  from rawgrad.compiler.render.llvmir import _symbol as llvm_symbol
  return llvm_symbol(name)


def run_schedule(items: list[ScheduleItem], compiler: KernelCompiler | None = None) -> None:
  """Run the kernels in order. Kernels the compiler has not started yet are all started first, so that running
  the first kernels overlaps compiling the last."""
  if compiler is None:
    with KernelCompiler() as compiler: return run_schedule(items, compiler)
  for item in items: compiler.start(_device_of(item), item.ast)
  for item in items:
    runner = compiler.runner(_device_of(item), item.ast)
    buffers = [buffer_for(node).ensure_allocated() for node in item.buffers]
    var_values = dict(item.var_values)
    if (capture := capturing()) is not None:
      capture.kernels.append(CapturedKernel(runner, buffers, var_values, item.dims, item.operations))
    start_ns, end_ns = runner(buffers, var_values)
    seconds = (end_ns - start_ns) / 1e9
    cost = runner.cost(var_values)
    if PROFILE:
      record_kernel(KernelEvent(runner.name, runner.device, start_ns, end_ns, item.dims, cost.flops,
                                cost.bytes_moved, item.operations))
    GlobalCounters.kernel_count += 1
    GlobalCounters.global_ops += cost.flops
    GlobalCounters.global_mem += cost.bytes_moved
    GlobalCounters.time_sum_s += seconds
    if DEBUG >= 2: print(_kernel_line(runner.name, seconds, cost))


def _device_of(item: ScheduleItem) -> str:
  return item.buffers[0].device  # the output BUFFER node's DEVICE (cached on the node)


def _kernel_line(name: str, seconds: float, cost: KernelCost) -> str:
  gflops = cost.flops / seconds / 1e9 if seconds else 0.0
  gbs = cost.bytes_moved / seconds / 1e9 if seconds else 0.0
  return (f"*** kernel {GlobalCounters.kernel_count:4d} {name:<32} {seconds * 1e6:9.2f} us "
          f"{gflops:9.2f} GFLOPS {gbs:8.2f} GB/s")


def realize_tensors(tensors: list) -> None:
  """Compute the given tensors into buffers; every live tensor that shared their graphs now reads the buffers."""
  from rawgrad.tensor import all_tensors
  outputs = [t.uop for t in tensors if buffer_base(t.uop) is None]
  if not outputs: return
  with KernelCompiler() as compiler:
    # each kernel starts compiling as soon as it is built, while the scheduler builds the next
    schedule = create_schedule(outputs, on_kernel=lambda item: compiler.start(_device_of(item), item.ast))
    becomes_map = schedule.becomes_map
    live = list(all_tensors)
    # A tensor whose graph was walked before (its toposort is cached: a realized tensor, typically) is checked on its
    # own, which costs nothing more; the others are walked together in one substitute, since they share most nodes.
    walked = [tensor for tensor in live if "toposort" in tensor.uop.__dict__]
    fresh = [tensor for tensor in live if "toposort" not in tensor.uop.__dict__]
    kept: set[UOp] = set()
    for tensor in walked:
      if any(node in becomes_map for node in tensor.uop.toposort): tensor.uop = substitute(tensor.uop, becomes_map)
      kept.update(node for node in tensor.uop.toposort if node.op is Ops.BUFFER)
    if fresh:
      graph = substitute(UOp.sink(*(tensor.uop for tensor in fresh)), becomes_map)
      for tensor, uop in zip(fresh, graph.src): tensor.uop = uop
      kept.update(node for node in graph.toposort if node.op is Ops.BUFFER)
    remember_for_autograd(becomes_map, kept, {t.uop for t in live if t.requires_grad})
    plan_temporaries(schedule.items, kept)
    run_schedule(schedule.items, compiler)


def remember_for_autograd(becomes_map: dict[UOp, UOp], kept: set[UOp], parameters: set[UOp]) -> None:
  """Realizing replaces a tensor's graph by its buffer; keep the graph for gradients that flow through it (as
  PyTorch keeps its autograd graph), so `loss.item(); loss.backward()` works. Only for buffers tensors keep (a
  temporary's storage is reused), never for assigns (that would chain every training step to the one before)."""
  for node, view in becomes_map.items():
    if node.op is Ops.ASSIGN or node in parameters or buffer_base(view) not in kept: continue
    if any(leaf in parameters or leaf in autograd_origin for leaf in node.toposort): autograd_origin[view] = node


def plan_temporaries(items: list[ScheduleItem], kept: set[UOp]) -> None:
  """Buffers a schedule creates and no tensor keeps are temporaries: pack them into one arena by lifetime."""
  temporaries = {item.buffers[0]: item.buffers[0].arg * item.buffers[0].dtype.itemsize for item in items
                 if item.buffers[0] not in kept and not buffer_for(item.buffers[0]).is_allocated}
  if len(temporaries) < 2: return
  arena_bytes, placements = plan_arena([list(item.buffers) for item in items], temporaries)
  device = items[0].buffers[0].src[1].arg
  arena = Buffer(device, arena_bytes, dtypes.uint8)
  for node, placement in placements.items():
    bind_buffer(node, Buffer(device, node.arg, node.dtype, base=arena, offset=placement.offset))


def read_numpy(tensor) -> np.ndarray:
  refuse_host_read("reading a tensor on the host (numpy/tolist/item)")
  if any(not isinstance(s, int) for s in tensor.shape):
    raise ValueError(f"cannot read a tensor with symbolic shape {tensor.shape} into numpy")
  if buffer_base(tensor.uop) is None: tensor.realize()
  base = buffer_base(tensor.uop)
  values = buffer_for(base).numpy()
  if tensor.dtype == dtypes.bfloat16: values = (values.astype(np.uint32) << 16).view(np.float32)
  return values.reshape(tensor.shape)
