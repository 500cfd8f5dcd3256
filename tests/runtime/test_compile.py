"""LLVMCompiler turns IR into objects for this host; compile_cached keeps them on disk across processes."""
from __future__ import annotations

import io
import multiprocessing
import platform
import sqlite3
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from rawgrad.runtime.compile import CompileError, LLVMCompiler, cache_path, compile_cached, save_objects

ADD = """
define i64 @add(i64 %a, i64 %b) {
  %s = add i64 %a, %b
  ret i64 %s
}
"""


class CountingCompiler:
  """Stands in for a real compiler: fast, deterministic, and counts its compiles."""

  def __init__(self, cache_key: str = "counting") -> None:
    self.cache_key, self.calls = cache_key, 0

  def compile(self, src: str) -> bytes:
    self.calls += 1
    return b"OBJ:" + src.encode()


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
  monkeypatch.setenv("RAWGRAD_CACHE_DIR", str(tmp_path / "cache"))
  monkeypatch.delenv("DISABLE_COMPILER_CACHE", raising=False)
  return tmp_path / "cache"


def test_compiles_an_object_for_the_host() -> None:
  obj = LLVMCompiler().compile(ADD)
  elf = ELFFile(io.BytesIO(obj))
  host = {"x86_64": "EM_X86_64", "aarch64": "EM_AARCH64", "arm64": "EM_AARCH64"}.get(platform.machine())
  assert elf["e_type"] == "ET_REL" and elf["e_machine"] == host


def test_invalid_ir_names_the_problem_and_shows_the_ir() -> None:
  src = ADD.replace("add i64 %a, %b", "add i64 %a, %nope")
  with pytest.raises(CompileError) as e:
    LLVMCompiler().compile(src)
  assert "%nope" in str(e.value) and "use of undefined value" in str(e.value)
  assert "add i64 %a, %nope" in str(e.value)  # the offending IR, so the error stands on its own


def test_ir_rejected_by_the_verifier_raises_compile_error() -> None:
  src = """
define i32 @f(i1 %c) {
entry:
  br i1 %c, label %a, label %b
a:
  %x = add i32 1, 2
  br label %b
b:
  ret i32 %x
}
"""
  with pytest.raises(CompileError, match="does not dominate all uses"):
    LLVMCompiler().compile(src)


def test_cache_key_names_compiler_versions_and_cpu() -> None:
  key = LLVMCompiler().cache_key
  assert key.startswith("LLVMCompiler(") and "llvmlite" in key and "LLVM" in key


def test_cache_hit_returns_identical_bytes_without_compiling_again(cache_dir: Path) -> None:
  first = CountingCompiler()
  obj = compile_cached(first, ADD)
  again = CountingCompiler()  # a later process: a new compiler, the same disk
  assert compile_cached(again, ADD) == obj and (first.calls, again.calls) == (1, 0)
  assert cache_path() == cache_dir / "compile_cache.db" and cache_path().exists()


def test_cache_of_real_objects(cache_dir: Path) -> None:
  obj = compile_cached(LLVMCompiler(), ADD)
  assert compile_cached(LLVMCompiler(), ADD) == obj == LLVMCompiler().compile(ADD)


def test_cache_tells_sources_and_compilers_apart(cache_dir: Path) -> None:
  compiler, other = CountingCompiler(), CountingCompiler("other cpu")
  compile_cached(compiler, ADD)
  compile_cached(compiler, ADD + "\n")
  compile_cached(other, ADD)
  assert (compiler.calls, other.calls) == (2, 1)


def _cached_rows(path: Path) -> int:
  with sqlite3.connect(path) as conn:
    return conn.execute("SELECT COUNT(*) FROM objects").fetchone()[0]


def test_unsaved_objects_reach_the_disk_in_one_write(cache_dir: Path) -> None:
  compile_cached(CountingCompiler(), "kernel 0")  # the cache file exists, with one object
  compiler, unsaved = CountingCompiler(), {}
  objs = [compile_cached(compiler, f"kernel {k}", unsaved) for k in (0, 1, 2, 1)]
  # kernel 0 comes from the disk, kernel 1 the second time from the batch: two compiles, both kept back
  assert objs == [b"OBJ:kernel 0", b"OBJ:kernel 1", b"OBJ:kernel 2", b"OBJ:kernel 1"] and compiler.calls == 2
  assert len(unsaved) == 2 and _cached_rows(cache_path()) == 1
  save_objects(unsaved)
  assert _cached_rows(cache_path()) == 3
  later = CountingCompiler()
  assert [compile_cached(later, f"kernel {k}") for k in range(3)] == [b"OBJ:kernel 0", b"OBJ:kernel 1",
                                                                      b"OBJ:kernel 2"] and later.calls == 0


def test_disable_compiler_cache_bypasses_it(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setenv("DISABLE_COMPILER_CACHE", "1")
  compiler = CountingCompiler()
  assert compile_cached(compiler, ADD) == compile_cached(compiler, ADD)
  assert compiler.calls == 2 and cache_path() is None and not cache_dir.exists()


def test_default_cache_location(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
  monkeypatch.delenv("RAWGRAD_CACHE_DIR", raising=False)
  monkeypatch.delenv("DISABLE_COMPILER_CACHE", raising=False)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  assert cache_path() == tmp_path / "rawgrad" / "compile_cache.db"


def test_corrupt_cache_file_falls_back_to_compiling(cache_dir: Path) -> None:
  cache_dir.mkdir()
  (cache_dir / "compile_cache.db").write_bytes(b"this is not a sqlite database" * 100)
  compiler = CountingCompiler()
  with pytest.warns(RuntimeWarning, match="compile_cache.db is unusable"):
    assert compile_cached(compiler, ADD) == b"OBJ:" + ADD.encode()
  assert compiler.calls == 1


def test_unusable_cache_dir_falls_back_to_compiling(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
  (tmp_path / "a_file").write_text("")
  monkeypatch.setenv("RAWGRAD_CACHE_DIR", str(tmp_path / "a_file" / "cache"))
  monkeypatch.delenv("DISABLE_COMPILER_CACHE", raising=False)
  with pytest.warns(RuntimeWarning, match="unusable"):
    assert compile_cached(CountingCompiler(), ADD) == b"OBJ:" + ADD.encode()


def test_cache_entry_from_an_old_schema_is_recompiled(cache_dir: Path) -> None:
  cache_dir.mkdir()
  with sqlite3.connect(cache_dir / "compile_cache.db") as conn:
    conn.execute("CREATE TABLE objects (unrelated INTEGER)")
  with pytest.warns(RuntimeWarning):
    assert compile_cached(CountingCompiler(), ADD) == b"OBJ:" + ADD.encode()


def _fill_cache(worker: int) -> list[bytes]:
  compiler = CountingCompiler()
  return [compile_cached(compiler, f"kernel {(worker + i) % 16}") for i in range(40)]


def test_concurrent_processes_share_the_cache(cache_dir: Path) -> None:
  # fork, so the children see the monkeypatched environment and need not import anything again
  with multiprocessing.get_context("fork").Pool(4) as pool:
    results = pool.map(_fill_cache, range(4))
  for worker, objs in enumerate(results):
    assert objs == [f"OBJ:kernel {(worker + i) % 16}".encode() for i in range(40)]
  compiler = CountingCompiler()
  assert all(compile_cached(compiler, f"kernel {k}") for k in range(16)) and compiler.calls == 0
