"""Compare rawgrad's ops with PyTorch's: `python -m rawgrad.tools.compare_torch [NAME ...] [--list]`.

Each case runs one public op on random inputs in rawgrad and in torch, forward and backward (the gradient of
sum(output * w) for a random w, for every float input), and the table lists the largest error of each. The error of
a value is |ours - torch| / max(1, |torch|): absolute below 1, relative above; nan, inf and -inf must match exactly.
The exit status is 1 when an op is above its tolerance or fails. torch is imported by this tool only, never by
rawgrad itself.
"""
from __future__ import annotations

import argparse
import math
import sys
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from rawgrad.dtype import dtypes
from rawgrad.tensor import Tensor

FLOAT32_TOLERANCE = 2e-5


@dataclass(frozen=True)
class Input:
  """A random input: uniform in [low, high) for floats, integers in [low, high) for int64; `values` fixes it."""
  shape: tuple[int, ...] = (3, 5)
  low: float = -2.0
  high: float = 2.0
  dtype: str = "float32"
  values: Any = None

  def make(self, rng: np.random.Generator) -> np.ndarray:
    if self.values is not None: return np.asarray(self.values, dtype=self.dtype)
    if self.dtype == "bool": return rng.random(self.shape) < 0.5
    if self.dtype.startswith("int"): return rng.integers(int(self.low), int(self.high), self.shape).astype(self.dtype)
    return rng.uniform(self.low, self.high, self.shape).astype(self.dtype)

  @property
  def differentiable(self) -> bool:
    return self.dtype.startswith("float")


@dataclass(frozen=True)
class Case:
  """One op: `ours` on rawgrad tensors and `theirs` on torch tensors, called with the inputs in order."""
  name: str
  ours: Callable[..., Any]
  theirs: Callable[..., Any]
  inputs: tuple[Input, ...] = (Input(),)
  tolerance: float = FLOAT32_TOLERANCE
  backward: bool = True


@dataclass
class Result:
  name: str
  forward: float = math.nan
  backward: float | None = None
  tolerance: float = FLOAT32_TOLERANCE
  error: str = ""
  notes: list[str] = field(default_factory=list)

  @property
  def passed(self) -> bool:
    return not self.error and self.forward <= self.tolerance and (self.backward or 0.0) <= self.tolerance


# *** measuring ***

def max_error(ours: np.ndarray, theirs: np.ndarray) -> float:
  """The largest |ours - theirs| / max(1, |theirs|); a shape mismatch or unmatched special value is inf."""
  ours, theirs = np.asarray(ours), np.asarray(theirs)
  if ours.shape != theirs.shape: return math.inf
  if ours.size == 0: return 0.0
  if ours.dtype == np.bool_ or theirs.dtype == np.bool_: return math.inf if np.any(ours != theirs) else 0.0
  a, b = ours.astype(np.float64), theirs.astype(np.float64)
  special = ~np.isfinite(a) | ~np.isfinite(b)
  same_special = (np.isnan(a) & np.isnan(b)) | (a == b)
  if np.any(special & ~same_special): return math.inf
  finite = ~special
  if not finite.any(): return 0.0
  return float(np.max(np.abs(a[finite] - b[finite]) / np.maximum(1.0, np.abs(b[finite]))))


def _outputs(value: Any) -> list[Any]:
  return [item for part in value for item in _outputs(part)] if isinstance(value, (tuple, list)) else [value]


def _torch_numpy(torch: Any, tensor: Any) -> np.ndarray:
  tensor = tensor.detach()
  return (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).numpy()


def _weights(name: str, outputs: list[np.ndarray]) -> list[np.ndarray]:
  rng = np.random.default_rng(zlib.crc32(name.encode()) + 1)
  return [rng.standard_normal(out.shape) for out in outputs]


