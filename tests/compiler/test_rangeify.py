"""The scheduler's fusion decisions, checked by kernel counts, the reasons nodes become buffers, and values.

A node becomes a buffer when it is an output, when contiguous() asks for it, or when recomputing it for its consumers
would repeat a reduction (a consumer broadcasts it, or consumers index it differently). Elementwise work is always
recomputed in place, and movement ops never copy.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rawgrad.compiler import rangeify
from rawgrad.compiler.codegen.opt.kernel import Opt, OptError, OptOps, apply_opts
from rawgrad.compiler.ir import Ops, UOp, origins
from rawgrad.compiler.rangeify import Schedule, _reshape_groups, _reshape_index, buffer_base, create_schedule
from rawgrad.compiler.symbolic import evaluate
from rawgrad.dtype import dtypes
from rawgrad.errors import IndexOutOfRange
from rawgrad.helpers import GlobalCounters
from rawgrad.tensor import realize_tensors
from rawgrad.tensor import Tensor

N = 6


def rand(*shape: int, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def schedule_of(*tensors: Tensor) -> Schedule:
  return create_schedule([t.uop for t in tensors])


def kernels_to_realize(*tensors: Tensor) -> int:
  """Realize the tensors and count the kernels that ran."""
  GlobalCounters.reset()
  realize_tensors(list(tensors))
  return GlobalCounters.kernel_count


def intermediate_buffers(schedule: Schedule) -> list[tuple[Ops, str]]:
  """(op, reason) of every node that became a buffer for a reason other than being an output."""
  return [(node.op, reason) for node, reason in schedule.reasons.items() if reason != "output"]


def assert_fusion(t: Tensor, kernels: int, expected: np.ndarray, rtol: float = 1e-5, atol: float = 1e-5) -> Schedule:
  """t's schedule has `kernels` kernels, realizing it runs that many, and its values match numpy's."""
  schedule = schedule_of(t)
  assert len(schedule.items) == kernels, [item.name for item in schedule.items]
  assert kernels_to_realize(t) == kernels
  assert buffer_base(t.uop) is not None
  np.testing.assert_allclose(t.numpy(), expected, rtol=rtol, atol=atol)
  return schedule


# *** one kernel ***

def test_elementwise_then_reduce_is_one_kernel() -> None:
  a, b, c = rand(4, 5, seed=1), rand(4, 5, seed=2), rand(4, 5, seed=3)
  schedule = assert_fusion(((Tensor(a) + Tensor(b)) * Tensor(c)).sum(), 1, ((a + b) * c).sum())
  assert intermediate_buffers(schedule) == []


def test_reduce_over_an_axis_with_broadcast_inputs_is_one_kernel() -> None:
  a, b = rand(4, 1, seed=1), rand(1, 5, seed=2)
  assert_fusion((Tensor(a) * Tensor(b) + 1).sum(0), 1, (a * b + 1).sum(0))


@pytest.mark.parametrize("shape_a, shape_b", [((3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5)), ((2, 3, 4), (4, 5)),
                                              ((4,), (4, 5)), ((3, 4), (4,))])
def test_matmul_is_one_kernel(shape_a: tuple, shape_b: tuple) -> None:
  a, b = rand(*shape_a, seed=1), rand(*shape_b, seed=2)
  schedule = assert_fusion(Tensor(a) @ Tensor(b), 1, a @ b)
  assert intermediate_buffers(schedule) == []


def test_matmul_of_transposed_and_flipped_views_is_one_kernel() -> None:
  a, b = rand(4, 3, seed=1), rand(5, 4, seed=2)
  assert_fusion(Tensor(a).T @ Tensor(b)[::-1].T, 1, a.T @ b[::-1].T)


def test_elementwise_epilogue_of_matmul_is_one_kernel() -> None:
  a, b, bias = rand(3, 4, seed=1), rand(4, 5, seed=2), rand(5, seed=3)
  assert_fusion((Tensor(a) @ Tensor(b) + Tensor(bias)).relu(), 1, np.maximum(a @ b + bias, 0))


def test_permute_then_reshape_is_one_kernel_without_a_copy() -> None:
  x = rand(4, N)
  t = Tensor(x).permute(1, 0).reshape(3, 8) + 1
  schedule = assert_fusion(t, 1, x.transpose(1, 0).reshape(3, 8) + 1)
  assert intermediate_buffers(schedule) == [], "a movement op was copied into a buffer"
  assert list(schedule.reasons.values()) == ["output"]


def test_chain_of_movement_ops_is_one_kernel() -> None:
  x = rand(4, N)
  t = Tensor(x).flip(0).pad(((1, 1), (0, 2))).permute(1, 0)[1:, ::2].reshape(-1) * 2
  expected = np.pad(x[::-1], ((1, 1), (0, 2))).transpose(1, 0)[1:, ::2].reshape(-1) * 2
  schedule = assert_fusion(t, 1, expected)
  assert intermediate_buffers(schedule) == []


def test_reduce_used_twice_the_same_way_is_not_buffered() -> None:
  x = rand(4, N)
  s = Tensor(x).sum(1)
  schedule = assert_fusion(s * s + s, 1, x.sum(1) * x.sum(1) + x.sum(1))
  assert intermediate_buffers(schedule) == []


def test_elementwise_used_at_different_indices_is_recomputed() -> None:
  x = rand(4, N)
  y = Tensor(x) * 2
  schedule = assert_fusion(y + y.flip(0), 1, x * 2 + (x * 2)[::-1])
  assert intermediate_buffers(schedule) == []


def test_elementwise_broadcast_two_ways_is_recomputed() -> None:
  v = rand(N)
  y = (Tensor(v) * 2).exp()
  expected = np.exp(v * 2).reshape(1, N) + np.exp(v * 2).reshape(N, 1)
  schedule = assert_fusion(y.reshape(1, N) + y.reshape(N, 1), 1, expected)
  assert intermediate_buffers(schedule) == []


def test_elementwise_used_three_ways_is_recomputed() -> None:
  x = rand(4, 4)
  y = Tensor(x).exp() + 1
  expected = (np.exp(x) + 1) * (np.exp(x) + 1).T - (np.exp(x) + 1)[::-1, 1:].sum(1, keepdims=True)
  assert_fusion(y * y.permute(1, 0) - y.flip(0)[:, 1:].sum(1, keepdim=True), 2, expected)


def test_reduction_of_a_reduction_is_one_kernel() -> None:
  x = rand(4, N)
  assert_fusion(Tensor(x).sum(1).max(), 1, x.sum(1).max())
  a, b = rand(3, 4, seed=1), rand(4, 5, seed=2)
  assert_fusion((Tensor(a) @ Tensor(b)).sum(), 1, (a @ b).sum())


def test_two_full_reductions_into_one_scalar_are_one_kernel() -> None:
  x = rand(4, N)
  assert_fusion(Tensor(x).sum() + Tensor(x).max(), 1, x.sum() + x.max())


# *** buffers ***

def test_softmax_over_rows_is_three_kernels() -> None:
  x = rand(4, N)
  t = Tensor(x)
  e = (t - t.max(1, keepdim=True)).exp()
  softmax = e / e.sum(1, keepdim=True)
  ex = np.exp(x - x.max(1, keepdims=True))
  schedule = assert_fusion(softmax, 3, ex / ex.sum(1, keepdims=True))
  buffered = intermediate_buffers(schedule)
  assert [op for op, _ in buffered] == [Ops.REDUCE_AXIS, Ops.REDUCE_AXIS], buffered
  np.testing.assert_allclose(softmax.numpy().sum(1), np.ones(4), rtol=1e-5)


def test_variance_is_two_kernels() -> None:
  x = rand(4, N)
  t = Tensor(x)
  centered = t - t.mean(1, keepdim=True)
  assert_fusion((centered * centered).mean(1), 2, x.var(1))


def test_reduce_broadcast_two_ways_is_buffered() -> None:
  x = rand(4, N)
  s = Tensor(x).sum(1)
  expected = x.sum(1).reshape(1, 4) + x.sum(1).reshape(4, 1)
  schedule = assert_fusion(s.reshape(1, 4) + s.reshape(4, 1), 2, expected)
  buffered = intermediate_buffers(schedule)
  assert [op for op, _ in buffered] == [Ops.REDUCE_AXIS], buffered


def test_reduce_indexed_differently_is_buffered() -> None:
  x = rand(4, N)
  s = Tensor(x).sum(1)
  schedule = assert_fusion(s + s.flip(0), 2, x.sum(1) + x.sum(1)[::-1])
  buffered = intermediate_buffers(schedule)
  assert len(buffered) == 1 and "index it differently" in buffered[0][1], buffered


def test_a_widened_reduce_indexed_differently_is_buffered_narrow() -> None:
  """A widening cast is index arithmetic for the buffering decision: its narrower source is stored, and each
  consumer widens what it reads (the same values, half the bytes for float32 widened to float64)."""
  x = rand(4, N)
  s = Tensor(x).sum(1).cast(dtypes.float64)
  expected = x.sum(1).astype(np.float64) + x.sum(1).astype(np.float64)[::-1]
  schedule = assert_fusion(s + s.flip(0), 2, expected)
  buffered = intermediate_buffers(schedule)
  assert [op for op, _ in buffered] == [Ops.REDUCE_AXIS], buffered
  stored = [node.dtype.base for item in schedule.items for node in item.ast.toposort if node.op is Ops.DEFINE_GLOBAL]
  assert dtypes.float64 in stored and stored.count(dtypes.float32) >= 2, stored  # the sum's buffer is float32


def test_elementwise_on_a_reduce_indexed_differently_is_buffered_once() -> None:
  x = rand(4, N)
  s = Tensor(x).sum(1).exp()
  expected = np.exp(x.sum(1)) * np.exp(x.sum(1))[::-1]
  schedule = assert_fusion(s * s.flip(0), 2, expected, rtol=1e-4)
  assert len(intermediate_buffers(schedule)) == 1


def test_an_exponential_a_matmul_broadcasts_is_buffered() -> None:
  """exp(x) @ w would compute each exponential once per column of w (32 times): it becomes a buffer."""
  x, w = rand(8, 16, seed=1), rand(16, 32, seed=2)
  schedule = assert_fusion(Tensor(x).exp() @ Tensor(w), 2, np.exp(x) @ w, rtol=1e-4, atol=1e-4)
  buffered = intermediate_buffers(schedule)
  assert len(buffered) == 1 and "exponentials or divisions again" in buffered[0][1], buffered
  assert not any(node.op is Ops.EXP2 for node in schedule.items[-1].ast.toposort)


def test_a_costly_value_the_sums_loop_does_not_move_is_not_buffered() -> None:
  """A per-column scale computed with a square root inside a sum over rows is the same on every row: the kernel
  computes it once per output (LLVM hoists it); so is a product broadcast fewer than 16 times."""
  x, v = rand(64, 8, seed=1), np.abs(rand(8, seed=2))
  assert_fusion((Tensor(x) / (Tensor(v) + 1).sqrt()).sum(0), 1, (x / np.sqrt(v + 1)).sum(0), rtol=1e-4)
  x, w = rand(8, 16, seed=1), rand(16, 4, seed=2)
  assert_fusion(Tensor(x).exp() @ Tensor(w), 1, np.exp(x) @ w, rtol=1e-4, atol=1e-4)


def test_other_readers_of_a_value_made_contiguous_read_its_buffer() -> None:
  """A sum's ReLU, made contiguous (a convolution's input), and the ReLU's gradient reading it: the gradient's kernel
  reads the contiguous buffer, so the sum's kernel stores the ReLU alone (two kernels, the sum not a buffer)."""
  x, g = rand(16, 32, seed=1), rand(16, seed=2)
  source = Tensor(x)
  act = source.sum(1).relu()
  following = act.contiguous()
  gradient = (act <= 0).where(0, Tensor(g))
  origins[gradient.uop] = "where at test"  # as PROFILE records it: the rebuilt node keeps it
  schedule = schedule_of(following, gradient)
  assert len(schedule.items) == 2 and intermediate_buffers(schedule) == [(Ops.CONTIGUOUS, "contiguous requested")]
  first, second = schedule.items
  assert first.buffers[0] in second.buffers[1:] and buffer_base(source.uop) not in second.buffers
  assert "where at test" in second.operations
  realize_tensors([following, gradient])
  relu = np.maximum(x.sum(1), 0)
  np.testing.assert_allclose(following.numpy(), relu, rtol=1e-5)
  np.testing.assert_allclose(gradient.numpy(), np.where(relu <= 0, 0, g), rtol=1e-5)


