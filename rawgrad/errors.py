"""The errors rawgrad raises for bad input, each a subclass of the exception PyTorch raises for the same mistake
(RuntimeError, mostly) and of the builtin exception Python code expects for it (ValueError, IndexError, TypeError),
so `except RuntimeError` written for torch and `except ValueError` written for numpy both catch them."""
from __future__ import annotations


class ShapeError(ValueError, RuntimeError):
  """Shapes or sizes that do not fit: tensors that do not broadcast, matmul's inner dims, reshape to another number of
  elements, negative sizes, reductions over nothing."""


class ArgumentError(ValueError, RuntimeError):
  """An argument value an operation cannot use (a zero step, an empty range of random integers, ...)."""


class IndexOutOfRange(IndexError, RuntimeError):
  """A dim, or an index value, outside the size it indexes."""


class DTypeError(TypeError, RuntimeError):
  """A dtype an operation cannot take: an integer tensor that should require gradients, an unknown dtype name."""


class OutOfMemoryError(RuntimeError, MemoryError):
  """An allocation larger than the device's memory."""


__all__ = ["ArgumentError", "DTypeError", "IndexOutOfRange", "OutOfMemoryError", "ShapeError"]
