"""Tensor operations: random."""
from __future__ import annotations


class RandomOps:
  """Mixin of rawgrad.tensor.Tensor."""
  __slots__ = ()
