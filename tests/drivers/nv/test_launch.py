"""Kernels on the emulated H100: QMDs built from the cubin's facts, Tensor programs end to end (PTX, ptxas, cubin,
QMD, pushbuffer, the emulated GPU's interpreter), device timestamps for the profiler, and faults that raise a clear
error instead of hanging: a kernel touching unmapped memory, a method the class lacks, a bad QMD, kernel arguments
over the limit."""
from __future__ import annotations

import numpy as np
import pytest

from rawgrad import Tensor
from rawgrad.autogen.nv import nv_classes as classes
from rawgrad.compiler.render.llvmir import kernel_symbol
from rawgrad.drivers import os as seam
from rawgrad.drivers.nv.channel import SUBCHANNEL_COMPUTE, Pushbuffer
from rawgrad.drivers.nv.cubin import KernelFacts, Parameter
from rawgrad.drivers.nv.device import EncodedQueue, NVDevice, NVProgram, check_argument_layout
from rawgrad.drivers.nv.emulated import read_qmd
from rawgrad.drivers.nv.qmd import (QMD_V03, QMD_V04, Launch, build_qmd, driver_constants, get_field,
                                    set_field)
from rawgrad.helpers import Context
from rawgrad.runtime import profile
from rawgrad.runtime.device import Device
from rawgrad.runtime.hcq import COMPUTE, DeviceFault, HWQueue

FACTS = KernelFacts(name="k", sm=90, code=b"\0" * 256, entry=0, registers=14,
                    parameters=(Parameter(0, 0, 8), Parameter(1, 8, 8), Parameter(2, 16, 4)), parameter_base=0x210,
                    parameter_bytes=20, constant_bank_bytes=0x224, shared_bytes=0x404, frame_bytes=0, barriers=1,
                    max_threads=None)


def test_a_v04_qmd_carries_the_launch_as_the_gpu_reads_it() -> None:
  launch = Launch(FACTS, 0x12_3456_7880, (70000, 3, 2), (128, 2, 1), 0x10_2000_0000, 0x7000_0000_0000, 0)
  qmd = build_qmd(QMD_V04, launch)
  read = read_qmd(bytes(qmd))   # the emulator's own reader
  assert (read.major, read.grid, read.block, read.program_address) == (4, (70000, 3, 2), (128, 2, 1), 0x12_3456_7880)
  assert (read.registers, read.shared_bytes, read.bank_valid) == (14, 0x500, True)
  assert (read.bank_address, read.bank_bytes) == (0x10_2000_0000, 0x230)   # 0x210 + 20 bytes, rounded to 16
  constants = driver_constants(launch)
  assert len(constants) == 0x210 and constants[:24] == np.array([128, 2, 1, 70000, 3, 2], "<u4").tobytes()
  ampere = build_qmd(QMD_V03, Launch(FACTS, 0x1000, (5, 1, 1), (32, 1, 1), 0x2000, 0, 0))
  assert len(ampere) == 256 and get_field(bytes(ampere), QMD_V03.bits("CTA_RASTER_WIDTH")) == 5
  assert get_field(bytes(ampere), QMD_V03.bits("QMD_MAJOR_VERSION")) == 3


def test_the_driver_refuses_launches_the_hardware_cannot_take() -> None:
  with pytest.raises(ValueError, match="1025 threads"):
    build_qmd(QMD_V04, Launch(FACTS, 0, (1, 1, 1), (1025, 1, 1), 0, 0, 0))
  with pytest.raises(ValueError, match=r"grid \(1, 65536, 1\)"):
    build_qmd(QMD_V04, Launch(FACTS, 0, (1, 65536, 1), (1, 1, 1), 0, 0, 0))
  with pytest.raises(ValueError, match="not 256-aligned"):
    build_qmd(QMD_V04, Launch(FACTS, 0, (1, 1, 1), (1, 1, 1), 0x1040, 0, 0))
  big = KernelFacts(**{**FACTS.__dict__, "parameter_bytes": 0x8000})
  with pytest.raises(ValueError, match="32768 bytes of kernel arguments exceed the limit of 32764"):
    build_qmd(QMD_V04, Launch(big, 0, (1, 1, 1), (1, 1, 1), 0, 0, 0))
  with pytest.raises(ValueError, match="takes 9 bits"):
    set_field(bytearray(384), QMD_V04.bits("REGISTER_COUNT"), 512, "REGISTER_COUNT")


