"""An emulated NVIDIA kernel interface: the 580 driver's RM and UVM ioctls for one H100, and a GPU that runs what is
submitted to it. `EMULATE=1` puts it behind the OS seam (drivers/os.py), so the NV driver runs unchanged without a
GPU; tests install one of their own.

What the kernel checks, it checks the same way (docs/nv-driver-notes.md 1.3 and 11): an escape whose size is not its
struct's is refused with EINVAL before anything else, as escape.c does; so is an escape on the wrong node. Past
that, the ioctl succeeds and RM's verdict is the struct's status: NV_ERR_INVALID_CLASS for a class the chip lacks,
NV_ERR_INVALID_OBJECT_PARENT, NV_ERR_INVALID_PARAM_STRUCT for a control's wrong size, NV_ERR_NOT_SUPPORTED for an
unknown control, NV_ERR_STATE_IN_USE for a second mapping on one fd. UVM answers in rmStatus: NV_ERR_ILLEGAL_ACTION
before UVM_INITIALIZE, NV_ERR_INVALID_FLAGS for a VA space UVM does not own, NV_ERR_UVM_ADDRESS_IN_USE, ...

Memory RM allocates (video memory, system memory, the usermode page) is a memfd: the CPU's mmap of it maps the same
pages the GPU side reads. OS-descriptor memory is the process's own pages. GPU addresses resolve through the VA
space's UVM external mappings, so a GPU access to anything not mapped is an MMU fault.

The GPU: one thread per channel, woken by the doorbell (the channel's token written to the usermode page at 0x90),
reads GPPut from USERD, decodes GPFIFO entries and pushbuffer methods from memory, and runs them: host semaphores
(release with the GPU clock at +8, acquires that poll memory), memory barriers, copy-engine copies and semaphores,
and compute launches. A launch reads the QMD, checks it (version, sizes, constant bank 0 as the driver must fill it)
and runs the kernel with the GPU program interpreter: the machine code cannot run here, so the program is found from
the code bytes at the QMD's program address, registered by the driver when it loaded the kernel (the compiler
carries the linear program after the cubin), by where the driver placed them, checked against their SHA-256 (see
../emulated_programs.py).

A fault (a bad method, an unaligned semaphore, a bad QMD, an access to unmapped memory) stops the channel group and
writes the error notifier as RM does after a robust-channel error; the details go to the log and to
`EmulatedKernel.faults`.
"""
from __future__ import annotations

import ctypes
import errno
import logging
import os
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rawgrad.autogen.nv import nv_classes as classes
from rawgrad.autogen.nv import nv_qmd as layouts
from rawgrad.autogen.nv import nv_rm as rm
from rawgrad.autogen.nv import nv_uvm as uvm
from rawgrad.drivers.emulated_programs import PlacedPrograms
from rawgrad.drivers.os import (MAP_SHARED, PROT_READ, PROT_WRITE, KernelInterface, RealKernel, host_view, ioc_number,
                                ioc_size)
from rawgrad.runtime.interpreter import InterpreterError, run_program

log = logging.getLogger(__name__)

# *** the emulated chip: an H100 SXM5 on driver 580 ***

DRIVER_VERSION = "580.159.04"
GPU_NAME = "NVIDIA H100 80GB HBM3 (emulated)"
GPU_ID, PCI_DEVICE_ID, MINOR = 0x100, 0x2330, 0
GPU_UUID = bytes(range(0xA0, 0xB0))
VIDEO_MEMORY_BYTES = 80 << 30
BAR1_BYTES = 128 << 30
SM_COUNT, TPC_COUNT = 132, 66   # an H100 SXM5 as sold: 8 GPCs of up to 9 TPCs, some floor-swept
GR_INFO = {rm.NV0080_CTRL_GR_INFO_INDEX_SM_VERSION: 0x900, rm.NV0080_CTRL_GR_INFO_INDEX_MAX_WARPS_PER_SM: 64,
           rm.NV0080_CTRL_GR_INFO_INDEX_MAX_THREADS_PER_WARP: 32, rm.NV0080_CTRL_GR_INFO_INDEX_LITTER_NUM_GPCS: 8,
           rm.NV0080_CTRL_GR_INFO_INDEX_LITTER_NUM_TPC_PER_GPC: 9,
           rm.NV0080_CTRL_GR_INFO_INDEX_LITTER_NUM_SM_PER_TPC: 2,
           rm.NV0080_CTRL_GR_INFO_INDEX_SHADER_PIPE_SUB_COUNT: TPC_COUNT}
FB_INFO = {rm.NV2080_CTRL_FB_INFO_INDEX_RAM_SIZE: VIDEO_MEMORY_BYTES >> 10,
           rm.NV2080_CTRL_FB_INFO_INDEX_TOTAL_RAM_SIZE: VIDEO_MEMORY_BYTES >> 10,
           rm.NV2080_CTRL_FB_INFO_INDEX_BAR1_SIZE: BAR1_BYTES >> 10,
           rm.NV2080_CTRL_FB_INFO_INDEX_L2CACHE_SIZE: 50 << 20}
GPFIFO_CLASSES = (classes.VOLTA_CHANNEL_GPFIFO_A, classes.TURING_CHANNEL_GPFIFO_A, classes.AMPERE_CHANNEL_GPFIFO_A,
                  classes.HOPPER_CHANNEL_GPFIFO_A)
USERMODE_CLASSES = (classes.VOLTA_USERMODE_A, classes.TURING_USERMODE_A, classes.AMPERE_USERMODE_A,
                    classes.HOPPER_USERMODE_A)
COMPUTE_CLASS, COPY_CLASS = classes.HOPPER_COMPUTE_A, classes.HOPPER_DMA_COPY_A
MEMORY_CLASSES = (rm.NV01_MEMORY_LOCAL_USER, rm.NV01_MEMORY_SYSTEM)
CHIP_CLASSES = (*GPFIFO_CLASSES, *USERMODE_CLASSES, COMPUTE_CLASS, COPY_CLASS, rm.FERMI_VASPACE_A,
                rm.KEPLER_CHANNEL_GROUP_A, rm.FERMI_CONTEXT_SHARE_A, *MEMORY_CLASSES,
                rm.NV01_MEMORY_SYSTEM_OS_DESCRIPTOR, rm.NV20_SUBDEVICE_0)   # what GET_CLASSLIST answers
ROOT_CLASSES = (rm.NV01_ROOT, rm.NV01_ROOT_CLIENT)
GPU_CLOCK_OFFSET_NS = 1 << 40          # the emulated PTIMER runs ahead of the host's monotonic clock
USERMODE_BYTES = 0x10000
DOORBELL = classes.NVC361_NOTIFY_CHANNEL_PENDING
USERD_GP_GET, USERD_GP_PUT = 0x88, 0x8C
QMD_BYTES, QMD_MAJOR = 384, 4
MAX_PARAMETER_BYTES = 0x7FFC
ACQUIRE_POLL_S = 50e-6
FIRST_FAKE_FD = 1 << 20

# robust-channel error codes the notifier reports (nverror.h)
XID_GR_EXCEPTION, XID_MMU_FAULT, XID_PBDMA_ERROR, XID_CE_ERROR, XID_GR_CLASS_ERROR = 13, 31, 32, 39, 69
ENGINE_GR0, ENGINE_COPY0 = rm.NV2080_ENGINE_TYPE_GR0, rm.NV2080_ENGINE_TYPE_COPY0


def gpu_time_ns() -> int:
  return time.monotonic_ns() + GPU_CLOCK_OFFSET_NS


# *** errors ***

class RMStatus(Exception):
  """RM's verdict: the ioctl returns 0 and the struct's status says this."""

  def __init__(self, status: int, why: str = ""):
    super().__init__(why)
    self.status = status


class GPUFault(Exception):
  """What stops a channel: a robust-channel error with its Xid code."""

  def __init__(self, xid: int, why: str):
    super().__init__(why)
    self.xid = xid


class ChannelStopped(Exception):
  """The channel was freed while its engine ran: drop the rest of its work."""


class MMUFault(GPUFault, InterpreterError):
  def __init__(self, why: str):
    super().__init__(XID_MMU_FAULT, why)


# *** memory ***

class Backing:
  """Pages the CPU and the emulated GPU both reach: a memfd (RM memory) or the process's own pages (OS descriptor)."""

  def __init__(self, real: RealKernel, nbytes: int, user_address: int | None = None):
    self.real, self.nbytes, self.fd = real, nbytes, -1
    if user_address is not None:
      self.address = user_address
      return
    self.fd = os.memfd_create("rawgrad-emulated-nv", os.MFD_CLOEXEC)
    os.ftruncate(self.fd, nbytes)
    self.address = real.mmap(0, nbytes, PROT_READ | PROT_WRITE, MAP_SHARED, self.fd, 0)

  def release(self) -> None:
    if self.fd >= 0:
      self.real.munmap(self.address, self.nbytes)
      os.close(self.fd)
      self.fd = -1


# *** RM objects ***

@dataclass(eq=False)
class RMObject:
  handle: int
  cls: int
  parent: RMObject | None
  client: RMObject | None
  params: Any = None
  children: dict[int, RMObject] = field(default_factory=dict)
  backing: Backing | None = None        # memory and usermode objects
  state: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False)
class File:
  fd: int
  kind: str                                # "ctl", "device" or "uvm"
  registered_to: File | None = None        # a device fd linked to a control fd (NV_ESC_REGISTER_FD)
  context: tuple[RMObject, int, int] | None = None    # (memory, offset, length) an mmap may map
  uvm: UVMSpace | None = None


@dataclass(eq=False)
class Mapping:
  base: int
  length: int
  kind: str                        # "external" (memory mapped once UVM_MAP_EXTERNAL_ALLOCATION names it) or "channel"
  memory: RMObject | None = None
  offset: int = 0


