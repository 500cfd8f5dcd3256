"""A compiled kernel ready to launch on its device (a runner), the one path from a lowered kernel to one, and copies
between buffers."""
from __future__ import annotations

import functools
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rawgrad.compiler.codegen.linearize import KernelCost, estimate_cost
from rawgrad.compiler.codegen.lower import LoweredKernel
from rawgrad.compiler.ir import UOp
from rawgrad.compiler.rangeify import is_value_parameter
from rawgrad.compiler.render.llvmir import kernel_symbol
from rawgrad.compiler.symbolic import evaluate
from rawgrad.dtype import dtypes
from rawgrad.helpers import GlobalCounters, LRUCache
from rawgrad.runtime.compile import compile_cached
from rawgrad.runtime.device import Buffer, Device
from rawgrad.runtime.hcq import COPY, HWQueue
from rawgrad.compiler.codegen.linearize import argument_table, kernel_parameters

COSTS_PER_RUNNER = 1024  # variable values whose cost a runner remembers; the least recently used go first


@dataclass
class CompiledRunner:
  """A kernel ready to run on one device: its lowered program, its source and the loaded program."""
  name: str
  device: str
  lowered: LoweredKernel
  source: str
  kernel: Any                     # the device's program_class instance (its .device launches it)
  buffer_slots: tuple[int, ...]   # which of the schedule item's buffers the program uses, in argument order
  variables: tuple[UOp, ...]
  cores: int = 1                  # CPU: slices of the parallel loop a launch runs
  costs: LRUCache[tuple, KernelCost] = field(default_factory=lambda: LRUCache(COSTS_PER_RUNNER))
  table: ArgumentTable | None = None  # the argument table launches use (not a jit capture's)

  @property
  def program(self) -> list[UOp]:
    return self.lowered.program

  @functools.cached_property
  def has_table(self) -> bool:
    """The program reads its argument words from an argument table."""
    return argument_table(self.program) is not None

  @functools.cached_property
  def size_variables(self) -> tuple[UOp, ...]:
    """The variables that are sizes (the cost depends on them), not values (constants, random draws)."""
    return tuple(v for v in self.variables if not is_value_parameter(v))

  def cost(self, var_values: dict[UOp, int]) -> KernelCost:
    """Operations and bytes for these variable values; remembered, as every launch asks (walking the program each
    time would put the whole program on the launch path)."""
    key = tuple(var_values[v] for v in self.size_variables)
    if (cost := self.costs.get(key)) is None: cost = self.costs.put(key, estimate_cost(self.program, var_values))
    return cost

  def args(self, buffers: list[Buffer], var_values: dict[UOp, int]) -> list[int]:
    """The argument words (8 bytes each): the addresses of the buffers the program uses, then variable values. They
    are the argument block, or the argument table of a program that has one."""
    return [buffers[i].address for i in self.buffer_slots] + [variable_slot(v, var_values[v]) for v in self.variables]

  @functools.cached_property
  def fixed_dims(self) -> tuple[tuple[int, int, int], tuple[int, int, int]] | None:
    """The launch dimensions where no variable changes them (every CPU kernel: its slices are fixed)."""
    if not self.lowered.target.is_gpu: return (self.cores, 1, 1), (1, 1, 1)
    return None if self.variables else self._evaluated_dims({})

  def launch_dims(self, var_values: dict[UOp, int]) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """Blocks and threads per block (CPU: slices of the parallel loop, one thread)."""
    if (dims := self.fixed_dims) is not None: return dims
    return self._evaluated_dims(var_values)

  def _evaluated_dims(self, var_values: dict[UOp, int]) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    values = {v: var_values[v] for v in self.variables}
    size = lambda exprs: tuple(int(evaluate(e, values)) for e in exprs)  # noqa: E731
    return size(self.lowered.global_size), size(self.lowered.local_size)  # type: ignore[return-value]

  def __call__(self, buffers: list[Buffer], var_values: dict[UOp, int], timed: bool = False) -> tuple[int, int] | None:
    """Launch on the device's compute engine; with `timed`, wait and return the device's start and end times (ns)."""
    global_size, local_size = self.launch_dims(var_values)
    args = self.args(buffers, var_values)
    if self.has_table:
      if self.table is None: self.table = ArgumentTable(self.device, len(args))
      self.table.write(args)
      args = [self.table.address]
    return self.kernel.device.launch(self.kernel, args, global_size, local_size, timed)


class ArgumentTable:
  """The argument words of a kernel that takes more than its target's kernel-argument limit, in device memory; the
  kernel's argument block holds the table's address alone. `words` may be patched in place (a jit replay binding
  new buffers or values); `write` copies them to the device only when they changed since the last write, in order
  after everything submitted before, so launches already queued still read the words they were launched with."""

  def __init__(self, device: str, words: int):
    self.buffer = Buffer(device, words, dtypes.uint64).ensure_allocated()
    self.words = np.zeros(words, np.uint64)
    self.written: np.ndarray | None = None   # the words the device memory holds

  @property
  def address(self) -> int:
    return self.buffer.address

  def write(self, words: list[int] | None = None) -> None:
    if words is not None: self.words[:] = [word & (2**64 - 1) for word in words]
    if self.written is not None and np.array_equal(self.words, self.written): return
    self.buffer.copyin(memoryview(self.words.view(np.uint8)))
    self.written = self.words.copy()


def variable_slot(variable: UOp, value: int | float) -> int:
  """A variable's 8-byte argument slot: an integer as itself, a float (a parameterized constant) as float64 bits."""
  if variable.dtype == dtypes.float64: return struct.unpack("<Q", struct.pack("<d", value))[0]
  return value


def build_runner(device: str, ast: UOp, lowered: LoweredKernel, source: str | None = None,
                 lib: bytes | None = None) -> CompiledRunner:
  """Render (unless given the source), compile (through the disk cache, unless given the machine code) and load a
  lowered kernel: the one path every kernel takes."""
  GlobalCounters.kernels_built += 1
  compiled = Device[device]
  if source is None: source = compiled.renderer.render(ast.arg, lowered.program)
  if lib is None: lib = compile_cached(compiled.compiler, source)
  params, variables = kernel_parameters(lowered.program)
  kernel = compiled.program_class(compiled, kernel_symbol(ast.arg), lib)
  cores = lowered.slices(getattr(compiled, "cores", 1))
  return CompiledRunner(ast.arg, device, lowered, source, kernel, tuple(p.arg for p in params), tuple(variables),
                        cores)


def copy_buffer(dest: Buffer, src: Buffer) -> None:
  """Copy a buffer's bytes: on the device's copy engine within a device, through the host between devices."""
  if dest.nbytes != src.nbytes: raise ValueError(f"copy of a {src.nbytes}-byte buffer into a {dest.nbytes}-byte one")
  if dest.device == src.device:
    Device[dest.device].submit(HWQueue().copy(dest.address, src.address, src.nbytes), COPY)
    return
  staging = np.empty(src.nbytes, np.uint8)
  Device[src.device].copyout(memoryview(staging), src.raw)
  dest.copyin(memoryview(staging))
