"""The ops issue 17 found missing, against torch: forward, backward, odd shapes, empty and 0-d inputs, broadcasting."""
import math

import numpy as np
import pytest

from rawgrad import Tensor, dtypes
from rawgrad.nn import init
from rawgrad.tools.compare_torch import Input
from tests.torch_parity.parity import both, check, values

torch = pytest.importorskip("torch")
F = torch.nn.functional

SHAPES = [(7,), (3, 5), (2, 1, 3), (), (0, 3)]


# *** elementwise ***

@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name, low, high", [("sinh", -5, 5), ("cosh", -5, 5), ("asinh", -30, 30), ("acosh", 1, 30),
                                             ("atanh", -0.99, 0.99)])
def test_hyperbolic(name, low, high, shape):
  check(both(f"{name}{shape}", lambda x: getattr(x, name)(), None, Input(shape, low, high)))


@pytest.mark.parametrize("name", ["sinh", "cosh", "asinh", "acosh", "atanh"])
def test_hyperbolic_special_values(name):
  special = values([0.0, -0.0, 1.0, -1.0, 1e-30, 89.0, -89.0, 1e30, math.inf, -math.inf, math.nan, 2.0, 1e-5])
  check(both(f"{name}_special", lambda x: getattr(x, name)(), None, special, backward=False))
  check(both(f"{name}_float64", lambda x: getattr(x, name)(), None, Input((9,), 1.01, 3.0, "float64"),
             tolerance=1e-14))


def test_copysign_broadcasts_and_keeps_signed_zero():
  check(both("copysign", lambda x, y: x.copysign(y), None, Input((3, 1, 4)), Input((5, 1))))
  check(both("copysign_zero", lambda x, y: x.copysign(y), None, values([0.0, 2.0, -3.0, 0.0]),
             values([-0.0, -1.0, 0.0, math.inf])))
  check(both("copysign_int", lambda x, y: x.copysign(y), None, Input((4,), -5, 5, "int64"), Input((4,))))


@pytest.mark.parametrize("rtol, atol, equal_nan", [(1e-5, 1e-8, False), (0.1, 0.0, True), (0.0, 0.0, False)])
def test_isclose_allclose(rtol, atol, equal_nan):
  a = values([1.0, math.inf, -math.inf, math.nan, 1.0, 1e10, 0.0, 1.05])
  b = values([1.0, math.inf, math.inf, math.nan, math.inf, 1.00001e10, 1e-9, 1.0])
  check(both("isclose", lambda x, y: x.isclose(y, rtol, atol, equal_nan), None, a, b, backward=False))
  x = np.array([1.0, 2.0, math.nan], np.float32)
  y = x + np.float32(1e-7)
  for other in (y, y + 1):
    assert Tensor(x).allclose(Tensor(other), equal_nan=True) == torch.allclose(torch.tensor(x), torch.tensor(other),
                                                                                equal_nan=True)
  assert Tensor([1, 2]).isclose(Tensor([1, 3])).tolist() == [True, False]


# *** sorting ***

@pytest.mark.parametrize("shape, dim", [((7,), 0), ((3, 5), 1), ((3, 5), 0), ((2, 3, 4), 1), ((), 0), ((0, 3), 1)])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_argsort(shape, dim, descending):
  check(both(f"sort{shape}", lambda x: x.sort(dim, descending=descending), lambda x: x.sort(dim=dim,
             descending=descending, stable=True), Input(shape)))
  check(both(f"argsort{shape}", lambda x: x.argsort(dim, descending=descending),
             lambda x: x.argsort(dim=dim, descending=descending, stable=True), Input(shape)))