class UVMSpace:
  """One open /dev/nvidia-uvm: its GPU, its VA space and its ranges."""

  def __init__(self) -> None:
    self.initialized: int | None = None   # the flags it was initialized with
    self.gpu_registered = False
    self.vaspace: RMObject | None = None
    self.ranges: list[Mapping] = []       # external ranges (memory None until mapped) and channel ranges
    self.lock = threading.RLock()

  def find(self, address: int, nbytes: int) -> Mapping | None:
    with self.lock:
      for mapping in self.ranges:
        if mapping.base <= address and address + nbytes <= mapping.base + mapping.length: return mapping
    return None

  def overlaps(self, base: int, length: int) -> bool:
    return any(m.base < base + length and base < m.base + m.length for m in self.ranges)


# *** the interface ***

ESCAPE_SIZES = {
  rm.NV_ESC_RM_ALLOC: (ctypes.sizeof(rm.NVOS21_PARAMETERS), ctypes.sizeof(rm.NVOS64_PARAMETERS)),
  rm.NV_ESC_RM_CONTROL: (ctypes.sizeof(rm.NVOS54_PARAMETERS),),
  rm.NV_ESC_RM_FREE: (ctypes.sizeof(rm.NVOS00_PARAMETERS),),
  rm.NV_ESC_RM_MAP_MEMORY: (ctypes.sizeof(rm.nv_ioctl_nvos33_parameters_with_fd),),
  rm.NV_ESC_RM_UNMAP_MEMORY: (ctypes.sizeof(rm.NVOS34_PARAMETERS),),
  rm.NV_ESC_RM_ALLOC_MEMORY: (ctypes.sizeof(rm.nv_ioctl_nvos02_parameters_with_fd),),
  rm.NV_ESC_CHECK_VERSION_STR: (ctypes.sizeof(rm.nv_ioctl_rm_api_version_t),),
  rm.NV_ESC_REGISTER_FD: (ctypes.sizeof(rm.nv_ioctl_register_fd_t),),
}
DEVICE_ONLY = (rm.NV_ESC_RM_ALLOC_MEMORY, rm.NV_ESC_REGISTER_FD)   # refused on the control node (NV_ACTUAL_DEVICE_ONLY)


