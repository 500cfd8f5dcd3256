"""Reverse-mode differentiation as rewrite rules on the tensor-level UOp graph.

Each rule maps a node and the gradient flowing into it (`ctx`) to the gradients of its sources (None where a source
gets none). `compute_gradient` walks the graph from the output to the targets, summing the gradients of nodes used
more than once. The result is an ordinary lazy graph: it fuses and schedules like any other.
"""
from __future__ import annotations

import math
import weakref
from typing import Callable

from rawgrad.compiler.ir import GroupOp, Ops, UOp
from rawgrad.compiler.rewrite import PatternMatcher, UPat, substitute
from rawgrad.dtype import dtypes


def _like(node: UOp, value: float) -> UOp:
  return node.const_like(value)


def _reduce_to(grad: UOp, shape: tuple) -> UOp:
  """Sum an expanded gradient back to the shape before the expand."""
  axes = tuple(i for i, (a, b) in enumerate(zip(shape, grad.shape)) if a != b)
  return UOp(Ops.REDUCE_AXIS, grad.dtype, (grad,), (Ops.ADD, axes)) if axes else grad


def _reduce_axis_grad(ctx: UOp, ret: UOp) -> tuple[UOp | None, ...]:
  source = ret.src[0]
  op, _ = ret.arg
  expanded = ctx.expand(source.shape)
  if op is Ops.ADD: return (expanded,)
  if op is Ops.MUL: return (expanded * _product_of_others(source, ret.arg[1]),)
  if op is Ops.MAX:
    # the gradient goes to every element equal to the maximum, shared evenly between ties
    is_max = UOp(Ops.CMPNE, dtypes.bool, (source, ret.expand(source.shape))).logical_not()
    mask = UOp(Ops.CAST, ctx.dtype, (is_max,))
    count = UOp(Ops.REDUCE_AXIS, ctx.dtype, (mask,), (Ops.ADD, ret.arg[1])).expand(source.shape)
    return (expanded * mask / count,)
  raise NotImplementedError(f"no gradient for a {op} reduction")


def _product_of_others(source: UOp, axes: tuple[int, ...]) -> UOp:
  """For each element, the product of the others in its reduction: prod/x where x != 0, handled exactly at zeros."""
  is_zero = UOp(Ops.CMPNE, dtypes.bool, (source, _like(source, 0.0))).logical_not()
  nonzero = is_zero.where(_like(source, 1.0), source)
  nonzero_product = UOp(Ops.REDUCE_AXIS, source.dtype, (nonzero,), (Ops.MUL, axes)).expand(source.shape)
  zeros = UOp(Ops.REDUCE_AXIS, source.dtype, (UOp(Ops.CAST, source.dtype, (is_zero,)),), (Ops.ADD, axes))
  zeros = zeros.expand(source.shape)
  no_zero = UOp(Ops.CMPNE, dtypes.bool, (zeros, _like(source, 0.0))).logical_not()
  one_zero = UOp(Ops.CMPNE, dtypes.bool, (zeros, _like(source, 1.0))).logical_not()
  only_this_is_zero = one_zero & is_zero
  return no_zero.where(nonzero_product / source, only_this_is_zero.where(nonzero_product, _like(source, 0.0)))


def _max_grad(ctx: UOp, a: UOp, b: UOp) -> tuple[UOp, UOp]:
  # ties share the gradient evenly, as PyTorch does for maximum
  a_wins = UOp(Ops.CAST, ctx.dtype, (b < a,))
  tie = UOp(Ops.CAST, ctx.dtype, (a.eq(b),)) * _like(ctx, 0.5)
  return ctx * (a_wins + tie), ctx * (_like(ctx, 1.0) - a_wins - tie)


def _cosine(x: UOp) -> UOp:
  return UOp(Ops.SIN, x.dtype, (x + _like(x, math.pi / 2),))


def _inverse_permutation(order: tuple[int, ...]) -> tuple[int, ...]:
  return tuple(order.index(i) for i in range(len(order)))


def _pad_grad(ctx: UOp, ret: UOp) -> tuple[UOp]:
  source_shape, sizes = ret.src[0].shape, ret.size_args()
  ndim = len(source_shape)
  return (ctx.shrink(tuple((sizes[i], sizes[i] + source_shape[i]) for i in range(ndim))),)