def run_case(torch: Any, case: Case, backward: bool = True) -> Result:
  result = Result(case.name, tolerance=case.tolerance)
  rng = np.random.default_rng(zlib.crc32(case.name.encode()))
  arrays = [spec.make(rng) for spec in case.inputs]
  differentiable = [i for i, spec in enumerate(case.inputs) if spec.differentiable]
  try:
    # requires_grad before the forward pass: reading the outputs realizes them, and a realized tensor keeps its
    # graph for the gradient only when it depends on a tensor that requires one. Flat, because Tensor(array) makes a
    # 0-d array 1-D; the gradient is taken with respect to these flat leaves.
    leaves = [Tensor(a.reshape(-1), dtype=dtypes.from_numpy(a.dtype),
                     requires_grad=i in differentiable and case.backward) for i, a in enumerate(arrays)]
    ours_in = [leaf.reshape(a.shape) for leaf, a in zip(leaves, arrays)]
    theirs_in = [torch.tensor(a, requires_grad=i in differentiable and case.backward) for i, a in enumerate(arrays)]
    ours_out, theirs_out = _outputs(case.ours(*ours_in)), _outputs(case.theirs(*theirs_in))
    if len(ours_out) != len(theirs_out): raise ValueError(f"{len(ours_out)} outputs, torch gives {len(theirs_out)}")
    ours_values = [out.numpy() for out in ours_out]
    theirs_values = [_torch_numpy(torch, out) for out in theirs_out]
    result.forward = max((max_error(a, b) for a, b in zip(ours_values, theirs_values)), default=0.0)
    if backward and case.backward and differentiable:
      result.backward = _backward_error(torch, case, leaves, theirs_in, ours_out, theirs_out, differentiable)
  except Exception as error:  # the table reports a failing op and goes on with the rest
    result.error = f"{type(error).__name__}: {str(error).splitlines()[0][:80] if str(error) else ''}"
  return result


def _backward_error(torch: Any, case: Case, leaves: list, theirs_in: list, ours_out: list, theirs_out: list,
                    differentiable: list[int]) -> float:
  floating = [i for i, out in enumerate(theirs_out) if out.dtype.is_floating_point and out.requires_grad]
  if not floating: return 0.0
  weights = _weights(case.name, [_torch_numpy(torch, theirs_out[i]) for i in floating])
  theirs_loss = sum((theirs_out[i] * torch.tensor(w, dtype=theirs_out[i].dtype)).sum()
                    for i, w in zip(floating, weights))
  targets = [theirs_in[i] for i in differentiable]
  theirs_grads = torch.autograd.grad(theirs_loss, targets, allow_unused=True)
  ours_loss = sum((ours_out[i] * Tensor(w, dtype=ours_out[i].dtype)).sum() for i, w in zip(floating, weights))
  ours_grads = ours_loss.gradient(*(leaves[i] for i in differentiable))
  errors = []
  for ours, theirs, target in zip(ours_grads, theirs_grads, targets):
    expected = np.zeros(target.shape, np.float32) if theirs is None else _torch_numpy(torch, theirs)
    errors.append(max_error(ours.numpy().reshape(expected.shape), expected))
  return max(errors)


# *** the cases ***

def _method(name: str, *args: Any, **kwargs: Any) -> Callable[..., Any]:
  """x.name(*other inputs, *args, **kwargs), the same call in rawgrad and torch."""
  return lambda x, *rest: getattr(x, name)(*rest, *args, **kwargs)


def same(name: str, *args: Any, inputs: tuple[Input, ...] = (Input(),), label: str | None = None,
         tolerance: float = FLOAT32_TOLERANCE, backward: bool = True, **kwargs: Any) -> Case:
  return Case(label or name, _method(name, *args, **kwargs), _method(name, *args, **kwargs), inputs, tolerance,
              backward)


def unary(name: str, low: float = -2.0, high: float = 2.0, backward: bool = True, **kwargs: Any) -> Case:
  return same(name, inputs=(Input((3, 5), low, high),), backward=backward, **kwargs)


def binary(name: str, low: float = -2.0, high: float = 2.0, other: tuple[float, float] = (-2.0, 2.0),
           **kwargs: Any) -> Case:
  # broadcasting: (3, 5) with (5,)
  return same(name, inputs=(Input((3, 5), low, high), Input((5,), *other)), **kwargs)


