"""CPUProgram runs hand-written LLVM IR kernels compiled for this host; results are checked against numpy."""
from __future__ import annotations

import ctypes
import gc
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rawgrad.drivers.cpu import CPUProgram
from rawgrad.runtime.compile import LLVMCompiler
from rawgrad.runtime.elf import PAGE_SIZE, find_process_symbol, load_elf


@pytest.fixture(scope="module")
def compiler() -> LLVMCompiler:
  return LLVMCompiler()


def ptr(a: np.ndarray) -> int:
  return a.ctypes.data


def loop(name: str, args: str, body: str, prelude: str = "") -> str:
  """A kernel `name` that runs prelude once, then body for %i in [0, %n); args must declare `i64 %n`."""
  return f"""
define void @{name}({args}) {{
entry:{prelude}
  %nonempty = icmp sgt i64 %n, 0
  br i1 %nonempty, label %loop, label %exit
loop:
  %i = phi i64 [0, %entry], [%i.next, %loop]
{body}
  %i.next = add i64 %i, 1
  %done = icmp eq i64 %i.next, %n
  br i1 %done, label %exit, label %loop
exit:
  ret void
}}
"""


VADD = loop("vadd", "ptr noalias %out, ptr noalias %a, ptr noalias %b, i64 %n", """
  %pa = getelementptr float, ptr %a, i64 %i
  %pb = getelementptr float, ptr %b, i64 %i
  %va = load float, ptr %pa
  %vb = load float, ptr %pb
  %s = fadd float %va, %vb
  %po = getelementptr float, ptr %out, i64 %i
  store float %s, ptr %po""")


@pytest.fixture(scope="module")
def vadd(compiler: LLVMCompiler) -> CPUProgram:
  return CPUProgram("vadd", compiler.compile(VADD))


@settings(max_examples=25, deadline=None)
@given(n=st.integers(0, 300), seed=st.integers(0, 2**32 - 1))
def test_vector_add(vadd: CPUProgram, n: int, seed: int) -> None:
  rng = np.random.default_rng(seed)
  a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
  out = np.full(n + 1, 7.0, np.float32)  # one sentinel past the end
  vadd(ptr(out), ptr(a), ptr(b), n)
  np.testing.assert_array_equal(out[:n], a + b)
  assert out[n] == 7.0


SWITCH = """
@table = internal constant [8 x float] [float 0.5, float 1.5, float 2.5, float 3.5, float 4.5, float 5.5, float 6.5,
                                        float 7.5]
declare float @llvm.sqrt.f32(float)
define void @pick(ptr noalias %out, ptr noalias %x, ptr noalias %sel, i64 %n) {
entry:
  %nonempty = icmp sgt i64 %n, 0
  br i1 %nonempty, label %loop, label %exit
loop:
  %i = phi i64 [0, %entry], [%i.next, %merge]
  %ps = getelementptr i32, ptr %sel, i64 %i
  %s = load i32, ptr %ps
  %px = getelementptr float, ptr %x, i64 %i
  %v = load float, ptr %px
  switch i32 %s, label %merge [ i32 0, label %c0  i32 1, label %c1  i32 2, label %c2  i32 3, label %c3
                                i32 4, label %c4  i32 5, label %c5  i32 6, label %c6  i32 7, label %c7 ]
c0:
  %r0 = fmul float %v, 2.0
  br label %merge
c1:
  %r1 = fadd float %v, 3.0
  br label %merge
c2:
  %r2 = call float @llvm.sqrt.f32(float %v)
  br label %merge
c3:
  %r3 = fneg float %v
  br label %merge
c4:
  %r4 = fdiv float 1.0, %v
  br label %merge
c5:
  %r5 = fsub float %v, 7.0
  br label %merge
c6:
  %r6 = fmul float %v, %v
  br label %merge
c7:
  %j = and i64 %i, 7
  %pt = getelementptr [8 x float], ptr @table, i64 0, i64 %j
  %t = load float, ptr %pt
  %r7 = fadd float %v, %t
  br label %merge
merge:
  %r = phi float [%r0, %c0], [%r1, %c1], [%r2, %c2], [%r3, %c3], [%r4, %c4], [%r5, %c5], [%r6, %c6], [%r7, %c7],
                 [%v, %loop]
  %po = getelementptr float, ptr %out, i64 %i
  store float %r, ptr %po
  %i.next = add i64 %i, 1
  %done = icmp eq i64 %i.next, %n
  br i1 %done, label %exit, label %loop
exit:
  ret void
}
"""


