"""Running a schedule: kernels are lowered on the calling thread and compiled on a second one, then run in order."""
from __future__ import annotations

import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import rawgrad.engine.realize as realize
from rawgrad.compiler.ir import UOp
from rawgrad.compiler.rangeify import create_schedule
from rawgrad.helpers import LRUCache
from rawgrad.runtime.compile import CompileError
from rawgrad.tensor import Tensor


def _softmax_rows(x: np.ndarray) -> np.ndarray:
  e = np.exp(x - x.max(1, keepdims=True))
  return e / e.sum(1, keepdims=True)


def _recording_compiles(monkeypatch: pytest.MonkeyPatch, fail_at: int | None = None) -> list[str]:
  """Record the thread of every compile; the compile numbered `fail_at` raises CompileError."""
  threads: list[str] = []
  compile_cached = realize.compile_cached

  def recording(compiler: object, source: str, *args: object) -> bytes:
    threads.append(threading.current_thread().name)
    if len(threads) - 1 == fail_at: raise CompileError("LLVM said no")
    return compile_cached(compiler, source, *args)
  monkeypatch.setattr(realize, "compile_cached", recording)
  return threads


def test_kernels_start_compiling_while_the_schedule_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
  import rawgrad.compiler.rangeify as rangeify
  events: list[str] = []
  build, lower_kernel = rangeify.KernelBuilder.build, realize.lower_kernel
  def recording_build(builder: rangeify.KernelBuilder) -> UOp:
    events.append("build")
    return build(builder)
  def recording_lower(*args: object) -> object:
    events.append("lower")
    return lower_kernel(*args)
  monkeypatch.setattr(rangeify.KernelBuilder, "build", recording_build)
  monkeypatch.setattr(realize, "lower_kernel", recording_lower)
  x = np.random.default_rng(2).standard_normal((7, 3)).astype(np.float32)
  softmax = Tensor(x).softmax(1)
  softmax.realize()
  assert events == ["build", "lower"] * 3
  np.testing.assert_allclose(softmax.numpy(), _softmax_rows(x), rtol=1e-5)


def test_kernels_compile_on_a_second_thread_and_run_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
  threads = _recording_compiles(monkeypatch)
  x = np.random.default_rng(0).standard_normal((5, 13)).astype(np.float32)
  interval = sys.getswitchinterval()
  softmax = Tensor(x).softmax(1)
  softmax.realize()
  assert len(threads) == 3 and all(name.startswith("rawgrad-compile") for name in threads), threads
  assert sys.getswitchinterval() == interval
  np.testing.assert_allclose(softmax.numpy(), _softmax_rows(x), rtol=1e-5)


def test_the_same_kernel_twice_is_compiled_once(monkeypatch: pytest.MonkeyPatch) -> None:
  threads = _recording_compiles(monkeypatch)
  ast = create_schedule([(Tensor(np.arange(11, dtype=np.float32)) * 3).uop]).items[0].ast
  with realize.KernelCompiler() as compiler:
    compiler.start("CPU", ast)
    compiler.start("CPU", ast)
    first, second = compiler.runner("CPU", ast), compiler.runner("CPU", ast)
  assert first is second and len(threads) == 1
  assert realize.get_runner("CPU", ast) is first and len(threads) == 1


def test_a_cold_realize_compiles_each_kernel_once_and_writes_the_cache_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
  import rawgrad.runtime.compile as compile_module
  monkeypatch.setenv("RAWGRAD_CACHE_DIR", str(tmp_path))
  monkeypatch.delenv("DISABLE_COMPILER_CACHE", raising=False)
  monkeypatch.setattr(realize, "_runners", LRUCache(realize.RUNNER_CACHE_SIZE))  # nothing compiled in this process
  writes: list[int] = []
  put = compile_module._cache_put
  def counting_put(path: Path, objects: dict[str, bytes]) -> None:
    writes.append(len(objects))
    put(path, objects)
  monkeypatch.setattr(compile_module, "_cache_put", counting_put)
  threads = _recording_compiles(monkeypatch)
  x = np.random.default_rng(3).standard_normal((6, 11)).astype(np.float32)
  softmax = Tensor(x).softmax(1)
  softmax.realize()
  # three kernels (max, sum of exps, the division), each compiled once, all written in one transaction
  assert len(threads) == 3 and writes == [3]
  np.testing.assert_allclose(softmax.numpy(), _softmax_rows(x), rtol=1e-5)
  writes.clear()
  realize._runners.entries.clear()  # a later process: every kernel from the disk cache, nothing written
  again = Tensor(x).softmax(1)
  again.realize()
  assert len(threads) == 6 and writes == []
  np.testing.assert_allclose(again.numpy(), _softmax_rows(x), rtol=1e-5)


def test_a_compile_error_reaches_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
  _recording_compiles(monkeypatch, fail_at=1)
  interval = sys.getswitchinterval()
  x = np.random.default_rng(1).standard_normal((3, 17)).astype(np.float32)
  with pytest.raises(CompileError, match="LLVM said no"): Tensor(x).softmax(1).realize()
  assert sys.getswitchinterval() == interval
  monkeypatch.undo()
  np.testing.assert_allclose(Tensor(x).softmax(1).numpy(), _softmax_rows(x), rtol=1e-5)
