"""A catalogue of bad input: each case does one wrong thing and names the exception it must raise and a piece of the
message (the offending value, shape, dtype or device). Where torch makes the same mistake, the error must also be
an instance of the builtin exception torch raises, so `except RuntimeError` (or IndexError, TypeError) written for
torch catches rawgrad's error too.

Index values here are known on the host, so they raise at the call; tests/errors/test_bounds_checks.py covers the
values only the device knows.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rawgrad import ArgumentError, DTypeError, IndexOutOfRange, OutOfMemoryError, ShapeError, Tensor, dtypes
from rawgrad import nn

HUGE = 10**13  # elements: more bytes than any machine's memory


@dataclass(frozen=True)
class Case:
  name: str
  bad: Callable[[], Any]
  raises: type[BaseException]
  names: str                                  # the message must contain this
  torch: Callable[[], Any] | None = None      # the same mistake in torch, where it has one


def zeros(*shape: int) -> Tensor:
  return Tensor.zeros(*shape)


def ints(*values: int) -> Tensor:
  return Tensor(list(values))


def t_ints(*values: int) -> torch.Tensor:
  return torch.tensor(list(values))


SHAPES = [
  Case("add does not broadcast", lambda: zeros(3, 4) + zeros(5), ShapeError, "(3, 4) with (5,)",
       lambda: torch.zeros(3, 4) + torch.zeros(5)),
  Case("mul does not broadcast", lambda: zeros(2, 3) * zeros(2), ShapeError, "(2, 3) with (2,)",
       lambda: torch.zeros(2, 3) * torch.zeros(2)),
  Case("where does not broadcast", lambda: zeros(3).bool().where(zeros(4), 0.0), ShapeError, "(4,)",
       lambda: torch.where(torch.zeros(3).bool(), torch.zeros(4), 0.0)),
  Case("matmul inner dims", lambda: zeros(3, 4) @ zeros(5, 2), ShapeError, "(3, 4) and (5, 2)",
       lambda: torch.zeros(3, 4) @ torch.zeros(5, 2)),
  Case("matmul batch dims", lambda: zeros(2, 3, 4) @ zeros(3, 4, 5), ShapeError, "(2, 3, 4) and (3, 4, 5)",
       lambda: torch.zeros(2, 3, 4) @ torch.zeros(3, 4, 5)),
  Case("matmul of vectors", lambda: zeros(3) @ zeros(4), ShapeError, "(3,) and (4,)",
       lambda: torch.zeros(3) @ torch.zeros(4)),
  Case("matmul of a 0-d tensor", lambda: Tensor(1.0) @ zeros(3), ShapeError, "got () and (3,)",
       lambda: torch.tensor(1.0) @ torch.zeros(3)),
  Case("reshape to another numel", lambda: zeros(3, 4).reshape(5, 2), ShapeError, "(5, 2)",
       lambda: torch.zeros(3, 4).reshape(5, 2)),
  Case("reshape with -1 that does not divide", lambda: zeros(6).reshape(4, -1), ShapeError, "(4, -1)",
       lambda: torch.zeros(6).view(4, -1)),
  Case("reshape with two -1", lambda: zeros(6).reshape(-1, -1), ShapeError, "(-1, -1)",
       lambda: torch.zeros(6).reshape(-1, -1)),
  Case("reshape to a negative size", lambda: zeros(6).reshape(-2, 3), ShapeError, "(-2, 3)",
       lambda: torch.zeros(6).reshape(-2, 3)),
  Case("expand a non-1 dim", lambda: zeros(3).expand(4, 5), ShapeError, "(4, 5)",
       lambda: torch.zeros(3).expand(4, 5)),
  Case("expand to fewer dims", lambda: zeros(3, 4).expand(4), ShapeError, "(3, 4)",
       lambda: torch.zeros(3, 4).expand(4)),
  Case("permute with too few dims", lambda: zeros(3, 4).permute(0), ShapeError, "(0,)",
       lambda: torch.zeros(3, 4).permute(0)),
  Case("cat of unequal sizes", lambda: zeros(3, 4).cat(zeros(3, 5)), ShapeError, "(3, 5)",
       lambda: torch.cat([torch.zeros(3, 4), torch.zeros(3, 5)])),
  Case("stack of unequal shapes", lambda: zeros(3).stack(zeros(4)), ShapeError, "(4,)",
       lambda: torch.stack([torch.zeros(3), torch.zeros(4)])),
  Case("linear weight does not match", lambda: zeros(2, 3).linear(zeros(4, 5)), ShapeError, "(4, 5)",
       lambda: F.linear(torch.zeros(2, 3), torch.zeros(4, 5))),
  Case("conv2d channels", lambda: zeros(1, 3, 5, 5).conv2d(zeros(2, 4, 3, 3)), ShapeError, "3 channels",
       lambda: F.conv2d(torch.zeros(1, 3, 5, 5), torch.zeros(2, 4, 3, 3))),
  Case("layer_norm shape", lambda: zeros(2, 3).layer_norm((4,)), ShapeError, "(4,)",
       lambda: F.layer_norm(torch.zeros(2, 3), (4,))),
  Case("batch_norm running stats", lambda: zeros(2, 3).batch_norm(zeros(4), Tensor.ones(4)), ShapeError, "(4,)",
       lambda: F.batch_norm(torch.zeros(2, 3), torch.zeros(4), torch.ones(4))),
  Case("mse_loss shapes", lambda: zeros(3).mse_loss(zeros(4)), ShapeError, "(4,)",
       lambda: F.mse_loss(torch.zeros(3), torch.zeros(4))),
  Case("masked_fill mask", lambda: zeros(3).masked_fill(zeros(4).bool(), 1.0), ShapeError, "(4,)",
       lambda: torch.zeros(3).masked_fill(torch.zeros(4).bool(), 1.0)),
  Case("split sizes", lambda: zeros(5).split([2, 2]), ShapeError, "[2, 2]",
       lambda: torch.zeros(5).split([2, 2])),
  Case("pad of odd length", lambda: zeros(3).padded((1, 2, 3)), ShapeError, "(1, 2, 3)",
       lambda: F.pad(torch.zeros(3), (1, 2, 3))),
  Case("repeat with fewer counts", lambda: zeros(3, 4).repeat(2), ShapeError, "(2,)",
       lambda: torch.zeros(3, 4).repeat(2)),
  Case("unflatten sizes", lambda: zeros(3, 4).unflatten(1, (3, 3)), ShapeError, "(3, 3)",
       lambda: torch.zeros(3, 4).unflatten(1, (3, 3))),
  Case("gather index larger than self", lambda: zeros(3, 4).gather(1, Tensor.zeros(4, 4, dtype=dtypes.int64)),
       ShapeError, "(4, 4)", lambda: torch.zeros(3, 4).gather(1, torch.zeros(4, 4, dtype=torch.long))),
  Case("max_pool2d window larger than input", lambda: zeros(1, 1, 2, 2).max_pool2d(3), ShapeError, "(1, 1, 2, 2)",
       lambda: F.max_pool2d(torch.zeros(1, 1, 2, 2), 3)),
  Case("attention shapes", lambda: zeros(1, 2, 3).scaled_dot_product_attention(zeros(1, 2, 4), zeros(1, 2, 4)),
       ShapeError, "(1, 2, 4)",
       lambda: F.scaled_dot_product_attention(torch.zeros(1, 2, 3), torch.zeros(1, 2, 4), torch.zeros(1, 2, 4))),
  Case("cross_entropy target shape", lambda: zeros(2, 3).cross_entropy(ints(0, 1, 2)), ShapeError, "(3,)"),
  Case("item of several elements", lambda: zeros(3).item(), ShapeError, "(3,)", lambda: torch.zeros(3).item()),
  Case("interpolate to size 0", lambda: zeros(1, 1, 4, 4).interpolate(size=(0, 0)), ShapeError, "(0, 0)",
       lambda: F.interpolate(torch.zeros(1, 1, 4, 4), size=(0, 0))),
  Case("interpolate of an empty input", lambda: zeros(1, 1, 0, 4).interpolate(size=(2, 2)), ShapeError, "(0, 4)",
       lambda: F.interpolate(torch.zeros(1, 1, 0, 4), size=(2, 2))),
  Case("min of an empty tensor", lambda: zeros(0).min(), ShapeError, "min over an empty axis of shape (0,)",
       lambda: torch.zeros(0).min()),
  Case("max of an empty tensor", lambda: zeros(0).max(), ShapeError, "max over an empty axis of shape (0,)",
       lambda: torch.zeros(0).max()),
  Case("integer min of an empty tensor", lambda: Tensor.zeros(0, dtype=dtypes.int32).min(), ShapeError,
       "min over an empty axis", lambda: torch.zeros(0, dtype=torch.int32).min()),
  Case("min over an empty dim", lambda: zeros(0, 3).min(0), ShapeError, "min over an empty axis of shape (0, 3)"),
  Case("argmax of an empty axis", lambda: zeros(0).argmax(), ShapeError, "(0,)"),
]

DIMS = [
  Case("sum dim", lambda: zeros(3, 4).sum(5), IndexOutOfRange, "axis 5", lambda: torch.zeros(3, 4).sum(5)),
  Case("mean dim", lambda: zeros(3, 4).mean(-3), IndexOutOfRange, "axis -3", lambda: torch.zeros(3, 4).mean(-3)),
  Case("softmax dim", lambda: zeros(3, 4).softmax(2), IndexOutOfRange, "axis 2",
       lambda: torch.zeros(3, 4).softmax(2)),
  Case("unsqueeze dim", lambda: zeros(3).unsqueeze(3), IndexOutOfRange, "axis 3",
       lambda: torch.zeros(3).unsqueeze(3)),
  Case("transpose dim", lambda: zeros(3).transpose(0, 2), IndexOutOfRange, "axis 2",
       lambda: torch.zeros(3).transpose(0, 2)),
  Case("flatten dim", lambda: zeros(3, 4).flatten(3), IndexOutOfRange, "axis 3",
       lambda: torch.zeros(3, 4).flatten(3)),
  Case("flip dim", lambda: zeros(3, 4).flip(2), IndexOutOfRange, "axis 2", lambda: torch.zeros(3, 4).flip(2)),
  Case("squeeze dim", lambda: zeros(3, 4).squeeze(2), IndexOutOfRange, "axis 2",
       lambda: torch.zeros(3, 4).squeeze(2)),
  Case("cumsum dim", lambda: zeros(3, 4).cumsum(3), IndexOutOfRange, "axis 3", lambda: torch.zeros(3, 4).cumsum(3)),
  Case("argmax dim", lambda: zeros(3, 4).argmax(3), IndexOutOfRange, "axis 3", lambda: torch.zeros(3, 4).argmax(3)),
  Case("cat dim", lambda: zeros(3).cat(zeros(3), dim=1), IndexOutOfRange, "axis 1",
       lambda: torch.cat([torch.zeros(3), torch.zeros(3)], 1)),
  Case("gather dim", lambda: zeros(3).gather(1, ints(0)), IndexOutOfRange, "axis 1",
       lambda: torch.zeros(3).gather(1, t_ints(0))),
  Case("size dim", lambda: zeros(3, 4).size(3), IndexOutOfRange, "axis 3", lambda: torch.zeros(3, 4).size(3)),
  Case("narrow beyond the end", lambda: zeros(5).narrow(0, 3, 4), IndexOutOfRange, "length 4",
       lambda: torch.zeros(5).narrow(0, 3, 4)),
]

INDICES = [
  Case("int index", lambda: zeros(3)[5], IndexOutOfRange, "index 5 is out of bounds for dim 0 with size 3",
       lambda: torch.zeros(3)[5]),
  Case("negative int index", lambda: zeros(3)[-4], IndexOutOfRange, "index -4", lambda: torch.zeros(3)[-4]),
  Case("int index of dim 1", lambda: zeros(3, 4)[:, 4], IndexOutOfRange, "dim 1 with size 4",
       lambda: torch.zeros(3, 4)[:, 4]),
  Case("list index", lambda: zeros(3)[[0, 5]], IndexOutOfRange, "index 5", lambda: torch.zeros(3)[[0, 5]]),
  Case("tensor index", lambda: zeros(3)[ints(5)], IndexOutOfRange, "index 5 is out of bounds for dim 0 with size 3",
       lambda: torch.zeros(3)[t_ints(5)]),
  Case("negative tensor index", lambda: zeros(3)[ints(-4)], IndexOutOfRange, "index -4",
       lambda: torch.zeros(3)[t_ints(-4)]),
  Case("tensor index of dim 1", lambda: zeros(3, 4)[:, ints(4)], IndexOutOfRange, "index 4 is out of bounds for dim 1",
       lambda: torch.zeros(3, 4)[:, t_ints(4)]),
  Case("numpy array index", lambda: zeros(3)[np.array([7])], IndexOutOfRange, "index 7",
       lambda: torch.zeros(3)[np.array([7])]),
  Case("too many indices", lambda: zeros(3)[0, 0], IndexOutOfRange, "(3,)", lambda: torch.zeros(3)[0, 0]),
  Case("gather", lambda: ints(1, 2, 3).gather(0, ints(5)), IndexOutOfRange, "index 5 is out of bounds for dim 0 "
       "with size 3", lambda: t_ints(1, 2, 3).gather(0, t_ints(5))),
  Case("gather negative", lambda: ints(1, 2, 3).gather(0, ints(-1)), IndexOutOfRange, "index -1",
       lambda: t_ints(1, 2, 3).gather(0, t_ints(-1))),
  Case("take_along_dim", lambda: ints(1, 2, 3).take_along_dim(ints(3), 0), IndexOutOfRange, "index 3"),
  Case("take_along_dim negative", lambda: ints(1, 2, 3).take_along_dim(ints(-4), 0), IndexOutOfRange, "index -4"),
  Case("index_select", lambda: zeros(3).index_select(0, ints(5)), IndexOutOfRange, "index 5",
       lambda: torch.zeros(3).index_select(0, t_ints(5))),
  Case("index_select negative", lambda: zeros(3).index_select(0, ints(-1)), IndexOutOfRange, "index -1",
       lambda: torch.zeros(3).index_select(0, t_ints(-1))),
  Case("scatter", lambda: zeros(3).scatter(0, ints(5), 1.0), IndexOutOfRange, "index 5",
       lambda: torch.zeros(3).scatter(0, t_ints(5), 1.0)),
  Case("scatter negative", lambda: zeros(3).scatter(0, ints(-1), 1.0), IndexOutOfRange, "index -1",
       lambda: torch.zeros(3).scatter(0, t_ints(-1), 1.0)),
  Case("scatter_add", lambda: zeros(3).scatter_add(0, ints(3), Tensor([1.0])), IndexOutOfRange, "index 3",
       lambda: torch.zeros(3).scatter_add(0, t_ints(3), torch.ones(1))),
  Case("scatter_reduce", lambda: zeros(3).scatter_reduce(0, ints(4), Tensor([1.0]), "amax"), IndexOutOfRange,
       "index 4", lambda: torch.zeros(3).scatter_reduce(0, t_ints(4), torch.ones(1), "amax")),
  Case("embedding", lambda: ints(5).embedding(zeros(3, 2)), IndexOutOfRange, "index 5 is out of range for 3",
       lambda: F.embedding(t_ints(5), torch.zeros(3, 2))),
  Case("Embedding layer", lambda: nn.Embedding(3, 2)(ints(0, 3)), IndexOutOfRange, "index 3",
       lambda: torch.nn.Embedding(3, 2)(t_ints(0, 3))),
  Case("Embedding layer negative", lambda: nn.Embedding(3, 2)(ints(-1)), IndexOutOfRange, "index -1",
       lambda: torch.nn.Embedding(3, 2)(t_ints(-1))),
  Case("one_hot", lambda: ints(0, 5).one_hot(3), IndexOutOfRange, "class 5 is out of range for num_classes=3",
       lambda: F.one_hot(t_ints(0, 5), 3)),
  Case("one_hot negative", lambda: ints(-1).one_hot(3), IndexOutOfRange, "class -1",
       lambda: F.one_hot(t_ints(-1), 3)),
  # the max that infers the classes uploads the values: on a GPU the check is deferred to the read
  Case("one_hot negative, classes inferred", lambda: ints(-1, 2).one_hot().numpy(), IndexOutOfRange, "class -1",
       lambda: F.one_hot(t_ints(-1, 2))),
  Case("cross_entropy label", lambda: zeros(2, 3).cross_entropy(ints(0, 5)), IndexOutOfRange,
       "target 5 is out of bounds for 3 classes", lambda: F.cross_entropy(torch.zeros(2, 3), t_ints(0, 5))),
  Case("cross_entropy negative label", lambda: zeros(2, 3).cross_entropy(ints(0, -2)), IndexOutOfRange,
       "target -2", lambda: F.cross_entropy(torch.zeros(2, 3), t_ints(0, -2))),
  Case("nll_loss label", lambda: zeros(2, 3).nll_loss(ints(3, 0)), IndexOutOfRange, "target 3",
       lambda: F.nll_loss(torch.zeros(2, 3), t_ints(3, 0))),
  Case("sparse_categorical_crossentropy label", lambda: zeros(2, 3).sparse_categorical_crossentropy(ints(1, 3)),
       IndexOutOfRange, "target 3 is out of bounds for 3 classes"),
  Case("sparse_categorical_crossentropy label -2", lambda: zeros(2, 3).sparse_categorical_crossentropy(ints(1, -2)),
       IndexOutOfRange, "target -2"),
]

CREATION = [
  Case("zeros of a negative size", lambda: Tensor.zeros(-1, 3), ShapeError, "negative dimension -1: shape (-1, 3)",
       lambda: torch.zeros(-1, 3)),
  Case("ones of a negative size", lambda: Tensor.ones(2, -2), ShapeError, "-2", lambda: torch.ones(2, -2)),
  Case("full of a negative size", lambda: Tensor.full((-2,), 1.0), ShapeError, "-2",
       lambda: torch.full((-2,), 1.0)),
  Case("empty of a negative size", lambda: Tensor.empty(-5), ShapeError, "-5", lambda: torch.empty(-5)),
  Case("rand of a negative size", lambda: Tensor.rand(-1), ShapeError, "-1", lambda: torch.rand(-1)),
  Case("randn of a negative size", lambda: Tensor.randn(3, -1), ShapeError, "(3, -1)", lambda: torch.randn(3, -1)),
  Case("randint of a negative size", lambda: Tensor.randint(-1, high=5), ShapeError, "-1",
       lambda: torch.randint(5, (-1,))),
  Case("eye of a negative size", lambda: Tensor.eye(-1), ShapeError, "-1", lambda: torch.eye(-1)),
  Case("linspace of negative steps", lambda: Tensor.linspace(0, 1, -1), ArgumentError, "-1",
       lambda: torch.linspace(0, 1, -1)),
  Case("arange step zero", lambda: Tensor.arange(0, 5, 0), ArgumentError, "zero", lambda: torch.arange(0, 5, 0)),
  Case("randint empty range", lambda: Tensor.randint(3, low=5, high=2), ArgumentError, "low=5 high=2",
       lambda: torch.randint(5, 2, (3,))),
  Case("chunk into no chunks", lambda: zeros(3).chunk(0), ArgumentError, "got 0", lambda: torch.zeros(3).chunk(0)),
  Case("ragged nested list", lambda: Tensor([[1, 2], [3]]), ValueError, "ragged",
       lambda: torch.tensor([[1, 2], [3]])),
  Case("unknown device", lambda: Tensor.zeros(3, device="TPU"), ArgumentError, "'TPU'",
       lambda: torch.zeros(3, device="TPU")),
  Case("tensors on different devices", lambda: Tensor.zeros(3, device="CPU") + Tensor.zeros(3, device="SIM"),
       RuntimeError, "CPU and SIM"),
]

GRADIENTS = [
  Case("int ones that require grad", lambda: Tensor.ones(3, dtype=dtypes.int32, requires_grad=True), DTypeError,
       "dtypes.int32", lambda: torch.ones(3, dtype=torch.int32, requires_grad=True)),
  Case("int list that requires grad", lambda: Tensor([1, 2], requires_grad=True), DTypeError, "dtypes.int32",
       lambda: torch.tensor([1, 2], requires_grad=True)),
  Case("int arange that requires grad", lambda: Tensor.arange(5, requires_grad=True), DTypeError, "int32",
       lambda: torch.arange(5, requires_grad=True)),
  Case("randint that requires grad", lambda: Tensor.randint(3, requires_grad=True), DTypeError, "int32",
       lambda: torch.randint(10, (3,), requires_grad=True)),
  Case("bool zeros that require grad", lambda: Tensor.zeros(3, dtype="bool", requires_grad=True), DTypeError,
       "dtypes.bool", lambda: torch.zeros(3, dtype=torch.bool, requires_grad=True)),
  Case("requires_grad set on an int tensor", lambda: setattr(ints(1, 2), "requires_grad", True), DTypeError,
       "shape (2,)", lambda: setattr(t_ints(1, 2), "requires_grad", True)),
  Case("int full_like that requires grad", lambda: ints(1, 2).full_like(3, requires_grad=True), DTypeError, "int32",
       lambda: torch.full_like(t_ints(1, 2), 3, requires_grad=True)),
]

# the CPU's memory is the host's physical memory; GPU drivers report theirs where they can (AMD), checked at the
# device's first allocation otherwise
MEMORY = [
  Case("empty larger than memory", lambda: Tensor.empty(HUGE, device="CPU"), OutOfMemoryError, f"{4 * HUGE} bytes",
       lambda: torch.empty(HUGE)),
  Case("zeros larger than memory", lambda: Tensor.zeros(10**7, 10**7, device="CPU"), OutOfMemoryError,
       f"{4 * 10**14} bytes"),
  Case("rand larger than memory", lambda: Tensor.rand(HUGE, device="CPU"), OutOfMemoryError, f"{4 * HUGE} bytes"),
  Case("float64 arange larger than memory", lambda: Tensor.arange(HUGE, dtype=dtypes.float64, device="CPU"),
       OutOfMemoryError, f"{8 * HUGE} bytes"),
  Case("eye larger than memory", lambda: Tensor.eye(10**7, device="CPU"), OutOfMemoryError, f"{4 * 10**14} bytes"),
  Case("a realize larger than memory", lambda: Tensor.zeros(1, device="CPU").expand(10**12).contiguous().realize(),
       OutOfMemoryError, f"{4 * 10**12} bytes"),
]

DTYPES = [
  Case("misspelled dtype name", lambda: Tensor.zeros(3, dtype="flaot32"), DTypeError, "'flaot32'",
       lambda: torch.zeros(3, dtype="flaot32")),
  Case("dtype name of Tensor()", lambda: Tensor([1.0], dtype="x"), DTypeError, "'x'"),
  Case("dtype of cast", lambda: zeros(3).cast("nope"), DTypeError, "'nope'"),
  Case("dtype of sum", lambda: zeros(3).sum(dtype="bad"), DTypeError, "'bad'",
       lambda: torch.zeros(3).sum(dtype="bad")),
  Case("an int as dtype", lambda: Tensor.full((2,), 1, dtype=3), DTypeError, "dtype 3",
       lambda: torch.full((2,), 1, dtype=3)),
  Case("object as dtype", lambda: Tensor.arange(3, dtype=object), DTypeError, "object",
       lambda: torch.arange(3, dtype=object)),
  Case("complex dtype name", lambda: Tensor.rand(2, dtype="complex64"), DTypeError, "'complex64'"),
  Case("numpy complex dtype", lambda: Tensor.empty(2, dtype=np.complex64), DTypeError, "complex64"),
  Case("void dtype", lambda: Tensor.ones(2, dtype=dtypes.void), DTypeError, "dtypes.void"),
  Case("vector dtype", lambda: Tensor.ones(2, dtype=dtypes.float32.vec(4)), DTypeError, "vec(4)"),
  Case("dtype of a layer", lambda: nn.Linear(2, 3, dtype="bad"), DTypeError, "'bad'",
       lambda: torch.nn.Linear(2, 3, dtype="bad")),
  Case("dtype of softmax", lambda: zeros(3).softmax(dtype="bad"), DTypeError, "'bad'",
       lambda: torch.zeros(3).softmax(0, dtype="bad")),
  Case("dtype of randn_like", lambda: zeros(3).randn_like(dtype="bad"), DTypeError, "'bad'"),
]

CASES = SHAPES + DIMS + INDICES + CREATION + GRADIENTS + MEMORY + DTYPES


def test_the_catalogue_is_large_and_names_each_case_once() -> None:
  assert len(CASES) >= 80
  assert len({case.name for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_bad_input_raises_naming_the_value(case: Case) -> None:
  with pytest.raises(case.raises) as raised: case.bad()
  assert case.names in str(raised.value)


def _builtin_base(error: BaseException) -> type[BaseException]:
  """The builtin exception class torch's error is (torch.OutOfMemoryError is a RuntimeError, ...)."""
  return next(kind for kind in type(error).__mro__ if kind.__module__ == "builtins")


