"""Fixtures of the codegen tests, which build and run CPU kernels (kernels.py): their tensors live on the CPU."""
from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

from rawgrad.compiler.codegen.opt.kernel import Opt
from rawgrad.tensor import Tensor
from tests.compiler.codegen.kernels import last_kernel, run_item


@pytest.fixture
def run_opts() -> Callable[..., np.ndarray]:
  """run_opts(tensor, opts, cores=1): the tensor's value computed by its last kernel with these opts."""
  def run(tensor: Tensor, opts: list[Opt] | None, cores: int = 1) -> np.ndarray:
    item = last_kernel(tensor)
    return run_item(item, opts, cores).reshape(tensor.shape)
  return run


@pytest.fixture(autouse=True)
def _on_the_cpu(default_cpu: None) -> None:
  pass
