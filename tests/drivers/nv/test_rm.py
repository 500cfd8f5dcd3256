"""The RM and UVM layer against the emulated kernel: what the real driver refuses, the emulation refuses the same
way (EINVAL from the ioctl for a wrong size or node; an RM status in the struct for the rest)."""
import ctypes
import errno

import pytest

from rawgrad.autogen.nv import nv_classes as classes
from rawgrad.autogen.nv import nv_rm as rm
from rawgrad.autogen.nv import nv_uvm as uvm
from rawgrad.drivers.nv.emulated import GPU_UUID, EmulatedKernel
from rawgrad.drivers.nv.gpu import NVGPU
from rawgrad.drivers.nv.rm import UVM, RMClient, RMError, UVMError, check_driver_version, escape_request, status_name
from rawgrad.drivers.os import IOC_READ, IOC_WRITE, ioc


@pytest.fixture
def client(kernel: EmulatedKernel) -> RMClient:
  return RMClient(kernel, kernel.open("/dev/nvidiactl"))


def _device(client: RMClient) -> int:
  client.kernel.open("/dev/nvidia0")  # RM allocates the device object only for a process holding the node open
  return client.alloc(client.handle, rm.NV01_DEVICE_0, rm.NV0080_ALLOC_PARAMETERS(hClientShare=client.handle))


def test_the_device_object_needs_the_gpu_node_open(client: RMClient) -> None:
  with pytest.raises(RMError) as refused:
    client.alloc(client.handle, rm.NV01_DEVICE_0, rm.NV0080_ALLOC_PARAMETERS(hClientShare=client.handle))
  assert refused.value.status == rm.NV_ERR_INSUFFICIENT_PERMISSIONS  # as the H100 answered on 2026-11-24
  assert _device(client) != 0


def test_a_wrong_struct_size_is_einval_before_anything_else(kernel: EmulatedKernel, client: RMClient) -> None:
  short = (ctypes.c_uint8 * 28)()   # NVOS21_PARAMETERS is 32 bytes (and NVOS64 48): escape.c refuses 28
  ctypes.memmove(short, bytes(rm.NVOS21_PARAMETERS(hRoot=client.handle, hObjectParent=client.handle,
                                                   hClass=rm.NV01_DEVICE_0))[:28], 28)
  before = bytes(short)
  with pytest.raises(OSError) as refused:
    kernel.ioctl(client.control_fd, ioc(IOC_READ | IOC_WRITE, rm.NV_IOCTL_MAGIC, rm.NV_ESC_RM_ALLOC, 28), short)
  assert refused.value.errno == errno.EINVAL and "32 or 48" in str(refused.value)
  assert bytes(short) == before   # copied back unchanged
  control = (ctypes.c_uint8 * 36)()
  with pytest.raises(OSError) as refused:
    kernel.ioctl(client.control_fd, ioc(IOC_READ | IOC_WRITE, rm.NV_IOCTL_MAGIC, rm.NV_ESC_RM_CONTROL, 36), control)
  assert refused.value.errno == errno.EINVAL


def test_an_argument_smaller_than_the_request_says_faults(kernel: EmulatedKernel, client: RMClient) -> None:
  small = rm.NVOS00_PARAMETERS()   # 16 bytes, but the request claims 32
  with pytest.raises(OSError) as refused:
    kernel.ioctl(client.control_fd, ioc(IOC_READ | IOC_WRITE, rm.NV_IOCTL_MAGIC, rm.NV_ESC_RM_CONTROL, 32), small)
  assert refused.value.errno == errno.EFAULT


def test_escapes_on_the_wrong_node_are_einval(kernel: EmulatedKernel, client: RMClient) -> None:
  register = rm.nv_ioctl_register_fd_t(ctl_fd=client.control_fd)
  with pytest.raises(OSError) as refused:   # NV_ESC_REGISTER_FD belongs on /dev/nvidia0
    kernel.ioctl(client.control_fd, escape_request(rm.NV_ESC_REGISTER_FD, register), register)
  assert refused.value.errno == errno.EINVAL
  device_fd = kernel.open("/dev/nvidia0")
  client.escape(rm.NV_ESC_REGISTER_FD, register, fd=device_fd)
  with pytest.raises(OSError):   # once only
    client.escape(rm.NV_ESC_REGISTER_FD, register, fd=device_fd)


