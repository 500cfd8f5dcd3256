"""compiler/render/llvmir.py on the CPU: types and constants, the entry point that reads the argument block, the
module LLVM accepts, and rendered kernels that compute what numpy does for every kind of dtype. (The GPU renderers:
test_gpu_renderers.py.)"""
import dataclasses
import struct

import numpy as np
import pytest

from rawgrad import Tensor
from rawgrad.compiler.codegen.linearize import argument_table
from rawgrad.compiler.codegen.lower import lower_kernel
from rawgrad.compiler.codegen.opt.kernel import Opt, OptOps
from rawgrad.compiler.ir import Ops, UOp
from rawgrad.compiler.program_text import deserialize_program, program_from_comments
from rawgrad.compiler.render.llvmir import LLVMRenderer, kernel_symbol, llvm_constant, llvm_type
from rawgrad.compiler.target import host_target
from rawgrad.dtype import dtypes
from rawgrad.runtime.compile import LLVMCompiler
from tests.compiler.codegen.kernels import last_kernel, run_item


def test_llvm_types() -> None:
  assert [llvm_type(d) for d in (dtypes.bool, dtypes.uint8, dtypes.int64, dtypes.index, dtypes.float16,
                                 dtypes.bfloat16, dtypes.float32, dtypes.float64)] == \
         ["i1", "i8", "i64", "i64", "half", "bfloat", "float", "double"]
  assert llvm_type(dtypes.bool, in_memory=True) == "i8" and llvm_type(dtypes.float32.vec(8)) == "<8 x float>"
  assert llvm_type(dtypes.float32.ptr(4)) == "ptr"


def test_llvm_constants() -> None:
  assert llvm_constant(True, dtypes.bool) == "true" and llvm_constant(0, dtypes.bool) == "false"
  assert llvm_constant(255, dtypes.uint8) == "-1" and llvm_constant(-1, dtypes.uint32) == "-1"
  assert llvm_constant(300, dtypes.int8) == "44" and llvm_constant(7, dtypes.int64) == "7"
  assert llvm_constant(1.0, dtypes.float16) == "0xH3C00" and llvm_constant(1.0, dtypes.bfloat16) == "0xR3F80"
  assert llvm_constant(0.1, dtypes.float32) == "0x%016X" % struct.unpack("<Q", struct.pack("<d", 0.1))[0]
  assert llvm_constant(float("inf"), dtypes.float64) == "0x7FF0000000000000"
  assert llvm_constant((1, 2), dtypes.int32.vec(2)) == "<i32 1, i32 2>"
  assert llvm_constant(0, dtypes.int16.vec(3)) == "<i16 0, i16 0, i16 0>"


def test_kernel_symbols_are_valid_identifiers() -> None:
  assert kernel_symbol("r_4_4") == "r_4_4" and kernel_symbol("E_3n1+x.y") == "E_3n1_x_y"


def test_the_entry_point_reads_the_argument_block() -> None:
  item = last_kernel(Tensor(np.ones(8, np.float32)) + Tensor(np.ones(8, np.float32)))
  module = LLVMRenderer().render(item.ast.arg, lower_kernel(item.ast, []).program)
  symbol = kernel_symbol(item.ast.arg)
  assert f"define void @{symbol}(ptr %args, i64 %core, i64 %cores)" in module
  assert f"define internal void @{symbol}.body(ptr noalias %data0, ptr noalias %data1, ptr noalias %data2" in module
  assert [f"%slot{i} = getelementptr inbounds i64, ptr %args, i64 {i}" in module for i in range(3)] == [True] * 3
  assert LLVMCompiler().compile(module)[:4] == b"\x7fELF"


def test_an_embedded_program_follows_the_module() -> None:
  item = last_kernel(Tensor(np.ones(4, np.float32)) * 2)
  program = lower_kernel(item.ast, []).program
  plain = LLVMRenderer().render(item.ast.arg, program)
  module = LLVMRenderer(embed_program=True).render(item.ast.arg, program)
  assert module.startswith(plain) and program_from_comments(plain) is None
  assert deserialize_program(program_from_comments(module)) == program


