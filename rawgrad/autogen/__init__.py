"""Generated ctypes bindings (nv/: NVIDIA, amd/: AMD), made by tools/autogen.py from the real C headers; never edit them by hand.

The one hand-written piece is the layout check below, shared by the generator (which runs it before writing) and
by tests/autogen (which runs it in CI against the gcc record, layouts.json).
"""
from __future__ import annotations

import ctypes


def bit_span(cls: type, field: str) -> tuple[int, int]:
  """(first bit, width) of a bit-field: set it to all ones in a zeroed instance and look at the bytes."""
  instance = cls()
  setattr(instance, field, -1)
  bits = int.from_bytes(bytes(instance), "little")
  first = (bits & -bits).bit_length() - 1
  return first, bits.bit_length() - first


def layout_mismatches(cls: type, record: dict) -> list[str]:
  """Where a ctypes class differs from the C layout `record`: {"size": n, "fields": {name: [offset, size]},
  "bitfields": {name: [first bit, width]}}, a size None where C cannot name the type (anonymous members)."""
  name, problems = cls.__name__, []
  if record["size"] is not None and ctypes.sizeof(cls) != record["size"]:
    problems.append(f"{name}: sizeof is {ctypes.sizeof(cls)} in ctypes, {record['size']} in C")
  for field, (offset, size) in record["fields"].items():
    if (got := getattr(cls, field).offset) != offset:
      problems.append(f"{name}.{field}: offset {got} in ctypes, {offset} in C")
    if size is not None and (got := getattr(cls, field).size) != size:
      problems.append(f"{name}.{field}: {got} bytes in ctypes, {size} in C")
  for field, span in record.get("bitfields", {}).items():
    if list(got := bit_span(cls, field)) != span:
      problems.append(f"{name}.{field}: bits (first, width) {got} in ctypes, {tuple(span)} in C")
  return problems
