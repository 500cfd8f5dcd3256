"""Linear programs as text and back (what SIM compiles to and emulated GPUs run)."""
import math

from rawgrad import Tensor
from rawgrad.compiler.codegen.lower import lower_kernel
from rawgrad.compiler.program_text import deserialize_program, program_comment, program_from_comments, \
  serialize_program
from rawgrad.compiler.rangeify import create_schedule
from rawgrad.compiler.target import gpu_target, host_target


def test_programs_round_trip_exactly() -> None:
  x = Tensor([[1.0, -math.inf, math.nan], [0.5, -0.0, 3.0]])
  for tensor in ((x * 1e-30).exp2().sum(1), (x.reshape(3, 2) @ x).max(0), x.cast(__import__("rawgrad").dtypes.int8)):
    ast = create_schedule([tensor.uop]).items[-1].ast
    for target in (host_target(), gpu_target("sm_90"), gpu_target("gfx942")):
      program = lower_kernel(ast, None, target).program
      text = serialize_program(program)
      again = deserialize_program(text)
      assert len(again) == len(program) and all(a is b for a, b in zip(again, program))  # hash-consed: identical
      assert program_from_comments("define void @k()\n" + program_comment(program)) == text


def test_a_module_without_comments_carries_no_program() -> None:
  assert program_from_comments("define void @k() {\n  ret void\n}") is None
