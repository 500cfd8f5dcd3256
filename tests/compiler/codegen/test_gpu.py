"""GPU lowering: THREADS and BLOCK_REDUCE, grid mapping, the GPU heuristics, and GPU programs run by the interpreter
against numpy (on random shapes, including sizes the block does not divide)."""
import ctypes
import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rawgrad import Tensor
from rawgrad.compiler.codegen.gpu import map_to_gpu
from rawgrad.compiler.codegen.lower import PASSES, lower_kernel
from rawgrad.compiler.codegen.opt.heuristic import hand_coded_opts
from rawgrad.compiler.codegen.opt.kernel import Opt, OptError, OptOps, apply_opts, loop_axes, size_of
from rawgrad.compiler.ir import Ops
from rawgrad.compiler.rangeify import create_schedule
from rawgrad.compiler.spec import SpecError
from rawgrad.compiler.symbolic import evaluate
from rawgrad.compiler.target import gpu_target, host_target
from rawgrad.engine.realize import run_schedule
from rawgrad.engine.runner import variable_slot
from rawgrad.helpers import Context
from rawgrad.runtime.device import buffer_for
from rawgrad.compiler.codegen.linearize import kernel_parameters
from rawgrad.runtime.interpreter import run_program

THREADS, BLOCK_REDUCE = OptOps.THREADS, OptOps.BLOCK_REDUCE


def host_memory(address: int, nbytes: int) -> np.ndarray:
  return np.ctypeslib.as_array((ctypes.c_uint8 * max(nbytes, 1)).from_address(address))[:nbytes]


def last_item(tensor: Tensor):
  items = create_schedule([tensor.uop]).items
  run_schedule(items[:-1])
  return items[-1]


def run_on(tensor: Tensor, arch: str, opts: list[Opt] | None = None) -> np.ndarray:
  """The tensor's last kernel lowered for a GPU and run by the interpreter over host memory."""
  return run_item(last_item(tensor), arch, opts).reshape(tensor.shape)


def run_item(item, arch: str, opts: list[Opt] | None = None) -> np.ndarray:
  """A kernel (its inputs realized) lowered for a GPU and run by the interpreter; its output buffer's values."""
  lowered = lower_kernel(item.ast, opts, gpu_target(arch))
  buffers = [buffer_for(node).ensure_allocated() for node in item.buffers]
  params, variables = kernel_parameters(lowered.program)
  values = dict(item.var_values)
  args = [buffers[p.arg].address for p in params] + [variable_slot(v, values[v]) for v in variables]
  grid = tuple(int(evaluate(s, values)) for s in lowered.global_size)
  block = tuple(int(evaluate(s, values)) for s in lowered.local_size)
  run_program(lowered.program, grid, block, args, host_memory)
  return buffers[0].numpy()


