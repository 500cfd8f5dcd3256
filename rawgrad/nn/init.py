"""torch.nn.init: fill a tensor in place with random values scaled for a layer's fan-in and fan-out.

Each function assigns into the tensor (lazily, like every assign) and returns it, as torch's in-place initializers
do. The numbers come from the tensor's random stream (Tensor.manual_seed), not torch's.
"""
from __future__ import annotations

import math

from rawgrad.tensor import Tensor

_MODES = ("fan_in", "fan_out")


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
  """The factor that keeps activations' variance steady through `nonlinearity`, as torch.nn.init.calculate_gain."""
  if nonlinearity in ("linear", "identity", "sigmoid") or nonlinearity.startswith("conv"): return 1.0
  if nonlinearity == "tanh": return 5.0 / 3
  if nonlinearity == "relu": return math.sqrt(2.0)
  if nonlinearity == "leaky_relu":
    slope = 0.01 if param is None else param
    return math.sqrt(2.0 / (1 + slope * slope))
  if nonlinearity == "selu": return 3.0 / 4
  raise ValueError(f"calculate_gain: unsupported nonlinearity {nonlinearity!r}")


def fans(tensor: Tensor) -> tuple[int, int]:
  """(fan_in, fan_out) of a weight (out, in, *kernel): the inputs and outputs each element of a kernel touches."""
  if tensor.ndim < 2:
    raise ValueError(f"fan in and fan out need a tensor of at least 2 dimensions, got shape {tensor.shape}")
  receptive = math.prod(tensor.shape[2:])
  return tensor.shape[1] * receptive, tensor.shape[0] * receptive


def _fan(tensor: Tensor, mode: str) -> int:
  if mode not in _MODES: raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
  return fans(tensor)[_MODES.index(mode)]


def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0) -> Tensor:
  with Tensor.no_grad():
    return tensor.assign(Tensor.uniform(*tensor.shape, low=a, high=b, dtype=tensor.dtype, device=tensor.device))


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
  with Tensor.no_grad():
    return tensor.assign(Tensor.normal(*tensor.shape, mean=mean, std=std, dtype=tensor.dtype, device=tensor.device))


def kaiming_uniform_(tensor: Tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu") -> Tensor:
  """Uniform in +-gain * sqrt(3 / fan) (He et al.)."""
  bound = math.sqrt(3.0) * calculate_gain(nonlinearity, a) / math.sqrt(_fan(tensor, mode))
  return uniform_(tensor, -bound, bound)


def kaiming_normal_(tensor: Tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu") -> Tensor:
  """Normal with standard deviation gain / sqrt(fan) (He et al.)."""
  return normal_(tensor, 0.0, calculate_gain(nonlinearity, a) / math.sqrt(_fan(tensor, mode)))


def xavier_uniform_(tensor: Tensor, gain: float = 1.0) -> Tensor:
  """Uniform in +-gain * sqrt(6 / (fan_in + fan_out)) (Glorot and Bengio)."""
  fan_in, fan_out = fans(tensor)
  bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
  return uniform_(tensor, -bound, bound)


def xavier_normal_(tensor: Tensor, gain: float = 1.0) -> Tensor:
  """Normal with standard deviation gain * sqrt(2 / (fan_in + fan_out)) (Glorot and Bengio)."""
  fan_in, fan_out = fans(tensor)
  return normal_(tensor, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)))
