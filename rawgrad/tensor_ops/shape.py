"""Tensor operations: shape."""
from __future__ import annotations


class ShapeOps:
  """Mixin of rawgrad.tensor.Tensor."""
  __slots__ = ()
