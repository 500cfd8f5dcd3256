"""Tensor operations: nn."""
from __future__ import annotations


class NNOps:
  """Mixin of rawgrad.tensor.Tensor."""
  __slots__ = ()
