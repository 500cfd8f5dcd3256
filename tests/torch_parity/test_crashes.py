"""Valid inputs issue 17 found crashing, against torch: 0-d scans, empty reductions, squeeze of 0-d, padding limits."""
import numpy as np
import pytest

from rawgrad import Tensor
from rawgrad.tools.compare_torch import Input
from tests.torch_parity.parity import both, check

torch = pytest.importorskip("torch")
F = torch.nn.functional


@pytest.mark.parametrize("name", ["cumsum", "cumprod", "cummax", "cummin", "logcumsumexp"])
@pytest.mark.parametrize("dim", [0, -1])
def test_scans_of_a_0d_tensor(name, dim):
  check(both(f"{name}_0d", lambda x: getattr(x, name)(dim), None, Input(())))
  if name != "logcumsumexp":
    check(both(f"{name}_0d_int", lambda x: getattr(x, name)(dim), None, Input((), -5, 5, "int32")))


@pytest.mark.parametrize("name", ["cumsum", "cumprod", "cummax", "cummin", "logcumsumexp"])
@pytest.mark.parametrize("shape, dim", [((2, 0), 1), ((0, 3), 0), ((0,), 0), ((3, 0, 2), 2)])
def test_scans_over_and_beside_an_empty_axis(name, shape, dim):
  check(both(f"{name}_empty", lambda x: getattr(x, name)(dim), None, Input(shape)))


@pytest.mark.parametrize("name", ["any", "all"])
@pytest.mark.parametrize("shape, dim, keepdim", [((2, 0), 1, False), ((0, 3), 0, True), ((0,), None, False),
                                                 ((2, 0, 3), (1, 2), False), ((3, 2), 1, False)])
def test_any_all_over_an_empty_axis(name, shape, dim, keepdim):
  def call(x, module):
    if dim is None: return getattr(x, name)()
    return getattr(x, name)(dim, keepdim=keepdim) if module == "ours" else getattr(x, name)(dim=dim, keepdim=keepdim)
  check(both(f"{name}_empty", lambda x: call(x != 0, "ours"), lambda x: call(x != 0, "torch"), Input(shape),
             backward=False))


@pytest.mark.parametrize("dim", [0, -1, None])
def test_squeeze_of_a_0d_tensor(dim):
  squeeze = (lambda x: x.squeeze()) if dim is None else (lambda x: x.squeeze(dim))
  check(both("squeeze_0d", squeeze, None, Input(())))
  check(both("squeeze_size_one", squeeze, None, Input((1,))))


def test_squeeze_0d_rejects_dims_beyond_0d():
  with pytest.raises(IndexError):
    Tensor(1.0).squeeze(1)


@pytest.mark.parametrize("shape, pad", [((1, 5), (4, 4)), ((1, 4, 3), (2, 2, 3, 3)), ((2, 3, 2), (1, 0, 2, 1)),
                                        ((1, 2, 3, 4, 2), (1, 1, 3, 0, 2, 2))])
def test_reflect_padding_up_to_size_minus_one(shape, pad):
  unbatched = Input(shape)
  check(both("reflect_limit", lambda x: x.padded(pad, "reflect"), lambda x: F.pad(x, pad, "reflect"), unbatched))


@pytest.mark.parametrize("shape, pad", [((1, 3), (5, 7)), ((1, 2, 3), (9, 0, 4, 6)), ((1, 1, 1), (3, 3, 2, 2)),
                                        ((1, 2, 2, 2, 3), (4, 1, 0, 5, 3, 3))])
def test_replicate_padding_beyond_the_size(shape, pad):
  check(both("replicate_large", lambda x: x.padded(pad, "replicate"), lambda x: F.pad(x, pad, "replicate"),
             Input(shape)))


@pytest.mark.parametrize("shape, pad", [((1, 3), (3, 3)), ((1, 2, 3), (3, 1, 2, 2)),
                                        ((1, 1, 2, 2, 3), (3, 3, 2, 0, 1, 2))])
def test_circular_padding_up_to_the_size(shape, pad):
  check(both("circular_limit", lambda x: x.padded(pad, "circular"), lambda x: F.pad(x, pad, "circular"),
            Input(shape)))


def test_padding_beyond_torchs_limits_raises():
  x = np.zeros((1, 2, 3), np.float32)
  for mode, pad in (("reflect", (3, 0)), ("circular", (0, 4))):
    with pytest.raises(RuntimeError):
      F.pad(torch.tensor(x), pad, mode)
    with pytest.raises(ValueError, match=mode):
      Tensor(x).padded(pad, mode)