class EmulatedKernel(KernelInterface):
  """The kernel side of the NV driver, emulated: files, RM objects, UVM VA spaces, and the GPU's channels."""
  name = "emulated NVIDIA driver"
  runs_programs = True

  def __init__(self, version: str = DRIVER_VERSION):
    self.version = version
    self.real = RealKernel()
    self.files: dict[int, File] = {}
    self.next_fd = FIRST_FAKE_FD
    self.clients: dict[int, RMObject] = {}
    self.next_client, self.next_handle = 0xC1D00000, 0xCAF00000
    self.usermode_pages: list[tuple[int, int]] = []    # CPU (address, bytes) of mapped usermode pages
    self.channels: dict[int, ChannelEngine] = {}       # work-submit token -> channel
    self.video_bytes = 0
    self.faults: list[str] = []
    self.boosts: dict[int, tuple[int, int]] = {}       # client handle -> its performance boost (flags, duration)
    self.boost_supported = True
    self.programs = PlacedPrograms()
    self.lock = threading.RLock()

  # ** files

  def open(self, path: str, flags: int = os.O_RDWR | os.O_CLOEXEC) -> int:
    kinds = {"/dev/nvidiactl": "ctl", f"/dev/nvidia{MINOR}": "device", "/dev/nvidia-uvm": "uvm"}
    if path not in kinds: raise FileNotFoundError(errno.ENOENT, f"{path}: no such device on the emulated machine")
    with self.lock:
      fd, self.next_fd = self.next_fd, self.next_fd + 1
      self.files[fd] = File(fd, kinds[path], uvm=UVMSpace() if kinds[path] == "uvm" else None)
    return fd

  def close(self, fd: int) -> None:
    with self.lock:
      file = self.files.pop(fd, None)
      if file is None: raise OSError(errno.EBADF, f"close of fd {fd}, which is not open")
      if file.kind == "ctl":
        for handle in [h for h, client in self.clients.items() if client.state["fd"] == fd]:
          self._free_object(self.clients[handle])
      if file.kind == "uvm":   # the VA space goes, and with it UVM's hold on memory RM has freed
        for mapping in file.uvm.ranges:
          if mapping.memory is not None: self._unmap(mapping.memory)

  def read_text(self, path: str) -> str:
    if path == "/sys/module/nvidia/version": return f"{self.version}\n"
    if path == "/proc/driver/nvidia/version":
      return (f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {self.version}  Release Build  (emulated)\n"
              "GCC version:  gcc version 12.2.0\n")
    raise FileNotFoundError(errno.ENOENT, f"{path}: not on the emulated machine")

  def exists(self, path: str) -> bool:
    return path in ("/dev/nvidiactl", f"/dev/nvidia{MINOR}", "/dev/nvidia-uvm", "/sys/module/nvidia/version",
                    "/proc/driver/nvidia/version")

  def _file(self, fd: int) -> File:
    if fd not in self.files: raise OSError(errno.EBADF, f"fd {fd} is not open on the emulated driver")
    return self.files[fd]

  # ** memory mappings

  def mmap(self, address: int, length: int, prot: int, flags: int, fd: int, offset: int = 0) -> int:
    if fd < 0: return self.real.mmap(address, length, prot, flags, fd, offset)
    file = self._file(fd)
    if file.context is None or offset != 0:
      raise OSError(errno.EINVAL, f"mmap of fd {fd}: no RM mapping context, or an offset ({offset}) other than 0")
    memory, start, mapped = file.context
    if file.kind == "device" and length != mapped:
      raise OSError(errno.ENXIO, f"mmap of {length:#x} bytes, but RM_MAP_MEMORY mapped {mapped:#x}")
    if length > mapped: raise OSError(errno.ERANGE, f"mmap of {length:#x} bytes past the {mapped:#x} mapped")
    result = self.real.mmap(address, length, prot, flags, memory.backing.fd, start)
    if memory.cls in USERMODE_CLASSES: self.usermode_pages.append((result, length))
    return result

  def munmap(self, address: int, length: int) -> None:
    self.usermode_pages = [(a, n) for a, n in self.usermode_pages if a + n <= address or address + length <= a]
    self.real.munmap(address, length)

  def write32(self, address: int, value: int) -> None:
    super().write32(address, value)
    for page, nbytes in self.usermode_pages:
      if page <= address < page + nbytes and address - page == DOORBELL:
        self._doorbell(value)

  def register_program(self, address: int, code: bytes, program_text: str, facts: object) -> None:
    self.programs.register(address, code, program_text, facts)

  # ** ioctl

  def ioctl(self, fd: int, request: int, argument: ctypes.Structure | ctypes.Array | None) -> None:
    file = self._file(fd)
    with self.lock:
      if file.kind == "uvm": return self._uvm(file, request, argument)
      number, size = ioc_number(request), ioc_size(request)
      if argument is None or ctypes.sizeof(argument) < size:
        raise OSError(errno.EFAULT, f"escape {number:#x}: the argument holds fewer than the {size} bytes requested")
      data = bytearray(ctypes.string_at(ctypes.addressof(argument), size))
      try:
        self._escape(file, number, size, data)
      finally:  # the kernel copies the argument back, changed or not
        ctypes.memmove(ctypes.addressof(argument), bytes(data), size)

  def _escape(self, file: File, number: int, size: int, data: bytearray) -> None:
    """escape.c's order: the struct size, then the node, then the call itself."""
    if number == rm.NV_ESC_CARD_INFO: return self._card_info(file, size, data)
    if number not in ESCAPE_SIZES:
      raise OSError(errno.EINVAL, f"escape {number:#x} is not one the emulated driver knows (NV_ERR_GENERIC)")
    if size not in ESCAPE_SIZES[number]:
      raise OSError(errno.EINVAL, f"escape {number:#x} with a {size}-byte argument; the driver takes "
                                  f"{' or '.join(map(str, ESCAPE_SIZES[number]))} (escape.c: NV_ERR_INVALID_ARGUMENT)")
    if (number in DEVICE_ONLY) != (file.kind == "device"):
      raise OSError(errno.EINVAL, f"escape {number:#x} on the wrong node ({file.kind})")
    handlers = {rm.NV_ESC_RM_ALLOC: self._rm_alloc, rm.NV_ESC_RM_CONTROL: self._rm_control,
                rm.NV_ESC_RM_FREE: self._rm_free, rm.NV_ESC_RM_MAP_MEMORY: self._rm_map_memory,
                rm.NV_ESC_RM_UNMAP_MEMORY: self._rm_unmap_memory, rm.NV_ESC_RM_ALLOC_MEMORY: self._rm_alloc_memory,
                rm.NV_ESC_CHECK_VERSION_STR: self._check_version, rm.NV_ESC_REGISTER_FD: self._register_fd}
    handlers[number](file, data)

  def _card_info(self, file: File, size: int, data: bytearray) -> None:
    entry = ctypes.sizeof(rm.nv_ioctl_card_info_t)
    if file.kind != "ctl" or size % entry or size < entry:
      raise OSError(errno.EINVAL, f"NV_ESC_CARD_INFO with {size} bytes (a multiple of {entry} on the control node)")
    card = rm.nv_ioctl_card_info_t(valid=1, gpu_id=GPU_ID, minor_number=MINOR, fb_size=BAR1_BYTES)
    card.pci_info.vendor_id, card.pci_info.device_id = 0x10DE, PCI_DEVICE_ID
    data[:] = bytes(card) + bytes(size - entry)

  def _check_version(self, file: File, data: bytearray) -> None:
    query = rm.nv_ioctl_rm_api_version_t.from_buffer(data)
    query.reply = rm.NV_RM_API_VERSION_REPLY_RECOGNIZED
    wanted = query.versionString.decode(errors="replace")
    matches = query.cmd == rm.NV_RM_API_VERSION_CMD_QUERY or \
      (query.cmd == rm.NV_RM_API_VERSION_CMD_RELAXED and wanted.split(".")[0] == self.version.split(".")[0]) or \
      (query.cmd == rm.NV_RM_API_VERSION_CMD_STRICT and wanted == self.version)
    query.versionString = self.version.encode()
    if not matches: raise OSError(errno.EINVAL, f"API mismatch: the client has {wanted}, the kernel {self.version}")

  def _register_fd(self, file: File, data: bytearray) -> None:
    request = rm.nv_ioctl_register_fd_t.from_buffer(data)
    control = self.files.get(request.ctl_fd)
    if file.registered_to is not None:
      raise OSError(errno.EINVAL, "the fd is registered already (NV_ERR_INVALID_STATE)")
    if control is None or control.kind != "ctl":
      raise OSError(errno.EINVAL, f"fd {request.ctl_fd} is not a control fd (NV_ERR_INVALID_ARGUMENT)")
    file.registered_to = control

  # ** RM objects

  def _client(self, file: File, handle: int) -> RMObject:
    """The client, if this control fd owns it (client handles are validated strictly)."""
    client = self.clients.get(handle)
    owner = file.registered_to.fd if file.registered_to is not None else file.fd
    if client is None or client.state["fd"] != owner: raise RMStatus(rm.NV_ERR_INVALID_CLIENT, f"client {handle:#x}")
    return client

  def _object(self, client: RMObject, handle: int, status: int = rm.NV_ERR_INVALID_OBJECT_HANDLE) -> RMObject:
    if handle == client.handle: return client
    found = client.state["objects"].get(handle)
    if found is None: raise RMStatus(status, f"no object {handle:#x} in client {client.handle:#x}")
    return found

  def _rm_alloc(self, file: File, data: bytearray) -> None:
    wide = len(data) == ctypes.sizeof(rm.NVOS64_PARAMETERS)
    request = (rm.NVOS64_PARAMETERS if wide else rm.NVOS21_PARAMETERS).from_buffer(data)
    try:
      if request.hClass in ROOT_CLASSES: request.hObjectNew = self._new_client(file, request.hObjectNew)
      else: request.hObjectNew = self._alloc_object(file, request.hRoot, request.hObjectParent, request.hObjectNew,
                                                    request.hClass, request.pAllocParms)
      request.status = rm.NV_OK
    except RMStatus as refusal:
      request.status = refusal.status

  def _new_client(self, file: File, handle: int) -> int:
    if file.kind != "ctl": raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, "a client is made on the control node")
    if handle == 0:
      handle, self.next_client = self.next_client, self.next_client + 1
    if handle in self.clients: raise RMStatus(rm.NV_ERR_INSERT_DUPLICATE_NAME, f"client {handle:#x} exists")
    client = RMObject(handle, rm.NV01_ROOT_CLIENT, None, None, state={"fd": file.fd, "objects": {}})
    client.client = client
    self.clients[handle] = client
    return handle

  def _alloc_object(self, file: File, client_handle: int, parent_handle: int, handle: int, cls: int,
                    params_address: int) -> int:
    client = self._client(file, client_handle)
    if _allocation_key(cls) not in ALLOCATIONS:
      raise RMStatus(rm.NV_ERR_INVALID_CLASS, f"class {cls:#x} is not one the emulated H100 allocates through RM_ALLOC")
    parent = self._object(client, parent_handle, rm.NV_ERR_INVALID_OBJECT_PARENT)
    allowed_parent, params_type, required = ALLOCATIONS[_allocation_key(cls)]
    if parent.cls not in allowed_parent:
      raise RMStatus(rm.NV_ERR_INVALID_OBJECT_PARENT, f"class {cls:#x} cannot live under class {parent.cls:#x}")
    if handle == 0:
      handle, self.next_handle = self.next_handle, self.next_handle + 1
    if handle in client.state["objects"] or handle == client.handle:
      raise RMStatus(rm.NV_ERR_INSERT_DUPLICATE_NAME, f"handle {handle:#x} is taken")
    params = None
    if params_type is not None and params_address:
      params = params_type.from_buffer_copy(ctypes.string_at(params_address, ctypes.sizeof(params_type)))
    elif required:
      raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, f"class {cls:#x} needs its allocation parameters")
    obj = RMObject(handle, cls, parent, client, params)
    self._construct(obj, params_address)
    parent.children[handle] = obj
    client.state["objects"][handle] = obj
    return handle

  def _construct(self, obj: RMObject, params_address: int) -> None:
    """Class-specific checks and state (RM's constructors)."""
    cls, params = obj.cls, obj.params
    if cls == rm.NV01_DEVICE_0 and params is not None and params.deviceId != 0:
      raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, f"device instance {params.deviceId}: the machine has one GPU")
    if cls == rm.NV01_DEVICE_0 and not any(file.kind == "device" for file in self.files.values()):
      # nv_is_gpu_accessible: the process must hold the GPU's device node open (kernel-open/nvidia/nv.c)
      raise RMStatus(rm.NV_ERR_INSUFFICIENT_PERMISSIONS, f"no open /dev/nvidia{MINOR}: the GPU is not accessible")
    if cls == rm.FERMI_VASPACE_A:
      flags = params.flags if params is not None else 0
      if flags & rm.NV_VASPACE_ALLOCATION_FLAGS_ENABLE_PAGE_FAULTING and \
         not flags & rm.NV_VASPACE_ALLOCATION_FLAGS_IS_EXTERNALLY_OWNED:
        raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, "page faulting needs an externally owned VA space")
    elif cls in MEMORY_CLASSES: self._construct_memory(obj)
    elif cls in USERMODE_CLASSES: obj.backing = Backing(self.real, USERMODE_BYTES)
    elif cls == rm.KEPLER_CHANNEL_GROUP_A: self._construct_group(obj)
    elif cls == rm.FERMI_CONTEXT_SHARE_A:
      if params.hVASpace and params.hVASpace != obj.parent.state["vaspace"].handle:
        raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, "a context share's VA space must be its channel group's")
      params.subctxId = len(obj.parent.state.setdefault("context_shares", []))
      obj.parent.state["context_shares"].append(obj)
      ctypes.memmove(params_address, bytes(params), ctypes.sizeof(params))
    elif cls in GPFIFO_CLASSES: self._construct_channel(obj)
    elif cls in (COMPUTE_CLASS, COPY_CLASS): obj.parent.state.setdefault("engines", []).append(cls)

  def _construct_memory(self, obj: RMObject) -> None:
    params = obj.params
    if params.size == 0: raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, "a memory allocation of 0 bytes")
    if params.owner in (0, 0xFFFFFFFF): raise RMStatus(rm.NV_ERR_INVALID_OWNER, f"owner {params.owner:#x}")
    if obj.cls == rm.NV01_MEMORY_LOCAL_USER:
      if self.video_bytes + params.size > VIDEO_MEMORY_BYTES:
        raise RMStatus(rm.NV_ERR_NO_MEMORY, f"{params.size:#x} bytes more of video memory: "
                                            f"{self.video_bytes:#x} of {VIDEO_MEMORY_BYTES:#x} are in use")
      self.video_bytes += params.size
    obj.backing = Backing(self.real, params.size)

  def _construct_group(self, obj: RMObject) -> None:
    params = obj.params
    device = obj.parent
    vaspace = device.children.get(params.hVASpace)
    if vaspace is None or vaspace.cls != rm.FERMI_VASPACE_A:
      raise RMStatus(rm.NV_ERR_INVALID_OBJECT_HANDLE, f"channel group VA space {params.hVASpace:#x}")
    if params.engineType not in (ENGINE_GR0, *range(ENGINE_COPY0, ENGINE_COPY0 + 10)):
      raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, f"engine type {params.engineType}")
    obj.state.update(vaspace=vaspace, error=self._notifier(obj.client, params.hObjectError), channels=[],
                     scheduled=False, dead=None)

  def _notifier(self, client: RMObject, handle: int) -> RMObject | None:
    if handle == 0: return None
    memory = self._object(client, handle)
    if memory.cls not in MEMORY_CLASSES: raise RMStatus(rm.NV_ERR_INVALID_OBJECT_HANDLE, f"notifier {handle:#x}")
    return memory

  def _construct_channel(self, obj: RMObject) -> None:
    params, group = obj.params, obj.parent
    entries = params.gpFifoEntries
    if entries == 0 or entries & (entries - 1):
      raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, f"{entries} GPFIFO entries: a power of two is required")
    if params.gpFifoOffset % 8 or params.gpFifoOffset + 8 * entries > 1 << 40:
      raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, f"GPFIFO ring at {params.gpFifoOffset:#x} (8-aligned, below 2^40)")
    userd = self._object(obj.client, params.hUserdMemory[0])
    if userd.cls not in MEMORY_CLASSES or params.userdOffset[0] % 512 or \
       params.userdOffset[0] + 512 > userd.params.size:
      raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, f"USERD at offset {params.userdOffset[0]:#x} of object "
                                                 f"{params.hUserdMemory[0]:#x} (512-aligned, inside a memory object)")
    if params.hContextShare and params.hContextShare not in group.children:
      raise RMStatus(rm.NV_ERR_INVALID_OBJECT_HANDLE, f"context share {params.hContextShare:#x} of another group")
    token = len(self.channels) + 1
    engine = ChannelEngine(self, obj, token, userd, params.userdOffset[0], self._notifier(obj.client,
                                                                                          params.hObjectError))
    obj.state.update(token=token, engine=engine, registered=False)
    group.state["channels"].append(obj)
    self.channels[token] = engine

  def _rm_alloc_memory(self, file: File, data: bytearray) -> None:
    request = rm.nv_ioctl_nvos02_parameters_with_fd.from_buffer(data).params
    try:
      if file.registered_to is None: raise RMStatus(rm.NV_ERR_INVALID_CLIENT, "the device fd is not registered")
      client = self._client(file, request.hRoot)
      if request.hClass != rm.NV01_MEMORY_SYSTEM_OS_DESCRIPTOR:
        raise RMStatus(rm.NV_ERR_INVALID_CLASS, f"class {request.hClass:#x} through NV_ESC_RM_ALLOC_MEMORY")
      flags = request.flags
      if _bits(flags, rm.NVOS02_FLAGS_LOCATION) != rm.NVOS02_FLAGS_LOCATION_PCI or \
         _bits(flags, rm.NVOS02_FLAGS_MAPPING) != rm.NVOS02_FLAGS_MAPPING_NO_MAP:
        raise RMStatus(rm.NV_ERR_INVALID_FLAGS, f"OS descriptor flags {flags:#x} (LOCATION_PCI and MAPPING_NO_MAP)")
      if request.pMemory % 4096: raise RMStatus(rm.NV_ERR_NOT_SUPPORTED, f"user memory at {request.pMemory:#x}")
      parent = self._object(client, request.hObjectParent, rm.NV_ERR_INVALID_OBJECT_PARENT)
      if parent.cls != rm.NV01_DEVICE_0: raise RMStatus(rm.NV_ERR_INVALID_OBJECT_PARENT, "memory lives under a device")
      if request.hObjectNew == 0 or request.hObjectNew in client.state["objects"]:
        raise RMStatus(rm.NV_ERR_INSERT_DUPLICATE_NAME, f"handle {request.hObjectNew:#x}")
      size = request.limit + 1
      params = rm.NV_MEMORY_ALLOCATION_PARAMS(size=size)
      obj = RMObject(request.hObjectNew, request.hClass, parent, client, params,
                     backing=Backing(self.real, size, user_address=request.pMemory))
      parent.children[obj.handle] = obj
      client.state["objects"][obj.handle] = obj
      request.status = rm.NV_OK
    except RMStatus as refusal:
      request.status = refusal.status

  def _rm_free(self, file: File, data: bytearray) -> None:
    request = rm.NVOS00_PARAMETERS.from_buffer(data)
    try:
      client = self._client(file, request.hRoot)
      obj = self._object(client, request.hObjectOld)
      if obj is not client and obj.parent.handle != request.hObjectParent:
        raise RMStatus(rm.NV_ERR_INVALID_OBJECT_PARENT,
                       f"object {obj.handle:#x} is not under {request.hObjectParent:#x}")
      self._free_object(obj)
      request.status = rm.NV_OK
    except RMStatus as refusal:
      request.status = refusal.status

  def _free_object(self, obj: RMObject) -> None:
    """Free the object and everything under it. Every channel among them stops first: children go in the order
    they were made, so a notifier allocated before its channel was released while the channel's engine could still
    write a fault into it (a segfault of the test process, seen once under CPU_ISA=avx2)."""
    self._stop_channels(obj)
    self._release(obj)

  def _stop_channels(self, obj: RMObject) -> None:
    for child in obj.children.values(): self._stop_channels(child)
    if obj.cls in GPFIFO_CLASSES and (engine := self.channels.pop(obj.state["token"], None)) is not None: engine.stop()

  def _release(self, obj: RMObject) -> None:
    for child in list(obj.children.values()): self._release(child)
    if obj.backing is not None and obj.cls != rm.NV01_MEMORY_SYSTEM_OS_DESCRIPTOR:
      if obj.cls == rm.NV01_MEMORY_LOCAL_USER: self.video_bytes -= obj.params.size
      if not obj.state.get("uvm_mapped"): obj.backing.release()   # UVM keeps what it maps until UVM_FREE
    if obj.parent is not None: obj.parent.children.pop(obj.handle, None)
    if obj.client is not None and obj.client is not obj: obj.client.state["objects"].pop(obj.handle, None)
    if obj.cls == rm.NV01_ROOT_CLIENT:
      self.clients.pop(obj.handle, None)
      self.boosts.pop(obj.handle, None)

  def _rm_map_memory(self, file: File, data: bytearray) -> None:
    wrapper = rm.nv_ioctl_nvos33_parameters_with_fd.from_buffer(data)
    request = wrapper.params
    try:
      client = self._client(file, request.hClient)
      memory = self._object(client, request.hMemory)
      if memory.backing is None or memory.cls == rm.NV01_MEMORY_SYSTEM_OS_DESCRIPTOR:
        raise RMStatus(rm.NV_ERR_INVALID_OBJECT, f"object {request.hMemory:#x} cannot be mapped for the CPU")
      target = self.files.get(wrapper.fd)
      wanted = "ctl" if memory.cls == rm.NV01_MEMORY_SYSTEM else "device"
      if target is None or target.kind != wanted:
        raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, f"the mapping fd {wrapper.fd} must be a fresh {wanted} fd")
      if target.context is not None: raise RMStatus(rm.NV_ERR_STATE_IN_USE, f"fd {wrapper.fd} maps something already")
      if request.offset % 4096 or request.length == 0 or request.offset + request.length > memory.backing.nbytes:
        raise RMStatus(rm.NV_ERR_INVALID_LIMIT, f"{request.length:#x} bytes at offset {request.offset:#x} of "
                                                f"{memory.backing.nbytes:#x}")
      target.context = (memory, request.offset, request.length)
      request.pLinearAddress = 0x1000_0000 + wrapper.fd * 0x1000
      request.status = rm.NV_OK
    except RMStatus as refusal:
      request.status = refusal.status

  def _rm_unmap_memory(self, file: File, data: bytearray) -> None:
    rm.NVOS34_PARAMETERS.from_buffer(data).status = rm.NV_OK

  # ** RM controls

  def _rm_control(self, file: File, data: bytearray) -> None:
    request = rm.NVOS54_PARAMETERS.from_buffer(data)
    try:
      client = self._client(file, request.hClient)
      target = self._object(client, request.hObject)
      handler = CONTROLS.get(request.cmd)
      if handler is None or not _control_fits(request.cmd, target.cls):
        raise RMStatus(rm.NV_ERR_NOT_SUPPORTED, f"control {request.cmd:#x} on class {target.cls:#x}")
      params_type, method = handler
      if request.paramsSize != ctypes.sizeof(params_type):
        raise RMStatus(rm.NV_ERR_INVALID_PARAM_STRUCT, f"control {request.cmd:#x} with {request.paramsSize} bytes of "
                                                      f"parameters; it takes {ctypes.sizeof(params_type)}")
      if request.params == 0: raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, "control parameters at NULL")
      params = params_type.from_buffer_copy(ctypes.string_at(request.params, request.paramsSize))
      getattr(self, method)(target, params)
      ctypes.memmove(request.params, bytes(params), request.paramsSize)
      request.status = rm.NV_OK
    except RMStatus as refusal:
      request.status = refusal.status

  def _control_gpu_id_info(self, target: RMObject, params: Any) -> None:
    if params.gpuId != GPU_ID: raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, f"GPU id {params.gpuId:#x}")
    params.deviceInstance, params.subDeviceInstance, params.gpuInstance = 0, 0, 0

  def _control_class_list(self, target: RMObject, params: Any) -> None:
    params.numClasses = len(CHIP_CLASSES)
    for i, cls in enumerate(CHIP_CLASSES): params.classList[i] = cls

  def _control_name(self, target: RMObject, params: Any) -> None:
    name = GPU_NAME.encode()
    ctypes.memmove(ctypes.addressof(params.gpuNameString), name, len(name))

  def _control_gid(self, target: RMObject, params: Any) -> None:
    binary = rm.NV2080_GPU_CMD_GPU_GET_GID_FLAGS_FORMAT_BINARY
    if _bits(params.flags, rm.NV2080_GPU_CMD_GPU_GET_GID_FLAGS_FORMAT) == binary:
      params.length = 16
      params.data[:16] = list(GPU_UUID)
    else:
      text = b"GPU-" + GPU_UUID.hex().encode()
      params.length = len(text) + 1
      params.data[:len(text)] = list(text)

  def _control_info_list(self, known: dict[int, int], count_field: str, list_field: str, maximum: int,
                         params: Any) -> None:
    count = getattr(params, count_field)
    if count > maximum: raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, f"{count} info entries (at most {maximum})")
    entries = getattr(params, list_field)
    for i in range(count):
      if entries[i].index not in known: raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, f"info index {entries[i].index:#x}")
      entries[i].data = known[entries[i].index]

  def _control_gr_info(self, target: RMObject, params: Any) -> None:
    self._control_info_list(GR_INFO, "grInfoListSize", "grInfoList", rm.NV2080_CTRL_GR_INFO_MAX_SIZE, params)

  def _control_fb_info(self, target: RMObject, params: Any) -> None:
    self._control_info_list(FB_INFO, "fbInfoListSize", "fbInfoList", rm.NV2080_CTRL_FB_INFO_MAX_LIST_SIZE, params)

  def _control_sm_order(self, target: RMObject, params: Any) -> None:
    params.numSm, params.numTpc = SM_COUNT, TPC_COUNT
    for sm in range(SM_COUNT):
      entry = params.globalSmId[sm]
      entry.globalTpcId, entry.localSmId, entry.gpcId = sm // 2, sm % 2, sm // 2 // 9

  def _control_boost(self, target: RMObject, params: Any) -> None:
    """Each client's boost is its own; a boost lasts 1 s to DURATION_MAX s, or until cleared (INFINITE)."""
    if not self.boost_supported: raise RMStatus(rm.NV_ERR_NOT_SUPPORTED, "a performance boost on this GPU")
    command = _bits(params.flags, rm.NV2080_CTRL_PERF_BOOST_FLAGS_CMD)
    if command == rm.NV2080_CTRL_PERF_BOOST_FLAGS_CMD_CLEAR:
      self.boosts.pop(target.client.handle, None)
      return
    boosts = (rm.NV2080_CTRL_PERF_BOOST_FLAGS_CMD_BOOST_1LEVEL, rm.NV2080_CTRL_PERF_BOOST_FLAGS_CMD_BOOST_TO_MAX)
    if command not in boosts:
      raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, f"performance boost command {command}")
    if not (0 < params.duration <= rm.NV2080_CTRL_PERF_BOOST_DURATION_MAX
            or params.duration == rm.NV2080_CTRL_PERF_BOOST_DURATION_INFINITE):
      raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, f"a performance boost of {params.duration} s")
    self.boosts[target.client.handle] = (params.flags, params.duration)

  def _control_time(self, target: RMObject, params: Any) -> None:
    params.time_nsec = gpu_time_ns()

  def _control_token(self, target: RMObject, params: Any) -> None:
    params.workSubmitToken = target.state["token"]

  def _control_schedule(self, target: RMObject, params: Any) -> None:
    """RM refuses to schedule a channel of an externally owned VA space until UVM bound its context buffers."""
    for channel in target.state["channels"]:
      if not channel.state.get("engines"):
        raise RMStatus(rm.NV_ERR_INVALID_STATE, f"channel {channel.handle:#x} has no engine object")
      if not channel.state["registered"]:
        raise RMStatus(rm.NV_ERR_INVALID_STATE, f"channel {channel.handle:#x} is not registered with UVM")
    target.state["scheduled"] = bool(params.bEnable)

  # ** UVM

  def _uvm(self, file: File, request: int, argument: ctypes.Structure | ctypes.Array | None) -> None:
    if request not in UVM_CALLS: raise OSError(errno.EINVAL, f"UVM ioctl {request:#x} is not emulated")
    params_type, name = UVM_CALLS[request]
    if argument is None or ctypes.sizeof(argument) < ctypes.sizeof(params_type):
      raise OSError(errno.EFAULT, f"UVM {name}: the argument is smaller than {params_type.__name__}")
    params = params_type.from_buffer(argument)
    space = file.uvm
    try:
      if request != uvm.UVM_INITIALIZE and request != uvm.UVM_MM_INITIALIZE and space.initialized is None:
        raise RMStatus(rm.NV_ERR_ILLEGAL_ACTION, "UVM_INITIALIZE first")
      getattr(self, f"_uvm_{name}")(file, space, params)
      params.rmStatus = rm.NV_OK
    except RMStatus as refusal:
      params.rmStatus = refusal.status

  def _uvm_initialize(self, file: File, space: UVMSpace, params: Any) -> None:
    if params.flags & ~uvm.UVM_INIT_FLAGS_MASK: raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, f"flags {params.flags:#x}")
    if space.initialized is not None and space.initialized != params.flags:
      raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, "initialized before with other flags")
    space.initialized = params.flags

  def _uvm_mm_initialize(self, file: File, space: UVMSpace, params: Any) -> None:
    if space.initialized is not None: raise RMStatus(rm.NV_ERR_IN_USE, "UVM_MM_INITIALIZE on the primary fd")
    primary = self.files.get(params.uvmFd)
    if primary is None or primary.kind != "uvm" or primary.uvm.initialized is None:
      raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, f"fd {params.uvmFd} is not an initialized UVM fd")
    space.initialized = primary.uvm.initialized

  def _uvm_register_gpu(self, file: File, space: UVMSpace, params: Any) -> None:
    if bytes(params.gpu_uuid.uuid) != GPU_UUID: raise RMStatus(rm.NV_ERR_GPU_UUID_NOT_FOUND, "unknown GPU UUID")
    if space.gpu_registered: raise RMStatus(rm.NV_ERR_INVALID_DEVICE, "the GPU is registered already")
    space.gpu_registered = True
    params.numaEnabled, params.numaNodeId = 0, -1

  def _uvm_rm_object(self, control_fd: int, client_handle: int, handle: int) -> RMObject:
    control = self.files.get(control_fd)
    client = self.clients.get(client_handle)
    if control is None or control.kind != "ctl" or client is None or client.state["fd"] != control_fd:
      raise RMStatus(rm.NV_ERR_INVALID_CLIENT, f"client {client_handle:#x} on fd {control_fd}")
    found = client.state["objects"].get(handle)
    if found is None: raise RMStatus(rm.NV_ERR_OBJECT_NOT_FOUND, f"object {handle:#x}")
    return found

  def _uvm_register_gpu_vaspace(self, file: File, space: UVMSpace, params: Any) -> None:
    self._uvm_gpu(space, params.gpuUuid)
    vaspace = self._uvm_rm_object(params.rmCtrlFd, params.hClient, params.hVaSpace)
    if vaspace.cls != rm.FERMI_VASPACE_A: raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, "not a VA space")
    if not vaspace.params or not vaspace.params.flags & rm.NV_VASPACE_ALLOCATION_FLAGS_IS_EXTERNALLY_OWNED:
      raise RMStatus(rm.NV_ERR_INVALID_FLAGS, "the VA space is not externally owned")
    if space.vaspace is not None: raise RMStatus(rm.NV_ERR_INVALID_DEVICE, "a VA space is registered already")
    space.vaspace = vaspace
    vaspace.state["uvm"] = space

  def _uvm_gpu(self, space: UVMSpace, uuid: Any) -> None:
    if bytes(uuid.uuid) != GPU_UUID or not space.gpu_registered:
      raise RMStatus(rm.NV_ERR_INVALID_DEVICE, "the GPU is not registered with this UVM fd")

  def _uvm_register_channel(self, file: File, space: UVMSpace, params: Any) -> None:
    self._uvm_gpu(space, params.gpuUuid)
    channel = self._uvm_rm_object(params.rmCtrlFd, params.hClient, params.hChannel)
    if channel.cls not in GPFIFO_CLASSES: raise RMStatus(rm.NV_ERR_INVALID_CHANNEL, f"object {channel.handle:#x}")
    if channel.parent.state["vaspace"] is not space.vaspace:
      raise RMStatus(rm.NV_ERR_INVALID_CHANNEL, "the channel's VA space is not the one registered with this fd")
    self._check_range(space, params.base, params.length)
    if params.length < 16 << 20:
      raise RMStatus(rm.NV_ERR_INVALID_ADDRESS, f"{params.length:#x} bytes cannot hold the channel's buffers")
    with space.lock: space.ranges.append(Mapping(params.base, params.length, "channel"))
    channel.state["registered"] = True

  def _check_range(self, space: UVMSpace, base: int, length: int) -> None:
    if base % 4096 or length % 4096 or length == 0 or base + length > 1 << 57:
      raise RMStatus(rm.NV_ERR_INVALID_ADDRESS, f"range {base:#x}+{length:#x} (4 KiB aligned, nonzero)")
    if space.overlaps(base, length):
      raise RMStatus(rm.NV_ERR_UVM_ADDRESS_IN_USE, f"range {base:#x}+{length:#x} overlaps another")

  def _uvm_create_external_range(self, file: File, space: UVMSpace, params: Any) -> None:
    self._check_range(space, params.base, params.length)
    with space.lock: space.ranges.append(Mapping(params.base, params.length, "external"))

  def _uvm_map_external_allocation(self, file: File, space: UVMSpace, params: Any) -> None:
    if not 1 <= params.gpuAttributesCount <= uvm.UVM_MAX_GPUS:
      raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, f"{params.gpuAttributesCount} GPU attributes")
    self._uvm_gpu(space, params.perGpuAttributes[0].gpuUuid)
    if space.vaspace is None: raise RMStatus(rm.NV_ERR_INVALID_DEVICE, "no GPU VA space is registered")
    external = space.find(params.base, params.length)
    if external is None or external.kind != "external" or external.base != params.base:
      raise RMStatus(rm.NV_ERR_INVALID_ADDRESS, f"{params.base:#x}+{params.length:#x} is not one external range")
    memory = self._uvm_rm_object(params.rmCtrlFd, params.hClient, params.hMemory)
    if memory.backing is None or memory.cls in USERMODE_CLASSES:
      raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, f"object {memory.handle:#x} is not memory")
    if params.offset % 4096 or params.offset + params.length > memory.backing.nbytes:
      raise RMStatus(rm.NV_ERR_INVALID_OFFSET, f"{params.length:#x} bytes at {params.offset:#x} of "
                                               f"{memory.backing.nbytes:#x}")
    with space.lock: external.memory, external.offset = memory, params.offset
    memory.state["uvm_mapped"] = True

  def _uvm_free(self, file: File, space: UVMSpace, params: Any) -> None:
    with space.lock:
      found = next((m for m in space.ranges if m.base == params.base), None)
      if found is None: raise RMStatus(rm.NV_ERR_INVALID_ADDRESS, f"no range starts at {params.base:#x}")
      space.ranges.remove(found)
    if found.memory is not None: self._unmap(found.memory)

  def _unmap(self, memory: RMObject) -> None:
    memory.state["uvm_mapped"] = False
    if memory.handle not in memory.client.state["objects"] and memory.cls != rm.NV01_MEMORY_SYSTEM_OS_DESCRIPTOR:
      memory.backing.release()   # RM freed it while UVM still mapped it

  # ** the GPU

  def _doorbell(self, token: int) -> None:
    engine = self.channels.get(token)
    if engine is not None: engine.ring()   # an unknown token is ignored, as the hardware ignores it

  def record_fault(self, message: str) -> None:
    self.faults.append(message)
    log.error("emulated GPU: %s", message)


