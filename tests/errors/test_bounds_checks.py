"""Index values the host does not have yet (tensors the device computes) are checked on the device: the op leaves a
pending check, the next realize computes it beside the result without waiting, and the next host read raises
IndexOutOfRange naming the value and the size. In-range values give the right results and cost no extra wait."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

from rawgrad import Device, GlobalCounters, IndexOutOfRange, Tensor, jit, nn
from rawgrad.runtime.device import Buffer
from rawgrad.tensor_ops import bounds

X = np.arange(12, dtype=np.float32).reshape(3, 4)


def lazy(values: Any) -> Tensor:
  """Index values only the device knows until it has run a kernel."""
  return Tensor(np.asarray(values, dtype=np.int32)) + 0


@pytest.fixture(autouse=True)
def no_check_left_behind():
  yield
  leftover = len(bounds._pending) + len(bounds._computed)
  bounds._pending.clear()
  bounds._computed.clear()
  assert leftover == 0, "a test left index checks for a later host read"


# op, out-of-range indices, in-range indices, what numpy computes from those, the message's value and size
OPS: list[tuple[str, Callable[[Tensor], Tensor], list, list, Callable[[np.ndarray], np.ndarray], str]] = [
  ("indexing", lambda i: Tensor(X)[i], [0, 3], [2, -1, 0], lambda i: X[i],
   "indexing: index 3 is out of bounds for dim 0 with size 3"),
  ("indexing dim 1", lambda i: Tensor(X)[:, i], [-5, 1], [3, -4], lambda i: X[:, i],
   "index -5 is out of bounds for dim 1"),
  ("gather", lambda i: Tensor(X).gather(1, i.reshape(3, 1)), [0, 1, 4], [3, 0, 2],
   lambda i: np.take_along_axis(X, i.reshape(3, 1), 1), "gather: index 4 is out of bounds for dim 1 with size 4"),
  ("take_along_dim", lambda i: Tensor(X).take_along_dim(i.reshape(3, 1), 1), [0, -5, 1], [-1, 0, 2],
   lambda i: np.take_along_axis(X, i.reshape(3, 1), 1), "take_along_dim: index -5"),
  ("index_select", lambda i: Tensor(X).index_select(0, i), [1, 7], [2, 2, 0], lambda i: X[i],
   "index_select: index 7 is out of bounds for dim 0 with size 3"),
  ("scatter", lambda i: Tensor(X).scatter(0, i.reshape(1, 4), 100.0), [0, 1, 2, 3], [2, 0, 1, 1],
   lambda i: _scattered(i), "scatter: index 3 is out of bounds for dim 0 with size 3"),
  ("embedding", lambda i: i.embedding(Tensor(X)), [2, -1], [2, 0, 1], lambda i: X[i],
   "embedding: index -1 is out of range for 3 embeddings"),
  ("one_hot", lambda i: i.one_hot(4), [1, 4], [3, 0], lambda i: np.eye(4, dtype=np.int32)[i],
   "one_hot: class 4 is out of range for num_classes=4"),
  ("cross_entropy", lambda i: Tensor(X).cross_entropy(i), [0, 9, 1], [3, -100, 1], lambda i: _cross_entropy(i),
   "cross_entropy: target 9 is out of bounds for 4 classes"),
  ("nll_loss", lambda i: Tensor(X).nll_loss(i), [0, -3, 1], [3, -100, 0], lambda i: _nll(i),
   "nll_loss: target -3 is out of bounds for 4 classes"),
  ("sparse_categorical_crossentropy", lambda i: Tensor(X).sparse_categorical_crossentropy(i), [4, 0, 1], [3, -1, 1],
   lambda i: _cross_entropy(i, ignore=-1), "sparse_categorical_crossentropy: target 4 is out of bounds for 4 classes"),
]


def _scattered(index: np.ndarray) -> np.ndarray:
  result = X.copy()
  result[index, np.arange(4)] = 100.0
  return result


def _log_softmax(x: np.ndarray) -> np.ndarray:
  shifted = x - x.max(1, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(1, keepdims=True))


def _nll(target: np.ndarray, log_probs: np.ndarray = X, ignore: int = -100) -> np.ndarray:
  counted = target != ignore
  picked = log_probs[np.arange(len(target))[counted], target[counted]]
  return -picked.mean()


def _cross_entropy(target: np.ndarray, ignore: int = -100) -> np.ndarray:
  return _nll(target, _log_softmax(X), ignore)


IDS = [op[0] for op in OPS]


@pytest.mark.parametrize("name, op, bad, good, expected, message", OPS, ids=IDS)
def test_out_of_range_raises_at_the_next_host_read(name, op, bad, good, expected, message) -> None:
  result = op(lazy(bad))    # the values are not known yet: nothing is raised
  result.realize()          # the check is computed with the result, not read
  with pytest.raises(IndexOutOfRange, match=message) as raised: result.numpy()
  assert isinstance(raised.value, IndexError) and isinstance(raised.value, RuntimeError)


@pytest.mark.parametrize("name, op, bad, good, expected, message", OPS, ids=IDS)
def test_in_range_values_are_right(name, op, bad, good, expected, message) -> None:
  np.testing.assert_allclose(op(lazy(good)).numpy(), expected(np.array(good)), rtol=1e-6)


@pytest.mark.parametrize("name, op, bad, good, expected, message", OPS, ids=IDS)
def test_values_the_host_has_raise_at_the_call(name, op, bad, good, expected, message) -> None:
  with pytest.raises(IndexOutOfRange, match=message): op(Tensor(np.array(bad, dtype=np.int32)))


@pytest.mark.parametrize("read", [lambda t: t.numpy(), lambda t: t.tolist(), lambda t: t.sum().item(),
                                  lambda t: Tensor.synchronize()], ids=["numpy", "tolist", "item", "synchronize"])
def test_every_host_read_raises(read: Callable[[Tensor], Any]) -> None:
  result = Tensor(X).gather(1, lazy([[0], [5], [1]]))
  with pytest.raises(IndexOutOfRange, match="index 5 is out of bounds for dim 1 with size 4"): read(result)


def test_a_host_read_of_another_tensor_raises_for_checks_made_before_it() -> None:
  Tensor(X).index_select(0, lazy([3]))   # never realized, never read
  with pytest.raises(IndexOutOfRange, match="index 3"): Tensor([1.0, 2.0]).numpy()


def test_an_error_is_raised_once_and_later_reads_work() -> None:
  result = Tensor(X).gather(1, lazy([[0], [5], [1]]))
  with pytest.raises(IndexOutOfRange): result.numpy()
  np.testing.assert_array_equal(Tensor(X)[lazy([1])].numpy(), X[[1]])


def test_the_first_failed_check_is_reported() -> None:
  Tensor(X)[lazy([7])]
  Tensor(X).gather(1, lazy([[9], [0], [0]]))
  with pytest.raises(IndexOutOfRange, match="indexing: index 7"): Tensor.synchronize()


def test_realize_neither_waits_for_the_device_nor_reads_a_check(monkeypatch: pytest.MonkeyPatch) -> None:
  result = Tensor(X).gather(1, lazy([[0], [5], [1]]))
  reads: list[Buffer] = []
  monkeypatch.setattr(Buffer, "numpy", lambda self: reads.append(self))
  waits: list[int] = []
  device = Device[result.device]
  monkeypatch.setattr(type(device), "synchronize", lambda self, timeout_s=30.0: waits.append(0))
  monkeypatch.setattr(type(device), "synchronize_after", lambda self, value: waits.append(value))
  result.realize()
  assert reads == [] and waits == []
  assert len(bounds._computed) == 1
  monkeypatch.undo()
  with pytest.raises(IndexOutOfRange): result.numpy()


def test_reading_the_checks_never_waits_for_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
  """The host read waits for the device once, for the data; the checks are read after it, from an idle device."""
  idle_at_check_reads: list[bool] = []
  read = Buffer.numpy
  check_buffers: set[int] = set()

  def recording_read(buffer: Buffer) -> np.ndarray:
    if id(buffer) in check_buffers: idle_at_check_reads.append(buffer.hcq.idle)
    return read(buffer)
  result = Tensor(X).gather(1, lazy([[0], [3], [1]])) * 2
  result.realize()
  check_buffers.update(id(bounds.buffer_for(bounds.buffer_base(check.extremes.uop))) for check in bounds._computed)
  monkeypatch.setattr(Buffer, "numpy", recording_read)
  np.testing.assert_array_equal(result.numpy(), 2 * np.take_along_axis(X, np.array([[0], [3], [1]]), 1))
  assert idle_at_check_reads == [True]


def test_a_deferred_check_is_one_small_kernel() -> None:
  Tensor(X).gather(1, lazy([[0], [3], [1]]))  # the result is never used: only its check runs
  GlobalCounters.kernel_count = 0
  Tensor.synchronize()
  assert GlobalCounters.kernel_count == 1


def test_values_the_host_has_are_checked_without_a_kernel() -> None:
  index = Tensor(np.array([[0], [3], [1]], dtype=np.int32))
  before = len(bounds._pending)
  Tensor(X).gather(1, index)
  assert len(bounds._pending) == before
  computed = (Tensor(np.array([2, 0], dtype=np.int32)) + 1).realize()
  Tensor.synchronize()
  message = "index 3 is out of bounds for dim 0 with size 3"
  if bounds.buffer_for(bounds.buffer_base(computed.uop)).raw.host is not None:
    # an idle device's host-mapped memory (the CPU's): the host reads the values at the call
    with pytest.raises(IndexOutOfRange, match=message): Tensor(X)[computed]
  else:
    result = Tensor(X)[computed]
    with pytest.raises(IndexOutOfRange, match=message): result.numpy()


def test_ignore_index_is_not_checked() -> None:
  loss = Tensor(X).cross_entropy(lazy([-100, -100, 2]), ignore_index=-100)
  np.testing.assert_allclose(loss.numpy(), -_log_softmax(X)[2, 2], rtol=1e-6)
  with pytest.raises(IndexOutOfRange, match="target -100"): Tensor(X).cross_entropy(lazy([-100, 0, 0]),
                                                                                     ignore_index=-1).numpy()


def test_embedding_layer_checks_its_indices() -> None:
  layer = nn.Embedding(3, 2)
  out = layer(lazy([[0, 2], [3, 1]]))
  with pytest.raises(IndexOutOfRange, match="index 3 is out of range for 3 embeddings"): out.numpy()


def test_jit_replays_read_their_checks() -> None:
  x = Tensor(X).realize()

  @jit
  def pick(x: Tensor, index: Tensor) -> Tensor:
    return x.gather(1, index + 0)
  for values, valid in (([[0], [1], [2]], True), ([[3], [2], [1]], True), ([[1], [1], [1]], True),
                        ([[0], [4], [1]], False), ([[2], [2], [0]], True), ([[-1], [0], [0]], False)):
    index = Tensor(np.array(values, dtype=np.int32)).realize()
    if valid:
      np.testing.assert_array_equal(pick(x, index).numpy(), np.take_along_axis(X, np.array(values), 1))
    else:
      with pytest.raises(IndexOutOfRange, match="gather: index"): pick(x, index).numpy()
  assert pick.calls == 6 and pick.graph is not None  # the last four calls were replays
