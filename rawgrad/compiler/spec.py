"""Verifiers that check the graph between stages when SPEC=1 (the test suite runs with it on), so a bug is found at
the pass that made it rather than as a wrong number at the end."""
from __future__ import annotations

from typing import Iterator

from rawgrad.compiler.codegen.opt.kernel import ALL_KINDS
from rawgrad.compiler.ir import GroupOp, Ops, UOp
from rawgrad.dtype import PtrDType, dtypes


class SpecError(AssertionError):
  pass


def _fail(stage: str, node: UOp, problem: str) -> None:
  raise SpecError(f"{stage}: {node.op} {node.dtype!r} arg={node.arg!r}: {problem}")


def _check_alu_dtypes(stage: str, node: UOp) -> None:
  if node.op is Ops.WHERE:
    condition, a, b = node.src
    if condition.dtype.scalar != dtypes.bool: _fail(stage, node, f"condition has dtype {condition.dtype!r}, not bool")
    if a.dtype != b.dtype or a.dtype != node.dtype: _fail(stage, node, f"branches {a.dtype!r} and {b.dtype!r} differ")
    return
  if node.op in (Ops.SHL, Ops.SHR): return
  operand_dtypes = {source.dtype for source in node.src}
  if len(operand_dtypes) != 1: _fail(stage, node, f"operands have different dtypes {sorted(map(repr, operand_dtypes))}")
  operand = next(iter(operand_dtypes))
  expected = dtypes.bool.vec(operand.count) if node.op in GroupOp.Comparison else operand
  if node.dtype != expected: _fail(stage, node, f"result dtype should be {expected!r}")


def verify_tensor_graph(sink: UOp) -> None:
  """Tensor level: elementwise operands agree in shape and dtype; movement sizes are index expressions."""
  stage = "tensor graph"
  for node in sink.toposort:
    if node.op in GroupOp.ALU:
      _check_alu_dtypes(stage, node)
      shapes = {source.shape for source in node.src if source.shape is not None and source.shape != ()}
      if len(shapes) > 1: _fail(stage, node, f"operands have different shapes {sorted(map(str, shapes))}")
    if node.op in GroupOp.Movement:
      for size in node.src[1:]:
        if size.dtype != dtypes.index: _fail(stage, node, f"size {size.op} has dtype {size.dtype!r}, not index")
    if node.op is Ops.BUFFER and not isinstance(node.arg, int): _fail(stage, node, "buffer size must be an int")


def _kernel_nodes(stage: str, ast: UOp) -> Iterator[UOp]:
  """The nodes of a kernel, each after the checks every kernel passes at every stage: a SINK of STOREs into INDEXed
  buffers, no tensor-level op left, ALU dtypes that agree, REDUCEs over RANGEs only."""
  if ast.op is not Ops.SINK: _fail(stage, ast, "a kernel must be a SINK")
  for store in ast.src:
    if store.op is not Ops.STORE or store.src[0].op is not Ops.INDEX:
      _fail(stage, store, "a kernel's SINK holds only STOREs to INDEXed buffers")
  for node in ast.toposort:
    if node.op in GroupOp.Movement or node.op in (Ops.REDUCE_AXIS, Ops.BUFFER, Ops.CONTIGUOUS, Ops.DEVICE):
      _fail(stage, node, "tensor-level op left in a kernel")
    if node.op in GroupOp.ALU: _check_alu_dtypes(stage, node)
    if node.op is Ops.REDUCE and any(r.op is not Ops.RANGE for r in node.src[1:]):
      _fail(stage, node, "REDUCE loops over RANGEs only")
    yield node


def verify_kernel(ast: UOp) -> None:
  """Kernel level: a SINK of STOREs into INDEXed globals; no tensor-level ops left; ALU dtypes agree."""
  stage = f"kernel {ast.arg}"
  for node in _kernel_nodes(stage, ast):
    if node.op is Ops.INDEX:
      if node.src[0].op is not Ops.DEFINE_GLOBAL: _fail(stage, node, "INDEX must address a DEFINE_GLOBAL")
      if node.src[1].dtype != dtypes.index: _fail(stage, node, f"index has dtype {node.src[1].dtype!r}")
      if len(node.src) > 2 and node.src[2].dtype != dtypes.bool: _fail(stage, node, "gate must be bool")
    if node.op is Ops.RANGE and node.dtype != dtypes.index: _fail(stage, node, "ranges have dtype index")
    if node.op is Ops.DEFINE_GLOBAL and not isinstance(node.dtype, PtrDType):
      _fail(stage, node, "a kernel parameter is a pointer")


