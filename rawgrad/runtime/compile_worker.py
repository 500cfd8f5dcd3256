"""LLVM IR -> a relocatable object, in this process or in worker processes, by the same code.

llvmlite holds a process-wide lock while it compiles, so one process compiles one kernel at a time, and between its
many short calls it needs the GIL back from the thread that lowers the next kernels. A worker process has neither
limit: the lowering thread and one compile per core run at once. A worker is this file run as a script by the same
interpreter (`python -I -S`, llvmlite's folder put on its path): it imports only llvmlite and the standard library, so
it starts in ~50 ms and never runs the user's __main__ (as multiprocessing's spawn would). It answers compile requests,
length-prefixed frames on its stdin, with frames on its stdout; it exits when its stdin closes, so it never outlives
the process that started it. Its objects are byte for byte those of an in-process compile: the same library builds
the same target machine and runs the same passes (a test compares them).

Every wait for a worker has a timeout; a worker that dies or does not answer in time raises CompileError naming it,
and the next compile starts a fresh one.
"""
from __future__ import annotations

import functools
import json
import os
import select
import signal
import struct
import subprocess
import sys
import threading
import time

import llvmlite
import llvmlite.binding as llvm

WORKER_START_TIMEOUT_S = 60.0   # a fresh interpreter importing llvmlite, on a machine busy with other work
COMPILE_TIMEOUT_S = 600.0       # far beyond any kernel's compile; a worker this slow is stuck and is killed
_FRAME_LENGTH = struct.Struct("<Q")
_START = "import runpy, sys; sys.path.insert(0, sys.argv[1]); runpy.run_path(sys.argv[2], run_name='__main__')"


class CompileError(Exception):
  """LLVM rejected the IR; the message has LLVM's error and the IR with line numbers."""


class WorkerFailed(CompileError):
  """A worker died or stopped answering while it compiled; the kernel's IR may be fine."""


class WorkerUnavailable(Exception):
  """No worker process could be started here (or it runs another llvmlite): compile in this process instead."""


@functools.cache
def init_llvm() -> None:
  # every target, not just the native one, so objects for other machines can be built (and their loading tested)
  llvm.initialize_all_targets()
  llvm.initialize_all_asmprinters()


def numbered(src: str) -> str:
  return "\n".join(f"{i:4d} | {line}" for i, line in enumerate(src.splitlines(), 1))


def llvm_version() -> str:
  return ".".join(map(str, llvm.llvm_version_info))


def cpu_target_machine(triple: str, cpu: str, features: str) -> llvm.TargetMachine:
  """The target machine objects are made for (see LLVMCompiler for why PIC and the small code model)."""
  init_llvm()
  return llvm.Target.from_triple(triple).create_target_machine(cpu=cpu, features=features, opt=3, reloc="pic",
                                                                codemodel="small")


def optimized_module(machine: llvm.TargetMachine, src: str) -> llvm.ModuleRef:
  """The module of LLVM IR `src`, verified and optimized at O3 for `machine`, without the SLP vectorizer: our kernels
  are vectors where they should be, and packing their straight-line math took a sixth to a third of LLVM's time on
  MNIST's step (3.4 -> 2.9 s of a Zen 4 core) with every kernel in tools/bench as fast (and LLVM 22's SelectionDAG
  failed an assertion after it on some kernels)."""
  try:
    module = llvm.parse_assembly(src)
    module.verify()
  except RuntimeError as e:
    raise CompileError(f"{e}\nin the IR:\n{numbered(src)}") from None
  module.triple, module.data_layout = machine.triple, str(machine.target_data)
  tuning = llvm.create_pipeline_tuning_options(speed_level=3)
  tuning.slp_vectorization = False
  pass_builder = llvm.create_pass_builder(machine, tuning)
  pass_builder.getModulePassManager().run(module, pass_builder)
  return module


def compile_object(machine: llvm.TargetMachine, src: str) -> bytes:
  return machine.emit_object(optimized_module(machine, src))


# *** frames on a pipe

