"""jit: run a function normally once, capture the kernels and copies it launches on the second call, replay them
afterwards.

Replay skips Python entirely: input buffers are swapped in by position, Variables rebound, and the captured kernels
run again on the same intermediate and output buffers as prebuilt queues (engine/jit.py). Anything the function does
besides launching kernels (printing, reading values on the host, changing Python state) does not happen on replay,
so the capture refuses what replay would silently get wrong, with an error that says what happened.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

from rawgrad.compiler.ir import Ops, UOp
from rawgrad.compiler.rangeify import buffer_base, is_random_draw
from rawgrad.engine.jit import (CapturedKernel, CommandGraph, JitError, capturing, replan_temporaries, start_capture,
                                stop_capture)
from rawgrad.runtime.device import Buffer, _buffers, buffer_for
from rawgrad.tensor import Tensor, live_tensors
from rawgrad.tensor_ops.random import DRAW_MASK, advance_draws, random_draws, random_seed
from rawgrad.tensor_ops.bounds import DeferredCheck, computed_count, computed_since, mark_computed

__all__ = ["jit", "JitError"]


@dataclass(frozen=True)
class _InputSpec:
  shape: tuple
  dtype: Any
  device: str


def _is_bound_variable(value: Any) -> bool:
  return isinstance(value, UOp) and value.op is Ops.BIND


def _split_arguments(args: tuple, kwargs: dict) -> tuple[list[Any], list[tuple[str, Any]], dict[str, int]]:
  """Tensor inputs (by position; those inside lists, tuples and dicts too), other arguments (which must not change;
  with their tensors as placeholders), and bound Variables' values by name."""
  values = [(f"argument {i}", a) for i, a in enumerate(args)] + [(f"keyword {k}", v) for k, v in sorted(kwargs.items())]
  tensors = [t for _, v in values for t in _tensors_in(v)]
  others = [(label, _without_tensors(v)) for label, v in values if not isinstance(v, Tensor) and
            not _is_bound_variable(v)]
  bound = {v.src[0].arg[0]: v.src[1].arg for _, v in values if _is_bound_variable(v)}
  return tensors, others, bound


def _tensors_in(value: Any) -> list[Any]:
  if isinstance(value, Tensor): return [value]
  if isinstance(value, (list, tuple)): return [t for item in value for t in _tensors_in(item)]
  if isinstance(value, dict): return [t for item in value.values() for t in _tensors_in(item)]
  return []


_A_TENSOR = "<a tensor input>"


def _without_tensors(value: Any) -> Any:
  """An argument with each tensor in it replaced by a placeholder: what must be the same on every call."""
  if isinstance(value, Tensor): return _A_TENSOR
  if isinstance(value, list): return [_without_tensors(item) for item in value]
  if isinstance(value, tuple): return tuple(_without_tensors(item) for item in value)
  if isinstance(value, dict): return {key: _without_tensors(item) for key, item in value.items()}
  return value


def _buffer_of(tensor: Any) -> Buffer:
  base = buffer_base(tensor.uop)
  if base is None: raise JitError(f"a jit input or output of shape {tensor.shape} is not a plain buffer after realize")
  return buffer_for(base)


