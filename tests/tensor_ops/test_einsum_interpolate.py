"""einsum, interpolate, linspace, eye and no_grad against numpy."""
import numpy as np
import pytest

from rawgrad import GlobalCounters, Tensor

rng = np.random.default_rng(7)
a = rng.standard_normal((3, 4)).astype(np.float32)
b = rng.standard_normal((4, 5)).astype(np.float32)
batch_a, batch_b = rng.standard_normal((2, 3, 4)).astype(np.float32), rng.standard_normal((2, 4, 5)).astype(np.float32)
square = rng.standard_normal((4, 4)).astype(np.float32)


@pytest.mark.parametrize("formula, operands", [
  ("ij,jk->ik", (a, b)), ("ij,jk", (a, b)), ("ij->ji", (a,)), ("ij->", (a,)), ("ij,ij->", (a, a)),
  ("ii->i", (square,)), ("ii", (square,)), ("bij,bjk->bik", (batch_a, batch_b)),
  ("...ij,...jk->...ik", (batch_a, batch_b)),
  ("i,j->ij", (a[0], b[0])), ("ij,kj->ik", (a, a)), ("bij->bji", (batch_a,)),
])
def test_einsum_matches_numpy(formula: str, operands: tuple) -> None:
  got = Tensor.einsum(formula, *[Tensor(o) for o in operands]).numpy()
  np.testing.assert_allclose(got, np.einsum(formula, *operands), rtol=1e-5, atol=1e-5)


def test_einsum_contraction_is_one_kernel_and_differentiable() -> None:
  x, w = Tensor(a.astype(np.float64), requires_grad=True), Tensor(b.astype(np.float64), requires_grad=True)
  GlobalCounters.reset()
  out = Tensor.einsum("ij,jk->ik", x, w)
  out.realize()
  assert GlobalCounters.kernel_count == 1
  gx, gw = (Tensor.einsum("ij,jk->ik", x, w) * 2).sum().gradient(x, w)
  np.testing.assert_allclose(gx.numpy(), 2 * np.ones((3, 5)) @ b.T, rtol=1e-6)
  np.testing.assert_allclose(gw.numpy(), 2 * a.T @ np.ones((3, 5)), rtol=1e-6)


def test_einsum_errors_name_the_problem() -> None:
  with pytest.raises(ValueError, match="names 2 operands"): Tensor.einsum("ij,jk->ik", Tensor(a))
  with pytest.raises(ValueError, match="sizes 4 and 3"): Tensor.einsum("ij,jk->ik", Tensor(a), Tensor(a))
  with pytest.raises(ValueError, match="do not match operand"): Tensor.einsum("ijk->i", Tensor(a))


def _interp_axis(x: np.ndarray, axis: int, out_size: int, align_corners: bool) -> np.ndarray:
  """Independent reference: np.interp at the source coordinates of each output position."""
  size = x.shape[axis]
  if align_corners: coords = np.linspace(0, size - 1, out_size) if out_size > 1 else np.zeros(1)
  else: coords = np.clip((np.arange(out_size) + 0.5) * size / out_size - 0.5, 0, size - 1)
  return np.apply_along_axis(lambda line: np.interp(coords, np.arange(size), line), axis, x)


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("size", [(7, 3), (4, 10), (1, 1)])
def test_bilinear_interpolate_matches_a_separable_reference(size: tuple, align_corners: bool) -> None:
  image = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
  want = _interp_axis(_interp_axis(image, 2, size[0], align_corners), 3, size[1], align_corners)
  got = Tensor(image).interpolate(size=size, mode="bilinear", align_corners=align_corners).numpy()
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_nearest_and_linear_hand_values() -> None:
  line = Tensor(np.array([[[0.0, 1.0]]], np.float32))
  assert line.interpolate(size=4, mode="nearest").tolist() == [[[0.0, 0.0, 1.0, 1.0]]]
  np.testing.assert_allclose(line.interpolate(size=4, mode="linear").numpy(), [[[0, 0.25, 0.75, 1]]])
  np.testing.assert_allclose(line.interpolate(size=4, mode="linear", align_corners=True).numpy(),
                             [[[0, 1 / 3, 2 / 3, 1]]], rtol=1e-6)
  assert Tensor(np.arange(3, dtype=np.float32).reshape(1, 1, 3)).interpolate(scale_factor=2).tolist() == \
    [[[0.0, 0.0, 1.0, 1.0, 2.0, 2.0]]]
  with pytest.raises(ValueError, match="exactly one of size, scale_factor"): line.interpolate()


def test_linspace_and_eye() -> None:
  np.testing.assert_allclose(Tensor.linspace(-1, 2, 7).numpy(), np.linspace(-1, 2, 7, dtype=np.float32), rtol=1e-6)
  assert Tensor.linspace(3, 3, 1).tolist() == [3.0] and Tensor.linspace(0, 1, 0).shape == (0,)
  np.testing.assert_array_equal(Tensor.eye(3, 5).numpy(), np.eye(3, 5, dtype=np.float32))


def test_no_grad_stops_gradients() -> None:
  x = Tensor(a, requires_grad=True)
  with Tensor.no_grad():
    frozen = x * 2
  (grad,) = (x * 3 + frozen).sum().gradient(x)
  np.testing.assert_allclose(grad.numpy(), np.full_like(a, 3.0))
  np.testing.assert_allclose(frozen.numpy(), a * 2)
