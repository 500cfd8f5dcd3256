#!/usr/bin/env python3
"""Regenerate rawgrad/autogen/ from the real C headers.

    make autogen                      # installs the autogen extra (libclang), then runs:
    python tools/autogen.py nv        # writes rawgrad/autogen/nv/*.py and layouts.json
    python tools/autogen.py amd       # writes rawgrad/autogen/amd/*.py and layouts.json

NVIDIA: nothing is downloaded. The headers come from local git copies (bare or checkouts) of
NVIDIA/open-gpu-kernel-modules (tag 580.142, the branch the lent H100 runs) and NVIDIA/open-gpu-doc
(class and QMD headers the kernel modules do not carry). Get them once with
`git clone --bare https://github.com/NVIDIA/<repo>` (in an agent session: the `fetch` tool on
github:NVIDIA/open-gpu-kernel-modules and github:NVIDIA/open-gpu-doc), then point --nvidia-src /
--gpu-doc-src (or $RAWGRAD_NVIDIA_SRC / $RAWGRAD_GPU_DOC_SRC) at them; the fetch tool's mirror is found
without either. Headers are read into a temporary directory and never committed.

AMD: the headers come from Debian packages: kfd_ioctl.h from linux-libc-dev, the HSA/AQL headers from
libhsa-runtime-dev, the SDMA and PM4 packet headers from the tarball in linux-source-6.1, the kernel descriptor from
LLVM's AMDHSAKernelDescriptor.h in llvm-14-dev (C++: read in C++ mode). Each is taken from the installed package when
it is there (CI: `apt-get install linux-libc-dev libhsa-runtime-dev linux-source-6.1 llvm-14-dev`), else from a .deb
named by --<package>-deb, else from the .deb `apt-get download` fetches. SDMA fields, which the headers
spell as NAME_offset / NAME_mask / NAME_shift, also become NAME = (hi, lo) over the whole packet.

How it works: libclang parses one translation unit per output module; structures and unions become
ctypes classes, enumerators and #define macros that are integer constant expressions become integers,
`hi:lo` (and `MW(hi:lo)`) field macros become (hi, lo) tuples, and function-like macros of plain
arithmetic become Python functions. The values come from gcc: a generated C probe includes the same
headers and prints every constant, every structure's sizeof and every field's offset. The offsets
are saved in layouts.json, which tests/autogen checks the ctypes classes against.
"""
from __future__ import annotations

import argparse
import importlib.util
import io
import json
import os
import platform
import re
import subprocess
import sys
import tarfile
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

try:
  from clang import cindex
except ImportError:  # tests import this file for its pure helpers; generating needs libclang
  cindex = None

REPO_ROOT = Path(__file__).resolve().parent.parent


class AutogenError(Exception):
  pass


# ---------------------------------------------------------------------------------------------
# Sources: header trees read out of a git repository at a pinned revision
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Repository:
  name: str                      # owner/name on GitHub
  option: str                    # command-line option naming the local copy
  rev_option: str
  env: str                       # environment variable naming the local copy
  default_rev: str
  known_copies: tuple[str, ...]  # where the fetch tool leaves its mirror
  subtrees: tuple[str, ...]      # directories the headers are read from

  @property
  def short_name(self) -> str:
    return self.name.split("/")[1]

  def describe(self, rev: str, commit: str) -> str:
    return f"{self.name} {rev} (commit {commit})"


NVIDIA_KERNEL = Repository(
    "NVIDIA/open-gpu-kernel-modules", "--nvidia-src", "--nvidia-rev", "RAWGRAD_NVIDIA_SRC", "580.142",
    ("/work/.mirror/NVIDIA+open-gpu-kernel-modules/repo",),
    ("src/common/sdk/nvidia/inc", "src/common/inc", "src/nvidia/arch/nvalloc/unix/include",
     "kernel-open/common/inc", "kernel-open/nvidia-uvm"))
NVIDIA_DOC = Repository(
    "NVIDIA/open-gpu-doc", "--gpu-doc-src", "--gpu-doc-rev", "RAWGRAD_GPU_DOC_SRC",
    "c8607fe576b53ff821ffcf97e7548d2de11c4eaf",  # 2025-07-18: adds the Hopper/Blackwell copy classes
    ("/work/.mirror/NVIDIA+open-gpu-doc/repo",),
    ("classes/compute", "classes/dma-copy", "classes/host"))


def git_dir(path: Path) -> Path | None:
  """The git directory of a bare repository or of a checkout at `path`, or None."""
  for candidate in (path / ".git", path):
    if (candidate / "objects").is_dir() and (candidate / "HEAD").is_file():
      return candidate
  return None


def missing_source_message(repo: Repository, looked_at: list[str]) -> str:
  return (f"no git copy of {repo.name} found (looked at: {', '.join(looked_at) or 'nothing'}).\n"
          f"This tool downloads nothing. Make a copy first:\n"
          f"  git clone --bare https://github.com/{repo.name} <dir>\n"
          f"(in an agent session: the fetch tool on github:{repo.name}), then pass {repo.option} <dir> "
          f"or set ${repo.env}.")


def locate(repo: Repository, given: str | None) -> Path:
  """The git directory holding `repo`: the option, else the environment, else a known mirror."""
  if given:
    candidates = [given]
  else:
    candidates = [os.environ[repo.env]] if os.environ.get(repo.env) else list(repo.known_copies)
  for candidate in candidates:
    if (found := git_dir(Path(candidate))) is not None:
      return found
  raise AutogenError(missing_source_message(repo, candidates))


def git(gdir: Path, *args: str) -> bytes:
  proc = subprocess.run(["git", "--git-dir", str(gdir), *args], capture_output=True)
  if proc.returncode != 0:
    raise AutogenError(f"git {' '.join(args)} in {gdir} failed: {proc.stderr.decode().strip()}")
  return proc.stdout


