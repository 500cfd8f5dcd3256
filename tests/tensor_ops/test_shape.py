"""Shape operations (rawgrad/tensor_ops/shape.py): values against numpy, errors, and gradients in float64."""
import numpy as np
import pytest

from rawgrad import Tensor
from rawgrad.dtype import dtypes

RNG = np.random.default_rng(0)


def data(shape: tuple, dtype: str = "float32") -> np.ndarray:
  if dtype == "bool": return RNG.random(shape) < 0.5
  if dtype == "int32": return RNG.integers(-50, 50, shape).astype(np.int32)
  return RNG.standard_normal(shape).astype(dtype)


def check(result: Tensor, expected: np.ndarray) -> None:
  expected = np.asarray(expected)
  assert result.shape == expected.shape, f"shape {result.shape} != {expected.shape}"
  actual = result.numpy()
  assert actual.dtype == expected.dtype, f"dtype {actual.dtype} != {expected.dtype}"
  np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-6)


def strided(array: np.ndarray) -> tuple[Tensor, np.ndarray]:
  """A non-contiguous view: the transposed tensor, as rawgrad Tensor and as numpy."""
  return Tensor(np.ascontiguousarray(array.T)).T, array


def selection_grad(numpy_fn, shape: tuple, weight: np.ndarray) -> np.ndarray:
  """The gradient of sum(fn(x) * weight) for an fn whose every output is one input element or a constant: run fn on
  element ids (0 for "no source") and add each weight to the element it came from."""
  ids = np.arange(1, int(np.prod(shape)) + 1, dtype=np.float64).reshape(shape)
  sources = np.asarray(numpy_fn(ids)).astype(np.int64)
  grad = np.zeros(ids.size + 1)
  np.add.at(grad, sources.ravel(), weight.ravel())
  return grad[1:].reshape(shape)


def check_grad(tensor_fn, numpy_fn, shape: tuple) -> None:
  x = RNG.standard_normal(shape)
  out_shape = np.asarray(numpy_fn(x)).shape
  weight = RNG.standard_normal(out_shape)
  target = Tensor(x, requires_grad=True)
  (grad,) = (tensor_fn(target) * Tensor(weight)).sum().gradient(target)
  np.testing.assert_allclose(grad.numpy(), selection_grad(numpy_fn, shape, weight), rtol=1e-12, atol=1e-12)


# *** reshaping and reordering ***

def test_unflatten():
  x = data((2, 12, 3))
  check(Tensor(x).unflatten(1, (3, 4)), x.reshape(2, 3, 4, 3))
  check(Tensor(x).unflatten(-2, (2, -1, 3)), x.reshape(2, 2, 2, 3, 3))
  with pytest.raises(ValueError, match=r"\(5, -1\).*12"): Tensor(x).unflatten(1, (5, -1))
  with pytest.raises(ValueError, match="more than one -1"): Tensor(x).unflatten(1, (-1, -1))


def test_view_reshape_expand_as():
  x = data((2, 3))
  check(Tensor(x).view_as(Tensor(data((3, 2)))), x.reshape(3, 2))
  check(Tensor(x).reshape_as(Tensor(data((6,)))), x.reshape(6))
  check(Tensor(x[:1]).expand_as(Tensor(data((4, 2, 3)))), np.broadcast_to(x[:1], (4, 2, 3)))


@pytest.mark.parametrize("source, destination", [(0, -1), (-1, 0), ((0, 1), (2, 0)), ([3, 0], [0, 1])])
def test_movedim(source, destination):
  x = data((2, 3, 4, 5))
  check(Tensor(x).movedim(source, destination), np.moveaxis(x, source, destination))
  check(Tensor(x).moveaxis(source, destination), np.moveaxis(x, source, destination))


def test_movedim_errors():
  x = Tensor(data((2, 3)))
  with pytest.raises(ValueError, match="as many"): x.movedim((0, 1), 0)
  with pytest.raises(ValueError, match="repeat"): x.movedim((0, 0), (0, 1))
  with pytest.raises(IndexError, match="out of range"): x.movedim(2, 0)


def test_swapaxes_swapdims():
  x = data((2, 3, 4), "int32")
  check(Tensor(x).swapaxes(0, -1), np.swapaxes(x, 0, -1))
  check(Tensor(x).swapdims(1, 2), np.swapaxes(x, 1, 2))


