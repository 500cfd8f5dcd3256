"""The codegen pipeline of one kernel, for one target: the passes from rangeify's kernel AST to a linear program.

PASSES below is the whole pipeline, in order. Each pass takes the kernel and the target and says (in its docstring)
what holds after it; under SPEC=1 the kernel verifier runs after every pass and the program verifier after the last,
so a bug is caught at the pass that made it. DEBUG=4 prints the kernel after the opts, DEBUG=5 the linear program.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from rawgrad.compiler.codegen.bounds import bound_gated_loops
from rawgrad.compiler.codegen.expand import expand
from rawgrad.compiler.codegen.gates import simplify_gated_indices
from rawgrad.compiler.codegen.gpu import launch_dims, map_to_gpu
from rawgrad.compiler.codegen.linearize import kernel_parameters, linearize, with_argument_table
from rawgrad.compiler.codegen.mathrules import expand_math
from rawgrad.compiler.codegen.opt.kernel import (PARALLEL, THREAD, UNROLL, UPCAST, Opt, all_ranges, apply_opts,
                                                 range_kind)
from rawgrad.compiler.codegen.peel import peel_remainders
from rawgrad.compiler.ir import Ops, UOp
from rawgrad.compiler.spec import verify_lowering, verify_program
from rawgrad.compiler.target import Target, host_target
from rawgrad.helpers import DEBUG, SPEC

SLICES_PER_THREAD = 8  # threads claim slices as they finish: a thread slowed by other work takes fewer


@dataclass(frozen=True)
class LoweredKernel:
  """A kernel ready to render: its opts, its linear program and how it is launched."""
  name: str
  opts: tuple[Opt, ...]
  program: list[UOp]
  target: Target
  parallel: bool = False          # CPU: the outermost loop is split into the `cores` slices of a launch
  parallel_size: int | None = None  # iterations of that loop (None: not known before the launch)
  global_size: tuple[UOp, ...] = ()  # GPU: blocks in the grid (x, y, z), index expressions of the variables
  local_size: tuple[UOp, ...] = ()   # GPU: threads in a block (x, y, z)

  def slices(self, threads: int) -> int:
    """How many slices to launch on `threads` threads: several per thread, at most one per iteration."""
    if not self.parallel or threads <= 1: return 1
    wanted = SLICES_PER_THREAD * threads
    return wanted if self.parallel_size is None else max(1, min(wanted, self.parallel_size))

  def __repr__(self) -> str:
    return f"LoweredKernel({self.name}, {self.target.arch}, {list(self.opts)}, {len(self.program)} instructions)"


def _apply_opts(ast: UOp, target: Target, opts: Sequence[Opt]) -> UOp:
  """The opts applied: ranges split, kinds set (parallel, upcast, unroll, thread, ...), staged copies made."""
  kernel = apply_opts(ast, opts)
  if DEBUG >= 4: print(f"kernel {ast.arg} for {target.arch} after {list(opts)}:\n{kernel}")
  return kernel


def _map_to_gpu(ast: UOp, target: Target, opts: Sequence[Opt]) -> UOp:
  """GPU targets: no output loops or thread ranges left, SPECIAL grid and thread indices instead."""
  return map_to_gpu(ast, target) if target.is_gpu else ast


def _peel(ast: UOp, target: Target, opts: Sequence[Opt]) -> UOp:
  """CPU targets: no output loop whose gates hold on all but its last iteration (see peel.py)."""
  return ast if target.is_gpu else peel_remainders(ast)


def _bound_gated_loops(ast: UOp, target: Target, opts: Sequence[Opt]) -> UOp:
  """CPU targets: no sum loops over iterations where a gate zeroes every term (see bounds.py). A GPU's threads keep
  their gates: a loop bound that differs between the threads of a block would diverge them."""
  return ast if target.is_gpu else bound_gated_loops(ast)


def _expand_math(ast: UOp, target: Target, opts: Sequence[Opt]) -> UOp:
  """No THREEFRY, and no EXP2, LOG2 or SIN the target does not compute itself (see mathrules.py)."""
  return expand_math(ast, target)


def _expand(ast: UOp, target: Target, opts: Sequence[Opt]) -> UOp:
  """No upcast or unroll ranges: vectors and copies instead (see expand.py)."""
  return expand(ast, interleave=not target.is_gpu)


def _gated_indices(ast: UOp, target: Target, opts: Sequence[Opt]) -> UOp:
  """Gated loads' indices simplified under their gates (see gates.py)."""
  return simplify_gated_indices(ast)


