"""The renderer tests build and run CPU kernels (codegen/kernels.py): their tensors live on the CPU."""
import pytest


@pytest.fixture(autouse=True)
def _on_the_cpu(default_cpu: None) -> None:
  pass