def test_a_value_made_contiguous_and_realized_itself_keeps_its_own_buffer() -> None:
  x = rand(8, seed=3)
  value = Tensor(x) * 2 + 1
  copy = value.contiguous()
  realize_tensors([value, copy])
  np.testing.assert_allclose(value.numpy(), x * 2 + 1)
  np.testing.assert_allclose(copy.numpy(), x * 2 + 1)
  assert buffer_base(value.uop) is not buffer_base(copy.uop)


def test_sums_over_the_same_memory_share_a_kernel_and_a_pass() -> None:
  """Three sums over the rows of one matrix, realized together (a batch norm's gradient sums): one kernel, one loop
  over the rows, three accumulators."""
  x = rand(64, N, seed=1)
  t = Tensor(x, device="CPU")   # a CPU rule (SHARED_SUM_DEVICES)
  sums = [t.sum(0), (t * t).sum(0), (t * 2 + 1).sum(0)]
  schedule = schedule_of(*sums)
  assert len(schedule.items) == 1, [item.name for item in schedule.items]
  reduces = [node for node in schedule.items[0].ast.toposort if node.op is Ops.REDUCE]
  assert len(reduces) == 3 and len({node.src[1:] for node in reduces}) == 1
  assert kernels_to_realize(*sums) == 1
  for got, expected in zip(sums, [x.sum(0), (x * x).sum(0), (x * 2 + 1).sum(0)]):
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-4)


