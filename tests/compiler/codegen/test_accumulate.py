"""ACCUMULATE cuts a sum's loop into blocks and adds each block's sum to the stored output: values against numpy for
blocks that divide the loop and blocks that do not, alone and with the other opts, on one core and several, with
the output holding nan before the launch (the first block must not read it); what it refuses; and the heuristics'
choice for a weight gradient that reads more than the L2 cache holds for every output channel."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rawgrad.compiler.codegen.lower import lower_kernel
from rawgrad.compiler.codegen.opt.heuristic import hand_coded_opts
from rawgrad.compiler.codegen.opt.kernel import ACCUMULATE, Opt, OptError, OptOps, apply_opts, loop_axes, range_kind
from rawgrad.compiler.ir import Ops
from rawgrad.compiler.rangeify import create_schedule
from rawgrad.compiler.rewrite import substitute
from rawgrad.compiler.target import host_target
from rawgrad.tensor import Tensor

from tests.compiler.codegen.kernels import last_kernel, run_item

U, R, T, S, P, L, A = OptOps.UPCAST, OptOps.UNROLL, OptOps.TILE, OptOps.SWAP, OptOps.PARALLEL, OptOps.LOCAL, \
  OptOps.ACCUMULATE


def rand(*shape: int, seed: int) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def matmul(m: int, k: int, n: int) -> tuple[Tensor, np.ndarray]:
  a, b = rand(m, k, seed=1), rand(k, n, seed=2)
  return Tensor(a) @ Tensor(b), a @ b


def check(opts: list[Opt], m: int = 30, k: int = 70, n: int = 24, cores: tuple[int, ...] = (1, 3)) -> None:
  tensor, expected = matmul(m, k, n)
  item = last_kernel(tensor)
  for count in cores:
    got = run_item(item, opts, count, fill=np.nan).reshape(expected.shape)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4, err_msg=f"{opts} on {count} cores")


@pytest.mark.parametrize("amount", [1, 7, 10, 16, 69])
def test_blocks_of_a_sum_add_up(amount: int) -> None:
  """k = 70: blocks of 7 and 10 divide it, 16 leaves a short last block, 69 a last block of one."""
  check([Opt(A, 2, amount)])


def test_with_the_other_opts() -> None:
  """A matmul's opts as the heuristics choose them on a CPU, the sum in blocks of 16 and B packed per block."""
  check([Opt(U, 1, 8), Opt(R, 0, 6), Opt(R, 1, 2), Opt(P, 0, 0), Opt(A, 2, 16), Opt(L, 1, 2)], m=40, k=100, n=32)
  # the block loop swapped inside the rows' loop
  check([Opt(U, 1, 8), Opt(A, 2, 8), Opt(S, 0, 1)])


def test_an_integer_sum_is_exact() -> None:
  a = (rand(9, 200, seed=3) * 100).astype(np.int32)
  item = last_kernel(Tensor(a).sum(1))
  for cores in (1, 2):
    np.testing.assert_array_equal(run_item(item, [Opt(U, 0, 4), Opt(A, 1, 64)], cores), a.sum(1))


def test_the_block_loop_is_an_output_loop_inside_the_parallel_one() -> None:
  ast = last_kernel(matmul(30, 70, 24)[0]).ast
  kinds = [(range_kind(r), r.src[0].arg) for r in loop_axes(apply_opts(ast, [Opt(P, 0, 0), Opt(A, 2, 16)]))]
  assert kinds == [("parallel", 30), (ACCUMULATE, 5), ("loop", 24), ("reduce", 16)]
  program = lower_kernel(ast, [Opt(A, 2, 16)]).program
  # the output is read back, gated off for the first block
  reads = [u for u in program if u.op is Ops.LOAD and u.src[0].op is Ops.INDEX and u.src[0].src[0].arg == 0]
  assert len(reads) == 1 and len(reads[0].src[0].src) == 3


@settings(max_examples=15, deadline=None)
@given(m=st.integers(2, 9), k=st.integers(2, 40), n=st.integers(2, 19), amount=st.integers(1, 39),
       vector=st.sampled_from([0, 4, 8]))
def test_any_sizes(m: int, k: int, n: int, amount: int, vector: int) -> None:
  opts = [Opt(U, 1, vector)] if vector else []
  # a vector as wide as the columns leaves no loop of them: the sum's loop is the last one either way
  axes = loop_axes(apply_opts(last_kernel(matmul(m, k, n)[0]).ast, opts))
  check(opts + [Opt(A, len(axes) - 1, min(amount, k - 1))], m, k, n, cores=(2,))


def refused(ast, opts: list[Opt], message: str) -> None:
  with pytest.raises(OptError, match=message): apply_opts(ast, opts)