def test_narrow():
  x = data((5, 6))
  check(Tensor(x).narrow(1, 2, 3), x[:, 2:5])
  check(Tensor(x).narrow(-2, -2, 2), x[3:5])
  check(Tensor(x).narrow(0, 5, 0), x[5:5])
  with pytest.raises(IndexError, match="length 3 from 4.*size 6"): Tensor(x).narrow(1, 4, 3)
  with pytest.raises(IndexError, match="start 7"): Tensor(x).narrow(1, 7, 0)


# *** repeating ***

@pytest.mark.parametrize("dtype", ["float32", "int32", "bool"])
def test_repeat(dtype):
  x = data((2, 3), dtype)
  check(Tensor(x).repeat(2, 3), np.tile(x, (2, 3)))
  check(Tensor(x).repeat((2, 1, 2)), np.tile(x, (2, 1, 2)))
  check(Tensor(x).repeat(0, 2), np.tile(x, (0, 2)))


def test_repeat_strided_and_errors():
  view, x = strided(data((3, 2)))
  check(view.repeat(1, 2), np.tile(x, (1, 2)))
  check(Tensor(x).tile(2), np.tile(x, 2))
  check(Tensor(x).tile((2, 1, 1)), np.tile(x, (2, 1, 1)))
  with pytest.raises(ValueError, match=r"at least 2.*\(3,\)"): Tensor(x).repeat(3)
  with pytest.raises(ValueError, match="negative"): Tensor(x).repeat(-1, 1)


@pytest.mark.parametrize("dtype", ["float32", "int32", "bool"])
def test_repeat_interleave(dtype):
  x = data((2, 3), dtype)
  check(Tensor(x).repeat_interleave(2, 1), np.repeat(x, 2, 1))
  check(Tensor(x).repeat_interleave(3, -2), np.repeat(x, 3, 0))
  check(Tensor(x).repeat_interleave(2), np.repeat(x, 2))
  with pytest.raises(TypeError, match="int count"): Tensor(x).repeat_interleave(Tensor([1, 2]), 0)


@pytest.mark.parametrize("shifts, dims", [(1, 0), (-2, 1), ((1, 7), (0, -1)), (5, None), (4, 1), (0, 0)])
def test_roll(shifts, dims):
  view, x = strided(data((3, 4), "int32"))
  check(view.roll(shifts, dims), np.roll(x, shifts, dims))


def test_roll_errors():
  with pytest.raises(ValueError, match="one shift per dim"): Tensor(data((2, 2))).roll((1, 2), 0)


# *** triangles and masks ***

@pytest.mark.parametrize("dtype", ["float32", "int32", "bool"])
@pytest.mark.parametrize("diagonal", [0, 1, -2])
def test_tril_triu(dtype, diagonal):
  x = data((2, 4, 5), dtype)
  check(Tensor(x).tril(diagonal), np.tril(x, diagonal))
  check(Tensor(x).triu(diagonal), np.triu(x, diagonal))


def test_tril_errors():
  with pytest.raises(ValueError, match=r"2 dimensions.*\(3,\)"): Tensor(data((3,))).tril()


@pytest.mark.parametrize("dtype", ["float32", "int32", "bool"])
def test_masked_fill(dtype):
  view, x = strided(data((3, 4), dtype))
  mask = data((4,), "bool")
  value = True if dtype == "bool" else 7
  check(view.masked_fill(Tensor(mask), value), np.where(mask, np.array(value, x.dtype), x))
  check(view.masked_fill(Tensor(mask), Tensor(value)), np.where(mask, np.array(value, x.dtype), x))


def test_masked_fill_keeps_dtype_and_errors():
  x = data((2, 3), "int32")
  mask = data((2, 3), "bool")
  check(Tensor(x).masked_fill(Tensor(mask), 2.7), np.where(mask, 2, x).astype(np.int32))
  with pytest.raises(TypeError, match="bool mask.*int32"): Tensor(x).masked_fill(Tensor(x), 0)
  with pytest.raises(ValueError, match=r"\(4, 2, 3\).*\(2, 3\)"):
    Tensor(x).masked_fill(Tensor(data((4, 2, 3), "bool")), 0)


def test_one_hot():
  labels = np.array([[0, 3], [2, 1]], dtype=np.int32)
  check(Tensor(labels).one_hot(5), np.eye(5, dtype=np.int32)[labels])
  check(Tensor(labels).one_hot(), np.eye(4, dtype=np.int32)[labels])
  with pytest.raises(TypeError, match="integer dtype.*float32"): Tensor(data((2,))).one_hot(3)


# *** joining and splitting ***

