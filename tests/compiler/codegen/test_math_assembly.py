"""The float32 exponential's vector loop converts nothing lane by lane on AVX2 (which has no float64 -> int64
conversion): the power of two's exponent comes from the bits of the rounding sum (mathrules._round_even)."""
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