def test_unknown_class_wrong_parent_and_duplicates_are_rm_statuses(client: RMClient) -> None:
  device = _device(client)
  with pytest.raises(RMError) as refused:
    client.alloc(device, 0xC9C0)   # ADA_COMPUTE_A: not an H100 class
  assert refused.value.status == rm.NV_ERR_INVALID_CLASS and "NV_ERR_INVALID_CLASS (0x22)" in str(refused.value)
  with pytest.raises(RMError) as refused:
    client.alloc(client.handle, rm.NV20_SUBDEVICE_0, rm.NV2080_ALLOC_PARAMETERS())   # a subdevice under the client
  assert refused.value.status == rm.NV_ERR_INVALID_OBJECT_PARENT
  with pytest.raises(RMError) as refused:
    client.alloc(client.handle, rm.NV01_DEVICE_0, rm.NV0080_ALLOC_PARAMETERS(), handle=device)
  assert refused.value.status == rm.NV_ERR_INSERT_DUPLICATE_NAME
  with pytest.raises(RMError) as refused:
    client.alloc(client.handle, rm.NV01_DEVICE_0, rm.NV0080_ALLOC_PARAMETERS(deviceId=3))
  assert refused.value.status == rm.NV_ERR_INVALID_ARGUMENT


def test_controls_check_their_parameter_size_and_existence(client: RMClient) -> None:
  device = _device(client)
  subdevice = client.alloc(device, rm.NV20_SUBDEVICE_0, rm.NV2080_ALLOC_PARAMETERS())
  name = client.control(subdevice, rm.NV2080_CTRL_CMD_GPU_GET_NAME_STRING, rm.NV2080_CTRL_GPU_GET_NAME_STRING_PARAMS())
  assert bytes(name.gpuNameString.ascii).startswith(b"NVIDIA H100")
  with pytest.raises(RMError) as refused:   # the right command with another struct's size
    client.control(subdevice, rm.NV2080_CTRL_CMD_GPU_GET_NAME_STRING, rm.NV2080_CTRL_TIMER_GET_TIME_PARAMS())
  assert refused.value.status == rm.NV_ERR_INVALID_PARAM_STRUCT
  with pytest.raises(RMError) as refused:
    client.control(subdevice, 0x2080FFFF, rm.NV2080_CTRL_TIMER_GET_TIME_PARAMS())
  assert refused.value.status == rm.NV_ERR_NOT_SUPPORTED
  with pytest.raises(RMError) as refused:   # a subdevice control sent to the device
    client.control(device, rm.NV2080_CTRL_CMD_TIMER_GET_TIME, rm.NV2080_CTRL_TIMER_GET_TIME_PARAMS())
  assert refused.value.status == rm.NV_ERR_NOT_SUPPORTED
  with pytest.raises(RMError) as refused:
    client.free(device, 0x1234)
  assert refused.value.status == rm.NV_ERR_INVALID_OBJECT_HANDLE


def test_a_client_belongs_to_its_control_fd(kernel: EmulatedKernel, client: RMClient) -> None:
  other = RMClient(kernel, kernel.open("/dev/nvidiactl"))
  request = rm.NVOS21_PARAMETERS(hRoot=client.handle, hObjectParent=client.handle, hObjectNew=0x5000,
                                 hClass=rm.NV01_DEVICE_0, pAllocParms=ctypes.addressof(rm.NV0080_ALLOC_PARAMETERS()))
  other.escape(rm.NV_ESC_RM_ALLOC, request)
  assert request.status == rm.NV_ERR_INVALID_CLIENT


