"""The amdkfd interface: /dev/kfd ioctls with the generated structures, the interface version check, the topology KFD
publishes in sysfs, and KFD events (the interrupts host waits sleep on). Everything goes through the OS seam."""
from __future__ import annotations

import ctypes
import errno
from dataclasses import dataclass, field

import rawgrad.autogen.amd as amd
from rawgrad.autogen.amd import kfd
from rawgrad.drivers.os import KernelInterface

KFD_PATH = "/dev/kfd"
TOPOLOGY = "/sys/devices/virtual/kfd/kfd/topology/nodes"
# gfx_target_version (major * 10000 + minor * 100 + stepping) of the chips rawgrad drives
SUPPORTED_TARGETS = {110000: "gfx1100", 90402: "gfx942"}
EVENT_PAGE_BYTES = kfd.KFD_SIGNAL_EVENT_LIMIT * 8     # one 8-byte slot per signal event
MEMORY_HEAP_TYPES = (1, 2)                           # mem_banks heap_type: frame buffer, public and private
REQUEST_NAMES = {value: name for name, value in vars(kfd).items() if name.startswith("AMDKFD_IOC_")}


def arch_name(gfx_target_version: int) -> str:
  """110000 -> gfx1100, 90402 -> gfx942, 90010 -> gfx90a: the stepping is a hex digit in the name."""
  major, minor, stepping = gfx_target_version // 10000, gfx_target_version // 100 % 100, gfx_target_version % 100
  return f"gfx{major}{minor}{stepping:x}"


class KFD:
  """An open /dev/kfd: ioctls that raise naming the request and its arguments."""

  def __init__(self, kernel: KernelInterface):
    self.kernel = kernel
    try:
      self.fd = kernel.open(KFD_PATH)
    except FileNotFoundError:
      raise RuntimeError(f"{KFD_PATH} does not exist: no amdkfd driver on this machine (load amdgpu, or set "
                         "EMULATE=1 to use the emulated AMD GPU)") from None
    self.version = self.check_version()

  def call(self, request: int, argument: ctypes.Structure) -> ctypes.Structure:
    try:
      self.kernel.ioctl(self.fd, request, argument)
    except OSError as error:
      name = REQUEST_NAMES.get(request, f"ioctl {request:#x}")
      raise OSError(error.errno, f"{name} failed: {error.strerror} ({describe(argument)})") from None
    return argument

  def check_version(self) -> tuple[int, int]:
    """The KFD interface version; a major version other than the bindings' is refused."""
    version = self.call(kfd.AMDKFD_IOC_GET_VERSION, kfd.kfd_ioctl_get_version_args())
    found = (version.major_version, version.minor_version)
    if found[0] != amd.KFD_IOCTL_VERSION[0]:
      raise RuntimeError(f"the kernel's KFD interface is {found[0]}.{found[1]}; rawgrad's bindings are for "
                         f"{amd.KFD_IOCTL_VERSION[0]}.x (generated from kfd_ioctl.h {amd.KFD_IOCTL_VERSION[0]}."
                         f"{amd.KFD_IOCTL_VERSION[1]})")
    return found

  def close(self) -> None:
    self.kernel.close(self.fd)


def describe(argument: ctypes.Structure) -> str:
  """The fields of an ioctl argument, for error messages."""
  parts = []
  for name, *_ in argument._fields_:
    value = getattr(argument, name)
    if isinstance(value, int): parts.append(f"{name}={value:#x}" if value > 9 else f"{name}={value}")
  return ", ".join(parts)


# *** topology ***

@dataclass(frozen=True)
class GPUNode:
  """A GPU node of the KFD topology: what its properties file and memory banks say."""
  index: int
  gpu_id: int
  name: str
  properties: dict[str, int] = field(repr=False)
  vram_bytes: int = 0

  @property
  def gfx_target_version(self) -> int:
    return self.properties["gfx_target_version"]

  @property
  def arch(self) -> str:
    return SUPPORTED_TARGETS[self.gfx_target_version]

  @property
  def render_node(self) -> str:
    return f"/dev/dri/renderD{self.properties['drm_render_minor']}"

  @property
  def compute_units(self) -> int:
    return self.properties["simd_count"] // self.properties["simd_per_cu"]

  @property
  def xcc_count(self) -> int:
    """Compute dies sharing the node (MI300 reports several; older kernels do not report it: one)."""
    return self.properties.get("num_xcc", 1) or 1

  def __getitem__(self, name: str) -> int:
    return self.properties[name]


def parse_properties(text: str) -> dict[str, int]:
  """`name value` lines of a sysfs properties file."""
  properties = {}
  for line in text.splitlines():
    name, _, value = line.strip().partition(" ")
    if name and value.strip().lstrip("-").isdigit(): properties[name] = int(value)
  return properties


