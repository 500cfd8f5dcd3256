"""Bringing up one NVIDIA GPU through RM and UVM (docs/nv-driver-notes.md 2 and 3), up to the point where memory can
be allocated and channels made: driver version check, root client, device, subdevice, the chip's classes, the
usermode (doorbell) page, the GPU's name, architecture and UUID, a UVM-owned virtual address space.
"""
from __future__ import annotations

import time
from dataclasses import dataclass


from rawgrad.autogen.nv import nv_classes as classes
from rawgrad.autogen.nv import nv_rm as rm
from rawgrad.drivers.nv.memory import GPUMemory
from rawgrad.drivers.nv.rm import UVM, RMClient, RMError, check_driver_version, class_name, escape_request
from rawgrad.drivers.os import MAP_FIXED, MAP_SHARED, PROT_READ, PROT_WRITE, KernelInterface
from rawgrad.helpers import DEBUG

CONTROL_PATH = "/dev/nvidiactl"
USERMODE_BYTES = 0x10000
# the highest performance state, asked as a compute client (CUDA) with high priority
_CUDA, _PRIORITY = rm.NV2080_CTRL_PERF_BOOST_FLAGS_CUDA[1], rm.NV2080_CTRL_PERF_BOOST_FLAGS_CUDA_PRIORITY[1]  # low bits
BOOST_TO_MAX = (rm.NV2080_CTRL_PERF_BOOST_FLAGS_CMD_BOOST_TO_MAX | rm.NV2080_CTRL_PERF_BOOST_FLAGS_CUDA_YES << _CUDA
                | rm.NV2080_CTRL_PERF_BOOST_FLAGS_CUDA_PRIORITY_HIGH << _PRIORITY)
# the classes we drive, newest first: the first one the chip lists is used (per-chip lists: notes section 2)
GPFIFO_CLASSES = (classes.HOPPER_CHANNEL_GPFIFO_A, classes.AMPERE_CHANNEL_GPFIFO_A)
COMPUTE_CLASSES = (classes.HOPPER_COMPUTE_A, classes.ADA_COMPUTE_A, classes.AMPERE_COMPUTE_B, classes.AMPERE_COMPUTE_A)
COPY_CLASSES = (classes.HOPPER_DMA_COPY_A, classes.AMPERE_DMA_COPY_B, classes.AMPERE_DMA_COPY_A)
USERMODE_CLASSES = (classes.HOPPER_USERMODE_A, classes.AMPERE_USERMODE_A, classes.TURING_USERMODE_A,
                    classes.VOLTA_USERMODE_A)
# the VA range RM is told about (the span public bring-ups use; below every GPU's limit from Ampere on)
VASPACE_BASE, VASPACE_SIZE = 0x1000, 0x1FFFFFB000000


@dataclass(frozen=True)
class GPUInfo:
  name: str
  driver_version: str
  arch: str                    # "sm_90"
  uuid: bytes                  # 16 raw bytes
  gpu_id: int
  minor: int
  sm_count: int
  tpc_count: int
  design_tpc_count: int   # GPCs x TPCs per GPC of the design: hardware TPC ids reach this even when some are fused off
  sms_per_tpc: int
  max_warps_per_sm: int
  video_memory_bytes: int
  bar1_bytes: int
  gpfifo_class: int
  compute_class: int
  copy_class: int
  usermode_class: int


