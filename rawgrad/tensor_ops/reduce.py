"""Tensor operations: reduce."""
from __future__ import annotations


class ReduceOps:
  """Mixin of rawgrad.tensor.Tensor."""
  __slots__ = ()
