"""compiler/spec.py: the verifiers pass what the pipeline makes and name what is wrong in a planted bad graph."""
import numpy as np
import pytest

from rawgrad import Tensor
from rawgrad.compiler.codegen.lower import lower_kernel
from rawgrad.compiler.ir import Ops, UOp
from rawgrad.compiler.rangeify import create_schedule
from rawgrad.compiler.rewrite import substitute
from rawgrad.compiler.spec import SpecError, verify_kernel, verify_lowering, verify_program, verify_tensor_graph
from rawgrad.dtype import dtypes


def _sum_kernel() -> UOp:
  """SINK(STORE(INDEX(out, r0), REDUCE(LOAD(in[r0*4 + r1]) + 1, r1))): a row sum of a 4x4 input plus 1."""
  return create_schedule([(Tensor(np.ones((4, 4), np.float32)) + 1).sum(1).uop]).items[-1].ast


def _first(ast: UOp, op: Ops) -> UOp:
  return next(node for node in ast.toposort if node.op is op)


def _replaced(ast: UOp, op: Ops, **changes: object) -> UOp:
  old = _first(ast, op)
  return substitute(ast, {old: old.replace(**changes)})


# *** the tensor graph ***

def test_a_tensor_graph_passes() -> None:
  x = Tensor(np.ones((2, 3), np.float32))
  verify_tensor_graph(UOp.sink(((x + 1) * x.reshape(3, 2).permute(1, 0)).sum(0).uop))


def test_tensor_graph_operands_must_agree() -> None:
  x, y = Tensor(np.ones(3, np.float32)).uop, Tensor(np.ones(3, np.int32)).uop
  with pytest.raises(SpecError, match="operands have different dtypes"):
    verify_tensor_graph(UOp.sink(UOp(Ops.ADD, dtypes.float32, (x, y))))
  z = Tensor(np.ones(4, np.float32)).uop
  with pytest.raises(SpecError, match="operands have different shapes"):
    verify_tensor_graph(UOp.sink(UOp(Ops.ADD, dtypes.float32, (x, z))))
  with pytest.raises(SpecError, match="result dtype should be dtypes.bool"):
    verify_tensor_graph(UOp.sink(UOp(Ops.CMPLT, dtypes.float32, (x, x))))
  with pytest.raises(SpecError, match="condition has dtype dtypes.float32, not bool"):
    verify_tensor_graph(UOp.sink(UOp(Ops.WHERE, dtypes.float32, (x, x, x))))


def test_tensor_graph_buffers_and_movement_sizes() -> None:
  buffer = UOp(Ops.BUFFER, dtypes.float32, (UOp(Ops.UNIQUE, arg=10**9), UOp(Ops.DEVICE, arg="CPU")), 6.0)
  with pytest.raises(SpecError, match="buffer size must be an int"): verify_tensor_graph(UOp.sink(buffer))
  x = Tensor(np.ones(6, np.float32)).uop
  bad = UOp(Ops.RESHAPE, dtypes.float32, (x, UOp.const(dtypes.int32, 2), UOp.const(dtypes.int32, 3)))
  with pytest.raises(SpecError, match="size Ops.CONST has dtype dtypes.int32, not index"):
    verify_tensor_graph(UOp.sink(bad))


# *** kernels ***

def test_a_scheduled_kernel_passes() -> None:
  verify_kernel(_sum_kernel())


def test_kernel_shape_is_a_sink_of_indexed_stores() -> None:
  ast = _sum_kernel()
  with pytest.raises(SpecError, match="a kernel must be a SINK"): verify_kernel(ast.src[0])
  load = _first(ast, Ops.LOAD)
  with pytest.raises(SpecError, match="SINK holds only STOREs to INDEXed buffers"):
    verify_kernel(ast.replace(src=(load,)))


