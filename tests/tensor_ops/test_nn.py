"""Neural-network functions (rawgrad/tensor_ops/nn.py): values against naive numpy references written here, errors,
and gradients against central finite differences in float64."""
import math

import numpy as np
import pytest

from rawgrad import Tensor

RNG = np.random.default_rng(0)


def data(*shape: int, dtype: str = "float64") -> np.ndarray:
  return RNG.standard_normal(shape).astype(dtype)


def close(result: Tensor, expected: np.ndarray, tolerance: float = 1e-5) -> None:
  expected = np.asarray(expected)
  assert result.shape == expected.shape, f"shape {result.shape} != {expected.shape}"
  np.testing.assert_allclose(result.numpy(), expected, rtol=tolerance, atol=tolerance)


def check_gradient(function, *arrays: np.ndarray, directions: int = 2, epsilon: float = 1e-6) -> None:
  """Compare d/dt sum(f(x + t*v) * r) at t=0, for random directions v and a random r, with the autograd gradient
  of sum(f(x) * r) projected on v."""
  inputs = [Tensor(a) for a in arrays]
  output = function(*inputs)
  weights = data(*output.shape)
  grads = [g.numpy() for g in (output * Tensor(weights)).sum().gradient(*inputs)]
  for _ in range(directions):
    steps = [data(*a.shape) for a in arrays]

    def value(sign: float, steps: list = steps) -> float:
      moved = [Tensor(a + sign * epsilon * s) for a, s in zip(arrays, steps)]
      return float((function(*moved).numpy() * weights).sum())

    numeric = (value(1.0) - value(-1.0)) / (2 * epsilon)
    analytic = sum(float((g * s).sum()) for g, s in zip(grads, steps))
    assert analytic == pytest.approx(numeric, rel=1e-5, abs=1e-6)


# *** numpy references ***

def conv_reference(x: np.ndarray, w: np.ndarray, stride: tuple, padding: tuple, dilation: tuple,
                   groups: int) -> np.ndarray:
  """Naive N-d convolution (cross-correlation) of x (N, C, *spatial) with w (O, C/groups, *kernel)."""
  dims = x.ndim - 2
  x = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in padding])
  kernel, out_channels, group_in = w.shape[2:], w.shape[0], w.shape[1]
  out = [(size - d * (k - 1) - 1) // s + 1 for size, k, s, d in zip(x.shape[2:], kernel, stride, dilation)]
  result = np.zeros((x.shape[0], out_channels, *out))
  group_out = out_channels // groups
  for position in np.ndindex(*out):
    for offset in np.ndindex(*kernel):
      at = tuple(o * s + k * d for o, s, k, d in zip(position, stride, offset, dilation))
      for g in range(groups):
        patch = x[(slice(None), slice(g * group_in, (g + 1) * group_in), *at)]
        weight = w[(slice(g * group_out, (g + 1) * group_out), slice(None), *offset)]
        result[(slice(None), slice(g * group_out, (g + 1) * group_out), *position)] += patch @ weight.T
  assert len(out) == dims
  return result


def conv_transpose_reference(x: np.ndarray, w: np.ndarray, stride: tuple, padding: tuple, output_padding: tuple,
                             groups: int, dilation: tuple) -> np.ndarray:
  """Scatter every input element times the kernel into the output, then crop the padding."""
  kernel, group_in, group_out = w.shape[2:], w.shape[0] // groups, w.shape[1]
  full = [(size - 1) * s + d * (k - 1) + 1 + e for size, s, d, k, e in zip(x.shape[2:], stride, dilation, kernel,
                                                                            output_padding)]
  result = np.zeros((x.shape[0], group_out * groups, *full))
  for position in np.ndindex(*x.shape[2:]):
    for offset in np.ndindex(*kernel):
      at = tuple(p * s + k * d for p, s, k, d in zip(position, stride, offset, dilation))
      for g in range(groups):
        value = x[(slice(None), slice(g * group_in, (g + 1) * group_in), *position)]
        weight = w[(slice(g * group_in, (g + 1) * group_in), slice(None), *offset)]
        result[(slice(None), slice(g * group_out, (g + 1) * group_out), *at)] += value @ weight
  crop = tuple(slice(p, size - p) for p, size in zip(padding, full))
  return result[(slice(None), slice(None), *crop)]


def pool_reference(x: np.ndarray, kernel: tuple, stride: tuple, padding: tuple, dilation: tuple, ceil_mode: bool,
                   mode: str, count_include_pad: bool = True) -> np.ndarray:
  """PyTorch's pooling, window by window: max ignores padding; avg divides by the window clipped to input+padding
  (count_include_pad) or by the input elements it covers."""
  dims = len(kernel)
  sizes = x.shape[-dims:]
  out = []
  for size, k, s, p, d in zip(sizes, kernel, stride, padding, dilation):
    span = size + 2 * p - d * (k - 1) - 1
    count = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (count - 1) * s >= size + p: count -= 1
    out.append(count)
  result = np.zeros((*x.shape[:-dims], *out))
  for position in np.ndindex(*out):
    starts = [o * s - p for o, s, p in zip(position, stride, padding)]
    taps = [[start + j * d for j in range(k)] for start, k, d in zip(starts, kernel, dilation)]
    inside = [[t for t in axis if 0 <= t < size] for axis, size in zip(taps, sizes)]
    window = x[(..., *np.ix_(*inside))]
    if mode == "max":
      result[(..., *position)] = window.max(axis=tuple(range(-dims, 0)))
      continue
    if count_include_pad:
      divisor = math.prod(min(start + k, size + p) - start
                          for start, k, size, p in zip(starts, kernel, sizes, padding))
    else:
      divisor = math.prod(len(axis) for axis in inside)
    result[(..., *position)] = window.sum(axis=tuple(range(-dims, 0))) / divisor
  return result


def log_softmax_reference(x: np.ndarray, axis: int) -> np.ndarray:
  shifted = x - x.max(axis, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(axis, keepdims=True))


def cross_entropy_reference(x: np.ndarray, target: np.ndarray, weight: np.ndarray | None, ignore_index: int,
                            reduction: str, smoothing: float) -> np.ndarray:
  """PyTorch's class-index cross entropy for (N, C) logits, sample by sample."""
  log_probs = log_softmax_reference(x, 1)
  classes = x.shape[1]
  weight = np.ones(classes) if weight is None else weight
  losses, total_weight = [], 0.0
  for row, label in zip(log_probs, target):
    if label == ignore_index:
      losses.append(0.0)
      continue
    nll = -weight[label] * row[label]
    smooth = -(weight * row).sum() / classes
    losses.append((1 - smoothing) * nll + smoothing * smooth)
    total_weight += weight[label]
  losses = np.array(losses)
  if reduction == "none": return losses
  return losses.sum() if reduction == "sum" else losses.sum() / total_weight


def attention_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None,
                        scale: float) -> np.ndarray:
  scores = q @ np.swapaxes(k, -1, -2) * scale
  if mask is not None: scores = np.where(mask, scores, -np.inf) if mask.dtype == bool else scores + mask
  weights = np.exp(scores - scores.max(-1, keepdims=True))
  return weights / weights.sum(-1, keepdims=True) @ v


