"""Running one kernel with chosen opts, slice by slice, outside the normal realize path."""
from __future__ import annotations


import numpy as np

from rawgrad.compiler.codegen.linearize import argument_table, kernel_parameters
from rawgrad.compiler.codegen.lower import lower_kernel
from rawgrad.compiler.codegen.opt.kernel import Opt
from rawgrad.compiler.ir import UOp
from rawgrad.compiler.rangeify import ScheduleItem, create_schedule
from rawgrad.compiler.render.llvmir import LLVMRenderer, kernel_symbol
from rawgrad.compiler.spec import verify_program
from rawgrad.drivers.cpu import CPUProgram
from rawgrad.runtime.compile import LLVMCompiler, compile_cached
from rawgrad.runtime.device import Buffer, Device, buffer_for
from rawgrad.engine.realize import item_device, run_schedule
from rawgrad.engine.runner import variable_slot
from rawgrad.tensor import Tensor

_compiler: LLVMCompiler | None = None


def compiled(item: ScheduleItem, opts: list[Opt] | None) -> tuple[CPUProgram, list[UOp]]:
  global _compiler
  if _compiler is None: _compiler = LLVMCompiler()
  lowered = lower_kernel(item.ast, opts)
  verify_program(item.ast.arg, lowered.program)
  source = LLVMRenderer().render(item.ast.arg, lowered.program)
  return CPUProgram(kernel_symbol(item.ast.arg), compile_cached(_compiler, source)), lowered.program


def last_kernel(tensor: Tensor, name_prefix: str | None = None) -> ScheduleItem:
  """The kernel that computes `tensor` (or the first of its schedule whose name starts with name_prefix); the kernels
  before it run now, the normal way, and are waited for: run_item calls the kernel from this thread, not after them
  on the device's queue."""
  items = create_schedule([tensor.uop]).items
  position = len(items) - 1 if name_prefix is None else \
    next(i for i, item in enumerate(items) if item.ast.arg.startswith(name_prefix))
  run_schedule(items[:position])
  for device in {item_device(item) for item in items[:position]}: Device[device].synchronize()
  return items[position]


def run_item(item: ScheduleItem, opts: list[Opt] | None, cores: int = 1, slices: list[int] | None = None,
             fill: float | None = None) -> np.ndarray:
  """Run the kernel with the opts as `cores` calls (slice 0, 1, ... of `cores`); the output buffer's values.
  `fill` preloads the output, to see which elements a partial run wrote."""
  program, instructions = compiled(item, opts)
  buffers = [buffer_for(node).ensure_allocated() for node in item.buffers]
  if fill is not None:
    output = buffers[0]
    output.copyin(memoryview(np.full(output.size, fill, dtype=output.numpy().dtype).view(np.uint8)))
  kernargs = argument_block(instructions, buffers, dict(item.var_values))
  for core in (range(cores) if slices is None else slices): program(kernargs.ctypes.data, core, cores)
  return buffers[0].numpy()


def argument_block(program: list[UOp], buffers: list[Buffer], var_values: dict[UOp, int]) -> np.ndarray:
  """The argument block a CPU program takes: its argument words, or for a program past the target's argument limit
  the address of its argument table, with the table after it in the same array (alive as long as the block)."""
  params, variables = kernel_parameters(program)
  words = [buffers[p.arg].address for p in params] + [variable_slot(v, var_values[v]) for v in variables]
  if argument_table(program) is None: return np.array(words + [0], dtype=np.uint64)
  block = np.array([0, 0, *words], dtype=np.uint64)
  block[0] = block.ctypes.data + 16
  return block
