"""Fixtures for the NV driver's tests: each runs against an emulated kernel interface (no GPU needed)."""
from __future__ import annotations

from typing import Iterator

import pytest

from rawgrad.drivers.nv.device import NVDevice
from rawgrad.drivers.nv.emulated import EmulatedKernel


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
