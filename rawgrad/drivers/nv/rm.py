"""The resource manager (RM) and UVM object layer: escapes on /dev/nvidiactl and /dev/nvidia<N>, ioctls on
/dev/nvidia-uvm, each failure raised with the call, the object and the status by name.

RM escapes are `_IOWR('F', number, sizeof(argument))`; the kernel rejects a wrong size with EINVAL and otherwise
returns 0, reporting the RM result in the argument's `status` (docs/nv-driver-notes.md 1.3). UVM requests are bare
numbers, the result in the trailing `rmStatus` (1.8). Everything goes through the OS seam (drivers/os.py).
"""
from __future__ import annotations

import ctypes
import os
import re
from typing import TypeVar

from rawgrad.autogen.nv import DRIVER_BRANCH
from rawgrad.autogen.nv import nv_rm as rm
from rawgrad.autogen.nv import nv_uvm as uvm
from rawgrad.drivers.os import IOC_READ, IOC_WRITE, KernelInterface, ioc

Params = TypeVar("Params", bound=ctypes.Structure)
VERSION_FILES = ("/sys/module/nvidia/version", "/proc/driver/nvidia/version")
FIRST_HANDLE = 0xCF000000  # our own handles; RM's generated ones start at 0xcaf00000 (rs_client.h)


class RMError(RuntimeError):
  """An RM or UVM call failed; `status` is the NV_STATUS it returned."""

  def __init__(self, message: str, status: int):
    super().__init__(message)
    self.status = status


def _status_names() -> dict[int, str]:
  names: dict[int, str] = {}
  for name, value in vars(rm).items():
    if (name.startswith("NV_ERR_") or name.startswith("NV_WARN_") or name == "NV_OK") and isinstance(value, int):
      names.setdefault(value, name)
  return names


STATUS_NAMES = _status_names()


def status_name(status: int) -> str:
  return f"{STATUS_NAMES.get(status, 'unknown status')} ({status:#x})"


def escape_request(number: int, argument: ctypes.Structure | ctypes.Array) -> int:
  return ioc(IOC_READ | IOC_WRITE, rm.NV_IOCTL_MAGIC, number, ctypes.sizeof(argument))


# *** the driver's version ***

def parse_version(text: str) -> str:
  """The version number in the text of /sys/module/nvidia/version or /proc/driver/nvidia/version."""
  found = re.search(r"\b(\d+\.\d+(?:\.\d+)?)\b", text)
  if found is None: raise RMError(f"no version number in {text.strip()[:200]!r}", rm.NV_ERR_GENERIC)
  return found.group(1)


def check_driver_version(kernel: KernelInterface) -> str:
  """The running driver's version, read from sysfs (or procfs); refuses a branch the bindings were not made for."""
  for path in VERSION_FILES:
    try:
      text = kernel.read_text(path)
    except OSError:
      continue
    version = parse_version(text)
    if version.split(".")[0] != DRIVER_BRANCH:
      raise RMError(f"the NVIDIA kernel driver is version {version} (from {path}), but rawgrad's RM bindings are for "
                    f"the {DRIVER_BRANCH} branch (rawgrad/autogen/nv, generated from {rm_source()}); RM structures "
                    f"change between branches, so install a {DRIVER_BRANCH}.x driver or regenerate the bindings",
                    rm.NV_ERR_NOT_SUPPORTED)
    return version
  raise RMError(f"no NVIDIA kernel driver is loaded: none of {', '.join(VERSION_FILES)} exists", rm.NV_ERR_GENERIC)


def rm_source() -> str:
  from rawgrad.autogen import nv
  return f"{nv.SOURCE_REPOSITORY} {nv.SOURCE_TAG}"


# *** RM ***