def elementwise_cases(torch: Any) -> list[Case]:
  F = torch.nn.functional
  positive = {"low": 0.1, "high": 4.0}
  cases = [unary(name) for name in ("neg", "abs", "square", "exp", "exp2", "expm1", "sin", "cos", "atan", "sinh",
                                    "cosh", "tanh", "asinh", "sigmoid", "erf", "erfc", "relu", "frac")]
  cases += [unary(name, **positive) for name in ("sqrt", "rsqrt", "log", "log2", "log10", "reciprocal")]
  cases += [unary("log1p", -0.5, 4.0), unary("tan", -1.2, 1.2), unary("asin", -0.9, 0.9), unary("acos", -0.9, 0.9),
            unary("acosh", 1.1, 4.0), unary("atanh", -0.9, 0.9), unary("sign", backward=False),
            unary("trunc", -5, 5), unary("floor", -5, 5), unary("ceil", -5, 5), unary("round", -5, 5)]
  for name in ("leaky_relu", "elu", "selu", "celu", "gelu", "silu", "softplus", "mish", "hardtanh", "relu6",
               "hardsigmoid", "hardswish", "softsign", "logsigmoid"):
    cases.append(Case(name, _method(name), lambda x, n=name: getattr(F, n)(x), (Input((3, 5), -4.0, 4.0),)))
  cases.append(Case("gelu_tanh", _method("gelu", "tanh"), lambda x: F.gelu(x, approximate="tanh")))
  cases.append(same("clamp", -0.5, 0.7))
  cases += [binary(name) for name in ("add", "sub", "mul", "maximum", "minimum", "atan2", "hypot", "logaddexp",
                                      "logaddexp2", "copysign")]
  cases += [binary("div", other=(0.5, 2.0)), binary("pow", 0.5, 2.0), binary("xlogy", other=(0.1, 3.0)),
            binary("fmod", other=(0.5, 2.0)), binary("remainder", other=(0.5, 2.0))]
  cases.append(same("pow", 3, label="pow_int", inputs=(Input((3, 5), -2.0, 2.0),)))
  cases.append(same("pow", 2.5, label="pow_float", inputs=(Input((3, 5), 0.1, 2.0),)))
  cases.append(Case("pow_special", lambda x, y: x ** y, lambda x, y: x ** y,
                    (Input(values=[-2.0, 0.0, 0.0, 0.0, math.inf, -math.inf, 2.0, 1.5]),
                     Input(values=[3.0, 2.0, 0.0, -1.0, 2.0, 3.0, 0.0, -0.5]))))
  cases.append(same("exp", label="exp_special", inputs=(Input(values=[-math.inf, math.inf, 100.0, -200.0]),)))
  cases.append(Case("lerp", lambda x, y: x.lerp(y, 0.3), lambda x, y: x.lerp(y, 0.3), (Input(), Input())))
  cases.append(Case("isclose", lambda x, y: x.isclose(y, atol=0.5), lambda x, y: x.isclose(y, atol=0.5),
                    (Input(), Input()), backward=False))
  cases.append(Case("where", lambda c, x, y: c.where(x, y), lambda c, x, y: torch.where(c, x, y),
                    (Input((3, 5), dtype="bool"), Input(), Input((5,)))))
  return cases


def reduction_cases(torch: Any) -> list[Case]:
  F = torch.nn.functional
  cases = [same(name, 1, label=f"{name}_axis") for name in ("sum", "mean", "prod", "var", "std", "logsumexp")]
  cases += [same("sum"), same("mean")]
  cases += [Case("max", lambda x: x.max(1), lambda x: x.amax(1)), Case("min", lambda x: x.min(0), lambda x: x.amin(0))]
  cases += [same(name, axis) for name, axis in (("softmax", 1), ("log_softmax", 0), ("cumsum", 1), ("cumprod", 0),
                                                ("logcumsumexp", 1), ("cummax", 1), ("cummin", 0))]
  cases.append(Case("softmin", lambda x: x.softmin(1), lambda x: F.softmin(x, 1)))
  cases.append(Case("softmax_large", lambda x: x.softmax(1), lambda x: x.softmax(1), (Input((3, 7), -60, 60),)))
  cases.append(Case("log_softmax_large", lambda x: x.log_softmax(1), lambda x: x.log_softmax(1),
                    (Input((3, 7), -60, 60),)))
  cases += [same("argmax", 1, backward=False), same("argmin", 0, backward=False)]
  cases += [same("sort", 1), same("sort", 0, label="sort_descending", descending=True), same("argsort", 1),
            same("topk", 2, 1, label="topk"), same("topk", 2, 0, label="topk_smallest", largest=False)]
  ties = Input(values=[[1.0, 3.0, 1.0, 2.0, 3.0, 1.0], [0.0, 0.0, 2.0, 2.0, 0.0, 0.0]])
  cases.append(Case("sort_stable_ties", lambda x: x.sort(1, stable=True), lambda x: x.sort(dim=1, stable=True),
                    (ties,)))
  cases.append(Case("sort_descending_ties", lambda x: x.sort(1, descending=True, stable=True),
                    lambda x: x.sort(dim=1, descending=True, stable=True), (ties,)))
  cases += [Case(name, lambda x, n=name: getattr(x > 0, n)(1), lambda x, n=name: getattr(x > 0, n)(1),
                 backward=False) for name in ("any", "all")]
  return cases