def test_jump_table_and_constant_array(compiler: LLVMCompiler) -> None:
  n = 200
  rng = np.random.default_rng(0)
  x = rng.uniform(0.5, 4.0, n).astype(np.float32)
  sel = rng.integers(0, 10, n).astype(np.int32)  # 8 and 9 take the default branch
  out = np.empty(n, np.float32)
  CPUProgram("pick", compiler.compile(SWITCH))(ptr(out), ptr(x), ptr(sel), n)
  table = np.arange(8, dtype=np.float32) + np.float32(0.5)
  cases = [x * 2, x + 3, np.sqrt(x), -x, np.float32(1) / x, x - 7, x * x, x + table[np.arange(n) & 7]]
  want = np.select([sel == k for k in range(8)], cases, default=x).astype(np.float32)
  np.testing.assert_array_equal(out, want)


LIBCALLS = """
declare float @expf(float)
declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)
declare void @llvm.memcpy.p0.p0.i64(ptr noalias, ptr noalias, i64, i1)
""" + loop("libcalls", "ptr noalias %exp_out, ptr noalias %copy_out, ptr noalias %fill_out, ptr noalias %x, i64 %n", """
  %px = getelementptr float, ptr %x, i64 %i
  %v = load float, ptr %px
  %e = call float @expf(float %v)
  %po = getelementptr float, ptr %exp_out, i64 %i
  store float %e, ptr %po""", prelude="""
  %bytes = shl i64 %n, 2
  call void @llvm.memset.p0.i64(ptr %fill_out, i8 127, i64 %bytes, i1 false)
  call void @llvm.memcpy.p0.p0.i64(ptr %copy_out, ptr %x, i64 %bytes, i1 false)""")


def test_libm_and_libc_calls(compiler: LLVMCompiler) -> None:
  obj = compiler.compile(LIBCALLS)
  assert {"expf", "memset", "memcpy"} <= set(load_elf(obj).stubs)  # they really are calls into libm/libc
  n = 1000
  x = np.linspace(-20, 20, n, dtype=np.float32)
  exp_out, copy_out, fill_out = np.zeros(n, np.float32), np.zeros(n, np.float32), np.zeros(n + 4, np.float32)
  CPUProgram("libcalls", obj)(ptr(exp_out), ptr(copy_out), ptr(fill_out), ptr(x), n)
  np.testing.assert_allclose(exp_out, np.exp(x), rtol=2e-7)
  np.testing.assert_array_equal(copy_out, x)
  assert (fill_out.view(np.uint8)[:4 * n] == 127).all() and (fill_out[n:] == 0).all()


HALF = loop("halfs", "ptr noalias %wide_out, ptr noalias %narrow_out, ptr noalias %h, ptr noalias %f, i64 %n", """
  %ph = getelementptr half, ptr %h, i64 %i
  %vh = load half, ptr %ph
  %wide = fpext half %vh to float
  %pw = getelementptr float, ptr %wide_out, i64 %i
  store float %wide, ptr %pw
  %pf = getelementptr float, ptr %f, i64 %i
  %vf = load float, ptr %pf
  %narrow = fptrunc float %vf to half
  %pn = getelementptr half, ptr %narrow_out, i64 %i
  store half %narrow, ptr %pn""")

HALF_LIBGCC = """
declare float @__extendhfsf2(half)
declare half @__truncsfhf2(float)
""" + HALF.replace("fpext half %vh to float", "call float @__extendhfsf2(half %vh)") \
          .replace("fptrunc float %vf to half", "call half @__truncsfhf2(float %vf)")


def half_inputs() -> tuple[np.ndarray, np.ndarray]:
  every_half = np.arange(2**16, dtype=np.uint16).view(np.float16)
  floats = np.random.default_rng(1).standard_normal(4096).astype(np.float32) * np.float32(3e4)
  special = np.array([0, -0.0, np.inf, -np.inf, np.nan, 65504, 65520, 1e-8, 6e-8, -3e-5], np.float32)
  return every_half, np.concatenate([floats, special])


def check_halfs(obj: bytes) -> None:
  h, f = half_inputs()
  n = len(h)
  f = np.resize(f, n)
  wide, narrow = np.empty(n, np.float32), np.empty(n, np.float16)
  CPUProgram("halfs", obj)(ptr(wide), ptr(narrow), ptr(h), ptr(f), n)
  np.testing.assert_array_equal(wide, h.astype(np.float32))
  with np.errstate(over="ignore"):  # floats past the float16 range become inf, as they should
    np.testing.assert_array_equal(narrow, f.astype(np.float16))


