"""jit: run a function normally once, capture the kernels it launches on the second call, replay them afterwards.

Replay skips Python entirely: input buffers are swapped in by position, Variables rebound, and the captured
kernels run again on the same intermediate and output buffers. Anything the function does besides launching
kernels (printing, reading values on the host, changing Python state) does not happen on replay, so the capture
refuses what replay would silently get wrong, with an error that says what happened.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable

from rawgrad.compiler.ir import Ops, UOp
from rawgrad.runtime.device import Buffer, buffer_for


class JitError(RuntimeError):
  pass


@dataclass
class CapturedKernel:
  runner: Any                       # CompiledRunner
  buffers: list[Buffer]
  var_values: dict[UOp, int]
  dims: tuple = ()
  operations: tuple[str, ...] = ()


@dataclass
class Capture:
  kernels: list[CapturedKernel] = field(default_factory=list)


_capturing: list[Capture] = []


def capturing() -> Capture | None:
  return _capturing[-1] if _capturing else None


def refuse_host_read(what: str) -> None:
  """Called by host reads (numpy(), item(), tolist()): inside a capture the replay would skip them."""
  if _capturing:
    raise JitError(f"{what} inside a jit-captured function: replay would skip this host read and return stale "
                   "values; return the tensor from the function and read it outside")


@dataclass(frozen=True)
class _InputSpec:
  shape: tuple
  dtype: Any
  device: str


def _is_bound_variable(value: Any) -> bool:
  return isinstance(value, UOp) and value.op is Ops.BIND


def _split_arguments(args: tuple, kwargs: dict) -> tuple[list[Any], list[tuple[str, Any]], dict[str, int]]:
  """Tensor inputs (by position), other arguments (which must not change), and bound Variables' values by name."""
  from rawgrad.tensor import Tensor
  values = [(f"argument {i}", a) for i, a in enumerate(args)] + [(f"keyword {k}", v) for k, v in sorted(kwargs.items())]
  tensors = [v for _, v in values if isinstance(v, Tensor)]
  others = [(label, v) for label, v in values if not isinstance(v, Tensor) and not _is_bound_variable(v)]
  bound = {v.src[0].arg[0]: v.src[1].arg for _, v in values if _is_bound_variable(v)}
  return tensors, others, bound


def _tensors_in(value: Any) -> list[Any]:
  from rawgrad.tensor import Tensor
  if isinstance(value, Tensor): return [value]
  if isinstance(value, (list, tuple)): return [t for item in value for t in _tensors_in(item)]
  if isinstance(value, dict): return [t for item in value.values() for t in _tensors_in(item)]
  return []


def _buffer_of(tensor: Any) -> Buffer:
  from rawgrad.compiler.rangeify import buffer_base
  base = buffer_base(tensor.uop)
  if base is None: raise JitError(f"a jit input or output of shape {tensor.shape} is not a plain buffer after realize")
  return buffer_for(base)


