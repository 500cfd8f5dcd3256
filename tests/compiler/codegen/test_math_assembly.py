"""The float32 exponential's vector loop converts nothing lane by lane on AVX2 (which has no float64 -> int64
conversion): the power of two's exponent comes from the bits of the rounding sum (mathrules._round_even). A cast to
bfloat16 is integer arithmetic on every CPU, rounded as PyTorch rounds."""
from __future__ import annotations

import re

import llvmlite.binding as llvm
import pytest

from rawgrad import Tensor
from rawgrad.compiler.codegen.lower import lower_kernel
from rawgrad.compiler.rangeify import create_schedule
from rawgrad.compiler.render.llvmir import LLVMRenderer
from rawgrad.compiler.target import Target, host_target
from rawgrad.runtime.compile import LLVMCompiler

pytestmark = pytest.mark.skipif(llvm.get_process_triple().split("-")[0] != "x86_64", reason="reads x86 assembly")

ZNVER3 = Target(kind="cpu", arch="x86_64", triple="x86_64-unknown-linux-gnu", cpu="znver3", vector_bytes=32,
                vector_registers=16, l1_bytes=32 << 10, l1_ways=8, l2_bytes=512 << 10)


def _avx2() -> Target:
  try:
    return host_target("avx2")
  except ValueError as e:
    pytest.skip(str(e))


@pytest.mark.parametrize("target", ["avx2", "znver3"])
def test_no_lane_is_converted_to_an_integer_alone(target: str) -> None:
  chosen = _avx2() if target == "avx2" else ZNVER3
  item = create_schedule([Tensor.empty(4096).exp().uop]).items[-1]
  lowered = lower_kernel(item.ast, None, chosen)
  assembly = LLVMCompiler(chosen).assembly(LLVMRenderer().render(item.ast.arg, lowered.program))
  assert re.search(r"\bvfmadd\w*pd\s+%ymm", assembly), "the polynomial runs on vectors of float64"
  assert not re.search(r"\bv?cvtt?sd2si", assembly), "a lane converted from float64 to an integer on its own"


def _bfloat16_cast_assembly(target: Target) -> str:
  halves = Tensor.empty(256, dtype="bfloat16")
  value = (Tensor.empty(256).cast("bfloat16") * 3).maximum(halves) - halves + (halves > 0).cast("bfloat16")
  item = create_schedule([value.uop]).items[-1]
  lowered = lower_kernel(item.ast, None, target)
  return LLVMCompiler(target).assembly(LLVMRenderer().render(item.ast.arg, lowered.program))


@pytest.mark.parametrize("target", ["native", "avx2", "znver3"])
def test_float_to_bfloat16_needs_no_library_and_keeps_denormals(target: str) -> None:
  """The conversion, and the rounding of bfloat16 arithmetic, is integer arithmetic on every CPU: without AVX-512
  BF16 LLVM's own called __truncsfbf2, which libgcc before 13 lacks (every bfloat16 cast or operation failed to load
  on AVX2 machines), and with it VCVTNEPS2BF16 flushed denormals to 0."""
  chosen = {"native": host_target("native"), "znver3": ZNVER3}.get(target) or _avx2()
  assembly = _bfloat16_cast_assembly(chosen)
  assert "__truncsfbf2" not in assembly and "vcvtneps2bf16" not in assembly
  assert not re.search(r"\bcall", assembly.split(".Lfunc_end")[0]), "the kernel calls a function"


def test_float_to_bfloat16_values_match_torch_bits() -> None:
  import numpy as np
  torch = pytest.importorskip("torch")
  values = np.array([1e-39, 9.2e-41, -3e-39, 1.17e-38, 1.0000001, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 3.4e38, -np.inf,
                     65504.0, -0.0], dtype=np.float32)
  ours = Tensor(values).cast("bfloat16").cast("float32").numpy()
  theirs = torch.from_numpy(values).to(torch.bfloat16).float().numpy()
  np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32))
  halves, torch_halves = Tensor(values).cast("bfloat16"), torch.from_numpy(values).to(torch.bfloat16)
  ours = ((halves * 3).maximum(halves - 1e-39) / 7).cast("float32").numpy()
  theirs = ((torch_halves * 3).maximum(torch_halves - 1e-39) / 7).float().numpy()
  np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32))
  np.testing.assert_array_equal((halves > 0).cast("bfloat16").cast("float32").numpy(), values > 0)
  assert np.isnan(Tensor(np.array([np.nan], np.float32)).cast("bfloat16").cast("float32").numpy()).all()
