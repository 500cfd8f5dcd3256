"""The MNIST training step (tools/mnist.py), jitted, on the emulated H100: its losses over five steps match the CPU's
to 1e-4."""
from __future__ import annotations

from rawgrad.drivers.nv.device import NVDevice
from tests.drivers.mnist_steps import assert_steps_match_the_cpu


def test_five_mnist_steps_on_nv_match_the_cpu(nv: NVDevice) -> None:
  assert_steps_match_the_cpu("NV")
