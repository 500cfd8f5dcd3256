"""Gate-aware index simplification: a convolution's input gradient by the autograd rules (convolutions now name a
transposed convolution instead; the rules' form is what other sliding windows still get) reads padded, strided views
whose indices are `x % c` under a gate `x % c < b`; under the gate they are affine, so the loads vectorize."""
from __future__ import annotations

import numpy as np

from rawgrad.compiler.codegen.gates import simplify_gated_indices
from rawgrad.compiler.codegen.opt.heuristic import accesses
from rawgrad.compiler.codegen.opt.kernel import all_ranges, stride
from rawgrad.compiler.gradient import set_custom_gradient
from rawgrad.compiler.ir import Ops
from rawgrad.compiler.rangeify import create_schedule
from rawgrad.compiler.symbolic import evaluate
from rawgrad.tensor import Tensor

from tests.compiler.codegen.kernels import last_kernel, run_item


def rand(*shape: int, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def input_gradient(n: int, cin: int, cout: int, size: int, k: int) -> tuple[Tensor, np.ndarray, np.ndarray]:
  x, w = rand(n, cin, size, size, seed=1), rand(cout, cin, k, k, seed=2)
  g = rand(n, cout, size - k + 1, size - k + 1, seed=3)
  tx, tw = Tensor(x), Tensor(w)
  y = tx.conv2d(tw)
  set_custom_gradient(y.uop, None)  # the rules' gradient, not the transposed convolution
  grad_x, = y.gradient(tx, gradient=Tensor(g))
  padded = np.pad(g, ((0, 0), (0, 0), (k - 1, k - 1), (k - 1, k - 1)))
  flipped = w[:, :, ::-1, ::-1].transpose(1, 0, 2, 3)
  expected = np.zeros_like(x)
  for i in range(k):
    for j in range(k):
      expected += np.einsum("nohw,co->nchw", padded[:, :, i:i + size, j:j + size], flipped[:, :, i, j])
  return grad_x, expected, x


def test_convolution_input_gradient_indices_become_affine() -> None:
  grad_x, _, _ = input_gradient(2, 3, 4, 9, 3)
  ast = create_schedule([grad_x.uop]).items[-1].ast
  assert any(node.op is Ops.MOD for node in ast.toposort), "the kernel starts with modulo indices"
  simplified = simplify_gated_indices(ast)
  for access in accesses(simplified):
    assert not any(node.op in (Ops.MOD, Ops.IDIV) for node in access.index.toposort), access.index.render()
    assert all(stride(access.index, r) is not None for r in all_ranges(simplified))


def test_simplified_indices_agree_wherever_the_gate_holds() -> None:
  grad_x, _, _ = input_gradient(1, 2, 2, 7, 3)
  ast = create_schedule([grad_x.uop]).items[-1].ast
  simplified = simplify_gated_indices(ast)
  before = [n for n in ast.toposort if n.op is Ops.INDEX and len(n.src) == 3]
  after = [n for n in simplified.toposort if n.op is Ops.INDEX and len(n.src) == 3]
  ranges = all_ranges(ast)
  rng = np.random.default_rng(0)
  checked = 0
  for _ in range(300):
    values = {r: int(rng.integers(0, r.src[0].arg)) for r in ranges}
    for old, new in zip(before, after):
      assert evaluate(old.src[2], values) == evaluate(new.src[2], values)
      if evaluate(old.src[2], values):
        assert evaluate(old.src[1], values) == evaluate(new.src[1], values)
        checked += 1
  assert checked > 50


def test_convolution_input_gradient_values() -> None:
  grad_x, expected, x = input_gradient(2, 3, 5, 11, 3)
  item = last_kernel(grad_x)
  for opts in (None, []):
    got = run_item(item, opts, cores=2).reshape(x.shape)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_gates_without_modulo_are_left_alone() -> None:
  ast = create_schedule([(Tensor(rand(4, 6)).pad(((1, 1), (2, 0))) * 2).uop]).items[-1].ast
  assert simplify_gated_indices(ast) is ast  # gates without modulo: nothing to resolve