def _shrink_grad(ctx: UOp, ret: UOp) -> tuple[UOp]:
  source_shape, sizes = ret.src[0].shape, ret.size_args()
  ndim = len(source_shape)
  return (ctx.pad(tuple((sizes[i], source_shape[i] - sizes[ndim + i]) for i in range(ndim))),)


LN2 = math.log(2)

def _copy_to(value: UOp, device: str) -> UOp:
  return UOp(Ops.COPY, value.dtype, (value, UOp(Ops.DEVICE, arg=device)))


pm_gradient = PatternMatcher([
  # arithmetic
  (UPat(Ops.ADD), lambda ctx: (ctx, ctx)),
  (UPat(Ops.MUL, name="ret"), lambda ctx, ret: (ctx * ret.src[1], ctx * ret.src[0])),
  (UPat(Ops.FDIV, name="ret"), lambda ctx, ret: (ctx / ret.src[1], -(ctx * ret.src[0]) / (ret.src[1] * ret.src[1]))),
  (UPat(Ops.MAX, src=(UPat.var("a"), UPat.var("b"))), _max_grad),
  (UPat(Ops.MULACC, name="ret"), lambda ctx, ret: (ctx * ret.src[1], ctx * ret.src[0], ctx)),
  # transcendental
  (UPat(Ops.EXP2, name="ret"), lambda ctx, ret: (ctx * ret * _like(ret, LN2),)),
  (UPat(Ops.LOG2, name="ret"), lambda ctx, ret: (ctx / (ret.src[0] * _like(ret, LN2)),)),
  (UPat(Ops.SIN, name="ret"), lambda ctx, ret: (ctx * _cosine(ret.src[0]),)),
  (UPat(Ops.SQRT, name="ret"), lambda ctx, ret: (ctx / (ret * _like(ret, 2.0)),)),
  (UPat(Ops.RECIPROCAL, name="ret"), lambda ctx, ret: (-(ctx * ret * ret),)),
  (UPat(Ops.TRUNC, name="ret"), lambda ctx, ret: (_like(ret, 0.0),)),
  # selection and conversion
  (UPat(Ops.WHERE, name="ret"), lambda ctx, ret: (None, ret.src[0].where(ctx, _like(ctx, 0.0)),
                                                  ret.src[0].where(_like(ctx, 0.0), ctx))),
  (UPat(Ops.CAST, name="ret"), lambda ctx, ret: (UOp(Ops.CAST, ret.src[0].dtype, (ctx,))
                                                 if dtypes.is_float(ret.src[0].dtype) else None,)),
  (UPat((Ops.CONTIGUOUS, Ops.REALIZE)), lambda ctx: (ctx,)),
  # a copy's gradient is copied back to the device its source lives on
  (UPat(Ops.COPY, name="ret"), lambda ctx, ret: (_copy_to(ctx, ret.src[0].device), None)),
  # the user asked for the gradient flowing back here to be a buffer: it is read many times by what comes next
  (UPat(Ops.CONTIGUOUS_BACKWARD), lambda ctx: (UOp(Ops.CONTIGUOUS, ctx.dtype, (ctx,)),)),
  # reductions
  (UPat(Ops.REDUCE_AXIS, name="ret"), _reduce_axis_grad),
  # movement: the gradient takes the inverse movement
  (UPat(Ops.RESHAPE, name="ret"), lambda ctx, ret: (ctx.reshape(ret.src[0].shape),)),
  (UPat(Ops.EXPAND, name="ret"), lambda ctx, ret: (_reduce_to(ctx, ret.src[0].shape),)),
  (UPat(Ops.PERMUTE, name="ret"), lambda ctx, ret: (ctx.permute(_inverse_permutation(ret.arg)),)),
  (UPat(Ops.PAD, name="ret"), _pad_grad),
  (UPat(Ops.SHRINK, name="ret"), _shrink_grad),
  (UPat(Ops.FLIP, name="ret"), lambda ctx, ret: (ctx.flip(ret.arg),)),
])
"""After pm_gradient: a rule gives one gradient (or None) per source of the node it matched."""

# ops that start a graph: gradients stop at them
LEAVES = frozenset({Ops.BUFFER, Ops.CONST, Ops.DEVICE, Ops.UNIQUE, Ops.DEFINE_VAR, Ops.BIND})

# ops through which no gradient flows
NOT_DIFFERENTIABLE = GroupOp.Comparison | {Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR, Ops.IDIV, Ops.MOD, Ops.THREEFRY,
                                           Ops.DETACH, Ops.BITCAST, Ops.IOTA}


