"""Compilers: LLVM IR text -> a relocatable ELF object (CPU, AMD GPU code objects) or PTX -> cubin (NVIDIA, through
ptxas); and an on-disk cache of compiled objects shared by processes, keyed by each compiler's target."""
from __future__ import annotations

import atexit
import contextlib
import functools
import glob
import hashlib
import os
import shutil
import sqlite3
import struct
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Protocol

import llvmlite
import llvmlite.binding as llvm

from rawgrad.compiler.program_text import program_from_comments
from rawgrad.compiler.target import Target, host_target
from rawgrad.helpers import usable_cores
from rawgrad.runtime.compile_worker import (CompileError, CompileWorkers, WorkerUnavailable, compile_object,
                                           cpu_target_machine, init_llvm, llvm_version, numbered, optimized_module)

class Compiler(Protocol):
  cache_key: str  # everything besides the source that decides the output

  def compile(self, src: str) -> bytes: ...


class LLVMCompiler:
  """Compiles LLVM IR text to a relocatable ELF object at -O3 for a target (the host CPU by default; a triple string
  names a foreign CPU, compiled for its baseline). Compiles run in worker processes (see compile_worker.py) where
  they can, else in this process."""

  def __init__(self, target: Target | str | None = None) -> None:
    init_llvm()
    if target is None or isinstance(target, str) and target == llvm.get_process_triple(): target = host_target()
    if isinstance(target, str): target = Target(kind="cpu", arch=target.split("-")[0], triple=target, cpu="generic")
    self.target = target
    self.triple = target.triple
    # the host's exact CPU and features so AVX2/AVX-512/NEON get used (or the ones CPU_ISA forces)
    self.cpu, self.features = target.cpu, target.features
    # PIC with the small code model: our loader puts everything in one image far smaller than 2GB, so references
    # inside it are PC-relative 32-bit fields (PC32/PLT32, ADRP+ADD) that work wherever mmap puts the image. Only
    # external symbols can be far away; calls to them are PLT32/CALL26 that the loader sends through its own stubs,
    # data through GOT slots. 'static' would emit absolute R_X86_64_32S, which need an image in the low 2GB, and
    # 'large' would turn every address into a 64-bit immediate.
    self._tm = cpu_target_machine(self.triple, self.cpu, self.features)
    self.cache_key = "|".join(("LLVMCompiler(O3,noslp,pic,small)", f"llvmlite {llvmlite.__version__}",
                               f"LLVM {llvm_version()}", self.triple, self.cpu, self.features))

  def compile(self, src: str) -> bytes:
    if (workers := compile_workers()) is not None:
      try:
        return workers.compile(self.triple, self.cpu, self.features, src)
      except WorkerUnavailable as error:
        _stop_workers(error)
    return self.compile_here(src)

  def compile_here(self, src: str) -> bytes:
    """The object compiled in this process (what a worker makes, byte for byte)."""
    return compile_object(self._tm, src)

  def assembly(self, src: str) -> str:
    """The optimized machine code as assembly text, to see what LLVM made of src; LLVM's comments mark the loops
    (`Inner Loop Header: Depth=3`) and the registers it spilled (`32-byte Spill`, `32-byte Reload`)."""
    self._tm.set_asm_verbosity(True)
    return self._tm.emit_assembly(optimized_module(self._tm, src))


# *** worker processes

_workers: dict[int, CompileWorkers | None] = {}  # by process id: a forked child starts its own
_workers_lock = threading.Lock()


def worker_count() -> int:
  """COMPILE_WORKERS, read when a process's first compile starts them: how many LLVM compiles run at once in
  worker processes; 0 compiles in this process, one at a time. By default one per core this process may use."""
  if (count := os.environ.get("COMPILE_WORKERS", "")) != "": return int(count)
  return usable_cores()


def compile_workers() -> CompileWorkers | None:
  """This process's compile workers, None where compiles run in this process."""
  if (workers := _workers.get(pid := os.getpid(), False)) is not False: return workers
  with _workers_lock:
    if pid not in _workers:
      _workers[pid] = CompileWorkers(count) if (count := worker_count()) > 0 else None
      if _workers[pid] is not None: atexit.register(_workers[pid].close)
  return _workers[pid]