class RMClient:
  """One RM client (root object) on a control fd: allocates, controls and frees objects under it."""

  def __init__(self, kernel: KernelInterface, control_fd: int):
    self.kernel, self.control_fd = kernel, control_fd
    self._next_handle = FIRST_HANDLE
    self.classes: dict[int, int] = {}  # handle -> class, for messages
    root = rm.NVOS21_PARAMETERS(hRoot=0, hObjectParent=0, hObjectNew=0, hClass=rm.NV01_ROOT_CLIENT)
    self.escape(rm.NV_ESC_RM_ALLOC, root)
    self._check(root.status, "allocating the root client (NV01_ROOT_CLIENT)")
    self.handle = root.hObjectNew
    self.classes[self.handle] = rm.NV01_ROOT_CLIENT

  def escape(self, number: int, argument: ctypes.Structure | ctypes.Array, fd: int | None = None) -> None:
    """An RM escape on the control fd (or `fd`); raises OSError for what the kernel itself refuses."""
    self.kernel.ioctl(self.control_fd if fd is None else fd, escape_request(number, argument), argument)

  def new_handle(self) -> int:
    self._next_handle += 1
    return self._next_handle

  def alloc(self, parent: int, cls: int, params: ctypes.Structure | None = None, handle: int | None = None,
            what: str = "") -> int:
    """Allocate an object of class `cls` under `parent`; returns its handle."""
    handle = handle or self.new_handle()
    pointer = ctypes.addressof(params) if params is not None else 0
    size = ctypes.sizeof(params) if params is not None else 0
    request = rm.NVOS21_PARAMETERS(hRoot=self.handle, hObjectParent=parent, hObjectNew=handle, hClass=cls,
                                   pAllocParms=pointer, paramsSize=size)
    self.escape(rm.NV_ESC_RM_ALLOC, request)
    self._check(request.status, f"allocating {what or class_name(cls)} (class {cls:#x}) under "
                                f"{self.describe(parent)}")
    self.classes[handle] = cls
    return handle

  def control(self, target: int, command: int, params: Params, what: str = "") -> Params:
    """Run control `command` on an object; returns params as RM filled them in."""
    request = rm.NVOS54_PARAMETERS(hClient=self.handle, hObject=target, cmd=command, flags=0,
                                   params=ctypes.addressof(params), paramsSize=ctypes.sizeof(params))
    self.escape(rm.NV_ESC_RM_CONTROL, request)
    self._check(request.status, f"control {what or command_name(command)} ({command:#x}) on {self.describe(target)}")
    return params

  def free(self, parent: int, handle: int) -> None:
    request = rm.NVOS00_PARAMETERS(hRoot=self.handle, hObjectParent=parent, hObjectOld=handle)
    self.escape(rm.NV_ESC_RM_FREE, request)
    self._check(request.status, f"freeing {self.describe(handle)}")
    self.classes.pop(handle, None)

  def map_memory(self, device: int, memory: int, length: int, mapping_fd: int) -> int:
    """Ask RM to let `mapping_fd` (a fresh fd) mmap `length` bytes of a memory object; returns RM's cookie."""
    request = rm.nv_ioctl_nvos33_parameters_with_fd(
      params=rm.NVOS33_PARAMETERS(hClient=self.handle, hDevice=device, hMemory=memory, offset=0, length=length,
                                  flags=0),
      fd=mapping_fd)
    self.escape(rm.NV_ESC_RM_MAP_MEMORY, request)
    self._check(request.params.status, f"mapping {self.describe(memory)} ({length:#x} bytes) for the CPU")
    return request.params.pLinearAddress

  def alloc_os_descriptor(self, device_fd: int, device: int, address: int, nbytes: int) -> int:
    """An RM memory object for the pinned user pages at `address` (NV01_MEMORY_SYSTEM_OS_DESCRIPTOR)."""
    handle = self.new_handle()
    flags = (field(rm.NVOS02_FLAGS_PHYSICALITY, rm.NVOS02_FLAGS_PHYSICALITY_NONCONTIGUOUS)
             | field(rm.NVOS02_FLAGS_COHERENCY, rm.NVOS02_FLAGS_COHERENCY_CACHED)
             | field(rm.NVOS02_FLAGS_MAPPING, rm.NVOS02_FLAGS_MAPPING_NO_MAP))
    request = rm.nv_ioctl_nvos02_parameters_with_fd(
      params=rm.NVOS02_PARAMETERS(hRoot=self.handle, hObjectParent=device, hObjectNew=handle,
                                  hClass=rm.NV01_MEMORY_SYSTEM_OS_DESCRIPTOR, flags=flags, pMemory=address,
                                  limit=nbytes - 1),
      fd=-1)
    self.escape(rm.NV_ESC_RM_ALLOC_MEMORY, request, fd=device_fd)
    self._check(request.params.status, f"pinning {nbytes:#x} bytes of host memory at {address:#x}")
    self.classes[handle] = rm.NV01_MEMORY_SYSTEM_OS_DESCRIPTOR
    return handle

  def describe(self, handle: int) -> str:
    cls = self.classes.get(handle)
    return f"{class_name(cls)} {handle:#x}" if cls is not None else f"object {handle:#x}"

  @staticmethod
  def _check(status: int, what: str) -> None:
    if status != rm.NV_OK: raise RMError(f"RM refused {what}: {status_name(status)}", status)


def field(bits: tuple[int, int], value: int) -> int:
  """`value` placed in the (hi, lo) bit range of a register or flags word; refuses a value that does not fit."""
  high, low = bits
  if not 0 <= value < 1 << (high - low + 1):
    raise ValueError(f"{value:#x} does not fit in bits {high}:{low}")
  return value << low


_CLASS_NAMES = ("NV01_ROOT_CLIENT", "NV01_DEVICE_0", "NV20_SUBDEVICE_0", "FERMI_VASPACE_A", "KEPLER_CHANNEL_GROUP_A",
                "FERMI_CONTEXT_SHARE_A", "NV01_MEMORY_SYSTEM", "NV01_MEMORY_LOCAL_USER",
                "NV01_MEMORY_SYSTEM_OS_DESCRIPTOR", "NV50_MEMORY_VIRTUAL", "VOLTA_USERMODE_A", "TURING_USERMODE_A",
                "AMPERE_USERMODE_A", "HOPPER_USERMODE_A",
                "VOLTA_CHANNEL_GPFIFO_A", "TURING_CHANNEL_GPFIFO_A", "AMPERE_CHANNEL_GPFIFO_A",
                "HOPPER_CHANNEL_GPFIFO_A", "AMPERE_COMPUTE_A", "AMPERE_COMPUTE_B", "ADA_COMPUTE_A", "HOPPER_COMPUTE_A",
                "AMPERE_DMA_COPY_A", "AMPERE_DMA_COPY_B", "HOPPER_DMA_COPY_A")


