"""What a device is, for codegen: every number a heuristic or a renderer needs about the chip.

Heuristics read these numbers and never assume a chip. The CPU target is built from the host (llvmlite's CPU name
and features), optionally forced to another feature set with CPU_ISA=avx2|avx512|native; GPU targets come from the
table below, keyed by architecture. KERNARG_BYTES=n sets every target's kernel-argument limit (tests force the
argument-table path with a low one).
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field, replace

from rawgrad.helpers import cpu_threads


@dataclass(frozen=True)
class Target:
  kind: str                  # "cpu", "nv" or "amd"
  arch: str                  # "x86_64", "aarch64", "sm_90", "gfx1100", ...
  triple: str                # the LLVM target triple
  cpu: str                   # the LLVM CPU name ("sapphirerapids", "sm_90", "gfx1100")
  features: str = ""         # the LLVM feature string
  vector_bytes: int = 16     # the widest vector one instruction computes (CPU) or one thread loads (GPU)
  vector_registers: int = 16  # architectural vector registers (CPU); unused on GPUs
  fma_units: int = 2         # vector multiply-add instructions a CPU core starts per cycle
  fma_latency: int = 4       # cycles before a multiply-add's result can feed the next one
  registers_per_thread: int = 255  # GPU registers a thread may use
  l1_bytes: int = 32 << 10
  l1_ways: int = 8           # associativity of the L1 data cache: lines of one set it holds at once
  l2_bytes: int = 1 << 20
  shared_memory_bytes: int = 0     # per block (GPU shared memory / LDS); 0 on the CPU
  warp_size: int = 1               # threads that run in lockstep (1 on the CPU)
  max_threads_per_block: int = 1
  max_grid: tuple[int, int, int] = (1, 1, 1)
  threads_in_flight: int = 1       # threads the whole chip runs at once (GPUs: SMs/CUs x resident threads each; the
                                   # CPU: the runtime's threads, one per core)
  kernarg_bytes: int = 1 << 16     # bytes of kernel arguments a launch passes; past them, an argument table
  native_math: frozenset[str] = field(default_factory=frozenset)  # unary ops the target computes itself

  @property
  def is_gpu(self) -> bool:
    return self.kind in ("nv", "amd")

  def __repr__(self) -> str:
    return f"Target({self.kind}, {self.arch}, {self.cpu}{', ' + self.features if self.features else ''})"


# *** GPUs ***

# GPUs have correctly rounded square roots and truncation; exp2, log2 and sin come from the shared math rules (their
# hardware versions are approximations)
_GPU_MATH = frozenset({"sqrt", "trunc"})
_NV_COMMON = dict(kind="nv", triple="nvptx64-nvidia-cuda", vector_bytes=16, registers_per_thread=255, warp_size=32,
                  max_threads_per_block=1024, max_grid=(2**31 - 1, 65535, 65535), kernarg_bytes=4096,
                  native_math=_GPU_MATH)
_AMD_COMMON = dict(kind="amd", triple="amdgcn-amd-amdhsa", vector_bytes=16, registers_per_thread=256,
                   max_threads_per_block=1024, max_grid=(2**31 - 1, 65535, 65535), kernarg_bytes=4096,
                   native_math=_GPU_MATH)

GPU_TARGETS: dict[str, Target] = {
  # PTX ISA 8.0 is the first to know sm_90; 7.x covers Ampere and Ada
  # H100 SXM (132 SMs x 2048 threads), RTX 4090 (128 x 1536), A100 (108 x 2048)
  "sm_90": Target(arch="sm_90", cpu="sm_90", features="+ptx80", l1_bytes=256 << 10, l2_bytes=50 << 20,
                  shared_memory_bytes=48 << 10, threads_in_flight=132 * 2048, **_NV_COMMON),
  "sm_89": Target(arch="sm_89", cpu="sm_89", features="+ptx78", l1_bytes=128 << 10, l2_bytes=72 << 20,
                  shared_memory_bytes=48 << 10, threads_in_flight=128 * 1536, **_NV_COMMON),
  "sm_80": Target(arch="sm_80", cpu="sm_80", features="+ptx70", l1_bytes=192 << 10, l2_bytes=40 << 20,
                  shared_memory_bytes=48 << 10, threads_in_flight=108 * 2048, **_NV_COMMON),
  # RDNA3 runs wave32; CDNA3 (MI300) runs wave64 and has 64 KiB of LDS per workgroup
  # RX 7900 XTX (96 CUs x 16 waves of 32), MI300X (304 CUs x 32 waves of 64)
  "gfx1100": Target(arch="gfx1100", cpu="gfx1100", l1_bytes=32 << 10, l2_bytes=6 << 20, shared_memory_bytes=64 << 10,
                    warp_size=32, threads_in_flight=96 * 512, **_AMD_COMMON),
  "gfx942": Target(arch="gfx942", cpu="gfx942", l1_bytes=32 << 10, l2_bytes=4 << 20, shared_memory_bytes=64 << 10,
                   warp_size=64, threads_in_flight=304 * 2048, **_AMD_COMMON),
}


def gpu_target(arch: str) -> Target:
  if arch not in GPU_TARGETS:
    raise ValueError(f"unknown GPU architecture {arch!r}; known: {', '.join(sorted(GPU_TARGETS))}")
  return _argument_limit(GPU_TARGETS[arch])


def _argument_limit(target: Target) -> Target:
  """KERNARG_BYTES in the environment sets the argument limit (a low one sends every kernel's arguments through its
  argument table, to test that path)."""
  if (limit := os.environ.get("KERNARG_BYTES")) is None: return target
  return replace(target, kernarg_bytes=int(limit))


# *** the host CPU ***

# x86 feature sets a machine can be forced to: what is switched off for AVX2, every feature these begin a name of
# (any one left on, avx512vp2intersect say, makes LLVM turn AVX-512 back on, its 32 registers and zmm instructions)
_AVX512_PREFIXES = ("avx512", "avx10", "evex512", "amx", "egpr", "apxf")


def _forced_features(features: dict[str, bool], isa: str) -> dict[str, bool]:
  """The host's features limited to an instruction set (it can only be lowered, never raised)."""
  if isa == "native": return features
  if isa == "avx2":
    if not features.get("avx2"): raise ValueError("CPU_ISA=avx2 needs a CPU with AVX2")
    return {name: on and not name.startswith(_AVX512_PREFIXES) for name, on in features.items()}
  if isa == "avx512":
    if not features.get("avx512f"): raise ValueError("CPU_ISA=avx512 needs a CPU with AVX-512")
    return features
  raise ValueError(f"CPU_ISA must be native, avx2 or avx512, not {isa!r}")


