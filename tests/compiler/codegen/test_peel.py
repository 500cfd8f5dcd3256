"""Peeling: a split an output loop's size does not divide leaves its gates only in the peeled last iteration, and the
kernel computes the same values, with the remainder of any length, on any number of cores."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from rawgrad.compiler.codegen.lower import lower_kernel
from rawgrad.compiler.codegen.opt.heuristic import hand_coded_opts, register_block
from rawgrad.compiler.codegen.opt.kernel import Opt, OptOps, apply_opts
from rawgrad.compiler.codegen.peel import peel_remainders
from rawgrad.compiler.ir import Ops, UOp
from rawgrad.compiler.target import host_target
from rawgrad.tensor import Tensor

from tests.compiler.codegen.kernels import last_kernel, run_item

ROW_BLOCKS = [Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.UNROLL, 0, 12), Opt(OptOps.UNROLL, 1, 2)]


def rand(*shape: int, seed: int) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def gates(program: list[UOp]) -> list[UOp]:
  return [u.src[2] for u in program if u.op is Ops.INDEX and len(u.src) == 3]


@pytest.mark.parametrize("m", [1, 11, 12, 13, 25, 50])
def test_row_blocks_with_a_remainder_match_numpy(m: int) -> None:
  a, b = rand(m, 37, seed=1), rand(37, 70, seed=2)
  item = last_kernel(Tensor(a) @ Tensor(b))
  columns = 1 if m > 12 else 0  # 12 rows or fewer leave no loop over row blocks
  for opts in (ROW_BLOCKS, ROW_BLOCKS + [Opt(OptOps.PARALLEL, columns)],
               ROW_BLOCKS + [Opt(OptOps.TILE, columns, 2), Opt(OptOps.PARALLEL, 0), Opt(OptOps.LOCAL, 0, 2)]):
    for cores in (1, 3):
      got = run_item(item, opts, cores).reshape(m, 70)
      np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-4, err_msg=f"{opts}, {cores} cores")


def test_the_main_loop_has_no_gates() -> None:
  item = last_kernel(Tensor(rand(50, 37, seed=1)) @ Tensor(rand(37, 64, seed=2)))
  program = lower_kernel(item.ast, ROW_BLOCKS).program
  # every gate left is a constant of the peeled last block (rows 48 and 49 of it exist, the rest do not)
  assert gates(program) and all(gate.op is Ops.CONST for gate in gates(program))
  ranges = [u for u in program if u.op is Ops.RANGE]
  assert [r.src[0].arg for r in ranges if r.arg[1] == "loop"] == [4, 2, 2]  # rows 0..47 by 12, columns twice


def test_two_loops_peel_into_four_nests() -> None:
  a, b = rand(25, 19, seed=1), rand(19, 21, seed=2)
  item = last_kernel(Tensor(a) @ Tensor(b))
  opts = [Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UNROLL, 0, 3), Opt(OptOps.UNROLL, 1, 2)]
  peeled = peel_remainders(apply_opts(item.ast, opts))
  assert len(peeled.src) == 4
  np.testing.assert_allclose(run_item(item, opts).reshape(25, 21), a @ b, rtol=1e-4, atol=1e-4)


def test_a_loop_split_between_cores_peels_its_last_iteration_into_the_last_slice() -> None:
  a, b = rand(50, 37, seed=1), rand(37, 64, seed=2)
  item = last_kernel(Tensor(a) @ Tensor(b))
  opts = ROW_BLOCKS + [Opt(OptOps.PARALLEL, 0), Opt(OptOps.LOCAL, 0, 2)]
  program = lower_kernel(item.ast, opts).program
  assert gates(program) and all(gate.op is Ops.CONST for gate in gates(program))
  ranges = [u for u in program if u.op is Ops.RANGE]
  assert [r.src[0].arg for r in ranges if r.arg[1] in ("parallel", "last")] == [4, 1]  # rows 0..47 by 12; 48, 49
  for cores in (1, 3, 6):
    np.testing.assert_allclose(run_item(item, opts, cores).reshape(50, 64), a @ b, rtol=1e-4, atol=1e-4)
  # without the last of 3 slices, rows 0..31 are written (blocks 0 and 1 of the 4), the last block and rows 48, 49 not
  got = run_item(item, opts, 3, slices=[0, 1], fill=np.nan).reshape(50, 64)
  np.testing.assert_allclose(got[:24], (a @ b)[:24], rtol=1e-4, atol=1e-4)
  assert np.isnan(got[24:]).all()


def test_a_split_reduction_does_not_peel_its_parallel_loop() -> None:
  """After a GROUP's barrier only one slice runs the program: the last slice may not be the one."""
  x = rand(3, 4100, seed=1)
  item = last_kernel(Tensor(x).sum(axis=1))
  opts = [Opt(OptOps.GROUP, 1, 8)]  # chunks of 513: the last one is shorter
  optimized = apply_opts(item.ast, opts)
  assert any(node.op is Ops.BARRIER for node in optimized.toposort)
  assert peel_remainders(optimized) is optimized
  for cores in (1, 3):
    np.testing.assert_allclose(run_item(item, opts, cores), x.sum(axis=1), rtol=1e-4, atol=1e-3)


