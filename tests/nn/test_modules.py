"""Layers against numpy: forward values, torch's default initializations, BatchNorm's running statistics and the
train/eval switch, and gradients reaching the parameters."""
from __future__ import annotations

import math

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

from rawgrad import nn
from rawgrad.compiler.rangeify import buffer_base
from rawgrad.dtype import dtypes
from rawgrad.nn.state import get_parameters
from rawgrad.tensor import Tensor

RTOL, ATOL = 1e-5, 1e-5


def rand(*shape: int, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def set_random(tensor: Tensor, seed: int) -> np.ndarray:
  """Give a parameter random values (so affine terms are not the identity) and return them."""
  values = rand(*tensor.shape, seed=seed)
  tensor.assign(Tensor(values)).realize()
  return values


# *** numpy references ***

def conv_reference(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, stride: int, padding: int, dilation: int,
                   groups: int) -> np.ndarray:
  """N-d convolution (cross-correlation, as torch) of (N, C, *spatial) with (O, C/groups, *kernel)."""
  dims = w.ndim - 2
  x = np.pad(x, [(0, 0), (0, 0)] + [(padding, padding)] * dims)
  kernel = w.shape[2:]
  span = tuple(dilation * (k - 1) + 1 for k in kernel)
  windows = sliding_window_view(x, span, axis=tuple(range(2, 2 + dims)))  # (N, C, *out, *span)
  windows = windows[(...,) + tuple(slice(None, None, dilation) for _ in kernel)]
  windows = windows[(slice(None), slice(None)) + tuple(slice(None, None, stride) for _ in kernel)]
  group_in, group_out = w.shape[1], w.shape[0] // groups
  outputs = []
  for g in range(groups):
    xs = windows[:, g * group_in:(g + 1) * group_in]
    ws = w[g * group_out:(g + 1) * group_out]
    letters = "hwd"[:dims]
    kernels = "klm"[:dims]
    outputs.append(np.einsum(f"nc{letters}{kernels},oc{kernels}->no{letters}", xs, ws))
  out = np.concatenate(outputs, axis=1)
  return out if b is None else out + b.reshape(1, -1, *(1,) * dims)


def conv_transpose2d_reference(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, stride: int, padding: int,
                               output_padding: int, groups: int, dilation: int) -> np.ndarray:
  """Scatter every input pixel times the kernel into the output, then crop the padding."""
  n, c_in, h, width = x.shape
  group_in, group_out = c_in // groups, w.shape[1]
  kh, kw = w.shape[2:]
  full_h = (h - 1) * stride + dilation * (kh - 1) + 1 + output_padding
  full_w = (width - 1) * stride + dilation * (kw - 1) + 1 + output_padding
  out = np.zeros((n, group_out * groups, full_h, full_w), np.float64)
  for g in range(groups):
    for i in range(h):
      for j in range(width):
        for ki in range(kh):
          for kj in range(kw):
            contribution = np.einsum("nc,co->no", x[:, g * group_in:(g + 1) * group_in, i, j],
                                     w[g * group_in:(g + 1) * group_in, :, ki, kj])
            out[:, g * group_out:(g + 1) * group_out, i * stride + ki * dilation, j * stride + kj * dilation] += \
              contribution
  out = out[:, :, padding:full_h - padding, padding:full_w - padding]
  return out if b is None else out + b.reshape(1, -1, 1, 1)


def normalize(x: np.ndarray, axes: tuple[int, ...], eps: float) -> np.ndarray:
  x = x.astype(np.float64)
  return (x - x.mean(axes, keepdims=True)) / np.sqrt(x.var(axes, keepdims=True) + eps)


# *** initialization ***

@pytest.mark.parametrize("make, fan_in", [
  (lambda: nn.Linear(50, 40), 50),
  (lambda: nn.Conv1d(6, 8, 5, groups=2), 3 * 5),
  (lambda: nn.Conv2d(4, 16, (3, 2)), 4 * 3 * 2),
  (lambda: nn.ConvTranspose2d(8, 6, 3, groups=2), 3 * 3 * 3),
])
def test_default_init_is_torch_kaiming_uniform(make, fan_in: int) -> None:
  Tensor.manual_seed(1)
  layer = make()
  bound = 1 / math.sqrt(fan_in)
  for name in ("weight", "bias"):
    values = getattr(layer, name).numpy()
    assert np.abs(values).max() <= bound
    if values.size >= 100:  # uniform in +-bound: standard deviation bound / sqrt(3)
      assert values.std() == pytest.approx(bound / math.sqrt(3), rel=0.15)


def test_init_shapes_and_defaults() -> None:
  assert nn.Linear(3, 5).weight.shape == (5, 3) and nn.Linear(3, 5, bias=False).bias is None
  assert nn.Conv2d(4, 6, 3, groups=2).weight.shape == (6, 2, 3, 3)
  assert nn.ConvTranspose2d(4, 6, 3, groups=2).weight.shape == (4, 3, 3, 3)
  norm = nn.BatchNorm2d(3)
  np.testing.assert_array_equal(norm.weight.numpy(), [1, 1, 1])
  np.testing.assert_array_equal(norm.bias.numpy(), [0, 0, 0])
  np.testing.assert_array_equal(norm.running_mean.numpy(), [0, 0, 0])
  np.testing.assert_array_equal(norm.running_var.numpy(), [1, 1, 1])
  assert norm.num_batches_tracked.shape == () and norm.num_batches_tracked.dtype == dtypes.int64
  assert norm.running_mean.requires_grad is False and norm.weight.requires_grad is True
  embedding = nn.Embedding(1000, 16, padding_idx=3)
  weights = embedding.weight.numpy()
  np.testing.assert_array_equal(weights[3], np.zeros(16))
  assert weights.std() == pytest.approx(1.0, rel=0.05)
  assert nn.LayerNorm((2, 3), bias=False).bias is None and nn.RMSNorm(4, elementwise_affine=False).weight is None
  assert nn.BatchNorm1d is nn.BatchNorm and nn.BatchNorm2d is nn.BatchNorm


# *** forward values ***

def test_linear_forward_and_gradients() -> None:
  layer = nn.Linear(4, 3)
  w, b = set_random(layer.weight, 1), set_random(layer.bias, 2)
  x = rand(2, 5, 4, seed=3)
  out = layer(Tensor(x))
  out.sum().backward()  # before out is realized: realizing replaces its graph with the buffer
  np.testing.assert_allclose(out.numpy(), x @ w.T + b, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(layer.weight.grad.numpy(), np.broadcast_to(x.sum((0, 1)), (3, 4)), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(layer.bias.grad.numpy(), [10, 10, 10])


@pytest.mark.parametrize("stride, padding, dilation, groups, bias", [
  (1, 0, 1, 1, True), (2, 1, 1, 2, False), (1, 2, 2, 1, True)])
def test_conv1d_forward(stride: int, padding: int, dilation: int, groups: int, bias: bool) -> None:
  layer = nn.Conv1d(4, 6, 3, stride=stride, padding=padding, dilation=dilation, groups=groups, bias=bias)
  w = set_random(layer.weight, 1)
  b = set_random(layer.bias, 2) if bias else None
  x = rand(2, 4, 11, seed=3)
  expected = conv_reference(x, w, b, stride, padding, dilation, groups)
  np.testing.assert_allclose(layer(Tensor(x)).numpy(), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("stride, padding, dilation, groups", [(1, 0, 1, 1), (2, 1, 1, 2), (1, 1, 2, 1)])
def test_conv2d_forward(stride: int, padding: int, dilation: int, groups: int) -> None:
  layer = nn.Conv2d(4, 6, 3, stride=stride, padding=padding, dilation=dilation, groups=groups)
  w, b = set_random(layer.weight, 1), set_random(layer.bias, 2)
  x = rand(2, 4, 9, 8, seed=3)
  expected = conv_reference(x, w, b, stride, padding, dilation, groups)
  np.testing.assert_allclose(layer(Tensor(x)).numpy(), expected, rtol=1e-4, atol=1e-4)


def test_conv2d_gradient_reaches_weight() -> None:
  layer = nn.Conv2d(2, 3, 3, bias=False)
  set_random(layer.weight, 1)
  x = rand(2, 2, 5, 5, seed=3)
  layer(Tensor(x)).sum().backward()
  # d(sum of outputs)/d(w[o, c, i, j]) is the sum of the inputs each kernel tap sees
  expected = np.stack([sliding_window_view(x, (3, 3), axis=(2, 3)).sum((0, 2, 3))] * 3)
  np.testing.assert_allclose(layer.weight.grad.numpy(), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("stride, padding, output_padding, groups, dilation", [
  (1, 0, 0, 1, 1), (2, 1, 1, 2, 1), (2, 0, 0, 1, 2)])
def test_conv_transpose2d_forward(stride: int, padding: int, output_padding: int, groups: int, dilation: int) -> None:
  layer = nn.ConvTranspose2d(4, 6, 3, stride=stride, padding=padding, output_padding=output_padding, groups=groups,
                             dilation=dilation)
  w, b = set_random(layer.weight, 1), set_random(layer.bias, 2)
  x = rand(2, 4, 5, 4, seed=3)
  expected = conv_transpose2d_reference(x, w, b, stride, padding, output_padding, groups, dilation)
  np.testing.assert_allclose(layer(Tensor(x)).numpy(), expected, rtol=1e-4, atol=1e-4)


def test_layer_norm_forward() -> None:
  layer = nn.LayerNorm((3, 4), eps=1e-3)
  w, b = set_random(layer.weight, 1), set_random(layer.bias, 2)
  x = rand(2, 5, 3, 4, seed=3) * 3 + 1
  expected = normalize(x, (2, 3), 1e-3) * w + b
  np.testing.assert_allclose(layer(Tensor(x)).numpy(), expected, rtol=1e-4, atol=1e-4)
  plain = nn.LayerNorm(4, elementwise_affine=False)
  np.testing.assert_allclose(plain(Tensor(x)).numpy(), normalize(x, (3,), 1e-5), rtol=1e-4, atol=1e-4)


def test_group_norm_forward() -> None:
  layer = nn.GroupNorm(2, 6)
  w, b = set_random(layer.weight, 1), set_random(layer.bias, 2)
  x = rand(3, 6, 4, 5, seed=3) * 2 - 1
  expected = normalize(x.reshape(3, 2, -1), (2,), 1e-5).reshape(x.shape) * w.reshape(1, 6, 1, 1) + \
    b.reshape(1, 6, 1, 1)
  np.testing.assert_allclose(layer(Tensor(x)).numpy(), expected, rtol=1e-4, atol=1e-4)


def test_rms_norm_forward() -> None:
  layer = nn.RMSNorm(5)
  w = set_random(layer.weight, 1)
  x = rand(4, 5, seed=3) * 3
  eps = np.finfo(np.float32).eps
  expected = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + eps) * w
  np.testing.assert_allclose(layer(Tensor(x)).numpy(), expected, rtol=1e-5, atol=1e-5)
  explicit = nn.RMSNorm([4, 5], eps=0.5, elementwise_affine=False)
  expected = x / np.sqrt((x.astype(np.float64) ** 2).mean() + 0.5)
  np.testing.assert_allclose(explicit(Tensor(x)).numpy(), expected, rtol=1e-5, atol=1e-5)


def test_embedding_forward_and_gradient() -> None:
  layer = nn.Embedding(10, 3)
  w = set_random(layer.weight, 1)
  indices = np.array([[1, 4, 4], [9, 0, 1]], np.int32)
  out = layer(Tensor(indices))
  out.sum().backward()
  np.testing.assert_array_equal(out.numpy(), w[indices])
  counts = np.bincount(indices.reshape(-1), minlength=10).astype(np.float32)
  np.testing.assert_array_equal(layer.weight.grad.numpy(), np.repeat(counts[:, None], 3, axis=1))


def test_embedding_padding_row_gets_no_gradient() -> None:
  layer = nn.Embedding(5, 2, padding_idx=-1)
  assert layer.padding_idx == 4
  w = set_random(layer.weight, 1)
  indices = np.array([4, 0, 4, 2], np.int32)
  out = layer(Tensor(indices))
  out.sum().backward()
  np.testing.assert_array_equal(out.numpy(), w[indices])
  np.testing.assert_array_equal(layer.weight.grad.numpy(), [[1, 1], [0, 0], [1, 1], [0, 0], [0, 0]])


def test_shape_errors_name_the_shapes() -> None:
  with pytest.raises(ValueError, match=r"LayerNorm: input of shape \(2, 3\) does not end in normalized_shape \(4,\)"):
    nn.LayerNorm(4)(Tensor(np.zeros((2, 3), np.float32)))
  with pytest.raises(ValueError, match=r"BatchNorm: expected input with 3 channels in axis 1, got shape \(2, 4\)"):
    nn.BatchNorm1d(3)(Tensor(np.zeros((2, 4), np.float32)))
  with pytest.raises(ValueError, match="divisible by num_groups 4"): nn.GroupNorm(4, 6)
  with pytest.raises(ValueError, match="divisible by groups 4"): nn.Conv2d(6, 8, 3, groups=4)
  with pytest.raises(ValueError, match="padding_mode='zeros'"): nn.Conv2d(1, 1, 3, padding_mode="reflect")
  with pytest.raises(TypeError, match="indices must be integers"): nn.Embedding(3, 2)(Tensor([0.0, 1.0]))


# *** BatchNorm ***

def test_batch_norm_training_uses_batch_statistics_and_updates_running_ones() -> None:
  norm = nn.BatchNorm2d(3, momentum=0.2)
  w, b = set_random(norm.weight, 1), set_random(norm.bias, 2)
  buffers = [buffer_base(norm.running_mean.uop), buffer_base(norm.running_var.uop)]
  running_mean, running_var = np.zeros(3), np.ones(3)
  for step in range(3):
    x = rand(4, 3, 2, 5, seed=10 + step) * (step + 1) + step
    out = norm(Tensor(x))
    Tensor.realize(out, norm.running_mean, norm.running_var, norm.num_batches_tracked)
    expected = normalize(x, (0, 2, 3), 1e-5) * w.reshape(1, 3, 1, 1) + b.reshape(1, 3, 1, 1)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-4, atol=1e-4)
    running_mean = 0.8 * running_mean + 0.2 * x.mean((0, 2, 3))
    running_var = 0.8 * running_var + 0.2 * x.var((0, 2, 3), ddof=1)
    np.testing.assert_allclose(norm.running_mean.numpy(), running_mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(norm.running_var.numpy(), running_var, rtol=1e-5, atol=1e-6)
    assert norm.num_batches_tracked.item() == step + 1
  assert [buffer_base(norm.running_mean.uop), buffer_base(norm.running_var.uop)] == buffers


def test_batch_norm_cumulative_average_when_momentum_is_none() -> None:
  norm = nn.BatchNorm1d(2, momentum=None)
  batches = [rand(6, 2, seed=s) * (s + 1) for s in range(3)]
  for x in batches: Tensor.realize(norm(Tensor(x)), norm.running_mean, norm.running_var)
  np.testing.assert_allclose(norm.running_mean.numpy(), np.mean([x.mean(0) for x in batches], 0), rtol=1e-5)
  np.testing.assert_allclose(norm.running_var.numpy(), np.mean([x.var(0, ddof=1) for x in batches], 0), rtol=1e-5)


def test_batch_norm_eval_uses_running_statistics() -> None:
  norm = nn.BatchNorm1d(3, eps=1e-3)
  w, b = set_random(norm.weight, 1), set_random(norm.bias, 2)
  mean, var = set_random(norm.running_mean, 3), np.abs(set_random(norm.running_var, 4)) + 0.5
  norm.running_var.assign(Tensor(var.astype(np.float32))).realize()
  assert norm.eval() is norm and norm.training is False
  x = rand(5, 3, 7, seed=5)
  out = norm(Tensor(x)).numpy()
  expected = (x - mean[:, None]) / np.sqrt(var[:, None] + 1e-3) * w[:, None] + b[:, None]
  np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(norm.running_mean.numpy(), mean)
  assert norm.num_batches_tracked.item() == 0


def test_batch_norm_without_running_statistics() -> None:
  norm = nn.BatchNorm1d(2, affine=False, track_running_stats=False).eval()
  assert norm.running_mean is None and norm.weight is None
  x = rand(8, 2, seed=1)
  np.testing.assert_allclose(norm(Tensor(x)).numpy(), normalize(x, (0,), 1e-5), rtol=1e-4, atol=1e-4)


def test_batch_norm_needs_more_than_one_value_per_channel() -> None:
  with pytest.raises(ValueError, match="more than one value per channel, got 1"):
    nn.BatchNorm1d(3)(Tensor(np.zeros((1, 3), np.float32)))


def test_batch_norm_gradient_flows_through_batch_statistics() -> None:
  norm = nn.BatchNorm1d(2)
  x = Tensor(rand(6, 2, seed=1), requires_grad=True)
  # the normalized values sum to zero per channel whatever x is, so their sum has zero gradient
  norm(x).sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), np.zeros((6, 2)), atol=1e-5)
  np.testing.assert_allclose(norm.bias.grad.numpy(), [6, 6])


def test_train_and_eval_reach_nested_modules() -> None:
  class Model(nn.Module):
    def __init__(self) -> None:
      self.features = [nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2)]
      self.heads = {"out": nn.BatchNorm1d(2)}

    def forward(self, x: Tensor) -> Tensor:
      return self.heads["out"](self.features[1](self.features[0](x)).mean((2, 3)))

  model = Model()
  modules = [model, *model.features, model.heads["out"]]
  assert all(m.training for m in modules)
  model.eval()
  assert not any(m.training for m in modules)
  model.train()
  assert all(m.training for m in modules)
  assert model(Tensor(rand(3, 1, 5, 5))).shape == (3, 2)
  assert len(model.parameters()) == len(get_parameters(model)) == 2 + 5 + 5
  assert list(model.state_dict())[:2] == ["features.0.weight", "features.0.bias"]