class jit:
  """Decorator: `@jit def step(x, y): ...`. Tensor arguments are inputs (matched by position); returned tensors
  are outputs, realized before the function returns and backed by the same buffers on every replay."""

  def __init__(self, function: Callable[..., Any]):
    self.function = function
    self.calls = 0
    self.kernels: list[CapturedKernel] = []
    self.input_specs: list[_InputSpec] = []
    self.non_tensor_arguments: list[tuple[str, Any]] = []
    self.input_slots: list[list[tuple[int, int]]] = []   # per input: (kernel, buffer position) that read it
    self.result: Any = None
    self.graph: CommandGraph | None = None
    functools.update_wrapper(self, function)

  def __call__(self, *args: Any, **kwargs: Any) -> Any:
    if _capturing: raise JitError(f"jit {self.function.__name__} called while another jit function is capturing")
    tensors, others, bound = _split_arguments(args, kwargs)
    from rawgrad.tensor import Tensor
    if tensors: Tensor.realize(*tensors)
    self.calls += 1
    if self.calls == 1: return self._run_and_realize(args, kwargs)
    if self.calls == 2: return self._capture(args, kwargs, tensors, others)
    return self._replay(tensors, others, bound)

  def _run_and_realize(self, args: tuple, kwargs: dict) -> Any:
    from rawgrad.tensor import Tensor
    result = self.function(*args, **kwargs)
    if outputs := _tensors_in(result): Tensor.realize(*outputs)
    return result

  def _capture(self, args: tuple, kwargs: dict, tensors: list[Any], others: list[tuple[str, Any]]) -> Any:
    input_buffers = [_buffer_of(t) for t in tensors]
    if len({id(b) for b in input_buffers}) != len(input_buffers):
      raise JitError(f"jit {self.function.__name__}: the same buffer is passed as two inputs; replay could not "
                     "swap them independently")
    capture = Capture()
    _capturing.append(capture)
    try:
      result = self._run_and_realize(args, kwargs)
    finally:
      _capturing.pop()
    if not capture.kernels: raise JitError(f"jit {self.function.__name__}: the function launched no kernels")
    outputs = [_buffer_of(t) for t in _tensors_in(result)]
    aliased = [i for i, b in enumerate(input_buffers) if any(b is o for o in outputs)]
    if aliased: raise JitError(f"jit {self.function.__name__}: output aliases input {aliased[0]}")
    self.kernels, self.result = replan_temporaries(capture.kernels, input_buffers + outputs), result
    self.input_specs = [_InputSpec(t.shape, t.dtype, t.device) for t in tensors]
    self.non_tensor_arguments = others
    self.input_slots = [[(k, p) for k, kernel in enumerate(self.kernels) for p, b in enumerate(kernel.buffers)
                         if b is buffer] for buffer in input_buffers]
    return result

  def _check_inputs(self, tensors: list[Any], others: list[tuple[str, Any]]) -> None:
    name = self.function.__name__
    if len(tensors) != len(self.input_specs):
      raise JitError(f"jit {name}: captured with {len(self.input_specs)} tensor inputs, called with {len(tensors)}")
    for i, (tensor, spec) in enumerate(zip(tensors, self.input_specs)):
      got = _InputSpec(tensor.shape, tensor.dtype, tensor.device)
      if got != spec:
        raise JitError(f"jit {name}: input {i} was captured as shape {spec.shape} {spec.dtype!r} on {spec.device}, "
                       f"now it is shape {got.shape} {got.dtype!r} on {got.device}")
    if [label for label, _ in others] != [label for label, _ in self.non_tensor_arguments] or \
       any(not _same_value(a, b) for (_, a), (_, b) in zip(others, self.non_tensor_arguments)):
      raise JitError(f"jit {name}: a non-Tensor argument changed since the capture ({self.non_tensor_arguments} -> "
                     f"{others}); replay would ignore it")
    buffers = [_buffer_of(t) for t in tensors]
    if len({id(b) for b in buffers}) != len(buffers):
      raise JitError(f"jit {name}: the same buffer is passed as two inputs")

  def _replay(self, tensors: list[Any], others: list[tuple[str, Any]], bound: dict[str, int]) -> Any:
    self._check_inputs(tensors, others)
    if self.graph is None: self.graph = CommandGraph(self.kernels)
    for kernel_index, kernel in enumerate(self.kernels):
      for variable in kernel.var_values:
        if variable.arg[0] in bound:
          kernel.var_values[variable] = bound[variable.arg[0]]
          self.graph.patch_variable(kernel_index, variable, bound[variable.arg[0]])
    for tensor, slots in zip(tensors, self.input_slots):
      buffer = _buffer_of(tensor).ensure_allocated()
      for kernel_index, position in slots:
        self.kernels[kernel_index].buffers[position] = buffer
        self.graph.patch_buffer(kernel_index, position, buffer)
    self.graph.run()
    return self.result


def _tensor_buffers() -> set[int]:
  """Ids of the Buffers behind every BUFFER node a live tensor's graph holds."""
  from rawgrad.runtime.device import _buffers
  from rawgrad.tensor import all_tensors
  held: set[int] = set()
  for tensor in list(all_tensors):
    for node in tensor.uop.toposort:
      if node.op is Ops.BUFFER and (buffer := _buffers.get(node)) is not None: held.add(id(buffer))
  return held