@pytest.mark.parametrize("dtype", ["float32", "int32", "bool"])
def test_cat(dtype):
  a, b, c = data((2, 3), dtype), data((2, 1), dtype), data((2, 4), dtype)
  check(Tensor.cat(Tensor(a), Tensor(b), Tensor(c), dim=1), np.concatenate([a, b, c], 1))
  check(Tensor.cat([Tensor(a), Tensor(b)], dim=-1), np.concatenate([a, b], 1))
  check(Tensor.cat((Tensor(a), Tensor(b)), 1), np.concatenate([a, b], 1))
  check(Tensor(a).cat(Tensor(a), dim=0), np.concatenate([a, a], 0))


def test_cat_strided_empty_and_promotion():
  view, x = strided(data((3, 2)))
  empty = np.zeros((0, 2), np.float32)
  check(view.cat(Tensor(empty), Tensor(x * 2), dim=0), np.concatenate([x, empty, x * 2]))
  check(Tensor(empty).cat(Tensor(empty)), np.zeros((0, 2), np.float32))
  ints = data((1, 2), "int32")
  check(Tensor(x).cat(Tensor(ints)), np.concatenate([x, ints.astype(np.float32)]))
  check(Tensor(x).cat(), x)


def test_cat_errors():
  a, b = Tensor(data((2, 3))), Tensor(data((3, 3)))
  with pytest.raises(ValueError, match=r"dim 1.*\(2, 3\), \(3, 3\)"): a.cat(b, dim=1)
  with pytest.raises(ValueError, match=r"\(2, 3\), \(3,\)"): a.cat(Tensor(data((3,))))
  with pytest.raises(IndexError, match="out of range"): a.cat(a, dim=2)
  with pytest.raises(TypeError, match="takes tensors"): a.cat(np.zeros((2, 3)))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_stack(dim):
  arrays = [data((2, 3), "int32") for _ in range(3)]
  check(Tensor.stack(*[Tensor(a) for a in arrays], dim=dim), np.stack(arrays, dim))
  check(Tensor.stack([Tensor(a) for a in arrays], dim), np.stack(arrays, dim))
  check(Tensor(arrays[0]).stack(Tensor(arrays[1]), dim=dim), np.stack(arrays[:2], dim))


def test_stack_errors():
  with pytest.raises(ValueError, match=r"equal shape.*\(2, 3\), \(3, 2\)"):
    Tensor.stack(Tensor(data((2, 3))), Tensor(data((3, 2))))
  with pytest.raises(IndexError, match="out of range"): Tensor.stack(Tensor(data((2, 3))), dim=3)


def test_split():
  x = data((7, 2))
  pieces = Tensor(x).split(3)
  assert [p.shape for p in pieces] == [(3, 2), (3, 2), (1, 2)]
  for piece, expected in zip(pieces, np.split(x, [3, 6])): check(piece, expected)
  for piece, expected in zip(Tensor(x).split([2, 0, 5]), np.split(x, [2, 2])): check(piece, expected)
  for piece, expected in zip(Tensor(x).split(1, dim=-1), np.split(x, 2, 1)): check(piece, expected)
  assert [p.shape for p in Tensor(np.zeros((0, 2))).split(2)] == [(0, 2)]
  with pytest.raises(ValueError, match=r"\[2, 2\] do not sum to 7"): Tensor(x).split([2, 2])
  with pytest.raises(ValueError, match="positive"): Tensor(x).split(0)


def test_chunk():
  x = data((2, 6))
  assert [p.shape[1] for p in Tensor(x).chunk(4, 1)] == [2, 2, 2]
  assert [p.shape[1] for p in Tensor(x[:, :5]).chunk(3, -1)] == [2, 2, 1]
  for piece, expected in zip(Tensor(x).chunk(3, 1), np.split(x, 3, 1)): check(piece, expected)
  assert [p.shape for p in Tensor(np.zeros((0,))).chunk(3)] == [(0,)] * 3
  with pytest.raises(ValueError, match="positive number of chunks, got 0"): Tensor(x).chunk(0)


def test_zero_size_inputs():
  x, empty = data((3, 4)), np.zeros((0, 4), np.float32)
  no_index = np.zeros((3, 0), np.int32)
  check(Tensor(x).gather(1, Tensor(no_index)), np.zeros((3, 0), np.float32))
  check(Tensor(x).scatter(1, Tensor(no_index), 1.0), x)
  check(Tensor(x).scatter(1, Tensor(no_index), 1.0, reduce="multiply"), x)
  check(Tensor(x)._advanced_getitem([]), x[[]])
  check(Tensor(x)._advanced_getitem(Tensor(x > 100)), x[x > 100])
  check(Tensor(empty)._advanced_getitem((slice(None), [1, 2])), empty[:, [1, 2]])
  check(Tensor(empty).roll(1, 0), empty)
  check(Tensor(empty).padded((1, 1), "replicate"), np.pad(empty, ((0, 0), (1, 1)), "edge"))
  check(Tensor.stack(Tensor(empty), Tensor(empty)), np.stack([empty, empty]))
  check(Tensor(np.zeros((2, 0), np.int32)).one_hot(3), np.zeros((2, 0, 3), np.int32))