def read_node(kernel: KernelInterface, index: int) -> GPUNode | None:
  """Node `index` when it is a GPU (CPU nodes have no SIMDs)."""
  root = f"{TOPOLOGY}/{index}"
  properties = parse_properties(kernel.read_text(f"{root}/properties"))
  if not properties.get("simd_count"): return None
  gpu_id = int(kernel.read_text(f"{root}/gpu_id").strip() or 0)
  if gpu_id == 0: return None
  name = kernel.read_text(f"{root}/name").strip() if kernel.exists(f"{root}/name") else ""
  vram, bank = 0, 0
  while kernel.exists(bank_file := f"{root}/mem_banks/{bank}/properties"):
    bank_properties = parse_properties(kernel.read_text(bank_file))
    if bank_properties.get("heap_type") in MEMORY_HEAP_TYPES: vram += bank_properties.get("size_in_bytes", 0)
    bank += 1
  return GPUNode(index, gpu_id, name, properties, vram)


def gpu_nodes(kernel: KernelInterface) -> list[GPUNode]:
  """Every GPU node KFD lists (nodes are numbered from 0 without gaps)."""
  nodes, index = [], 0
  while kernel.exists(f"{TOPOLOGY}/{index}/properties"):
    if (node := read_node(kernel, index)) is not None: nodes.append(node)
    index += 1
  return nodes


def gpu_node(kernel: KernelInterface, ordinal: int) -> GPUNode:
  """The ordinal-th GPU, checked to be a chip rawgrad drives."""
  nodes = gpu_nodes(kernel)
  if not nodes:
    raise RuntimeError(f"KFD lists no GPU in {TOPOLOGY} (is amdgpu loaded and the GPU supported by KFD?)")
  if ordinal >= len(nodes):
    raise RuntimeError(f"AMD:{ordinal} asked for, but KFD lists {len(nodes)} GPU(s)")
  node = nodes[ordinal]
  if node.gfx_target_version not in SUPPORTED_TARGETS:
    supported = ", ".join(f"{name} ({version})" for version, name in SUPPORTED_TARGETS.items())
    raise RuntimeError(f"GPU node {node.index} ({node.name or 'unnamed'}) is {arch_name(node.gfx_target_version)} "
                       f"(gfx_target_version {node.gfx_target_version}); rawgrad's AMD driver supports {supported}")
  return node


# *** events ***

class Events:
  """KFD events: a signal event the packet processors interrupt (host waits sleep on it), and the memory and
  hardware exception events KFD raises when the GPU faults."""

  def __init__(self, device_kfd: KFD, node: GPUNode, event_page_handle: int):
    self.kfd, self.node = device_kfd, node
    # the first CREATE_EVENT hands KFD the event page (a GTT buffer the GPU writes event slots in)
    signal = self._create(kfd.KFD_IOC_EVENT_SIGNAL, auto_reset=True, page_handle=event_page_handle)
    self.signal_id, self.signal_slot = signal.event_id, signal.event_slot_index
    self.memory_id = self._create(kfd.KFD_IOC_EVENT_MEMORY).event_id
    self.hardware_id = self._create(kfd.KFD_IOC_EVENT_HW_EXCEPTION).event_id

  def _create(self, event_type: int, auto_reset: bool = False, page_handle: int = 0) -> kfd.kfd_ioctl_create_event_args:
    args = kfd.kfd_ioctl_create_event_args(event_page_offset=page_handle, event_type=event_type,
                                           auto_reset=int(auto_reset), node_id=self.node.index)
    return self.kfd.call(kfd.AMDKFD_IOC_CREATE_EVENT, args)

  def wait(self, event_ids: list[int], timeout_ms: int) -> list[kfd.kfd_event_data] | None:
    """WAIT_EVENTS for any of the events; their data (filled for the signaled memory events) once one is signaled,
    None after the timeout."""
    data = (kfd.kfd_event_data * len(event_ids))()
    for entry, event_id in zip(data, event_ids): entry.event_id = event_id
    args = kfd.kfd_ioctl_wait_events_args(events_ptr=ctypes.addressof(data), num_events=len(event_ids),
                                          wait_for_all=0, timeout=max(0, int(timeout_ms)))
    self.kfd.call(kfd.AMDKFD_IOC_WAIT_EVENTS, args)
    if args.wait_result == kfd.KFD_IOC_WAIT_RESULT_TIMEOUT: return None
    if args.wait_result != kfd.KFD_IOC_WAIT_RESULT_COMPLETE:
      raise OSError(errno.EIO, f"WAIT_EVENTS on events {event_ids} failed (wait_result {args.wait_result})")
    return list(data)

  def sleep_until_signaled(self, timeout_ms: int) -> bool:
    """Sleep until a packet processor interrupts (or the timeout); True when it did."""
    return self.wait([self.signal_id], timeout_ms) is not None

  def exception(self) -> str | None:
    """What a memory or hardware exception event reports, without waiting; None when neither is signaled."""
    data = self.wait([self.memory_id, self.hardware_id], 0)
    if data is None: return None
    memory = data[0].memory_exception_data
    if memory.gpu_id:
      failure = memory.failure
      kinds = [name for name, flag in (("page not present", failure.NotPresent), ("write to a read-only page",
               failure.ReadOnly), ("execute of a no-execute page", failure.NoExecute)) if flag]
      where = "at an imprecise address near" if failure.imprecise else "at"
      return f"GPU memory fault {where} {memory.va:#x} ({', '.join(kinds) or 'no details'})"
    return "the GPU reported a hardware exception (a hang: the engine was reset)"

