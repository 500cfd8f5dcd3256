"""Targets: the host CPU (optionally limited to a feature set) and the GPU table."""
import llvmlite.binding as llvm
import pytest

from rawgrad.compiler.target import GPU_TARGETS, gpu_target, host_target

HOST = dict(llvm.get_host_cpu_features())


def test_host_target_describes_this_cpu() -> None:
  target = host_target("native")
  assert target.kind == "cpu" and not target.is_gpu and target.triple == llvm.get_process_triple()
  expected = 64 if HOST.get("avx512f") else 32 if HOST.get("avx2") or HOST.get("avx") else 16
  assert target.vector_bytes == expected
  assert target.l1_bytes > 0 and target.l2_bytes >= target.l1_bytes


@pytest.mark.skipif(not HOST.get("avx2"), reason="forcing AVX2 needs a CPU with AVX2")
def test_forcing_avx2_turns_avx512_off() -> None:
  target = host_target("avx2")
  assert target.vector_bytes == 32 and target.vector_registers == 16
  assert "-avx512f" in target.features.split(",") and "+avx2" in target.features.split(",")


def test_forcing_an_isa_the_cpu_lacks_or_an_unknown_one_raises() -> None:
  if not HOST.get("avx512f"):
    with pytest.raises(ValueError, match="AVX-512"): host_target("avx512")
  with pytest.raises(ValueError, match="native, avx2 or avx512"): host_target("sse9")


def test_gpu_table() -> None:
  assert gpu_target("sm_90").warp_size == 32 and gpu_target("gfx942").warp_size == 64
  assert gpu_target("gfx1100").shared_memory_bytes == 64 << 10
  for arch, target in GPU_TARGETS.items():
    assert target.is_gpu and target.arch == arch and target.max_threads_per_block >= 256
    assert {"sqrt", "trunc"} <= target.native_math and "sin" not in target.native_math
  with pytest.raises(ValueError, match="unknown GPU architecture 'sm_1'.*sm_90"): gpu_target("sm_1")