# *** padding with modes ***

NUMPY_MODE = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}


@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("pad", [(1, 2), (2, 0, 1, 3), (0, 0, 0, 1, 1, 0)])
def test_padded_modes(mode, pad):
  view, x = strided(data((3, 4, 5)))
  widths = [(0, 0)] * (3 - len(pad) // 2) + [(pad[i], pad[i + 1]) for i in range(len(pad) - 2, -1, -2)]
  check(view.padded(pad, mode), np.pad(x, widths, NUMPY_MODE[mode]))


@pytest.mark.parametrize("dtype", ["int32", "bool"])
def test_padded_dtypes(dtype):
  x = data((2, 3), dtype)
  check(Tensor(x).padded((1, 1), "reflect"), np.pad(x, ((0, 0), (1, 1)), "reflect"))
  check(Tensor(x).padded((0, 0, 1, 0), value=1), np.pad(x, ((1, 0), (0, 0)), constant_values=1))


def test_padded_crop_and_value():
  x = data((4, 5))
  check(Tensor(x).padded((-1, 2), value=3.5), np.pad(x[:, 1:], ((0, 0), (0, 2)), constant_values=3.5))
  check(Tensor(x).padded((1, -2, -1, 0)), np.pad(x[1:, :3], ((0, 0), (1, 0))))
  # torch crops first, then pads from the cropped edges
  check(Tensor(x).padded((-1, 2), "reflect"), np.pad(x[:, 1:], ((0, 0), (0, 2)), "reflect"))
  check(Tensor(x).padded((-1, 2), "circular"), np.pad(x[:, 1:], ((0, 0), (0, 2)), "wrap"))


def test_padded_errors():
  x = Tensor(data((2, 3)))
  with pytest.raises(ValueError, match=r"even length.*\(2, 3\)"): x.padded((1,))
  with pytest.raises(ValueError, match="at most 4"): x.padded((1,) * 6)
  with pytest.raises(ValueError, match="'mirror' is not one of"): x.padded((1, 1), "mirror")
  with pytest.raises(ValueError, match="reflect pad.*at most 2"): x.padded((3, 0), "reflect")
  with pytest.raises(ValueError, match="circular pad.*at most 2"): x.padded((0, 0, 0, 3), "circular")
  with pytest.raises(ValueError, match="crops more"): x.padded((-2, -2))
  with pytest.raises(ValueError, match="only applies"): x.padded((1, 1), "reflect", value=1.0)


# *** gathering and scattering ***

@pytest.mark.parametrize("dtype", ["float32", "int32", "bool"])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_gather(dtype, dim):
  view, x = strided(data((4, 5), dtype))
  axis = dim % 2
  index_shape = (3, 2) if axis == 0 else (2, 6)
  index = RNG.integers(0, x.shape[axis], index_shape).astype(np.int32)
  source = x[:index_shape[0]] if axis == 1 else x[:, :index_shape[1]]
  check(view.gather(dim, Tensor(index)), np.take_along_axis(source, index, axis))


def test_gather_errors():
  x = Tensor(data((3, 4)))
  with pytest.raises(TypeError, match="integer dtype.*float32"): x.gather(0, Tensor(data((3, 4))))
  with pytest.raises(TypeError, match="integer dtype.*bool"): x.gather(0, Tensor(data((3, 4), "bool")))
  with pytest.raises(ValueError, match=r"\(2, 5\).*\(3, 4\)"): x.gather(0, Tensor(np.zeros((2, 5), np.int32)))
  with pytest.raises(ValueError, match=r"\(3,\).*\(3, 4\)"): x.gather(0, Tensor(np.zeros((3,), np.int32)))
  with pytest.raises(IndexError, match="out of range"): x.gather(2, Tensor(np.zeros((3, 4), np.int32)))


def test_take_along_dim():
  x = data((3, 4, 5))
  index = RNG.integers(0, 4, (1, 6, 5)).astype(np.int32)
  check(Tensor(x).take_along_dim(Tensor(index), 1), np.take_along_axis(x, index, 1))
  flat = RNG.integers(0, 60, (7,)).astype(np.int32)
  check(Tensor(x).take_along_dim(Tensor(flat)), np.take_along_axis(x.ravel(), flat, 0))
  with pytest.raises(ValueError, match=r"\(6,\).*3 dims"): Tensor(x).take_along_dim(Tensor(flat[:6]), 0)


@pytest.mark.parametrize("dtype", ["float32", "int32", "bool"])
def test_index_select(dtype):
  view, x = strided(data((4, 5), dtype))
  index = np.array([3, 0, 3, 1, 4, 2], np.int32)
  check(view.index_select(1, Tensor(index)), np.take(x, index, 1))
  check(view.index_select(-2, Tensor(index[:3])), np.take(x, index[:3], 0))
  check(view.index_select(0, Tensor(2)), x[2:3])
  check(view.index_select(0, Tensor(np.zeros(0, np.int32))), x[:0])
  with pytest.raises(ValueError, match=r"1-D.*\(2, 2\)"): view.index_select(0, Tensor(np.zeros((2, 2), np.int32)))


def scatter_reference(x: np.ndarray, dim: int, index: np.ndarray, src: np.ndarray, reduce: str,
                      include_self: bool = True) -> np.ndarray:
  """torch.scatter_reduce by loops ('replace' writes, summing repeats)."""
  sent: dict[tuple, list] = {}
  for position in np.ndindex(index.shape):
    target = list(position)
    target[dim] = index[position]
    sent.setdefault(tuple(target), []).append(src[position])
  result = x.copy()
  mean = (lambda v: np.floor_divide(np.sum(v), len(v))) if np.issubdtype(x.dtype, np.integer) else np.mean
  combine = {"replace": np.sum, "sum": np.sum, "prod": np.prod, "mean": mean, "amax": np.max, "amin": np.min}
  for target, values in sent.items():
    if include_self and reduce != "replace": values = [x[target], *values]
    result[target] = combine[reduce](values)
  return result


@pytest.mark.parametrize("dtype", ["float32", "int32"])
@pytest.mark.parametrize("dim", [0, -1])
def test_scatter(dtype, dim):
  x, src = data((4, 5), dtype), data((3, 6), dtype)
  axis = dim % 2
  index_shape = (3, 4) if axis == 0 else (3, 2)
  # distinct targets per line, as torch needs for a defined result
  index = np.argsort(RNG.random((x.shape[axis], *index_shape[1 - axis:1 - axis + 1])), 0)[:index_shape[axis]]
  index = (index if axis == 0 else index.T).astype(np.int32)
  check(Tensor(x).scatter(dim, Tensor(index), Tensor(src)), scatter_reference(x, axis, index, src, "replace"))
  check(Tensor(x).scatter(dim, Tensor(index), 3), scatter_reference(x, axis, index, np.full(index.shape, 3, x.dtype),
                                                                    "replace"))


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(reduce, include_self):
  x, src = data((3, 4)), data((3, 5))
  index = RNG.integers(0, 4, (2, 5)).astype(np.int32)
  expected = scatter_reference(x, 1, index, src, reduce, include_self)
  check(Tensor(x).scatter_reduce(1, Tensor(index), Tensor(src), reduce, include_self=include_self), expected)


@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_int_mean_rounds_down(include_self):
  x, src = data((2, 3), "int32"), data((2, 6), "int32")
  index = RNG.integers(0, 3, (2, 6)).astype(np.int32)
  expected = scatter_reference(x, 1, index, src, "mean", include_self)
  check(Tensor(x).scatter_reduce(1, Tensor(index), Tensor(src), "mean", include_self=include_self), expected)


def test_scatter_add_multiply_and_bool():
  x, src = data((3, 4), "int32"), data((4, 4), "int32")
  index = RNG.integers(0, 3, (4, 4)).astype(np.int32)
  check(Tensor(x).scatter_add(0, Tensor(index), Tensor(src)), scatter_reference(x, 0, index, src, "sum"))
  check(Tensor(x).scatter(0, Tensor(index), Tensor(src), reduce="add"), scatter_reference(x, 0, index, src, "sum"))
  check(Tensor(x).scatter(0, Tensor(index), Tensor(src), reduce="multiply"),
        scatter_reference(x, 0, index, src, "prod"))
  flags = np.zeros((2, 3), bool)
  check(Tensor(flags).scatter(1, Tensor(np.array([[2], [0]], np.int32)), True), np.array([[0, 0, 1], [1, 0, 0]], bool))


def test_scatter_errors():
  x = Tensor(data((3, 4)))
  index = Tensor(np.zeros((2, 2), np.int32))
  with pytest.raises(TypeError, match="integer dtype.*float32"): x.scatter(0, Tensor(data((2, 2))), 1.0)
  with pytest.raises(ValueError, match=r"index of shape \(4, 5\)"):
    x.scatter(0, Tensor(np.zeros((4, 5), np.int32)), 1.0)
  with pytest.raises(ValueError, match=r"src of shape \(1, 2\)"): x.scatter(0, index, Tensor(data((1, 2))))
  with pytest.raises(ValueError, match="'max'"): x.scatter(0, index, 1.0, reduce="max")
  with pytest.raises(ValueError, match="'median' is not one of"): x.scatter_reduce(0, index, x, "median")


# *** advanced indexing ***

def numpy_index(item):
  if isinstance(item, tuple): return tuple(numpy_index(i) for i in item)
  return item.numpy() if isinstance(item, Tensor) else item


def index_tensor(values) -> Tensor:
  array = np.asarray(values, np.int32)
  return Tensor(array.reshape(-1)).reshape(array.shape)


ADVANCED_INDICES = [
  lambda: index_tensor([3, 0, -1]),
  lambda: (slice(None), index_tensor([[0, 1], [4, 2]])),
  lambda: (index_tensor([0, 2]), index_tensor([1, 4])),
  lambda: (index_tensor([[0], [2]]), slice(1, 4), index_tensor([1, 2, 0])),  # separated: index dims go first
  lambda: (Ellipsis, index_tensor([1, 0])),
  lambda: (None, index_tensor([1, 0]), None, slice(None, None, 2)),
  lambda: ([1, 3], slice(None), [[0], [-1]]),
  lambda: (slice(None, 2), [True, False, True, True, False]),
  lambda: Tensor(np.arange(60).reshape(4, 5, 3) % 3 == 0),
  lambda: (Tensor(np.arange(20).reshape(4, 5) % 4 == 1), index_tensor([2])),
  lambda: (slice(None), index_tensor(np.zeros(0, np.int32))),
  lambda: np.array([2, 2, 1]),
  lambda: ((0, 2), slice(None), 1),
]


@pytest.mark.parametrize("dtype", ["float32", "int32", "bool"])
@pytest.mark.parametrize("case", range(len(ADVANCED_INDICES)))
def test_advanced_getitem_matches_numpy(dtype, case):
  view, x = strided(data((3, 5, 4), dtype).transpose(2, 1, 0).copy())
  index = ADVANCED_INDICES[case]()
  check(view._advanced_getitem(index), x[numpy_index(index)])


def test_advanced_getitem_torch_placement():
  x = data((3, 4, 5))
  rows = index_tensor([1, 2])
  # ints select before tensor indices are placed, so they do not separate them (numpy would put (2,) first)
  check(Tensor(x)._advanced_getitem((0, slice(None), rows)), x[0][:, [1, 2]])
  check(Tensor(x)._advanced_getitem((index_tensor(0), slice(None), rows)), x[0][:, [1, 2]])
  check(Tensor(x)._advanced_getitem((slice(None), index_tensor(1), rows)), x[:, 1, [1, 2]])
  check(Tensor(x)._advanced_getitem((rows, None, rows)), x[[1, 2], None, [1, 2]])
  # a bool adds a dim of size 1 (True) or 0 (False) that is indexed like a tensor
  check(Tensor(x)._advanced_getitem(True), x[None])
  check(Tensor(x)._advanced_getitem(False), x[None][:0])
  check(Tensor(x)._advanced_getitem((slice(None), True, rows)), x[:, [1, 2]])
  check(Tensor(x)._advanced_getitem((Ellipsis, rows, True)), x[..., [1, 2]])
  check(Tensor(x)._advanced_getitem((Tensor(True), 1)), x[None, 1])
  check(Tensor(x)._advanced_getitem((slice(1, 3), 2)), x[1:3, 2])


def test_advanced_getitem_against_torch():
  torch = pytest.importorskip("torch")
  x = data((3, 4, 5))
  cases = [(0, slice(None), [1, 2]), (slice(None), True, [1, 2]), ([[0], [2]], None, [1, 2]), (Ellipsis, [0, 1], True),
           ([0, 1], 2, slice(None), None), (None, [True, False, True], 1, [0, 4]), ((0, 2), slice(None), 1)]
  for index in cases:
    expected = torch.from_numpy(x)[index].numpy()
    check(Tensor(x)._advanced_getitem(index), expected)


def test_setitem_writes_what_torch_writes():
  """Tensor, list and boolean-mask indices select copies: a write through them used to be lost without a word."""
  torch = pytest.importorskip("torch")
  x = data((3, 4, 5))
  mask = x[:, :, 0] > 0
  rows, columns = np.array([0, 2]), np.array([1, 3])
  cases = [([1, 2], [1, 2], 7.0), (Tensor(rows), torch.from_numpy(rows), data((4, 5))),
           ((Tensor(rows), Tensor(columns)), (torch.from_numpy(rows), torch.from_numpy(columns)), -1.0),
           ((1, slice(None), [0, 4]), (1, slice(None), [0, 4]), data((4, 2))),
           (Tensor(mask), torch.from_numpy(mask), 3.0), ((Ellipsis, [4, 0]), (Ellipsis, [4, 0]), data((3, 4, 1))),
           ((slice(1, None), 2), (slice(1, None), 2), data((5,))), ([2, 2], [2, 2], 5.0)]
  for index, torch_index, value in cases:
    ours, theirs = Tensor(x.copy()), torch.from_numpy(x.copy())
    ours[index] = Tensor(value) if isinstance(value, np.ndarray) else value
    theirs[torch_index] = torch.from_numpy(value) if isinstance(value, np.ndarray) else value
    check(ours, theirs.numpy())


def test_advanced_getitem_non_buffer_source():
  x = data((4, 3))
  computed = Tensor(x) * 2 + 1
  check(computed._advanced_getitem((index_tensor([3, 1]), slice(None, None, -1))), (x * 2 + 1)[[3, 1], ::-1])


def test_advanced_getitem_errors():
  x = Tensor(data((3, 4)))
  with pytest.raises(IndexError, match="index 3 is out of bounds for dim 0 with size 3"): x._advanced_getitem([0, 3])
  with pytest.raises(IndexError, match="index -5 is out of bounds for dim 1 with size 4"):
    x._advanced_getitem((slice(None), [-5]))
  with pytest.raises(IndexError, match="index 4 is out of bounds for dim 1 with size 4"):
    x._advanced_getitem((index_tensor([0]), 4))
  with pytest.raises(IndexError, match=r"mask of shape \(3, 3\).*\(3, 4\)"):
    x._advanced_getitem(Tensor(np.ones((3, 3), bool)))
  with pytest.raises(IndexError, match=r"shapes \(2,\), \(3,\)"): x._advanced_getitem((index_tensor([0, 1]), [0, 1, 2]))
  with pytest.raises(IndexError, match="integer or bool dtype, got dtypes.float32"): x._advanced_getitem(Tensor([0.0]))
  with pytest.raises(IndexError, match="too many indices"): x._advanced_getitem((0, 0, index_tensor([0])))
  with pytest.raises(IndexError, match="single ellipsis"): x._advanced_getitem((Ellipsis, Ellipsis, [0]))


def test_basic_getitem_passes_through():
  x = data((3, 4))
  check(Tensor(x)._advanced_getitem((slice(None), 1)), x[:, 1])
  check(Tensor(x)._advanced_getitem((np.int64(2), None)), x[2, None])


# *** gradients (float64) ***

GRADIENT_CASES = {
  "cat": (lambda t: t.cat(t[:, :2] * 1, t, dim=1), lambda a: np.concatenate([a, a[:, :2], a], 1)),
  "stack": (lambda t: Tensor.stack(t, t.flip(0), dim=-1), lambda a: np.stack([a, a[::-1]], -1)),
  "gather": (lambda t: t.gather(1, index_tensor([[0, 0, 3], [2, 1, 0], [1, 1, 1]])),
             lambda a: np.take_along_axis(a, np.array([[0, 0, 3], [2, 1, 0], [1, 1, 1]]), 1)),
  "index_select": (lambda t: t.index_select(0, index_tensor([2, 2, 0])), lambda a: a[[2, 2, 0]]),
  "roll": (lambda t: t.roll((1, -1), (0, 1)), lambda a: np.roll(a, (1, -1), (0, 1))),
  "repeat": (lambda t: t.repeat(2, 1, 3), lambda a: np.tile(a, (2, 1, 3))),
  "repeat_interleave": (lambda t: t.repeat_interleave(2, 1), lambda a: np.repeat(a, 2, 1)),
  "pad_constant": (lambda t: t.padded((1, -1, 2, 0), value=5.0), lambda a: np.pad(a[:, :3], ((2, 0), (1, 0)))),
  "pad_reflect": (lambda t: t.padded((2, 1, 1, 2), "reflect"), lambda a: np.pad(a, ((1, 2), (2, 1)), "reflect")),
  "pad_replicate": (lambda t: t.padded((2, 1), "replicate"), lambda a: np.pad(a, ((0, 0), (2, 1)), "edge")),
  "pad_circular": (lambda t: t.padded((0, 0, 3, 1), "circular"), lambda a: np.pad(a, ((3, 1), (0, 0)), "wrap")),
  "advanced_index": (lambda t: t._advanced_getitem((index_tensor([[0, 2], [2, 2]]), slice(None, None, 2))),
                     lambda a: a[[[0, 2], [2, 2]], ::2]),
  "mask_index": (lambda t: t._advanced_getitem(Tensor(np.arange(12).reshape(3, 4) % 3 == 0)),
                 lambda a: a[np.arange(12).reshape(3, 4) % 3 == 0]),
  "masked_fill": (lambda t: t.masked_fill(Tensor(np.array([True, False, False, True])), 2.0),
                  lambda a: np.where([True, False, False, True], 0, a)),
  "tril": (lambda t: t.tril(1), lambda a: np.tril(a, 1)),
}


@pytest.mark.parametrize("name", list(GRADIENT_CASES))
def test_gradient_of_selection(name):
  tensor_fn, numpy_fn = GRADIENT_CASES[name]
  check_grad(tensor_fn, numpy_fn, (3, 4))


def test_gradient_of_scatter():
  x, src = RNG.standard_normal((3, 4)), RNG.standard_normal((2, 4))
  index = np.array([[2, 0, 1, 1], [0, 0, 2, 1]], np.int32)
  weight = RNG.standard_normal((3, 4))
  for reduce in ("replace", "sum"):
    target, source = Tensor(x, requires_grad=True), Tensor(src, requires_grad=True)
    result = target.scatter(0, Tensor(index), source) if reduce == "replace" else target.scatter_add(0, Tensor(index),
                                                                                                       source)
    grad_x, grad_src = (result * Tensor(weight)).sum().gradient(target, source)
    written = np.zeros((3, 4), bool)
    np.put_along_axis(written, index.astype(np.int64), True, 0)
    expected_x = np.where(written, 0, weight) if reduce == "replace" else weight
    np.testing.assert_allclose(grad_x.numpy(), expected_x, rtol=1e-12)
    np.testing.assert_allclose(grad_src.numpy(), np.take_along_axis(weight, index, 0), rtol=1e-12)


def numeric_gradient(fn, x: np.ndarray, step: float = 1e-6) -> np.ndarray:
  grad = np.zeros_like(x)
  for position in np.ndindex(x.shape):
    up, down = x.copy(), x.copy()
    up[position] += step
    down[position] -= step
    grad[position] = (fn(up) - fn(down)) / (2 * step)
  return grad


@pytest.mark.parametrize("reduce", ["amax", "mean", "prod"])
def test_gradient_of_scatter_reduce(reduce):
  x, src = RNG.standard_normal((2, 3)), RNG.standard_normal((2, 4))
  index = Tensor(np.array([[0, 2, 2, 0], [1, 1, 1, 2]], np.int32))
  weight = Tensor(RNG.standard_normal((2, 3)))

  def loss(self_values: np.ndarray, src_values: np.ndarray) -> Tensor:
    return (Tensor(self_values).scatter_reduce(1, index, Tensor(src_values), reduce) * weight).sum()

  target, source = Tensor(x, requires_grad=True), Tensor(src, requires_grad=True)
  grad_x, grad_src = (target.scatter_reduce(1, index, source, reduce) * weight).sum().gradient(target, source)
  np.testing.assert_allclose(grad_x.numpy(), numeric_gradient(lambda v: loss(v, src).item(), x), atol=1e-6)
  np.testing.assert_allclose(grad_src.numpy(), numeric_gradient(lambda v: loss(x, v).item(), src), atol=1e-6)


def test_gradient_through_backward():
  x = Tensor(RNG.standard_normal((2, 3)), requires_grad=True)
  Tensor.cat(x, x, dim=0).roll(1, 0)._advanced_getitem([0, 3]).sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), np.array([[1.0, 1, 1], [1, 1, 1]]))
  assert x.grad.dtype == dtypes.float64


def test_a_write_leaves_what_was_computed_from_the_old_values() -> None:
  """PyTorch computes y = x * 2 when it is made; a lazy y read x after the write. Views still see the write."""
  x = Tensor(np.array([1.0, 2.0, 3.0], np.float32))
  y, view = x * 2, x[1:]
  x[0] = 100.0
  x[Tensor(np.array([2]))] = -1.0
  assert y.tolist() == [2.0, 4.0, 6.0] and x.tolist() == [100.0, 2.0, -1.0] and view.tolist() == [2.0, -1.0]