def _bits(value: int, bits: tuple[int, int]) -> int:
  high, low = bits
  return (value >> low) & ((1 << (high - low + 1)) - 1)


def _allocation_key(cls: int) -> int:
  for group in (GPFIFO_CLASSES, USERMODE_CLASSES, MEMORY_CLASSES):
    if cls in group: return group[0]
  return cls


# class -> (allowed parent classes, parameter struct, parameters required)
ALLOCATIONS: dict[int, tuple[tuple[int, ...], Any, bool]] = {
  rm.NV01_DEVICE_0: ((rm.NV01_ROOT_CLIENT,), rm.NV0080_ALLOC_PARAMETERS, True),
  rm.NV20_SUBDEVICE_0: ((rm.NV01_DEVICE_0,), rm.NV2080_ALLOC_PARAMETERS, False),
  USERMODE_CLASSES[0]: ((rm.NV20_SUBDEVICE_0,), rm.NV_HOPPER_USERMODE_A_PARAMS, False),
  rm.FERMI_VASPACE_A: ((rm.NV01_DEVICE_0,), rm.NV_VASPACE_ALLOCATION_PARAMETERS, False),
  MEMORY_CLASSES[0]: ((rm.NV01_DEVICE_0,), rm.NV_MEMORY_ALLOCATION_PARAMS, True),
  rm.KEPLER_CHANNEL_GROUP_A: ((rm.NV01_DEVICE_0,), rm.NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS, True),
  rm.FERMI_CONTEXT_SHARE_A: ((rm.KEPLER_CHANNEL_GROUP_A,), rm.NV_CTXSHARE_ALLOCATION_PARAMETERS, True),
  GPFIFO_CLASSES[0]: ((rm.KEPLER_CHANNEL_GROUP_A,), rm.NV_CHANNEL_ALLOC_PARAMS, True),
  COMPUTE_CLASS: (GPFIFO_CLASSES, None, False),
  COPY_CLASS: (GPFIFO_CLASSES, None, False),
}

