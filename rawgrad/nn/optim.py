"""Optimizers with torch.optim's names, defaults and update formulas.

An update is lazy: `schedule_step()` assigns the new values into the parameters' and the optimizer state's buffers
and returns those tensors, so a training step is one schedule:

    loss = model(x).cross_entropy(y)
    opt.zero_grad()
    loss.backward()
    Tensor.realize(loss, *opt.schedule_step())

`step()` does the realize by itself, and from the third step of one shape on replays the kernels it captured
(rawgrad.jit), so an eager step costs what a jitted one does. The learning rate is a 0-d tensor, `opt.lr`, read by
the update kernels: change it with `opt.set_lr(value)` and nothing recompiles. Hyperparameters other than lr are
constants in the tensor graph, which the scheduler turns into kernel parameters; changing one makes step() capture
anew.

No update has a kernel of its own: `_update` is plain tensor math, and the scheduler fuses the assigns realized
together (rangeify.group_kernels): one parameter's new value and state in one kernel, and all parameters of one
element count in one kernel, so a step over N equal-sized parameters is a fixed number of kernels. A subclass
that writes `_update` the same way gets the same.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from rawgrad.compiler.rangeify import buffer_base
from rawgrad.dtype import DType, dtypes
from rawgrad.engine.jit import capturing
from rawgrad.helpers import LRUCache
from rawgrad.tensor import Tensor, is_buffer_view, readers_of
from rawgrad.tensor_jit import JitError, jit


class Optimizer:
  """Holds the parameters (tensors with requires_grad; None counts as True for float tensors and is set so) and the
  tensors given along that need no gradient, such as BatchNorm's running statistics: schedule_step() returns those
  too, so their pending in-place updates run in the step's schedule.

  As in torch, a parameter whose .grad is None is skipped. Unlike torch, the step count the bias corrections use
  belongs to the optimizer, not to each parameter."""

  def __init__(self, params: Sequence[Tensor], lr: float):
    unique = list({id(t): t for t in params}.values())
    for tensor in unique:
      if not isinstance(tensor, Tensor):
        raise TypeError(f"optimizer params must be Tensors, got {type(tensor).__name__}")
      if tensor.requires_grad is None: tensor.requires_grad = dtypes.is_float(tensor.dtype)
    self.params = [t for t in unique if t.requires_grad]
    self.buffers = [t for t in unique if not t.requires_grad]
    if not self.params: raise ValueError("optimizer got no parameters that require gradients")
    if lr < 0: raise ValueError(f"invalid learning rate {lr}")
    self.lr = _scalar(lr, dtypes.float32, self.params[0].device)
    self._replays: LRUCache[tuple, jit | bool] = LRUCache(8)  # steps captured by _replay_key(); False: not replayable

  def set_lr(self, value: float) -> None:
    """Write a new learning rate into opt.lr's buffer (a copy kernel, compiled once)."""
    if value < 0: raise ValueError(f"invalid learning rate {value}")
    self.lr.assign(_scalar(value, dtypes.float32, self.lr.device)).realize()

  def zero_grad(self) -> None:
    for param in self.params: param.grad = None

  def step(self) -> None:
    """Update the parameters from their gradients. A step like one before (the same parameters with gradients, the
    same state buffers, gradient shapes and settings) replays the kernels captured from that step (rawgrad.jit)
    rather than building the update's graph again: after two steps, a step costs microseconds per parameter. The
    capture holds on to the gradient buffers of the last step until the next one replaces them."""
    # what was computed from the weights and state before the step keeps their old values (see realize_readers); a
    # lazy loss is realized in one schedule with the gradients, whose forward pass it shares (realized apart, that
    # pass ran twice: once for the loss, once again for the gradients)
    grads = [p.grad for p in self.params if p.grad is not None]
    readers = readers_of(self._written(), [*self.buffers, *grads])
    key = self._replay_key()
    replay = None if key is None else self._replays.get(key)
    if key is not None and replay is None: replay = self._replays.put(key, jit(self._realize_step))
    if replay and capturing() is None:
      if readers: Tensor.realize(*readers, *grads)
      try:
        return replay(*grads, *self.buffers)
      except JitError:
        self._replays.put(key, False)  # refused before it ran anything (a buffer passed twice): step eagerly
    self._realize_step(readers=readers)

  def _realize_step(self, *inputs: Tensor, readers: Sequence[Tensor] = ()) -> None:
    # `inputs` (the gradients and buffers) are what the jit swaps on replay; the update reads them through the params.
    # `readers` (a lazy loss) read the weights before the update, in the same schedule
    if tensors := [*readers, *self.schedule_step()]: Tensor.realize(*tensors)

  def _written(self) -> list[Tensor]:
    """The tensors a step writes in place: the parameters and the optimizer's state."""
    state = [t for name, value in vars(self).items() if name not in ("buffers", "params")
             for t in (value if isinstance(value, list) else [value]) if isinstance(t, Tensor)]
    return [*self.params, *state]

  def _replay_key(self) -> tuple | None:
    """What a captured step depends on besides the values in its buffers: the buffers of the parameters and the
    state, the gradients' shapes, the settings; None while a parameter or state tensor has pending work (its update
    must be scheduled with the step). The gradients and `buffers` are the replay's inputs, realized before it."""
    buffers = tuple(buffer_base(t.uop) for t in self._written())
    if None in buffers: return None
    settings = tuple((name, value) for name, value in vars(self).items() if name != "buffers" and _is_setting(value))
    grads = tuple(None if p.grad is None else (p.grad.shape, p.grad.dtype, p.grad.device) for p in self.params)
    return buffers, grads, settings

  def schedule_step(self) -> list[Tensor]:
    """Assign the updated values into the parameters and the optimizer state (lazily); return every tensor that
    must be realized for the step to happen."""
    with_grads = [p for p in self.params if p.grad is not None]
    if not with_grads: return [*self.buffers]
    for param in with_grads:
      if param.grad.shape != param.shape:
        raise ValueError(f"gradient of shape {param.grad.shape} does not match parameter of shape {param.shape}")
    # parameters still to be computed (their initialization) must be buffers before values are assigned into them:
    # all in one schedule, whose kernels compile side by side, not one realize (and one compile wait) each
    if pending := [p for p in with_grads if not is_buffer_view(p.uop)]: pending[0].realize(*pending[1:])
    state = self._update(with_grads, [p.grad.detach().cast(p.dtype) for p in with_grads])
    return [*with_grads, *state, *self.buffers]

  def _update(self, params: list[Tensor], grads: list[Tensor]) -> list[Tensor]:
    """Assign new values into params; return the state tensors assigned to."""
    raise NotImplementedError(f"{type(self).__name__} does not define _update()")

  def _state_like(self, param: Tensor, count: int = 1) -> Tensor:
    """Zeros with a buffer of their own: the parameter's shape, or `count` of them stacked in axis 0."""
    shape = tuple(param.shape) if count == 1 else (count, *param.shape)
    if param.dtype == dtypes.bfloat16:  # numpy has no bfloat16: fill on the device
      state = Tensor.zeros(*shape, dtype=param.dtype, device=param.device).contiguous().realize()
    else:
      state = Tensor(np.zeros(shape, dtypes.to_numpy(param.dtype)), param.device, param.dtype)
    state.requires_grad = False
    return state