def replan_temporaries(kernels: list[CapturedKernel], protected: list[Buffer]) -> list[CapturedKernel]:
  """Re-plan the capture's temporaries (arena views no input, output or live tensor holds) across the whole kernel
  list: reorder the kernels (dependencies kept, so replay computes the same bits) to shorten the temporaries'
  lifetimes, pack them by lifetime into one arena per device, and drop the arenas they lived in before (each
  schedule planned its own, by its own kernel order). Kept as captured when that would not use fewer bytes."""
  from rawgrad.dtype import dtypes
  from rawgrad.runtime.device import _buffers
  from rawgrad.runtime.memory import order_for_memory, plan_arena
  held = _tensor_buffers() | {id(b) for b in protected}
  views: dict[int, Buffer] = {id(b): b for k in kernels for b in k.buffers if b.base is not None}
  bases: dict[int, Buffer] = {id(b.base): b.base for b in views.values()}
  # an arena is re-planned only if nothing outside the capture's temporaries still holds one of its views
  shared = {id(b.base) for b in views.values() if id(b) in held or b.base.base is not None}
  internal = [b for b in views.values() if id(b.base) not in shared]
  if len(internal) < 2: return kernels
  sizes: dict[object, int] = {b: b.nbytes for b in internal}
  uses = [list(k.buffers) for k in kernels]
  # reordering is only safe when every arena view is re-placed: views of a kept arena may share bytes, and their
  # placements were only checked for the order the kernels were captured in
  if shared: order = list(range(len(kernels)))
  else: order = order_for_memory(uses, [k.buffers[0] if k.buffers else None for k in kernels], sizes)
  new_kernels = [kernels[i] for i in order]
  old_bytes = sum(bases[i].nbytes for i in {id(b.base) for b in internal})
  new_views: dict[int, Buffer] = {}
  new_bytes = 0
  for device in sorted({b.device for b in internal}):
    on_device = {b: n for b, n in sizes.items() if b.device == device}  # type: ignore[attr-defined]
    arena_bytes, placements = plan_arena([list(k.buffers) for k in new_kernels], on_device)
    new_bytes += arena_bytes
    arena = Buffer(device, arena_bytes, dtypes.uint8)
    for old, placement in placements.items():
      new_views[id(old)] = Buffer(device, old.size, old.dtype, base=arena, offset=placement.offset)  # type: ignore
  if new_bytes >= old_bytes: return kernels
  for kernel in new_kernels: kernel.buffers = [new_views.get(id(b), b) for b in kernel.buffers]
  for node, buffer in list(_buffers.items()):
    if id(buffer) in new_views: _buffers[node] = new_views[id(buffer)]
  return new_kernels


class CommandGraph:
  """A capture as one prebuilt command buffer: every kernel's EXEC over its own argument block, submitted at once.
  Replays patch the argument blocks in place (new input addresses, new variable values) and submit again."""

  def __init__(self, kernels: list[CapturedKernel]):
    from rawgrad.helpers import PROFILE
    from rawgrad.runtime.device import Device
    from rawgrad.runtime.hcq import HWQueue, timestamp_slots
    self.kernels = kernels
    self.device = Device[kernels[0].runner.device]
    self.kernargs = [k.runner.kernargs(k.buffers, k.var_values) for k in kernels]
    self.times = timestamp_slots(2 * len(kernels)) if PROFILE else None
    queue = HWQueue()
    for index, (kernel, kernargs) in enumerate(zip(kernels, self.kernargs)):
      if self.times is not None: queue.timestamp(self.times, 2 * index)
      queue.exec(kernel.runner.runtime, kernargs, kernel.runner.cores)
      if self.times is not None: queue.timestamp(self.times, 2 * index + 1)
    self.encoded = self.device.encode(queue)
    self.costs = [kernel.runner.cost(kernel.var_values) for kernel in kernels]

  def patch_buffer(self, kernel_index: int, position: int, buffer: Buffer) -> None:
    runner = self.kernels[kernel_index].runner
    if position in runner.buffer_slots:
      self.kernargs[kernel_index][runner.buffer_slots.index(position)] = buffer.address

  def patch_variable(self, kernel_index: int, variable: UOp, value: int) -> None:
    runner = self.kernels[kernel_index].runner
    if variable in runner.variables:
      self.kernargs[kernel_index][len(runner.buffer_slots) + runner.variables.index(variable)] = value
    self.costs[kernel_index] = runner.cost(self.kernels[kernel_index].var_values)

  def run(self) -> None:
    from rawgrad.helpers import GlobalCounters
    from rawgrad.runtime.hcq import HWQueue
    value = self.device.next_timeline_value()
    self.device.submit(self.encoded)
    HWQueue().signal(self.device.timeline_signal, value).submit(self.device)
    self.device.timeline_signal.wait(value)
    GlobalCounters.kernel_count += len(self.kernels)
    GlobalCounters.global_ops += sum(cost.flops for cost in self.costs)
    GlobalCounters.global_mem += sum(cost.bytes_moved for cost in self.costs)
    if self.times is not None: self._record_profile()

  def _record_profile(self) -> None:
    from rawgrad.runtime.profile import KernelEvent, record_kernel
    for index, (kernel, cost) in enumerate(zip(self.kernels, self.costs)):
      start, end = int(self.times[2 * index]), int(self.times[2 * index + 1])
      record_kernel(KernelEvent(kernel.runner.name, kernel.runner.device, start, end, kernel.dims, cost.flops,
                                cost.bytes_moved, kernel.operations))


def _same_value(a: Any, b: Any) -> bool:
  try:
    return bool(a == b) and type(a) is type(b)
  except Exception:  # noqa: BLE001 - objects whose comparison fails are treated as changed
    return False
