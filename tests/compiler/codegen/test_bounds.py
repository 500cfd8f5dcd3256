"""compiler/codegen/bounds.py: a sum whose product a padding gate zeroes loops only over the rows that exist, and
computes what numpy does with every opt list and core count; a sum whose terms are not zero in the padding keeps
its whole loop."""
from __future__ import annotations

import numpy as np
import pytest

from rawgrad import Tensor
from rawgrad.compiler.codegen.bounds import bound_gated_loops
from rawgrad.compiler.codegen.opt.heuristic import hand_coded_opts
from rawgrad.compiler.codegen.opt.kernel import Opt, OptOps, apply_opts
from rawgrad.compiler.ir import Ops, UOp
from tests.compiler.codegen.kernels import last_kernel, run_item

rng = np.random.default_rng(5)


def _conv(x: np.ndarray, w: np.ndarray, padding: int) -> np.ndarray:
  x = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
  windows = np.lib.stride_tricks.sliding_window_view(x, w.shape[2:], axis=(2, 3))
  return np.einsum("nchwij,ocij->nohw", windows, w)


def _variable_loops(ast: UOp) -> list[UOp]:
  return [node for node in ast.toposort if node.op is Ops.RANGE and node.src[0].op is not Ops.CONST]


@pytest.mark.parametrize("padding", [1, 2])
def test_a_padded_convolution_loops_over_the_rows_inside_the_image(padding: int) -> None:
  x = rng.standard_normal((2, 3, 6, 7)).astype(np.float32)
  w = rng.standard_normal((5, 3, 3, 3)).astype(np.float32)
  item = last_kernel(Tensor(x).conv2d(Tensor(w), padding=padding))
  bounded = bound_gated_loops(apply_opts(item.ast, []))
  # one loop of the window's rows, its length an expression of the output row; no gate left on the rows
  assert len(_variable_loops(bounded)) == 1
  reduction = next(node for node in bounded.toposort if node.op is Ops.REDUCE)
  assert not any(node.op is Ops.INDEX and len(node.src) == 3 for node in reduction.toposort)
  expected = _conv(x, w, padding)
  for opts in ([], hand_coded_opts(item.ast), [Opt(OptOps.UPCAST, 3, 4), Opt(OptOps.UNROLL, 1, 2)]):
    for cores in (1, 3):
      np.testing.assert_allclose(run_item(item, opts, cores).reshape(expected.shape), expected, rtol=1e-4,
                                 atol=1e-4, err_msg=f"opts {opts}")


def test_a_sum_whose_terms_are_not_zero_in_the_padding_keeps_its_loop() -> None:
  """(padded + 1) summed over windows: the padded rows add 1 each, so every row of the window counts."""
  x = rng.standard_normal((1, 2, 5, 5)).astype(np.float32)
  padded = Tensor(x).pad(((0, 0), (0, 0), (1, 1), (0, 0))) + 1
  item = last_kernel(padded.avg_pool2d((3, 1), stride=1))
  assert not _variable_loops(bound_gated_loops(apply_opts(item.ast, [])))
  windows = np.lib.stride_tricks.sliding_window_view(np.pad(x, ((0, 0), (0, 0), (1, 1), (0, 0))) + 1, (3, 1),
                                                     axis=(2, 3))
  np.testing.assert_allclose(run_item(item, []).reshape(1, 2, 5, 5), windows.mean((-1, -2)), rtol=1e-5)


def test_an_input_gradient_loops_over_the_pixels_inside_the_output_gradient() -> None:
  """The output gradient, read channels last, is padded by a view on all sides (the kernel's size less one): each of
  the window's loops gets its bounds, whatever the opts (the heuristics' blocks take images, not pixels)."""
  x = rng.standard_normal((4, 16, 7, 6)).astype(np.float32)
  w = rng.standard_normal((16, 16, 3, 2)).astype(np.float32)
  gradient = rng.standard_normal((4, 16, 5, 5)).astype(np.float32)
  source = Tensor(x)
  item = last_kernel(source.conv2d(Tensor(w)).gradient(source, gradient=Tensor(gradient))[0])
  expected = _conv(np.pad(gradient, ((0, 0), (0, 0), (2, 2), (1, 1))), w.transpose(1, 0, 2, 3)[:, :, ::-1, ::-1], 0)
  for opts in ([], hand_coded_opts(item.ast)):
    bounded = bound_gated_loops(apply_opts(item.ast, opts))
    assert len(_variable_loops(bounded)) == 2, opts
    reduction = next(node for node in bounded.toposort if node.op is Ops.REDUCE)
    assert not any(node.op is Ops.INDEX and len(node.src) == 3 for node in reduction.toposort), opts
    for cores in (1, 3):
      np.testing.assert_allclose(run_item(item, opts, cores).reshape(expected.shape), expected, rtol=1e-4,
                                 atol=1e-4, err_msg=f"opts {opts}")