class jit:
  """Decorator: `@jit def step(x, y): ...`. Tensor arguments (also inside lists, tuples and dicts) are inputs
  (matched by position); returned tensors are outputs, realized before the function returns and backed by the same
  buffers on every replay (an output passed back in is copied first). A new manual_seed captures again."""

  def __init__(self, function: Callable[..., Any]):
    self.function = function
    self.calls = 0
    self.items: list[Any] = []
    self.input_specs: list[_InputSpec] = []
    self.non_tensor_arguments: list[tuple[str, Any]] = []
    self.input_slots: list[list[tuple[int, int]]] = []   # per input: (item, buffer position) that read it
    self.result: Any = None
    self.output_buffers: dict[int, Buffer] = {}   # by id: the buffers the outputs are bound to on every replay
    self.draws = (0, 0)  # the generator's draw number when the capture began, and how many draws it made
    self.seed = 0        # the generator's seed when the capture began
    self.captured_draws: dict[tuple[int, UOp], int] = {}  # (item, variable): the draw number it had at the capture
    self.checks: list[DeferredCheck] = []   # the index checks the capture computes: read after every replay
    self.graph: CommandGraph | None = None
    functools.update_wrapper(self, function)

  @property
  def kernels(self) -> list[CapturedKernel]:
    """The captured kernel launches, in replay order."""
    return [item for item in self.items if isinstance(item, CapturedKernel)]

  def __call__(self, *args: Any, **kwargs: Any) -> Any:
    if capturing() is not None:
      raise JitError(f"jit {self.function.__name__} called while another jit function is capturing")
    tensors, others, bound = _split_arguments(args, kwargs)
    if tensors: Tensor.realize(*tensors)
    self.calls += 1
    if self.calls == 1: return self._run_and_realize(args, kwargs)
    # the capture's kernels hold the seed as a constant (the draw number is a parameter): a new seed captures again
    if self.calls > 2 and self.draws[1] and random_seed() != self.seed: self.calls = 2
    if self.calls == 2: return self._capture(args, kwargs, tensors, others)
    return self._replay(tensors, others, bound)

  def _run_and_realize(self, args: tuple, kwargs: dict) -> Any:
    result = self.function(*args, **kwargs)
    if outputs := _tensors_in(result): Tensor.realize(*outputs)
    return result

  def _capture(self, args: tuple, kwargs: dict, tensors: list[Any], others: list[tuple[str, Any]]) -> Any:
    input_buffers = [_buffer_of(t) for t in tensors]
    if len({id(b) for b in input_buffers}) != len(input_buffers):
      raise JitError(f"jit {self.function.__name__}: the same buffer is passed as two inputs; replay could not "
                     "swap them independently")
    checks_before = computed_count()
    self.seed, self.graph = random_seed(), None
    capture = start_capture()
    first_draw = random_draws()
    try:
      result = self._run_and_realize(args, kwargs)
    finally:
      stop_capture()
    self.draws = (first_draw, (random_draws() - first_draw) & DRAW_MASK)
    self.checks = computed_since(checks_before)
    if not capture.kernels: raise JitError(f"jit {self.function.__name__}: the function launched no kernels")
    outputs = [_buffer_of(t) for t in _tensors_in(result)]
    aliased = [i for i, b in enumerate(input_buffers) if any(b is o for o in outputs)]
    if aliased: raise JitError(f"jit {self.function.__name__}: output aliases input {aliased[0]}")
    protected = _tensor_buffers() | {id(b) for b in input_buffers + outputs}
    self.items, self.result = replan_temporaries(capture.items, protected), result
    self.output_buffers = {id(buffer): buffer for buffer in outputs}
    self.captured_draws = {(index, variable): value for index, item in enumerate(self.items)
                           for variable, value in getattr(item, "var_values", {}).items()
                           if is_random_draw(variable)}
    self.input_specs = [_InputSpec(t.shape, t.dtype, t.device) for t in tensors]
    self.non_tensor_arguments = others
    self.input_slots = [[(k, p) for k, item in enumerate(self.items) for p, b in enumerate(item.buffers)
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
    if self.graph is None: self.graph = CommandGraph(self.items)
    self.graph.wait_for_last_run()
    # random tensors drawn in the function draw new numbers on every replay, as eager calls would: the draws'
    # numbers move by how far the generator went since the capture
    first_draw, count = self.draws
    shift = (random_draws() - first_draw) & DRAW_MASK
    advance_draws(count)
    for index, item in enumerate(self.items):
      for variable in getattr(item, "var_values", {}):
        if variable.arg[0] in bound: value = bound[variable.arg[0]]
        elif (index, variable) in self.captured_draws:
          value = (self.captured_draws[index, variable] + shift) & DRAW_MASK
        else: continue
        item.var_values[variable] = value
        self.graph.patch_variable(index, variable, value)
    for tensor, slots in zip(tensors, self.input_slots):
      buffer = _buffer_of(tensor).ensure_allocated()
      if id(buffer) in self.output_buffers:
        # an earlier call's output passed back in (x = step(x)): the replay would overwrite it while reading it
        buffer = _buffer_of(tensor.clone().realize())
      for index, position in slots:
        if not hasattr(self.items[index], "dest"): self.items[index].buffers[position] = buffer
        self.graph.patch_buffer(index, position, buffer)
    self.graph.run()
    mark_computed(self.checks)
    return self.result


def _tensor_buffers() -> set[int]:
  """Ids of the Buffers behind every BUFFER node a live tensor's graph holds."""
  held: set[int] = set()
  for tensor in live_tensors():
    for node in tensor.uop.toposort:
      if node.op is Ops.BUFFER and (buffer := _buffers.get(node)) is not None: held.add(id(buffer))
  return held


def _same_value(a: Any, b: Any) -> bool:
  try:
    return bool(a == b) and type(a) is type(b)
  except Exception:  # noqa: BLE001 - objects whose comparison fails are treated as changed
    return False
