"""python -m rawgrad.tools.compare_torch, run in-process: every op within tolerance, and the tool able to fail."""
import subprocess
import sys

import pytest

from rawgrad.tools import compare_torch
from rawgrad.tools.compare_torch import Case, Input, compare, main, run_case, table

torch = pytest.importorskip("torch")


def test_every_op_is_within_tolerance_of_torch():
  results = compare()
  failures = [r for r in results if not r.passed]
  assert len(results) > 150
  assert not failures, "\n".join(table(failures))
  assert all(r.backward is not None for r in results if r.name in ("sinh", "sort", "conv3d", "logcumsumexp"))


def test_the_tool_finds_a_wrong_op_and_a_failing_one():
  wrong = run_case(torch, Case("sin_as_cos", lambda x: x.sin(), lambda x: x.cos()))
  assert not wrong.passed and wrong.forward > 0.01
  wrong_gradient = run_case(torch, Case("detached", lambda x: x.detach() * x, lambda x: x * x))
  assert wrong_gradient.forward == 0 and wrong_gradient.backward > 0.01 and not wrong_gradient.passed
  broken = run_case(torch, Case("missing", lambda x: x.no_such_op(), lambda x: x))
  assert not broken.passed and "AttributeError" in broken.error
  shape = run_case(torch, Case("shape", lambda x: x.sum(0), lambda x: x.sum(1), (Input((2, 3)),)))
  assert not shape.passed


def test_exit_status(monkeypatch, capsys):
  assert main(["neg", "sort", "--forward-only"]) == 0
  assert "2 ops within tolerance" in capsys.readouterr().out
  bad = Case("sin_as_cos", lambda x: x.sin(), lambda x: x.cos())
  monkeypatch.setattr(compare_torch, "all_cases", lambda torch: [bad])
  assert main([]) == 1
  assert "ABOVE TOLERANCE" in capsys.readouterr().out
  with pytest.raises(ValueError, match="no comparison case"):
    compare(["no_such_case"])


def test_rawgrad_never_imports_torch():
  code = ("import sys; from rawgrad import Tensor; import rawgrad.nn, rawgrad.tools.compare_torch; "
          "Tensor([1.0, 2.0]).sinh().sort()[0].numpy(); assert 'torch' not in sys.modules, 'torch imported'")
  subprocess.run([sys.executable, "-c", code], check=True, cwd=__file__.rsplit("/tests/", 1)[0])