@pytest.mark.parametrize("descending", [False, True])
def test_sort_is_stable_and_puts_nan_where_torch_does(descending):
  ties = values([[3.0, 1.0, math.nan, 1.0, 3.0, -math.inf, math.nan, 1.0], [0.0, -0.0, 0.0, 2.0, 2.0, 2.0, 0.0, 1.0]])
  check(both("sort_ties", lambda x: x.sort(1, descending=descending, stable=True),
             lambda x: x.sort(dim=1, descending=descending, stable=True), ties, backward=False))
  ints = Input((4, 9), -3, 3, "int32")
  check(both("sort_ints", lambda x: x.sort(0, descending=descending, stable=True),
             lambda x: x.sort(dim=0, descending=descending, stable=True), ints))


@pytest.mark.parametrize("k, dim, largest", [(3, 1, True), (1, 0, False), (5, -1, True), (0, 1, True)])
def test_topk(k, dim, largest):
  check(both(f"topk{k}", lambda x: x.topk(k, dim, largest), None, Input((3, 5))))


def test_topk_checks_k():
  with pytest.raises(ValueError, match="k=6"):
    Tensor.ones(2, 5).topk(6)


# *** scans and reductions ***

@pytest.mark.parametrize("shape, dim", [((9,), 0), ((3, 5), 1), ((3, 5), 0), ((), 0), ((2, 0), 1), ((0, 3), 1)])
def test_logcumsumexp(shape, dim):
  check(both(f"logcumsumexp{shape}", lambda x: x.logcumsumexp(dim), None, Input(shape, -5, 5)))


def test_logcumsumexp_keeps_tiny_prefixes():
  spread = values([[-1000.0, 0.0, -math.inf, 50.0, -200.0], [-math.inf, -math.inf, 1.0, 1e-3, 88.0]])
  check(both("logcumsumexp_spread", lambda x: x.logcumsumexp(1), None, spread))


@pytest.mark.parametrize("shape, dim", [((3, 5), 1), ((4,), 0), ((2, 3, 4), 0)])
def test_softmin(shape, dim):
  check(both("softmin", lambda x: x.softmin(dim), lambda x: F.softmin(x, dim), Input(shape)))


# *** shapes ***

@pytest.mark.parametrize("offset", [0, 1, 2, -1, -3, 6])
def test_diag_and_diagonal(offset):
  check(both("diag_vector", lambda x: x.diag(offset), None, Input((4,))))
  check(both("diag_matrix", lambda x: x.diag(offset), None, Input((3, 5))))
  check(both("diagonal", lambda x: x.diagonal(offset, 2, 0), None, Input((3, 2, 4))))
  check(both("diagonal_negative_dims", lambda x: x.diagonal(offset, -1, -2), None, Input((2, 5, 3))))
  check(both("diag_empty", lambda x: x.diag(offset), None, Input((0,))))


@pytest.mark.parametrize("dim, size, step", [(0, 2, 1), (1, 3, 2), (-1, 5, 1), (1, 1, 3), (0, 0, 1)])
def test_unfold_tensor_form(dim, size, step):
  check(both("unfold", lambda x: x.unfold(dim, size, step), None, Input((4, 5))))
  check(both("unfold_0d", lambda x: x.unfold(0, 1, 1), None, Input(())))


@pytest.mark.parametrize("kernel, dilation, padding, stride", [(2, 1, 0, 1), ((2, 3), (1, 2), (1, 0), (2, 1)),
                                                                (3, 1, 1, 3)])
def test_unfold_im2col_form(kernel, dilation, padding, stride):
  check(both("im2col", lambda x: x.im2col(kernel, dilation, padding, stride),
             lambda x: F.unfold(x, kernel, dilation, padding, stride), Input((2, 3, 5, 6))))
  check(both("im2col_unbatched", lambda x: x.im2col(kernel, dilation, padding, stride),
             lambda x: F.unfold(x, kernel, dilation, padding, stride), Input((3, 5, 6))))


