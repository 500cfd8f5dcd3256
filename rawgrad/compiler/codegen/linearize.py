"""Lower a kernel graph to a linear program: loops for RANGEs, registers for reductions, one instruction per UOp.

The program is a list of UOps in execution order. RANGE opens a loop and END(range) closes it; DEFINE_REG is an
accumulator reset to its identity where it appears; STORE/LOAD on a DEFINE_REG update and read it. Every other
instruction computes its op from earlier instructions. The same UOp may appear more than once (say, a load both
inside and after a loop): a use always refers to its most recent appearance, which the emitter guarantees is in
scope. Loop-invariant instructions stay where they are first used; LLVM hoists them.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from rawgrad.compiler.ir import GroupOp, Ops, UOp
from rawgrad.dtype import DType, dtypes


def reduce_identity(op: Ops, dtype: DType) -> int | float | bool:
  if op is Ops.ADD: return False if dtype == dtypes.bool else 0
  if op is Ops.MUL: return 1
  if op is Ops.MAX: return -math.inf if dtypes.is_float(dtype) else dtypes.min(dtype)
  raise ValueError(f"{op} is not a reduce op")


class _Linearizer:
  def __init__(self) -> None:
    self.program: list[UOp] = []
    self.scopes: list[dict[UOp, UOp]] = [{}]
    self.registers = itertools.count()

  def lookup(self, node: UOp) -> UOp | None:
    for scope in reversed(self.scopes):
      if node in scope: return scope[node]
    return None

  def emit(self, node: UOp) -> UOp:
    if (found := self.lookup(node)) is not None: return found
    if node.op is Ops.RANGE: raise ValueError(f"range r{node.arg[0]} is used outside its loop")
    if node.op is Ops.REDUCE: instruction = self.emit_reduce(node)
    else:
      sources = tuple(self.emit(source) for source in node.src)
      instruction = node if sources == node.src else node.replace(src=sources)
      self.program.append(instruction)
    self.scopes[-1][node] = instruction
    return instruction

  def open_loop(self, loop: UOp) -> None:
    end = self.emit(loop.src[0])
    instruction = loop if end is loop.src[0] else loop.replace(src=(end,))
    self.program.append(instruction)
    self.scopes.append({loop: instruction})

  def close_loop(self, loop: UOp) -> None:
    self.program.append(UOp(Ops.END, dtypes.void, (self.scopes[-1][loop],)))
    self.scopes.pop()

  def emit_reduce(self, node: UOp) -> UOp:
    body, loops = node.src[0], node.src[1:]
    register = UOp(Ops.DEFINE_REG, node.dtype, arg=(next(self.registers), reduce_identity(node.arg, node.dtype)))
    self.program.append(register)
    for loop in loops: self.open_loop(loop)
    value = self.emit(body)
    current = UOp(Ops.LOAD, node.dtype, (register,))
    updated = UOp(node.arg if node.dtype != dtypes.bool else Ops.OR, node.dtype, (current, value))
    self.program.extend([current, updated, UOp(Ops.STORE, dtypes.void, (register, updated))])
    for loop in reversed(loops): self.close_loop(loop)
    result = UOp(Ops.LOAD, node.dtype, (register,))
    self.program.append(result)
    return result


def output_loops(store: UOp) -> list[UOp]:
  """The loops around a store: every range it uses outside a reduction, outermost (lowest axis) first."""
  inner: set[UOp] = set()
  for node in store.toposort:
    if node.op is Ops.REDUCE: inner.update(node.src[1:])
  return sorted((n for n in store.toposort if n.op is Ops.RANGE and n not in inner), key=lambda r: r.arg[0])


def linearize(ast: UOp) -> list[UOp]:
  """The linear program of a kernel (a SINK of STOREs)."""
  linearizer = _Linearizer()
  for store in ast.src:
    loops = output_loops(store)
    for loop in loops: linearizer.open_loop(loop)
    linearizer.emit(store)
    for loop in reversed(loops): linearizer.close_loop(loop)
  return linearizer.program


@dataclass(frozen=True)
class KernelCost:
  flops: int
  bytes_moved: int


def estimate_cost(program: list[UOp], var_values: dict[UOp, int] | None = None) -> KernelCost:
  """ALU operations executed (each counted once per loop iteration) and bytes of global memory touched."""
  var_values = var_values or {}
  multipliers, flops, touched = [1], 0, {}
  for instruction in program:
    if instruction.op is Ops.RANGE: multipliers.append(multipliers[-1] * _evaluate_size(instruction.src[0], var_values))
    elif instruction.op is Ops.END: multipliers.pop()
    elif instruction.op in GroupOp.ALU and instruction.dtype != dtypes.index and not _is_index_math(instruction):
      flops += multipliers[-1]
    elif instruction.op is Ops.DEFINE_GLOBAL:
      touched[instruction.arg] = instruction.dtype.size * instruction.dtype.base.itemsize
  return KernelCost(flops, sum(touched.values()))


def _is_index_math(instruction: UOp) -> bool:
  return instruction.op in GroupOp.Comparison and any(s.dtype == dtypes.index for s in instruction.src)


def _evaluate_size(node: UOp, var_values: dict[UOp, int]) -> int:
  from rawgrad.compiler.symbolic import evaluate
  return int(evaluate(node, var_values))