def test_matmuls_of_one_shape_keep_their_own_kernels() -> None:
  """Products of broadcast inputs (two matmuls of one shape) are not streaming sums: each keeps the kernel its
  register blocks are planned for."""
  x, w1, w2 = rand(8, 16, seed=1), rand(16, 4, seed=2), rand(16, 4, seed=3)
  a, b = Tensor(x) @ Tensor(w1), Tensor(x) @ Tensor(w2)
  assert len(schedule_of(a, b).items) == 2
  realize_tensors([a, b])
  np.testing.assert_allclose(a.numpy(), x @ w1, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(b.numpy(), x @ w2, rtol=1e-5, atol=1e-5)


def test_contiguous_forces_a_buffer() -> None:
  x = rand(4, N)
  schedule = assert_fusion(Tensor(x).permute(1, 0).contiguous() + 1, 2, x.T + 1)
  assert intermediate_buffers(schedule) == [(Ops.CONTIGUOUS, "contiguous requested")]


def test_contiguous_of_a_buffer_is_free() -> None:
  x = rand(4, N)
  assert len(schedule_of(Tensor(x).contiguous() * 2).items) == 1
  assert_fusion(Tensor(x).reshape(N, 4).contiguous() * 2, 1, x.reshape(N, 4) * 2)


# *** realized buffers and the becomes map ***

def test_realized_buffers_are_reused() -> None:
  x = rand(4, N)
  y = Tensor(x).exp().sum(1)
  assert kernels_to_realize(y) == 1
  base = buffer_base(y.uop)
  assert base is not None
  z = y * 2 + y.flip(0)
  schedule = schedule_of(z)
  assert len(schedule.items) == 1, "only the new kernel"
  assert base in schedule.items[0].buffers, "the new kernel reads the realized buffer"
  assert not any(node.op is Ops.REDUCE for node in schedule.items[0].ast.toposort), "the sum was recomputed"
  assert kernels_to_realize(z) == 1
  np.testing.assert_allclose(z.numpy(), np.exp(x).sum(1) * 2 + np.exp(x).sum(1)[::-1], rtol=1e-5)


def test_realizing_again_runs_nothing() -> None:
  y = Tensor(rand(4, N)) + 1
  assert kernels_to_realize(y) == 1
  assert kernels_to_realize(y) == 0
  assert len(schedule_of(y).items) == 0


def test_becomes_map_maps_outputs_to_buffer_views() -> None:
  x = rand(4, N)
  y = Tensor(x).sum(1, keepdim=True) * 2
  schedule = schedule_of(y)
  replacement = schedule.becomes_map[y.uop]
  assert buffer_base(replacement) is not None and replacement.shape == y.shape
  assert buffer_base(replacement) is schedule.items[-1].buffers[0], "the output is the last kernel's first buffer"
  before = y.uop
  y.realize()
  assert y.uop is not before and buffer_base(y.uop) is not None and y.shape == (4, 1)
  assert buffer_base(y.uop).op is Ops.BUFFER
  np.testing.assert_allclose(y.numpy(), x.sum(1, keepdims=True) * 2, rtol=1e-5)


def test_becomes_map_updates_every_tensor_that_shares_the_graph() -> None:
  x = rand(4, N)
  t = Tensor(x)
  row_max = t.max(1, keepdim=True)
  e = (t - row_max).exp()
  total = e.sum(1, keepdim=True)
  softmax = e / total
  later = softmax * 3  # built before softmax is realized
  assert kernels_to_realize(softmax) == 3
  assert buffer_base(softmax.uop) in later.uop.toposort
  # the buffered intermediates are buffers now: reading them runs nothing
  assert kernels_to_realize(row_max) == 0 and kernels_to_realize(total) == 0
  np.testing.assert_allclose(row_max.numpy(), x.max(1, keepdims=True))
  ex = np.exp(x - x.max(1, keepdims=True))
  np.testing.assert_allclose(total.numpy(), ex.sum(1, keepdims=True), rtol=1e-5)
  assert kernels_to_realize(later) == 1
  np.testing.assert_allclose(later.numpy(), ex / ex.sum(1, keepdims=True) * 3, rtol=1e-5)
  # e was recomputed inside the kernels, never stored: realizing it is one new elementwise kernel
  assert kernels_to_realize(e) == 1
  np.testing.assert_allclose(e.numpy(), ex, rtol=1e-5)


def test_a_movement_op_is_indexed_once_per_index_in_a_schedule(monkeypatch: pytest.MonkeyPatch) -> None:
  import rawgrad.compiler.rangeify as rangeify
  asked: list[tuple] = []
  index_through = rangeify.index_through
  def counting(node: UOp, idx: tuple, valid: UOp) -> tuple:
    asked.append((node, idx, valid))
    return index_through(node, idx, valid)
  monkeypatch.setattr(rangeify, "index_through", counting)
  x = rand(4, N)
  s = Tensor(x).sum(1).exp()
  # deciding the buffers and building the kernels both index the flips, at the same ranges
  out = s * s.flip(0) + s.flip(0)
  assert len(schedule_of(out).items) == 2
  assert asked and len(asked) == len(set(asked))
  np.testing.assert_allclose(out.numpy(), np.exp(x.sum(1)) * np.exp(x.sum(1))[::-1] + np.exp(x.sum(1))[::-1],
                             rtol=1e-4)


def test_assign_that_reads_its_buffer_at_other_indices_computes_into_a_buffer_first() -> None:
  x = np.arange(6, dtype=np.float32)
  flipped = Tensor(x.copy()).contiguous().realize()
  flipped.assign((flipped.flip(0) + flipped).reshape(2, 3).permute(1, 0).permute(1, 0).reshape(6))
  assert sorted(schedule_of(flipped).reasons.values()) == ["assign", "it reads the buffer it is assigned into at "
                                                                     "other indices"]
  np.testing.assert_array_equal(flipped.numpy(), x[::-1] + x)
  # the same indices only: each element is read before it is written, in one kernel
  doubled = Tensor(x.copy()).contiguous().realize()
  doubled.assign(doubled * 2 + 1)
  assert list(schedule_of(doubled).reasons.values()) == ["assign"]
  np.testing.assert_array_equal(doubled.numpy(), x * 2 + 1)


def test_realizing_two_outputs_together() -> None:
  x = rand(4, N)
  a = Tensor(x) + 1
  b = (Tensor(x) * 2).sum(0)
  assert len(schedule_of(a, b).items) == 2
  assert kernels_to_realize(a, b) == 2
  np.testing.assert_allclose(a.numpy(), x + 1)
  np.testing.assert_allclose(b.numpy(), (x * 2).sum(0), rtol=1e-5)


def test_kernel_count_matches_schedule_length() -> None:
  x = rand(4, N)
  t = Tensor(x)
  out = (t.sum(1).reshape(4, 1) + t.max(0).reshape(1, N)).exp().sum()
  schedule = schedule_of(out)
  assert kernels_to_realize(out) == len(schedule.items) == 3
  expected = np.exp(x.sum(1).reshape(4, 1) + x.max(0).reshape(1, N)).sum()
  np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5)