def shape_cases(torch: Any) -> list[Case]:
  F = torch.nn.functional
  cases = [same("reshape", 5, 3), same("permute", 1, 0), same("transpose", 0, 1), same("flip", 0), same("roll", 2, 1),
           same("roll", 4, label="roll_flat"), same("repeat", 2, 1), same("tile", 1, 2), same("tril"),
           same("triu", 1), same("narrow", 1, 1, 3), same("split", 2, 1), same("chunk", 2, 0), same("unsqueeze", 1),
           same("movedim", 0, 1), same("expand", 2, 3, 5, label="expand", inputs=(Input((3, 1)),)),
           same("squeeze", 1, inputs=(Input((3, 1, 5)),)), same("repeat_interleave", 2, dim=1),
           same("diagonal", 1), same("diagonal", -1, 0, 2, label="diagonal_3d", inputs=(Input((3, 4, 5)),)),
           same("diag", 1, label="diag_vector", inputs=(Input((4,)),)), same("diag", -1, label="diag_matrix"),
           same("unfold", 1, 2, 2), same("unfold", 0, 2, 1, label="unfold_overlapping")]
  for mode, pad in (("constant", (1, 2, 2, 0)), ("reflect", (2, 4, 1, 2)), ("replicate", (7, 1, 0, 5)),
                    ("circular", (5, 3, 3, 2))):
    cases.append(Case(f"pad_{mode}", lambda x, m=mode, p=pad: x.padded(p, m),
                      lambda x, m=mode, p=pad: F.pad(x[None], p, m)[0] if m != "constant" else F.pad(x, p, m)))
  two = (Input(), Input())
  cases += [Case("cat", lambda a, b: a.cat(b, dim=1), lambda a, b: torch.cat([a, b], 1), two),
            Case("stack", lambda a, b: a.stack(b, dim=2), lambda a, b: torch.stack([a, b], 2), two)]
  index = Input((3, 4), 0, 5, "int64")
  cases += [Case("gather", lambda x, i: x.gather(1, i), lambda x, i: x.gather(1, i), (Input(), index)),
            Case("scatter", lambda x, src: x.scatter(0, type(x)(np.array([[0, 1, 2, 0, 1], [2, 0, 1, 1, 0]])), src),
                 lambda x, src: x.scatter(0, torch.tensor([[0, 1, 2, 0, 1], [2, 0, 1, 1, 0]]), src),
                 (Input(), Input((2, 5)))),
            Case("index_select", lambda x, i: x.index_select(1, i), lambda x, i: x.index_select(1, i),
                 (Input(), Input((4,), 0, 5, "int64"))),
            Case("masked_fill", lambda x, m: x.masked_fill(m, 0.5), lambda x, m: x.masked_fill(m, 0.5),
                 (Input(), Input((5,), dtype="bool"))),
            same("masked_select", inputs=(Input(), Input((5,), dtype="bool"))),
            same("nonzero", inputs=(Input((3, 5), -1, 1, "int64"),), backward=False),
            Case("meshgrid_xy", lambda a, b: type(a).meshgrid(a, b, indexing="xy"),
                 lambda a, b: torch.meshgrid(a, b, indexing="xy"), (Input((3,)), Input((4,)))),
            Case("meshgrid_ij", lambda a, b: type(a).meshgrid(a, b, indexing="ij"),
                 lambda a, b: torch.meshgrid(a, b, indexing="ij"), (Input((3,)), Input((4,)))),
            Case("view_dtype", lambda x: x.view(dtypes.int32), lambda x: x.view(torch.int32), backward=False),
            Case("view_dtype_split", lambda x: x.view(dtypes.int16), lambda x: x.view(torch.int16), backward=False)]
  image = (Input((1, 2, 4, 5)),)
  for mode, size in (("nearest", (7, 3)), ("bilinear", (6, 9))):
    cases.append(Case(f"interpolate_{mode}", lambda x, m=mode, s=size: x.interpolate(size=s, mode=m),
                      lambda x, m=mode, s=size: F.interpolate(x, size=s, mode=m), image))
  cases.append(Case("interpolate_bilinear_uint8", lambda x: x.interpolate(size=(7, 9), mode="bilinear"),
                    lambda x: F.interpolate(x, size=(7, 9), mode="bilinear"), (Input((1, 2, 4, 5), 0, 256, "uint8"),),
                    backward=False))
  return cases