TORCH_CASES = [case for case in CASES if case.torch is not None]


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch warns before some of its errors
@pytest.mark.parametrize("case", TORCH_CASES, ids=[case.name for case in TORCH_CASES])
def test_error_is_what_torch_raises(case: Case) -> None:
  with pytest.raises(Exception) as torch_raised: case.torch()
  with pytest.raises(_builtin_base(torch_raised.value)): case.bad()


@pytest.mark.parametrize("kind", [ShapeError, ArgumentError, IndexOutOfRange, DTypeError, OutOfMemoryError])
def test_each_error_class_is_a_runtime_error(kind: type[Exception]) -> None:
  assert issubclass(kind, RuntimeError)


@pytest.mark.parametrize("given, expected", [
  (dtypes.float16, dtypes.float16), ("float32", dtypes.float32), ("float", dtypes.float32), ("half", dtypes.float16),
  ("long", dtypes.int64), ("bfloat16", dtypes.bfloat16), ("f8", dtypes.float64), (np.int16, dtypes.int16),
  (np.dtype("uint8"), dtypes.uint8), (float, dtypes.float64), (int, dtypes.int64), (bool, dtypes.bool),
])
def test_dtype_arguments_accept_rawgrad_and_numpy_dtypes_and_names(given: Any, expected: Any) -> None:
  assert Tensor.zeros(2, dtype=given).dtype == expected
  assert Tensor([1, 0]).cast(given).dtype == expected
  assert Tensor.ones(2, dtype=given).numpy().tolist() == [1, 1]