def test_a_value_used_before_it_is_computed_is_refused() -> None:
  x = UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(1), arg=0)
  late = UOp.const(dtypes.float32, 1.0).alu(Ops.SQRT)
  store = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, x.dtype, (x, UOp.const(dtypes.index, 0))), late))
  with pytest.raises(ValueError, match="LLVM renderer: Ops.SQRT is used before it is computed"):
    LLVMRenderer().render("bad", [x, store.src[0], store])


rng = np.random.default_rng(31)


@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.uint16, np.int32, np.int64, np.float16, np.float32,
                                   np.float64])
def test_rendered_kernels_compute_every_dtype(dtype: type) -> None:
  if dtype is np.bool_: a, b = rng.integers(0, 2, 24).astype(bool), rng.integers(0, 2, 24).astype(bool)
  elif np.issubdtype(dtype, np.integer): a, b = (rng.integers(0, 50, 24).astype(dtype) for _ in range(2))
  else: a, b = (rng.standard_normal(24).astype(dtype) for _ in range(2))
  x, y = Tensor(a), Tensor(b)
  if dtype is np.bool_: tensor, expected = (x & y) | ~x, (a & b) | ~a
  else: tensor, expected = x.maximum(y) * 2 + (x < y).cast(x.dtype), np.maximum(a, b) * 2 + (a < b).astype(dtype)
  item = last_kernel(tensor)
  for opts in ([], [Opt(OptOps.UPCAST, 0, 8)]):
    np.testing.assert_allclose(run_item(item, opts), expected, rtol=1e-3 if dtype is np.float16 else 1e-6)


def test_rendered_math_and_casts() -> None:
  x = rng.uniform(0.5, 4, 16).astype(np.float32)
  item = last_kernel((Tensor(x).sqrt() + Tensor(x).reciprocal()).cast(dtypes.int32) + Tensor(x).trunc().cast(
    dtypes.int32))
  np.testing.assert_array_equal(run_item(item, [Opt(OptOps.UPCAST, 0, 4)]),
                                (np.sqrt(x) + 1 / x).astype(np.int32) + np.trunc(x).astype(np.int32))


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float64, np.bool_])
def test_a_vector_stored_lane_by_lane_is_one_scatter(dtype: type) -> None:
  # a transposing copy whose lanes run along the output's rows: every lane is stored a row apart
  a = rng.integers(0, 2, (8, 16)).astype(dtype) if dtype is np.bool_ else rng.integers(-9, 9, (8, 16)).astype(dtype)
  item = last_kernel(~Tensor(a).T if dtype is np.bool_ else (Tensor(a) + 1).T)
  opts = [Opt(OptOps.UPCAST, 0, 8)]
  module = LLVMRenderer().render(item.ast.arg, lower_kernel(item.ast, opts).program)
  scatters = module.count("call void @llvm.masked.scatter.")
  # booleans are widened to bytes lane by lane, so they stay lone stores
  assert scatters == (0 if dtype is np.bool_ else 1), module
  np.testing.assert_array_equal(run_item(item, opts), (~a.T if dtype is np.bool_ else a.T + 1).ravel())


def test_a_cpu_kernel_with_an_argument_table_keeps_its_buffers_apart() -> None:
  """Past the argument limit the entry point loads the words from the table and passes the buffers to the body as
  noalias parameters, as an argument block's: LLVM then hoists what a row reads out of the loop over its elements."""
  item = last_kernel((Tensor.empty(4, 64) - Tensor.empty(4, 1)) * (Tensor.empty(4, 1).exp() + 1))
  program = lower_kernel(item.ast, [], dataclasses.replace(host_target(), kernarg_bytes=8)).program
  assert argument_table(program) is not None
  module = LLVMRenderer().render(item.ast.arg, program)
  symbol = kernel_symbol(item.ast.arg)
  assert f"define internal void @{symbol}.body(ptr noalias %data0, ptr noalias %data1, ptr noalias %data2" in module
  assert "%table = load ptr, ptr %args, align 8" in module and "!invariant.load" not in module, module
  # (tests/engine/test_argument_table.py runs kernels through the table)
