"""Fixtures for the NV driver's tests: each runs against an emulated kernel interface (no GPU needed)."""
from __future__ import annotations

from typing import Iterator

import pytest

from rawgrad.drivers import os as seam
from rawgrad.drivers.nv.device import NVDevice
from rawgrad.drivers.nv.emulated import EmulatedKernel
from rawgrad.runtime.compile import CompileError, find_ptxas
from rawgrad.runtime.device import Device


@pytest.fixture
def kernel() -> EmulatedKernel:
  return EmulatedKernel()


@pytest.fixture(scope="module")
def device() -> Iterator[NVDevice]:
  """One emulated H100 shared by a module's tests (none of them may leave it faulted)."""
  opened = NVDevice("NV", EmulatedKernel())
  yield opened
  opened.close()


@pytest.fixture
def fresh_device() -> Iterator[NVDevice]:
  """An emulated H100 of its own, for a test that stops its channels."""
  opened = NVDevice("NV", EmulatedKernel())
  yield opened
  opened.close()


@pytest.fixture(scope="session")
def nv() -> NVDevice:
  """Device["NV"] for the Tensor API, on the emulation (opened inside the seam's installed emulation); Tensor
  programs are assembled by ptxas, so without it these tests skip."""
  try:
    find_ptxas()
  except CompileError as missing:
    pytest.skip(str(missing))
  with seam.installed("nv", EmulatedKernel()):
    opened = Device["NV"]
  if not opened.kernel.runs_programs:   # only on a machine with the GPU, after a test there opened the real one
    pytest.skip("Device['NV'] is the real GPU in this process; these tests drive the emulation")
  return opened