def parallel_compiles() -> int:
  """How many compiles are worth running at once: one per worker, or one (llvmlite's lock) in this process."""
  return workers.size if (workers := compile_workers()) is not None else 1


def _stop_workers(error: WorkerUnavailable) -> None:
  with _workers_lock:
    if (workers := _workers.get(os.getpid())) is None: return
    _workers[os.getpid()] = None
  warnings.warn(f"compiling in this process, one kernel at a time: {error}", RuntimeWarning, stacklevel=3)
  workers.close()


def _forget_parent_workers() -> None:
  # a forked child holds copies of its parent's pipes: close them (the parent's workers must still see the parent's
  # own close as the end of their input) and start its own workers when it compiles
  for workers in _workers.values():
    if workers is not None: workers.abandon()
  _workers.clear()


os.register_at_fork(after_in_child=_forget_parent_workers)


# *** NVIDIA: PTX and cubins

class PTXCompiler:
  """LLVM IR -> PTX (llvmlite's NVPTX backend) -> cubin (ptxas, from the CUDA toolkit or the nvidia-cuda-nvcc wheel).
  With embed_program, the cubin is followed by the kernel's linear program (see append_program): the emulated GPU
  runs that, since it cannot run the cubin's machine code."""

  def __init__(self, target: Target, embed_program: bool = False) -> None:
    init_llvm()
    self.target, self.embed_program = target, embed_program
    machine = llvm.Target.from_triple(target.triple)
    self._tm = machine.create_target_machine(cpu=target.cpu, features=target.features, opt=3)
    # a different assembler makes a different cubin
    self.cache_key = "|".join(("PTXCompiler(O3)", f"llvmlite {llvmlite.__version__}", f"LLVM {llvm_version()}",
                               target.triple, target.cpu, target.features, f"embed={embed_program}", _ptxas_version()))

  def ptx(self, src: str) -> str:
    """The PTX assembly of an LLVM IR module."""
    return self._tm.emit_assembly(optimized_module(self._tm, src))

  def assembly(self, src: str) -> str:
    """The device assembly (PTX) of a module."""
    return self.ptx(src)

  def compile(self, src: str) -> bytes:
    cubin = assemble_ptx(self.ptx(src), self.target.cpu)
    return append_program(cubin, embedded_program_text(src)) if self.embed_program else cubin