def test_kernels_whose_arguments_are_not_8_byte_slots_are_refused() -> None:
  with pytest.raises(ValueError, match="parameter 2 is 4 bytes at offset 16"):
    check_argument_layout(FACTS, 0x210)
  slots = KernelFacts(**{**FACTS.__dict__, "parameters": (Parameter(0, 0, 8), Parameter(1, 8, 8))})
  check_argument_layout(slots, 0x210)
  with pytest.raises(ValueError, match="parameters start at 0x210 .* end at 0x160"):
    check_argument_layout(slots, 0x160)


def test_tensor_programs_run_on_the_emulated_gpu(nv: NVDevice) -> None:
  rng = np.random.default_rng(0)
  a, b = rng.random(1000, dtype=np.float32), rng.random(1000, dtype=np.float32)
  assert np.array_equal((Tensor(a, device="NV") + Tensor(b, device="NV")).numpy(), a + b)
  x = rng.random((300, 70), dtype=np.float32)
  np.testing.assert_allclose(Tensor(x, device="NV").sum(axis=1).numpy(), x.sum(axis=1), rtol=1e-5)
  assert int(Tensor(np.arange(100_000, dtype=np.int32), device="NV").max().item()) == 99_999
  m, w = rng.random((33, 17), dtype=np.float32), rng.random((17, 9), dtype=np.float32)
  np.testing.assert_allclose((Tensor(m, device="NV") @ Tensor(w, device="NV")).numpy(), m @ w, rtol=1e-5)


def test_kernels_with_the_same_code_run_their_own_programs(nv: NVDevice) -> None:
  # an add of 2 and of 4 elements can compile to the same machine code: the emulation must still run each launch's
  # program (the one uploaded at the launched address), not the first registered with those bytes
  for n in (2, 4, 8, 4, 2):
    np.testing.assert_array_equal((Tensor(np.arange(n, dtype=np.float32), device="NV") + 1).numpy(),
                                  np.arange(n, dtype=np.float32) + 1)


def test_profiled_kernels_carry_gpu_times(nv: NVDevice) -> None:
  before = len(profile.events)
  with Context(PROFILE=1):
    (Tensor(np.ones(4096, np.float32), device="NV") * 3).numpy()
  events = [event for event in profile.events[before:] if event.device == "NV"]
  del profile.events[before:]   # no trace file at exit
  assert events and all(0 < event.end_ns - event.start_ns < 10_000_000_000 for event in events)


def _program(device: NVDevice) -> tuple[NVProgram, int]:
  """An elementwise add loaded on `device`: compiled from a Tensor kernel's source; returns it and its parameters."""
  from rawgrad.engine.realize import _runners
  Device["NV"]
  (Tensor(np.ones(64, np.float32), device="NV") + Tensor(np.ones(64, np.float32), device="NV")).numpy()
  runner = next(r for (name, _), r in reversed(_runners.entries.items()) if name == "NV")
  program = NVProgram(device, kernel_symbol(runner.name), device.compiler.compile(runner.source))
  return program, len(program.facts.parameters)


def test_a_kernel_reading_unmapped_memory_faults_naming_the_kernel(nv: NVDevice, fresh_device: NVDevice) -> None:
  program, count = _program(fresh_device)
  good = fresh_device.allocator.alloc(4096)
  fresh_device.launch(program, [good.address] * count, (1, 1, 1), (64, 1, 1))
  fresh_device.synchronize(5.0)
  fresh_device.launch(program, [good.address] + [0x40_0000_0000] * (count - 1), (1, 1, 1), (64, 1, 1))
  with pytest.raises(DeviceFault) as fault:
    fresh_device.synchronize(5.0)
  message = str(fault.value)
  assert "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT" in message and "Xid 31" in message and program.name in message
  assert "0x4000000000" in fresh_device.kernel.faults[-1]
  with pytest.raises(DeviceFault, match="open the device again"):   # the channel is gone: no hang, no more work
    fresh_device.submit(HWQueue())


def _submit_words(device: NVDevice, pushbuffer: Pushbuffer) -> None:
  """Hand-made words on the compute channel, after everything before (code uploads go through the copy engine)."""
  device.synchronize(5.0)
  device._submit(EncodedQueue(COMPUTE, pushbuffer.array()), COMPUTE)
  device.submit(HWQueue(), COMPUTE)


