"""The MNIST training step (tools/mnist.py's CNN and Adam step, under jit) on the emulated AMD GPU, gfx1100 and
gfx942, against the same model on the CPU: the losses agree to 1e-4 after 5 steps."""
from __future__ import annotations

import pytest

from rawgrad.drivers import os as seam
from rawgrad.drivers.amd.emulated import EmulatedKernel
from rawgrad.runtime.device import Device
from tests.drivers.mnist_steps import assert_steps_match_the_cpu


@pytest.mark.parametrize("arch", ["gfx1100", "gfx942"])
def test_the_mnist_training_step_matches_the_cpu(arch: str) -> None:
  name = "AMD:0" if arch == "gfx942" else "AMD"
  with seam.installed("amd", EmulatedKernel(arch=arch)):
    opened = Device[name]
  assert opened.arch == arch, f"{name} was opened for {opened.arch} earlier in this process"
  assert_steps_match_the_cpu(name)
