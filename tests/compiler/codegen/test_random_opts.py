"""Random sequences of the opts BEAM may try (any opt, any loop, any amount, in any order), applied to kernels of
awkward sizes: whatever applies must compute the same values as numpy, on one core and split across three. Catches
opts that are each right alone but wrong together (found so far: a staged copy inside a peeled loop; a parameter
staged twice). One-off runs with 150–250 examples of up to 7–8 opts per case passed; CI runs 10 per case."""
from __future__ import annotations

from typing import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rawgrad.compiler.codegen.lower import lower_kernel
from rawgrad.compiler.codegen.opt.kernel import Opt, OptError, OptOps, apply_opt
from rawgrad.compiler.render.llvmir import LLVMRenderer
from rawgrad.runtime.compile import LLVMCompiler
from rawgrad.runtime.elf import load_elf
from rawgrad.engine.search import actions
from rawgrad.tensor import Tensor

from tests.compiler.codegen.kernels import last_kernel, run_item


def rand(*shape: int, seed: int) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def matmul() -> tuple[Tensor, np.ndarray]:
  a, b = rand(25, 19, seed=1), rand(19, 37, seed=2)
  return Tensor(a) @ Tensor(b), a @ b


def padded_conv() -> tuple[Tensor, np.ndarray]:
  x, w = rand(2, 3, 7, 9, seed=1), rand(5, 3, 3, 3, seed=2)
  padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
  expected = np.zeros((2, 5, 7, 9), np.float32)
  for i in range(3):
    for j in range(3):
      expected += np.einsum("nchw,oc->nohw", padded[:, :, i:i + 7, j:j + 9], w[:, :, i, j])
  return Tensor(x).conv2d(Tensor(w), padding=1), expected


def scaled_column_sums() -> tuple[Tensor, np.ndarray]:
  a, b = rand(23, 41, seed=1), rand(41, seed=2)
  return (Tensor(a) * Tensor(b)).sum(0) * 0.5, (a * b).sum(0) * 0.5


def full_sum() -> tuple[Tensor, np.ndarray]:
  a = rand(3, 1000, seed=3)
  return Tensor(a).sum() / 3, a.sum() / 3


def int_max() -> tuple[Tensor, np.ndarray]:
  a = (rand(13, 29, seed=5) * 100).astype(np.int32)
  return Tensor(a).max(1), a.max(1)


def argmax_rows() -> tuple[Tensor, np.ndarray]:
  a = rand(11, 21, seed=6)
  return Tensor(a).argmax(1), a.argmax(1).astype(np.int32)


def cumsum_rows() -> tuple[Tensor, np.ndarray]:
  a = rand(6, 19, seed=7)
  return Tensor(a).cumsum(1), np.cumsum(a, 1)


def strided_sum() -> tuple[Tensor, np.ndarray]:
  a = rand(17, 12, 9, seed=8)
  return Tensor(a).permute(2, 0, 1).sum(2) + 1, a.transpose(2, 0, 1).sum(2) + 1


def pooled() -> tuple[Tensor, np.ndarray]:
  a = rand(2, 3, 10, 14, seed=9)
  return Tensor(a).max_pool2d(2), a.reshape(2, 3, 5, 2, 7, 2).max((3, 5))


def bool_any() -> tuple[Tensor, np.ndarray]:
  a = rand(9, 33, seed=10) > 1.2
  return Tensor(a).any(1), a.any(1)


CASES: dict[str, Callable[[], tuple[Tensor, np.ndarray]]] = {
  "matmul": matmul, "padded conv": padded_conv, "scaled column sums": scaled_column_sums,
  "full sum": full_sum,
  "int max": int_max, "argmax": argmax_rows, "cumsum": cumsum_rows, "strided sum": strided_sum, "pooled": pooled,
  "bool any": bool_any}


@pytest.mark.parametrize("name", CASES)
@settings(max_examples=10, deadline=None)
@given(choices=st.lists(st.integers(0, 10_000), min_size=1, max_size=5))
def test_random_opt_sequences_match_numpy(name: str, choices: list[int]) -> None:
  tensor, expected = CASES[name]()
  item = last_kernel(tensor)
  ast, opts = item.ast, []
  for choice in choices:
    candidates = actions(ast)
    opt = candidates[choice % len(candidates)]
    try:
      ast = apply_opt(ast, opt)
    except OptError:
      continue
    opts.append(opt)
  for cores in (1, 3):
    got = run_item(item, opts, cores).reshape(expected.shape)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4, err_msg=f"{opts}, {cores} cores")


def test_the_sequences_apply_opts() -> None:
  # the strategy is not vacuous: most draws leave some opts applied
  item = last_kernel(matmul()[0])
  candidates = actions(item.ast)
  applied = 0
  for opt in candidates:
    try:
      apply_opt(item.ast, opt)
      applied += 1
    except OptError:
      continue
  assert applied > len(candidates) // 3, (applied, len(candidates))


def test_a_kernel_llvm_aborted_on_with_slp_vectorization_compiles() -> None:
  """Found by the sequences above: with these opts llvmlite 0.50's LLVM failed an assertion in its SelectionDAG
  after SLP vectorization, killing the compile worker with SIGABRT (the SLP vectorizer is off now). Compiled here past
  the disk cache, which may hold the object from an earlier run."""
  tensor, expected = matmul()
  item = last_kernel(tensor)
  opts = [Opt(OptOps.TILE, 2, 4), Opt(OptOps.UNROLL, 1, 3), Opt(OptOps.UNROLL, 0, 3), Opt(OptOps.UNROLL, 2, 2),
          Opt(OptOps.TILE, 1, 8)]
  source = LLVMRenderer().render(item.ast.arg, lower_kernel(item.ast, opts).program)
  assert load_elf(LLVMCompiler().compile(source)).functions
  for cores in (1, 3):
    np.testing.assert_allclose(run_item(item, opts, cores).reshape(expected.shape), expected, rtol=1e-4, atol=1e-4)