def rand(*shape: int, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("arch", ["sm_90", "gfx942"])
def test_default_opts_match_numpy(arch: str) -> None:
  a, b = rand(33, 20), rand(20, 7, seed=1)
  np.testing.assert_allclose(run_on((Tensor(a) @ Tensor(b)).relu(), arch), np.maximum(a @ b, 0), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(run_on(Tensor(rand(5000)).sum(), arch), rand(5000).sum(), rtol=1e-4)
  np.testing.assert_allclose(run_on(Tensor(a).max(0), arch), a.max(0))
  np.testing.assert_allclose(run_on(Tensor(a).exp().sum(1), arch), np.exp(a).sum(1), rtol=1e-5)


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(2, 70), cols=st.integers(2, 70), threads=st.sampled_from([1, 2, 3, 32, 64]),
       reduce_threads=st.sampled_from([2, 5, 16]), arch=st.sampled_from(["sm_90", "gfx1100"]))
def test_random_thread_splits_match_numpy(rows: int, cols: int, threads: int, reduce_threads: int, arch: str) -> None:
  x, w = rand(rows, cols, seed=rows * 100 + cols), rand(cols, seed=cols)
  # a row broadcast keeps the rows and columns two loops
  np.testing.assert_allclose(run_on(Tensor(x) * Tensor(w) + 1, arch, [Opt(THREADS, 1, threads)]), x * w + 1, rtol=1e-6)
  # THREADS may use up the output loop: the reduce loop is the last one either way
  loops = loop_axes(apply_opts(last_item(Tensor(x).sum(1)).ast, [Opt(THREADS, 0, threads)]))
  opts = [Opt(THREADS, 0, threads), Opt(BLOCK_REDUCE, len(loops) - 1, reduce_threads)]
  summed = run_on(Tensor(x).sum(1), arch, opts)
  np.testing.assert_allclose(summed, x.sum(1), rtol=1e-5, atol=1e-5)


def test_block_reduce_uses_shared_memory_a_barrier_and_one_storing_lane() -> None:
  item = last_item(Tensor(rand(1000)).sum())
  program = lower_kernel(item.ast, [Opt(BLOCK_REDUCE, 0, 64)], gpu_target("sm_90")).program
  locals_ = [u for u in program if u.op is Ops.DEFINE_LOCAL]
  assert len(locals_) == 1 and locals_[0].dtype.size == 64 and locals_[0].dtype.local
  assert sum(1 for u in program if u.op is Ops.BARRIER) == 1
  stores = [u for u in program if u.op is Ops.STORE and u.src[0].op is Ops.INDEX and
            u.src[0].src[0].op is Ops.DEFINE_GLOBAL]
  assert len(stores) == 1 and len(stores[0].src[0].src) == 3, "the output store is gated to lane 0"


def test_block_reduce_refuses_what_it_cannot_do() -> None:
  ast = last_item(Tensor(rand(8, 8)).sum(1)).ast
  with pytest.raises(OptError, match="not a reduce loop"): apply_opts(ast, [Opt(BLOCK_REDUCE, 0, 4)])
  with pytest.raises(OptError, match="fewer than 2 threads"): apply_opts(ast, [Opt(BLOCK_REDUCE, 1, 1)])
  with pytest.raises(OptError, match="cores or on GPU threads"):
    apply_opts(ast, [Opt(OptOps.PARALLEL, 0), Opt(BLOCK_REDUCE, 1, 4)])
  outputs = last_item(Tensor(rand(8, 8)) + Tensor(rand(8))).ast
  for parallel_axis, threads_axis in ((0, 0), (0, 1)):   # THREADS on the parallel loop or beside it
    with pytest.raises(OptError, match="cores or on GPU threads"):
      apply_opts(outputs, [Opt(OptOps.PARALLEL, parallel_axis), Opt(THREADS, threads_axis, 2)])


def test_grid_folds_extra_loops_and_blocks_respect_the_limit() -> None:
  transposed = lambda seed: Tensor(rand(6, 5, 4, 3, seed=seed)).permute(3, 2, 1, 0)  # noqa: E731 - four loops
  item = last_item(transposed(0) + 1)
  mapped = map_to_gpu(apply_opts(item.ast, []), gpu_target("sm_90"))
  names = sorted(u.arg for u in mapped.toposort if u.op is Ops.SPECIAL)
  assert names == ["gidx0", "gidx1", "gidx2"]
  sizes = {u.arg: u.src[0].arg for u in mapped.toposort if u.op is Ops.SPECIAL}
  assert sizes == {"gidx0": 6, "gidx1": 5, "gidx2": 12}
  np.testing.assert_allclose(run_on(transposed(3) + 1, "sm_90", []), rand(6, 5, 4, 3, seed=3).transpose(3, 2, 1, 0) + 1)
  big = last_item(Tensor(rand(64, 64)) + Tensor(rand(64))).ast
  with pytest.raises(OptError, match="32 x 64 threads is more than sm_90.s 1024"):
    lower_kernel(big, [Opt(THREADS, 1, 32), Opt(THREADS, 0, 64)], gpu_target("sm_90"))


def test_heuristics_follow_each_targets_numbers() -> None:
  """The same matmul: vector widths and register files decide the CPU opts, warp sizes the GPU ones."""
  ast = last_item(Tensor(rand(256, 256)) @ Tensor(rand(256, 256, seed=1))).ast
  base = host_target()
  avx512 = dataclasses.replace(base, vector_bytes=64, vector_registers=32)
  avx2 = dataclasses.replace(base, vector_bytes=32, vector_registers=16)
  choices = {name: hand_coded_opts(ast, target) for name, target in
             {"avx512": avx512, "avx2": avx2, "sm_90": gpu_target("sm_90"), "gfx942": gpu_target("gfx942")}.items()}
  upcast = {name: next(o.amount for o in opts if o.op is OptOps.UPCAST) for name, opts in choices.items()
            if name.startswith("avx")}
  assert upcast == {"avx512": 16, "avx2": 8}  # one machine vector of floats
  unrolled = {name: max(o.amount for o in opts if o.op is OptOps.UNROLL) for name, opts in choices.items()
              if name.startswith("avx")}
  assert unrolled["avx2"] < unrolled["avx512"]  # half the registers hold half the accumulators
  threads = {name: [o.amount for o in opts if o.op is THREADS] for name, opts in choices.items()
             if not name.startswith("avx")}
  assert threads["sm_90"] != threads["gfx942"] and all(threads.values())  # blocks of 8 warps of 32 or 64
  for name in ("sm_90", "gfx942"):
    # a 16-byte vector of outputs per thread, a block of 8 rows, and both inputs staged in shared memory by tiles
    assert {(o.op, o.amount) for o in choices[name] if o.op is not THREADS} == \
      {(OptOps.UPCAST, 4), (OptOps.UNROLL, 8), (OptOps.TILE, 16), (OptOps.LOCAL, 1), (OptOps.LOCAL, 2)}


def test_debug_5_prints_a_readable_program_for_each_target(capsys: pytest.CaptureFixture) -> None:
  ast = last_item(Tensor(rand(16, 8)) @ Tensor(rand(8, 4, seed=1))).ast
  for target in (host_target(), gpu_target("sm_90"), gpu_target("gfx1100")):
    with Context(DEBUG=5): lower_kernel(ast, None, target)
    printed = capsys.readouterr().out
    assert f"program {ast.arg} for {target.arch}" in printed and "MULACC" in printed and "STORE" in printed
    assert ("SPECIAL" in printed) == target.is_gpu


def test_spec_catches_a_malformed_kernel_between_passes(monkeypatch: pytest.MonkeyPatch) -> None:
  ast = last_item(Tensor(rand(16)) + 1).ast

  def break_the_index(kernel, target, opts):
    store = kernel.src[0]
    index = store.src[0]
    bad = index.replace(src=(index.src[0], index.src[1].cast(__import__("rawgrad").dtypes.float32)))
    return kernel.replace(src=(store.replace(src=(bad, store.src[1])),))
  planted = [(name, break_the_index if name == "expand_math" else run, gone) for name, run, gone in PASSES]
  monkeypatch.setattr("rawgrad.compiler.codegen.lower.PASSES", planted)
  with Context(SPEC=1), pytest.raises(SpecError, match="after expand_math.*index has dtype dtypes.float32"):
    lower_kernel(ast, [], gpu_target("sm_90"))


@pytest.mark.parametrize("arch", ["sm_90", "gfx1100"])
def test_large_kernels_get_vectors_and_register_blocks_and_stay_right(arch: str) -> None:
  a, b = rand(128, 96), rand(96, 256, seed=1)
  ast = last_item(Tensor(a) @ Tensor(b)).ast
  opts = hand_coded_opts(ast, gpu_target(arch))
  assert Opt(OptOps.UPCAST, 1, 4) in opts and any(o.op is OptOps.UNROLL for o in opts)
  assert sum(1 for o in opts if o.op is OptOps.LOCAL) == 2
  np.testing.assert_allclose(run_on(Tensor(a) @ Tensor(b), arch), a @ b, rtol=1e-4, atol=1e-4)
  x = rand(64, 1024, seed=2)
  assert hand_coded_opts(last_item(Tensor(x) * 3).ast, gpu_target(arch))[0] == Opt(OptOps.UPCAST, 0, 4)  # one loop
  np.testing.assert_allclose(run_on(Tensor(x) * 3 + 1, arch), x * 3 + 1, rtol=1e-6)


def test_a_tile_is_not_staged_for_a_load_whose_gate_differs_between_its_threads() -> None:
  """Two sums side by side (a concatenation): each output column's threads read one of the inputs, gated by the
  column. A shared tile is copied by all the block's threads for all of them, so with that gate the threads of the
  other column would copy nothing: LOCAL refuses, and the default opts compute both sums (topk's passes on gfx1100
  once read zeros)."""
  a, b = rand(2, 3, 32, seed=4)
  both = Tensor(a).sum(1, keepdim=True).cat(Tensor(b).sum(1, keepdim=True), dim=1)
  ast = last_item(both).ast
  opts = [Opt(THREADS, 0, 3), Opt(THREADS, 0, 2), Opt(OptOps.TILE, 0, 16), Opt(OptOps.LOCAL, 0, 1)]
  with pytest.raises(OptError, match="gate depends on loops"): apply_opts(ast, opts)
  for arch in ("sm_90", "gfx1100"):
    np.testing.assert_allclose(run_on(both, arch).reshape(3, 2), np.stack([a.sum(1), b.sum(1)], 1), rtol=1e-5)


def weight_gradient_kernel(n: int, ci: int, co: int, size: int, k: int):
  """The kernel summing a convolution's weight gradient (its inputs computed), and its values by numpy in the order
  the kernel stores them: Ci, kh, kw, Co (the gradient is permuted after it)."""
  x, w, g = rand(n, ci, size, size, seed=1), rand(co, ci, k, k, seed=2), rand(n, co, size - k + 1, size - k + 1, seed=3)
  weight = Tensor(w, requires_grad=True)
  (Tensor(x).conv2d(weight) * Tensor(g)).sum().backward()
  items = create_schedule([weight.grad.uop]).items
  index = next(i for i, item in enumerate(items) if item.ast.arg.startswith("r_"))
  run_schedule(items[:index])
  windows = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(2, 3))   # n, ci, oh, ow, k, k
  return items[index], np.einsum("nchwij,nohw->cijo", windows, g).reshape(-1)


@pytest.mark.parametrize("arch", ["sm_90", "gfx1100"])
def test_block_reduce_of_unrolled_outputs_keeps_each_outputs_partials_apart(arch: str) -> None:
  """Outputs unrolled before a BLOCK_REDUCE (a register block) each have a slot per lane in shared memory: with one
  slot per lane, the unrolled outputs overwrote each other's partials."""
  item, expected = weight_gradient_kernel(2, 4, 4, 8, 3)
  ast = item.ast
  # Ci, kh, kw, Co; the reduction runs over n, oh, ow
  assert [size_of(r) for r in loop_axes(ast)] == [4, 3, 3, 4, 2, 6, 6]
  for opts in ([Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.UNROLL, 2, 2), Opt(BLOCK_REDUCE, 3, 2)],
               [Opt(OptOps.UNROLL, 1, 3), Opt(OptOps.UNROLL, 1, 3), Opt(BLOCK_REDUCE, 2, 8)], None):
    np.testing.assert_allclose(run_item(item, arch, opts), expected, rtol=1e-4, atol=1e-4)
  with pytest.raises(OptError, match="vector outputs"):
    apply_opts(ast, [Opt(OptOps.UPCAST, 0, 4), Opt(BLOCK_REDUCE, 4, 2)])