def test_heuristics_block_rows_the_size_does_not_divide() -> None:
  a, b = rand(100, 2048, seed=1), rand(2048, 96, seed=2)
  item = last_kernel(Tensor(a) @ Tensor(b))
  opts = hand_coded_opts(item.ast)
  rows, _ = register_block(host_target(), vectors=1, rows_available=100, widen=(2,))  # 12 on AVX-512, 6 on AVX2
  assert 100 % rows != 0 and Opt(OptOps.UNROLL, 0, rows) in opts, opts
  np.testing.assert_allclose(run_item(item, None, 2).reshape(100, 96), a @ b, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("registers, ways, rows", [(32, 12, 10), (16, 12, 5)], ids=["avx512", "avx2"])
def test_a_small_kernel_takes_rows_that_divide(registers: int, ways: int, rows: int) -> None:
  """Its run is too short to repay compiling a peeled block: 10 rows of 100 (5 with AVX2's registers), not 12 (6) and
  a rest."""
  a, b = rand(100, 64, seed=1), rand(64, 96, seed=2)
  item = last_kernel(Tensor(a) @ Tensor(b))
  target = replace(host_target(), vector_bytes=registers * 2, vector_registers=registers, l1_ways=ways)
  assert register_block(target, vectors=1, rows_available=100, widen=(2,))[0] == 12 * registers // 32
  opts = hand_coded_opts(item.ast, target)
  assert Opt(OptOps.UNROLL, 0, rows) in opts, opts
  np.testing.assert_allclose(run_item(item, opts, 2).reshape(100, 96), a @ b, rtol=1e-4, atol=1e-4)


def test_a_staged_copy_inside_a_peeled_loop_is_made_in_both_nests() -> None:
  a, b = rand(25, 37, seed=1), rand(37, 70, seed=2)
  item = last_kernel(Tensor(a) @ Tensor(b))
  opts = ROW_BLOCKS + [Opt(OptOps.LOCAL, 1, 2)]  # B's panel, copied inside the loop over column blocks
  np.testing.assert_allclose(run_item(item, opts, 3).reshape(25, 70), a @ b, rtol=1e-4, atol=1e-4)
  # the copy runs once per column block in each nest, never inside the reduction that reads it
  open_kinds: list[str] = []
  copies = 0
  for u in lower_kernel(item.ast, opts).program:
    if u.op is Ops.RANGE:
      if u.arg[1] == "stage" and "stage" not in open_kinds:
        assert "reduce" not in open_kinds
        copies += 1
      open_kinds.append(u.arg[1])
    elif u.op is Ops.END: open_kinds.pop()
  assert copies == 2


def test_a_peeled_block_sums_in_its_own_loop() -> None:
  """Two column blocks of 3 vectors over 5 vectors of columns: the first alone is left beside the peeled second, and
  each sums in a loop of its own (in one loop they would hold twice the accumulators the block was sized for)."""
  a, b = rand(8, 37, seed=1), rand(37, 20, seed=2)
  item = last_kernel(Tensor(a) @ Tensor(b))
  opts = [Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UNROLL, 0, 2), Opt(OptOps.UNROLL, 1, 3)]
  program = lower_kernel(item.ast, opts).program
  assert [r.src[0].arg for r in program if r.op is Ops.RANGE and r.arg[1] == "reduce"] == [37, 37]
  for cores in (1, 3):
    np.testing.assert_allclose(run_item(item, opts, cores).reshape(8, 20), a @ b, rtol=1e-4, atol=1e-4)