def _is_setting(value: object) -> bool:
  """A hyperparameter: a number, flag or string, or a tuple of them (betas)."""
  if isinstance(value, tuple): return all(_is_setting(item) for item in value)
  return value is None or isinstance(value, (bool, int, float, str))


def _vector(values: list[float], dtype: DType, device: str) -> Tensor:
  vector = Tensor(np.array(values, dtypes.to_numpy(dtype)), device, dtype)
  vector.requires_grad = False
  return vector


def _scalar(value: float, dtype: DType, device: str) -> Tensor:
  scalar = Tensor(np.array(value, dtypes.to_numpy(dtype)), device, dtype)
  scalar.requires_grad = False
  return scalar


class SGD(Optimizer):
  """Stochastic gradient descent with torch's momentum (first step: buffer = gradient), dampening, weight decay
  (added to the gradient) and Nesterov momentum."""

  def __init__(self, params: Sequence[Tensor], lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
               weight_decay: float = 0.0, nesterov: bool = False, maximize: bool = False):
    super().__init__(params, lr)
    if momentum < 0: raise ValueError(f"invalid momentum {momentum}")
    if weight_decay < 0: raise ValueError(f"invalid weight_decay {weight_decay}")
    if nesterov and (momentum <= 0 or dampening != 0):
      raise ValueError(f"Nesterov momentum needs momentum > 0 and zero dampening, got {momentum} and {dampening}")
    self.momentum, self.dampening, self.weight_decay = momentum, dampening, weight_decay
    self.nesterov, self.maximize = nesterov, maximize
    self.momentum_buffers = [self._state_like(p) for p in self.params] if momentum else []
    # the first step copies the gradient into the momentum buffer; 1 until then
    self.first = _scalar(1.0, dtypes.float32, self.params[0].device) if momentum and dampening else None

  def _update(self, params: list[Tensor], grads: list[Tensor]) -> list[Tensor]:
    buffers = {id(p): b for p, b in zip(self.params, self.momentum_buffers)}
    state = []
    for param, grad in zip(params, grads):
      if self.maximize: grad = -grad
      if self.weight_decay: grad = grad + param.detach() * self.weight_decay
      if self.momentum:
        buffer = buffers[id(param)]
        scale = (1 - self.dampening) if self.first is None else \
          (self.first * self.dampening + (1 - self.dampening)).cast(grad.dtype)
        buffer.assign(buffer * self.momentum + grad * scale)
        grad = grad + buffer * self.momentum if self.nesterov else buffer
        state.append(buffer)
      param.assign(param.detach() - grad * self.lr)
    if self.first is not None:
      self.first.assign(self.first * 0)
      state.append(self.first)
    return state