# *** reshape index mapping ***

@st.composite
def reshapes(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """Two shapes with the same number of elements: factors of one size, dealt out to axes twice."""
  factors = draw(st.lists(st.sampled_from([1, 2, 3, 5]), min_size=0, max_size=6))

  def deal() -> tuple[int, ...]:
    cuts = sorted(draw(st.lists(st.integers(0, len(factors)), max_size=4)))
    bounds = [0, *cuts, len(factors)]
    shape = [int(np.prod(factors[a:b])) for a, b in zip(bounds, bounds[1:])]
    return tuple(draw(st.permutations(shape))) if draw(st.booleans()) else tuple(shape)
  return deal(), deal()


@settings(max_examples=150, deadline=None)
@given(reshapes())
def test_reshape_index_matches_the_flat_mapping(shapes: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
  shape, source_shape = shapes
  if int(np.prod(shape)) != int(np.prod(source_shape)): return  # a permuted deal can change neither product
  ranges = tuple(UOp.range(size, axis) for axis, size in enumerate(shape))
  mapped = _reshape_index(ranges, shape, source_shape)
  for flat in range(int(np.prod(shape))):
    position = np.unravel_index(flat, shape) if shape else ()
    values = {r: int(p) for r, p in zip(ranges, position)}
    expected = np.unravel_index(flat, source_shape) if source_shape else ()
    assert tuple(int(evaluate(i, values)) for i in mapped) == tuple(int(e) for e in expected), (shape, source_shape)


def test_reshape_groups_pair_the_smallest_runs() -> None:
  assert _reshape_groups((6, 4), (2, 3, 4)) == [([0], [0, 1]), ([1], [2])]
  assert _reshape_groups((4, 6), (8, 3)) == [([0, 1], [0, 1])]
  assert _reshape_groups((5, 1), (5,)) == [([0, 1], [0])]
  assert _reshape_groups((3, UOp.range(4, 0)), (12,)) is None


# *** multi-output kernels ***

def test_outputs_realized_together_share_a_kernel() -> None:
  a, b, c = rand(3, 4), rand(4, 3, seed=1), rand(5, seed=2)
  x, y, z, w = Tensor(a) * 2 + 1, (Tensor(b) * 3).exp(), Tensor(a).permute(1, 0) + Tensor(b), Tensor(c) + 1
  schedule = schedule_of(x, y, z, w)
  # x, y and z have 12 elements each: one flat range; w's 5 elements follow them in one concatenated range
  assert [item.outputs for item in schedule.items] == [4] and schedule.items[0].dims == (17,)
  realize_tensors([x, y, z, w])
  for tensor, expected in ((x, a * 2 + 1), (y, np.exp(b * 3)), (z, a.T + b), (w, c + 1)):
    np.testing.assert_allclose(tensor.numpy(), expected, rtol=1e-6)


def test_an_assign_read_at_the_same_index_is_computed_once_with_its_reader() -> None:
  momentum, param, grad = Tensor(rand(4, 4)), Tensor(rand(4, 4, seed=1)), rand(4, 4, seed=2)
  expected_momentum = momentum.numpy() * 0.5 + grad
  expected_param = param.numpy() - expected_momentum * 0.1
  momentum.assign(momentum * 0.5 + Tensor(grad))
  param.assign(param - momentum * 0.1)
  schedule = schedule_of(param, momentum)
  assert len(schedule.items) == 1 and schedule.items[0].outputs == 2
  realize_tensors([param, momentum])
  np.testing.assert_allclose(momentum.numpy(), expected_momentum, rtol=1e-6)
  np.testing.assert_allclose(param.numpy(), expected_param, rtol=1e-6)


def test_a_kernel_that_would_read_what_it_overwrites_elsewhere_is_split() -> None:
  # y's new value reads x's old buffer transposed while x is overwritten: in one kernel some reads would come late
  x, y = Tensor(rand(4, 4)), Tensor(rand(4, 4, seed=1))
  old_x, old_y, x_before = x.numpy(), y.numpy(), x.detach()
  y.assign(y + x_before.permute(1, 0))
  x.assign(x * 2)
  assert [item.outputs for item in schedule_of(x, y).items] == [1, 1]
  realize_tensors([x, y])
  np.testing.assert_allclose(x.numpy(), old_x * 2, rtol=1e-6)
  np.testing.assert_allclose(y.numpy(), old_y + old_x.T, rtol=1e-6)


def test_many_buffers_stay_one_kernel() -> None:
  # past the target's argument limit the kernel reads an argument table (codegen's choice): no split here
  tensors = [Tensor(rand(8, seed=i)) * (i + 3) for i in range(300)]
  items = create_schedule([t.uop for t in tensors]).items
  assert [item.outputs for item in items] == [300] and len(items[0].buffers) == 600


def _reduce_sizes(tensor: Tensor) -> list[list[int]]:
  ast = schedule_of(tensor).items[-1].ast
  return [[r.src[0].arg for r in node.src[1:]] for node in ast.toposort if node.op is Ops.REDUCE]


def test_a_reduction_over_contiguous_rows_loops_over_them_as_one() -> None:
  """A batch norm's statistics sum (batch, height, width) of NCHW: height and width are one run of 30 floats."""
  x = rand(4, 3, 5, 6)
  total = Tensor(x).sum((0, 2, 3))
  assert _reduce_sizes(total) == [[4, 30]]
  np.testing.assert_allclose(total.numpy(), x.sum((0, 2, 3)), rtol=1e-5, atol=1e-5)
  # a pooling window's rows do not continue one another, nor do a transposed tensor's
  assert _reduce_sizes(Tensor(x).max_pool2d(2)) == [[2, 2]]
  assert _reduce_sizes(Tensor(x).permute(0, 1, 3, 2).sum((2, 3))) == [[6, 5]]


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=2, max_size=4), data=st.data())
def test_merged_reduce_loops_sum_what_numpy_sums(shape: list[int], data: st.DataObject) -> None:
  axes = tuple(sorted(data.draw(st.sets(st.integers(0, len(shape) - 1), min_size=1))))
  order = data.draw(st.permutations(range(len(shape))))
  x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape) % 7
  got = Tensor(x).permute(*order).sum(axes).numpy()
  np.testing.assert_array_equal(got, x.transpose(order).sum(axes))


