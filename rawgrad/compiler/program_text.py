"""A linear program as text and back: how a program travels where machine code would (the SIM device's "binary",
the program an emulated GPU runs in place of a cubin or code object), and how a renderer embeds it."""
from __future__ import annotations

import json
from typing import Any

from rawgrad.compiler.ir import Ops, UOp
from rawgrad.dtype import DType, PtrDType, dtypes

PROGRAM_COMMENT = "; rawgrad program: "


def serialize_program(program: list[UOp]) -> str:
  """The program as JSON lines, one instruction each: [op, dtype, sources, arg]. A source is the number of the
  instruction that computed it (its most recent appearance) or, for a constant not in the program, the constant."""
  position: dict[UOp, int] = {}
  lines = []
  for number, instruction in enumerate(program):
    sources = [position[s] if s in position else {"const": [_dtype_text(s.dtype), _value_text(s.arg)]}
               for s in instruction.src]
    arg = _value_text(instruction.arg)
    lines.append(json.dumps([instruction.op.name, _dtype_text(instruction.dtype), sources, arg]))
    position[instruction] = number
  return "\n".join(lines)


def deserialize_program(text: str) -> list[UOp]:
  program: list[UOp] = []
  for line in text.splitlines():
    op, dtype, sources, arg = json.loads(line)
    src = tuple(program[s] if isinstance(s, int) else UOp(Ops.CONST, _dtype_of(s["const"][0]), (),
                                                          _value_of(s["const"][1])) for s in sources)
    program.append(UOp(Ops[op], _dtype_of(dtype), src, _value_of(arg)))
  return program


def _dtype_text(dtype: DType | PtrDType) -> Any:
  if isinstance(dtype, PtrDType): return {"ptr": _dtype_text(dtype.base), "size": dtype.size, "local": dtype.local}
  return [dtype.name, dtype.count]


def _dtype_of(text: Any) -> DType | PtrDType:
  if isinstance(text, dict): return _dtype_of(text["ptr"]).ptr(text["size"], text["local"])
  name, count = text
  return dtypes.void if name == "void" else dtypes.from_name(name).vec(count)


def _value_text(value: Any) -> Any:
  """JSON for an arg: floats by their exact hex (nan and inf included), tuples tagged, Ops by name."""
  if isinstance(value, bool) or value is None or isinstance(value, (int, str)): return value
  if isinstance(value, float): return {"float": value.hex()}
  if isinstance(value, tuple): return {"tuple": [_value_text(v) for v in value]}
  if isinstance(value, Ops): return {"op": value.name}
  raise TypeError(f"cannot serialize an arg of type {type(value).__name__}: {value!r}")


def _value_of(text: Any) -> Any:
  if not isinstance(text, dict): return text
  if "float" in text: return float.fromhex(text["float"])
  if "tuple" in text: return tuple(_value_of(v) for v in text["tuple"])
  return Ops[text["op"]]




def program_comment(program: list[UOp]) -> str:
  """The serialized program as comment lines of an LLVM IR module."""
  return "\n".join(PROGRAM_COMMENT + line for line in serialize_program(program).splitlines())


def program_from_comments(src: str) -> str | None:
  """The serialized program a module's comment lines carry (None when it carries none)."""
  lines = [line[len(PROGRAM_COMMENT):] for line in src.splitlines() if line.startswith(PROGRAM_COMMENT)]
  return "\n".join(lines) if lines else None