# control -> (parameter struct, the method answering it); the control's class family is the command's top 16 bits
CONTROLS: dict[int, tuple[Any, str]] = {
  rm.NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2: (rm.NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS,
                                          "_control_gpu_id_info"),
  rm.NV0080_CTRL_CMD_GPU_GET_CLASSLIST_V2: (rm.NV0080_CTRL_GPU_GET_CLASSLIST_V2_PARAMS,
                                            "_control_class_list"),
  rm.NV2080_CTRL_CMD_GPU_GET_NAME_STRING: (rm.NV2080_CTRL_GPU_GET_NAME_STRING_PARAMS, "_control_name"),
  rm.NV2080_CTRL_CMD_GPU_GET_GID_INFO: (rm.NV2080_CTRL_GPU_GET_GID_INFO_PARAMS, "_control_gid"),
  rm.NV2080_CTRL_CMD_GR_GET_INFO_V2: (rm.NV2080_CTRL_GR_GET_INFO_V2_PARAMS, "_control_gr_info"),
  rm.NV2080_CTRL_CMD_FB_GET_INFO_V2: (rm.NV2080_CTRL_FB_GET_INFO_V2_PARAMS, "_control_fb_info"),
  rm.NV2080_CTRL_CMD_TIMER_GET_TIME: (rm.NV2080_CTRL_TIMER_GET_TIME_PARAMS, "_control_time"),
  rm.NV2080_CTRL_CMD_PERF_BOOST: (rm.NV2080_CTRL_PERF_BOOST_PARAMS, "_control_boost"),
  rm.NV2080_CTRL_CMD_GR_GET_GLOBAL_SM_ORDER: (rm.NV2080_CTRL_GR_GET_GLOBAL_SM_ORDER_PARAMS,
                                              "_control_sm_order"),
  rm.NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN: (rm.NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN_PARAMS,
                                                    "_control_token"),
  rm.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE: (rm.NVA06C_CTRL_GPFIFO_SCHEDULE_PARAMS, "_control_schedule"),
}


