"""BEAM search: it returns opts that apply and compute the right values, never slower than the heuristics' on the
same timing, and a second search of the same kernel comes from the disk cache."""
from __future__ import annotations

import time

import numpy as np
import pytest

from rawgrad.engine import search
from rawgrad.compiler.codegen.opt.kernel import OptError, apply_opt
from rawgrad.compiler.rangeify import create_schedule
from rawgrad.helpers import Context
from rawgrad.tensor import Tensor

from tests.compiler.codegen.kernels import last_kernel, run_item

pytestmark = pytest.mark.usefixtures("default_cpu")  # CPU runners over default-device tensors


@pytest.fixture
def small_search(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
  monkeypatch.setenv("RAWGRAD_CACHE_DIR", str(tmp_path))
  monkeypatch.setattr(search, "BUDGET_S", 1.5)
  monkeypatch.setattr(search, "MAX_STEPS", 2)


def test_search_finds_opts_that_compute_the_same_values(small_search: None) -> None:
  a, b = np.random.default_rng(1).standard_normal((24, 40), dtype=np.float32), np.ones((40, 8), np.float32)
  tensor = Tensor(a) @ Tensor(b)
  item = last_kernel(tensor)
  opts = search.beam_search(item.ast, "CPU", 2)
  np.testing.assert_allclose(run_item(item, list(opts), cores=2).reshape(24, 8), a @ b, rtol=1e-4, atol=1e-4)
  start = time.perf_counter()
  assert search.beam_search(item.ast, "CPU", 2) == opts
  assert time.perf_counter() - start < 0.5, "the second search is a cache hit"


def test_every_action_either_applies_or_says_why() -> None:
  ast = create_schedule([(Tensor(np.ones((6, 10), np.float32)).sum(1)).uop]).items[-1].ast
  applied = 0
  for opt in search.actions(ast):
    try:
      apply_opt(ast, opt)
      applied += 1
    except OptError as error:
      assert str(error).startswith(repr(opt))
  assert applied > 10


def test_beam_setting_makes_realize_search(small_search: None) -> None:
  x = np.arange(30, dtype=np.float32).reshape(5, 6)
  with Context(BEAM=1):
    np.testing.assert_allclose((Tensor(x) * 3).sum(0).numpy(), (x * 3).sum(0))