def test_a_method_the_class_lacks_faults(fresh_device: NVDevice) -> None:
  pushbuffer = Pushbuffer()
  pushbuffer.method(SUBCHANNEL_COMPUTE, 0x3FFC, 1)
  _submit_words(fresh_device, pushbuffer)
  with pytest.raises(DeviceFault, match=r"ROBUST_CHANNEL_GR_CLASS_ERROR .*Xid 69"):
    fresh_device.synchronize(5.0)
  assert "0x3ffc" in fresh_device.kernel.faults[-1]


def test_a_launch_pointing_at_no_qmd_faults(fresh_device: NVDevice) -> None:
  """SEND_PCAS_A can only name 256-byte-aligned QMDs; one pointing at a QMD's middle reads garbage, which the GPU
  rejects (here: zeros, major version 0)."""
  qmd = fresh_device.host_memory(1024)
  qmd.host[:] = 0
  pushbuffer = Pushbuffer()
  compute = fresh_device.gpu.info.compute_class
  pushbuffer.method(SUBCHANNEL_COMPUTE, classes.NVCBC0_SEND_PCAS_A, (qmd.address + 256) >> 8)
  pushbuffer.method(SUBCHANNEL_COMPUTE, classes.NVCBC0_SEND_SIGNALING_PCAS2_B,
                    classes.NVCBC0_SEND_SIGNALING_PCAS2_B_PCAS_ACTION_INVALIDATE_COPY_SCHEDULE)
  assert compute == classes.HOPPER_COMPUTE_A
  _submit_words(fresh_device, pushbuffer)
  with pytest.raises(DeviceFault, match=r"ROBUST_CHANNEL_GR_EXCEPTION .*Xid 13"):
    fresh_device.synchronize(5.0)
  assert "major version 0" in fresh_device.kernel.faults[-1]


def test_kernel_arguments_over_the_limit_are_rejected_by_the_gpu(nv: NVDevice, fresh_device: NVDevice) -> None:
  program, _ = _program(fresh_device)
  block = fresh_device.host_memory(0x9000 + 1024)
  bank = (block.address + 1023) & ~1023
  launch = Launch(program.facts, program.address, (1, 1, 1), (64, 1, 1), bank, 0, 0)
  qmd = build_qmd(QMD_V04, launch)
  set_field(qmd, QMD_V04.bits("CONSTANT_BUFFER_SIZE_SHIFTED4", 0), (0x210 + 0x8000) >> 4)
  seam.host_view(bank - 512, 384)[:] = np.frombuffer(bytes(qmd), np.uint8)
  seam.host_view(bank, 0x210)[:] = np.frombuffer(driver_constants(launch), np.uint8)
  pushbuffer = Pushbuffer()
  pushbuffer.method(SUBCHANNEL_COMPUTE, classes.NVCBC0_SEND_PCAS_A, (bank - 512) >> 8)
  pushbuffer.method(SUBCHANNEL_COMPUTE, classes.NVCBC0_SEND_SIGNALING_PCAS2_B,
                    classes.NVCBC0_SEND_SIGNALING_PCAS2_B_PCAS_ACTION_INVALIDATE_COPY_SCHEDULE)
  _submit_words(fresh_device, pushbuffer)
  with pytest.raises(DeviceFault, match="Xid 13"):
    fresh_device.synchronize(5.0)
  assert "32768 bytes of kernel arguments, over the limit of 32764" in fresh_device.kernel.faults[-1]


def test_a_timed_launch_returns_ordered_host_times(nv: NVDevice, fresh_device: NVDevice) -> None:
  program, count = _program(fresh_device)
  memory = fresh_device.allocator.alloc(4096)
  start, end = fresh_device.launch(program, [memory.address] * count, (1, 1, 1), (64, 1, 1), timed=True)
  assert 0 < end - start < 5_000_000_000


def test_no_cuda_library_is_loaded_after_a_run(nv: NVDevice) -> None:
  assert (Tensor(np.arange(8, dtype=np.float32), device="NV") * 2).numpy()[3] == 6
  with open("/proc/self/maps") as maps:
    loaded = [line.split()[-1] for line in maps if any(name in line for name in
                                                          ("libcuda.so", "libcudart", "libnvidia-ptxjitcompiler"))]
  assert loaded == []