def _output_sizes(tensor: Tensor) -> list[int]:
  ast = schedule_of(tensor).items[-1].ast
  loops = {node for node in ast.toposort if node.op is Ops.RANGE and node.arg[1] == "loop"}
  return [r.src[0].arg for r in sorted(loops, key=lambda r: r.arg[0])]


def test_output_loops_walked_as_one_are_one_loop() -> None:
  """An update of a contiguous 64x32x3x3 weight is one loop of 18432 elements, not rows of 3 (vectors of 4 lanes with
  one masked off: 10x slower in MNIST's AdamW)."""
  w, g = rand(64, 32, 3, 3), rand(64, 32, 3, 3, seed=1)
  update = Tensor(w) - Tensor(g) * 0.1
  assert _output_sizes(update) == [18432]
  np.testing.assert_allclose(update.numpy(), w - g * 0.1, rtol=1e-6)
  # a broadcast row, a transposed read and a padded read keep the loops they do not walk as one apart
  x = rand(4, 3, 5, 6)
  assert _output_sizes(Tensor(x) + Tensor(rand(6))) == [60, 6]
  assert _output_sizes(Tensor(x).permute(0, 1, 3, 2) + 1) == [12, 6, 5]
  assert _output_sizes(Tensor(x).pad(((0, 0), (0, 0), (1, 1), (1, 1))) + 1) == [12, 7, 8]


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=2, max_size=4), data=st.data())
def test_merged_output_loops_compute_what_numpy_computes(shape: list[int], data: st.DataObject) -> None:
  order = data.draw(st.permutations(range(len(shape))))
  broadcast = data.draw(st.sets(st.integers(0, len(shape) - 1)))
  x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape) % 7
  out_shape = [shape[axis] for axis in order]
  y = np.arange(np.prod(out_shape), dtype=np.float32).reshape(out_shape) % 5
  y = y[tuple(slice(0, 1) if axis in broadcast else slice(None) for axis in range(len(shape)))]
  got = (Tensor(x).permute(*order) * 2 + Tensor(np.ascontiguousarray(y))).numpy()
  np.testing.assert_array_equal(got, x.transpose(order) * 2 + y)


