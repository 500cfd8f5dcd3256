"""Autograd: gradients as rewrite rules, through realized values as PyTorch allows."""
import numpy as np

from rawgrad import Tensor
from rawgrad.compiler.gradient import expand_realized

rng = np.random.default_rng(3)
a = rng.standard_normal((3, 4)).astype(np.float32)
b = rng.standard_normal((4, 5)).astype(np.float32)
relu_mask = ((a @ b) > 0).astype(np.float32)


def _expected() -> tuple[np.ndarray, np.ndarray]:
  return relu_mask @ b.T, a.T @ relu_mask


def test_backward_after_reading_values_on_the_host() -> None:
  x, w = Tensor(a, requires_grad=True), Tensor(b, requires_grad=True)
  out = (x @ w).relu()
  out.numpy()                   # realizes out: its graph is replaced by its buffer
  loss = out.sum()
  loss.item()                   # and this one too
  loss.backward()
  want_x, want_w = _expected()
  np.testing.assert_allclose(x.grad.numpy(), want_x, rtol=1e-5)
  np.testing.assert_allclose(w.grad.numpy(), want_w, rtol=1e-5)


def test_gradient_reads_realized_values_from_their_buffers() -> None:
  x = Tensor(a, requires_grad=True)
  hidden = (x * 3).exp().realize()
  (grad,) = (hidden * hidden).sum().gradient(x)
  np.testing.assert_allclose(grad.numpy(), 6 * np.exp(6 * a), rtol=1e-5)


def test_a_realize_with_no_parameter_alive_keeps_the_graph_through_remembered_values() -> None:
  x = Tensor(a, requires_grad=True)
  hidden = (x * 3).realize()       # remembers the graph it came from
  x.requires_grad = False          # no tensor requires a gradient while the next one is realized
  out = (hidden * hidden).realize()
  x.requires_grad = True
  (grad,) = out.sum().gradient(x)
  np.testing.assert_allclose(grad.numpy(), 18 * a, rtol=1e-5)


def test_detach_stops_the_gradient() -> None:
  x = Tensor(a, requires_grad=True)
  (grad,) = (x * x.detach()).sum().gradient(x)
  np.testing.assert_allclose(grad.numpy(), a, rtol=1e-6)


def test_assigned_parameters_do_not_chain_steps_together() -> None:
  w = Tensor(b, requires_grad=True)
  sizes = []
  for _ in range(4):
    loss = (Tensor(a) @ w).sum()
    loss.backward()
    w.assign(w - w.grad * 0.1).realize()
    w.grad = None
    sizes.append(len(expand_realized(loss.uop)[0].toposort))
  assert len(set(sizes)) == 1, sizes  # each step's graph has the same size: nothing accumulates across steps


def test_clone_has_its_own_buffer() -> None:
  x = Tensor(a).realize()
  copy = x.clone()
  copy.assign(copy + 1).realize()
  np.testing.assert_array_equal(x.numpy(), a)
  np.testing.assert_array_equal(copy.numpy(), a + 1)
