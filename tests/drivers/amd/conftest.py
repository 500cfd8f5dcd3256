"""Fixtures for the AMD driver's tests: each runs against an emulated KFD (no GPU needed)."""
from __future__ import annotations

from typing import Iterator

import pytest

from rawgrad.drivers import os as seam
from rawgrad.drivers.amd.device import AMDDevice
from rawgrad.drivers.amd.emulated import EmulatedKernel
from rawgrad.runtime.device import Device


@pytest.fixture(scope="module")
def device() -> Iterator[AMDDevice]:
  """One emulated RX 7900 XTX (gfx1100) shared by a module's tests (none of them may leave it faulted)."""
  opened = AMDDevice("AMD", EmulatedKernel(arch="gfx1100"))
  yield opened
  opened.close()


@pytest.fixture
def fresh_device() -> Iterator[AMDDevice]:
  """An emulated gfx1100 of its own, for a test that stops its queues."""
  opened = AMDDevice("AMD", EmulatedKernel(arch="gfx1100"))
  yield opened
  opened.close()


@pytest.fixture(scope="module")
def amd() -> AMDDevice:
  """Device["AMD"] for the Tensor API, opened on an emulated gfx1100 (kept for the process, as the registry does)."""
  with seam.installed("amd", EmulatedKernel(arch="gfx1100")):
    return Device["AMD"]