@functools.cache
def host_target(isa: str | None = None) -> Target:
  """The CPU this process runs on, limited to the instruction set `isa` (CPU_ISA by default: native, avx2, avx512)."""
  import llvmlite.binding as llvm
  isa = isa or os.environ.get("CPU_ISA", "native") or "native"
  features = _forced_features(dict(llvm.get_host_cpu_features()), isa)
  flattened = ",".join(("+" if on else "-") + name for name, on in sorted(features.items()))
  machine = llvm.get_process_triple().split("-")[0]
  if features.get("avx512f"): vector_bytes, registers = 64, 32
  elif features.get("avx2") or features.get("avx"): vector_bytes, registers = 32, 16
  elif machine == "aarch64": vector_bytes, registers = 16, 32
  else: vector_bytes, registers = 16, 16
  # the argument limit: a kernel keeps its argument words (buffer addresses, variable values) in general-purpose
  # registers, 16 on x86-64 and 31 on ARM64; past them, the words are copied from the argument block to the stack in
  # every slice's prologue and reloaded where they are used, while a kernel with an argument table loads each word
  # from the table where it uses it (with no copy)
  general_registers = 31 if machine == "aarch64" else 16
  # every x86 core with FMA (Haswell and Zen on) and every 64-bit ARM core starts two vector multiply-adds a cycle;
  # LLVM knows each CPU's pipes but llvmlite does not expose its scheduling model
  fma_units = 2 if features.get("fma") or machine == "aarch64" else 1
  caches = cache_geometry()
  target = Target(kind="cpu", arch=machine, triple=llvm.get_process_triple(), cpu=llvm.get_host_cpu_name(),
                  features=flattened, vector_bytes=vector_bytes, vector_registers=registers, fma_units=fma_units,
                  l1_bytes=caches["l1_bytes"], l1_ways=caches["l1_ways"], l2_bytes=caches["l2_bytes"],
                  threads_in_flight=cpu_threads(), kernarg_bytes=8 * general_registers,
                  native_math=frozenset({"sqrt", "trunc", "sin"}))
  return _argument_limit(target)


def cache_geometry(root: str = "/sys/devices/system/cpu/cpu0/cache") -> dict[str, int]:
  """The L1 data cache's size and ways and the L2 cache's size, for cpu0 from sysfs (typical values where it says
  nothing)."""
  geometry = {"l1_bytes": 32 << 10, "l1_ways": 8, "l2_bytes": 1 << 20}
  try:
    for entry in sorted(name for name in os.listdir(root) if name.startswith("index")):
      level, kind = int(_read(f"{root}/{entry}/level")), _read(f"{root}/{entry}/type")
      if level not in (1, 2) or kind not in ("Data", "Unified"): continue
      text = _read(f"{root}/{entry}/size")
      geometry[f"l{level}_bytes"] = int(text[:-1]) << (10 if text[-1] == "K" else 20) if text[-1] in "KM" else int(text)
      if level == 1: geometry["l1_ways"] = int(_read(f"{root}/{entry}/ways_of_associativity"))
  except (OSError, ValueError):
    pass
  return geometry


def _read(path: str) -> str:
  with open(path) as f: return f.read().strip()