def normalize_reference(x: np.ndarray, axes: tuple, eps: float) -> np.ndarray:
  mean = x.mean(axes, keepdims=True)
  return (x - mean) / np.sqrt(((x - mean) ** 2).mean(axes, keepdims=True) + eps)


# *** linear and convolution ***

def test_linear():
  x, w, b = data(3, 4, 5), data(6, 5), data(6)
  close(Tensor(x).linear(Tensor(w), Tensor(b)), x @ w.T + b)
  close(Tensor(x).linear(Tensor(w)), x @ w.T)
  with pytest.raises(ValueError, match=r"\(3, 4, 5\).*\(6, 4\)"):
    Tensor(x).linear(Tensor(data(6, 4)))


CONV2D_CASES = [
  dict(),
  dict(stride=2, padding=1),
  dict(stride=(2, 3), padding=(0, 2)),
  dict(dilation=2, padding=2),
  dict(groups=2, stride=2, dilation=(1, 2)),
  dict(groups=4, padding="same"),
  dict(padding="same", dilation=(2, 1)),
  dict(padding="valid", stride=3),
]


@pytest.mark.parametrize("options", CONV2D_CASES, ids=str)
def test_conv2d(options):
  groups = options.get("groups", 1)
  x, w = data(2, 4, 9, 8), data(6 if groups != 4 else 4, 4 // groups, 3, 3)
  b = data(w.shape[0])
  stride = options.get("stride", 1)
  dilation = options.get("dilation", 1)
  stride = (stride,) * 2 if isinstance(stride, int) else stride
  dilation = (dilation,) * 2 if isinstance(dilation, int) else dilation
  padding = options.get("padding", 0)
  if padding == "same":
    padding = tuple(d * (k - 1) // 2 for d, k in zip(dilation, (3, 3)))
  elif padding == "valid":
    padding = (0, 0)
  elif isinstance(padding, int):
    padding = (padding,) * 2
  expected = conv_reference(x, w, stride, padding, dilation, groups) + b.reshape(1, -1, 1, 1)
  close(Tensor(x).conv2d(Tensor(w), Tensor(b), **options), expected)


def test_conv2d_same_even_kernel_pads_more_at_the_end():
  x, w = data(1, 2, 5, 6), data(3, 2, 2, 4)
  padded = np.pad(x, [(0, 0), (0, 0), (0, 1), (1, 2)])
  close(Tensor(x).conv2d(Tensor(w), padding="same"), conv_reference(padded, w, (1, 1), (0, 0), (1, 1), 1))


def test_conv2d_unbatched_and_disjoint_windows():
  x, w = data(3, 8, 8), data(5, 3, 2, 2)
  close(Tensor(x).conv2d(Tensor(w), stride=2), conv_reference(x[None], w, (2, 2), (0, 0), (1, 1), 1)[0])


def test_conv1d():
  x, w = data(2, 4, 11), data(6, 2, 3)
  close(Tensor(x).conv1d(Tensor(w), stride=2, padding=2, dilation=2, groups=2),
        conv_reference(x, w, (2,), (2,), (2,), 2))
  pointwise = data(3, 4, 1)
  close(Tensor(x).conv1d(Tensor(pointwise), stride=4), conv_reference(x, pointwise, (4,), (0,), (1,), 1))


def test_conv_float32():
  x, w = data(2, 3, 7, 7, dtype="float32"), data(4, 3, 3, 3, dtype="float32")
  result = Tensor(x).conv2d(Tensor(w), padding=1)
  assert result.dtype == Tensor(x).dtype
  close(result, conv_reference(x.astype(np.float64), w.astype(np.float64), (1, 1), (1, 1), (1, 1), 1), 1e-4)


@pytest.mark.parametrize("options", [dict(), dict(stride=2, padding=1, output_padding=1),
                                     dict(stride=(2, 3), groups=2, dilation=(2, 1)),
                                     dict(stride=3, padding=(2, 0), output_padding=(2, 1))], ids=str)
def test_conv_transpose2d(options):
  groups = options.get("groups", 1)
  x, w, b = data(2, 4, 4, 5), data(4, 3, 3, 2), data(3 * groups)
  pair = lambda value: (value,) * 2 if isinstance(value, int) else value  # noqa: E731
  expected = conv_transpose_reference(x, w, pair(options.get("stride", 1)), pair(options.get("padding", 0)),
                                      pair(options.get("output_padding", 0)), groups, pair(options.get("dilation", 1)))
  close(Tensor(x).conv_transpose2d(Tensor(w), Tensor(b), **options), expected + b.reshape(1, -1, 1, 1))


def test_conv_transpose1d():
  x, w = data(2, 2, 6), data(2, 3, 4)
  close(Tensor(x).conv_transpose1d(Tensor(w), stride=2, padding=1),
        conv_transpose_reference(x, w, (2,), (1,), (0,), 1, (1,)))


def test_conv_errors():
  x = Tensor(data(2, 3, 6, 6))
  with pytest.raises(ValueError, match=r"\(2, 3, 6, 6\) has 3 channels.*\(4, 2, 3, 3\).*groups=1 expects 2"):
    x.conv2d(Tensor(data(4, 2, 3, 3)))
  with pytest.raises(ValueError, match="groups=3"):
    Tensor(data(2, 6, 6, 6)).conv2d(Tensor(data(4, 2, 3, 3)), groups=3)
  with pytest.raises(ValueError, match="larger than the padded input"):
    x.conv2d(Tensor(data(4, 3, 7, 7)))
  with pytest.raises(ValueError, match="strides"):
    x.conv2d(Tensor(data(4, 3, 3, 3)), stride=2, padding="same")
  with pytest.raises(ValueError, match="stride must be positive"):
    x.conv2d(Tensor(data(4, 3, 3, 3)), stride=0)
  with pytest.raises(ValueError, match="weight must have 4 dimensions"):
    x.conv2d(Tensor(data(4, 3, 3)))
  with pytest.raises(ValueError, match="bias of shape"):
    x.conv2d(Tensor(data(4, 3, 3, 3)), Tensor(data(3)))
  with pytest.raises(ValueError, match="output_padding"):
    x.conv_transpose2d(Tensor(data(3, 2, 3, 3)), output_padding=1)


# *** pooling ***

POOL_CASES = [
  dict(kernel_size=2),
  dict(kernel_size=3, stride=2, padding=1),
  dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
  dict(kernel_size=(2, 3), stride=(3, 1), ceil_mode=True),
  dict(kernel_size=3, stride=1, padding=1),
]


def _pool_arguments(options: dict, dilation: int = 1) -> tuple:
  pair = lambda value: (value,) * 2 if isinstance(value, int) else value  # noqa: E731
  kernel = pair(options["kernel_size"])
  return (kernel, pair(options.get("stride", kernel)), pair(options.get("padding", 0)), pair(dilation),
          options.get("ceil_mode", False))


@pytest.mark.parametrize("options", POOL_CASES + [dict(kernel_size=3, stride=2, dilation=2, ceil_mode=True)], ids=str)
def test_max_pool2d(options):
  x = data(2, 3, 9, 8)
  expected = pool_reference(x, *_pool_arguments(options, options.get("dilation", 1)), "max")
  close(Tensor(x).max_pool2d(**options), expected)


@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("options", POOL_CASES, ids=str)
def test_avg_pool2d(options, count_include_pad):
  x = data(2, 3, 9, 8)
  expected = pool_reference(x, *_pool_arguments(options), "avg", count_include_pad)
  close(Tensor(x).avg_pool2d(**options, count_include_pad=count_include_pad), expected)


def test_pool_1d_unbatched_integer_and_divisor():
  x = data(3, 10)
  close(Tensor(x).max_pool1d(3, 2, 1), pool_reference(x, (3,), (2,), (1,), (1,), False, "max"))
  close(Tensor(x).avg_pool1d(4, 3, ceil_mode=True), pool_reference(x, (4,), (3,), (0,), (1,), True, "avg"))
  integers = RNG.integers(-9, 9, (2, 6, 6)).astype(np.int32)
  close(Tensor(integers).max_pool2d(2, padding=1), pool_reference(integers, (2, 2), (2, 2), (1, 1), (1, 1), False,
                                                                   "max"))
  x = data(1, 4, 4)
  average = pool_reference(x, (2, 2), (2, 2), (0, 0), (1, 1), False, "avg")
  close(Tensor(x).avg_pool2d(2, divisor_override=3), average * 4 / 3)


def test_pool_errors():
  x = Tensor(data(1, 1, 5, 5))
  with pytest.raises(ValueError, match="half the window"):
    x.max_pool2d(2, padding=2)
  with pytest.raises(ValueError, match="kernel_size must be positive"):
    x.avg_pool2d(0)
  with pytest.raises(ValueError, match="does not fit"):
    x.max_pool2d(6)
  with pytest.raises(ValueError, match="3 or 4 dimensions"):
    Tensor(data(5, 5)).max_pool2d(2)


# *** normalization ***

def test_batch_norm_training_and_evaluation():
  x, weight, bias = data(4, 3, 5, 2), data(3), data(3)
  mean, var = data(3), RNG.random(3) + 0.5
  shape = (1, 3, 1, 1)
  expected = normalize_reference(x, (0, 2, 3), 1e-5) * weight.reshape(shape) + bias.reshape(shape)
  close(Tensor(x).batch_norm(None, None, Tensor(weight), Tensor(bias), training=True), expected)
  expected = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + 1e-3) * weight.reshape(shape) + \
    bias.reshape(shape)
  close(Tensor(x).batch_norm(Tensor(mean), Tensor(var), Tensor(weight), Tensor(bias), eps=1e-3), expected)
  invstd = 1 / np.sqrt(var)
  close(Tensor(x).batchnorm(None, None, Tensor(mean), Tensor(invstd)), (x - mean.reshape(shape)) *
        invstd.reshape(shape))


def test_normalization_errors():
  with pytest.raises(ValueError, match="more than one value per channel"):
    Tensor(data(1, 3)).batch_norm(None, None, training=True)
  with pytest.raises(ValueError, match="running_mean and running_var are required"):
    Tensor(data(2, 3)).batch_norm(None, None)
  with pytest.raises(ValueError, match=r"weight of shape \(4,\) does not match 3 channels"):
    Tensor(data(2, 3)).batch_norm(None, None, Tensor(data(4)), training=True)
  with pytest.raises(ValueError, match="normalized_shape"):
    Tensor(data(2, 3)).layer_norm((2, 3, 1))
  with pytest.raises(ValueError, match="do not split into 4 groups"):
    Tensor(data(2, 6, 3)).group_norm(4)


def test_layer_norm_rms_norm_group_norm():
  x, weight, bias = data(2, 3, 4, 5), data(4, 5), data(4, 5)
  expected = normalize_reference(x, (2, 3), 1e-5) * weight + bias
  close(Tensor(x).layer_norm((4, 5), Tensor(weight), Tensor(bias)), expected)
  close(Tensor(x).layernorm(5, eps=1e-2), normalize_reference(x, (3,), 1e-2))
  close(Tensor(x).rms_norm((4, 5), Tensor(weight), eps=1e-3),
        x / np.sqrt((x * x).mean((2, 3), keepdims=True) + 1e-3) * weight)
  close(Tensor(x).rms_norm(5), x / np.sqrt((x * x).mean(3, keepdims=True) + np.finfo(np.float64).eps))
  channel_weight, channel_bias = data(3), data(3)
  grouped = normalize_reference(x.reshape(2, 3, 20), (2,), 1e-5).reshape(x.shape)
  close(Tensor(x).group_norm(3, Tensor(channel_weight), Tensor(channel_bias)),
        grouped * channel_weight.reshape(1, 3, 1, 1) + channel_bias.reshape(1, 3, 1, 1))
  close(Tensor(x).group_norm(1), normalize_reference(x, (1, 2, 3), 1e-5))


# *** dropout, embedding, attention ***

def test_dropout():
  x = data(4, 6)
  keep = RNG.random((4, 6)) < 0.7
  close(Tensor(x).dropout(0.3, mask=Tensor(keep)), np.where(keep, x / 0.7, 0))
  close(Tensor(x).dropout(0.3, training=False), x)
  close(Tensor(x).dropout(1.0), np.zeros_like(x))
  with pytest.raises(ValueError, match="probability"):
    Tensor(x).dropout(1.5)
  if hasattr(Tensor, "rand_like"):
    dropped = Tensor(np.ones((64, 64))).dropout(0.25).numpy()
    assert set(np.unique(dropped)) <= {0.0, 1 / 0.75}
    assert abs((dropped == 0).mean() - 0.25) < 0.05


def test_embedding():
  weight = data(7, 3)
  indices = RNG.integers(0, 7, (2, 4)).astype(np.int32)
  close(Tensor(indices).embedding(Tensor(weight)), weight[indices])
  with pytest.raises(TypeError, match="integers"):
    Tensor(data(3)).embedding(Tensor(weight))


@pytest.mark.parametrize("case", ["plain", "causal", "bool mask", "float mask", "scale"])
def test_scaled_dot_product_attention(case):
  q, k, v = data(2, 3, 4, 5), data(2, 3, 6, 5), data(2, 3, 6, 2)
  mask, options = None, {}
  if case == "causal":
    options["is_causal"] = True
    mask = np.tril(np.ones((4, 6), dtype=bool))
  elif case == "bool mask":
    mask = RNG.random((4, 6)) < 0.6
    mask[:, 0] = True
    options["attn_mask"] = Tensor(mask)
  elif case == "float mask":
    mask = data(4, 6)
    options["attn_mask"] = Tensor(mask)
  scale = 0.25 if case == "scale" else 1 / math.sqrt(5)
  if case == "scale": options["scale"] = 0.25
  result = Tensor(q).scaled_dot_product_attention(Tensor(k), Tensor(v), **options)
  close(result, attention_reference(q, k, v, mask, scale))


def test_attention_errors():
  q = Tensor(data(3, 4))
  with pytest.raises(ValueError, match="shapes do not match"):
    q.scaled_dot_product_attention(Tensor(data(5, 3)), Tensor(data(5, 2)))
  with pytest.raises(ValueError, match="not both"):
    q.scaled_dot_product_attention(Tensor(data(5, 4)), Tensor(data(5, 2)), Tensor(np.ones((3, 5), bool)),
                                   is_causal=True)


# *** losses ***

@pytest.mark.parametrize("options", [dict(), dict(reduction="sum"), dict(reduction="none"),
                                     dict(label_smoothing=0.2), dict(weighted=True, label_smoothing=0.3),
                                     dict(weighted=True, ignore_index=2), dict(weighted=True, reduction="none")],
                         ids=str)
def test_cross_entropy_class_indices(options):
  x = data(6, 5)
  target = np.array([0, 4, -100, 2, 2, 1])
  weight = RNG.random(5) + 0.1 if options.pop("weighted", False) else None
  if options.get("ignore_index") == 2: target[2] = 3
  expected = cross_entropy_reference(x, target, weight, options.get("ignore_index", -100),
                                     options.get("reduction", "mean"), options.get("label_smoothing", 0.0))
  result = Tensor(x).cross_entropy(Tensor(target.astype(np.int32)), None if weight is None else Tensor(weight),
                                   **options)
  close(result, expected)


def test_cross_entropy_spatial_unbatched_and_probabilities():
  x = data(2, 4, 3)
  target = RNG.integers(0, 4, (2, 3))
  per_position = cross_entropy_reference(np.moveaxis(x, 1, -1).reshape(-1, 4), target.reshape(-1), None, -100,
                                         "none", 0.0)
  close(Tensor(x).cross_entropy(Tensor(target.astype(np.int32)), reduction="none"), per_position.reshape(2, 3))
  close(Tensor(x[:, :, 0][0]).cross_entropy(Tensor(np.array(3, np.int32))),
        cross_entropy_reference(x[:1, :, 0], np.array([3]), None, -100, "mean", 0.0))
  logits, probabilities, weight = data(3, 4), RNG.random((3, 4)), RNG.random(4)
  probabilities /= probabilities.sum(1, keepdims=True)
  smoothed = probabilities * 0.9 + 0.1 / 4
  expected = -(log_softmax_reference(logits, 1) * smoothed * weight).sum() / 3
  close(Tensor(logits).cross_entropy(Tensor(probabilities), Tensor(weight), label_smoothing=0.1), expected)


def test_nll_loss_and_sparse_categorical_crossentropy():
  log_probs = log_softmax_reference(data(5, 4), 1)
  target = np.array([1, 3, 0, -100, 2])
  weight = RNG.random(4) + 0.5
  expected = cross_entropy_reference(log_probs, target, weight, -100, "mean", 0.0)
  close(Tensor(log_probs).nll_loss(Tensor(target.astype(np.int32)), Tensor(weight)), expected)
  logits = data(2, 3, 4)  # classes on the last axis
  labels = np.array([[1, -1, 3], [0, 2, -1]])
  expected = cross_entropy_reference(logits.reshape(6, 4), labels.reshape(6), None, -1, "mean", 0.1)
  close(Tensor(logits).sparse_categorical_crossentropy(Tensor(labels.astype(np.int32)), label_smoothing=0.1), expected)


def test_binary_cross_entropies():
  probabilities, target = RNG.random((3, 4)) * 0.98 + 0.01, RNG.random((3, 4))
  expected = -(target * np.log(probabilities) + (1 - target) * np.log(1 - probabilities))
  close(Tensor(probabilities).binary_cross_entropy(Tensor(target)), expected.mean())
  close(Tensor(probabilities).binary_crossentropy(Tensor(target), reduction="none"), expected)
  close(Tensor(np.array([0.0, 1.0])).binary_cross_entropy(Tensor(np.array([1.0, 0.0])), reduction="sum"), 200.0)
  logits, pos_weight = data(3, 4) * 40, RNG.random(4) * 3
  log_sigmoid = -np.logaddexp(0, -logits)
  log_one_minus = -np.logaddexp(0, logits)
  expected = -(pos_weight * target * log_sigmoid + (1 - target) * log_one_minus)
  close(Tensor(logits).binary_cross_entropy_with_logits(Tensor(target), pos_weight=Tensor(pos_weight),
                                                        reduction="none"), expected)
  close(Tensor(logits).binary_crossentropy_logits(Tensor(target)),
        (-(target * log_sigmoid + (1 - target) * log_one_minus)).mean())


def test_regression_losses_and_errors():
  x, y = data(3, 4), data(3, 4)
  close(Tensor(x).mse_loss(Tensor(y)), ((x - y) ** 2).mean())
  close(Tensor(x).l1_loss(Tensor(y), reduction="sum"), np.abs(x - y).sum())
  with pytest.raises(ValueError, match="reduction"):
    Tensor(x).mse_loss(Tensor(y), reduction="avg")
  with pytest.raises(TypeError, match="integers"):
    Tensor(x).cross_entropy(Tensor(np.zeros(3, bool)))
  with pytest.raises(ValueError, match=r"target of shape \(4,\)"):
    Tensor(x).cross_entropy(Tensor(np.zeros(4, np.int32)))


# *** gradients ***

@pytest.mark.parametrize("options", [dict(stride=2, padding=1), dict(groups=2, dilation=2, padding=(1, 2))], ids=str)
def test_conv2d_gradient(options):
  weight = data(4, 4 // options.get("groups", 1), 3, 3)
  check_gradient(lambda x, w, b: x.conv2d(w, b, **options), data(2, 4, 7, 6), weight, data(4))


@pytest.mark.parametrize("function", [
  lambda x, w: x.conv1d(w, stride=3, dilation=2),   # windows leave 1 row of the input unread
  lambda x, w: x.conv1d(w, padding="same"),         # an even window: padded one more at the end
], ids=["strided dilated", "same"])
def test_conv1d_gradient(function):
  check_gradient(function, data(2, 3, 12), data(4, 3, 2))


def test_conv_input_gradient_is_a_transposed_convolution():
  """The input's gradient is computed from a copy of the output gradient padded along its columns; the padding above
  and below stays a view, and codegen runs each window's row loop only over the rows that exist (bounds.py): the
  kernel's program checks no bounds (the autograd rules' form checks every load; tests/compiler/codegen/test_gates.py
  keeps that form covered)."""
  from rawgrad.compiler.codegen.lower import lower_kernel
  from rawgrad.compiler.ir import Ops
  from rawgrad.compiler.rangeify import create_schedule
  xs, ws, gs = data(2, 3, 9, 9, dtype="float32"), data(4, 3, 3, 3, dtype="float32"), data(2, 4, 7, 7, dtype="float32")
  x, w = Tensor(xs), Tensor(ws)
  grad_x, = x.conv2d(w).gradient(x, gradient=Tensor(gs))
  kernel = create_schedule([grad_x.uop]).items[-1].ast
  program = lower_kernel(kernel, []).program  # no opts: no vector lanes past the rows' end to mask
  assert not any(node.op is Ops.INDEX and len(node.src) == 3 for node in program)
  assert any(node.op is Ops.RANGE and node.src[0].op is not Ops.CONST for node in program)  # rows: their own length
  padded = np.pad(gs, ((0, 0), (0, 0), (2, 2), (2, 2)))
  windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))
  expected = np.einsum("nohwij,ocij->nchw", windows, ws[:, :, ::-1, ::-1])
  np.testing.assert_allclose(grad_x.numpy(), expected, rtol=1e-4, atol=1e-4)