def nn_cases(torch: Any) -> list[Case]:
  F = torch.nn.functional
  cases = [Case("linear", lambda x, w, b: x.linear(w, b), F.linear, (Input((2, 5)), Input((3, 5)), Input((3,)))),
           Case("matmul", lambda a, b: a @ b, lambda a, b: a @ b, (Input((2, 3, 4)), Input((4, 5)))),
           Case("matmul_half", lambda a, b: a @ b, lambda a, b: a @ b,
                (Input((4, 64), dtype="float16"), Input((64, 3), dtype="float16")), 2e-3, backward=False),
           Case("sum_half", lambda x: x.sum(1), lambda x: x.sum(1), (Input((2, 300), 0, 1, "float16"),), 2e-3, False)]
  for dims in (1, 2, 3):
    spatial, kernel = (5,) * dims, (3,) * dims
    conv, transposed = f"conv{dims}d", f"conv_transpose{dims}d"
    cases.append(Case(conv, lambda x, w, b, n=conv: getattr(x, n)(w, b, stride=2, padding=1, groups=2),
                      lambda x, w, b, n=conv: getattr(F, n)(x, w, b, stride=2, padding=1, groups=2),
                      (Input((2, 4, *spatial)), Input((6, 2, *kernel)), Input((6,))), 1e-4))
    cases.append(Case(transposed, lambda x, w, n=transposed: getattr(x, n)(w, stride=2, padding=1),
                      lambda x, w, n=transposed: getattr(F, n)(x, w, stride=2, padding=1),
                      (Input((1, 3, *(4,) * dims)), Input((3, 2, *kernel))), 1e-4))
    for pool in (f"max_pool{dims}d", f"avg_pool{dims}d"):
      cases.append(Case(pool, lambda x, n=pool: getattr(x, n)(2, 2, 1), lambda x, n=pool: getattr(F, n)(x, 2, 2, 1),
                        (Input((1, 2, *(5,) * dims)),)))
  cases.append(Case("max_pool2d_indices", lambda x: x.max_pool2d(3, 2, 1, return_indices=True),
                    lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), (Input((2, 2, 5, 6)),)))
  cases.append(Case("max_unpool2d", lambda x: Tensor.max_unpool2d(*x.max_pool2d(2, return_indices=True), 2),
                    lambda x: F.max_unpool2d(*F.max_pool2d(x, 2, return_indices=True), 2), (Input((1, 2, 4, 6)),)))
  cases.append(Case("im2col", lambda x: x.im2col(2, dilation=1, padding=1, stride=2),
                    lambda x: F.unfold(x, 2, dilation=1, padding=1, stride=2), (Input((2, 3, 5, 4)),)))
  channels = (Input((4, 3, 5)), Input((3,), 0.5, 1.5), Input((3,)))
  cases += [Case("batch_norm", lambda x, w, b: x.batch_norm(None, None, w, b, training=True),
                 lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), channels, 1e-4),
            Case("layer_norm", lambda x, w, b: x.layer_norm(5, w, b), lambda x, w, b: F.layer_norm(x, (5,), w, b),
                 (Input((4, 3, 5)), Input((5,)), Input((5,))), 1e-4),
            Case("group_norm", lambda x: x.group_norm(3), lambda x: F.group_norm(x, 3), (Input((2, 6, 4)),), 1e-4),
            Case("rms_norm", lambda x: x.rms_norm(5), lambda x: F.rms_norm(x, (5,)), (Input((3, 5)),), 1e-4),
            Case("normalize", lambda x: x.normalize(), lambda x: F.normalize(x), (Input((3, 5, 2)),)),
            Case("normalize_p1", lambda x: x.normalize(1.0, 0), lambda x: F.normalize(x, 1.0, 0)),
            Case("embedding", lambda i, w: i.embedding(w), lambda i, w: F.embedding(i, w),
                 (Input((2, 3), 0, 6, "int64"), Input((6, 4))))]
  attention = (Input((2, 4, 3, 8)), Input((2, 2, 5, 8)), Input((2, 2, 5, 6)))
  cases += [Case("attention_gqa", lambda q, k, v: q.scaled_dot_product_attention(k, v, enable_gqa=True),
                 lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), attention, 1e-4),
            Case("attention_causal", lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=True),
                 lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                 (Input((2, 4, 8)), Input((2, 4, 8)), Input((2, 4, 6))), 1e-4)]
  classes = (Input((4, 5)), Input((4,), 0, 5, "int64"))
  cases += [Case("cross_entropy", lambda x, t: x.cross_entropy(t, label_smoothing=0.1),
                 lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1), classes),
            Case("nll_loss", lambda x, t: x.nll_loss(t), lambda x, t: F.nll_loss(x, t), classes),
            Case("binary_cross_entropy", lambda x, t: x.binary_cross_entropy(t), F.binary_cross_entropy,
                 (Input((3, 4), 0.05, 0.95), Input((3, 4), 0.0, 1.0))),
            Case("binary_cross_entropy_with_logits", lambda x, t: x.binary_cross_entropy_with_logits(t),
                 F.binary_cross_entropy_with_logits, (Input((3, 4)), Input((3, 4), 0.0, 1.0))),
            Case("mse_loss", lambda x, t: x.mse_loss(t), F.mse_loss, (Input(), Input())),
            Case("l1_loss", lambda x, t: x.l1_loss(t), F.l1_loss, (Input(), Input()))]
  return cases


