"""LLVM compiles in worker processes: the same bytes as an in-process compile, errors that name what went wrong, and
no wait without a timeout."""
from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import rawgrad.runtime.compile as compile_module
import rawgrad.runtime.compile_worker as compile_worker
from rawgrad.compiler.rangeify import create_schedule
from rawgrad.compiler.codegen.lower import lower_kernel
from rawgrad.engine.search import searched_opts
from rawgrad.runtime.compile import CompileError, LLVMCompiler
from rawgrad.runtime.compile_worker import CompileWorkers, WorkerFailed, WorkerUnavailable
from rawgrad.runtime.device import Device
from rawgrad.tensor import Tensor

ADD = """
define i64 @add(i64 %a, i64 %b) {
  %s = add i64 %a, %b
  ret i64 %s
}
"""
BAD = ADD.replace("add i64 %a, %b", "add i64 %a, %nope")


@pytest.fixture
def workers() -> CompileWorkers:
  pool = CompileWorkers(2)
  yield pool
  pool.close()


def _compile(pool: CompileWorkers, compiler: LLVMCompiler, src: str) -> bytes:
  return pool.compile(compiler.triple, compiler.cpu, compiler.features, src)


def _kernel_sources() -> list[str]:
  """The LLVM IR of real kernels: a softmax (reduces, exp) and a matmul (upcast, unrolled, vectorized)."""
  rng = np.random.default_rng(0)
  x = Tensor(rng.standard_normal((9, 33)).astype(np.float32))
  w = Tensor(rng.standard_normal((33, 64)).astype(np.float32))
  device = Device["CPU"]
  asts = [item.ast for item in create_schedule([x.softmax(1).uop, (x @ w).relu().uop]).items]
  return [device.renderer.render(ast.arg, lower_kernel(ast, searched_opts(ast, "CPU"), device.target).program)
          for ast in asts]


def test_a_worker_makes_the_same_bytes_as_this_process(workers: CompileWorkers) -> None:
  compiler = LLVMCompiler()
  sources = [ADD, *_kernel_sources()]
  assert len(sources) == 5  # the softmax's three kernels, the matmul's one
  for src in sources:
    assert _compile(workers, compiler, src) == compiler.compile_here(src)
  assert workers.started == 1 and len(workers.idle) == 1  # one at a time: one worker was enough


