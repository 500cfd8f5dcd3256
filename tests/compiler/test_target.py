"""Targets: the host CPU (optionally limited to a feature set) and the GPU table."""
import llvmlite.binding as llvm
import pytest

from rawgrad.compiler.target import GPU_TARGETS, gpu_target, host_target

def test_host_target_describes_this_cpu() -> None:
  target = host_target("native")
  assert target.kind == "cpu" and not target.is_gpu and target.triple == llvm.get_process_triple()
  assert target.cpu == llvm.get_host_cpu_name() and target.l1_bytes > 0 and target.l2_bytes >= target.l1_bytes


SAPPHIRE_RAPIDS = {"sse4.2": True, "avx": True, "avx2": True, "fma": True, "avx512f": True, "avx512bw": True,
                   "avx512vl": True, "avx512fp16": True, "amx-tile": True}
ZEN3 = {"sse4.2": True, "avx": True, "avx2": True, "fma": True, "avx512f": False}
NEHALEM = {"sse4.2": True, "avx": False, "avx2": False}


@pytest.fixture
def cpu_features(monkeypatch: pytest.MonkeyPatch):
  """host_target on an x86-64 machine with the features the test names."""
  def use(features: dict[str, bool]) -> None:
    monkeypatch.setattr(llvm, "get_host_cpu_features", lambda: dict(features))
    monkeypatch.setattr(llvm, "get_process_triple", lambda: "x86_64-unknown-linux-gnu")
    host_target.cache_clear()
  yield use
  host_target.cache_clear()


@pytest.mark.parametrize("features, isa, vector_bytes, registers", [
  (SAPPHIRE_RAPIDS, "native", 64, 32), (SAPPHIRE_RAPIDS, "avx512", 64, 32), (SAPPHIRE_RAPIDS, "avx2", 32, 16),
  (ZEN3, "native", 32, 16), (ZEN3, "avx2", 32, 16), (NEHALEM, "native", 16, 16)])
def test_vector_width_and_registers_follow_the_features(cpu_features, features, isa, vector_bytes, registers) -> None:
  cpu_features(features)
  target = host_target(isa)
  assert (target.arch, target.vector_bytes, target.vector_registers) == ("x86_64", vector_bytes, registers)
  flags = target.features.split(",")
  switched_off = {"-avx512fp16", "-amx-tile"} if features is SAPPHIRE_RAPIDS else set()
  if isa == "avx2": assert {"-avx512f", "+avx2", "+fma"} | switched_off <= set(flags)
  else: assert all(("+" if on else "-") + name in flags for name, on in features.items())


def test_forcing_an_isa_the_cpu_lacks_or_an_unknown_one_raises(cpu_features) -> None:
  cpu_features(ZEN3)
  with pytest.raises(ValueError, match="AVX-512"): host_target("avx512")
  cpu_features(NEHALEM)
  with pytest.raises(ValueError, match="AVX2"): host_target("avx2")
  with pytest.raises(ValueError, match="native, avx2 or avx512"): host_target("sse9")


def test_gpu_table() -> None:
  assert gpu_target("sm_90").warp_size == 32 and gpu_target("gfx942").warp_size == 64
  assert gpu_target("gfx1100").shared_memory_bytes == 64 << 10
  for arch, target in GPU_TARGETS.items():
    assert target.is_gpu and target.arch == arch and target.max_threads_per_block >= 256
    assert {"sqrt", "trunc"} <= target.native_math and "sin" not in target.native_math
  with pytest.raises(ValueError, match="unknown GPU architecture 'sm_1'.*sm_90"): gpu_target("sm_1")
