"""The matmul's inner loops keep their register blocks in registers on every x86 feature set CPU_ISA can force, and
on the other CPUs the benchmarks run on: in LLVM's assembly no innermost loop of multiply-adds spills or reloads, and
the full block's multiply-adds accumulate into exactly the registers the heuristics planned, which fit the vector
register file."""
from __future__ import annotations

import dataclasses
import re

import llvmlite.binding as llvm
import pytest

from rawgrad import Tensor
from rawgrad.compiler.codegen.lower import lower_kernel
from rawgrad.compiler.codegen.opt.heuristic import BROADCASTS_IN_FLIGHT, _widening, register_block
from rawgrad.compiler.codegen.opt.kernel import OptOps
from rawgrad.compiler.rangeify import create_schedule
from rawgrad.compiler.render.llvmir import LLVMRenderer
from rawgrad.compiler.target import Target, host_target
from rawgrad.runtime.compile import LLVMCompiler

pytestmark = pytest.mark.skipif(llvm.get_process_triple().split("-")[0] != "x86_64", reason="reads x86 assembly")

FMA = re.compile(r"^\s*vfmadd\d+ps\s+(.*)$")
STACK_SLOT = re.compile(r"(?<![\w)])-?\d*\(%r[sb]p\)")  # a fixed offset from the stack or frame pointer


# the machines of the CPU benchmarks besides this one, compiled for with LLVM's model of each (caches from their specs)
OTHER_CPUS = {
  "znver3": dict(vector_bytes=32, vector_registers=16, l1_bytes=32 << 10, l1_ways=8, l2_bytes=512 << 10),
  "skylake-avx512": dict(vector_bytes=64, vector_registers=32, l1_bytes=32 << 10, l1_ways=8, l2_bytes=1 << 20),
  "sapphirerapids": dict(vector_bytes=64, vector_registers=32, l1_bytes=48 << 10, l1_ways=12, l2_bytes=2 << 20),
}


def _target(isa: str) -> Target:
  """The host limited to CPU_ISA=isa, or another CPU by its LLVM name."""
  if isa in OTHER_CPUS: return Target(kind="cpu", arch="x86_64", triple="x86_64-unknown-linux-gnu", cpu=isa,
                                      **OTHER_CPUS[isa])
  try:
    return host_target(isa)
  except ValueError as e:
    pytest.skip(str(e))


def matmul_assembly(n: int, target: Target) -> tuple[str, list]:
  """The assembly of the n x n x n fp32 matmul kernel the heuristics make for the target, and its opts."""
  a, b = Tensor.empty(n, n), Tensor.empty(n, n)
  item = create_schedule([(a @ b).uop]).items[-1]
  lowered = lower_kernel(item.ast, None, target)
  source = LLVMRenderer().render(item.ast.arg, lowered.program)
  return LLVMCompiler(target).assembly(source), list(lowered.opts)


def conv_assembly(target: Target) -> tuple[str, list]:
  """The assembly of a 3x3 convolution 32 -> 32 channels over 20x20 images as the heuristics make it: rows of 18
  pixels fill the vectors poorly, so its 32 output channels are the vector axis, with the weights packed."""
  x, w = Tensor.empty(2, 32, 20, 20), Tensor.empty(32, 32, 3, 3)
  item = create_schedule([x.conv2d(w).uop]).items[-1]
  lowered = lower_kernel(item.ast, None, target)
  source = LLVMRenderer().render(item.ast.arg, lowered.program)
  return LLVMCompiler(target).assembly(source), list(lowered.opts)


def innermost_loops(assembly: str) -> list[list[str]]:
  """The instructions of each innermost loop: from its header label (LLVM's verbose comments below a label mark it)
  to the last jump back to that label."""
  lines = assembly.splitlines()
  loops = []
  for marked, line in enumerate(lines):
    if "Inner Loop Header" not in line: continue
    start = next(i for i in range(marked, -1, -1) if re.match(r"^\.?\w+:", lines[i]))
    label = lines[start].split(":")[0]
    ends = [i for i, text in enumerate(lines) if i > start and re.search(rf"\bj\w+\s+{re.escape(label)}\b", text)]
    if ends: loops.append(lines[start + 1:ends[-1] + 1])
  return loops


def multiply_add_loops(assembly: str) -> list[list[str]]:
  """The innermost loops that multiply-add: the matmul's inner loop over a full register block, and the ones over the
  last, shorter blocks."""
  loops = [body for body in innermost_loops(assembly) if any(FMA.match(line) for line in body)]
  assert loops, f"no loop of multiply-adds in\n{assembly}"
  return loops


def spills(loop: list[str]) -> list[str]:
  """Lines of a loop that move a value to or from a fixed stack slot (LLVM notes its spills and reloads)."""
  return [line for line in loop if "Spill" in line or "Reload" in line or STACK_SLOT.search(line.split("#")[0])]


