"""Fixtures shared by the test folders."""
import pytest

from rawgrad.helpers import getenv


@pytest.fixture
def default_cpu(monkeypatch: pytest.MonkeyPatch):
  """Tensors made without a device go to the CPU, whatever DEVICE says: for tests that run their kernels through CPU
  runners (given another device's buffers, a CPU kernel would dereference that device's addresses)."""
  monkeypatch.setenv("DEVICE", "CPU")
  getenv.cache_clear()
  yield
  monkeypatch.undo()
  getenv.cache_clear()