def test_llvm_compiler_compiles_in_workers_unless_told_not_to(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setattr(compile_module, "_workers", {})
  monkeypatch.setenv("COMPILE_WORKERS", "3")
  assert compile_module.parallel_compiles() == 3
  pool = compile_module.compile_workers()
  try:
    assert LLVMCompiler().compile(ADD) == LLVMCompiler().compile_here(ADD) and pool.started == 1
  finally:
    pool.close()
  monkeypatch.setattr(compile_module, "_workers", {})
  monkeypatch.setenv("COMPILE_WORKERS", "0")
  assert compile_module.compile_workers() is None and compile_module.parallel_compiles() == 1
  assert LLVMCompiler().compile(ADD) == LLVMCompiler().compile_here(ADD)


def test_concurrent_compiles_use_one_worker_each(workers: CompileWorkers) -> None:
  compiler, sources = LLVMCompiler(), _kernel_sources()
  expected = [compiler.compile_here(src) for src in sources]
  barrier, results, pids = threading.Barrier(2), {}, set()

  def compile_all(index: int) -> None:
    barrier.wait(timeout=30)
    results[index] = [_compile(workers, compiler, src) for src in sources]
  threads = [threading.Thread(target=compile_all, args=(index,)) for index in range(2)]
  for thread in threads: thread.start()
  for thread in threads: thread.join(timeout=120)
  pids = {worker.process.pid for worker in workers.idle}
  assert results == {0: expected, 1: expected} and workers.started == 2 and len(pids) == 2


def test_bad_ir_raises_the_same_error_as_in_this_process_and_the_worker_goes_on(workers: CompileWorkers) -> None:
  compiler = LLVMCompiler()
  with pytest.raises(CompileError) as here:
    compiler.compile_here(BAD)
  with pytest.raises(CompileError) as there:
    _compile(workers, compiler, BAD)
  assert not isinstance(there.value, WorkerFailed) and str(there.value) == str(here.value)
  assert "use of undefined value '%nope'" in str(there.value) and "add i64 %a, %nope" in str(there.value)
  pid = workers.idle[0].process.pid
  assert _compile(workers, compiler, ADD) == compiler.compile_here(ADD) and workers.idle[0].process.pid == pid


def test_a_dead_worker_raises_an_error_naming_it_and_the_next_compile_starts_another(workers: CompileWorkers) -> None:
  compiler = LLVMCompiler()
  _compile(workers, compiler, ADD)
  dead = workers.idle[0].process
  os.kill(dead.pid, signal.SIGKILL)
  dead.wait(timeout=10)
  with pytest.raises(WorkerFailed, match=rf"compile worker \(pid {dead.pid}\) died while compiling a kernel: "
                                         r"killed by SIGKILL"):
    _compile(workers, compiler, ADD)
  assert workers.started == 0 and workers.idle == []
  assert _compile(workers, compiler, ADD) == compiler.compile_here(ADD)
  assert workers.started == 1 and workers.idle[0].process.pid != dead.pid


def test_a_worker_that_stops_answering_is_killed_after_the_timeout(workers: CompileWorkers,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
  compiler = LLVMCompiler()
  _compile(workers, compiler, ADD)
  stuck = workers.idle[0].process
  os.kill(stuck.pid, signal.SIGSTOP)
  monkeypatch.setattr(compile_worker, "COMPILE_TIMEOUT_S", 0.5)
  start = time.monotonic()
  with pytest.raises(WorkerFailed, match=rf"compile worker \(pid {stuck.pid}\) did not compile a kernel in 0.5 s; "
                                         "it was killed"):
    _compile(workers, compiler, ADD)
  assert time.monotonic() - start < 10 and stuck.wait(timeout=10) == -signal.SIGKILL
  assert workers.started == 0
  monkeypatch.undo()
  assert _compile(workers, compiler, ADD) == compiler.compile_here(ADD)


def test_a_worker_that_cannot_start_is_reported(workers: CompileWorkers, monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setattr(sys, "executable", "/nonexistent/python")
  with pytest.raises(WorkerUnavailable, match="cannot start a compile worker with /nonexistent/python"):
    _compile(workers, LLVMCompiler(), ADD)
  assert workers.started == 0


def test_a_worker_with_another_llvmlite_is_refused(workers: CompileWorkers, monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setattr(compile_worker.llvmlite, "__version__", "0.0.1")  # what this process expects of a worker
  with pytest.raises(WorkerUnavailable, match="not the versions"):
    _compile(workers, LLVMCompiler(), ADD)
  assert workers.started == 0


def test_without_workers_llvm_compiler_compiles_here_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
  pool = CompileWorkers(2)
  monkeypatch.setattr(compile_module, "_workers", {os.getpid(): pool})
  monkeypatch.setattr(sys, "executable", "/nonexistent/python")
  with pytest.warns(RuntimeWarning, match="compiling in this process, one kernel at a time: cannot start"):
    obj = LLVMCompiler().compile(ADD)
  assert obj == LLVMCompiler().compile_here(ADD) and compile_module.compile_workers() is None
  assert compile_module.parallel_compiles() == 1


def test_closing_ends_the_workers(workers: CompileWorkers) -> None:
  threads = [threading.Thread(target=_compile, args=(workers, LLVMCompiler(), ADD)) for _ in range(2)]
  for thread in threads: thread.start()
  for thread in threads: thread.join(timeout=60)
  processes = [worker.process for worker in workers.idle]
  workers.close()
  assert [process.returncode for process in processes] == [0] * len(processes) and workers.started == 0


def test_workers_end_with_the_process_that_started_them() -> None:
  script = ("import os, rawgrad.runtime.compile as c; c.LLVMCompiler().compile('define void @f() { ret void }');"
            "print(*(w.process.pid for w in c.compile_workers().idle))")
  done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                        env=dict(os.environ, COMPILE_WORKERS="2"))
  assert done.returncode == 0, done.stderr
  (pid,) = map(int, done.stdout.split())
  deadline = time.monotonic() + 10
  while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline: time.sleep(0.05)
  assert not os.path.exists(f"/proc/{pid}")


def _compile_in_child(src: str) -> tuple[bytes, int]:
  obj = LLVMCompiler().compile(src)
  return obj, compile_module.compile_workers().idle[0].process.pid


def test_a_forked_child_starts_its_own_workers(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setattr(compile_module, "_workers", {})
  monkeypatch.setenv("COMPILE_WORKERS", "1")
  obj = LLVMCompiler().compile(ADD)
  parent_pool = compile_module.compile_workers()
  try:
    parent_pid = parent_pool.idle[0].process.pid
    with multiprocessing.get_context("fork").Pool(1) as pool:
      child_obj, child_worker = pool.apply(_compile_in_child, (ADD,))
    assert child_obj == obj and child_worker != parent_pid
    assert LLVMCompiler().compile(ADD) == obj and parent_pool.idle[0].process.pid == parent_pid
  finally:
    parent_pool.close()
