"""Tensor.to between the CPU, the emulated AMD GPU and the emulated NVIDIA GPU, in every direction: the copies run
through each device's own queues (SDMA on AMD, the copy engine on NV) and the host."""
from __future__ import annotations

import numpy as np
import pytest

from rawgrad import Tensor
from rawgrad.drivers import os as seam
from rawgrad.drivers.amd.device import AMDDevice
from rawgrad.runtime.compile import CompileError, find_ptxas
from rawgrad.runtime.device import Device


@pytest.fixture(scope="module")
def nv() -> object:
  """Device["NV"] on the emulated H100 (its kernels go through ptxas, so without it these tests skip)."""
  try:
    find_ptxas()
  except CompileError as missing:
    pytest.skip(str(missing))
  from rawgrad.drivers.nv.emulated import EmulatedKernel as NVEmulatedKernel
  with seam.installed("nv", NVEmulatedKernel()):
    return Device["NV"]


def test_cpu_to_amd_and_back(amd: AMDDevice) -> None:
  values = np.random.default_rng(1).random((17, 5), dtype=np.float32)
  on_amd = Tensor(values).to("AMD") * 2
  assert on_amd.device == "AMD"
  back = (on_amd + 1).to("CPU")
  np.testing.assert_array_equal(back.numpy(), values * 2 + 1)


def test_amd_to_nv_and_nv_to_amd(amd: AMDDevice, nv: object) -> None:
  values = np.arange(-40, 40, dtype=np.float32)
  on_nv = Tensor(values, device="AMD").relu().to("NV")
  assert on_nv.device == "NV"
  np.testing.assert_array_equal(on_nv.numpy(), np.maximum(values, 0))
  round_trip = (on_nv * 3).to("AMD") - 1
  assert round_trip.device == "AMD"
  np.testing.assert_array_equal(round_trip.numpy(), np.maximum(values, 0) * 3 - 1)


def test_gradients_flow_back_through_copies_between_gpus(amd: AMDDevice, nv: object) -> None:
  x = Tensor(np.linspace(-1, 1, 12, dtype=np.float32), device="AMD", requires_grad=True)
  (x.to("NV") * x.to("NV")).sum().backward()
  assert x.grad.device == "AMD"
  np.testing.assert_allclose(x.grad.numpy(), 2 * np.linspace(-1, 1, 12, dtype=np.float32), rtol=1e-6)
