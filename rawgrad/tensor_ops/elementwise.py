"""Tensor operations: elementwise."""
from __future__ import annotations


class ElementwiseOps:
  """Mixin of rawgrad.tensor.Tensor."""
  __slots__ = ()