def test_what_it_refuses() -> None:
  ast = last_kernel(matmul(30, 70, 24)[0]).ast
  refused(ast, [Opt(A, 0, 8)], "not a reduce loop")
  refused(ast, [Opt(A, 2, 70)], "not longer than one block")
  refused(ast, [Opt(A, 2, 0)], "positive")
  # a tile of 4 blocks of the 3 would add a past-the-end block that finds the output gated off
  for op in (U, R, P, T):
    refused(ast, [Opt(A, 2, 32), Opt(op, 0, 4)], "one block at a time")
  refused(ast, [Opt(A, 2, 8), Opt(OptOps.GROUP, 2, 2)], "one block at a time")
  refused(ast, [Opt(A, 2, 8), Opt(OptOps.STREAM, 0)], "one block at a time")
  refused(ast, [Opt(OptOps.STREAM, 0), Opt(A, 2, 8)], "streamed")
  a, b = rand(6, 50, seed=4), rand(50, 5, seed=5)
  refused(last_kernel((Tensor(a) @ Tensor(b)).relu()).ast, [Opt(A, 2, 8)], "the sum over loop 2 itself")
  refused(last_kernel(Tensor(a).max(1)).ast, [Opt(A, 1, 8)], "the sum over loop 1 itself")
  # float16 sums in float32 and rounds once at the end: adding rounded blocks would round more often
  refused(last_kernel(Tensor(a.astype(np.float16)).sum(1)).ast, [Opt(A, 1, 8)], "the sum over loop 1 itself")


def test_a_kernel_that_reads_its_output_is_refused() -> None:
  """A matmul whose A is its own output (the scheduler copies such an input first; a kernel built by hand need not):
  adding block by block would read partial sums."""
  ast = last_kernel(matmul(4, 4, 4)[0]).ast
  globals_ = {node.arg: node for node in ast.toposort if node.op is Ops.DEFINE_GLOBAL}
  assert globals_[0].dtype == globals_[1].dtype
  refused(substitute(ast, {globals_[1]: globals_[0]}), [Opt(A, 2, 2)], "reads its output")


def weight_gradient(batch: int, channels: int, size: int) -> tuple[Tensor, np.ndarray]:
  """The gradient of sum(conv2d(x, w) * g) by w, and numpy's."""
  x, w, g = rand(batch, channels, size, size, seed=8), rand(8, channels, 3, 3, seed=9), \
    rand(batch, 8, size - 2, size - 2, seed=10)
  weight = Tensor(w, requires_grad=True)
  (Tensor(x).conv2d(weight) * Tensor(g)).sum().backward()
  windows = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(2, 3))  # batch, channels, y, x, ky, kx
  return weight.grad, np.einsum("bcyxij,boyx->ocij", windows, g)


def test_heuristics_block_a_weight_gradient_by_images() -> None:
  """With an L2 cache of 64 KB, the images (16 x 8 x 14 x 14 floats, 100 KB) no longer fit it: the batch is summed
  in blocks that do, and the values stay numpy's."""
  grad, expected = weight_gradient(16, 8, 14)
  item = last_kernel(grad, "r_")  # its sum over images and pixels (a transposing copy follows)
  small = dataclasses.replace(host_target(), l2_bytes=64 << 10)
  opts = hand_coded_opts(item.ast, small)
  blocked = [opt for opt in opts if opt.op is A]
  assert len(blocked) == 1 and 1 < blocked[0].amount < 16, opts
  assert not any(opt.op is A for opt in hand_coded_opts(item.ast, dataclasses.replace(small, l2_bytes=4 << 20)))
  for cores in (1, 2):
    got = run_item(item, opts, cores, fill=np.nan).reshape(8, 3, 3, 8).transpose(3, 0, 1, 2)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("l2_bytes", [512 << 10, 1 << 20])
def test_heuristics_leave_a_matmul_whole(l2_bytes: int) -> None:
  """A matmul's B is packed a tile at a time and a block of A's rows fits the cache: no blocks (they measured no
  faster for matmuls of 1024 and 2048 on AVX2)."""
  a, b = Tensor.empty(2048, 2048), Tensor.empty(2048, 2048)
  ast = create_schedule([(a @ b).uop]).items[-1].ast
  assert not any(opt.op is A for opt in hand_coded_opts(ast, dataclasses.replace(host_target(), l2_bytes=l2_bytes)))


@pytest.mark.parametrize("batch, blocked", [(512, False), (2048, True)])
def test_heuristics_block_a_transposed_matmuls_long_sum_only(batch: int, blocked: bool) -> None:
  """x^T dy over a batch of 512 or 2048 rows (1024 x 1024 outputs): x's rows jump 4 KB per step of the sum and are
  read again for every tile of dy. Blocks must span 256 steps at least and there must be 4 of them: 512 rows make 2
  (blocks of 128 measured 1-2% slower than none there), 2048 make 8 (AVX-512 on a Zen 5: 431 -> 486 GFLOPS)."""
  x, dy = Tensor.empty(batch, 1024), Tensor.empty(batch, 1024)
  ast = create_schedule([(x.T @ dy).uop]).items[-1].ast
  blocks = [opt for opt in hand_coded_opts(ast, dataclasses.replace(host_target(), l2_bytes=1 << 20)) if opt.op is A]
  assert (len(blocks) == 1 and batch // 8 >= blocks[0].amount >= 256) if blocked else not blocks, blocks