def test_a_second_mapping_on_one_fd_is_state_in_use(kernel: EmulatedKernel, client: RMClient) -> None:
  device = _device(client)
  params = rm.NV_MEMORY_ALLOCATION_PARAMS(owner=client.handle, size=1 << 16)
  memory = client.alloc(device, rm.NV01_MEMORY_LOCAL_USER, params)
  fd = kernel.open("/dev/nvidia0")
  client.map_memory(device, memory, 1 << 16, fd)
  with pytest.raises(RMError) as refused:
    client.map_memory(device, memory, 1 << 16, fd)
  assert refused.value.status == rm.NV_ERR_STATE_IN_USE
  with pytest.raises(RMError) as refused:   # video memory maps through /dev/nvidiaN, not the control node
    client.map_memory(device, memory, 1 << 16, kernel.open("/dev/nvidiactl"))
  assert refused.value.status == rm.NV_ERR_INVALID_ARGUMENT


def test_uvm_refuses_calls_before_initialize_and_foreign_vaspaces(kernel: EmulatedKernel, client: RMClient) -> None:
  fd = kernel.open("/dev/nvidia-uvm")
  early = uvm.UVM_CREATE_EXTERNAL_RANGE_PARAMS(base=1 << 32, length=1 << 21)
  kernel.ioctl(fd, uvm.UVM_CREATE_EXTERNAL_RANGE, early)
  assert early.rmStatus == rm.NV_ERR_ILLEGAL_ACTION
  space = UVM(kernel)
  space.register_gpu(GPU_UUID)
  with pytest.raises(UVMError) as refused:
    space.register_gpu(GPU_UUID)
  assert refused.value.status == rm.NV_ERR_INVALID_DEVICE
  device = _device(client)
  owned_by_rm = client.alloc(device, rm.FERMI_VASPACE_A, rm.NV_VASPACE_ALLOCATION_PARAMETERS())
  with pytest.raises(UVMError) as refused:
    space.register_vaspace(GPU_UUID, client.control_fd, client.handle, owned_by_rm)
  assert refused.value.status == rm.NV_ERR_INVALID_FLAGS and "UVM_REGISTER_GPU_VASPACE" in str(refused.value)
  with pytest.raises(RMError) as refused:   # faulting without UVM owning the space
    client.alloc(device, rm.FERMI_VASPACE_A, rm.NV_VASPACE_ALLOCATION_PARAMETERS(
      flags=rm.NV_VASPACE_ALLOCATION_FLAGS_ENABLE_PAGE_FAULTING))
  assert refused.value.status == rm.NV_ERR_INVALID_ARGUMENT


def test_uvm_ranges_must_be_aligned_and_disjoint(kernel: EmulatedKernel) -> None:
  space = UVM(kernel)
  space.call(uvm.UVM_CREATE_EXTERNAL_RANGE, uvm.UVM_CREATE_EXTERNAL_RANGE_PARAMS(base=1 << 32, length=1 << 21))
  with pytest.raises(UVMError) as refused:
    space.call(uvm.UVM_CREATE_EXTERNAL_RANGE, uvm.UVM_CREATE_EXTERNAL_RANGE_PARAMS(base=(1 << 32) + 4096, length=4096))
  assert refused.value.status == rm.NV_ERR_UVM_ADDRESS_IN_USE
  with pytest.raises(UVMError) as refused:
    space.call(uvm.UVM_CREATE_EXTERNAL_RANGE, uvm.UVM_CREATE_EXTERNAL_RANGE_PARAMS(base=(1 << 33) + 100, length=4096))
  assert refused.value.status == rm.NV_ERR_INVALID_ADDRESS
  with pytest.raises(UVMError) as refused:
    space.free(1 << 40, 4096)
  assert refused.value.status == rm.NV_ERR_INVALID_ADDRESS


def test_the_version_check_refuses_another_branch_naming_both() -> None:
  with pytest.raises(RMError, match=r"version 570\.86\.15 .*the 580 branch"):
    check_driver_version(EmulatedKernel(version="570.86.15"))
  assert check_driver_version(EmulatedKernel()) == "580.159.04"

  class NoDriver(EmulatedKernel):
    def read_text(self, path: str) -> str:
      raise FileNotFoundError(path)
  with pytest.raises(RMError, match="no NVIDIA kernel driver is loaded"):
    check_driver_version(NoDriver())
  with pytest.raises(RMError, match="570.86.15"):
    NVGPU(EmulatedKernel(version="570.86.15"))