def edge_cases(torch: Any) -> list[Case]:
  """0-d and empty inputs."""
  scalar, empty = Input(()), Input((2, 0))
  cases = [same(name, 0, label=f"{name}_0d", inputs=(scalar,)) for name in ("cumsum", "cumprod", "logcumsumexp")]
  cases += [same(name, 0, label=f"{name}_0d", inputs=(scalar,)) for name in ("cummax", "cummin", "squeeze")]
  cases += [same(name, 1, label=f"{name}_empty", inputs=(empty,)) for name in ("cumsum", "cummax", "cummin", "sort")]
  cases += [Case(f"{name}_empty", lambda x, n=name: getattr(x > 0, n)(1), lambda x, n=name: getattr(x > 0, n)(1),
                 (empty,), backward=False) for name in ("any", "all")]
  cases += [same("sinh", label="sinh_0d", inputs=(scalar,)), same("sum", label="sum_empty", inputs=(empty,))]
  return cases


def all_cases(torch: Any) -> list[Case]:
  return elementwise_cases(torch) + reduction_cases(torch) + shape_cases(torch) + nn_cases(torch) + edge_cases(torch)


# *** the table ***

def _number(value: float | None) -> str:
  return "-" if value is None else f"{value:.2e}"


def table(results: list[Result]) -> list[str]:
  lines = [f"{'op':<34} {'forward':>9} {'backward':>9} {'tolerance':>9}  status"]
  for r in results:
    status = "ok" if r.passed else (f"FAILED {r.error}" if r.error else "ABOVE TOLERANCE")
    lines.append(f"{r.name:<34} {_number(r.forward):>9} {_number(r.backward):>9} {r.tolerance:>9.0e}  {status}")
  failed = sum(not r.passed for r in results)
  lines.append(f"{len(results) - failed} ops within tolerance, {failed} above it or failing")
  return lines


def compare(names: list[str] | None = None, backward: bool = True) -> list[Result]:
  import torch  # the reference: imported here only, so rawgrad never depends on it
  cases = all_cases(torch)
  if names:
    unknown = set(names) - {case.name for case in cases}
    if unknown: raise ValueError(f"no comparison case named {sorted(unknown)}")
    cases = [case for case in cases if case.name in names]
  return [run_case(torch, case, backward) for case in cases]


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("names", nargs="*", help="compare only these ops (case names as the table prints them)")
  parser.add_argument("--forward-only", action="store_true", help="skip the gradients")
  parser.add_argument("--list", action="store_true", help="print the case names and exit")
  arguments = parser.parse_args(argv)
  if arguments.list:
    import torch
    print("\n".join(case.name for case in all_cases(torch)))
    return 0
  results = compare(arguments.names, backward=not arguments.forward_only)
  print("\n".join(table(results)))
  return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
  sys.exit(main())