def verify_program(name: str, program: list[UOp]) -> None:
  """Linear program: every source is computed before its use, loops open and close in nesting order; a scratch array
  has a size, and a BARRIER meets outside every loop, on a scratch array, after a parallel loop that has as many
  iterations as it counts."""
  stage = f"program {name}"
  defined: set[UOp] = set()
  open_loops: list[UOp] = []
  parallel: list[UOp] = []
  for instruction in program:
    for source in instruction.src:
      if source.op is not Ops.CONST and source not in defined: _fail(stage, instruction, f"uses {source.op} early")
    if instruction.op is Ops.DEFINE_SCRATCH and (not isinstance(instruction.dtype, PtrDType) or
                                                  instruction.dtype.size < 1):
      _fail(stage, instruction, "a scratch array is a pointer with a positive size")
    if instruction.op is Ops.BARRIER: _check_barrier(stage, instruction, open_loops, parallel)
    if instruction.op is Ops.RANGE and instruction.arg[1] == "parallel": parallel.append(instruction)
    if instruction.op is Ops.RANGE: open_loops.append(instruction)
    if instruction.op is Ops.END:
      if not open_loops or open_loops[-1] is not instruction.src[0]: _fail(stage, instruction, "closes the wrong loop")
      open_loops.pop()
    defined.add(instruction)
  if open_loops: _fail(stage, open_loops[-1], "loop is never closed")


def _check_barrier(stage: str, barrier: UOp, open_loops: list[UOp], parallel: list[UOp]) -> None:
  if barrier.src[0].op is Ops.DEFINE_LOCAL: return  # a GPU block's barrier: loops run alike in every thread

  if open_loops: _fail(stage, barrier, f"a BARRIER inside {len(open_loops)} loops: the slices would never all meet")
  if barrier.src[0].op is not Ops.DEFINE_SCRATCH: _fail(stage, barrier, "a BARRIER meets on a DEFINE_SCRATCH")
  sizes = {r.src[0].arg if r.src[0].op is Ops.CONST else None for r in parallel}
  if not isinstance(barrier.arg, int) or barrier.arg < 1 or (parallel and sizes != {barrier.arg}):
    _fail(stage, barrier, f"counts {barrier.arg!r} chunks, its parallel loops have {sorted(map(str, sizes))}")


_BUFFER_OPS = (Ops.DEFINE_GLOBAL, Ops.DEFINE_LOCAL, Ops.DEFINE_SCRATCH, Ops.AFTER, Ops.BARRIER)


def verify_lowering(stage: str, ast: UOp, gone: frozenset[str] = frozenset()) -> None:
  """Between codegen passes: a SINK of STOREs into INDEXed buffers; ALU dtypes agree; indices are index-typed and
  gates bool; ranges have a known kind, and none of the kinds in `gone` (an earlier pass removed them)."""
  where = f"kernel {ast.arg} after {stage}"
  for node in _kernel_nodes(where, ast):
    if node.op is Ops.INDEX:
      if node.src[0].op not in _BUFFER_OPS: _fail(where, node, f"INDEX addresses {node.src[0].op}, not a buffer")
      if node.src[1].dtype.scalar != dtypes.index: _fail(where, node, f"index has dtype {node.src[1].dtype!r}")
      if len(node.src) > 2 and node.src[2].dtype.scalar != dtypes.bool: _fail(where, node, "gate must be bool")
    if node.op is Ops.RANGE:
      if node.arg[1] not in ALL_KINDS: _fail(where, node, f"unknown range kind {node.arg[1]!r}")
      if node.arg[1] in gone: _fail(where, node, f"a {node.arg[1]} range is left after {stage}")