def test_bring_up_reads_the_gpu_through_rm(kernel: EmulatedKernel) -> None:
  gpu = NVGPU(kernel)
  try:
    info = gpu.info
    assert info.name.startswith("NVIDIA H100") and info.arch == "sm_90" and info.driver_version == "580.159.04"
    assert (info.compute_class, info.copy_class, info.gpfifo_class, info.usermode_class) == \
      (classes.HOPPER_COMPUTE_A, classes.HOPPER_DMA_COPY_A, classes.HOPPER_CHANNEL_GPFIFO_A, classes.HOPPER_USERMODE_A)
    assert info.uuid == GPU_UUID and info.sm_count == 132 and info.video_memory_bytes == 80 << 30
    assert abs(gpu.clock_offset_ns() + (1 << 40)) < 50_000_000   # the emulated clock runs 2^40 ns ahead
  finally:
    gpu.close()
  assert status_name(0x56) == "NV_ERR_NOT_SUPPORTED (0x56)"


def test_an_open_gpu_holds_the_highest_performance_state_and_clears_it_at_close(kernel: EmulatedKernel) -> None:
  # without the boost the H100 ran a+b at 1780 GB/s, with it 3063 (torch 2989): docs/hardware.md, 2026-11-27
  gpu = NVGPU(kernel)
  try:
    flags, duration = kernel.boosts[gpu.client.handle]
    assert flags & 3 == rm.NV2080_CTRL_PERF_BOOST_FLAGS_CMD_BOOST_TO_MAX and flags >> 4 & 1 == 1 and flags >> 6 & 1 == 1
    assert duration == rm.NV2080_CTRL_PERF_BOOST_DURATION_INFINITE and gpu.boost_refused == ""
  finally:
    gpu.close()
  assert kernel.boosts == {}


def test_a_boost_is_the_clients_own_and_checked(kernel: EmulatedKernel, client: RMClient) -> None:
  subdevice = client.alloc(_device(client), rm.NV20_SUBDEVICE_0, rm.NV2080_ALLOC_PARAMETERS(subDeviceId=0))
  boost = lambda flags, duration: client.control(  # noqa: E731
    subdevice, rm.NV2080_CTRL_CMD_PERF_BOOST, rm.NV2080_CTRL_PERF_BOOST_PARAMS(flags=flags, duration=duration))
  to_max = rm.NV2080_CTRL_PERF_BOOST_FLAGS_CMD_BOOST_TO_MAX
  for flags, duration in ((3, 10), (to_max, 0), (to_max, rm.NV2080_CTRL_PERF_BOOST_DURATION_MAX + 1)):
    with pytest.raises(RMError, match="NV_ERR_INVALID_ARGUMENT"): boost(flags, duration)
  boost(rm.NV2080_CTRL_PERF_BOOST_FLAGS_CMD_BOOST_1LEVEL, 60)
  other = RMClient(kernel, kernel.open("/dev/nvidiactl"))
  assert kernel.boosts == {client.handle: (rm.NV2080_CTRL_PERF_BOOST_FLAGS_CMD_BOOST_1LEVEL, 60)}
  kernel.close(other.control_fd)
  assert client.handle in kernel.boosts
  kernel.close(client.control_fd)   # a client freed takes its boost with it
  assert kernel.boosts == {}


def test_a_gpu_refusing_the_boost_still_opens_and_says_why(kernel: EmulatedKernel, capsys) -> None:
  from rawgrad.helpers import Context
  kernel.boost_supported = False
  with Context(DEBUG=1): gpu = NVGPU(kernel)
  try:
    assert "NV_ERR_NOT_SUPPORTED" in gpu.boost_refused and gpu.info.sm_count == 132
    assert "lower performance state" in capsys.readouterr().out
  finally:
    gpu.close()