def _control_fits(command: int, cls: int) -> bool:
  family = command >> 16
  if family == 0x0000: return cls == rm.NV01_ROOT_CLIENT
  if family == 0x0080: return cls == rm.NV01_DEVICE_0
  if family == 0x2080: return cls == rm.NV20_SUBDEVICE_0
  if family == 0xA06C: return cls == rm.KEPLER_CHANNEL_GROUP_A
  if family == 0xC36F: return cls in GPFIFO_CLASSES
  return False


UVM_CALLS: dict[int, tuple[Any, str]] = {
  uvm.UVM_INITIALIZE: (uvm.UVM_INITIALIZE_PARAMS, "initialize"),
  uvm.UVM_MM_INITIALIZE: (uvm.UVM_MM_INITIALIZE_PARAMS, "mm_initialize"),
  uvm.UVM_REGISTER_GPU: (uvm.UVM_REGISTER_GPU_PARAMS, "register_gpu"),
  uvm.UVM_REGISTER_GPU_VASPACE: (uvm.UVM_REGISTER_GPU_VASPACE_PARAMS, "register_gpu_vaspace"),
  uvm.UVM_REGISTER_CHANNEL: (uvm.UVM_REGISTER_CHANNEL_PARAMS, "register_channel"),
  uvm.UVM_CREATE_EXTERNAL_RANGE: (uvm.UVM_CREATE_EXTERNAL_RANGE_PARAMS, "create_external_range"),
  uvm.UVM_MAP_EXTERNAL_ALLOCATION: (uvm.UVM_MAP_EXTERNAL_ALLOCATION_PARAMS, "map_external_allocation"),
  uvm.UVM_FREE: (uvm.UVM_FREE_PARAMS, "free"),
}


# *** the methods each engine class defines ***

def class_methods(prefix: str) -> dict[int, str]:
  """Method address -> name for a class header's prefix ("NVCBC0_"): integer constants that are not the values of a
  field (those are named after a (hi, lo) field: FIELD_VALUE)."""
  names = {name: value for name, value in vars(classes).items() if name.startswith(prefix)}
  fields = {name for name, value in names.items() if isinstance(value, tuple)}
  methods = {}
  for name, value in names.items():
    parts = name.split("_")
    if isinstance(value, int) and not any("_".join(parts[:k]) in fields for k in range(1, len(parts))):
      methods.setdefault(value, name[len(prefix):])
  return methods


COMPUTE_METHODS = class_methods("NVCBC0_")
COPY_METHODS = class_methods("NVC8B5_")
HOST_METHODS = {address: name for address, name in class_methods("NVC56F_").items() if address < 0x100}


# *** a channel's command processor ***