@pytest.mark.parametrize("indexing", ["ij", "xy"])
@pytest.mark.parametrize("shapes", [((3,), (4,)), ((2,), (1,), (3,)), ((3,),), ((), (2,)), ((0,), (2,))])
def test_meshgrid(indexing, shapes):
  check(both(f"meshgrid{shapes}", lambda *xs: Tensor.meshgrid(*xs, indexing=indexing),
             lambda *xs: torch.meshgrid(*xs, indexing=indexing), *(Input(shape) for shape in shapes)))


@pytest.mark.parametrize("shape, mask", [((3, 5), (5,)), ((3, 1), (3, 4)), ((2, 3), (2, 3)), ((), ()), ((0, 3), (3,))])
def test_masked_select(shape, mask):
  check(both("masked_select", lambda x, m: x.masked_select(m), None, Input(shape), Input(mask, dtype="bool")))


def test_masked_select_of_nothing():
  check(both("masked_select_none", lambda x, m: x.masked_select(m), None, Input((3, 4)),
             values(np.zeros(4, bool), "bool")))


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4), (), (0, 3)])
def test_nonzero(shape):
  check(both("nonzero", lambda x: x.nonzero(), None, Input(shape, -1, 2, "int32"), backward=False))
  check(both("nonzero_tuple", lambda x: x.nonzero(as_tuple=True), None, Input(shape, -1, 2, "int32"),
             backward=False))


def test_nonzero_of_floats_and_bools():
  check(both("nonzero_float", lambda x: x.nonzero(), None, values([[0.0, -0.0, 1.5], [math.nan, 0.0, -2.0]]),
             backward=False))
  check(both("nonzero_bool", lambda x: x.nonzero(), None, Input((4, 3), dtype="bool"), backward=False))
  check(both("nonzero_0d_zero", lambda x: x.nonzero(), None, values(0.0), backward=False))


@pytest.mark.parametrize("shift", [1, -4, 13, 0])
def test_roll_without_dims_flattens(shift):
  check(both(f"roll{shift}", lambda x: x.roll(shift), None, Input((3, 4))))
  check(both("roll_0d", lambda x: x.roll(shift), None, Input(())))


# *** dtypes ***

@pytest.mark.parametrize("method, dtype", [("half", torch.float16), ("bfloat16", torch.bfloat16),
                                           ("double", torch.float64), ("long", torch.int64),
                                           ("short", torch.int16), ("char", torch.int8), ("byte", torch.uint8),
                                           ("float", torch.float32), ("int", torch.int32), ("bool", torch.bool)])
def test_dtype_conversions(method, dtype):
  x = np.array([[-3.7, 0.25, 2.5, 100.9]], np.float32)
  ours, theirs = getattr(Tensor(x), method)(), getattr(torch.tensor(x), method)()
  assert ours.dtype == dtypes.from_name(str(dtype).removeprefix("torch."))
  expected = theirs.float().numpy() if dtype == torch.bfloat16 else theirs.numpy()
  np.testing.assert_array_equal(ours.numpy(), expected)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_float_reductions_and_matmul_accumulate_in_float32(dtype):
  torch_dtype = getattr(torch, dtype)
  rng = np.random.default_rng(1)
  # 3000 values of about 0.1: half-float accumulation would stall far below the sum
  long_row = rng.uniform(0.05, 0.15, (2, 3000)).astype(np.float32)
  ours, theirs = Tensor(long_row).cast(dtypes.from_name(dtype)), torch.tensor(long_row).to(torch_dtype)
  for ours_value, theirs_value in ((ours.sum(1), theirs.sum(1)), (ours.mean(1), theirs.mean(1)),
                                   (ours.sum(), theirs.sum())):
    assert ours_value.dtype == dtypes.from_name(dtype)
    np.testing.assert_allclose(ours_value.numpy().astype(np.float32), theirs_value.float().numpy(), rtol=2 ** -8)
  a, b = rng.standard_normal((5, 700)).astype(np.float32), rng.standard_normal((700, 3)).astype(np.float32)
  product = Tensor(a).cast(dtypes.from_name(dtype)) @ Tensor(b).cast(dtypes.from_name(dtype))
  expected = (torch.tensor(a).to(torch_dtype) @ torch.tensor(b).to(torch_dtype)).float().numpy()
  assert product.dtype == dtypes.from_name(dtype)
  np.testing.assert_allclose(product.numpy().astype(np.float32), expected, rtol=2 ** -7, atol=0.1)


