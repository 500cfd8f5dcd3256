"""The GPU program interpreter: runs a linear program (codegen's output for a GPU target) with numpy.

Every thread of a launch runs in lockstep: a value is a numpy array with one row per thread (and a column per vector
lane), or a 0-d array where every thread holds the same value. A SPECIAL is the thread's grid or block index, loops
(RANGE ... END) run once for all threads (their bounds must be the same for every thread), a gated access touches
memory only where its gate holds (a gated load reads 0), shared memory (DEFINE_LOCAL) is one array per block, and a
BARRIER needs nothing more: in lockstep every thread has already done everything before it. Threads run a few
thousand blocks at a time, so memory stays bounded on large grids.

Arithmetic follows the generated code: integers wrap, integer division and remainder truncate toward zero, floats
round to their dtype after every operation (bfloat16 too; a fused multiply-add rounds once), casts from float to int
truncate. Device memory is reached through `memory(address, nbytes)`, which returns a writable uint8 view.

The emulated GPUs of the drivers (drivers/nv/emulated.py, drivers/amd/emulated.py) run kernels with it, and the
tests run GPU-lowered kernels with it on machines without a GPU.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable

import numpy as np

from rawgrad.compiler.codegen.linearize import argument_table, kernel_parameters
from rawgrad.compiler.ir import Ops, UOp
from rawgrad.dtype import DType, PtrDType, dtypes

Memory = Callable[[int, int], np.ndarray]   # (device address, bytes) -> a writable uint8 view
THREADS_PER_CHUNK = 1 << 16                 # threads run together at most


class InterpreterError(RuntimeError):
  """The program does something a GPU could not do (divergent loop bounds, an unknown op, memory out of range)."""


def numpy_dtype(dtype: DType) -> np.dtype:
  """How the interpreter holds values of a dtype: bfloat16 as float32 (rounded after every operation)."""
  if dtype.scalar == dtypes.bfloat16: return np.dtype(np.float32)
  return dtypes.to_numpy(dtype.scalar)


def round_bfloat16(values: np.ndarray) -> np.ndarray:
  """float32 values rounded to the nearest bfloat16 (ties to even), still as float32."""
  bits = np.asarray(values, np.float32).view(np.uint32)
  rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
  return np.where(np.isnan(values), values, rounded.view(np.float32))


@dataclass
class _Pointer:
  """An INDEX: which memory (a typed array, with a block axis for shared memory) and the element per thread."""
  array: np.ndarray
  index: np.ndarray
  gate: np.ndarray | None
  shared: bool


def run_program(program: list[UOp], global_size: tuple[int, ...], local_size: tuple[int, ...], args: list[int],
                memory: Memory) -> None:
  """Run the program over a grid of global_size blocks of local_size threads; args are the argument block's slots
  (for a program with an argument table, the table's address)."""
  params, variables = kernel_parameters(program)
  globals_: dict[UOp, np.ndarray] = {}
  if (table := argument_table(program)) is not None:
    if not args: raise InterpreterError("the program takes the address of its argument table, got no arguments")
    globals_[table] = _global_view(table, args[0], memory)
    args = [int(word) for word in globals_[table]]
  if len(args) < len(params) + len(variables):
    raise InterpreterError(f"the program takes {len(params) + len(variables)} arguments, got {len(args)}")
  globals_.update({param: _global_view(param, args[i], memory) for i, param in enumerate(params)})
  values = {variable: _variable_value(variable, args[len(params) + i]) for i, variable in enumerate(variables)}
  block_threads = math.prod(local_size)
  blocks = math.prod(global_size)
  if block_threads == 0 or blocks == 0: return
  per_chunk = max(1, THREADS_PER_CHUNK // block_threads)
  for first in range(0, blocks, per_chunk):
    count = min(per_chunk, blocks - first)
    _Execution(program, globals_, dict(values), global_size, local_size, first, count).run()


def _signed(word: int) -> int:
  return word - (1 << 64) if word >= 1 << 63 else word


def _variable_value(variable: UOp, word: int) -> np.generic:
  """A variable's value from its 8-byte slot: float64 variables (parameterized constants) travel as their bits."""
  value = np.int64(_signed(word))
  return value.view(np.float64) if variable.dtype == dtypes.float64 else value


def _global_view(param: UOp, address: int, memory: Memory) -> np.ndarray:
  dtype: PtrDType = param.dtype
  element = dtypes.to_numpy(dtype.base)
  count = max(dtype.size, 0)
  if address % element.itemsize:
    raise InterpreterError(f"buffer {param.arg} at {address:#x} is not aligned to its {element.itemsize}-byte elements")
  return memory(address, count * element.itemsize).view(element)


class _Execution:
  def __init__(self, program: list[UOp], globals_: dict[UOp, np.ndarray], values: dict[UOp, Any],
               global_size: tuple[int, ...], local_size: tuple[int, ...], first_block: int, blocks: int):
    self.program, self.globals = program, globals_
    self.values: dict[UOp, Any] = values
    self.registers: dict[UOp, Any] = {}
    self.shared: dict[UOp, np.ndarray] = {}
    self.blocks = blocks
    block_threads = math.prod(local_size)
    thread = np.arange(blocks * block_threads, dtype=np.int64)
    self.block_of_thread = thread // block_threads
    block = self.block_of_thread + first_block
    local = thread % block_threads
    gx, gy = global_size[0], global_size[1]
    lx, ly = local_size[0], local_size[1]
    self.specials = {"gidx0": block % gx, "gidx1": block // gx % gy, "gidx2": block // (gx * gy),
                     "lidx0": local % lx, "lidx1": local // lx % ly, "lidx2": local // (lx * ly)}
    self.ends = _matching_ends(program)

  def run(self) -> None:
    loops: list[list[int]] = []  # open loops: [position of the RANGE, value, end]
    position = 0
    with np.errstate(all="ignore"):
      while position < len(self.program):
        instruction = self.program[position]
        if instruction.op is Ops.RANGE:
          end = self.uniform(instruction.src[0], "a loop bound")
          if end <= 0:
            position = self.ends[position] + 1
            continue
          loops.append([position, 0, end])
          self.values[instruction] = np.int64(0)
        elif instruction.op is Ops.END:
          loop = loops[-1]
          if loop[1] + 1 < loop[2]:
            loop[1] += 1
            self.values[self.program[loop[0]]] = np.int64(loop[1])
            position = loop[0] + 1
            continue
          loops.pop()
        else:
          self.step(instruction)
        position += 1

  def uniform(self, node: UOp, what: str) -> int:
    value = self.value(node)
    if np.ndim(value) == 0: return int(value)
    if (value == value.flat[0]).all(): return int(value.flat[0])
    raise InterpreterError(f"{what} differs between threads ({node.op}): a GPU loop needs one bound for all")

  def value(self, node: UOp) -> Any:
    if node.op is Ops.CONST: return _constant(node)
    if node not in self.values: raise InterpreterError(f"{node.op} {node.dtype!r} is used before it is computed")
    return self.values[node]

  # *** instructions ***

  def step(self, node: UOp) -> None:
    op = node.op
    if op in (Ops.CONST, Ops.DEFINE_VAR, Ops.SINK, Ops.NOOP): return
    if op is Ops.DEFINE_GLOBAL: self.values[node] = self.globals[node]
    elif op is Ops.SPECIAL:
      if node.arg not in self.specials: raise InterpreterError(f"unknown special index {node.arg!r}")
      self.values[node] = self.specials[node.arg]
    elif op is Ops.DEFINE_LOCAL:
      if node not in self.shared:
        self.shared[node] = np.zeros((self.blocks, node.dtype.size), dtypes.to_numpy(node.dtype.base))
      self.values[node] = self.shared[node]
    elif op is Ops.DEFINE_REG:
      self.registers[node] = _constant(UOp.const(node.dtype, node.arg[1]))
      self.values[node] = node
    elif op in (Ops.BARRIER, Ops.AFTER): self.values[node] = self.value(node.src[0])
    elif op is Ops.INDEX: self.values[node] = self.index(node)
    elif op is Ops.LOAD: self.values[node] = self.load(node)
    elif op is Ops.STORE: self.store(node)
    elif op is Ops.VECTORIZE: self.values[node] = np.stack(np.broadcast_arrays(*[self.value(s) for s in node.src]), -1)
    elif op is Ops.GEP:
      source = self.value(node.src[0])
      lanes = list(node.arg)
      self.values[node] = source[..., lanes[0]] if len(lanes) == 1 else source[..., lanes]
    elif op is Ops.CAST: self.values[node] = cast(self.value(node.src[0]), node.src[0].dtype, node.dtype)
    elif op is Ops.BITCAST: self.values[node] = bitcast(self.value(node.src[0]), node.src[0].dtype, node.dtype)
    elif op in _ALU: self.values[node] = alu(op, node.dtype, [self.value(s) for s in node.src], node.src)
    else: raise InterpreterError(f"the interpreter has no rule for {op}")

  def index(self, node: UOp) -> _Pointer:
    buffer = node.src[0]
    array = self.value(buffer)
    if isinstance(array, UOp): raise InterpreterError("INDEX of a register")
    gate = np.asarray(self.value(node.src[2]), bool) if len(node.src) > 2 else None
    return _Pointer(array, np.asarray(self.value(node.src[1]), np.int64), gate, _is_shared(buffer))

  def _addresses(self, pointer: _Pointer, lanes: int) -> tuple[tuple, np.ndarray | None]:
    """numpy index tuples for the pointer's elements (lanes consecutive elements per thread), and the mask."""
    threads = len(self.block_of_thread)
    index = np.broadcast_to(pointer.index, (threads,) + pointer.index.shape[1:]) if pointer.index.ndim else \
      np.full(threads, pointer.index)
    if lanes > 1: index = index[:, None] + np.arange(lanes)
    gate = pointer.gate
    if gate is not None and lanes > 1 and gate.ndim == 1 and gate.shape[0] == threads: gate = gate[:, None]
    mask = None if gate is None else np.broadcast_to(gate, index.shape)
    if mask is not None: index = np.where(mask, index, 0)
    size = pointer.array.shape[-1]
    checked = index if mask is None else index[mask]
    if checked.size and (checked.min() < 0 or checked.max() >= size):
      raise InterpreterError(f"an access at element {int(checked.max() if checked.max() >= size else checked.min())} "
                             f"is outside a buffer of {size} elements")
    if pointer.shared:
      block = self.block_of_thread if index.ndim == 1 else self.block_of_thread[:, None]
      return (np.broadcast_to(block, index.shape), index), mask
    return (index,), mask

  def load(self, node: UOp) -> Any:
    source = node.src[0]
    if source.op is Ops.DEFINE_REG: return self.registers[source]
    pointer: _Pointer = self.value(source)
    where, mask = self._addresses(pointer, node.dtype.count)
    # an empty buffer can only be read where the gate is false everywhere (_addresses checked): nothing to gather
    array = pointer.array if pointer.array.shape[-1] else np.zeros(pointer.array.shape[:-1] + (1,), pointer.array.dtype)
    loaded = array[where]
    if mask is not None: loaded = np.where(mask, loaded, np.zeros((), loaded.dtype))
    return from_memory(loaded, node.dtype)

  def store(self, node: UOp) -> None:
    target, value = node.src
    if target.op is Ops.DEFINE_REG:
      self.registers[target] = self.value(value)
      return
    pointer: _Pointer = self.value(target)
    where, mask = self._addresses(pointer, value.dtype.count)
    data = np.broadcast_to(to_memory(self.value(value), value.dtype, pointer.array.dtype), where[-1].shape)
    if mask is not None:
      where, data = tuple(w[mask] for w in where), data[mask]
    pointer.array[where] = data


def _is_shared(buffer: UOp) -> bool:
  while buffer.op in (Ops.BARRIER, Ops.AFTER): buffer = buffer.src[0]
  return buffer.op is Ops.DEFINE_LOCAL


def _matching_ends(program: list[UOp]) -> dict[int, int]:
  ends, open_loops = {}, []
  for position, instruction in enumerate(program):
    if instruction.op is Ops.RANGE: open_loops.append(position)
    elif instruction.op is Ops.END: ends[open_loops.pop()] = position
  return ends


def _constant(node: UOp) -> Any:
  holder = numpy_dtype(node.dtype)
  if node.dtype.count > 1:
    lanes = node.arg if isinstance(node.arg, tuple) else (node.arg,) * node.dtype.count
    return np.array(lanes, dtype=holder)
  return np.array(node.arg, dtype=holder)[()]


# *** values in memory and in registers ***

def from_memory(loaded: np.ndarray, dtype: DType) -> np.ndarray:
  if dtype.scalar == dtypes.bfloat16: return (loaded.astype(np.uint32) << np.uint32(16)).view(np.float32)
  return loaded


def to_memory(value: Any, dtype: DType, stored: np.dtype) -> np.ndarray:
  value = np.asarray(value)
  if dtype.scalar == dtypes.bfloat16:
    return (round_bfloat16(value).astype(np.float32).view(np.uint32) >> np.uint32(16)).astype(np.uint16)
  return value.astype(stored, copy=False)


def _finish(result: Any, dtype: DType) -> Any:
  """A result held as its dtype holds it (rounded to bfloat16 where that is the dtype)."""
  result = np.asarray(result).astype(numpy_dtype(dtype), copy=False)
  if dtype.scalar == dtypes.bfloat16: result = round_bfloat16(result)
  return result if result.ndim else result[()]


_ALU = frozenset({Ops.ADD, Ops.MUL, Ops.FDIV, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.AND, Ops.OR,
                  Ops.XOR, Ops.SHL, Ops.SHR, Ops.WHERE, Ops.MULACC, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT,
                  Ops.RECIPROCAL, Ops.TRUNC})


def alu(op: Ops, dtype: DType, operands: list[Any], sources: tuple[UOp, ...]) -> Any:
  """One ALU instruction over the threads' values, with the generated code's semantics."""
  if op is Ops.WHERE: return _finish(np.where(operands[0], operands[1], operands[2]), dtype)
  source_dtype = sources[0].dtype
  is_float = dtypes.is_float(source_dtype.scalar)
  a = operands[0]
  if op in _UNARY:
    wide = np.asarray(a, np.float64)
    return _finish(_UNARY[op](wide), dtype)
  b = operands[1]
  if op is Ops.MULACC:
    c = operands[2]
    # one rounding: float32 products are exact in float64 (and a float32 sum that is exact stays exact there)
    if is_float and source_dtype.scalar != dtypes.float64:
      return _finish(np.asarray(a, np.float64) * np.asarray(b, np.float64) + np.asarray(c, np.float64), dtype)
    if is_float: return _finish(_fma64(a, b, c), dtype)
    return _finish(a * b + c, dtype)
  if op is Ops.CMPLT: return np.asarray(a < b)[()]
  if op is Ops.CMPNE: return np.asarray(a != b)[()]
  if op is Ops.MAX:
    if dtypes.is_bool(source_dtype.scalar): return np.logical_or(a, b)[()]
    larger = np.maximum(a, b)
    # LLVM's maximum orders -0.0 below +0.0 (numpy's picks either)
    if is_float: larger = np.where((a == 0) & (b == 0), np.where(np.signbit(a) & np.signbit(b), a, abs(a)), larger)
    return _finish(larger, dtype)
  if op in (Ops.IDIV, Ops.MOD) and not is_float: return _finish(_truncating(op, a, b), dtype)
  if op in (Ops.SHL, Ops.SHR):
    bits = 8 * source_dtype.itemsize
    b = np.asarray(b).astype(np.asarray(a).dtype) & (bits - 1)
    return _finish(np.left_shift(a, b) if op is Ops.SHL else np.right_shift(a, b), dtype)
  if dtypes.is_bool(source_dtype.scalar) and op in (Ops.ADD, Ops.MUL):
    return (np.logical_or(a, b) if op is Ops.ADD else np.logical_and(a, b))[()]
  function = _BINARY[op]
  return _finish(function(a, b), dtype)


def _exact_fma(a: float, b: float, c: float) -> float:
  if not (math.isfinite(a) and math.isfinite(b) and math.isfinite(c)): return a * b + c
  return float(Fraction(a) * Fraction(b) + Fraction(c))  # rounded once, to nearest even


_fma64_elements = np.frompyfunc(_exact_fma, 3, 1)


def _fma64(a: Any, b: Any, c: Any) -> np.ndarray:
  """a*b + c in float64 with one rounding, as the hardware's fused multiply-add. Error-free transformations (Dekker's
  product, Knuth's sum) give the exact value as s + u + v with |v| tiny; s + u rounds to the correctly rounded result
  unless it lies (almost) exactly between two doubles, where v decides. Those, and anything near overflow or
  underflow, go through exact fractions."""
  a, b, c = np.broadcast_arrays(*(np.asarray(v, np.float64) for v in (a, b, c)))
  product = a * b
  split_a, split_b = a * 134217729.0, b * 134217729.0  # Veltkamp: 2^27 + 1
  a_high = split_a - (split_a - a)
  b_high = split_b - (split_b - b)
  a_low, b_low = a - a_high, b - b_high
  product_error = ((a_high * b_high - product) + a_high * b_low + a_low * b_high) + a_low * b_low
  total = product + c
  back = total - product
  sum_error = (product - (total - back)) + (c - back)
  u = sum_error + product_error
  u_back = u - sum_error
  v = (sum_error - (u - u_back)) + (product_error - u_back)
  result = np.asarray(total + u)
  residual = np.abs((total - result) + u)  # what rounding total + u dropped: half an ulp at a tie (a quarter of
  spacing = np.spacing(np.abs(result))       # the spacing above, just below a power of two)
  near_tie = (v != 0) & ((residual == spacing * 0.5) | (residual == spacing * 0.25))
  magnitude = np.abs(product)
  safe = (np.abs(a) < 2.0 ** 990) & (np.abs(b) < 2.0 ** 990) & (np.abs(c) < 2.0 ** 1000) & ~near_tie & \
    ((a == 0) | (b == 0) | ((magnitude > 2.0 ** -960) & (magnitude < 2.0 ** 960)))
  if not safe.all():
    slow = ~safe
    result = result.copy()
    result[slow] = _fma64_elements(a[slow], b[slow], c[slow]).astype(np.float64)
  return result


def _truncating(op: Ops, a: Any, b: Any) -> Any:
  """C's integer division and remainder (toward zero); division by zero gives 0 (it is undefined)."""
  a, b = np.asarray(a), np.asarray(b)
  safe = np.where(b == 0, np.ones((), b.dtype), b)
  quotient = a // safe  # floors: one less than truncating where the signs differ and something remains
  remainder = a - quotient * safe
  fix = (remainder != 0) & ((a < 0) != (safe < 0))
  quotient = np.where(fix, quotient + 1, quotient)
  if op is Ops.IDIV: return np.where(b == 0, np.zeros((), quotient.dtype), quotient)
  return np.where(b == 0, np.zeros((), a.dtype), a - quotient * safe)


_UNARY: dict[Ops, Callable[[np.ndarray], np.ndarray]] = {
  Ops.EXP2: np.exp2, Ops.LOG2: np.log2, Ops.SIN: np.sin, Ops.SQRT: np.sqrt, Ops.RECIPROCAL: lambda x: 1.0 / x,
  Ops.TRUNC: np.trunc,
}

_BINARY: dict[Ops, Callable[[Any, Any], Any]] = {
  Ops.ADD: np.add, Ops.MUL: np.multiply, Ops.FDIV: np.true_divide, Ops.IDIV: np.true_divide, Ops.MOD: np.fmod,
  Ops.AND: np.bitwise_and, Ops.OR: np.bitwise_or, Ops.XOR: np.bitwise_xor,
}


def cast(value: Any, source: DType, target: DType) -> Any:
  """C conversions: float to int truncates toward zero, anything to bool is `!= 0`."""
  value = np.asarray(value)
  if target.scalar == dtypes.bool: return np.asarray(value != 0)[()]
  if dtypes.is_float(source.scalar) and not dtypes.is_float(target.scalar):
    finite = np.where(np.isfinite(value), value, 0)
    return _finish(np.trunc(finite).astype(np.float64).astype(numpy_dtype(target)), target)
  return _finish(value.astype(numpy_dtype(target)), target)


def bitcast(value: Any, source: DType, target: DType) -> Any:
  """The same bits as another dtype of the same size."""
  bits = to_memory(value, source, dtypes.to_numpy(source.scalar))
  result = np.ascontiguousarray(bits).view(dtypes.to_numpy(target.scalar))
  return _finish(from_memory(result, target), target)




__all__ = ["run_program", "InterpreterError"]