def accumulators(loop: list[str]) -> set[str]:
  """The registers the loop's multiply-adds accumulate into (AT&T syntax: the last operand)."""
  return {FMA.match(line).group(1).split("#")[0].split(",")[-1].strip() for line in loop if FMA.match(line)}


def planned_block(opts: list) -> int:
  """Accumulators the opts ask for: the unrolled copies of the output loops (the vector axis is one vector)."""
  copies = 1
  for opt in opts:
    if opt.op is OptOps.UNROLL: copies *= opt.amount
  return copies


@pytest.mark.parametrize("n", [256, 1024])
@pytest.mark.parametrize("isa", ["avx2", "avx512", *OTHER_CPUS])
def test_the_matmul_inner_loop_does_not_spill(isa: str, n: int) -> None:
  target = _target(isa)
  assembly, opts = matmul_assembly(n, target)
  loops = multiply_add_loops(assembly)
  for loop in loops:
    assert not spills(loop), f"{isa} matmul {n} with {opts} spills in an inner loop:\n" + "\n".join(loop)
  registers = max((accumulators(loop) for loop in loops), key=len)
  block = planned_block(opts)
  vector = {32: "%ymm", 64: "%zmm"}[target.vector_bytes]
  assert all(name.startswith(vector) for name in registers), registers
  assert len(registers) == block, f"{isa}: {sorted(registers)} accumulate, {opts} plan {block}"
  columns = next(opt.amount for opt in opts if opt.op is OptOps.UNROLL and opt.axis == 1)
  assert block + columns + BROADCASTS_IN_FLIGHT <= target.vector_registers


@pytest.mark.parametrize("isa", ["avx2", "avx512", *OTHER_CPUS])
def test_the_packed_convolution_inner_loop_does_not_spill(isa: str) -> None:
  """Its broadcasts are neighbouring pixels, all loaded before the multiply-adds: the block leaves them registers."""
  target = _target(isa)
  assembly, opts = conv_assembly(target)
  assert opts[0].op is OptOps.UPCAST and opts[0].axis == 1 and opts[-1].op is OptOps.LOCAL, opts
  loops = multiply_add_loops(assembly)
  for loop in loops:
    assert not spills(loop), f"{isa} convolution with {opts} spills in an inner loop:\n" + "\n".join(loop)
  assert len(max((accumulators(loop) for loop in loops), key=len)) == planned_block(opts)


def test_the_check_finds_spills_when_the_block_outgrows_the_register_file() -> None:
  """Heuristics that assume AVX-512's 32 registers while the code is for AVX2's 16 (the old constants: 24
  accumulators, rows of 12) spill in the inner loop, and the check says so."""
  avx2 = _target("avx2")
  assembly, opts = matmul_assembly(256, dataclasses.replace(avx2, vector_registers=32, l1_ways=12))
  assert planned_block(opts) == 24
  assert any(spills(loop) for loop in multiply_add_loops(assembly))


@pytest.mark.parametrize("registers, ways, expected", [
  (16, 12, (6, 2)),   # AVX2: 12 accumulators + 2 loaded vectors + 2 broadcasts of 16 registers
  (16, 8, (6, 2)),    # AVX2 on a Zen 3 (32 KiB L1, 8 ways)
  (32, 12, (12, 2)),  # AVX-512 with a 12-way L1 (Sapphire Rapids, Zen 5): the rows are limited by the ways
  (32, 8, (8, 2)),    # AVX-512 with an 8-way L1 (Zen 4, Skylake-X)
  (32, 16, (14, 2)),  # AVX-512 with more ways than rows the registers hold
])
def test_register_block_follows_the_registers_and_the_l1_ways(registers: int, ways: int,
                                                              expected: tuple[int, int]) -> None:
  target = Target(kind="cpu", arch="x86_64", triple="x86_64-unknown-linux-gnu", cpu="x86-64",
                  vector_registers=registers, l1_ways=ways)
  assert register_block(target, vectors=1, rows_available=1024, widen=(2,)) == expected
  # few rows: the vector axis is copied so the block still has enough independent accumulators
  assert register_block(target, vectors=1, rows_available=3, widen=(2,)) == (3, 2)
  assert register_block(target, vectors=1, rows_available=1024, widen=())[1] == 1


@pytest.mark.parametrize("registers, vectors, expected", [
  (16, 3, (3, 3)),     # AVX2, a row of 24 floats: three copies, none peeled off
  (16, 213, (6, 2)),   # AVX2, 1700 floats: 6 x 2 (one vector peeled off) loads as little as 3 x 3, with more rows
  (32, 63, (8, 3)),    # AVX-512, 1000 floats: 8 x 3 loads less than 8 x 2
  (32, 64, (8, 2)),
])
def test_three_copies_where_they_divide_the_row(registers: int, vectors: int, expected: tuple[int, int]) -> None:
  target = Target(kind="cpu", arch="x86_64", triple="x86_64-unknown-linux-gnu", cpu="x86-64",
                  vector_registers=registers, l1_ways=8)
  assert register_block(target, vectors=1, rows_available=1024, widen=_widening(vectors)) == expected