def class_name(cls: int | None) -> str:
  """The header's name of an RM class we allocate (its number for others)."""
  if cls is None: return "object"
  from rawgrad.autogen.nv import nv_classes
  for name in _CLASS_NAMES:
    if getattr(rm, name, getattr(nv_classes, name, None)) == cls: return name
  return f"class {cls:#x}"


def command_name(command: int) -> str:
  for name, value in vars(rm).items():
    if value == command and "_CTRL_CMD_" in name: return name
  return "control"


# *** UVM ***

class UVMError(RMError):
  pass


class UVM:
  """The process's UVM state on /dev/nvidia-uvm: one fd initialized for this process, one for its mm."""

  def __init__(self, kernel: KernelInterface, path: str = "/dev/nvidia-uvm"):
    self.kernel = kernel
    self.fd = kernel.open(path, os.O_RDWR | os.O_CLOEXEC)
    self.call(uvm.UVM_INITIALIZE, uvm.UVM_INITIALIZE_PARAMS(flags=0))
    self.mm_fd = kernel.open(path, os.O_RDWR | os.O_CLOEXEC)
    self.call(uvm.UVM_MM_INITIALIZE, uvm.UVM_MM_INITIALIZE_PARAMS(uvmFd=self.fd), fd=self.mm_fd,
              allowed=(rm.NV_WARN_NOTHING_TO_DO,))

  def call(self, number: int, params: Params, fd: int | None = None, allowed: tuple[int, ...] = ()) -> Params:
    self.kernel.ioctl(self.fd if fd is None else fd, number, params)
    if params.rmStatus != rm.NV_OK and params.rmStatus not in allowed:
      raise UVMError(f"UVM refused {uvm_name(number)} ({_describe_params(params)}): {status_name(params.rmStatus)}",
                     params.rmStatus)
    return params

  def register_gpu(self, uuid: bytes) -> None:
    self.call(uvm.UVM_REGISTER_GPU, uvm.UVM_REGISTER_GPU_PARAMS(gpu_uuid=_uuid(uuid), rmCtrlFd=-1))

  def register_vaspace(self, uuid: bytes, control_fd: int, client: int, vaspace: int) -> None:
    self.call(uvm.UVM_REGISTER_GPU_VASPACE, uvm.UVM_REGISTER_GPU_VASPACE_PARAMS(
      gpuUuid=_uuid(uuid), rmCtrlFd=control_fd, hClient=client, hVaSpace=vaspace))

  def register_channel(self, uuid: bytes, control_fd: int, client: int, channel: int, base: int, length: int) -> None:
    self.call(uvm.UVM_REGISTER_CHANNEL, uvm.UVM_REGISTER_CHANNEL_PARAMS(
      gpuUuid=_uuid(uuid), rmCtrlFd=control_fd, hClient=client, hChannel=channel, base=base, length=length))

  def map_external(self, uuid: bytes, control_fd: int, client: int, memory: int, address: int, nbytes: int) -> None:
    """Give the GPU the RM memory object at `address` (its own external range)."""
    self.call(uvm.UVM_CREATE_EXTERNAL_RANGE, uvm.UVM_CREATE_EXTERNAL_RANGE_PARAMS(base=address, length=nbytes))
    params = uvm.UVM_MAP_EXTERNAL_ALLOCATION_PARAMS(base=address, length=nbytes, offset=0, gpuAttributesCount=1,
                                                     rmCtrlFd=control_fd, hClient=client, hMemory=memory)
    params.perGpuAttributes[0].gpuUuid = _uuid(uuid)
    params.perGpuAttributes[0].gpuMappingType = uvm.UvmGpuMappingTypeReadWriteAtomic
    self.call(uvm.UVM_MAP_EXTERNAL_ALLOCATION, params)

  def free(self, address: int, nbytes: int) -> None:
    self.call(uvm.UVM_FREE, uvm.UVM_FREE_PARAMS(base=address, length=nbytes))


def _uuid(raw: bytes) -> uvm.NvUuid:
  if len(raw) != 16: raise ValueError(f"a GPU UUID is 16 bytes, not {len(raw)}")
  return uvm.NvUuid((ctypes.c_uint8 * 16)(*raw))


def uvm_name(number: int) -> str:
  for name, value in vars(uvm).items():
    if value == number and name.startswith("UVM_") and name.isupper() and not name.endswith(("_FLAGS", "_BASE")):
      return name
  return f"UVM ioctl {number}"


def _describe_params(params: ctypes.Structure) -> str:
  shown = []
  for name, kind in params._fields_:
    value = getattr(params, name)
    if name != "rmStatus" and isinstance(value, int) and kind in (ctypes.c_uint64, ctypes.c_uint32, ctypes.c_int32):
      shown.append(f"{name}={value:#x}")
  return ", ".join(shown[:6])
