"""Random numbers of tensor_ops/random.py (Threefry), by value and by distribution."""
import numpy as np
import pytest

from rawgrad import Tensor, dtypes
from rawgrad.compiler.ir import Ops, UOp, exec_alu


@pytest.mark.parametrize("key, counter, expected", [
  # known-answer vectors of Threefry-2x32 with 20 rounds (Random123)
  ((0, 0), (0, 0), (0x6B200159, 0x99BA4EFE)),
  ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
  ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
])
def test_threefry_known_answers(key: tuple, counter: tuple, expected: tuple) -> None:
  packed = lambda words: words[0] | words[1] << 32  # noqa: E731
  bits = Tensor([packed(counter)], dtype=dtypes.uint64).uop
  keys = Tensor([packed(key)], dtype=dtypes.uint64).uop
  # as a kernel computes it (codegen writes out the rounds), and as the constant folder does
  assert Tensor(UOp(Ops.THREEFRY, dtypes.uint64, (bits, keys))).item() == packed(expected)
  assert exec_alu(Ops.THREEFRY, dtypes.uint64, (packed(counter), packed(key))) == packed(expected)


def test_same_seed_same_numbers_in_any_order_of_realization() -> None:
  Tensor.manual_seed(5)
  first, second = Tensor.rand(100), Tensor.randn(3, 7)
  a, b = first.numpy(), second.numpy()
  Tensor.manual_seed(5)
  first, second = Tensor.rand(100), Tensor.randn(3, 7)
  np.testing.assert_array_equal(second.numpy(), b)  # realized in the other order
  np.testing.assert_array_equal(first.numpy(), a)
  Tensor.manual_seed(6)
  assert not np.array_equal(Tensor.rand(100).numpy(), a)


def test_distributions() -> None:
  Tensor.manual_seed(0)
  uniform = Tensor.rand(200_000).numpy()
  assert uniform.min() >= 0 and uniform.max() < 1 and abs(uniform.mean() - 0.5) < 0.005
  assert np.all(np.abs(np.histogram(uniform, 10, (0, 1))[0] / 20_000 - 1) < 0.05)
  normal = Tensor.randn(200_000).numpy()
  assert abs(normal.mean()) < 0.01 and abs(normal.std() - 1) < 0.01 and np.isfinite(normal).all()
  ints = Tensor.randint(10_000, low=-3, high=4).numpy()
  assert ints.dtype == np.int32 and set(np.unique(ints)) == set(range(-3, 4))
  scaled = Tensor.normal(50_000, mean=3.0, std=0.5).numpy()
  assert abs(scaled.mean() - 3) < 0.01 and abs(scaled.std() - 0.5) < 0.01
  like = Tensor.zeros(50_000, dtype=dtypes.float64).randn_like()
  assert like.dtype == dtypes.float64 and abs(like.numpy().mean()) < 0.02 and abs(like.numpy().std() - 1) < 0.02


def test_initializers_respect_their_bounds() -> None:
  weight = Tensor.kaiming_uniform(64, 27, a=5 ** 0.5).numpy()
  bound = np.sqrt(2 / (1 + 5)) * np.sqrt(3 / 27)
  assert np.abs(weight).max() <= bound and np.abs(weight).max() > 0.9 * bound
  glorot = Tensor.glorot_uniform(30, 20).numpy()
  assert np.abs(glorot).max() <= np.sqrt(6 / 50)
  like = Tensor.zeros(4, 5, dtype=dtypes.float16).rand_like()
  assert like.shape == (4, 5) and like.dtype == dtypes.float16
  with pytest.raises(ValueError, match="low < high"): Tensor.randint(3, low=2, high=2)


def test_a_draw_is_a_small_graph_whose_rounds_codegen_writes_out() -> None:
  # the 20 rounds are one THREEFRY node until codegen: building a draw per call stays cheap
  nodes = Tensor.rand(16).uop.toposort
  assert sum(node.op is Ops.THREEFRY for node in nodes) == 1 and len(nodes) < 40, len(nodes)


def test_rand_in_half_precision_stays_below_one() -> None:
  """A float32 just below 1 rounded to 1 in float16 and bfloat16 (30 and 213 of 100000): (rand * n).int() gave n."""
  Tensor.manual_seed(0)
  for dtype in (dtypes.float16, dtypes.bfloat16):
    values = Tensor.rand(100000, dtype=dtype).cast(dtypes.float32).numpy()
    assert values.max() < 1.0 and values.min() >= 0.0 and abs(values.mean() - 0.5) < 0.01


def test_randint_over_a_wide_range_reaches_every_residue() -> None:
  """One float32 word has 24 random bits: randint over 2**30 gave multiples of 64 only."""
  Tensor.manual_seed(0)
  values = Tensor.randint(100000, low=0, high=2 ** 30, dtype=dtypes.int64).numpy()
  assert values.min() >= 0 and values.max() < 2 ** 30 and np.unique(values % 64).size == 64
  assert abs(values.mean() / 2 ** 30 - 0.5) < 0.01


def test_random_floats_refuse_an_integer_dtype() -> None:
  """They returned zeros (torch raises)."""
  from rawgrad.errors import DTypeError
  with pytest.raises(DTypeError, match="float dtype"): Tensor.rand(3, dtype=dtypes.int32)
  with pytest.raises(DTypeError, match="float dtype"): Tensor.zeros(3, dtype=dtypes.int32).randn_like()
