"""The shape of the code after expand and linearize: vector loads and stores where memory is contiguous, gathers
where it is not, masks where an amount does not divide a size, one loop for all the accumulators of a blocked
reduction, fused multiply-adds, and the LLVM IR that follows from them."""
from __future__ import annotations

import numpy as np
import pytest

from rawgrad.compiler.codegen.lower import lower_kernel
from rawgrad.compiler.codegen.opt.kernel import Opt, OptOps
from rawgrad.compiler.ir import Ops, UOp
from rawgrad.compiler.rangeify import create_schedule
from rawgrad.compiler.render.llvmir import LLVMRenderer
from rawgrad.tensor import Tensor
from tests.compiler.codegen.kernels import last_kernel, run_item


def kernel(tensor: Tensor) -> UOp:
  return create_schedule([tensor.uop]).items[-1].ast


def program(tensor: Tensor, opts: list[Opt]) -> list[UOp]:
  return lower_kernel(kernel(tensor), opts).program


def zeros(*shape: int) -> Tensor:
  return Tensor(np.zeros(shape, np.float32))


def memory_ops(instructions: list[UOp], op: Ops) -> list[UOp]:
  return [u for u in instructions if u.op is op and u.src[0].op is Ops.INDEX]


def test_contiguous_elementwise_is_vector_loads_and_stores() -> None:
  instructions = program(zeros(64) + zeros(64), [Opt(OptOps.UPCAST, 0, 16)])
  assert [u.dtype.count for u in memory_ops(instructions, Ops.LOAD)] == [16, 16]
  assert [u.src[1].dtype.count for u in memory_ops(instructions, Ops.STORE)] == [16]
  assert not any(len(u.src[0].src) > 2 for u in memory_ops(instructions, Ops.LOAD))  # 16 divides 64: no mask


def test_an_amount_that_does_not_divide_masks_the_lanes() -> None:
  instructions = program(zeros(60) + zeros(60), [Opt(OptOps.UPCAST, 0, 16)])
  loads, stores = memory_ops(instructions, Ops.LOAD), memory_ops(instructions, Ops.STORE)
  assert all(len(u.src[0].src) == 3 and u.src[0].src[2].dtype.count == 16 for u in loads + stores)
  source = LLVMRenderer().render("k", instructions)
  assert "@llvm.masked.load.v16f32" in source and "@llvm.masked.store.v16f32" in source


def test_strided_loads_are_gathered_lane_by_lane() -> None:
  instructions = program(zeros(8, 16).permute(1, 0) + 1, [Opt(OptOps.UPCAST, 1, 8)])
  loads = memory_ops(instructions, Ops.LOAD)
  assert len(loads) == 8 and all(u.dtype.count == 1 for u in loads)
  assert any(u.op is Ops.VECTORIZE for u in instructions)


def test_loads_a_few_elements_apart_load_their_run_and_pick_the_lanes() -> None:
  """Lanes 2 apart (a pooling window's stride): one load of the 15 elements from the first lane's to the last's, its
  even elements the lanes (the transposed load above, 16 apart, stays gathered: most of its run would be waste)."""
  x = np.arange(64, dtype=np.float32)
  every_other = Tensor(x).reshape(32, 2)[:, 0] + 1
  opts = [Opt(OptOps.UPCAST, 0, 8)]
  instructions = program(every_other, opts)
  assert [u.dtype.count for u in memory_ops(instructions, Ops.LOAD)] == [15]
  assert [u.arg for u in instructions if u.op is Ops.GEP] == [(0, 2, 4, 6, 8, 10, 12, 14)]
  np.testing.assert_array_equal(run_item(last_kernel(every_other), opts), x[::2] + 1)


@pytest.mark.parametrize("lanes, copies", [(8, 8), (16, 4), (16, 2), (8, 2)])
def test_a_transposing_copy_loads_rows_along_its_copies_and_shuffles_them_into_lanes(lanes: int, copies: int) -> None:
  """To channels last: the store is contiguous along the channels (the lanes), the load along the columns (the
  copies). Each block of copies loads one row of `copies` neighbours per lane and transposes: no lane is gathered."""
  x = np.arange(2 * 16 * 3 * 8, dtype=np.float32).reshape(2, 16, 3, 8)
  channels_last = Tensor(x).permute(0, 2, 3, 1) + 1  # loops: images, pixels (rows and columns: one run), channels
  opts = [Opt(OptOps.UPCAST, 2, lanes), Opt(OptOps.UNROLL, 1, copies)]
  instructions = program(channels_last, opts)
  assert [u.dtype.count for u in memory_ops(instructions, Ops.LOAD)] == [copies] * lanes
  assert all(len(u.src) == 2 for u in instructions if u.op is Ops.GEP)
  assert not any(u.op is Ops.VECTORIZE for u in instructions)
  np.testing.assert_array_equal(run_item(last_kernel(channels_last), opts), (x.transpose(0, 2, 3, 1) + 1).reshape(-1))


