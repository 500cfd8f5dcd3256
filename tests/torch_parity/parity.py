"""What the tests of this package share: one case of rawgrad.tools.compare_torch, asserted within tolerance."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from rawgrad.tools.compare_torch import Case, Input, run_case, table


def check(case: Case) -> None:
  """Run `case` in rawgrad and torch, forward and backward, and fail with its table line when above tolerance."""
  import torch
  result = run_case(torch, case)
  assert result.passed, "\n".join(table([result]))


def both(name: str, ours: Callable[..., Any], theirs: Callable[..., Any] | None = None, *inputs: Input,
         tolerance: float = 2e-5, backward: bool = True) -> Case:
  """A case whose torch form is the same call unless given."""
  return Case(name, ours, theirs or ours, inputs or (Input(),), tolerance, backward)


def values(array: Any, dtype: str = "float32") -> Input:
  return Input(values=np.asarray(array, dtype=dtype), dtype=dtype)