def test_kernel_rejects_tensor_level_ops_and_bad_indices() -> None:
  ast = _sum_kernel()
  load = _first(ast, Ops.LOAD)
  with pytest.raises(SpecError, match="tensor-level op left in a kernel"):
    verify_kernel(substitute(ast, {load: UOp(Ops.CONTIGUOUS, load.dtype, (load,))}))
  index = _first(ast, Ops.INDEX)
  with pytest.raises(SpecError, match="index has dtype dtypes.int32"):
    verify_kernel(substitute(ast, {index: index.replace(src=(index.src[0], index.src[1].cast(dtypes.int32)))}))
  with pytest.raises(SpecError, match="gate must be bool"):
    verify_kernel(substitute(ast, {index: index.replace(src=(*index.src, UOp.const(dtypes.int32, 1)))}))
  with pytest.raises(SpecError, match="a kernel parameter is a pointer"):
    verify_kernel(_replaced(ast, Ops.DEFINE_GLOBAL, dtype=dtypes.float32))


def test_kernel_reduces_loop_over_ranges() -> None:
  ast = _sum_kernel()
  reduce = _first(ast, Ops.REDUCE)
  with pytest.raises(SpecError, match="REDUCE loops over RANGEs only"):
    verify_kernel(substitute(ast, {reduce: reduce.replace(src=(reduce.src[0], UOp.const(dtypes.index, 4)))}))


# *** between codegen passes ***

def test_lowering_checks_range_kinds() -> None:
  ast = _sum_kernel()
  verify_lowering("test", ast)
  with pytest.raises(SpecError, match="kernel r_4_4 after expand: Ops.RANGE .*: a reduce range is left after expand"):
    verify_lowering("expand", ast, frozenset({"reduce"}))
  loop = next(node for node in ast.toposort if node.op is Ops.RANGE and node.arg[1] == "loop")
  with pytest.raises(SpecError, match="unknown range kind 'spiral'"):
    verify_lowering("test", substitute(ast, {loop: loop.replace(arg=(loop.arg[0], "spiral"))}))


# *** linear programs ***

def test_a_lowered_program_passes() -> None:
  ast = _sum_kernel()
  verify_program(ast.arg, lower_kernel(ast, []).program)


def test_program_order_and_loops() -> None:
  program = lower_kernel(_sum_kernel(), []).program
  with pytest.raises(SpecError, match="program p: Ops.INDEX .*: uses Ops.RANGE early"): verify_program("p", program[2:])
  ends = [i for i, instruction in enumerate(program) if instruction.op is Ops.END]
  with pytest.raises(SpecError, match="loop is never closed"): verify_program("p", program[:ends[-1]])
  swapped = program[:ends[0]] + [program[ends[-1]]] + program[ends[0] + 1:ends[-1]] + [program[ends[0]]]
  with pytest.raises(SpecError, match="closes the wrong loop"): verify_program("p", swapped)


def test_program_barriers_and_scratch() -> None:
  scratch = UOp(Ops.DEFINE_SCRATCH, dtypes.float32.ptr(4), arg=0)
  barrier = UOp(Ops.BARRIER, dtypes.void, (scratch,), 2)
  verify_program("p", [scratch, barrier])
  loop = UOp.range(4, 0, "loop")
  with pytest.raises(SpecError, match="a BARRIER inside 1 loops"):
    verify_program("p", [scratch, loop.src[0], loop, barrier, UOp(Ops.END, dtypes.void, (loop,))])
  empty = UOp(Ops.DEFINE_SCRATCH, dtypes.float32.ptr(0), arg=0)
  with pytest.raises(SpecError, match="a scratch array is a pointer with a positive size"): verify_program("p", [empty])
  parallel = UOp.range(3, 0, "parallel")
  with pytest.raises(SpecError, match="counts 2 chunks, its parallel loops have \\['3'\\]"):
    verify_program("p", [scratch, parallel.src[0], parallel, UOp(Ops.END, dtypes.void, (parallel,)), barrier])