def _write_all(fd: int, data: bytes, deadline: float | None) -> None:
  view = memoryview(data)
  while view:
    if deadline is not None: _wait_ready(fd, select.POLLOUT, deadline)
    try:
      view = view[os.write(fd, view):]
    except BlockingIOError:
      continue


def _read_exact(fd: int, count: int, deadline: float | None) -> bytes | None:
  """count bytes from fd; None at end of file (the other side is gone)."""
  data = bytearray()
  while len(data) < count:
    if deadline is not None: _wait_ready(fd, select.POLLIN, deadline)
    try:
      chunk = os.read(fd, min(count - len(data), 1 << 20))
    except BlockingIOError:
      continue
    if not chunk: return None
    data += chunk
  return bytes(data)


def _wait_ready(fd: int, event: int, deadline: float) -> None:
  poller = select.poll()
  poller.register(fd, event)
  while not poller.poll(max(0, int((deadline - time.monotonic()) * 1000)) + 1):
    if time.monotonic() >= deadline: raise TimeoutError
  # POLLHUP/POLLERR come back as ready too: the read or write that follows sees the end


def _send(fd: int, payload: bytes, deadline: float | None = None) -> None:
  _write_all(fd, _FRAME_LENGTH.pack(len(payload)) + payload, deadline)


def _receive(fd: int, deadline: float | None = None) -> bytes | None:
  if (header := _read_exact(fd, _FRAME_LENGTH.size, deadline)) is None: return None
  return _read_exact(fd, _FRAME_LENGTH.unpack(header)[0], deadline)


# *** the parent's side

