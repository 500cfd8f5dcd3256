"""tensor_ops/helpers.py: the mixins' base, and the shape and axis arguments, against numpy's rules."""
import itertools

import numpy as np
import pytest

from rawgrad import Tensor
from rawgrad.compiler.ir import UOp
from rawgrad.tensor_ops.elementwise import ElementwiseOps
from rawgrad.tensor_ops.helpers import TensorBase, broadcast_shape, reduce_axes, resolve_axis, shape_arg
from rawgrad.tensor_ops.nn import NNOps
from rawgrad.tensor_ops.random import RandomOps
from rawgrad.tensor_ops.reduce import ReduceOps
from rawgrad.tensor_ops.shape import ShapeOps


def test_every_mixin_shares_the_base_and_tensor_is_one() -> None:
  for mixin in (ElementwiseOps, ShapeOps, ReduceOps, NNOps, RandomOps): assert issubclass(mixin, TensorBase)
  assert isinstance(Tensor([1.0]), TensorBase) and not isinstance(np.ones(1), TensorBase)
  assert Tensor.__slots__ and TensorBase.__slots__ == ()


@pytest.mark.parametrize("ndim", [1, 2, 4])
def test_resolve_axis_matches_numpy(ndim: int) -> None:
  shape = tuple(range(2, 2 + ndim))
  for axis in range(-ndim, ndim):
    assert shape[resolve_axis(axis, ndim)] == np.empty(shape).shape[axis]
  for axis in (ndim, -ndim - 1):
    with pytest.raises(IndexError, match=f"axis {axis} is out of range for {ndim} dimensions"): resolve_axis(axis, ndim)


def test_a_scalar_accepts_axis_0_and_minus_1() -> None:
  assert resolve_axis(0, 0) == 0 and resolve_axis(-1, 0) == 0
  with pytest.raises(IndexError): resolve_axis(1, 0)


def test_reduce_axes() -> None:
  assert reduce_axes(None, 3) == (0, 1, 2) and reduce_axes(-1, 3) == (2,) and reduce_axes((2, 0), 3) == (0, 2)
  assert reduce_axes([], 3) == () and reduce_axes(None, 0) == ()
  with pytest.raises(ValueError, match="axis \\(1, -2\\) repeats an axis"): reduce_axes((1, -2), 3)


def test_shape_arg_takes_sizes_or_one_sequence() -> None:
  assert shape_arg((2, 3)) == (2, 3) and shape_arg(((2, 3),)) == (2, 3) and shape_arg(([4],)) == (4,)
  assert shape_arg(()) == ()
  n = UOp.variable("n", 1, 8)
  assert shape_arg((n, 2)) == (n, 2)
  with pytest.raises(TypeError, match="shape entries must be ints, got float 2.0"): shape_arg((2.0,))
  with pytest.raises(TypeError, match="got bool True"): shape_arg((True, 3))


def test_broadcast_shape_matches_numpy() -> None:
  shapes = [(), (1,), (3,), (4, 1), (4, 3), (2, 1, 3), (2, 4, 1), (0,), (1, 0)]
  for a, b in itertools.product(shapes, repeat=2):
    try:
      expected = np.broadcast_shapes(a, b)
    except ValueError:
      with pytest.raises(ValueError, match="cannot broadcast"): broadcast_shape(a, b)
    else:
      assert broadcast_shape(a, b) == expected, (a, b)
  assert broadcast_shape((5, 1, 1), (1, 4, 1), (1, 1, 3)) == (5, 4, 3)
  with pytest.raises(ValueError, match=r"cannot broadcast \(3,\) with \(4,\) with \(1,\)"):
    broadcast_shape((3,), (4,), (1,))