class _MomentOptimizer(Optimizer):
  """Adam's state, shared with LAMB: per parameter the first and second moments (buffers of its shape: the whole
  update of a parameter is elementwise, so the scheduler stores the moments and the parameter in one kernel), and
  beta1**t, beta2**t in one float64 buffer: the bias corrections in double precision match torch's, which computes
  them on the host."""

  def __init__(self, params: Sequence[Tensor], lr: float, betas: tuple[float, float], eps: float,
               weight_decay: float):
    super().__init__(params, lr)
    if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1): raise ValueError(f"invalid betas {betas}")
    if eps < 0 or weight_decay < 0: raise ValueError(f"invalid eps {eps} or weight_decay {weight_decay}")
    self.betas, self.eps, self.weight_decay = tuple(betas), eps, weight_decay
    device = self.params[0].device
    self.exp_avgs = [self._state_like(p) for p in self.params]
    self.exp_avg_sqs = [self._state_like(p) for p in self.params]
    self._position = {id(p): i for i, p in enumerate(self.params)}
    self.beta_powers = _vector([1.0, 1.0], dtypes.float64, device)
    self._beta_vector = _vector(list(betas), dtypes.float64, device)

  @property
  def moments(self) -> list[Tensor]:
    return [*self.exp_avgs, *self.exp_avg_sqs]

  def _advance_beta_powers(self) -> tuple[Tensor, Tensor]:
    """beta1**t and beta2**t for the step t about to happen."""
    self.beta_powers.assign(self.beta_powers * self._beta_vector)
    return self.beta_powers[0], self.beta_powers[1]

  def _update_moments(self, param: Tensor, grad: Tensor) -> tuple[Tensor, Tensor]:
    """Assign the new first and second moments of param; return them."""
    beta1, beta2 = self.betas
    position = self._position[id(param)]
    first, second = self.exp_avgs[position], self.exp_avg_sqs[position]
    first.assign(first * beta1 + grad * (1 - beta1))
    second.assign(second * beta2 + grad * grad * (1 - beta2))
    return first, second


class Adam(_MomentOptimizer):
  """Adam (torch.optim.Adam): weight_decay is L2, added to the gradient. With decoupled=True (what AdamW sets) the
  parameter is instead shrunk by lr * weight_decay before the update."""

  def __init__(self, params: Sequence[Tensor], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
               eps: float = 1e-8, weight_decay: float = 0.0, decoupled: bool = False):
    super().__init__(params, lr, betas, eps, weight_decay)
    self.decoupled = decoupled

  def _update(self, params: list[Tensor], grads: list[Tensor]) -> list[Tensor]:
    beta1_power, beta2_power = self._advance_beta_powers()
    # torch: param -= lr / (1 - beta1**t) * m / (sqrt(v) / sqrt(1 - beta2**t) + eps)
    step_size = (self.lr.cast(dtypes.float64) / (1 - beta1_power)).cast(dtypes.float32)
    correction2_sqrt = (1 - beta2_power).sqrt().cast(dtypes.float32)
    for param, grad in zip(params, grads):
      weights = param.detach()
      if self.weight_decay and self.decoupled: weights = weights * (1 - self.lr * self.weight_decay)
      elif self.weight_decay: grad = grad + weights * self.weight_decay
      first, second = self._update_moments(param, grad)
      param.assign(weights - step_size * first / (second.sqrt() / correction2_sqrt + self.eps))
    return [self.beta_powers, *self.moments]


class AdamW(Adam):
  """Adam with decoupled weight decay (torch.optim.AdamW), default weight_decay 1e-2."""

  def __init__(self, params: Sequence[Tensor], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
               eps: float = 1e-8, weight_decay: float = 1e-2):
    super().__init__(params, lr, betas, eps, weight_decay, decoupled=True)


class LAMB(_MomentOptimizer):
  """LAMB (You et al., 2019): Adam's bias-corrected direction plus decoupled weight decay, scaled per parameter by
  the trust ratio ||param|| / ||direction|| (1 where either norm is zero)."""

  def __init__(self, params: Sequence[Tensor], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
               eps: float = 1e-6, weight_decay: float = 0.0):
    super().__init__(params, lr, betas, eps, weight_decay)

  def _update(self, params: list[Tensor], grads: list[Tensor]) -> list[Tensor]:
    beta1_power, beta2_power = self._advance_beta_powers()
    correction1, correction2 = (1 - beta1_power).cast(dtypes.float32), (1 - beta2_power).cast(dtypes.float32)
    for param, grad in zip(params, grads):
      weights = param.detach()
      first, second = self._update_moments(param, grad)
      direction = (first / correction1) / ((second / correction2).sqrt() + self.eps) + weights * self.weight_decay
      weight_norm, direction_norm = (weights * weights).sum().sqrt(), (direction * direction).sum().sqrt()
      trust = ((weight_norm > 0) & (direction_norm > 0)).where(weight_norm / direction_norm, 1.0)
      param.assign(weights - self.lr * trust * direction)
    return [self.beta_powers, *self.moments]


__all__ = ["LAMB", "SGD", "Adam", "AdamW", "Optimizer"]