@pytest.mark.parametrize("source", ["float32", "int32", "float64", "int16", "uint8", "float16"])
@pytest.mark.parametrize("target", ["float32", "int32", "int64", "int16", "uint8", "float16", "bfloat16", "float64"])
def test_view_dtype_bitcasts(source, target):
  rng = np.random.default_rng(2)
  x = (rng.standard_normal((3, 8)) * 100).astype(source)
  ours = Tensor(x).view(dtypes.from_name(target))
  theirs = torch.tensor(x).view(getattr(torch, target))
  expected = theirs.float().numpy() if target == "bfloat16" else theirs.numpy()
  assert ours.shape == tuple(theirs.shape)
  np.testing.assert_array_equal(ours.numpy(), expected)
  np.testing.assert_array_equal(Tensor(x).bitcast(dtypes.from_name(target)).bitcast(dtypes.from_name(source)).numpy(),
                                x)


# *** convolution, pooling, attention ***

@pytest.mark.parametrize("stride, padding, dilation, groups", [(1, 0, 1, 1), (2, 1, 1, 2),
                                                               ((1, 2, 1), (0, 1, 2), 2, 1)])
def test_conv3d(stride, padding, dilation, groups):
  check(both("conv3d", lambda x, w, b: x.conv3d(w, b, stride, padding, dilation, groups),
             lambda x, w, b: F.conv3d(x, w, b, stride, padding, dilation, groups),
             Input((2, 4, 5, 6, 7)), Input((2, 4 // groups, 3, 2, 3)), Input((2,)), tolerance=1e-4))
  check(both("conv3d_unbatched", lambda x, w: x.conv3d(w, None, stride, padding, dilation, groups),
             lambda x, w: F.conv3d(x, w, None, stride, padding, dilation, groups),
             Input((4, 5, 6, 7)), Input((2, 4 // groups, 3, 2, 3)), tolerance=1e-4))


@pytest.mark.parametrize("stride, padding, output_padding", [(1, 0, 0), (2, 1, 1), ((2, 1, 3), (0, 1, 1), (1, 0, 2))])
def test_conv_transpose3d(stride, padding, output_padding):
  check(both("conv_transpose3d", lambda x, w, b: x.conv_transpose3d(w, b, stride, padding, output_padding),
             lambda x, w, b: F.conv_transpose3d(x, w, b, stride, padding, output_padding),
             Input((1, 3, 3, 4, 2)), Input((3, 2, 3, 2, 3)), Input((2,)), tolerance=1e-4))


@pytest.mark.parametrize("kernel, stride, padding, ceil_mode", [(2, None, 0, False), ((3, 2, 2), 2, 1, True),
                                                                (3, (1, 2, 3), (1, 0, 1), False)])
def test_pool3d(kernel, stride, padding, ceil_mode):
  check(both("max_pool3d", lambda x: x.max_pool3d(kernel, stride, padding, ceil_mode=ceil_mode),
             lambda x: F.max_pool3d(x, kernel, stride, padding, ceil_mode=ceil_mode), Input((2, 2, 5, 6, 7))))
  check(both("avg_pool3d", lambda x: x.avg_pool3d(kernel, stride, padding, ceil_mode),
             lambda x: F.avg_pool3d(x, kernel, stride, padding, ceil_mode), Input((2, 5, 6, 7))))
  check(both("avg_pool3d_no_pad_count", lambda x: x.avg_pool3d(kernel, stride, padding, ceil_mode, False),
             lambda x: F.avg_pool3d(x, kernel, stride, padding, ceil_mode, False), Input((1, 2, 5, 6, 7))))


@pytest.mark.parametrize("kernel, stride, padding, dilation", [(2, None, 0, 1), (3, 2, 1, 1), ((2, 3), (1, 2), 1, 2)])
def test_max_pool2d_indices_and_unpool(kernel, stride, padding, dilation):
  check(both("max_pool2d_indices", lambda x: x.max_pool2d(kernel, stride, padding, dilation, return_indices=True),
             lambda x: F.max_pool2d(x, kernel, stride, padding, dilation, return_indices=True), Input((2, 3, 7, 6))))
  if dilation == 1:
    check(both("max_unpool2d",
               lambda x: Tensor.max_unpool2d(*x.max_pool2d(kernel, stride, padding, return_indices=True), kernel,
                                             stride, padding, (7, 6)),
               lambda x: F.max_unpool2d(*F.max_pool2d(x, kernel, stride, padding, return_indices=True), kernel, stride,
                                        padding, (7, 6)), Input((2, 3, 7, 6))))


def test_max_unpool2d_with_output_size():
  check(both("max_unpool2d_size", lambda x: Tensor.max_unpool2d(*x.max_pool2d(2, return_indices=True), 2,
                                                                output_size=(5, 7)),
             lambda x: F.max_unpool2d(*F.max_pool2d(x, 2, return_indices=True), 2, output_size=(5, 7)),
             Input((1, 2, 5, 7))))


@pytest.mark.parametrize("heads, key_heads, causal", [(4, 2, False), (6, 1, True), (3, 3, False)])
def test_attention_with_grouped_query_heads(heads, key_heads, causal):
  check(both("attention_gqa", lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=causal, enable_gqa=True),
             lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True),
             Input((2, heads, 3, 8)), Input((2, key_heads, 5, 8)), Input((2, key_heads, 5, 4)), tolerance=1e-4))


# *** normalize ***

@pytest.mark.parametrize("p, dim", [(2.0, 1), (1.0, 0), (3.0, -1), (math.inf, 1), (0.5, 0)])
def test_normalize(p, dim):
  check(both("normalize", lambda x: x.normalize(p, dim), lambda x: F.normalize(x, p, dim), Input((3, 4, 2), 0.1, 2)))


def test_normalize_of_a_zero_vector_has_torchs_gradient():
  zeros = values([[0.0, 0.0, 0.0], [1.0, -2.0, 0.5]])
  check(both("normalize_zero", lambda x: x.normalize(), lambda x: F.normalize(x), zeros))


# *** initializers ***

@pytest.mark.parametrize("name, kwargs", [("kaiming_uniform_", {}), ("kaiming_normal_", {}),
                                          ("kaiming_uniform_", {"a": 0.2, "mode": "fan_out"}),
                                          ("kaiming_normal_", {"nonlinearity": "relu", "mode": "fan_out"}),
                                          ("xavier_uniform_", {}), ("xavier_normal_", {"gain": 2.0})])
def test_initializers_match_torchs_distribution(name, kwargs):
  shape = (96, 64, 3)
  ours = getattr(init, name)(Tensor.zeros(*shape).contiguous(), **kwargs).numpy()
  theirs = getattr(torch.nn.init, name)(torch.empty(*shape), **kwargs).numpy()
  assert abs(ours.mean()) < 0.03 * theirs.std()
  assert abs(ours.std() / theirs.std() - 1) < 0.03
  if "uniform" in name: assert abs(np.abs(ours).max() / np.abs(theirs).max() - 1) < 0.01


@pytest.mark.parametrize("nonlinearity, param", [("linear", None), ("tanh", None), ("relu", None), ("selu", None),
                                                 ("leaky_relu", None), ("leaky_relu", 0.3), ("conv2d", None)])
def test_calculate_gain(nonlinearity, param):
  assert init.calculate_gain(nonlinearity, param) == pytest.approx(torch.nn.init.calculate_gain(nonlinearity, param))
