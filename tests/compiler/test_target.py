"""Targets: the host CPU (optionally limited to a feature set) and the GPU table."""
import llvmlite.binding as llvm
import pytest

from rawgrad.compiler.target import GPU_TARGETS, cache_geometry, gpu_target, host_target

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


@pytest.mark.parametrize("features, fma_units", [(SAPPHIRE_RAPIDS, 2), (ZEN3, 2), (NEHALEM, 1)])
def test_fma_units_follow_the_features(cpu_features, features, fma_units) -> None:
  cpu_features(features)
  assert host_target("native").fma_units == fma_units


def test_forcing_avx2_switches_off_every_avx512_feature(cpu_features) -> None:
  """Any AVX-512 feature left on (Zen 5's avx512vp2intersect, say) makes LLVM turn AVX-512 back on: zmm instructions
  an AVX2 machine lacks, and 32 vector registers in the measurements that stand for one."""
  cpu_features({**SAPPHIRE_RAPIDS, "avx512vp2intersect": True, "avx10.1-256": True, "amx-int8": True, "gfni": True})
  flags = set(host_target("avx2").features.split(","))
  assert {"-avx512vp2intersect", "-avx10.1-256", "-amx-int8", "+gfni", "+avx2"} <= flags, flags
  assert not any(flag.startswith("+avx512") for flag in flags)


def test_an_avx2_kernel_uses_only_avx2_registers() -> None:
  """On this host, whatever it has: no zmm register, no ymm16-31, no mask register (EVEX) in a kernel compiled for
  CPU_ISA=avx2."""
  import re

  from rawgrad import Tensor
  from rawgrad.compiler.codegen.lower import lower_kernel
  from rawgrad.compiler.rangeify import create_schedule
  from rawgrad.compiler.render.llvmir import LLVMRenderer
  from rawgrad.runtime.compile import LLVMCompiler
  if not host_target("native").features.count("+avx2"): pytest.skip("the host has no AVX2")
  target = host_target("avx2")
  # a convolution vectorized along its output channels: its stores scatter the lanes, which LLVM shuffles
  item = create_schedule([Tensor.empty(4, 8, 12, 12).conv2d(Tensor.empty(32, 8, 5, 5)).uop]).items[-1]
  source = LLVMRenderer().render(item.ast.arg, lower_kernel(item.ast, None, target).program)
  assembly = LLVMCompiler(target).assembly(source)
  assert "ymm" in assembly and not re.search(r"zmm|ymm(1[6-9]|2\d|3[01])|%k[1-7]", assembly)


def test_cpu_isa_in_the_environment_forces_the_feature_set(cpu_features, monkeypatch: pytest.MonkeyPatch) -> None:
  cpu_features(SAPPHIRE_RAPIDS)
  monkeypatch.setenv("CPU_ISA", "avx2")
  assert (host_target().vector_bytes, host_target().vector_registers) == (32, 16)
  host_target.cache_clear()
  monkeypatch.setenv("CPU_ISA", "native")
  assert (host_target().vector_bytes, host_target().vector_registers) == (64, 32)


def _cache_entry(root, name: str, level: int, kind: str, size: str, ways: int) -> None:
  entry = root / name
  entry.mkdir()
  for field, value in (("level", level), ("type", kind), ("size", size), ("ways_of_associativity", ways)):
    (entry / field).write_text(f"{value}\n")


def test_cache_geometry_reads_sysfs(tmp_path) -> None:
  _cache_entry(tmp_path, "index0", 1, "Data", "48K", 12)
  _cache_entry(tmp_path, "index1", 1, "Instruction", "32K", 8)
  _cache_entry(tmp_path, "index2", 2, "Unified", "2048K", 16)
  _cache_entry(tmp_path, "index3", 3, "Unified", "32M", 16)
  (tmp_path / "uevent").write_text("")  # sysfs lists files beside the index folders
  assert cache_geometry(str(tmp_path)) == {"l1_bytes": 48 << 10, "l1_ways": 12, "l2_bytes": 2 << 20}
  assert cache_geometry(str(tmp_path / "missing")) == {"l1_bytes": 32 << 10, "l1_ways": 8, "l2_bytes": 1 << 20}


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


def test_argument_limits_come_from_the_target_and_the_environment(cpu_features,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.delenv("KERNARG_BYTES", raising=False)
  cpu_features(ZEN3)
  assert host_target().kernarg_bytes == 8 * 16  # x86-64's general-purpose registers, 8 bytes each
  assert gpu_target("sm_90").kernarg_bytes == gpu_target("gfx1100").kernarg_bytes == 4096
  monkeypatch.setenv("KERNARG_BYTES", "24")
  host_target.cache_clear()
  assert host_target().kernarg_bytes == gpu_target("sm_90").kernarg_bytes == 24