def test_a_padded_convolution_computes_its_input_gradient_without_the_padding():
  """The gradient of the input before its padding: the last kernel is the sum itself, no copy cropping a border."""
  from rawgrad.compiler.ir import Ops
  from rawgrad.compiler.rangeify import create_schedule
  xs, ws, gs = data(2, 3, 7, 6, dtype="float32"), data(4, 3, 3, 3, dtype="float32"), data(2, 4, 7, 6, dtype="float32")
  x, w = Tensor(xs), Tensor(ws)
  grad_x, = x.conv2d(w, padding=1).gradient(x, gradient=Tensor(gs))
  last = create_schedule([grad_x.uop]).items[-1].ast
  assert any(node.op is Ops.REDUCE for node in last.toposort), last.arg
  windows = np.lib.stride_tricks.sliding_window_view(np.pad(gs, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), axis=(2, 3))
  expected = np.einsum("nohwij,ocij->nchw", windows, ws[:, :, ::-1, ::-1])
  np.testing.assert_allclose(grad_x.numpy(), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("batch", [2, 4])  # the output gradient's padding buffered, or a view read channels last
def test_the_input_gradient_is_a_buffer_its_readers_read(batch):
  """Through a ReLU into an earlier convolution: the second convolution's input gradient is a buffer. Computed in
  place of its reader (the ReLU's gradient, which also needs the first convolution's output), one kernel would nest
  the two convolutions' sums."""
  from rawgrad.compiler.ir import Ops
  from rawgrad.compiler.rangeify import create_schedule
  x, b = Tensor(data(batch, 16, 8, 8, dtype="float32")), Tensor(data(16, dtype="float32"))
  w1, w2 = Tensor(data(16, 16, 3, 3, dtype="float32")), Tensor(data(16, 16, 3, 3, dtype="float32"))
  y = (x.conv2d(w1) + b.reshape(1, 16, 1, 1)).relu().conv2d(w2)
  grad_x, grad_b = y.gradient(x, b, gradient=Tensor(data(batch, 16, 4, 4, dtype="float32")))
  sums = [sum(node.op is Ops.REDUCE for node in item.ast.toposort) for item in create_schedule([grad_x.uop,
                                                                                             grad_b.uop]).items]
  assert max(sums) == 1, sums


def test_conv_weight_gradient_vectorizes_along_output_channels():
  """The weight's gradient sums into a buffer with the output channels last, so they are the vector lanes (the rules'
  form stores along the kernel's width)."""
  from rawgrad.compiler.codegen.opt.heuristic import hand_coded_opts
  from rawgrad.compiler.codegen.opt.kernel import OptOps, loop_axes
  from rawgrad.compiler.ir import Ops
  from rawgrad.compiler.rangeify import create_schedule
  x, w = Tensor(data(2, 3, 9, 9, dtype="float32")), Tensor(data(16, 3, 5, 5, dtype="float32"))
  grad_w, = x.conv2d(w).gradient(w, gradient=Tensor(data(2, 16, 5, 5, dtype="float32")))
  kernel = next(item.ast for item in create_schedule([grad_w.uop]).items
                if any(node.op is Ops.REDUCE for node in item.ast.toposort))
  upcast = next(opt for opt in hand_coded_opts(kernel) if opt.op is OptOps.UPCAST)
  assert loop_axes(kernel)[upcast.axis].src[0].arg == 16


def test_conv_bias_gradient_sums_the_channels_last_output_gradient():
  """Behind a ReLU of a buffer the output gradient is an expression of two buffers (the ReLU's input and the gradient
  flowing in). The convolution buffers it, channels last, for the weight's gradient; the bias's gradient sums that
  buffer instead of evaluating the expression from both again."""
  from rawgrad.compiler.ir import Ops
  from rawgrad.compiler.rangeify import create_schedule
  xs, ws, bs = data(4, 3, 9, 9, dtype="float32"), data(8, 3, 3, 3, dtype="float32"), data(8, dtype="float32")
  flowing = data(4, 8, 7, 7, dtype="float32")
  x, w, b = Tensor(xs), Tensor(ws), Tensor(bs)
  grad_w, grad_b = x.conv2d(w, b).contiguous().relu().gradient(w, b, gradient=Tensor(flowing))
  items = create_schedule([grad_w.uop, grad_b.uop]).items
  bias_kernel = next(item.ast for item in items if item.ast.src[0].src[0].src[0].dtype.size == 8)
  sizes = sorted(node.dtype.size for node in bias_kernel.toposort if node.op is Ops.DEFINE_GLOBAL)
  assert sizes == [8, 4 * 7 * 7 * 8], sizes
  windows = np.lib.stride_tricks.sliding_window_view(xs, (3, 3), axis=(2, 3))  # (4, 3, 7, 7, 3, 3)
  gated = flowing * (np.einsum("ncyxij,ocij->noyx", windows, ws) + bs.reshape(1, 8, 1, 1) > 0)
  np.testing.assert_allclose(grad_b.numpy(), gated.sum((0, 2, 3)), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(grad_w.numpy(), np.einsum("ncyxij,noyx->ocij", windows, gated), rtol=1e-4, atol=1e-4)


def test_conv_transpose2d_gradient():
  check_gradient(lambda x, w: x.conv_transpose2d(w, stride=2, padding=1, output_padding=1), data(1, 2, 4, 3),
                 data(2, 3, 3, 3))


def test_pool_gradients():
  check_gradient(lambda x: x.max_pool2d(3, 2, 1, ceil_mode=True), data(2, 2, 7, 6))
  check_gradient(lambda x: x.avg_pool2d(3, 2, 1, ceil_mode=True, count_include_pad=False), data(2, 2, 7, 6))


def test_normalization_gradients():
  check_gradient(lambda x, w, b: x.batch_norm(None, None, w, b, training=True), data(4, 3, 2), data(3), data(3))
  check_gradient(lambda x, w, b: x.layer_norm(5, w, b), data(3, 5), data(5), data(5))
  check_gradient(lambda x, w, b: x.group_norm(2, w, b), data(2, 4, 3), data(4), data(4))
  check_gradient(lambda x, w: x.rms_norm(5, w), data(3, 5), data(5))


def test_attention_and_embedding_gradients():
  check_gradient(lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=True), data(2, 3, 4), data(2, 5, 4),
                 data(2, 5, 3))
  indices = Tensor(np.array([[0, 2], [2, 3]], np.int32))
  check_gradient(lambda w: indices.embedding(w), data(4, 3))


def test_loss_gradients():
  target = Tensor(np.array([1, -100, 3, 0], np.int32))
  check_gradient(lambda x, w: x.cross_entropy(target, w, label_smoothing=0.2), data(4, 5), RNG.random(5) + 0.5)
  labels = RNG.random((3, 4))
  check_gradient(lambda x: x.binary_cross_entropy_with_logits(Tensor(labels), pos_weight=Tensor(labels[0] + 1)),
                 data(3, 4) * 3)
  check_gradient(lambda x: x.binary_cross_entropy(Tensor(labels)), RNG.random((3, 4)) * 0.8 + 0.1)
  check_gradient(lambda x: x.mse_loss(Tensor(labels)) + x.l1_loss(Tensor(labels), reduction="sum"), data(3, 4))