def test_a_padded_transposing_copy_stays_gathered_with_the_paddings_zeros() -> None:
  """Padded along the columns, the copies' loads are gated by the column: a block of them is not one row of the
  input (the edge columns are padding), so they stay gathered where the gate says, with the padding's zeros."""
  x = np.arange(2 * 16 * 3 * 8, dtype=np.float32).reshape(2, 16, 3, 8)
  channels_last = Tensor(x).pad(((0, 0), (0, 0), (0, 0), (1, 1))).permute(0, 2, 3, 1) + 1
  opts = [Opt(OptOps.UPCAST, 3, 16), Opt(OptOps.UNROLL, 2, 2)]
  assert not any(u.op is Ops.GEP and len(u.src) == 2 for u in program(channels_last, opts))
  expected = np.pad(x, ((0, 0), (0, 0), (0, 0), (1, 1))).transpose(0, 2, 3, 1) + 1
  np.testing.assert_array_equal(run_item(last_kernel(channels_last), opts), expected.reshape(-1))


def test_matmul_register_block_is_one_loop_of_fused_multiply_adds() -> None:
  opts = [Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.UNROLL, 1, 2), Opt(OptOps.UNROLL, 0, 8)]
  instructions = program(zeros(64, 32) @ zeros(32, 64), opts)
  assert [u.src[0].arg for u in instructions if u.op is Ops.RANGE] == [8, 2, 32]  # i/8, j/32, k
  accumulators = [u for u in instructions if u.op is Ops.DEFINE_REG]
  assert len(accumulators) == 16 and all(u.dtype.count == 16 for u in accumulators)
  assert sum(1 for u in instructions if u.op is Ops.MULACC) == 16
  loads = memory_ops(instructions, Ops.LOAD)
  assert sorted(u.dtype.count for u in loads) == [1] * 8 + [16] * 2  # 8 broadcast rows of A, 2 vectors of B
  assert len(memory_ops(instructions, Ops.STORE)) == 16


def test_reducing_the_vector_axis_combines_lanes_after_the_loop() -> None:
  instructions = program(zeros(4, 256).sum(1), [Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.UNROLL, 1, 4)])
  accumulators = [u for u in instructions if u.op is Ops.DEFINE_REG]
  assert len(accumulators) == 4 and all(u.dtype.count == 16 for u in accumulators)
  assert [u.src[0].arg for u in instructions if u.op is Ops.RANGE] == [4, 4]
  # each accumulator's 16 lanes are combined by halving: 8, 4, 2, then 1 lane
  assert sorted(len(u.arg) for u in instructions if u.op is Ops.GEP) == sorted([8, 8, 4, 4, 2, 2, 1, 1] * 4)


def test_parallel_loop_reads_its_slice_from_the_core_arguments() -> None:
  instructions = program(zeros(64) + 1, [Opt(OptOps.PARALLEL, 0)])
  assert [u.arg[1] for u in instructions if u.op is Ops.RANGE] == ["parallel"]
  source = LLVMRenderer().render("k", instructions)
  assert "mul i64 64, %core" in source and "udiv" in source


def test_a_staged_panel_is_copied_before_the_loops_that_read_it() -> None:
  opts = [Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.TILE, 1, 2), Opt(OptOps.LOCAL, 0, 2)]
  instructions = program(zeros(16, 64) @ zeros(64, 64), opts)
  ranges = [(u.arg[1], u.src[0].arg) for u in instructions if u.op is Ops.RANGE]
  # the tile loop, the copy of its 64x2x16 panel (source rows outermost), then the loops that use it
  assert ranges == [("loop", 2), ("stage", 64), ("stage", 2), ("loop", 4), ("loop", 2), ("reduce", 64)]
  local_loads = [u for u in memory_ops(instructions, Ops.LOAD) if u.src[0].src[0].op is Ops.DEFINE_LOCAL]
  assert [u.dtype.count for u in local_loads] == [16]
  assert "alloca [2048 x float], align 64" in LLVMRenderer().render("k", instructions)


def test_streamed_stores_are_non_temporal_where_aligned_and_fenced() -> None:
  source = LLVMRenderer().render("k", program(zeros(64) + 1, [Opt(OptOps.UPCAST, 0, 16), Opt(OptOps.STREAM, 0)]))
  assert "align 64, !nontemporal !0" in source and "fence seq_cst" in source