def _has_reduce(tensor: Tensor) -> bool:
  return any(node.op is Ops.REDUCE for item in schedule_of(tensor).items for node in item.ast.toposort)


def test_an_embedding_reads_its_rows_not_every_row() -> None:
  """The one-hot sum embedding and indexing are written as becomes a gather: no reduction over the 50 rows."""
  weight = rand(50, 8)
  indices = np.array([[1, 2, 3], [49, -1, 0]], np.int32)
  picked = Tensor(weight)[Tensor(indices)]  # negative indices count from the end
  assert not _has_reduce(picked)
  np.testing.assert_array_equal(picked.numpy(), weight[indices])
  embedded = Tensor(indices % 50).embedding(Tensor(weight))
  assert not _has_reduce(embedded)
  np.testing.assert_array_equal(embedded.numpy(), weight[indices % 50])
  # a sum over the loop of something else than a selection stays a sum
  assert _has_reduce(Tensor(weight).sum(0))


def test_an_index_out_of_range_computed_on_the_device_reads_nothing_and_raises_at_the_read() -> None:
  weight = Tensor(rand(50, 8))
  far = Tensor(np.array([0, 1, 2], np.int32)) * 1_000_000_000 + 3  # out of range, known only once computed
  # the gathered address is clamped to row 0 where the index is out of range (LLVM may also drop such a load, so
  # the run alone cannot show it)
  gather = schedule_of(weight[far]).items[-1].ast
  gathered = [node for node in gather.toposort if node.op is Ops.INDEX and
              any(n.op is Ops.LOAD for n in node.src[1].toposort)]
  assert gathered and all(any(n.op is Ops.WHERE and n.src[2].op is Ops.CONST and n.src[2].arg == 0
                              for n in node.src[1].toposort) for node in gathered)
  picked = weight[far].realize()  # the gather runs (its check is computed beside it, read at the next read)
  with pytest.raises(IndexOutOfRange, match="index 2000000003 is out of bounds for dim 0 with size 50"): picked.numpy()


@settings(max_examples=30, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=3), data=st.data())
def test_a_collapsed_gather_takes_what_numpy_takes(shape: list[int], data: st.DataObject) -> None:
  axis = data.draw(st.integers(0, len(shape) - 1))
  index_shape = [data.draw(st.integers(1, size)) if d != axis else data.draw(st.integers(1, 6))
                 for d, size in enumerate(shape)]
  x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape) - 7
  index = np.random.default_rng(len(shape) * 10 + axis).integers(0, shape[axis], index_shape).astype(np.int32)
  got = Tensor(x).gather(axis, Tensor(index))
  expected = np.take_along_axis(x[tuple(slice(0, s) if d != axis else slice(None) for d, s in enumerate(index_shape))],
                                index, axis)
  np.testing.assert_array_equal(got.numpy(), expected)


# *** a one-hot sum whose terms each land in one row is a scatter ***

def _scatter_kinds(tensor: Tensor) -> list[str]:
  """Per kernel: "fill" (stores without loading), "scatter" (adds its terms in order: accumulate loops, no
  reduction), "sum" (a reduction) or "elementwise"."""
  kinds = []
  for item in schedule_of(tensor).items:
    nodes = item.ast.toposort
    sums = any(n.op is Ops.REDUCE for n in nodes)
    if any(n.op is Ops.RANGE and n.arg[1] == "accumulate" for n in nodes) and not sums: kinds.append("scatter")
    elif sums: kinds.append("sum")
    else: kinds.append("elementwise" if any(n.op is Ops.LOAD for n in nodes) else "fill")
  return kinds


def _weight_gradient(weight: np.ndarray, pick, upstream: np.ndarray) -> Tensor:
  w = Tensor(weight, requires_grad=True)
  (pick(w) * Tensor(upstream)).sum().backward()
  return w.grad