@functools.cache
def _ptxas_version() -> str:
  try:
    return subprocess.run([find_ptxas(), "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
  except (CompileError, OSError, IndexError):
    return "no ptxas"


def find_ptxas() -> str:
  """ptxas: $PTXAS, the nvidia-cuda-nvcc wheel, PATH, or the CUDA toolkit's usual place."""
  if (path := os.environ.get("PTXAS")): return path
  for entry in _python_paths():
    for found in sorted(glob.glob(os.path.join(entry, "nvidia", "cu*", "bin", "ptxas")) +
                        glob.glob(os.path.join(entry, "nvidia", "cuda_nvcc", "bin", "ptxas")), reverse=True):
      if os.access(found, os.X_OK): return found
  if (path := shutil.which("ptxas")): return path
  for path in ("/usr/local/cuda/bin/ptxas", "/opt/cuda/bin/ptxas"):
    if os.access(path, os.X_OK): return path
  raise CompileError("ptxas was not found: NVIDIA kernels are assembled by it. Install it with "
                     "`pip install nvidia-cuda-nvcc` (or the CUDA toolkit), or set PTXAS to its path")


def _python_paths() -> list[str]:
  import sys
  return [entry for entry in sys.path if entry and os.path.isdir(entry)]


def assemble_ptx(ptx: str, arch: str) -> bytes:
  """A cubin for `arch` (e.g. sm_90) from PTX text; CompileError with ptxas's message and the PTX when it refuses."""
  ptxas = find_ptxas()
  with tempfile.TemporaryDirectory(prefix="rawgrad-ptx-") as folder:
    source, output = os.path.join(folder, "kernel.ptx"), os.path.join(folder, "kernel.cubin")
    with open(source, "w") as file: file.write(ptx)
    result = subprocess.run([ptxas, f"-arch={arch}", "-O3", source, "-o", output], capture_output=True, text=True)
    if result.returncode != 0:
      raise CompileError(f"ptxas ({ptxas}) rejected the PTX: {result.stderr.strip()}\n{numbered(ptx)}")
    with open(output, "rb") as file: return file.read()


# *** a kernel's linear program carried with its machine code, for the emulated GPUs

PROGRAM_TRAILER = b"RGPROGv1"


def embedded_program_text(src: str) -> str:
  if (text := program_from_comments(src)) is None:
    raise CompileError("the source carries no program to embed (render it with embed_program=True)")
  return text


def append_program(binary: bytes, program_text: str) -> bytes:
  """The binary followed by the program, its length and a magic word: loaders of the real binary ignore the tail."""
  payload = program_text.encode()
  return binary + payload + struct.pack("<Q", len(payload)) + PROGRAM_TRAILER


def split_embedded_program(lib: bytes) -> tuple[bytes, str | None]:
  """(the binary, the program text) of a lib made by append_program; (lib, None) for a plain binary."""
  if not lib.endswith(PROGRAM_TRAILER): return lib, None
  (length,) = struct.unpack("<Q", lib[-len(PROGRAM_TRAILER) - 8:-len(PROGRAM_TRAILER)])
  end = len(lib) - len(PROGRAM_TRAILER) - 8
  return lib[:end - length], lib[end - length:end].decode()


# *** disk cache

def cache_path() -> Path | None:
  """Where compiled objects are cached, read from the environment on every call; None when caching is off."""
  if os.environ.get("DISABLE_COMPILER_CACHE", "0") not in ("", "0"):
    return None
  if root := os.environ.get("RAWGRAD_CACHE_DIR"):
    return Path(root) / "compile_cache.db"
  return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rawgrad" / "compile_cache.db"


def compile_cached(compiler: Compiler, src: str, unsaved: dict[str, bytes] | None = None) -> bytes:
  """compiler.compile(src), from the disk cache when an identical compile was done before by any process. A new
  object is written to the cache at once, or, given `unsaved`, kept there for save_objects to write together with
  the others: every write is a transaction that waits for the disk, which costs more than compiling a small kernel."""
  if (path := cache_path()) is None:
    return compiler.compile(src)
  key = hashlib.sha256(f"{compiler.cache_key}\0{hashlib.sha256(src.encode()).hexdigest()}".encode()).hexdigest()
  if unsaved is not None and (obj := unsaved.get(key)) is not None: return obj
  if (obj := _cache_get(path, key)) is None:
    obj = compiler.compile(src)
    if unsaved is None: _cache_put(path, {key: obj})
    else: unsaved[key] = obj
  return obj


def save_objects(unsaved: dict[str, bytes]) -> None:
  """Write the objects compile_cached kept unsaved to the disk cache, in one transaction."""
  if unsaved and (path := cache_path()) is not None: _cache_put(path, unsaved)


def _connect(path: Path) -> sqlite3.Connection:
  path.parent.mkdir(parents=True, exist_ok=True)
  conn = sqlite3.connect(path, timeout=30)  # wait out other processes' write locks instead of failing at once
  conn.execute("CREATE TABLE IF NOT EXISTS objects (key TEXT PRIMARY KEY, obj BLOB NOT NULL)")
  return conn


def _unusable(path: Path, e: Exception) -> None:
  # a broken cache costs a recompile, never the compile itself
  warnings.warn(f"compile cache {path} is unusable ({type(e).__name__}: {e}), compiling without it", RuntimeWarning,
                stacklevel=4)


def _cache_get(path: Path, key: str) -> bytes | None:
  try:
    with contextlib.closing(_connect(path)) as conn:
      row = conn.execute("SELECT obj FROM objects WHERE key = ?", (key,)).fetchone()
  except (sqlite3.Error, OSError) as e:
    _unusable(path, e)
    return None
  return None if row is None else bytes(row[0])


def _cache_put(path: Path, objects: dict[str, bytes]) -> None:
  try:
    with contextlib.closing(_connect(path)) as conn, conn:
      conn.executemany("INSERT OR REPLACE INTO objects (key, obj) VALUES (?, ?)", objects.items())
  except (sqlite3.Error, OSError) as e:
    _unusable(path, e)
