"""Kernels on the emulated AMD GPU: Tensor programs end to end (LLVM, the code object, its kernel descriptor, an AQL
dispatch, the interpreter), the packets as the packet processor reads them, device timestamps for the profiler,
gfx942 through AMD_ARCH, and malformed packets and faults that raise a clear error instead of hanging."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from rawgrad import Tensor
from rawgrad.autogen.amd import hsa
from rawgrad.autogen.amd import kernel_descriptor as descriptors
from rawgrad.compiler.render.llvmir import kernel_symbol
from rawgrad.drivers import os as seam
from rawgrad.drivers.amd import packets
from rawgrad.drivers.amd.device import AMDDevice, AMDProgram
from rawgrad.drivers.amd.emulated import EmulatedKernel
from rawgrad.helpers import Context
from rawgrad.runtime import profile
from rawgrad.runtime.device import Device
from rawgrad.runtime.hcq import COMPUTE, COPY, DeviceFault, HWQueue


def test_tensor_programs_run_on_the_emulated_gpu(amd: AMDDevice) -> None:
  rng = np.random.default_rng(0)
  a, b = rng.random(1000, dtype=np.float32), rng.random(1000, dtype=np.float32)
  assert np.array_equal((Tensor(a, device="AMD") + Tensor(b, device="AMD")).numpy(), a + b)
  x = rng.random((300, 70), dtype=np.float32)
  np.testing.assert_allclose(Tensor(x, device="AMD").sum(axis=1).numpy(), x.sum(axis=1), rtol=1e-5)
  assert int(Tensor(np.arange(100_000, dtype=np.int32), device="AMD").max().item()) == 99_999
  m, w = rng.random((33, 17), dtype=np.float32), rng.random((17, 9), dtype=np.float32)
  np.testing.assert_allclose((Tensor(m, device="AMD") @ Tensor(w, device="AMD")).numpy(), m @ w, rtol=1e-5)


def test_gradients_run_on_the_emulated_gpu(amd: AMDDevice) -> None:
  x = Tensor(np.linspace(-2, 2, 24, dtype=np.float32).reshape(4, 6), device="AMD", requires_grad=True)
  (x.exp() * x).sum().backward()
  values = np.linspace(-2, 2, 24, dtype=np.float32).reshape(4, 6)
  np.testing.assert_allclose(x.grad.numpy(), np.exp(values) * (values + 1), rtol=1e-5)


def program(device: AMDDevice) -> tuple[AMDProgram, int]:
  """An elementwise add loaded on `device`, compiled from a Tensor kernel's source; returns it and its argument
  count."""
  from rawgrad.engine.realize import _runners
  (Tensor(np.ones(64, np.float32), device="AMD") + Tensor(np.ones(64, np.float32), device="AMD")).numpy()
  runner = next(r for (name, _), r in reversed(_runners.entries.items()) if name == "AMD")
  loaded = AMDProgram(device, kernel_symbol(runner.name), device.compiler.compile(runner.source))
  return loaded, len(runner.buffer_slots) + len(runner.variables)


def test_a_dispatch_packet_is_what_the_queue_reads(amd: AMDDevice, fresh_device: AMDDevice) -> None:
  loaded, count = program(fresh_device)
  memory = fresh_device.allocator.alloc(4096)
  fresh_device.launch(loaded, [memory.address] * count, (2, 1, 1), (64, 1, 1))
  fresh_device.synchronize(5.0)
  queue = fresh_device.compute_queue
  index = next(i for i, name in reversed(fresh_device.in_flight) if name == loaded.name)
  slot = (index % queue.entries) * packets.AQL_PACKET_BYTES
  packet = hsa.hsa_kernel_dispatch_packet_t.from_buffer_copy(queue.ring.host[slot:slot + 64].tobytes())
  # the processor marks a slot INVALID once done; the rest is as the driver wrote it
  assert packet.header == hsa.HSA_PACKET_TYPE_INVALID
  assert (packet.grid_size_x, packet.workgroup_size_x, packet.setup) == (128, 64, 1)   # grid counts work-items
  assert packet.kernel_object == loaded.descriptor_address and loaded.descriptor_address % 64 == 0
  assert packet.group_segment_size == loaded.kernel.group_segment_size
  header = packets.aql_header(hsa.HSA_PACKET_TYPE_KERNEL_DISPATCH)
  assert header & 0xFF == 2 and header >> 8 & 1 and header >> 9 & 3 == 2 and header >> 11 & 3 == 2


def test_kernels_with_the_same_code_run_their_own_programs(amd: AMDDevice) -> None:
  # an add of 2 and of 4 elements can compile to the same machine code: the emulation must still run each launch's
  # program (the one uploaded at the launched address), not the first registered with those bytes
  for n in (2, 4, 8, 4, 2):
    np.testing.assert_array_equal((Tensor(np.arange(n, dtype=np.float32), device="AMD") + 1).numpy(),
                                  np.arange(n, dtype=np.float32) + 1)


def test_profiled_kernels_carry_gpu_times(amd: AMDDevice) -> None:
  before = len(profile.events)
  with Context(PROFILE=1):
    (Tensor(np.ones(4096, np.float32), device="AMD") * 3).numpy()
  events = [event for event in profile.events[before:] if event.device == "AMD"]
  del profile.events[before:]   # no trace file at exit
  assert events and all(0 < event.end_ns - event.start_ns < 10_000_000_000 for event in events)
  trace = profile.trace_json(events)["traceEvents"]
  assert [entry["name"] for entry in trace] == [event.name for event in events]
  assert [entry["dur"] for entry in trace] == [(event.end_ns - event.start_ns) / 1e3 for event in events]


def test_a_timed_launch_returns_ordered_host_times(amd: AMDDevice, fresh_device: AMDDevice) -> None:
  loaded, count = program(fresh_device)
  memory = fresh_device.allocator.alloc(4096)
  start, end = fresh_device.launch(loaded, [memory.address] * count, (1, 1, 1), (64, 1, 1), timed=True)
  assert 0 < end - start < 5_000_000_000


def test_gfx942_is_picked_by_amd_arch(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setenv("AMD_ARCH", "gfx942")
  with seam.installed("amd", EmulatedKernel()):
    mi300 = Device["AMD:0"]
  assert (mi300.arch, mi300.target.warp_size, mi300.node.xcc_count) == ("gfx942", 64, 8)
  x = np.arange(-500, 500, dtype=np.float32)
  np.testing.assert_allclose((Tensor(x, device="AMD:0").relu() * 2).sum().numpy(), 2 * np.maximum(x, 0).sum())
  from rawgrad.engine.realize import _runners
  kernel = next(r for (name, _), r in reversed(_runners.entries.items()) if name == "AMD:0").kernel.kernel
  assert not kernel.properties & descriptors.KERNEL_CODE_PROPERTY_ENABLE_WAVEFRONT_SIZE32   # wave64 code


# *** malformed packets and faults ***

def submit_raw(device: AMDDevice, packet: ctypes.Structure) -> None:
  """A hand-made AQL packet after everything before, followed by a timeline signal."""
  device.synchronize(5.0)
  device.compute_queue.submit([packet], device.check_faults)
  device.submit(HWQueue(), COMPUTE)


def dispatch(loaded: AMDProgram, kernargs: int, grid: tuple[int, int, int], workgroup: tuple[int, int, int],
             kernel_object: int | None = None) -> ctypes.Structure:
  packet = hsa.hsa_kernel_dispatch_packet_t(
    setup=3, workgroup_size_x=workgroup[0], workgroup_size_y=workgroup[1], workgroup_size_z=workgroup[2],
    grid_size_x=grid[0], grid_size_y=grid[1], grid_size_z=grid[2], group_segment_size=loaded.kernel.group_segment_size,
    kernel_object=loaded.descriptor_address if kernel_object is None else kernel_object, kernarg_address=kernargs)
  packet.header = packets.aql_header(hsa.HSA_PACKET_TYPE_KERNEL_DISPATCH)
  return packet


def assert_stops(device: AMDDevice, message: str, detail: str) -> None:
  """The next wait raises DeviceFault with `message`; the emulator's own account has `detail`; the device takes no
  more work afterwards (no hang either way)."""
  with pytest.raises(DeviceFault, match=message):
    device.synchronize(5.0)
  assert detail in device.kernel.faults[-1], device.kernel.faults
  with pytest.raises(DeviceFault, match="open the device again"):
    device.submit(HWQueue())


def test_a_packet_of_an_unknown_type_is_refused(fresh_device: AMDDevice) -> None:
  packet = hsa.hsa_barrier_and_packet_t(header=7)
  submit_raw(fresh_device, packet)
  assert_stops(fresh_device, r"invalid packet format \(queue error 0x20\)", "type 7 is not one")


def test_a_header_with_reserved_bits_is_refused(fresh_device: AMDDevice) -> None:
  packet = hsa.hsa_barrier_and_packet_t(header=packets.aql_header(hsa.HSA_PACKET_TYPE_BARRIER_AND) | 1 << 14)
  submit_raw(fresh_device, packet)
  assert_stops(fresh_device, "invalid packet format", "sets reserved bits 13-15")


def test_a_grid_that_is_not_whole_workgroups_is_refused(amd: AMDDevice, fresh_device: AMDDevice) -> None:
  loaded, count = program(fresh_device)
  memory = fresh_device.allocator.alloc(4096)
  arguments = fresh_device.host_memory(64)
  arguments.host.view(np.uint64)[:count] = memory.address
  submit_raw(fresh_device, dispatch(loaded, arguments.address, (100, 1, 1), (64, 1, 1)))
  assert_stops(fresh_device, r"invalid dimensions \(queue error 0x2\)",
               "grid_size_x 100 is not a multiple of workgroup_size_x 64")


def test_a_workgroup_over_1024_items_is_refused(amd: AMDDevice, fresh_device: AMDDevice) -> None:
  loaded, _ = program(fresh_device)
  submit_raw(fresh_device, dispatch(loaded, 0, (2048, 1, 1), (2048, 1, 1)))
  assert_stops(fresh_device, r"workgroup too large \(queue error 0x40\)", "2048 work-items, more than 1024")


def test_a_kernel_object_with_no_known_code_is_refused(amd: AMDDevice, fresh_device: AMDDevice) -> None:
  loaded, _ = program(fresh_device)
  zeros = fresh_device.host_memory(4096)
  zeros.host[:] = 0   # a wave32 descriptor whose "code" (entry offset 0) is the descriptor itself
  zeros.host.view(np.uint16)[descriptors.KERNEL_CODE_PROPERTIES_OFFSET // 2] = \
    descriptors.KERNEL_CODE_PROPERTY_ENABLE_WAVEFRONT_SIZE32
  submit_raw(fresh_device, dispatch(loaded, 0, (64, 1, 1), (64, 1, 1), kernel_object=zeros.address))
  assert_stops(fresh_device, "invalid \\(or null\\) code object", "no program is registered for the code at")


def test_wave64_code_on_a_wave32_chip_is_refused(amd: AMDDevice, fresh_device: AMDDevice) -> None:
  loaded, _ = program(fresh_device)
  zeros = fresh_device.host_memory(4096)
  zeros.host[:] = 0
  submit_raw(fresh_device, dispatch(loaded, 0, (64, 1, 1), (64, 1, 1), kernel_object=zeros.address))
  assert_stops(fresh_device, "invalid \\(or null\\) code object", "compiled for wave64; gfx1100 runs wave32")


def test_a_vendor_packet_of_another_format_is_refused(fresh_device: AMDDevice) -> None:
  packet = packets.pm4_ib_packet(fresh_device.family, fresh_device.event_page.address, 4)
  packet.pm4_command[0] = 2
  packet.header = packets.aql_header(hsa.HSA_PACKET_TYPE_VENDOR_SPECIFIC)
  submit_raw(fresh_device, packet)
  assert_stops(fresh_device, r"invalid vendor-specific packet \(queue error 0x100\)", "vendor packet format 2")


def test_a_kernel_touching_unmapped_memory_faults_naming_the_kernel(amd: AMDDevice, fresh_device: AMDDevice) -> None:
  loaded, count = program(fresh_device)
  good = fresh_device.allocator.alloc(4096)
  fresh_device.launch(loaded, [good.address] * count, (1, 1, 1), (64, 1, 1))
  fresh_device.synchronize(5.0)
  fresh_device.launch(loaded, [good.address] + [0x7000_0000_0000] * (count - 1), (1, 1, 1), (64, 1, 1))
  with pytest.raises(DeviceFault) as fault:
    fresh_device.synchronize(5.0)
  message = str(fault.value)
  assert "GPU memory fault at 0x700000000000 (page not present)" in message and loaded.name in message
  assert "0x700000000000" in fresh_device.kernel.faults[-1]
  with pytest.raises(DeviceFault, match="open the device again"):
    fresh_device.submit(HWQueue())


def test_an_sdma_copy_from_unmapped_memory_faults(fresh_device: AMDDevice) -> None:
  target = fresh_device.host_memory(4096)
  fresh_device.submit(HWQueue().copy(target.address, 0x6000_0000_0000, 4096), COPY)
  assert_stops(fresh_device, "GPU memory fault at 0x600000000000", "copy read of 4096 bytes at 0x600000000000")


def test_an_sdma_packet_the_engine_cannot_decode_hangs_it(fresh_device: AMDDevice) -> None:
  fresh_device.synchronize(5.0)
  fresh_device.copy_queue.submit([0x3F], fresh_device.check_faults)   # opcode 63 is no SDMA packet
  fresh_device.submit(HWQueue(), COPY)
  assert_stops(fresh_device, "hardware exception", "opcode 63")


def test_no_rocm_or_hsa_library_is_loaded_after_a_run(amd: AMDDevice) -> None:
  assert (Tensor(np.arange(8, dtype=np.float32), device="AMD") * 2).numpy()[3] == 6
  with open("/proc/self/maps") as maps:
    loaded = [line.split()[-1] for line in maps if any(name in line.lower() for name in
              ("libhsa", "hsa-runtime", "libamdhip", "libhsakmt", "librocm", "/opt/rocm", "libdrm_amdgpu"))]
  assert loaded == []