def test_an_embedding_gradient_adds_each_row_where_its_index_points() -> None:
  """The weight gradient of an embedding, index_select or gather sums one-hot rows: a fill of zeros, then each
  term added to its row in order, the same result as the sum (np.add.at adds in the same order: equal bits)."""
  rows, width, picks = 1000, 16, 512
  rng = np.random.default_rng(0)
  index = rng.integers(-rows, rows, picks).astype(np.int32)
  index[:8] = index[8]  # repeated rows add up
  upstream = rand(picks, width, seed=4)
  grad = _weight_gradient(np.zeros((rows, width), np.float32), lambda w: w[Tensor(index)], upstream)
  assert _scatter_kinds(grad) == ["fill", "scatter"]
  expected = np.zeros((rows, width), np.float32)
  np.add.at(expected, index % rows, upstream)
  np.testing.assert_array_equal(grad.numpy(), expected)
  # again with other indices: the schedule remembered for this graph's shape
  other = rng.integers(0, rows, picks).astype(np.int32)
  grad = _weight_gradient(np.zeros((rows, width), np.float32), lambda w: w.index_select(0, Tensor(other)), upstream)
  expected = np.zeros((rows, width), np.float32)
  np.add.at(expected, other, upstream)
  np.testing.assert_array_equal(grad.numpy(), expected)
  # a gather along the rows: each column has its own indices
  columns = rng.integers(0, rows, (picks, width)).astype(np.int32)
  grad = _weight_gradient(np.zeros((rows, width), np.float32), lambda w: w.gather(0, Tensor(columns)), upstream)
  assert _scatter_kinds(grad) == ["fill", "scatter"]
  expected = np.zeros((rows, width), np.float32)
  np.add.at(expected, (columns, np.arange(width)), upstream)
  np.testing.assert_array_equal(grad.numpy(), expected)


def test_scatter_add_and_a_count_by_index_are_scattered_after_their_start() -> None:
  rows, width, picks = 1000, 16, 512
  rng = np.random.default_rng(1)
  base, source = rand(rows, width, seed=5), rand(picks, width, seed=6)
  index = rng.integers(0, rows, (picks, width)).astype(np.int32)
  added = Tensor(base).scatter_add(0, Tensor(index), Tensor(source))
  assert _scatter_kinds(added) == ["elementwise", "scatter"]  # the fill copies the base
  expected = base.copy()
  np.add.at(expected, (index, np.arange(width)), source)
  np.testing.assert_array_equal(added.numpy(), expected)
  # along dim 1 each row's terms are contiguous: the terms' loop goes inside the rows' (along dim 0, outside)
  for dim, innermost in ((0, "loop"), (1, "accumulate")):
    flip = (lambda a: a) if dim == 0 else (lambda a: a.T.copy())
    along = Tensor(flip(base)).scatter_add(dim, Tensor(flip(index)), Tensor(flip(source)))
    assert _scatter_kinds(along) == ["elementwise", "scatter"]
    loops = [n for n in schedule_of(along).items[-1].ast.toposort if n.op is Ops.RANGE]
    assert max(loops, key=lambda r: r.arg[0]).arg[1] == innermost
    np.testing.assert_array_equal(along.numpy(), flip(expected))
  labels = rng.integers(0, rows, 8192).astype(np.int32)
  counts = (Tensor(labels).unsqueeze(1) == Tensor.arange(rows)).sum(0)  # a bool cast to a number: a count
  assert _scatter_kinds(counts) == ["fill", "scatter"]
  np.testing.assert_array_equal(counts.numpy(), np.bincount(labels, minlength=rows))


def test_a_scattered_sum_that_another_kernel_would_compute_inside_gets_its_own() -> None:
  """An SGD step subtracts the gradient where it computes it: the sum becomes a buffer, scattered, and the step reads
  it (computed inside the step's kernel, it would be the one-hot sum over every row)."""
  rows, width, picks = 1000, 16, 512
  weight, upstream = rand(rows, width, seed=8), rand(picks, width, seed=9)
  index = np.random.default_rng(4).integers(0, rows, picks).astype(np.int32)
  w = Tensor(weight, requires_grad=True)
  (w[Tensor(index)] * Tensor(upstream)).sum().backward()
  stepped = w.detach() - 0.5 * w.grad
  schedule = schedule_of(stepped)
  assert _scatter_kinds(stepped) == ["fill", "scatter", "elementwise"]
  assert any("scattered" in reason for reason in schedule.reasons.values())
  gradient = np.zeros((rows, width), np.float32)
  np.add.at(gradient, index, upstream)
  np.testing.assert_array_equal(stepped.numpy(), weight - np.float32(0.5) * gradient)


def test_a_scatter_larger_than_the_caches_adds_to_what_it_stored() -> None:
  """An output this large would get streamed stores, which a kernel that reads back what it stored must not use."""
  rows, width, picks = 32768, 128, 256
  index = np.random.default_rng(2).integers(0, rows, picks).astype(np.int32)
  upstream = rand(picks, width, seed=7)
  grad = _weight_gradient(np.zeros((rows, width), np.float32), lambda w: w[Tensor(index)], upstream)
  assert _scatter_kinds(grad) == ["fill", "scatter"]
  expected = np.zeros((rows, width), np.float32)
  np.add.at(expected, index, upstream)
  np.testing.assert_array_equal(grad.numpy(), expected)


def test_small_and_few_row_one_hot_sums_and_products_stay_sums() -> None:
  rng = np.random.default_rng(3)
  # too little work to pay for a second launch
  small = rng.integers(0, 50, 64).astype(np.int32)
  assert _scatter_kinds(_weight_gradient(rand(50, 8), lambda w: w[Tensor(small)], rand(64, 8))) == ["sum"]
  # four rows: the scatter would save too little
  few = rng.integers(0, 4, 65536).astype(np.int32)
  grad = _weight_gradient(rand(4, 16), lambda w: w[Tensor(few)], np.ones((65536, 16), np.float32))
  assert _scatter_kinds(grad) == ["sum"]
  np.testing.assert_array_equal(grad.numpy(), np.repeat(np.bincount(few, minlength=4)[:, None], 16, 1))
  # a one-hot matrix times values is a product: 0 * inf is nan in every row, not only in the row picked
  labels = rng.integers(0, 1000, 512).astype(np.int32)
  values = rand(512, 16)
  values[3, 0] = np.inf
  product = Tensor(labels).one_hot(1000).float().T @ Tensor(values)
  assert _scatter_kinds(product) == ["sum"]
  with np.errstate(invalid="ignore"): expected = np.eye(1000, dtype=np.float32)[labels].T @ values
  assert np.isnan(expected[:, 0]).sum() == 999
  np.testing.assert_allclose(product.numpy(), expected, rtol=1e-5, atol=1e-5)
  # on a GPU (here the simulated one) the terms would run one after another in each thread: it stays a sum
  on_gpu = Tensor(np.zeros((1000, 16), np.float32), device="SIM", requires_grad=True)
  (on_gpu[Tensor(labels, device="SIM")] * Tensor(values, device="SIM")).sum().backward()
  assert _scatter_kinds(on_gpu.grad) == ["sum"]