Pass = Callable[[UOp, Target, Sequence[Opt]], UOp]
# (name, pass, the range kinds that no longer exist after it)
PASSES: list[tuple[str, Pass, frozenset[str]]] = [
  ("simplify_gated_indices", _gated_indices, frozenset()),
  ("apply_opts", _apply_opts, frozenset()),
  ("map_to_gpu", _map_to_gpu, frozenset({THREAD})),
  ("peel_remainders", _peel, frozenset()),
  ("bound_gated_loops", _bound_gated_loops, frozenset()),
  ("expand_math", _expand_math, frozenset()),
  ("expand", _expand, frozenset({UPCAST, UNROLL})),
]


def lower_kernel(ast: UOp, opts: Sequence[Opt] | None = None, target: Target | None = None) -> LoweredKernel:
  """The program of a kernel for a target (the host CPU by default) with the given opts (None: the heuristics')."""
  target = target or host_target()
  if opts is None:
    from rawgrad.compiler.codegen.opt.heuristic import hand_coded_opts
    opts = hand_coded_opts(ast, target)
  kernel = ast
  gone: frozenset[str] = frozenset()
  for name, run, removes in PASSES:
    kernel, gone = run(kernel, target, opts), gone | removes
    if SPEC: verify_lowering(name, kernel, gone)
  parallel = [r for r in all_ranges(kernel) if range_kind(r) == PARALLEL]
  program = place_arguments(linearize(kernel), target)
  if SPEC: verify_program(ast.arg, program)
  if DEBUG >= 5: print(format_program(ast.arg, program, target))
  size = parallel[0].src[0].arg if parallel and parallel[0].src[0].op is Ops.CONST else None
  global_size, local_size = launch_dims(program) if target.is_gpu else ((), ())
  return LoweredKernel(ast.arg, tuple(opts), program, target, bool(parallel), size, global_size, local_size)


def place_arguments(program: list[UOp], target: Target) -> list[UOp]:
  """The program reading its argument words (8 bytes for each buffer address and variable value) from its argument
  block, or from an argument table in device memory where they exceed the target's kernarg_bytes: one launch of a
  kernel over any number of buffers (a fused optimizer step over hundreds of parameters), never several."""
  params, variables = kernel_parameters(program)
  if 8 * (len(params) + len(variables)) <= target.kernarg_bytes: return program
  if DEBUG >= 3: print(f"{len(params)} buffers and {len(variables)} variables exceed the {target.kernarg_bytes} bytes "
                       f"of kernel arguments of {target.arch}: they are read from an argument table")
  return with_argument_table(program)


def format_program(name: str, program: list[UOp], target: Target) -> str:
  """The linear program one instruction per line, indented by loop depth: `  12 ADD float32 %9 %11`."""
  numbers: dict[UOp, int] = {}
  lines, depth = [f"program {name} for {target.arch} ({len(program)} instructions):"], 0
  for position, instruction in enumerate(program):
    if instruction.op is Ops.END: depth -= 1
    operands = " ".join(f"%{numbers[s]}" if s in numbers else _constant_text(s) for s in instruction.src)
    arg = "" if instruction.arg is None else f" {instruction.arg!r}"
    lines.append(f"{position:4d} {'  ' * depth}{instruction.op.name} {instruction.dtype!r}{arg} {operands}".rstrip())
    numbers[instruction] = position  # a use refers to the most recent appearance
    if instruction.op is Ops.RANGE: depth += 1
  return "\n".join(lines)


def _constant_text(node: UOp) -> str:
  return repr(node.arg) if node.op is Ops.CONST else f"<{node.op.name}>"
