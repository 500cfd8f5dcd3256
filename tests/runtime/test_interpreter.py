"""The GPU program interpreter: the generated code's arithmetic, lockstep threads, gates, shared memory, and the errors
a GPU program can make."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rawgrad.compiler.codegen.linearize import linearize
from rawgrad.compiler.ir import Ops, UOp, exec_alu
from rawgrad.dtype import dtypes
from rawgrad.runtime.interpreter import InterpreterError, alu, run_program

INTS = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.int32, dtypes.uint32, dtypes.int64]
FLOATS = [dtypes.float16, dtypes.float32, dtypes.float64]


def _value(draw, dtype):
  if dtypes.is_float(dtype):
    return draw(st.floats(width=8 * dtype.itemsize if dtype != dtypes.float16 else 16, allow_nan=True))
  return draw(st.integers(dtypes.min(dtype), dtypes.max(dtype)))


@st.composite
def alu_cases(draw):
  dtype = draw(st.sampled_from(INTS + FLOATS))
  ops = [Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPLT, Ops.CMPNE]
  ops += [Ops.IDIV, Ops.MOD, Ops.AND, Ops.OR, Ops.XOR] if not dtypes.is_float(dtype) else [Ops.FDIV]
  return draw(st.sampled_from(ops)), dtype, _value(draw, dtype), _value(draw, dtype)


@settings(max_examples=300, deadline=None)
@given(alu_cases())
def test_alu_agrees_with_the_ir_semantics(case) -> None:
  """One instruction on one thread computes what exec_alu says the generated code computes."""
  op, dtype, a, b = case
  if op in (Ops.IDIV, Ops.MOD) and b == 0: return  # undefined: exec_alu raises
  expected = exec_alu(op, dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE) else dtype, (a, b))
  holder = dtypes.to_numpy(dtype)
  sources = (UOp.const(dtype, a), UOp.const(dtype, b))
  got = alu(op, dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE) else dtype,
            [np.array([a], holder), np.array([b], holder)], sources)[0]
  if isinstance(expected, float) and math.isnan(expected):
    assert math.isnan(got)
    return
  assert got == expected
  if isinstance(expected, float): assert math.copysign(1, got) == math.copysign(1, expected), "the zero's sign"


def test_threads_run_in_lockstep_with_gates_and_shared_memory() -> None:
  """out[block*4 + t] = in[block*4 + 3 - t] through shared memory, written only where the element exists."""
  out = UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(10), arg=0)
  source = UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(10), arg=1)
  four = UOp.const(dtypes.index, 4)
  block, thread = UOp(Ops.SPECIAL, dtypes.index, (UOp.const(dtypes.index, 3),), "gidx0"), \
    UOp(Ops.SPECIAL, dtypes.index, (four,), "lidx0")
  element = block * 4 + thread
  valid = element < 10
  local = UOp(Ops.DEFINE_LOCAL, dtypes.float32.ptr(4, local=True), arg=0)
  loaded = UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.INDEX, source.dtype, (source, element, valid)),))
  staged = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, local.dtype, (local, thread)), loaded))
  met = UOp(Ops.BARRIER, local.dtype, (local, staged))
  mirrored = (four - 1) - thread
  read = UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.INDEX, local.dtype, (met, mirrored)),))
  store = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, out.dtype, (out, element, valid)), read))
  program = linearize(UOp(Ops.SINK, dtypes.void, (store,), "mirror"))
  memory = {0x1000: np.full(40, 0xFF, np.uint8), 0x2000: np.arange(10, dtype=np.float32).view(np.uint8).copy()}
  run_program(program, (3, 1, 1), (4, 1, 1), [0x1000, 0x2000], lambda address, n: memory[address][:n])
  got = memory[0x1000].view(np.float32)
  np.testing.assert_array_equal(got[:8], [3, 2, 1, 0, 7, 6, 5, 4])
  # elements 8 and 9: their block mirrors 10, 11 (gated out: read as 0) onto them
  np.testing.assert_array_equal(got[8:], [0, 0])


def test_a_loop_bound_that_differs_between_threads_is_an_error() -> None:
  thread = UOp(Ops.SPECIAL, dtypes.index, (UOp.const(dtypes.index, 4),), "lidx0")
  loop = UOp(Ops.RANGE, dtypes.index, (thread,), (0, "reduce"))
  with pytest.raises(InterpreterError, match="differs between threads"):
    run_program([thread, loop, UOp(Ops.END, dtypes.void, (loop,))], (1, 1, 1), (4, 1, 1), [], lambda a, n: None)


def test_an_access_outside_its_buffer_is_an_error() -> None:
  buffer = UOp(Ops.DEFINE_GLOBAL, dtypes.int32.ptr(4), arg=0)
  index = UOp(Ops.INDEX, buffer.dtype, (buffer, UOp.const(dtypes.index, 7)))
  store = UOp(Ops.STORE, dtypes.void, (index, UOp.const(dtypes.int32, 1)))
  memory = np.zeros(16, np.uint8)
  with pytest.raises(InterpreterError, match="element 7 is outside a buffer of 4 elements"):
    run_program([buffer, index, store], (1, 1, 1), (1, 1, 1), [0x40], lambda a, n: memory[:n])


def test_bfloat16_rounds_after_every_operation() -> None:
  one_plus = alu(Ops.ADD, dtypes.bfloat16, [np.float32(1.0), np.float32(2.0 ** -9)],
                 (UOp.const(dtypes.bfloat16, 1.0),) * 2)
  assert float(one_plus) == 1.0  # 1 + 2^-9 is a tie between bfloat16 neighbours: to even