class NVGPU:
  """One GPU opened through RM and UVM: its objects, its facts (`info`), its memory and its doorbell page."""

  def __init__(self, kernel: KernelInterface, index: int = 0):
    self.kernel = kernel
    version = check_driver_version(kernel)
    self.control_fd = kernel.open(CONTROL_PATH)
    try:
      self._bring_up(version, index)
    except BaseException:
      self._abandon()
      raise

  def _bring_up(self, version: str, index: int) -> None:
    kernel = self.kernel
    self._confirm_version(version)
    cards = self._cards()
    if index >= len(cards):
      raise RMError(f"there is no NVIDIA GPU {index}: the driver lists {len(cards)}", rm.NV_ERR_INVALID_DEVICE)
    card = cards[index]
    self.client = RMClient(kernel, self.control_fd)
    # RM gives a process the GPU's device object only while it holds the GPU's node open (nv_is_gpu_accessible)
    device_path = f"/dev/nvidia{card.minor_number}"
    self.device_fd = kernel.open(device_path)
    self.client.escape(rm.NV_ESC_REGISTER_FD, rm.nv_ioctl_register_fd_t(ctl_fd=self.control_fd), fd=self.device_fd)
    instance = self._device_instance(card.gpu_id)
    self.device = self.client.alloc(self.client.handle, rm.NV01_DEVICE_0, rm.NV0080_ALLOC_PARAMETERS(
      deviceId=instance, hClientShare=self.client.handle, vaMode=rm.NV_DEVICE_ALLOCATION_VAMODE_MULTIPLE_VASPACES))
    self.subdevice = self.client.alloc(self.device, rm.NV20_SUBDEVICE_0, rm.NV2080_ALLOC_PARAMETERS(subDeviceId=0))
    self.boost_refused = self._boost(BOOST_TO_MAX, rm.NV2080_CTRL_PERF_BOOST_DURATION_INFINITE)
    if self.boost_refused and DEBUG >= 1:
      print(f"NV: {self.boost_refused}; the GPU may stay in a lower performance state (memory-bound kernels slower)")
    available = self._classes()
    chosen = {kind: _first_listed(kind, wanted, available) for kind, wanted in
              (("GPFIFO", GPFIFO_CLASSES), ("compute", COMPUTE_CLASSES), ("copy", COPY_CLASSES),
               ("usermode", USERMODE_CLASSES))}
    self.uvm = UVM(kernel)
    uuid = self._uuid()
    self.uvm.register_gpu(uuid)
    gr = self._gr_info()
    fb = self._fb_info()
    sm = gr[rm.NV0080_CTRL_GR_INFO_INDEX_SM_VERSION]
    sm_count, tpc_count = self._sm_and_tpc_counts(gr)
    self.info = GPUInfo(
      name=self._name(), driver_version=version, arch=f"sm_{(sm >> 8) & 0xFF}{sm & 0xFF}", uuid=uuid,
      gpu_id=card.gpu_id, minor=card.minor_number, sm_count=sm_count, tpc_count=tpc_count,
      design_tpc_count=gr[rm.NV0080_CTRL_GR_INFO_INDEX_LITTER_NUM_GPCS] *
      gr[rm.NV0080_CTRL_GR_INFO_INDEX_LITTER_NUM_TPC_PER_GPC],
      sms_per_tpc=gr[rm.NV0080_CTRL_GR_INFO_INDEX_LITTER_NUM_SM_PER_TPC],
      max_warps_per_sm=gr[rm.NV0080_CTRL_GR_INFO_INDEX_MAX_WARPS_PER_SM],
      video_memory_bytes=fb[rm.NV2080_CTRL_FB_INFO_INDEX_RAM_SIZE] << 10,
      bar1_bytes=fb[rm.NV2080_CTRL_FB_INFO_INDEX_BAR1_SIZE] << 10,
      gpfifo_class=chosen["GPFIFO"], compute_class=chosen["compute"], copy_class=chosen["copy"],
      usermode_class=chosen["usermode"])
    self.memory = GPUMemory(kernel, self.client, self.device, device_path, self.device_fd, self.uvm, uuid)
    self.vaspace = self.client.alloc(self.device, rm.FERMI_VASPACE_A, rm.NV_VASPACE_ALLOCATION_PARAMETERS(
      flags=rm.NV_VASPACE_ALLOCATION_FLAGS_ENABLE_PAGE_FAULTING | rm.NV_VASPACE_ALLOCATION_FLAGS_IS_EXTERNALLY_OWNED,
      vaBase=VASPACE_BASE, vaSize=VASPACE_SIZE))
    self.uvm.register_vaspace(uuid, self.control_fd, self.client.handle, self.vaspace)
    self.usermode = self._map_usermode(device_path)

  # ** discovery

  def _confirm_version(self, version: str) -> None:
    """Ask the control node too: sysfs and the module answering ioctls could differ after an upgrade without reload."""
    query = rm.nv_ioctl_rm_api_version_t(cmd=rm.NV_RM_API_VERSION_CMD_QUERY)
    self.kernel.ioctl(self.control_fd, escape_request(rm.NV_ESC_CHECK_VERSION_STR, query), query)
    answered = query.versionString.decode(errors="replace")
    if answered.split(".")[0] != version.split(".")[0]:
      raise RMError(f"/dev/nvidiactl answers version {answered}, but the loaded module says {version}",
                    rm.NV_ERR_NOT_SUPPORTED)

  def _cards(self) -> list[rm.nv_ioctl_card_info_t]:
    cards = (rm.nv_ioctl_card_info_t * rm.NV_MAX_DEVICES)()
    self.kernel.ioctl(self.control_fd, escape_request(rm.NV_ESC_CARD_INFO, cards), cards)
    return [card for card in cards if card.valid]

  def _device_instance(self, gpu_id: int) -> int:
    params = self.client.control(self.client.handle, rm.NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2,
                                 rm.NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS(gpuId=gpu_id))
    return params.deviceInstance

  def _classes(self) -> set[int]:
    params = self.client.control(self.device, rm.NV0080_CTRL_CMD_GPU_GET_CLASSLIST_V2,
                                 rm.NV0080_CTRL_GPU_GET_CLASSLIST_V2_PARAMS())
    return set(params.classList[:params.numClasses])

  def _uuid(self) -> bytes:
    flags = rm.NV2080_GPU_CMD_GPU_GET_GID_FLAGS_FORMAT_BINARY | rm.NV2080_GPU_CMD_GPU_GET_GID_FLAGS_TYPE_SHA1
    params = self.client.control(self.subdevice, rm.NV2080_CTRL_CMD_GPU_GET_GID_INFO,
                                 rm.NV2080_CTRL_GPU_GET_GID_INFO_PARAMS(flags=flags))
    if params.length != 16: raise RMError(f"the GPU's UUID is {params.length} bytes, not 16", rm.NV_ERR_INVALID_STATE)
    return bytes(params.data[:16])

  def _name(self) -> str:
    params = self.client.control(self.subdevice, rm.NV2080_CTRL_CMD_GPU_GET_NAME_STRING,
                                 rm.NV2080_CTRL_GPU_GET_NAME_STRING_PARAMS(gpuNameStringFlags=0))
    return bytes(params.gpuNameString.ascii).split(b"\0")[0].decode(errors="replace")

  def _sm_and_tpc_counts(self, gr: dict[int, int]) -> tuple[int, int]:
    """The SMs and TPCs the chip really has (floor-swept); the design's maximum where RM will not say."""
    try:
      order = self.client.control(self.subdevice, rm.NV2080_CTRL_CMD_GR_GET_GLOBAL_SM_ORDER,
                                  rm.NV2080_CTRL_GR_GET_GLOBAL_SM_ORDER_PARAMS())
      return order.numSm, order.numTpc
    except RMError:
      tpcs = gr[rm.NV0080_CTRL_GR_INFO_INDEX_LITTER_NUM_GPCS] * gr[rm.NV0080_CTRL_GR_INFO_INDEX_LITTER_NUM_TPC_PER_GPC]
      return tpcs * gr[rm.NV0080_CTRL_GR_INFO_INDEX_LITTER_NUM_SM_PER_TPC], tpcs

  def _gr_info(self) -> dict[int, int]:
    wanted = (rm.NV0080_CTRL_GR_INFO_INDEX_SM_VERSION, rm.NV0080_CTRL_GR_INFO_INDEX_MAX_WARPS_PER_SM,
              rm.NV0080_CTRL_GR_INFO_INDEX_LITTER_NUM_SM_PER_TPC, rm.NV0080_CTRL_GR_INFO_INDEX_LITTER_NUM_GPCS,
              rm.NV0080_CTRL_GR_INFO_INDEX_LITTER_NUM_TPC_PER_GPC)
    params = rm.NV2080_CTRL_GR_GET_INFO_V2_PARAMS(grInfoListSize=len(wanted))
    for i, index in enumerate(wanted): params.grInfoList[i].index = index
    self.client.control(self.subdevice, rm.NV2080_CTRL_CMD_GR_GET_INFO_V2, params)
    return {params.grInfoList[i].index: params.grInfoList[i].data for i in range(len(wanted))}

  def _fb_info(self) -> dict[int, int]:
    wanted = (rm.NV2080_CTRL_FB_INFO_INDEX_RAM_SIZE, rm.NV2080_CTRL_FB_INFO_INDEX_BAR1_SIZE)
    params = rm.NV2080_CTRL_FB_GET_INFO_V2_PARAMS(fbInfoListSize=len(wanted))
    for i, index in enumerate(wanted): params.fbInfoList[i].index = index
    self.client.control(self.subdevice, rm.NV2080_CTRL_CMD_FB_GET_INFO_V2, params)
    return {params.fbInfoList[i].index: params.fbInfoList[i].data for i in range(len(wanted))}

  def _map_usermode(self, device_path: str) -> int:
    """The usermode page (BAR0 registers of the doorbell), mapped at an address of our arena."""
    usermode = self.client.alloc(self.subdevice, self.info.usermode_class, what=class_name(self.info.usermode_class))
    address = self.memory.arena.allocate(USERMODE_BYTES, USERMODE_BYTES)
    fd = self.kernel.open(device_path)
    try:
      self.client.map_memory(self.device, usermode, USERMODE_BYTES, fd)
      self.kernel.mmap(address, USERMODE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0)
    finally:
      self.kernel.close(fd)
    return address

  def close(self) -> None:
    """Let go of the GPU: the performance boost is cleared, closing the control fd frees every RM object of our
    client, closing UVM's fds our VA space; then the arena's address space goes back."""
    if not self.boost_refused: self._boost(rm.NV2080_CTRL_PERF_BOOST_FLAGS_CMD_CLEAR, 0)
    for fd in (self.device_fd, self.control_fd, self.uvm.mm_fd, self.uvm.fd): self.kernel.close(fd)
    self.memory.arena.close()

  def _abandon(self) -> None:
    """After a failed bring-up: close what was opened (the driver frees the objects made through it)."""
    memory, uvm = getattr(self, "memory", None), getattr(self, "uvm", None)
    try:
      if getattr(self, "boost_refused", None) == "": self._boost(rm.NV2080_CTRL_PERF_BOOST_FLAGS_CMD_CLEAR, 0)
    except OSError:
      pass   # the error being raised is the one to report (closing the control fd ends the boost too)
    fds = [self.device_fd] if hasattr(self, "device_fd") else []
    fds += [self.control_fd] + ([uvm.mm_fd, uvm.fd] if uvm is not None else [])
    for fd in fds:
      try:
        self.kernel.close(fd)
      except OSError:
        pass   # the error being raised is the one to report
    if memory is not None: memory.arena.close()

  # ** performance state

  def _boost(self, flags: int, duration: int) -> str:
    """Ask RM for a performance state for this client (RM tracks each client's request apart). Without one, the
    H100 ran memory-bound kernels at 59% of the bandwidth torch reached, at the same reported clocks
    (docs/hardware.md, 2026-11-27), so the device asks for the highest state while it is open, as a compute client,
    and clears it at close. A GPU that refuses still computes: returns the refusal, or "" when granted."""
    try:
      self.client.control(self.subdevice, rm.NV2080_CTRL_CMD_PERF_BOOST,
                          rm.NV2080_CTRL_PERF_BOOST_PARAMS(flags=flags, duration=duration))
    except RMError as refusal:
      return str(refusal)
    return ""

  # ** time

  def time_ns(self) -> int:
    """The GPU's clock (PTIMER, ns), asked of RM."""
    params = self.client.control(self.subdevice, rm.NV2080_CTRL_CMD_TIMER_GET_TIME,
                                 rm.NV2080_CTRL_TIMER_GET_TIME_PARAMS())
    return params.time_nsec

  def clock_offset_ns(self, samples: int = 7) -> int:
    """host monotonic ns - GPU ns, from the tightest of a few bracketed readings."""
    best = None
    for _ in range(samples):
      before = time.monotonic_ns()
      gpu = self.time_ns()
      after = time.monotonic_ns()
      if best is None or after - before < best[0]: best = (after - before, (before + after) // 2 - gpu)
    return best[1]

  def doorbell(self, token: int) -> None:
    self.kernel.write32(self.usermode + classes.NVC361_NOTIFY_CHANNEL_PENDING, token)



def _first_listed(kind: str, wanted: tuple[int, ...], available: set[int]) -> int:
  for cls in wanted:
    if cls in available: return cls
  raise RMError(f"the GPU offers no {kind} class rawgrad drives (wanted one of "
                f"{', '.join(class_name(c) for c in wanted)})", rm.NV_ERR_INVALID_CLASS)