def remember_origin(view: UOp, graph: UOp) -> None:
  """Differentiate the realized buffer view `view` through the graph it was computed from (see tensor.py). The graph
  lives on the view, as long as it: it reaches the views of earlier results, and in a table keyed weakly by view each
  entry would keep those keys alive, so a garbage collection would free such a chain one link at a time."""
  view.__dict__["autograd_origin"] = graph
  _views_with_origin.add(view)


def autograd_origin(view: UOp) -> UOp | None:
  """The graph a realized buffer view was computed from, where remember_origin kept it."""
  return view.__dict__.get("autograd_origin")


def any_origin_remembered() -> bool:
  """Whether a live view has a remembered graph: where none has, no graph reaches one (most eager realizes)."""
  return len(_views_with_origin) > 0


_views_with_origin: weakref.WeakSet[UOp] = weakref.WeakSet()  # nodes compare by identity: a WeakSet fits


def expand_realized(root: UOp) -> tuple[UOp, dict[UOp, UOp]]:
  """root with every realized buffer view replaced by the graph it came from (repeatedly: those graphs may read
  earlier results), and the reverse map, to point the gradient back at the buffers that hold those values."""
  reverse: dict[UOp, UOp] = {}
  while mapping := {node: origin for node in root.toposort if (origin := autograd_origin(node)) is not None}:
    reverse.update({origin: view for view, origin in mapping.items()})
    root = substitute(root, mapping)
  return root, reverse


def _on_path_to(root: UOp, targets: set[UOp]) -> set[UOp]:
  """The nodes between root and any target: only these need gradients."""
  leads: dict[UOp, bool] = {}
  for node in root.toposort:
    leads[node] = node in targets or (node.op not in NOT_DIFFERENTIABLE and any(leads[s] for s in node.src))
  return {node for node, yes in leads.items() if yes}


def compute_gradient(root: UOp, root_grad: UOp, targets: set[UOp]) -> dict[UOp, UOp]:
  """d(root)/d(target) for every target that root depends on, given the gradient flowing into root. Realized
  values on the way are differentiated through the graphs they came from, and read back from their buffers."""
  root, reverse = expand_realized(root)
  grads = _gradients(root, root_grad, targets)
  return {target: substitute(grad, reverse) for target, grad in grads.items()} if reverse else grads


# A composite operation whose gradient the rules would build in a form that schedules badly can name a better one:
# function(node, gradient flowing into it, the nodes that need a gradient) -> {input: gradient}. It must give the
# gradient of every input of the composite that can need one (the walk does not enter the composite's graph).
CustomGradient = Callable[[UOp, UOp, set[UOp]], dict[UOp, UOp]]


def set_custom_gradient(node: UOp, gradient: CustomGradient | None) -> None:
  """Differentiate `node` by `gradient` instead of by the rules (None: by the rules again). The function lives on the
  node: it goes when the node does, and a node rebuilt differently (by expand_realized, say) falls back to the rules,
  which stay correct. Not in a table keyed weakly by node: the function holds the composite's inputs, whose graphs
  reach earlier composites, so each entry would keep the keys before it alive and a garbage collection would free such
  a chain one link at a time (an eager training loop kept every step's graph and buffers)."""
  if gradient is None: node.__dict__.pop("custom_gradient", None)
  else: node.__dict__["custom_gradient"] = gradient


def custom_gradient(node: UOp) -> CustomGradient | None:
  """The function set_custom_gradient gave the node, or None."""
  return node.__dict__.get("custom_gradient")


def _gradients(root: UOp, root_grad: UOp, targets: set[UOp]) -> dict[UOp, UOp]:
  needed = _on_path_to(root, targets)
  grads: dict[UOp, UOp] = {root: root_grad}
  for node in reversed(list(root.toposort)):
    if node not in grads or node not in needed or node.op in NOT_DIFFERENTIABLE or node.op in LEAVES: continue
    if (custom := custom_gradient(node)) is not None:
      for source, grad in custom(node, grads[node], needed).items():
        if source in needed: grads[source] = grads[source] + grad if source in grads else grad
      continue
    source_grads = pm_gradient.rewrite(node, ctx=grads[node])
    if source_grads is None: raise NotImplementedError(f"no gradient rule for {node.op}")
    for source, grad in zip(node.src, source_grads):
      if grad is None or source not in needed: continue
      grads[source] = grads[source] + grad if source in grads else grad
  return {target: grads[target] for target in targets if target in grads}