def test_float16_conversions(compiler: LLVMCompiler) -> None:
  check_halfs(compiler.compile(HALF))


def test_float16_conversions_through_libgcc(compiler: LLVMCompiler) -> None:
  # what LLVM calls for half on CPUs without F16C, found by name in libgcc_s
  try:
    find_process_symbol("__truncsfhf2")
  except LookupError:
    pytest.skip("no libgcc_s with float16 conversions in this process")
  obj = compiler.compile(HALF_LIBGCC)
  assert {"__extendhfsf2", "__truncsfhf2"} <= set(load_elf(obj).stubs)
  check_halfs(obj)


SAXPY = loop("saxpy", "ptr noalias %out, float %alpha, ptr noalias %x, ptr noalias %y, i64 %n", """
  %px = getelementptr float, ptr %x, i64 %i
  %py = getelementptr float, ptr %y, i64 %i
  %vx = load float, ptr %px
  %vy = load float, ptr %py
  %m = fmul float %alpha, %vx
  %s = fadd float %m, %vy
  %po = getelementptr float, ptr %out, i64 %i
  store float %s, ptr %po""")


def test_vectorized_loop(compiler: LLVMCompiler) -> None:
  # packed single-precision math: the loop vectorizer turned the scalar loop into SIMD code
  assert re.search(r"\b(vmulps|vfmadd\w*ps|mulps|fmul\s+v\d+\.4s|fmla\s+v\d+\.4s)\b", compiler.assembly(SAXPY))
  argtypes = [ctypes.c_void_p, ctypes.c_float, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
  prog = CPUProgram("saxpy", compiler.compile(SAXPY), argtypes=argtypes)
  n = 1037  # not a multiple of any vector width, so the scalar epilogue runs too
  x, y = np.arange(n, dtype=np.float32) / 7, np.linspace(-1, 1, n, dtype=np.float32)
  out = np.empty(n, np.float32)
  prog(ptr(out), 1.5, ptr(x), ptr(y), n)
  np.testing.assert_array_equal(out, np.float32(1.5) * x + y)


SCALARS = """
define float @scale(float %x, i64 %k) {
  %kf = sitofp i64 %k to float
  %r = fmul float %x, %kf
  ret float %r
}
"""


def test_scalar_arguments_and_result(compiler: LLVMCompiler) -> None:
  prog = CPUProgram("scale", compiler.compile(SCALARS), argtypes=[ctypes.c_float, ctypes.c_int64],
                    restype=ctypes.c_float)
  assert prog(2.5, -3) == -7.5


def mapping_perms(addr: int) -> str | None:
  """Permissions (e.g. 'r-xp') of the mapping that holds addr in this process, None if unmapped."""
  with open("/proc/self/maps") as f:
    for line in f:
      lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
      if lo <= addr < hi:
        return line.split()[1]
  return None


def test_program_memory_is_executable_and_not_writable(compiler: LLVMCompiler) -> None:
  prog = CPUProgram("vadd", compiler.compile(VADD))
  assert mapping_perms(prog.address) == "r-xp"
  assert mapping_perms(prog.base) == "r-xp"


COUNTER = """
@counter = global i64 41
define i64 @bump() {
  %old = load i64, ptr @counter
  %new = add i64 %old, 1
  store i64 %new, ptr @counter
  ret i64 %new
}
"""


def test_writable_global_stays_writable_on_its_own_page(compiler: LLVMCompiler) -> None:
  obj = compiler.compile(COUNTER)
  image = load_elf(obj)
  prog = CPUProgram("bump", obj, restype=ctypes.c_int64)
  assert [prog(), prog(), prog()] == [42, 43, 44]
  data_page = prog.base + (image.exec_size + PAGE_SIZE - 1) // PAGE_SIZE * PAGE_SIZE
  assert mapping_perms(prog.address) == "r-xp" and mapping_perms(data_page) == "rw-p"


def test_memory_freed_with_program(compiler: LLVMCompiler) -> None:
  prog = CPUProgram("vadd", compiler.compile(VADD))
  base = prog.base
  del prog
  gc.collect()
  assert mapping_perms(base) != "r-xp"


def test_missing_function_names_what_exists(compiler: LLVMCompiler) -> None:
  with pytest.raises(KeyError, match=r"'nope'.*\['vadd'\]"):
    CPUProgram("nope", compiler.compile(VADD))
