"""rawgrad: a hardware-direct tensor runtime.

The public names load on first use, so that importing one layer (`import rawgrad.compiler`) loads that layer and
the ones below it, not the tensor, the engine and the runtime above.
"""
from __future__ import annotations

import importlib
from typing import Any

_PUBLIC = {"Context": "rawgrad.helpers", "Device": "rawgrad.runtime.device", "GlobalCounters": "rawgrad.helpers",
           "Tensor": "rawgrad.tensor", "Variable": "rawgrad.compiler.symbolic", "dtypes": "rawgrad.dtype",
           "jit": "rawgrad.tensor_jit", "ArgumentError": "rawgrad.errors", "DTypeError": "rawgrad.errors",
           "IndexOutOfRange": "rawgrad.errors", "OutOfMemoryError": "rawgrad.errors", "ShapeError": "rawgrad.errors"}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
  if name not in _PUBLIC: raise AttributeError(f"module 'rawgrad' has no attribute {name!r}")
  value = getattr(importlib.import_module(_PUBLIC[name]), name)
  globals()[name] = value  # later lookups find it directly
  return value


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(__all__))