def extract(repo: Repository, gdir: Path, rev: str, dest: Path) -> str:
  """Write `repo`'s header subtrees at `rev` under dest/<short name>; return the commit."""
  try:
    commit = git(gdir, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").decode().strip()
  except AutogenError:
    raise AutogenError(f"{repo.name}: revision {rev!r} is not in {gdir}; fetch it there "
                       f"(git fetch --tags) or pass another {repo.rev_option}") from None
  archive = git(gdir, "archive", "--format=tar", commit, "--", *repo.subtrees)
  with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
    tar.extractall(dest / repo.short_name, filter="data")
  return commit


# ---------------------------------------------------------------------------------------------
# Sources for AMD: Debian packages, as installed or fetched with `apt-get download`
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DebianPackage:
  name: str                      # the package, as apt names it
  option: str                    # command-line option naming a local .deb of it
  files: tuple[str, ...]         # the headers to take: paths inside the package, or inside its tarball
  tarball: str = ""              # a tarball inside the package that holds the files (linux-source)

  @property
  def short_name(self) -> str:
    return self.name

  def describe(self, version: str, origin: str) -> str:
    return f"{self.name} {version} (Debian package)"


@dataclass(frozen=True)
class StubHeaders:
  """Headers we write ourselves where the real one would pull in a tree nothing here needs."""
  short_name: str
  files: tuple[tuple[str, str], ...]   # (path, text)

  @property
  def name(self) -> str:
    return f"rawgrad {self.short_name}"

  def describe(self, version: str, origin: str) -> str:
    return f"{self.name} (written by tools/autogen.py)"


Source = Repository | DebianPackage | StubHeaders


def run_tool(command: list[str], what: str, cwd: Path | None = None) -> str:
  proc = subprocess.run(command, capture_output=True, text=True, cwd=cwd)
  if proc.returncode != 0:
    raise AutogenError(f"{what}: `{' '.join(command)}` failed: {proc.stderr.strip()[:2000]}")
  return proc.stdout


def installed_version(package: DebianPackage) -> str | None:
  """The installed version, or None unless the package and every file it is to give are on this machine."""
  proc = subprocess.run(["dpkg-query", "-W", "-f=${Status}\t${Version}", package.name], capture_output=True,
                        text=True)
  if proc.returncode != 0 or not proc.stdout.startswith("install ok installed"):
    return None
  needed = [package.tarball] if package.tarball else list(package.files)
  return proc.stdout.split("\t")[1] if all((Path("/") / f).is_file() for f in needed) else None


def unpack_deb(package: DebianPackage, deb: Path, work: Path) -> tuple[Path, str]:
  """(the directory the .deb is unpacked into, its version)."""
  root = work / f"{package.name}-deb"
  run_tool(["dpkg-deb", "-x", str(deb), str(root)], f"unpacking {deb}")
  version = run_tool(["dpkg-deb", "-f", str(deb), "Version"], f"reading the version of {deb}").strip()
  return root, version


def package_root(package: DebianPackage, given: Path | None, work: Path) -> tuple[Path, str, str]:
  """(where the package's files lie, its version, where they came from): a given .deb, the installed package, or
  the .deb `apt-get download` fetches."""
  if given is not None:
    return (*unpack_deb(package, given, work), str(given))
  if (version := installed_version(package)) is not None:
    return Path("/"), version, "installed"
  downloads = work / "downloads"
  downloads.mkdir(exist_ok=True)
  run_tool(["apt-get", "download", package.name], f"{package.name} is not installed", cwd=downloads)
  deb = next(downloads.glob(f"{package.name}_*.deb"))
  return (*unpack_deb(package, deb, work), "apt-get download")


def take_package(package: DebianPackage, given: Path | None, work: Path, tree: Path) -> tuple[str, str]:
  """Copy the package's header files to tree/<package>/<path>; returns (version, origin)."""
  root, version, origin = package_root(package, given, work)
  dest = tree / package.short_name
  if package.tarball:
    top = tarball_top_directory(root / package.tarball)
    members = [f"{top}/{f}" for f in package.files]
    run_tool(["tar", "-xf", str(root / package.tarball), "-C", str(work), *members],
             f"extracting headers from {package.tarball}")
    sources = {f: work / top / f for f in package.files}
  else:
    sources = {f: root / f for f in package.files}
  for path, source in sources.items():
    if not source.is_file():
      raise AutogenError(f"{package.name} {version} ({origin}) has no {path}")
    (dest / path).parent.mkdir(parents=True, exist_ok=True)
    (dest / path).write_bytes(source.read_bytes())
  return version, origin


def tarball_top_directory(tarball: Path) -> str:
  """The directory a source tarball unpacks into (linux-source-6.1), from its first member."""
  with tarfile.open(tarball) as archive:
    first = archive.next()
  if first is None:
    raise AutogenError(f"{tarball} is empty")
  return first.name.split("/")[0]


def write_stubs(stubs: StubHeaders, tree: Path) -> None:
  for path, text in stubs.files:
    (tree / stubs.short_name / path).parent.mkdir(parents=True, exist_ok=True)
    (tree / stubs.short_name / path).write_text(text)


# ---------------------------------------------------------------------------------------------
# What to generate: one module per translation unit, from an explicit list of headers
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Header:
  repo: Source
  path: str                      # inside the repository (or package)
  only: tuple[str, ...] = ()     # name prefixes to keep (structures and constants); empty keeps all
  enums: tuple[str, ...] = ()    # keep only the enumerators of these enum types (huge register headers)


@dataclass(frozen=True)
class Module:
  name: str
  doc: str
  include_dirs: tuple[tuple[Source, str], ...]
  headers: tuple[Header, ...]
  preamble: str = '#include "nvtypes.h"'  # class headers use NvU32 without including nvtypes.h
  mask_ranges: bool = False      # NAME_offset/_mask/_shift families also become NAME = (hi, lo) over the packet
  words32: bool = False          # constants and functions are 32-bit words: C's negative int is read unsigned
  language: str = "c"            # "c++": structures and enumerators (in namespaces too); macros are not read


SDK = "src/common/sdk/nvidia/inc"
UNIX = "src/nvidia/arch/nvalloc/unix/include"
UVM = "kernel-open/nvidia-uvm"
COMMON = "kernel-open/common/inc"


def sdk(*paths: str, only: tuple[str, ...] = ()) -> tuple[Header, ...]:
  return tuple(Header(NVIDIA_KERNEL, f"{SDK}/{path}", only) for path in paths)


def doc(*paths: str) -> tuple[Header, ...]:
  return tuple(Header(NVIDIA_DOC, f"classes/{path}") for path in paths)


NV_MODULES = (
    Module(
        "nv_rm", "RM (resource manager) API: escapes on /dev/nvidiactl, NVOS parameter structures, "
        "allocation parameters of the classes a driver allocates, control calls, status codes.",
        ((NVIDIA_KERNEL, SDK), (NVIDIA_KERNEL, UNIX), (NVIDIA_KERNEL, "src/common/inc")),
        (Header(NVIDIA_KERNEL, f"{UNIX}/nv-ioctl-numbers.h"), Header(NVIDIA_KERNEL, f"{UNIX}/nv_escape.h"),
         Header(NVIDIA_KERNEL, f"{UNIX}/nv-ioctl.h"), Header(NVIDIA_KERNEL, f"{UNIX}/nv-unix-nvos-params-wrappers.h"))
        + sdk("nvstatus.h", "nvlimits.h", "nvgputypes.h", "nvos.h", "alloc/alloc_channel.h")
        # object classes (engine classes with methods are in nv_classes)
        + sdk("class/cl0000.h", "class/cl0005.h", "class/cl003e.h", "class/cl0040.h", "class/cl0070.h",
              "class/cl0071.h", "class/cl0080.h", "class/cl2080.h", "class/cl2080_notification.h",
              "class/cl50a0.h", "class/cl84a0.h", "class/cl90f1.h", "class/cl9067.h", "class/cla06c.h",
              "class/cl00c2.h", "class/cl00f8.h", "class/cl00fd.h", "class/cl00de.h")
        # control calls: ids, parameter structures, their field values
        + sdk("ctrl/ctrlxxxx.h", "ctrl/ctrl0000/ctrl0000base.h", "ctrl/ctrl0000/ctrl0000client.h",
              "ctrl/ctrl0000/ctrl0000gpu.h", "ctrl/ctrl0000/ctrl0000system.h",
              "ctrl/ctrl0080/ctrl0080base.h", "ctrl/ctrl0080/ctrl0080gpu.h", "ctrl/ctrl0080/ctrl0080fifo.h",
              "ctrl/ctrl0080/ctrl0080dma.h", "ctrl/ctrl0080/ctrl0080fb.h", "ctrl/ctrl0080/ctrl0080host.h",
              "ctrl/ctrl0080/ctrl0080gr.h", "ctrl/ctrl0080/ctrl0080bif.h",
              "ctrl/ctrl2080/ctrl2080base.h", "ctrl/ctrl2080/ctrl2080gpu.h", "ctrl/ctrl2080/ctrl2080gr.h",
              "ctrl/ctrl2080/ctrl2080fb.h", "ctrl/ctrl2080/ctrl2080perf.h", "ctrl/ctrl2080/ctrl2080tmr.h",
              "ctrl/ctrl2080/ctrl2080mc.h", "ctrl/ctrl2080/ctrl2080bus.h", "ctrl/ctrl2080/ctrl2080fifo.h",
              "ctrl/ctrl2080/ctrl2080ce.h", "ctrl/ctrl2080/ctrl2080event.h", "ctrl/ctrl906f.h",
              "ctrl/ctrla06c.h", "ctrl/ctrla06f/ctrla06fbase.h", "ctrl/ctrla06f/ctrla06fgpfifo.h",
              "ctrl/ctrlc36f.h", "ctrl/ctrl90f1.h")),
    Module(
        "nv_uvm", "UVM ioctls on /dev/nvidia-uvm: the request is the raw number (UVM_INITIALIZE, ...), "
        "the argument its _PARAMS structure.",
        ((NVIDIA_KERNEL, UVM), (NVIDIA_KERNEL, COMMON)),
        (Header(NVIDIA_KERNEL, f"{UVM}/uvm_ioctl.h"), Header(NVIDIA_KERNEL, f"{UVM}/uvm_linux_ioctl.h"),
         Header(NVIDIA_KERNEL, f"{UVM}/uvm_types.h"), Header(NVIDIA_KERNEL, f"{COMMON}/nv_uvm_user_types.h"))),
    Module(
        "nv_classes", "Engine classes: GPFIFO channel methods and entries (host), usermode doorbells, "
        "compute and copy-engine methods, for Volta through Blackwell.",
        ((NVIDIA_KERNEL, SDK),),
        # channels and usermode from the kernel modules (open-gpu-doc stops at clc76f); compute and copy
        # from open-gpu-doc, whose clcbc0.h/clc8b5.h have the methods the kernel modules' copies lack
        # (Hopper's clc86f.h has no pushbuffer-header encoding: NVC56F_DMA_* is the same format)
        sdk("class/cl906f.h", "class/cl906fsw.h", "class/cla06fsubch.h", "class/clc36f.h", "class/clc36fsw.h",
            "class/clc46f.h", "class/clc56f.h", "class/clc56fsw.h", "class/clc86f.h", "class/clc86fsw.h",
            "class/clc96f.h", "class/clca6f.h", "class/clc361.h", "class/clc461.h", "class/clc561.h",
            "class/clc661.h", "class/clc761.h")
        + doc("compute/clc6c0.h", "compute/clc7c0.h", "compute/clc9c0.h", "compute/clcbc0.h",
              "compute/clcdc0.h", "compute/clcec0.h", "dma-copy/clc5b5.h", "dma-copy/clc6b5.h",
              "dma-copy/clc7b5.h", "dma-copy/clc8b5.h", "dma-copy/clc9b5.h", "dma-copy/clcab5.h")),
    Module(
        "nv_qmd", "Queue meta data (compute launch descriptor) layouts as (hi, lo) bit ranges over the QMD, "
        "per compute class and version: Ampere (clc6c0qmd.h, clc7c0qmd.h: V02_03, V02_04, V03_00), Ada "
        "(clc9c0qmd.h: V02_04, V03_00), Hopper (clcbc0qmd.h: V03_00, V04_00; Mesa's NVK launches V04_00 on "
        "Hopper), Blackwell (clcdc0qmd.h, clcec0qmd.h: V04_01, V05_00, V05_01).",
        ((NVIDIA_KERNEL, SDK),),
        doc("compute/clc6c0qmd.h", "compute/clc7c0qmd.h", "compute/clc9c0qmd.h", "compute/clcbc0qmd.h",
            "compute/clcdc0qmd.h", "compute/clcec0qmd.h"),
        # QMD fields are written MW(hi:lo); the macro is left to the user, the identity keeps hi:lo
        preamble='#include "nvtypes.h"\n#ifndef MW\n#define MW(x) x\n#endif'),
)


AMDGPU = "drivers/gpu/drm/amd/amdgpu"
AMD_INCLUDE = "drivers/gpu/drm/amd/include"
LINUX_LIBC_DEV = DebianPackage("linux-libc-dev", "--linux-libc-dev-deb", ("usr/include/linux/kfd_ioctl.h",))
HSA_RUNTIME_DEV = DebianPackage(
    "libhsa-runtime-dev", "--hsa-runtime-dev-deb",
    tuple(f"usr/include/hsa/{name}.h" for name in ("hsa", "amd_hsa_common", "amd_hsa_queue", "amd_hsa_signal",
                                                   "amd_hsa_kernel_code", "hsa_ven_amd_aqlprofile")))
LINUX_SOURCE = DebianPackage(
    "linux-source-6.1", "--linux-source-deb",
    (f"{AMDGPU}/vega10_sdma_pkt_open.h", f"{AMDGPU}/sdma_v6_0_0_pkt_open.h", f"{AMDGPU}/soc15d.h", f"{AMDGPU}/nvd.h",
     f"{AMD_INCLUDE}/vega10_enum.h", f"{AMD_INCLUDE}/soc21_enum.h", f"{AMD_INCLUDE}/asic_reg/gc/gc_9_4_2_sh_mask.h",
     f"{AMD_INCLUDE}/asic_reg/gc/gc_11_0_0_sh_mask.h"),
    tarball="usr/src/linux-source-6.1.tar.xz")
LLVM_INCLUDE = "usr/include/llvm-14"
LLVM_DEV = DebianPackage("llvm-14-dev", "--llvm-dev-deb", (f"{LLVM_INCLUDE}/llvm/Support/AMDHSAKernelDescriptor.h",))
AMD_PACKAGES = (LINUX_LIBC_DEV, HSA_RUNTIME_DEV, LINUX_SOURCE, LLVM_DEV)
# kfd_ioctl.h includes <drm/drm.h> for the __u32 family alone; libdrm's full header is not needed for that
AMD_STUBS = StubHeaders("stubs", (("drm/drm.h", "/* rawgrad autogen stub: kfd_ioctl.h needs only the __u* types */\n"
                                                "#include <linux/types.h>\n"),))
HSA_INCLUDE = "usr/include/hsa"


def hsa(name: str, only: tuple[str, ...] = ()) -> Header:
  return Header(HSA_RUNTIME_DEV, f"{HSA_INCLUDE}/{name}.h", only)


def sdma_module(name: str, header: str, chips: str) -> Module:
  return Module(
      name, f"SDMA (system DMA engine) packets for {chips}: opcodes, and each packet field as NAME_offset (its dword), "
      "NAME_mask and NAME_shift as the header spells them, plus NAME = (hi, lo): the field's bits counted over the "
      "whole packet (dword NAME_offset holds bits 32*offset .. 32*offset+31).",
      ((LINUX_SOURCE, AMDGPU),), (Header(LINUX_SOURCE, f"{AMDGPU}/{header}"),), preamble="", mask_ranges=True,
      words32=True)


def pm4_module(name: str, header: str, enums: str, registers: str, chips: str) -> Module:
  return Module(
      name, f"PM4 type-3 packets of the command processor for {chips}: opcodes (PACKET3_*), the header builder "
      "PACKET3(op, count), field builders of an index (DATA_SEL(x) = x << 29 ...), the event types "
      "(VGT_EVENT_TYPE) RELEASE_MEM and EVENT_WRITE take, and the scratch ring register's fields "
      "(COMPUTE_TMPRING_SIZE, which an AQL queue's amd_queue_t carries for the CP).",
      ((LINUX_SOURCE, AMDGPU), (LINUX_SOURCE, AMD_INCLUDE)),
      (Header(LINUX_SOURCE, f"{AMDGPU}/{header}"),
       Header(LINUX_SOURCE, f"{AMD_INCLUDE}/{enums}", enums=("VGT_EVENT_TYPE",)),
       Header(LINUX_SOURCE, f"{AMD_INCLUDE}/asic_reg/gc/{registers}", only=("COMPUTE_TMPRING_SIZE__",))),
      preamble="", words32=True)


AMD_MODULES = (
    Module(
        "kfd", "KFD (the amdkfd kernel driver's /dev/kfd) ioctls: AMDKFD_IOC_* request numbers, their argument "
        "structures, memory allocation flags, queue types, event types and wait results.",
        ((AMD_STUBS, ""), (LINUX_LIBC_DEV, "usr/include")),
        (Header(LINUX_LIBC_DEV, "usr/include/linux/kfd_ioctl.h"),), preamble="", words32=True),
    Module(
        "hsa", "HSA architected queuing language (AQL): packet headers and types, kernel dispatch and barrier "
        "packets, fence scopes, queues; AMD's signal (amd_signal_t: what a completion signal handle points at) "
        "and queue (amd_queue_t) structures; the compute program resource and kernel code property bits of the "
        "kernel descriptor; the vendor-specific AQL packet that carries PM4 commands.",
        ((HSA_RUNTIME_DEV, HSA_INCLUDE),),
        (hsa("hsa", only=("hsa_signal_t", "hsa_queue_t", "hsa_kernel_dispatch_packet", "hsa_agent_dispatch_packet",
                          "hsa_barrier_and_packet", "hsa_barrier_or_packet", "HSA_PACKET_", "HSA_FENCE_SCOPE",
                          "HSA_QUEUE_TYPE", "HSA_QUEUE_FEATURE", "HSA_KERNEL_DISPATCH_PACKET_SETUP")),
         hsa("amd_hsa_common", only=("AMD_HSA",)), hsa("amd_hsa_queue"), hsa("amd_hsa_signal"),
         hsa("amd_hsa_kernel_code"),
         # the vendor-specific AQL packet that carries PM4 (signals, waits and timestamps ride in it)
         hsa("hsa_ven_amd_aqlprofile", only=("hsa_ext_amd_aql_pm4_packet_t",))), preamble=""),
    Module(
        "kernel_descriptor", "The code object (v3 and later) kernel descriptor an AQL dispatch's kernel_object points "
        "at (kernel_descriptor_t, 64 bytes), and its bit fields: COMPUTE_PGM_RSRC1/2/3 and KERNEL_CODE_PROPERTY_* "
        "(each NAME, NAME_SHIFT, NAME_WIDTH). From LLVM's AMDGPU support header, the one definition of the layout "
        "(C++: read as C++, no macros taken).",
        ((LLVM_DEV, LLVM_INCLUDE),), (Header(LLVM_DEV, f"{LLVM_INCLUDE}/llvm/Support/AMDHSAKernelDescriptor.h"),),
        preamble="", language="c++"),
    sdma_module("sdma_v4", "vega10_sdma_pkt_open.h", "SDMA 4.x (gfx9: Vega, MI100-MI300, so gfx942)"),
    sdma_module("sdma_v6", "sdma_v6_0_0_pkt_open.h", "SDMA 6.0 (gfx11: RDNA3, so gfx1100)"),
    # gc 9.4.2 (MI200) is the newest gfx9 register file in 6.1; gfx942 (gc 9.4.3) keeps its COMPUTE_TMPRING_SIZE
    pm4_module("pm4_gfx9", "soc15d.h", "vega10_enum.h", "gc_9_4_2_sh_mask.h",
               "gfx9 (SOC15: Vega, MI100-MI300, so gfx942)"),
    pm4_module("pm4_gfx11", "nvd.h", "soc21_enum.h", "gc_11_0_0_sh_mask.h", "gfx10 and gfx11 (so gfx1100)"),
)


# ---------------------------------------------------------------------------------------------
# The model: what the headers declare, in the terms the Python output needs
# ---------------------------------------------------------------------------------------------

@dataclass
class Field:
  name: str
  ctype: str                  # ctypes expression
  offset: int                 # bytes from the start of the record, as clang lays it out
  size: int
  align: int                  # the alignment ctypes gives this type
  bits: int | None = None     # bit-field width
  bit_offset: int = 0         # bit-field: first bit, from the start of the record
  anonymous: bool = False     # an unnamed struct/union member whose fields are reached directly
  flexible: bool = False      # a flexible array member (`T x[];`): C has no sizeof for it
  padding: bool = False       # bytes we add so ctypes leaves the gap C leaves; not in C
  inline: Record | None = None  # the record type of an anonymous member


@dataclass
class Record:
  name: str                   # the Python class name
  union: bool
  size: int
  align: int                  # clang's alignment
  header: str
  line: int
  c_root: str                 # C spelling of the outermost named record this one lives in
  c_prefix: str               # designator from c_root to this record ('' when it is c_root)
  anonymous: bool = False
  fields: list[Field] = field(default_factory=list)
  pack: int | None = None
  ctypes_align: int = 1


@dataclass
class Macro:
  name: str
  header: Header
  line: int
  params: tuple[str, ...] | None   # None for an object-like macro
  body: list[str]
  python: str | None = None        # function-like: the body as a Python expression
  kind: str = ""                   # after checking: "int", "range" (or not emitted: "")


@dataclass
class Constant:
  name: str
  header: Header
  line: int
  value: int | tuple[int, int] | None = None   # filled from the probe (enumerators: from clang)
  hexadecimal: bool = False
  function: Macro | None = None


# ---------------------------------------------------------------------------------------------
# Layout: place fields the way ctypes will, padding where the C compiler leaves gaps
# ---------------------------------------------------------------------------------------------

def round_up(value: int, to: int) -> int:
  return (value + to - 1) // to * to


def place_fields(fields: list[Field], size: int, union: bool, pack: int | None) -> tuple[list[Field], int] | None:
  """Fields with padding inserted so ctypes (with this _pack_) puts each at its C offset and the
  record ends at `size`; with the record's ctypes alignment. None when ctypes cannot match."""
  placed: list[Field] = []
  end, align = 0, 1

  def pad(offset: int, length: int) -> None:
    index = sum(f.padding for f in placed)
    placed.append(Field(f"_pad{index}", f"ctypes.c_uint8 * {length}", offset, length, 1, padding=True))

  for f in fields:
    field_align = min(f.align, pack) if pack else f.align
    if not union and f.offset > round_up(end, field_align):  # e.g. a member declared aligned(8)
      pad(end, f.offset - end)
      end = f.offset
    if (0 if union else round_up(end, field_align)) != f.offset:
      return None
    placed.append(f)
    end = max(end, f.offset + f.size)
    align = max(align, field_align)
  if round_up(end, align) < size:  # tail padding ctypes would not add (an aligned or over-sized record)
    pad(0 if union else end, size if union else size - end)
    end = size
  return (placed, align) if round_up(end, align) == size else None


def plan_layout(record: Record) -> None:
  """Choose _pack_ and padding so the ctypes class matches clang's layout (checked again by gcc)."""
  if any(f.bits is not None for f in record.fields):  # ctypes lays bit-fields out itself; the probe checks
    record.ctypes_align = max([f.align for f in record.fields] + [1])
    return
  for pack in (None, record.align, 1):
    if (placed := place_fields(record.fields, record.size, record.union, pack)) is not None:
      record.fields, record.ctypes_align = placed
      record.pack = pack
      return
  raise AutogenError(f"{record.name} ({record.header}:{record.line}): no ctypes layout matches clang's")


# ---------------------------------------------------------------------------------------------
# Parsing with libclang
# ---------------------------------------------------------------------------------------------

CTYPES_OF_KIND = {
    "BOOL": "ctypes.c_bool", "CHAR_S": "ctypes.c_char", "SCHAR": "ctypes.c_int8", "UCHAR": "ctypes.c_uint8",
    "CHAR_U": "ctypes.c_uint8", "SHORT": "ctypes.c_int16", "USHORT": "ctypes.c_uint16", "INT": "ctypes.c_int32",
    "UINT": "ctypes.c_uint32", "LONG": "ctypes.c_int64", "ULONG": "ctypes.c_uint64", "LONGLONG": "ctypes.c_int64",
    "ULONGLONG": "ctypes.c_uint64", "FLOAT": "ctypes.c_float", "DOUBLE": "ctypes.c_double",
    # pointers travel through the ioctl ABI as 64-bit addresses (NvP64); the driver fills them with ints
    "POINTER": "ctypes.c_uint64",
}


def gcc_include_dir() -> str:
  found = subprocess.run(["gcc", "-print-file-name=include"], capture_output=True, text=True, check=True)
  return found.stdout.strip()


def compile_args(module: Module, tree: Path) -> list[str]:
  """The arguments clang and gcc share: the language and dialect, and the module's include directories."""
  args = ["-x", "c++", "-std=gnu++17"] if module.language == "c++" else ["-std=gnu11"]
  for repo, directory in module.include_dirs:
    args += ["-I", str(tree / repo.short_name / directory)]
  return args


def umbrella_source(module: Module, tree: Path) -> str:
  includes = [f'#include "{tree / h.repo.short_name / h.path}"' for h in module.headers]
  return "\n".join([module.preamble, *includes, ""])


def parse(path: Path, text: str, args: list[str]) -> cindex.TranslationUnit:
  if cindex is None:
    raise AutogenError("libclang is missing: pip install -e '.[autogen]' (libclang==18.1.1)")
  options = (cindex.TranslationUnit.PARSE_DETAILED_PROCESSING_RECORD
             | cindex.TranslationUnit.PARSE_SKIP_FUNCTION_BODIES)
  # the libclang wheel has no compiler headers (stddef.h, ...); gcc's serve
  language = [] if "-x" in args else ["-x", "c"]
  clang_args = [*language, *args, "-ferror-limit=0", "-isystem", gcc_include_dir()]
  return cindex.Index.create().parse(str(path), args=clang_args, unsaved_files=[(str(path), text)], options=options)


def errors_of(tu: cindex.TranslationUnit) -> list[cindex.Diagnostic]:
  return [d for d in tu.diagnostics if d.severity >= cindex.Diagnostic.Error]


def tag_of(decl: cindex.Cursor) -> str | None:
  """The struct/union tag, or None for an unnamed record (libclang spells those '(unnamed at ...)')."""
  return decl.spelling if decl.spelling.isidentifier() else None


class Collector:
  """Walks a translation unit and builds the records and constants of one module."""

  def __init__(self, module: Module, tu: cindex.TranslationUnit, tree: Path):
    self.module, self.tu, self.tree = module, tu, tree
    self.own = {os.path.realpath(tree / h.repo.short_name / h.path): h for h in module.headers}
    self.records: dict[str, Record] = {}          # by USR, in completion order
    self.by_name: dict[str, Record] = {}
    self.typedef_names: dict[str, list[str]] = {}  # record USR -> typedef names that name it directly
    self.aliases: dict[str, str] = {}              # other C names (typedefs, tags) -> Python name

  # --- where things are declared

  def declarations(self) -> Iterator[cindex.Cursor]:
    """File-scope declarations, and those inside C++ namespaces, in order."""
    pending = list(self.tu.cursor.get_children())
    while pending:
      cursor = pending.pop(0)
      if cursor.kind == cindex.CursorKind.NAMESPACE:
        pending[0:0] = list(cursor.get_children())
      else:
        yield cursor

  def header_of(self, cursor: cindex.Cursor) -> Header | None:
    location = cursor.location
    return self.own.get(os.path.realpath(location.file.name)) if location.file else None

  def relative(self, cursor: cindex.Cursor) -> str:
    if not cursor.location.file:
      return "?"
    path = Path(os.path.realpath(cursor.location.file.name))
    try:
      return str(path.relative_to(os.path.realpath(self.tree)))
    except ValueError:
      return str(path)

  @staticmethod
  def wanted(header: Header, name: str) -> bool:
    """A structure or constant of `header` to keep (a header kept for some enums gives nothing else)."""
    return not header.enums and (not header.only or name.startswith(header.only))

  # --- records

  def collect_typedef_names(self) -> None:
    for cursor in self.declarations():
      if cursor.kind != cindex.CursorKind.TYPEDEF_DECL:
        continue
      underlying = cursor.underlying_typedef_type
      decl = underlying.get_canonical().get_declaration()
      # `typedef struct X Y` names the record directly; `typedef Y Z` is an alias of an alias
      if underlying.kind == cindex.TypeKind.ELABORATED and decl.kind in record_kinds():
        self.typedef_names.setdefault(decl.get_usr(), []).append(cursor.spelling)

  def record_names(self, decl: cindex.Cursor) -> tuple[str | None, str | None]:
    """(Python name, C spelling) of a file-scope record, or (None, None) when it is unnamed."""
    typedefs = self.typedef_names.get(decl.get_usr(), [])
    if typedefs:
      return typedefs[0], typedefs[0]
    if (tag := tag_of(decl)) is not None:
      if self.module.language == "c++":   # C++ names a record by its qualified name (llvm::amdhsa::...)
        return tag, decl.type.get_canonical().spelling
      return tag, f"{'union' if decl.kind == cindex.CursorKind.UNION_DECL else 'struct'} {tag}"
    return None, None

  def record(self, decl: cindex.Cursor, parent: Record | None = None, member: str = "",
             designator: str = "", anonymous: bool = False) -> Record:
    """The Record for a struct/union declaration. An unnamed one is named after its parent and member, and
    the probe reaches it from the parent through `designator` (e.g. `entries[0]`)."""
    decl = decl.get_definition() or decl
    usr = record_key(decl)
    if usr in self.records:
      return self.records[usr]
    name, c_spelling = self.record_names(decl)
    if name is not None:
      c_root, c_prefix = c_spelling, ""
      for other in [*self.typedef_names.get(decl.get_usr(), []), tag_of(decl)]:
        if other and other != name:
          self.aliases.setdefault(other, name)
    elif parent is not None:
      name = f"{parent.name}_{member}"
      c_root = parent.c_root
      c_prefix = parent.c_prefix if anonymous else join_designator(parent.c_prefix, designator)
    else:
      raise AutogenError(f"unnamed record at {self.relative(decl)}:{decl.location.line} outside any record")
    size, align = decl.type.get_size(), decl.type.get_align()
    if size < 0:
      raise AutogenError(f"{name}: incomplete type (declared at {self.relative(decl)}:{decl.location.line})")
    record = Record(name, decl.kind == cindex.CursorKind.UNION_DECL, size, align, self.relative(decl),
                    decl.location.line, c_root, c_prefix, anonymous)
    for f in decl.type.get_fields():
      # an anonymous struct/union member is a field whose "name" is its type's spelling
      record.fields.append(self.field(record, f) if f.spelling.isidentifier() else self.anonymous_field(record, f))
    plan_layout(record)
    if name in self.by_name:
      raise AutogenError(f"two records are named {name}: {self.by_name[name].header} and {record.header}")
    self.records[usr], self.by_name[name] = record, record
    return record

  def anonymous_field(self, record: Record, f: cindex.Cursor) -> Field:
    """A member `_anonN` of a class of its own, listed in _anonymous_ so its fields read as the parent's."""
    index = sum(other.anonymous for other in record.fields)
    inner = self.record(f.type.get_canonical().get_declaration(), record, f"anon{index}", anonymous=True)
    return Field(f"_anon{index}", inner.name, f.get_field_offsetof() // 8, inner.size, inner.ctypes_align,
                 anonymous=True, inline=inner)

  def field(self, record: Record, f: cindex.Cursor) -> Field:
    ctype, size, align = self.ctype(f.type, record, f.spelling)
    bits = f.get_bitfield_width() if f.is_bitfield() else None
    flexible = f.type.get_canonical().kind == cindex.TypeKind.INCOMPLETEARRAY
    return Field(f.spelling, ctype, f.get_field_offsetof() // 8, size, align, bits, f.get_field_offsetof(),
                 flexible=flexible)

  def ctype(self, c_type: cindex.Type, record: Record, member: str, designator: str = "") -> tuple[str, int, int]:
    """(ctypes expression, size, ctypes alignment) of the type of `record`'s field `member`."""
    canonical = c_type.get_canonical()
    kind = canonical.kind.name
    designator = designator or member
    if kind in CTYPES_OF_KIND:
      return CTYPES_OF_KIND[kind], canonical.get_size(), canonical.get_align()
    if kind == "ENUM":
      return self.ctype(canonical.get_declaration().enum_type, record, member, designator)
    if kind == "RECORD":
      inner = self.record(canonical.get_declaration(), record, member, designator)
      return inner.name, inner.size, inner.ctypes_align
    if kind in ("CONSTANTARRAY", "INCOMPLETEARRAY"):
      count = canonical.element_count if kind == "CONSTANTARRAY" else 0
      element, element_size, align = self.ctype(canonical.element_type, record, member, designator + "[0]")
      element = f"({element})" if " " in element else element
      return f"{element} * {count}", element_size * count, align
    raise AutogenError(f"{record.name}.{member}: no ctypes type for {c_type.spelling} ({kind})")

  def collect_records(self) -> None:
    """Records declared in the module's headers, and every record they contain."""
    for cursor in self.declarations():
      header = self.header_of(cursor)
      if header is None:
        continue
      if cursor.kind in record_kinds() and cursor.is_definition():
        name, _ = self.record_names(cursor)
        if name is not None and self.wanted(header, name):
          self.record(cursor)
      elif cursor.kind == cindex.CursorKind.TYPEDEF_DECL and self.wanted(header, cursor.spelling):
        self.typedef_alias(cursor)

  def typedef_alias(self, cursor: cindex.Cursor) -> None:
    """`typedef A B;` of a record: B names the same class (e.g. NVA06C_CTRL_GPFIFO_SCHEDULE_PARAMS)."""
    decl = cursor.underlying_typedef_type.get_canonical().get_declaration()
    if decl.kind not in record_kinds() or not (decl.get_definition() or decl).is_definition():
      return
    record = self.record(decl)
    if cursor.spelling != record.name:
      self.aliases.setdefault(cursor.spelling, record.name)

  # --- constants

  def collect_macros(self) -> list[Macro]:
    macros, seen = [], set()
    for cursor in self.tu.cursor.get_children():
      if cursor.kind != cindex.CursorKind.MACRO_DEFINITION or cursor.spelling in seen:
        continue
      header = self.header_of(cursor)
      if header is None or not self.wanted(header, cursor.spelling):
        continue
      params, body = split_macro(list(cursor.get_tokens()))
      if body:
        seen.add(cursor.spelling)
        macros.append(Macro(cursor.spelling, header, cursor.location.line, params, body))
    return macros

  def collect_enumerators(self) -> list[Constant]:
    constants = []
    for cursor in self.declarations():
      header = self.header_of(cursor)
      if cursor.kind != cindex.CursorKind.ENUM_DECL or header is None:
        continue
      if header.enums and cursor.spelling not in header.enums:
        continue
      for enumerator in cursor.get_children():
        if header.enums or self.wanted(header, enumerator.spelling):
          hexadecimal = any(t.spelling.lower().startswith("0x") for t in enumerator.get_tokens())
          # the enum's line, not the enumerator's: nvstatus.h's enumerators are spelled in nvstatuscodes.h
          constants.append(Constant(enumerator.spelling, header, cursor.location.line, enumerator.enum_value,
                                    hexadecimal))
    return constants


def record_key(decl: cindex.Cursor) -> str:
  """What tells records apart: the USR, and for an unnamed one also where it is (libclang gives two anonymous
  unions of one struct the same USR)."""
  if tag_of(decl) is not None:
    return decl.get_usr()
  where = decl.location
  return f"{decl.get_usr()}@{where.file.name if where.file else ''}:{where.line}:{where.column}"


def record_kinds() -> tuple:
  return (cindex.CursorKind.STRUCT_DECL, cindex.CursorKind.UNION_DECL)


def join_designator(prefix: str, member: str) -> str:
  return f"{prefix}.{member}" if prefix else member


# ---------------------------------------------------------------------------------------------
# Macros: token-level helpers (pure; tested in tests/autogen/test_autogen_tool.py)
# ---------------------------------------------------------------------------------------------

def split_macro(tokens: list) -> tuple[tuple[str, ...] | None, list[str]]:
  """(parameters or None, body spellings) of a MACRO_DEFINITION's tokens. A macro is function-like
  when '(' touches its name; `#define F (x)` is an object-like macro whose body is (x)."""
  name, rest = tokens[0], tokens[1:]
  touching = (rest and rest[0].spelling == "(" and rest[0].extent.start.line == name.extent.end.line
              and rest[0].extent.start.column == name.extent.end.column)
  if not touching:
    return None, [t.spelling for t in rest]
  close = next(i for i, t in enumerate(rest) if t.spelling == ")")
  params = tuple(t.spelling for t in rest[1:close] if t.spelling != ",")
  return params, [t.spelling for t in rest[close + 1:]]


C_INTEGER = re.compile(r"^(0[xX][0-9a-fA-F]+|[0-9]+)[uUlL]*$")
ARITHMETIC = {"+", "-", "*", "/", "%", "<<", ">>", "&", "|", "^", "~", "(", ")"}


def python_expression(tokens: list[str], names: set[str]) -> str | None:
  """A C integer expression of literals, `names` and arithmetic as Python source, or None."""
  out = []
  for token in tokens:
    if (literal := C_INTEGER.match(token)) is not None:
      digits = literal.group(1)
      octal = len(digits) > 1 and digits[0] == "0" and digits[1] not in "xX"
      out.append("0o" + digits[1:] if octal else digits)
    elif token in names:
      out.append(token)
    elif token in ARITHMETIC:
      out.append("//" if token == "/" else token)  # C's / truncates; the probe samples catch negatives
    else:
      return None
  return re.sub(r"\( | \)", lambda m: m.group(0).strip(), " ".join(out)) if out else None


def unwrap_call(tokens: list[str], function: str) -> list[str]:
  """`MW ( x )` -> `x` when the call spans the whole body."""
  if len(tokens) >= 3 and tokens[0] == function and tokens[1] == "(" and closing_paren(tokens, 1) == len(tokens) - 1:
    return tokens[2:-1]
  return tokens


def closing_paren(tokens: list[str], opening: int) -> int:
  depth = 0
  for i in range(opening, len(tokens)):
    depth += {"(": 1, ")": -1}.get(tokens[i], 0)
    if depth == 0:
      return i
  return -1


def range_split(tokens: list[str]) -> int | None:
  """Index of the ':' of a `hi:lo` bit range at the top level, or None (also for a ?: expression)."""
  depth, colon = 0, None
  for i, token in enumerate(tokens):
    depth += {"(": 1, ")": -1}.get(token, 0)
    if depth == 0 and token == "?":
      return None
    if depth == 0 and token == ":" and colon is None:
      colon = i
  return colon


def macro_function_body(body: list[str], params: tuple[str, ...], names: set[str]) -> str | None:
  """The Python return expression of a function-like macro: an integer expression, or a (hi, lo)
  tuple for `hi:lo` and `MW(hi:lo)` bodies; None when the body is anything else."""
  body = unwrap_call(body, "MW")
  allowed = set(params) | names
  if (colon := range_split(body)) is None:
    return python_expression(body, allowed)
  hi, lo = python_expression(body[:colon], allowed), python_expression(body[colon + 1:], allowed)
  return None if hi is None or lo is None else f"({hi}, {lo})"


# ---------------------------------------------------------------------------------------------
# Which macros are integer constants: ask clang, one _Static_assert per candidate
# ---------------------------------------------------------------------------------------------

# _Generic without a default rejects floats, pointers and strings; `0 + (x)`, not `(x) + 0`, which reads as a
# cast when a macro names a type (`#define NVOS_STATUS NV_STATUS`); _Static_assert rejects what is not constant
IS_INTEGER = ("#define RG_IS_INT(x) _Generic(0 + (x), int: 1, unsigned int: 1, long: 1, unsigned long: 1, "
              "long long: 1, unsigned long long: 1)")
SAMPLE_ARGUMENTS = (0, 1, 2)


def call(macro: Macro, argument: int) -> str:
  return f"{macro.name}({', '.join([str(argument)] * len(macro.params))})"


def expressions_of(macro: Macro, kind: str) -> list[str]:
  """The C expressions a macro of `kind` ("int" or "range") must make valid, to be one."""
  uses = [call(macro, a) for a in SAMPLE_ARGUMENTS] if macro.params is not None else [macro.name]
  if kind == "int":
    return uses
  return [f"{side} ? {use}" for use in uses for side in (1, 0)]  # the DRF idiom: (1 ? hi:lo) is hi


def integer_checks(base: str, candidates: dict[str, list[str]], path: Path, args: list[str]) -> set[str]:
  """The keys of `candidates` whose expressions are all integer constant expressions after `base`."""
  lines = [*base.splitlines(), IS_INTEGER]
  first = len(lines) + 1
  keys = list(candidates)
  for key in keys:
    asserts = " && ".join(f"RG_IS_INT({e})" for e in candidates[key])
    lines.append(f'_Static_assert({asserts}, "{key}");')
  # at file scope (libclang skips function bodies); an error inside a macro is reported at its assert's line
  tu = parse(path, "\n".join(lines) + "\n", args)
  failed = {d.location.line for d in errors_of(tu) if d.location.file and d.location.file.name == str(path)}
  return {key for i, key in enumerate(keys) if first + i not in failed}


def classify_macros(macros: list[Macro], base: str, path: Path, args: list[str]) -> None:
  """Set each macro's kind: "int", "range" or "" (not an integer: strings, types, helpers...)."""
  pending = [m for m in macros if m.params is None or m.python is not None]
  for kind in ("int", "range"):
    ok = integer_checks(base, {m.name: expressions_of(m, kind) for m in pending}, path, args)
    for macro in pending:
      if macro.name in ok:
        macro.kind = kind
    pending = [m for m in pending if not m.kind]


# ---------------------------------------------------------------------------------------------
# The probe: gcc compiles the same headers and prints every value and layout
# ---------------------------------------------------------------------------------------------

PROBE_PRELUDE = r"""#include <stdio.h>
#include <stddef.h>
#include <string.h>
static void rg_u(const char *key, unsigned long long value) { printf("%s\t%llu\n", key, value); }
static void rg_s(const char *key, long long value) { printf("%s\t%lld\n", key, value); }
#ifdef __cplusplus
template <typename T> static void rg_int(const char *key, T value) {
    if ((T)-1 < (T)0) rg_s(key, (long long)value); else rg_u(key, (unsigned long long)value);
}
#define RG_INT(key, x) rg_int(key, 0 + (x))
#else
#define RG_INT(key, x) _Generic(0 + (x), unsigned int: rg_u, unsigned long: rg_u, unsigned long long: rg_u, \
                                default: rg_s)(key, (x))
#endif
static void rg_bits(const char *key, const unsigned char *bytes, size_t size, size_t base) {
    size_t first = (size_t)-1, last = 0;
    for (size_t i = 0; i < size * 8; i++)
        if (bytes[i / 8] >> (i % 8) & 1) { if (first == (size_t)-1) first = i; last = i; }
    printf("%s\t%zu\t%zu\n", key, first - base * 8, last - first + 1);
}
"""


def first_leaf(record: Record) -> str:
  """A named field at offset 0 of `record`, reached through anonymous members (C promotes their names)."""
  first = next(f for f in record.fields if not f.padding)
  if first.anonymous:
    return first_leaf(first.inline)
  if first.bits is not None:
    raise AutogenError(f"{record.name}: anonymous member starting with a bit-field; teach the probe its offset")
  return first.name


def base_offset(record: Record) -> str:
  """C expression: where `record` starts inside its named root."""
  if record.anonymous:
    return f"offsetof({record.c_root}, {join_designator(record.c_prefix, first_leaf(record))})"
  return f"offsetof({record.c_root}, {record.c_prefix})" if record.c_prefix else "0"


def probe_record(record: Record) -> list[str]:
  lines, base = [], base_offset(record)
  if not record.anonymous:
    size = f"sizeof(((({record.c_root} *)0)->{record.c_prefix}))" if record.c_prefix else f"sizeof({record.c_root})"
    lines.append(f'RG_INT("S\\t{record.name}", {size});')
  for f in record.fields:
    if f.padding:
      continue
    member = first_leaf(f.inline) if f.anonymous else f.name
    designator = join_designator(record.c_prefix, member)
    if f.bits is not None:
      lines.append(f"{{ static {record.c_root} o; memset((void *)&o, 0, sizeof o); o.{designator} = -1; "
                   f'rg_bits("B\\t{record.name}\\t{f.name}", (const unsigned char *)&o, sizeof o, {base}); }}')
    else:
      lines.append(f'RG_INT("F\\t{record.name}\\t{f.name}", offsetof({record.c_root}, {designator}) - {base});')
    if f.bits is None and not f.anonymous and not f.flexible:
      lines.append(f'RG_INT("Z\\t{record.name}\\t{f.name}", sizeof((({record.c_root} *)0)->{designator}));')
  return lines


def probe_macro(macro: Macro) -> list[str]:
  uses = [(str(a), call(macro, a)) for a in SAMPLE_ARGUMENTS] if macro.params is not None else [("", macro.name)]
  lines = []
  for argument, use in uses:
    key = f"X\\t{macro.name}\\t{argument}" if macro.params is not None else f"C\\t{macro.name}"
    if macro.kind == "int":
      lines.append(f'RG_INT("{key}", {use});')
    else:
      lines += [f'RG_INT("{key}\\thi", (1 ? {use}));', f'RG_INT("{key}\\tlo", (0 ? {use}));']
  return lines


def probe_source(base: str, records: list[Record], macros: list[Macro]) -> str:
  body = [line for r in records for line in probe_record(r)]
  body += [line for m in macros if m.kind for line in probe_macro(m)]
  return PROBE_PRELUDE + base + "int main(void) {\n    " + "\n    ".join(body) + "\n    return 0;\n}\n"


@dataclass
class ProbeResult:
  sizes: dict[str, int] = field(default_factory=dict)
  offsets: dict[str, dict[str, int]] = field(default_factory=dict)
  field_sizes: dict[str, dict[str, int]] = field(default_factory=dict)
  bitfields: dict[str, dict[str, list[int]]] = field(default_factory=dict)
  values: dict[str, int] = field(default_factory=dict)
  ranges: dict[str, dict[str, int]] = field(default_factory=dict)            # name -> {"hi", "lo"}
  samples: dict[str, dict[str, object]] = field(default_factory=dict)        # name -> {argument: value}


def parse_probe_output(text: str) -> ProbeResult:
  result = ProbeResult()
  for line in text.splitlines():
    kind, *keys, value = line.split("\t")
    if kind == "S":
      result.sizes[keys[0]] = int(value)
    elif kind == "F":
      result.offsets.setdefault(keys[0], {})[keys[1]] = int(value)
    elif kind == "Z":
      result.field_sizes.setdefault(keys[0], {})[keys[1]] = int(value)
    elif kind == "B":
      result.bitfields.setdefault(keys[0], {})[keys[1]] = [int(keys[2]), int(value)]
    elif kind == "C" and len(keys) == 1:
      result.values[keys[0]] = int(value)
    elif kind == "C":
      result.ranges.setdefault(keys[0], {})[keys[1]] = int(value)
    elif kind == "X" and len(keys) == 2:
      result.samples.setdefault(keys[0], {})[keys[1]] = int(value)
    elif kind == "X":
      sample = result.samples.setdefault(keys[0], {}).setdefault(keys[1], {})
      sample[keys[2]] = int(value)
  return result


def run_probe(source: str, args: list[str], work: Path, name: str) -> ProbeResult:
  c_file, binary = work / f"{name}_probe.c", work / f"{name}_probe"
  c_file.write_text(source)
  compiled = subprocess.run(["gcc", *args, "-w", "-o", str(binary), str(c_file)], capture_output=True, text=True)
  if compiled.returncode != 0:
    raise AutogenError(f"the layout probe {c_file} does not compile:\n{compiled.stderr[:4000]}")
  ran = subprocess.run([str(binary)], capture_output=True, text=True)
  if ran.returncode != 0:
    raise AutogenError(f"the layout probe {binary} failed ({ran.returncode}): {ran.stderr[:2000]}")
  return parse_probe_output(ran.stdout)


# ---------------------------------------------------------------------------------------------
# One module: parse, classify, probe, check
# ---------------------------------------------------------------------------------------------

@dataclass
class ModuleResult:
  module: Module
  records: list[Record]
  aliases: dict[str, str]
  constants: list[Constant]
  probe: ProbeResult
  dropped_functions: list[str]


def build_module(module: Module, tree: Path, work: Path) -> ModuleResult:
  base = umbrella_source(module, tree)
  args = compile_args(module, tree)
  unit = work / f"{module.name}.c"
  unit.write_text(base)
  tu = parse(unit, base, args)
  if errs := errors_of(tu):
    raise AutogenError(f"{module.name}: the headers do not parse:\n" + "\n".join(str(e) for e in errs[:20]))
  collector = Collector(module, tu, tree)
  collector.collect_typedef_names()
  collector.collect_records()
  macros = collector.collect_macros()
  enumerators = collector.collect_enumerators()
  names = {m.name for m in macros if m.params is None} | {c.name for c in enumerators}
  for macro in macros:
    if macro.params is not None and "..." not in macro.params:
      macro.python = macro_function_body(macro.body, macro.params, names)
  if module.language == "c":   # the integer test is C's _Generic
    classify_macros(macros, base, work / f"{module.name}_check.c", args)
  records = list(collector.records.values())
  probe = run_probe(probe_source(base, records, macros), args, work, module.name)
  check_layouts(records, probe)
  constants, dropped = constants_of(module, macros, enumerators, probe)
  if module.mask_ranges: constants = with_mask_ranges(constants)
  check_names(module, records, collector.aliases, constants)
  return ModuleResult(module, records, collector.aliases, constants, probe, dropped)


def check_layouts(records: list[Record], probe: ProbeResult) -> None:
  """The classes follow clang's layout; gcc must agree with it, or the bindings would be wrong."""
  problems = []
  for record in records:
    if record.name in probe.sizes and probe.sizes[record.name] != record.size:
      problems.append(f"{record.name}: clang says {record.size} bytes, gcc {probe.sizes[record.name]}")
    for f in record.fields:
      gcc_offset = probe.offsets.get(record.name, {}).get(f.name)
      if gcc_offset is not None and gcc_offset != f.offset:
        problems.append(f"{record.name}.{f.name}: clang puts it at {f.offset}, gcc at {gcc_offset}")
      gcc_size = probe.field_sizes.get(record.name, {}).get(f.name)
      if gcc_size is not None and gcc_size != f.size:
        problems.append(f"{record.name}.{f.name}: clang says {f.size} bytes, gcc {gcc_size}")
      gcc_bits = probe.bitfields.get(record.name, {}).get(f.name)
      if gcc_bits is not None and gcc_bits != [f.bit_offset, f.bits]:
        problems.append(f"{record.name}.{f.name}: clang puts it at bits {f.bit_offset}+{f.bits}, gcc {gcc_bits}")
  if problems:
    raise AutogenError("clang and gcc disagree on layouts:\n" + "\n".join(problems[:40]))


def constants_of(module: Module, macros: list[Macro], enumerators: list[Constant],
                 probe: ProbeResult) -> tuple[list[Constant], list[str]]:
  """Constants in header order with gcc's values; function-like macros whose Python form disagrees
  with gcc at the sample arguments are dropped (returned by name)."""
  constants = list(enumerators)
  for macro in macros:
    if macro.params is None and macro.kind == "int":
      hexadecimal = any(t.lower().startswith("0x") for t in macro.body)
      value = probe.values[macro.name]
      if module.words32 and -2**31 <= value < 0: value += 2**32   # (1 << 31) as the flag word it stands for
      constants.append(Constant(macro.name, macro.header, macro.line, value, hexadecimal))
    elif macro.params is None and macro.kind == "range":
      bounds = probe.ranges[macro.name]
      constants.append(Constant(macro.name, macro.header, macro.line, (bounds["hi"], bounds["lo"])))
  namespace = {c.name: c.value for c in constants}
  dropped = []
  for macro in macros:
    if macro.params is None or not macro.kind:
      continue
    if function_matches(macro, probe.samples[macro.name], namespace, module.words32):
      constants.append(Constant(macro.name, macro.header, macro.line, function=macro))
    else:
      dropped.append(macro.name)
  return sorted(constants, key=lambda c: (module.headers.index(c.header), c.line)), dropped


def mask_range(offset: int, mask: int, shift: int, name: str) -> tuple[int, int]:
  """(hi, lo) over a packet of a field in dword `offset`, `mask` wide (ones from bit 0) at `shift`."""
  width = mask.bit_length()
  if mask <= 0 or mask != (1 << width) - 1 or shift + width > 32:
    raise AutogenError(f"{name}: mask {mask:#x} at shift {shift} is not a field inside one dword")
  return 32 * offset + shift + width - 1, 32 * offset + shift


def with_mask_ranges(constants: list[Constant]) -> list[Constant]:
  """Each NAME_offset / NAME_mask / NAME_shift family followed by NAME = (hi, lo), the field's bits over the packet
  (the shape set_field-style helpers take)."""
  values = {c.name: c.value for c in constants}
  out = []
  for constant in constants:
    out.append(constant)
    if not constant.name.endswith("_offset"): continue
    name = constant.name[:-len("_offset")]
    mask, shift = values.get(f"{name}_mask"), values.get(f"{name}_shift")
    if isinstance(mask, int) and isinstance(shift, int) and isinstance(constant.value, int) and name not in values:
      out.append(Constant(name, constant.header, constant.line, mask_range(constant.value, mask, shift, name)))
  return out


def function_matches(macro: Macro, samples: dict[str, object], namespace: dict[str, object],
                     words32: bool = False) -> bool:
  """The Python form gives gcc's values at the sample arguments. With `words32`, a negative int from C (a shift into
  bit 31 of a packet word) matches Python's unsigned reading of the same 32 bits."""
  function = eval(f"lambda {', '.join(macro.params)}: {macro.python}", dict(namespace))  # our own translation
  for argument, expected in samples.items():
    expected = (expected["hi"], expected["lo"]) if isinstance(expected, dict) else expected
    try:
      got = function(*[int(argument)] * len(macro.params))
    except (NameError, TypeError, ValueError, OverflowError, ZeroDivisionError):  # ValueError: a negative shift
      return False
    if words32 and isinstance(expected, int) and -2**31 <= expected < 0 and got == expected + 2**32:
      continue
    if got != expected:
      return False
  return True


def check_names(module: Module, records: list[Record], aliases: dict[str, str], constants: list[Constant]) -> None:
  seen: dict[str, str] = {}
  for name, what in [*((r.name, "record") for r in records), *((a, "alias") for a in aliases),
                     *((c.name, "constant") for c in constants)]:
    if name in seen:
      raise AutogenError(f"{module.name}: {name} is both a {seen[name]} and a {what}")
    seen[name] = what


# ---------------------------------------------------------------------------------------------
# Output: Python modules, layouts.json, the package's __init__
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Provenance:
  revisions: dict[str, tuple[str, str]]   # repository -> (revision asked for, commit); package -> (version, origin)
  target: str = "nv"

  def command(self) -> str:
    if self.target == "amd":
      return "python tools/autogen.py amd"
    return (f"python tools/autogen.py nv {NVIDIA_KERNEL.rev_option} {self.revisions[NVIDIA_KERNEL.name][0]} "
            f"{NVIDIA_DOC.rev_option} {self.revisions[NVIDIA_DOC.name][0]}")

  def sources(self) -> dict[str, dict[str, str]]:
    """What layouts.json records of each source."""
    if self.target == "amd":
      return {package: {"version": version} for package, (version, _) in self.revisions.items()}
    return {repo: {"rev": rev, "commit": commit} for repo, (rev, commit) in self.revisions.items()}


def file_header(result: ModuleResult, provenance: Provenance) -> list[str]:
  counts = summary_counts(result)
  lines = ["# Generated by tools/autogen.py: never edit by hand; change the generator and run `make autogen`.",
           f"# Command: {provenance.command()}",
           *textwrap.wrap(result.module.doc, 116, initial_indent="# ", subsequent_indent="#   ",
                         break_on_hyphens=False),
           "# Sources (read at generation time, never committed):"]
  for repo in dict.fromkeys(h.repo for h in result.module.headers):
    lines.append(f"#   {repo.describe(*provenance.revisions[repo.name])}")
    lines += [f"#     {h.path}" + (f"  (only {', '.join(h.only)}*)" if h.only else "")
              for h in result.module.headers if h.repo is repo]
  lines.append(f"# {counts['records']} structures/unions, {counts['integers']} integer constants, "
               f"{counts['ranges']} bit ranges as (hi, lo), {counts['functions']} functions of an index.")
  lines.append("# gcc's sizeof/offsetof of every class are in layouts.json; tests/autogen checks the classes.")
  return lines


def summary_counts(result: ModuleResult) -> dict[str, int]:
  return {"records": len(result.records),
          "integers": sum(1 for c in result.constants if isinstance(c.value, int)),
          "ranges": sum(1 for c in result.constants if isinstance(c.value, tuple)),
          "functions": sum(1 for c in result.constants if c.function is not None)}


def render_constant(constant: Constant) -> str:
  if constant.function is not None:
    return f"def {constant.name}({', '.join(constant.function.params)}): return {constant.function.python}"
  if isinstance(constant.value, tuple):
    return f"{constant.name} = ({constant.value[0]}, {constant.value[1]})"
  value = hex(constant.value) if constant.hexadecimal and constant.value >= 0 else str(constant.value)
  return f"{constant.name} = {value}"


def render_record(record: Record) -> list[str]:
  lines = [f"class {record.name}(ctypes.{'Union' if record.union else 'Structure'}):"]
  if record.pack:
    # _layout_ keeps Python 3.14+ from warning; without bit-fields the "ms" layout under _pack_ is gcc's too
    lines += [f"  _pack_ = {record.pack}", '  _layout_ = "ms"']
  if anonymous := [f'"{f.name}"' for f in record.fields if f.anonymous]:
    lines.append(f"  _anonymous_ = ({', '.join(anonymous)},)")
  if not record.fields:
    return lines + ["  _fields_ = []"]
  lines.append("  _fields_ = [")
  for f in record.fields:
    bits = f", {f.bits}" if f.bits is not None else ""
    lines.append(f'    ("{f.name}", {f.ctype}{bits}),')
  return lines + ["  ]"]


def render_module(result: ModuleResult, provenance: Provenance) -> str:
  lines = file_header(result, provenance) + ["import ctypes", ""]
  header = None
  for constant in result.constants:
    if constant.header is not header:
      header = constant.header
      lines += ["", f"# ---- {header.path} ----"]
    lines.append(render_constant(constant))
  if result.records:
    lines += ["", "", "# ---- structures and unions (each after the ones it contains) ----"]
  for record in result.records:
    lines += ["", ""] + render_record(record)
  if result.aliases:
    lines += ["", "", "# ---- other C names of the classes above (typedefs, struct tags) ----"]
    lines += [f"{alias} = {name}" for alias, name in result.aliases.items()]
  return "\n".join(lines) + "\n"


def layouts_of(result: ModuleResult) -> dict[str, dict]:
  """gcc's layout of every class: its size and each field's [offset, size]; None where C cannot name the
  type (anonymous members, flexible arrays)."""
  layouts = {}
  for record in result.records:
    sizes = result.probe.field_sizes.get(record.name, {})
    fields = {name: [offset, sizes.get(name)] for name, offset in result.probe.offsets.get(record.name, {}).items()}
    entry = {"size": result.probe.sizes.get(record.name), "fields": fields}
    if record.name in result.probe.bitfields:
      entry["bitfields"] = result.probe.bitfields[record.name]
    layouts[record.name] = entry
  return layouts


def render_layouts(results: list[ModuleResult], provenance: Provenance) -> str:
  """layouts.json, one class per line so a regeneration's diff shows what moved."""
  compiler = subprocess.run(["gcc", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
  head = {"generated_by": provenance.command(), "compiler": f"{compiler}, {platform.machine()}",
          "sources": provenance.sources()}
  modules = []
  for result in results:
    entries = [f"   {json.dumps(name)}: {json.dumps(entry)}" for name, entry in layouts_of(result).items()]
    modules.append(f"  {json.dumps(result.module.name)}: {{\n" + ",\n".join(entries) + "\n  }")
  head_lines = "".join(f" {json.dumps(key)}: {json.dumps(value)},\n" for key, value in head.items())
  return "{\n" + head_lines + ' "modules": {\n' + ",\n".join(modules) + "\n }\n}\n"


def module_summaries(results: list[ModuleResult]) -> str:
  return "\n".join(line for r in results for line in
                   textwrap.wrap(f"{r.module.name}: {r.module.doc}", 116, initial_indent="#   ",
                                 subsequent_indent="#     ", break_on_hyphens=False))


def render_package_init(results: list[ModuleResult], provenance: Provenance) -> str:
  if provenance.target == "amd":
    return render_amd_package_init(results, provenance)
  rev, commit = provenance.revisions[NVIDIA_KERNEL.name]
  modules = module_summaries(results)
  return (f"# Generated by tools/autogen.py: never edit by hand; change the generator and run `make autogen`.\n"
          f"# Command: {provenance.command()}\n"
          f"# ctypes bindings for NVIDIA GPUs from the real headers:\n{modules}\n"
          f"# layouts.json holds gcc's sizeof/offsetof of every class; tests/autogen checks them.\n\n"
          f"# RM structures change between driver branches: the driver refuses a branch other than this one.\n"
          f'DRIVER_BRANCH = "{rev.split(".")[0]}"\n'
          f'SOURCE_REPOSITORY = "{NVIDIA_KERNEL.name}"\n'
          f'SOURCE_TAG = "{rev}"\n'
          f'SOURCE_COMMIT = "{commit}"\n')


def render_amd_package_init(results: list[ModuleResult], provenance: Provenance) -> str:
  kfd = next(r for r in results if r.module.name == "kfd")
  major, minor = (kfd.probe.values[f"KFD_IOCTL_{part}_VERSION"] for part in ("MAJOR", "MINOR"))
  packages = "".join(f'    "{name}": "{version}",\n' for name, (version, _) in provenance.revisions.items())
  return (f"# Generated by tools/autogen.py: never edit by hand; change the generator and run `make autogen`.\n"
          f"# Command: {provenance.command()}\n"
          f"# ctypes bindings for AMD GPUs from the real headers:\n{module_summaries(results)}\n"
          f"# layouts.json holds gcc's sizeof/offsetof of every class; tests/autogen checks them.\n\n"
          f"# the KFD ioctl interface the headers describe; a kernel reporting another major version is refused\n"
          f"KFD_IOCTL_VERSION = ({major}, {minor})\n"
          f"SOURCE_PACKAGES = {{\n{packages}}}\n")


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------

def generate_nv(args: argparse.Namespace, work: Path) -> list[ModuleResult]:
  tree = work / "headers"
  revisions = {}
  for repo in (NVIDIA_KERNEL, NVIDIA_DOC):
    gdir = locate(repo, getattr(args, option_attribute(repo.option)))
    rev = getattr(args, option_attribute(repo.rev_option))
    revisions[repo.name] = (rev, extract(repo, gdir, rev, tree))
    print(f"{repo.name} {rev}: commit {revisions[repo.name][1]} from {gdir}")
  provenance = Provenance(revisions)
  results = [build_module(module, tree, work) for module in NV_MODULES]
  for result in results:
    report(result)
  write_outputs(args.out, results, provenance)
  return results


def generate_amd(args: argparse.Namespace, work: Path) -> list[ModuleResult]:
  tree = work / "headers"
  write_stubs(AMD_STUBS, tree)
  revisions = {}
  for package in AMD_PACKAGES:
    revisions[package.name] = take_package(package, getattr(args, option_attribute(package.option)), work, tree)
    print(f"{package.name} {revisions[package.name][0]} ({revisions[package.name][1]})")
  provenance = Provenance(revisions, "amd")
  results = [build_module(module, tree, work) for module in AMD_MODULES]
  for result in results:
    report(result)
  write_outputs(args.out, results, provenance)
  return results


def report(result: ModuleResult) -> None:
  counts = summary_counts(result)
  print(f"{result.module.name}: {counts['records']} structures/unions, {counts['integers']} integers, "
        f"{counts['ranges']} bit ranges, {counts['functions']} functions")
  if result.dropped_functions:
    print(f"  left out, their Python form disagreed with gcc: {', '.join(result.dropped_functions)}")


def layout_mismatches_function():
  """rawgrad.autogen.layout_mismatches, loaded by path: it needs only ctypes, rawgrad needs much more."""
  spec = importlib.util.spec_from_file_location("rawgrad_autogen", REPO_ROOT / "rawgrad" / "autogen" / "__init__.py")
  checker = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(checker)
  return checker.layout_mismatches


def check_ctypes(result: ModuleResult, source: str) -> None:
  """Run the generated module and compare its classes with gcc's layouts, as tests/autogen will."""
  namespace: dict = {}
  exec(compile(source, f"{result.module.name}.py", "exec"), namespace)
  mismatches = layout_mismatches_function()
  problems = [p for name, record in layouts_of(result).items() for p in mismatches(namespace[name], record)]
  if problems:
    raise AutogenError(f"{result.module.name}: ctypes lays out differently from gcc:\n" + "\n".join(problems[:40]))


def write_outputs(out: Path, results: list[ModuleResult], provenance: Provenance) -> None:
  sources = {r.module.name: render_module(r, provenance) for r in results}
  for result in results:
    check_ctypes(result, sources[result.module.name])
  out.mkdir(parents=True, exist_ok=True)
  (out / "__init__.py").write_text(render_package_init(results, provenance))
  for name, source in sources.items():
    (out / f"{name}.py").write_text(source)
  (out / "layouts.json").write_text(render_layouts(results, provenance))
  print(f"wrote {len(results)} modules and layouts.json to {out}")


def option_attribute(option: str) -> str:
  return option.lstrip("-").replace("-", "_")


def argument_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  targets = parser.add_subparsers(dest="target", required=True)
  nv = targets.add_parser("nv", help="NVIDIA: RM, UVM, engine classes, QMDs -> rawgrad/autogen/nv/")
  for repo in (NVIDIA_KERNEL, NVIDIA_DOC):
    nv.add_argument(repo.option, metavar="DIR_OR_GITDIR",
                    help=f"git copy (bare or checkout) of {repo.name}; default ${repo.env}, else the fetch "
                         f"tool's mirror ({', '.join(repo.known_copies)})")
    nv.add_argument(repo.rev_option, metavar="REV", default=repo.default_rev,
                    help=f"tag or commit of {repo.name} (default {repo.default_rev})")
  nv.add_argument("--out", type=Path, default=REPO_ROOT / "rawgrad" / "autogen" / "nv", help="output directory")
  nv.add_argument("--keep", type=Path, metavar="DIR",
                  help="work in DIR and keep the extracted headers, translation units and probes there")
  amd = targets.add_parser("amd", help="AMD: KFD ioctls, AQL packets and HSA signals, SDMA and PM4 packets -> "
                                       "rawgrad/autogen/amd/")
  for package in AMD_PACKAGES:
    amd.add_argument(package.option, type=Path, metavar="DEB",
                     help=f"a local .deb of {package.name}; default: the installed package, else `apt-get download "
                          f"{package.name}`")
  amd.add_argument("--out", type=Path, default=REPO_ROOT / "rawgrad" / "autogen" / "amd", help="output directory")
  amd.add_argument("--keep", type=Path, metavar="DIR",
                   help="work in DIR and keep the extracted headers, translation units and probes there")
  return parser


def main(argv: list[str] | None = None) -> int:
  args = argument_parser().parse_args(argv)
  generate = generate_amd if args.target == "amd" else generate_nv
  try:
    if args.keep:
      args.keep.mkdir(parents=True, exist_ok=True)
      generate(args, args.keep)
    else:
      with tempfile.TemporaryDirectory(prefix="rawgrad-autogen-") as work:
        generate(args, Path(work))
  except AutogenError as error:
    print(f"autogen: {error}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