class CompileWorker:
  """One worker process; one request at a time."""

  def __init__(self) -> None:
    llvmlite_dir = os.path.dirname(os.path.dirname(os.path.abspath(llvmlite.__file__)))
    # isolated, without site: only this file and the llvmlite this process imported, whatever the environment says
    self.process = subprocess.Popen([sys.executable, "-I", "-S", "-c", _START, llvmlite_dir, os.path.abspath(__file__)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    assert self.process.stdin is not None and self.process.stdout is not None
    self.requests, self.replies = self.process.stdin.fileno(), self.process.stdout.fileno()
    os.set_blocking(self.requests, False)
    os.set_blocking(self.replies, False)
    self.greeted = False

  def __repr__(self) -> str:
    return f"compile worker (pid {self.process.pid})"

  def compile(self, triple: str, cpu: str, features: str, src: str, name: str = "") -> bytes:
    if not self.greeted: self._greeting()
    header = json.dumps({"triple": triple, "cpu": cpu, "features": features}).encode()
    deadline = time.monotonic() + COMPILE_TIMEOUT_S
    try:
      _send(self.requests, header, deadline)
      _send(self.requests, src.encode(), deadline)
      reply = _receive(self.replies, deadline)
    except TimeoutError:
      self.close(kill=True)
      raise WorkerFailed(f"{self} did not compile {name or 'a kernel'} in {COMPILE_TIMEOUT_S:g} s; it was killed") \
        from None
    except BrokenPipeError:
      reply = None
    if reply is None:
      raise WorkerFailed(f"{self} died while compiling {name or 'a kernel'}: {self._ended()}")
    if reply[:1] == b"O": return reply[1:]
    raise CompileError(reply[1:].decode())

  def _greeting(self) -> None:
    try:
      hello = _receive(self.replies, time.monotonic() + WORKER_START_TIMEOUT_S)
    except TimeoutError:
      self.close(kill=True)
      raise WorkerUnavailable(f"{self} did not start in {WORKER_START_TIMEOUT_S:g} s") from None
    versions = {"llvmlite": llvmlite.__version__, "llvm": llvm_version()}
    if hello is None or json.loads(hello) != versions:
      self.close(kill=True)
      raise WorkerUnavailable(f"{self} answered {hello!r} at start, not the versions {versions}: {self._ended()}")
    self.greeted = True

  def _ended(self) -> str:
    try:
      code = self.process.wait(timeout=5)
    except subprocess.TimeoutExpired:
      self.close(kill=True)
      return "it stopped answering and was killed"
    if code < 0: return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"

  def close(self, kill: bool = False) -> None:
    """Closing its stdin ends the worker; a worker that does not end in a few seconds (or `kill`) is killed."""
    if kill: self.process.kill()
    for pipe in (self.process.stdin, self.process.stdout):
      if pipe is not None: pipe.close()
    try:
      self.process.wait(timeout=5)
    except subprocess.TimeoutExpired:
      self.process.kill()
      self.process.wait(timeout=5)


class CompileWorkers:
  """Up to `size` workers, started as compiles need them (a compile that finds none idle starts one)."""

  def __init__(self, size: int) -> None:
    self.size, self.pid = size, os.getpid()
    self.idle: list[CompileWorker] = []
    self.started = 0  # workers alive: idle or compiling
    self.available = threading.Condition()

  def compile(self, triple: str, cpu: str, features: str, src: str, name: str = "") -> bytes:
    worker = self._take()
    try:
      obj = worker.compile(triple, cpu, features, src, name)
    except WorkerFailed:
      self._lost(worker)
      raise
    except CompileError:  # LLVM refused the IR; the worker is fine
      self._give_back(worker)
      raise
    except BaseException:
      worker.close(kill=True)
      self._lost(worker)
      raise
    self._give_back(worker)
    return obj

  def _take(self) -> CompileWorker:
    deadline = time.monotonic() + COMPILE_TIMEOUT_S  # every busy worker finishes (or is killed) by then
    with self.available:
      while not self.idle and self.started >= self.size:
        if not self.available.wait(max(0.0, deadline - time.monotonic())):
          raise CompileError(f"no compile worker became free in {COMPILE_TIMEOUT_S:g} s")
      if self.idle: return self.idle.pop()
      self.started += 1
    try:
      return CompileWorker()
    except OSError as error:
      self._lost(None)
      raise WorkerUnavailable(f"cannot start a compile worker with {sys.executable}: {error}") from None

  def _give_back(self, worker: CompileWorker) -> None:
    with self.available:
      self.idle.append(worker)
      self.available.notify()

  def _lost(self, worker: CompileWorker | None) -> None:
    if worker is not None and worker.process.poll() is None: worker.close(kill=True)
    with self.available:
      self.started -= 1
      self.available.notify()

  def close(self) -> None:
    with self.available:
      idle, self.idle = self.idle, []
      self.started -= len(idle)
    for worker in idle: worker.close()

  def abandon(self) -> None:
    """In a forked child: close its copies of the pipes, leaving the parent's workers to the parent."""
    for worker in self.idle:
      for pipe in (worker.process.stdin, worker.process.stdout):
        if pipe is not None: pipe.close()
    self.idle, self.started = [], 0


# *** the worker's side

def serve() -> None:
  """Answer compile requests on stdin until it closes."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the parent, which ends us by closing our stdin
  requests, replies = 0, os.dup(1)
  os.dup2(2, 1)  # whatever LLVM or Python prints goes to stderr, never into a reply
  init_llvm()
  _send(replies, json.dumps({"llvmlite": llvmlite.__version__, "llvm": llvm_version()}).encode())
  machines: dict[tuple[str, str, str], llvm.TargetMachine] = {}
  while (header := _receive(requests)) is not None and (src := _receive(requests)) is not None:
    spec = json.loads(header)
    key = spec["triple"], spec["cpu"], spec["features"]
    try:
      if key not in machines: machines[key] = cpu_target_machine(*key)
      reply = b"O" + compile_object(machines[key], src.decode())
    except CompileError as error:
      reply = b"E" + str(error).encode()
    except Exception as error:  # an llvmlite failure outside LLVM's diagnostics: the parent shows it, we go on
      reply = b"E" + f"{type(error).__name__} in the compile worker: {error}".encode()
    _send(replies, reply)


if __name__ == "__main__":
  serve()