class ChannelEngine:
  """The GPU side of one channel: a thread that, after a doorbell, runs the GPFIFO entries between GPGet and GPPut."""

  def __init__(self, kernel: EmulatedKernel, channel: RMObject, token: int, userd: RMObject, userd_offset: int,
               notifier: RMObject | None):
    self.kernel, self.channel, self.token = kernel, channel, token
    self.group = channel.parent
    self.userd = host_view(userd.backing.address + userd_offset, 512).view(np.uint32)
    self.notifier = notifier
    self.entries = channel.params.gpFifoEntries
    self.ring_address = channel.params.gpFifoOffset
    self.get = 0
    self.subchannels: dict[int, int] = {}   # subchannel -> bound class
    self.registers: dict[int, int] = {}     # method address -> last value (host and engine methods)
    self.doorbell = threading.Event()
    self.stopped = False
    self.position = "idle"
    self.thread = threading.Thread(target=self._run, name=f"emulated NV channel {token}", daemon=True)
    self.thread.start()

  def ring(self) -> None:
    self.doorbell.set()

  def stop(self, timeout_s: float = 10.0) -> None:
    """Stop the engine and wait until it no longer touches memory (which its freeing is about to take away)."""
    self.stopped = True
    self.doorbell.set()
    if threading.current_thread() is not self.thread: self.thread.join(timeout_s)

  @property
  def space(self) -> UVMSpace:
    space = self.group.state["vaspace"].state.get("uvm")
    if space is None: raise MMUFault("the channel's VA space is not registered with UVM: it has no page tables")
    return space

  def memory(self, address: int, nbytes: int) -> np.ndarray:
    """The bytes at a GPU virtual address: an MMU fault when they are not mapped."""
    mapping = self.space.find(address, max(nbytes, 1))
    if mapping is None or mapping.memory is None:
      raise MMUFault(f"GPU access to {address:#x} (+{nbytes} bytes): no mapping")
    backing = mapping.memory.backing
    return host_view(backing.address + mapping.offset + address - mapping.base, nbytes)

  def _run(self) -> None:
    while not self.stopped:
      self.doorbell.wait(0.5)
      self.doorbell.clear()
      if self.stopped or self.group.state["dead"] is not None or not self.group.state["scheduled"]: continue
      try:
        self._drain()
      except ChannelStopped:
        return
      except GPUFault as fault:
        self._fault(fault)
      except Exception as error:  # noqa: BLE001 - an emulator bug must not look like a hang either
        self._fault(GPUFault(XID_PBDMA_ERROR, f"emulator error: {type(error).__name__}: {error}"))

  def _drain(self) -> None:
    while (put := int(self.userd[USERD_GP_PUT // 4])) != self.get:
      if put >= self.entries: raise GPUFault(XID_PBDMA_ERROR, f"GPPut {put} is past the {self.entries}-entry ring")
      entry = int(self.memory(self.ring_address + 8 * self.get, 8).view(np.uint64)[0])
      self.position = f"GPFIFO entry {self.get}"
      self._entry(entry)
      self.get = (self.get + 1) % self.entries
      self.userd[USERD_GP_GET // 4] = self.get

  def _entry(self, entry: int) -> None:
    low, high = entry & 0xFFFFFFFF, entry >> 32
    length = _bits(high, classes.NVC86F_GP_ENTRY1_LENGTH)
    if length == 0:
      opcode = _bits(high, classes.NVC86F_GP_ENTRY1_OPCODE)
      if opcode != classes.NVC86F_GP_ENTRY1_OPCODE_NOP:
        raise GPUFault(XID_PBDMA_ERROR, f"GPFIFO control entry with opcode {opcode} is not emulated")
      return
    address = (_bits(low, classes.NVC86F_GP_ENTRY0_GET) << 2) | (_bits(high, classes.NVC86F_GP_ENTRY1_GET_HI) << 32)
    if address + 4 * length > 1 << 40:
      raise GPUFault(XID_PBDMA_ERROR, f"pushbuffer segment at {address:#x} crosses 2^40")
    words = self.memory(address, 4 * length).view(np.uint32).copy()   # the PBDMA fetches the segment
    self._methods(words, address)

  def _methods(self, words: np.ndarray, address: int) -> None:
    i = 0
    while i < len(words):
      header = int(words[i])
      opcode = header >> 29
      count, subchannel, method = (header >> 16) & 0x1FFF, (header >> 13) & 7, (header & 0xFFF) << 2
      self.position = f"pushbuffer word {i} at {address + 4 * i:#x}"
      if header == 0: i += 1
      elif opcode in (1, 3, 5):   # incrementing, non-incrementing, increment once
        if i + 1 + count > len(words):
          raise GPUFault(XID_PBDMA_ERROR, f"method {method:#x} wants {count} data words past the segment's end")
        for k in range(count):
          target = method + 4 * k if opcode == 1 else method + 4 * min(k, 1) if opcode == 5 else method
          self._method(subchannel, target, int(words[i + 1 + k]))
        i += 1 + count
      elif opcode == 4:           # immediate data
        self._method(subchannel, method, count)
        i += 1
      elif opcode == 7: return    # END_PB_SEGMENT
      else: raise GPUFault(XID_PBDMA_ERROR, f"pushbuffer word {header:#010x}: unknown opcode {opcode}")

  def _method(self, subchannel: int, method: int, data: int) -> None:
    if self.stopped: raise ChannelStopped()
    if method == classes.NVC86F_SET_OBJECT: return self._bind(subchannel, data & 0xFFFF)
    if method < 0x100: return self._host_method(method, data)
    cls = self.subchannels.get(subchannel)
    if cls is None:
      raise GPUFault(XID_GR_CLASS_ERROR, f"method {method:#x} on subchannel {subchannel}, which has no class bound")
    known = COMPUTE_METHODS if cls == COMPUTE_CLASS else COPY_METHODS
    if method not in known:
      name = "HOPPER_COMPUTE_A" if cls == COMPUTE_CLASS else "HOPPER_DMA_COPY_A"
      raise GPUFault(XID_GR_CLASS_ERROR if cls == COMPUTE_CLASS else XID_CE_ERROR,
                     f"method {method:#x} on subchannel {subchannel} is not one {name} defines")
    self.registers[(subchannel << 16) | method] = data
    if cls == COMPUTE_CLASS: self._compute_method(subchannel, method, data)
    else: self._copy_method(subchannel, method, data)

  def _bind(self, subchannel: int, cls: int) -> None:
    if cls not in self.channel.state.get("engines", []):
      raise GPUFault(XID_GR_CLASS_ERROR, f"SET_OBJECT {cls:#x} on subchannel {subchannel}: the channel has no such "
                                         "engine object")
    self.subchannels[subchannel] = cls

  # ** host methods

  def _host_method(self, method: int, data: int) -> None:
    if method not in HOST_METHODS: raise GPUFault(XID_PBDMA_ERROR, f"host method {method:#x} is not defined")
    self.registers[method] = data
    if method == classes.NVC56F_SEM_EXECUTE: self._semaphore(data)
    elif method == classes.NVC56F_SEMAPHORED:
      raise GPUFault(XID_PBDMA_ERROR, "the legacy SEMAPHOREA-D methods are not emulated")

  def _semaphore(self, execute: int) -> None:
    address = (self.registers.get(classes.NVC56F_SEM_ADDR_HI, 0) << 32) | \
      (self.registers.get(classes.NVC56F_SEM_ADDR_LO, 0) & 0xFFFFFFFC)
    payload = (self.registers.get(classes.NVC56F_SEM_PAYLOAD_HI, 0) << 32) | \
      self.registers.get(classes.NVC56F_SEM_PAYLOAD_LO, 0)
    operation = _bits(execute, classes.NVC56F_SEM_EXECUTE_OPERATION)
    wide = _bits(execute, classes.NVC56F_SEM_EXECUTE_PAYLOAD_SIZE) == classes.NVC56F_SEM_EXECUTE_PAYLOAD_SIZE_64BIT
    if operation == classes.NVC56F_SEM_EXECUTE_OPERATION_RELEASE:
      timestamp = _bits(execute, classes.NVC56F_SEM_EXECUTE_RELEASE_TIMESTAMP) == 1
      self._release(address, payload if wide else payload & 0xFFFFFFFF, wide, timestamp)
    elif operation in ACQUIRES:
      self._acquire(address, payload, wide, operation)
    else:
      raise GPUFault(XID_PBDMA_ERROR, f"SEM_EXECUTE operation {operation} (reductions) is not emulated")

  def _release(self, address: int, payload: int, wide: bool, timestamp: bool) -> None:
    alignment = 16 if timestamp else 8 if wide else 4
    if address % alignment:
      raise GPUFault(XID_PBDMA_ERROR, f"semaphore release at {address:#x}: it must be {alignment}-byte aligned")
    if timestamp: self.memory(address + 8, 8).view(np.uint64)[0] = gpu_time_ns()
    if wide: self.memory(address, 8).view(np.uint64)[0] = payload
    else: self.memory(address, 4).view(np.uint32)[0] = payload

  def _acquire(self, address: int, payload: int, wide: bool, operation: int) -> None:
    if address % (8 if wide else 4):
      raise GPUFault(XID_PBDMA_ERROR, f"semaphore acquire at {address:#x} is not aligned to its payload")
    word = self.memory(address, 8 if wide else 4).view(np.uint64 if wide else np.uint32)
    bits = 64 if wide else 32
    self.position = f"semaphore acquire of {address:#x} for {payload}"
    while not _acquired(int(word[0]), payload, operation, bits):
      if self.stopped: raise ChannelStopped()
      time.sleep(ACQUIRE_POLL_S)

  # ** compute

  def _compute_method(self, subchannel: int, method: int, data: int) -> None:
    if method == classes.NVCBC0_SEND_SIGNALING_PCAS2_B:
      action = _bits(data, classes.NVCBC0_SEND_SIGNALING_PCAS2_B_PCAS_ACTION)
      if action in (classes.NVCBC0_SEND_SIGNALING_PCAS2_B_PCAS_ACTION_SCHEDULE,
                    classes.NVCBC0_SEND_SIGNALING_PCAS2_B_PCAS_ACTION_INVALIDATE_COPY_SCHEDULE,
                    classes.NVCBC0_SEND_SIGNALING_PCAS2_B_PCAS_ACTION_PREFETCH_SCHEDULE,
                    classes.NVCBC0_SEND_SIGNALING_PCAS2_B_PCAS_ACTION_INVALIDATE_PREFETCH_COPY_SCHEDULE,
                    classes.NVCBC0_SEND_SIGNALING_PCAS2_B_PCAS_ACTION_INVALIDATE_PREFETCH_COPY_FORCE_REQUIRE_SCHEDULING):
        self._launch(self.registers.get((subchannel << 16) | classes.NVCBC0_SEND_PCAS_A, 0) << 8)

  def _launch(self, qmd_address: int) -> None:
    self.position = f"the launch of the QMD at {qmd_address:#x}"
    qmd = self.memory(qmd_address, QMD_BYTES).tobytes()
    launch = read_qmd(qmd)
    if launch.major != QMD_MAJOR:
      raise GPUFault(XID_GR_EXCEPTION, f"the QMD at {qmd_address:#x} has major version {launch.major}; "
                                       f"HOPPER_COMPUTE_A runs version {QMD_MAJOR} (is a QMD where SEND_PCAS_A "
                                       "points?)")
    threads = launch.block[0] * launch.block[1] * launch.block[2]
    if not 0 < threads <= 1024 or 0 in launch.grid:
      raise GPUFault(XID_GR_EXCEPTION, f"a launch of grid {launch.grid} of blocks {launch.block}")
    address = launch.program_address
    found = self.kernel.programs.find(address, lambda n: self.memory(address, n).tobytes(), GPUFault)
    if found is None:
      raise GPUFault(XID_GR_EXCEPTION, f"no kernel the driver registered has its code at {launch.program_address:#x} "
                                       "(an illegal instruction on hardware)")
    facts = found.facts
    bank = self._constant_bank(launch, facts)
    self._check_resources(launch, facts)
    base = facts.parameter_base
    arguments = [int.from_bytes(bank[base + p.offset:base + p.offset + p.size].tobytes(), "little")
                 for p in facts.parameters]
    self.position = f"kernel {facts.name} (grid {launch.grid}, block {launch.block})"
    try:
      run_program(found.program, launch.grid, launch.block, arguments, self.memory)
    except MMUFault as fault:
      raise GPUFault(XID_MMU_FAULT, f"kernel {facts.name}: {fault}") from None
    except InterpreterError as error:
      raise GPUFault(XID_GR_EXCEPTION, f"kernel {facts.name}: {error}") from None

  def _constant_bank(self, launch: QMDLaunch, facts: Any) -> np.ndarray:
    """Constant bank 0 as the kernel would read it: checked for the launch sizes and the arguments' room."""
    if not launch.bank_valid: raise GPUFault(XID_GR_EXCEPTION, "constant bank 0 is not valid in the QMD")
    parameters = launch.bank_bytes - facts.parameter_base
    if parameters > MAX_PARAMETER_BYTES:
      raise GPUFault(XID_GR_EXCEPTION, f"kernel {facts.name}: constant bank 0 holds {parameters} bytes of kernel "
                                       f"arguments, over the limit of {MAX_PARAMETER_BYTES}")
    if parameters < facts.parameter_bytes:
      raise GPUFault(XID_GR_EXCEPTION, f"kernel {facts.name}: constant bank 0 ({launch.bank_bytes} bytes) ends before "
                                       f"its {facts.parameter_bytes} bytes of arguments at {facts.parameter_base:#x}")
    bank = self.memory(launch.bank_address, launch.bank_bytes)
    dimensions = struct.unpack_from("<6I", bank.tobytes(), 0)
    if dimensions != (*launch.block, *launch.grid):
      raise GPUFault(XID_GR_EXCEPTION, f"kernel {facts.name}: constant bank 0 says block {dimensions[:3]} and grid "
                                       f"{dimensions[3:]}, the QMD block {launch.block} and grid {launch.grid}")
    return bank

  def _check_resources(self, launch: QMDLaunch, facts: Any) -> None:
    needed_shared = max(facts.shared_bytes, 0x400)
    if launch.shared_bytes < needed_shared:
      raise GPUFault(XID_GR_EXCEPTION, f"kernel {facts.name} uses {needed_shared} bytes of shared memory; the QMD "
                                       f"gives {launch.shared_bytes}")
    if launch.registers < facts.registers:
      raise GPUFault(XID_GR_EXCEPTION, f"kernel {facts.name} uses {facts.registers} registers; the QMD gives "
                                       f"{launch.registers}")
    if facts.frame_bytes and launch.stack_bytes < facts.frame_bytes:
      raise GPUFault(XID_GR_EXCEPTION, f"kernel {facts.name} needs {facts.frame_bytes} bytes of stack per thread; the "
                                       f"QMD gives {launch.stack_bytes} in the local window's high part")

  # ** copy engine

  def _copy_method(self, subchannel: int, method: int, data: int) -> None:
    if method != classes.NVC8B5_LAUNCH_DMA: return
    value = lambda name: self.registers.get((subchannel << 16) | getattr(classes, f"NVC8B5_{name}"), 0)  # noqa: E731
    transfer = _bits(data, classes.NVC8B5_LAUNCH_DMA_DATA_TRANSFER_TYPE)
    if transfer != classes.NVC8B5_LAUNCH_DMA_DATA_TRANSFER_TYPE_NONE:
      pitch = classes.NVC8B5_LAUNCH_DMA_SRC_MEMORY_LAYOUT_PITCH
      if _bits(data, classes.NVC8B5_LAUNCH_DMA_SRC_MEMORY_LAYOUT) != pitch \
         or _bits(data, classes.NVC8B5_LAUNCH_DMA_DST_MEMORY_LAYOUT) != pitch \
         or _bits(data, classes.NVC8B5_LAUNCH_DMA_SRC_TYPE) or _bits(data, classes.NVC8B5_LAUNCH_DMA_DST_TYPE):
        raise GPUFault(XID_CE_ERROR, f"LAUNCH_DMA {data:#x}: only pitch-linear virtual copies are emulated")
      source = (value("OFFSET_IN_UPPER") << 32) | value("OFFSET_IN_LOWER")
      dest = (value("OFFSET_OUT_UPPER") << 32) | value("OFFSET_OUT_LOWER")
      length = value("LINE_LENGTH_IN")
      lines = value("LINE_COUNT") if _bits(data, classes.NVC8B5_LAUNCH_DMA_MULTI_LINE_ENABLE) else 1
      self.position = f"a copy of {lines} x {length} bytes from {source:#x} to {dest:#x}"
      for line in range(lines):
        read = self.memory(source + line * value("PITCH_IN"), length).copy()
        self.memory(dest + line * value("PITCH_OUT"), length)[:] = read
    kind = _bits(data, classes.NVC8B5_LAUNCH_DMA_SEMAPHORE_TYPE)
    if kind != classes.NVC8B5_LAUNCH_DMA_SEMAPHORE_TYPE_NONE:
      address = (value("SET_SEMAPHORE_A") << 32) | value("SET_SEMAPHORE_B")
      wide = _bits(data, classes.NVC8B5_LAUNCH_DMA_SEMAPHORE_PAYLOAD_SIZE) == \
        classes.NVC8B5_LAUNCH_DMA_SEMAPHORE_PAYLOAD_SIZE_TWO_WORD
      payload = (value("SET_SEMAPHORE_PAYLOAD_UPPER") << 32 if wide else 0) | value("SET_SEMAPHORE_PAYLOAD")
      timestamp = kind == classes.NVC8B5_LAUNCH_DMA_SEMAPHORE_TYPE_RELEASE_SEMAPHORE_WITH_TIMESTAMP
      self._release(address, payload, wide, timestamp)

  # ** faults

  def _fault(self, fault: GPUFault) -> None:
    """What RM does after a robust-channel error: the channel group stops, its notifiers say why (written last: the
    host may act on them at once)."""
    self.kernel.record_fault(f"channel {self.channel.handle:#x} (token {self.token}), Xid {fault.xid}, at "
                             f"{self.position}: {fault}")
    engine = ENGINE_COPY0 if self.channel.state.get("engines") == [COPY_CLASS] else ENGINE_GR0
    self.group.state["dead"] = fault.xid
    for notifier in (self.notifier, self.group.state["error"]):
      if notifier is None: continue
      now = gpu_time_ns()
      record = rm.NvNotification(info32=fault.xid, info16=engine, status=0xFFFF)
      record.timeStamp.nanoseconds[0], record.timeStamp.nanoseconds[1] = now >> 32, now & 0xFFFFFFFF
      ctypes.memmove(notifier.backing.address, bytes(record), ctypes.sizeof(record))


ACQUIRES = (classes.NVC56F_SEM_EXECUTE_OPERATION_ACQUIRE, classes.NVC56F_SEM_EXECUTE_OPERATION_ACQ_STRICT_GEQ,
            classes.NVC56F_SEM_EXECUTE_OPERATION_ACQ_CIRC_GEQ, classes.NVC56F_SEM_EXECUTE_OPERATION_ACQ_AND,
            classes.NVC56F_SEM_EXECUTE_OPERATION_ACQ_NOR)


def _acquired(value: int, payload: int, operation: int, bits: int) -> bool:
  mask = (1 << bits) - 1
  if operation == classes.NVC56F_SEM_EXECUTE_OPERATION_ACQUIRE: return value == payload & mask
  if operation == classes.NVC56F_SEM_EXECUTE_OPERATION_ACQ_STRICT_GEQ: return value >= payload & mask
  if operation == classes.NVC56F_SEM_EXECUTE_OPERATION_ACQ_CIRC_GEQ:
    return ((value - payload) & mask) < 1 << (bits - 1)
  if operation == classes.NVC56F_SEM_EXECUTE_OPERATION_ACQ_AND: return value & payload != 0
  return value & payload == 0   # ACQ_NOR


# *** reading a V04 QMD (the emulator reads it independently of the driver's builder) ***

@dataclass(frozen=True)
class QMDLaunch:
  major: int
  grid: tuple[int, int, int]
  block: tuple[int, int, int]
  program_address: int
  registers: int
  shared_bytes: int
  stack_bytes: int   # the local window's high part, where the stack grows down from the stack pointer
  bank_valid: bool
  bank_address: int
  bank_bytes: int


def read_qmd(qmd: bytes) -> QMDLaunch:
  number = int.from_bytes(qmd, "little")

  def get(bits: tuple[int, int]) -> int:
    high, low = bits
    return (number >> low) & ((1 << (high - low + 1)) - 1)

  v = "NVCBC0_QMDV04_00_"
  f = lambda name, *index: getattr(layouts, v + name)(*index) if index else getattr(layouts, v + name)  # noqa: E731
  return QMDLaunch(
    major=get(f("QMD_MAJOR_VERSION")),
    grid=(get(f("GRID_WIDTH")), get(f("GRID_HEIGHT")), get(f("GRID_DEPTH"))),
    block=(get(f("CTA_THREAD_DIMENSION0")), get(f("CTA_THREAD_DIMENSION1")), get(f("CTA_THREAD_DIMENSION2"))),
    program_address=get(f("PROGRAM_ADDRESS_LOWER")) | get(f("PROGRAM_ADDRESS_UPPER")) << 32,
    registers=get(f("REGISTER_COUNT")), shared_bytes=get(f("SHARED_MEMORY_SIZE")),
    stack_bytes=get(f("SHADER_LOCAL_MEMORY_HIGH_SIZE")),
    bank_valid=bool(get(f("CONSTANT_BUFFER_VALID", 0))),
    bank_address=(get(f("CONSTANT_BUFFER_ADDR_LOWER_SHIFTED6", 0)) | get(f("CONSTANT_BUFFER_ADDR_UPPER_SHIFTED6", 0))
                  << 32) << 6,
    bank_bytes=get(f("CONSTANT_BUFFER_SIZE_SHIFTED4", 0)) << 4)