def test_a_stored_parameter_is_not_staged() -> None:
  """A local copy of what the scatter reads back would miss what it stored since."""
  grad = _weight_gradient(np.zeros((1000, 16), np.float32), lambda w: w[Tensor(np.arange(512, dtype=np.int32))],
                          rand(512, 16))
  scatter = schedule_of(grad).items[-1].ast
  with pytest.raises(OptError, match="stores into parameter 0"):
    apply_opts(scatter, [Opt(OptOps.PARALLEL, 1), Opt(OptOps.LOCAL, 0, 0)])


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 9), width=st.integers(1, 20), picks=st.integers(1, 40), seed=st.integers(0, 1 << 16))
def test_scattered_sums_add_what_numpy_adds(rows: int, width: int, picks: int, seed: int) -> None:
  rng = np.random.default_rng(seed)
  base, source = rand(rows, width, seed=seed), rand(picks, width, seed=seed + 1)
  index = rng.integers(0, rows, (picks, width)).astype(np.int32)
  with pytest.MonkeyPatch.context() as patch:  # every size scattered
    patch.setattr(rangeify, "SCATTER_MIN_WORK", 0)
    patch.setattr(rangeify, "SCATTER_MIN_SAVING", 0)
    added = Tensor(base).scatter_add(0, Tensor(index), Tensor(source))
    # (a loop of one row or one term is no loop)
    scattered = "scatter" in _scatter_kinds(added)
    assert scattered == (rows > 1 and picks > 1)
    got = added.numpy()
  expected = base.copy()
  np.add.at(expected, (index, np.arange(width)), source)
  # scattered, the terms are added to the base one by one, as np.add.at adds them; a sum adds them up first
  if scattered: np.testing.assert_array_equal(got, expected)
  else: np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_sums_over_the_same_memory_keep_kernels_of_their_own_on_a_gpu() -> None:
  """On a GPU each sum of few outputs gets a block of threads (BLOCK_REDUCE) when it is alone; in one kernel the three
  would get a thread per output (a batch norm's 32 channels: 32 threads, 11.8 ms on the H100)."""
  x = rand(64, N, seed=1)
  t = Tensor(x, device="SIM")
  sums = [t.sum(0), (t * t).sum(0), (t * 2 + 1).sum(0)]
  assert len(schedule_of(*sums).items) == 3
  realize_tensors(sums)
  for got, expected in zip(sums, [x.sum(0), (x * x).sum(0), (x * 2 + 1).sum(0)]):
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-4)


def test_a_gpu_reduction_of_few_outputs_sums_chunks_first() -> None:
  """A full sum on a GPU was one block of threads (one SM of 132 on the H100: 2^26 floats in 8.44 ms, 0.78 split).
  The outermost reduce axis is split so the partials' kernel has SPLIT_REDUCE_BLOCKS blocks, each summing at least
  SPLIT_REDUCE_CHUNK elements; a second kernel sums the partials. The CPU keeps one kernel."""
  from rawgrad.compiler.rangeify import SPLIT_REDUCE_BLOCKS, SPLIT_REDUCE_MIN_ELEMENTS
  total = schedule_of(Tensor.empty(1 << 24, device="SIM").sum()).items
  assert [item.ast.arg for item in total] == ["r_512_1_32768", "r_1_512"]
  channels = schedule_of(Tensor.empty(256, 32, 32, 32, device="SIM").sum((0, 2, 3))).items
  assert [item.ast.arg for item in channels] == ["r_16_1_32_1_1_16_1024", "r_32_16"]   # 16 x 32 partials of 16384
  assert len(schedule_of(Tensor.empty(1 << 24, device="CPU").sum()).items) == 1
  # enough outputs already, or too little to read (MNIST's batch norm sums: 128x32x20x20)
  assert len(schedule_of(Tensor.empty(SPLIT_REDUCE_BLOCKS, 1 << 14, device="SIM").sum(1)).items) == 1
  assert len(schedule_of(Tensor.empty(128, 32, 20, 20, device="SIM").sum((0, 2, 3))).items) == 1
  assert len(schedule_of(Tensor.empty(SPLIT_REDUCE_MIN_ELEMENTS - 1, device="SIM").sum()).items) == 1


@pytest.mark.parametrize("op", ["sum", "max", "mean"])
def test_split_gpu_reductions_compute_what_numpy_does(op: str, monkeypatch: pytest.MonkeyPatch) -> None:
  from rawgrad.compiler import rangeify
  monkeypatch.setattr(rangeify, "SPLIT_REDUCE_MIN_ELEMENTS", 1)   # small enough for the interpreter
  x = rand(8, 4, 1000, seed=3)   # 1000 is no multiple of any split: the first axis is cut
  t = Tensor(x, device="SIM")
  got = getattr(t, op)((0, 2))
  assert len(schedule_of(got).items) == 2
  np.testing.assert_allclose(got.numpy(), getattr(x, op)((0, 2)), rtol=1e-5, atol=1e-5)
  whole = getattr(Tensor(x, device="SIM"), op)()
  np.testing.assert_allclose(whole.numpy(), getattr(x, op)(), rtol=1e-5, atol=1e-5)