@pytest.mark.parametrize("make", [
  lambda: Tensor.zeros(2, 3, requires_grad=True), lambda: Tensor.ones(2, 3, requires_grad=True),
  lambda: Tensor.full((2, 3), 2.0, requires_grad=True), lambda: Tensor.empty(2, 3, requires_grad=True),
  lambda: Tensor.rand(2, 3, requires_grad=True), lambda: Tensor.randn(2, 3, requires_grad=True),
  lambda: Tensor.arange(6, dtype=dtypes.float32, requires_grad=True), lambda: Tensor.eye(2, 3, requires_grad=True),
  lambda: Tensor.linspace(0, 1, 6, requires_grad=True), lambda: zeros(2, 3).zeros_like(requires_grad=True),
  lambda: zeros(2, 3).ones_like(requires_grad=True), lambda: zeros(2, 3).full_like(5.0, requires_grad=True),
  lambda: zeros(2, 3).rand_like(requires_grad=True), lambda: zeros(2, 3).randn_like(requires_grad=True),
  lambda: Tensor([[1.0, 2, 3], [4, 5, 6]], requires_grad=True),
])
def test_every_creation_function_takes_requires_grad(make: Callable[[], Tensor]) -> None:
  parameter = make()
  assert parameter.requires_grad is True
  (parameter * 3).sum().backward()
  np.testing.assert_allclose(parameter.grad.numpy(), np.full(parameter.shape, 3.0))


def test_layers_take_dtype_names() -> None:
  assert nn.LayerNorm(3, dtype="float16").weight.dtype == dtypes.float16
  assert nn.BatchNorm(3, dtype=np.float64).running_mean.dtype == dtypes.float64


def test_an_optimizer_leaves_integer_tensors_out_of_its_parameters() -> None:
  weight, steps = Tensor([1.0, 2.0]), Tensor([0, 0])
  optimizer = nn.optim.SGD([weight, steps], lr=0.1)
  assert optimizer.params == [weight] and optimizer.buffers == [steps] and steps.requires_grad is False
