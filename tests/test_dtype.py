"""Value tests for rawgrad.dtype: promotion, sum accumulation, truncation, limits and conversions."""
import math
import re
import struct
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from rawgrad.dtype import SCALAR_DTYPES, DType, PtrDType, dtypes, least_upper_dtype, sum_acc_dtype, truncate

# The promotion of every ordered pair of SCALAR_DTYPES, written out from torch 2.13's `torch.promote_types`.
# torch refuses to promote uint16, uint32 or uint64 with a different integer or with bool; those entries are numpy
# 2.4's `np.promote_types` and end in `# numpy: torch refuses`. torch answers every pair involving bfloat16, so no
# entry needed a rule that neither library defines.
PROMOTION: dict[tuple[DType, DType], DType] = {
  (dtypes.bool, dtypes.bool): dtypes.bool,
  (dtypes.bool, dtypes.int8): dtypes.int8,
  (dtypes.bool, dtypes.uint8): dtypes.uint8,
  (dtypes.bool, dtypes.int16): dtypes.int16,
  (dtypes.bool, dtypes.uint16): dtypes.uint16,  # numpy: torch refuses
  (dtypes.bool, dtypes.int32): dtypes.int32,
  (dtypes.bool, dtypes.uint32): dtypes.uint32,  # numpy: torch refuses
  (dtypes.bool, dtypes.int64): dtypes.int64,
  (dtypes.bool, dtypes.uint64): dtypes.uint64,  # numpy: torch refuses
  (dtypes.bool, dtypes.float16): dtypes.float16,
  (dtypes.bool, dtypes.bfloat16): dtypes.bfloat16,
  (dtypes.bool, dtypes.float32): dtypes.float32,
  (dtypes.bool, dtypes.float64): dtypes.float64,

  (dtypes.int8, dtypes.bool): dtypes.int8,
  (dtypes.int8, dtypes.int8): dtypes.int8,
  (dtypes.int8, dtypes.uint8): dtypes.int16,
  (dtypes.int8, dtypes.int16): dtypes.int16,
  (dtypes.int8, dtypes.uint16): dtypes.int32,  # numpy: torch refuses
  (dtypes.int8, dtypes.int32): dtypes.int32,
  (dtypes.int8, dtypes.uint32): dtypes.int64,  # numpy: torch refuses
  (dtypes.int8, dtypes.int64): dtypes.int64,
  (dtypes.int8, dtypes.uint64): dtypes.float64,  # numpy: torch refuses
  (dtypes.int8, dtypes.float16): dtypes.float16,
  (dtypes.int8, dtypes.bfloat16): dtypes.bfloat16,
  (dtypes.int8, dtypes.float32): dtypes.float32,
  (dtypes.int8, dtypes.float64): dtypes.float64,

  (dtypes.uint8, dtypes.bool): dtypes.uint8,
  (dtypes.uint8, dtypes.int8): dtypes.int16,
  (dtypes.uint8, dtypes.uint8): dtypes.uint8,
  (dtypes.uint8, dtypes.int16): dtypes.int16,
  (dtypes.uint8, dtypes.uint16): dtypes.uint16,  # numpy: torch refuses
  (dtypes.uint8, dtypes.int32): dtypes.int32,
  (dtypes.uint8, dtypes.uint32): dtypes.uint32,  # numpy: torch refuses
  (dtypes.uint8, dtypes.int64): dtypes.int64,
  (dtypes.uint8, dtypes.uint64): dtypes.uint64,  # numpy: torch refuses
  (dtypes.uint8, dtypes.float16): dtypes.float16,
  (dtypes.uint8, dtypes.bfloat16): dtypes.bfloat16,
  (dtypes.uint8, dtypes.float32): dtypes.float32,
  (dtypes.uint8, dtypes.float64): dtypes.float64,

  (dtypes.int16, dtypes.bool): dtypes.int16,
  (dtypes.int16, dtypes.int8): dtypes.int16,
  (dtypes.int16, dtypes.uint8): dtypes.int16,
  (dtypes.int16, dtypes.int16): dtypes.int16,
  (dtypes.int16, dtypes.uint16): dtypes.int32,  # numpy: torch refuses
  (dtypes.int16, dtypes.int32): dtypes.int32,
  (dtypes.int16, dtypes.uint32): dtypes.int64,  # numpy: torch refuses
  (dtypes.int16, dtypes.int64): dtypes.int64,
  (dtypes.int16, dtypes.uint64): dtypes.float64,  # numpy: torch refuses
  (dtypes.int16, dtypes.float16): dtypes.float16,
  (dtypes.int16, dtypes.bfloat16): dtypes.bfloat16,
  (dtypes.int16, dtypes.float32): dtypes.float32,
  (dtypes.int16, dtypes.float64): dtypes.float64,

  (dtypes.uint16, dtypes.bool): dtypes.uint16,  # numpy: torch refuses
  (dtypes.uint16, dtypes.int8): dtypes.int32,  # numpy: torch refuses
  (dtypes.uint16, dtypes.uint8): dtypes.uint16,  # numpy: torch refuses
  (dtypes.uint16, dtypes.int16): dtypes.int32,  # numpy: torch refuses
  (dtypes.uint16, dtypes.uint16): dtypes.uint16,
  (dtypes.uint16, dtypes.int32): dtypes.int32,  # numpy: torch refuses
  (dtypes.uint16, dtypes.uint32): dtypes.uint32,  # numpy: torch refuses
  (dtypes.uint16, dtypes.int64): dtypes.int64,  # numpy: torch refuses
  (dtypes.uint16, dtypes.uint64): dtypes.uint64,  # numpy: torch refuses
  (dtypes.uint16, dtypes.float16): dtypes.float16,
  (dtypes.uint16, dtypes.bfloat16): dtypes.bfloat16,
  (dtypes.uint16, dtypes.float32): dtypes.float32,
  (dtypes.uint16, dtypes.float64): dtypes.float64,

  (dtypes.int32, dtypes.bool): dtypes.int32,
  (dtypes.int32, dtypes.int8): dtypes.int32,
  (dtypes.int32, dtypes.uint8): dtypes.int32,
  (dtypes.int32, dtypes.int16): dtypes.int32,
  (dtypes.int32, dtypes.uint16): dtypes.int32,  # numpy: torch refuses
  (dtypes.int32, dtypes.int32): dtypes.int32,
  (dtypes.int32, dtypes.uint32): dtypes.int64,  # numpy: torch refuses
  (dtypes.int32, dtypes.int64): dtypes.int64,
  (dtypes.int32, dtypes.uint64): dtypes.float64,  # numpy: torch refuses
  (dtypes.int32, dtypes.float16): dtypes.float16,
  (dtypes.int32, dtypes.bfloat16): dtypes.bfloat16,
  (dtypes.int32, dtypes.float32): dtypes.float32,
  (dtypes.int32, dtypes.float64): dtypes.float64,

  (dtypes.uint32, dtypes.bool): dtypes.uint32,  # numpy: torch refuses
  (dtypes.uint32, dtypes.int8): dtypes.int64,  # numpy: torch refuses
  (dtypes.uint32, dtypes.uint8): dtypes.uint32,  # numpy: torch refuses
  (dtypes.uint32, dtypes.int16): dtypes.int64,  # numpy: torch refuses
  (dtypes.uint32, dtypes.uint16): dtypes.uint32,  # numpy: torch refuses
  (dtypes.uint32, dtypes.int32): dtypes.int64,  # numpy: torch refuses
  (dtypes.uint32, dtypes.uint32): dtypes.uint32,
  (dtypes.uint32, dtypes.int64): dtypes.int64,  # numpy: torch refuses
  (dtypes.uint32, dtypes.uint64): dtypes.uint64,  # numpy: torch refuses
  (dtypes.uint32, dtypes.float16): dtypes.float16,
  (dtypes.uint32, dtypes.bfloat16): dtypes.bfloat16,
  (dtypes.uint32, dtypes.float32): dtypes.float32,
  (dtypes.uint32, dtypes.float64): dtypes.float64,

  (dtypes.int64, dtypes.bool): dtypes.int64,
  (dtypes.int64, dtypes.int8): dtypes.int64,
  (dtypes.int64, dtypes.uint8): dtypes.int64,
  (dtypes.int64, dtypes.int16): dtypes.int64,
  (dtypes.int64, dtypes.uint16): dtypes.int64,  # numpy: torch refuses
  (dtypes.int64, dtypes.int32): dtypes.int64,
  (dtypes.int64, dtypes.uint32): dtypes.int64,  # numpy: torch refuses
  (dtypes.int64, dtypes.int64): dtypes.int64,
  (dtypes.int64, dtypes.uint64): dtypes.float64,  # numpy: torch refuses
  (dtypes.int64, dtypes.float16): dtypes.float16,
  (dtypes.int64, dtypes.bfloat16): dtypes.bfloat16,
  (dtypes.int64, dtypes.float32): dtypes.float32,
  (dtypes.int64, dtypes.float64): dtypes.float64,

  (dtypes.uint64, dtypes.bool): dtypes.uint64,  # numpy: torch refuses
  (dtypes.uint64, dtypes.int8): dtypes.float64,  # numpy: torch refuses
  (dtypes.uint64, dtypes.uint8): dtypes.uint64,  # numpy: torch refuses
  (dtypes.uint64, dtypes.int16): dtypes.float64,  # numpy: torch refuses
  (dtypes.uint64, dtypes.uint16): dtypes.uint64,  # numpy: torch refuses
  (dtypes.uint64, dtypes.int32): dtypes.float64,  # numpy: torch refuses
  (dtypes.uint64, dtypes.uint32): dtypes.uint64,  # numpy: torch refuses
  (dtypes.uint64, dtypes.int64): dtypes.float64,  # numpy: torch refuses
  (dtypes.uint64, dtypes.uint64): dtypes.uint64,
  (dtypes.uint64, dtypes.float16): dtypes.float16,
  (dtypes.uint64, dtypes.bfloat16): dtypes.bfloat16,
  (dtypes.uint64, dtypes.float32): dtypes.float32,
  (dtypes.uint64, dtypes.float64): dtypes.float64,

  (dtypes.float16, dtypes.bool): dtypes.float16,
  (dtypes.float16, dtypes.int8): dtypes.float16,
  (dtypes.float16, dtypes.uint8): dtypes.float16,
  (dtypes.float16, dtypes.int16): dtypes.float16,
  (dtypes.float16, dtypes.uint16): dtypes.float16,
  (dtypes.float16, dtypes.int32): dtypes.float16,
  (dtypes.float16, dtypes.uint32): dtypes.float16,
  (dtypes.float16, dtypes.int64): dtypes.float16,
  (dtypes.float16, dtypes.uint64): dtypes.float16,
  (dtypes.float16, dtypes.float16): dtypes.float16,
  (dtypes.float16, dtypes.bfloat16): dtypes.float32,
  (dtypes.float16, dtypes.float32): dtypes.float32,
  (dtypes.float16, dtypes.float64): dtypes.float64,

  (dtypes.bfloat16, dtypes.bool): dtypes.bfloat16,
  (dtypes.bfloat16, dtypes.int8): dtypes.bfloat16,
  (dtypes.bfloat16, dtypes.uint8): dtypes.bfloat16,
  (dtypes.bfloat16, dtypes.int16): dtypes.bfloat16,
  (dtypes.bfloat16, dtypes.uint16): dtypes.bfloat16,
  (dtypes.bfloat16, dtypes.int32): dtypes.bfloat16,
  (dtypes.bfloat16, dtypes.uint32): dtypes.bfloat16,
  (dtypes.bfloat16, dtypes.int64): dtypes.bfloat16,
  (dtypes.bfloat16, dtypes.uint64): dtypes.bfloat16,
  (dtypes.bfloat16, dtypes.float16): dtypes.float32,
  (dtypes.bfloat16, dtypes.bfloat16): dtypes.bfloat16,
  (dtypes.bfloat16, dtypes.float32): dtypes.float32,
  (dtypes.bfloat16, dtypes.float64): dtypes.float64,

  (dtypes.float32, dtypes.bool): dtypes.float32,
  (dtypes.float32, dtypes.int8): dtypes.float32,
  (dtypes.float32, dtypes.uint8): dtypes.float32,
  (dtypes.float32, dtypes.int16): dtypes.float32,
  (dtypes.float32, dtypes.uint16): dtypes.float32,
  (dtypes.float32, dtypes.int32): dtypes.float32,
  (dtypes.float32, dtypes.uint32): dtypes.float32,
  (dtypes.float32, dtypes.int64): dtypes.float32,
  (dtypes.float32, dtypes.uint64): dtypes.float32,
  (dtypes.float32, dtypes.float16): dtypes.float32,
  (dtypes.float32, dtypes.bfloat16): dtypes.float32,
  (dtypes.float32, dtypes.float32): dtypes.float32,
  (dtypes.float32, dtypes.float64): dtypes.float64,

  (dtypes.float64, dtypes.bool): dtypes.float64,
  (dtypes.float64, dtypes.int8): dtypes.float64,
  (dtypes.float64, dtypes.uint8): dtypes.float64,
  (dtypes.float64, dtypes.int16): dtypes.float64,
  (dtypes.float64, dtypes.uint16): dtypes.float64,
  (dtypes.float64, dtypes.int32): dtypes.float64,
  (dtypes.float64, dtypes.uint32): dtypes.float64,
  (dtypes.float64, dtypes.int64): dtypes.float64,
  (dtypes.float64, dtypes.uint64): dtypes.float64,
  (dtypes.float64, dtypes.float16): dtypes.float64,
  (dtypes.float64, dtypes.bfloat16): dtypes.float64,
  (dtypes.float64, dtypes.float32): dtypes.float64,
  (dtypes.float64, dtypes.float64): dtypes.float64,
}

# `torch.ones(2, dtype=dt).sum().dtype` in torch 2.13.
SUM_ACC: dict[DType, DType] = {
  dtypes.bool: dtypes.int64,
  dtypes.int8: dtypes.int64,
  dtypes.uint8: dtypes.int64,
  dtypes.int16: dtypes.int64,
  dtypes.uint16: dtypes.int64,
  dtypes.int32: dtypes.int64,
  dtypes.uint32: dtypes.int64,
  dtypes.int64: dtypes.int64,
  dtypes.uint64: dtypes.int64,
  dtypes.float16: dtypes.float16,
  dtypes.bfloat16: dtypes.bfloat16,
  dtypes.float32: dtypes.float32,
  dtypes.float64: dtypes.float64,
}

ITEMSIZE: dict[DType, int] = {
  dtypes.void: 0, dtypes.bool: 1, dtypes.int8: 1, dtypes.uint8: 1, dtypes.int16: 2, dtypes.uint16: 2,
  dtypes.int32: 4, dtypes.uint32: 4, dtypes.int64: 8, dtypes.uint64: 8, dtypes.float16: 2, dtypes.bfloat16: 2,
  dtypes.float32: 4, dtypes.float64: 8, dtypes.index: 8,
}

INT_DTYPES = [dt for dt in SCALAR_DTYPES if dtypes.is_int(dt)]
FLOAT_DTYPES = [dt for dt in SCALAR_DTYPES if dtypes.is_float(dt)]
NUMPY_DTYPES = [dt for dt in SCALAR_DTYPES if dt != dtypes.bfloat16]
PAIRS = list(PROMOTION)


def _name(dt: DType) -> str:
  return dt.name


def _same_float(a: float, b: float) -> bool:
  # compares bit patterns so -0.0 differs from 0.0 and inf equals inf
  return struct.pack("<d", a) == struct.pack("<d", b)


def _f32_bits(x: float) -> int:
  return struct.unpack("<I", struct.pack("<f", x))[0]


def _f32_from_bits(bits: int) -> float:
  return struct.unpack("<f", struct.pack("<I", bits))[0]


# ---- promotion

def test_promotion_table_covers_every_ordered_pair() -> None:
  assert len(SCALAR_DTYPES) == 13
  assert set(PROMOTION) == {(a, b) for a in SCALAR_DTYPES for b in SCALAR_DTYPES}


@pytest.mark.parametrize("a,b", PAIRS, ids=[f"{a.name}-{b.name}" for a, b in PAIRS])
def test_promotion_matches_table(a: DType, b: DType) -> None:
  assert least_upper_dtype(a, b) == PROMOTION[(a, b)]


@pytest.mark.parametrize("a,b", PAIRS, ids=[f"{a.name}-{b.name}" for a, b in PAIRS])
def test_promotion_is_symmetric(a: DType, b: DType) -> None:
  assert least_upper_dtype(a, b) == least_upper_dtype(b, a)
  # a typo in one half of the written table would otherwise go unnoticed
  assert PROMOTION[(a, b)] == PROMOTION[(b, a)]


def test_least_upper_dtype_folds_left_to_right() -> None:
  assert least_upper_dtype(dtypes.uint16) == dtypes.uint16
  assert least_upper_dtype(dtypes.int8, dtypes.uint8, dtypes.int32) == dtypes.int32
  # the pairwise rule is not associative, so the documented left-to-right order is observable
  assert least_upper_dtype(dtypes.uint64, dtypes.int8, dtypes.float16) == dtypes.float64
  assert least_upper_dtype(dtypes.int8, dtypes.float16, dtypes.uint64) == dtypes.float16


def test_least_upper_dtype_errors() -> None:
  with pytest.raises(ValueError, match="at least one"):
    least_upper_dtype()
  assert least_upper_dtype(dtypes.index, dtypes.index) == dtypes.index
  with pytest.raises(TypeError, match=r"dtypes\.index and dtypes\.int32"):
    least_upper_dtype(dtypes.index, dtypes.int32)
  with pytest.raises(TypeError, match=r"dtypes\.float32 and dtypes\.index"):
    least_upper_dtype(dtypes.float32, dtypes.index)


# ---- sum accumulation

def test_sum_table_covers_every_dtype() -> None:
  assert set(SUM_ACC) == set(SCALAR_DTYPES)


@pytest.mark.parametrize("dt", SCALAR_DTYPES, ids=_name)
def test_sum_acc_dtype_matches_table(dt: DType) -> None:
  assert sum_acc_dtype(dt) == SUM_ACC[dt]


# ---- sizes, kinds, names

@pytest.mark.parametrize("dt", list(ITEMSIZE), ids=_name)
def test_itemsize(dt: DType) -> None:
  assert dt.itemsize == ITEMSIZE[dt]
  assert dt.nbytes == ITEMSIZE[dt]
  # the struct format is what truncate packs through, so it has to be exactly itemsize wide
  if dt.fmt is not None:
    assert struct.calcsize("<" + dt.fmt) == dt.itemsize


def test_aliases() -> None:
  assert (dtypes.half, dtypes.float, dtypes.double) == (dtypes.float16, dtypes.float32, dtypes.float64)
  assert (dtypes.char, dtypes.short, dtypes.int, dtypes.long) == (dtypes.int8, dtypes.int16, dtypes.int32,
                                                                   dtypes.int64)
  assert (dtypes.uchar, dtypes.ushort, dtypes.uint, dtypes.ulong) == (dtypes.uint8, dtypes.uint16, dtypes.uint32,
                                                                      dtypes.uint64)
  assert (dtypes.default_float, dtypes.default_int) == (dtypes.float32, dtypes.int32)


def test_kind_predicates() -> None:
  assert [dt.name for dt in SCALAR_DTYPES if dtypes.is_float(dt)] == ["float16", "bfloat16", "float32", "float64"]
  assert [dt.name for dt in SCALAR_DTYPES if dtypes.is_unsigned(dt)] == ["uint8", "uint16", "uint32", "uint64"]
  assert [dt.name for dt in SCALAR_DTYPES if dtypes.is_bool(dt)] == ["bool"]
  assert len(INT_DTYPES) == 8 and not dtypes.is_int(dtypes.bool) and dtypes.is_int(dtypes.index)
  ptr = dtypes.float32.ptr()
  assert not any(pred(ptr) for pred in (dtypes.is_float, dtypes.is_int, dtypes.is_unsigned, dtypes.is_bool))


@pytest.mark.parametrize("dt", [*SCALAR_DTYPES, dtypes.index], ids=_name)
def test_from_name(dt: DType) -> None:
  assert dtypes.from_name(dt.name) is dt


def test_from_name_unknown() -> None:
  with pytest.raises(ValueError, match="'float8'"):
    dtypes.from_name("float8")


# ---- truncate: ints and bool

@pytest.mark.parametrize("value,dt,expected", [
  (200, dtypes.int8, -56), (-129, dtypes.int8, 127), (127, dtypes.int8, 127),
  (-1, dtypes.uint8, 255), (256, dtypes.uint8, 0),
  (40000, dtypes.int16, -25536), (-1, dtypes.uint16, 65535),
  (2**31, dtypes.int32, -2**31), (2**32 + 5, dtypes.uint32, 5), (-1, dtypes.uint32, 2**32 - 1),
  (2**63, dtypes.int64, -2**63), (-1, dtypes.uint64, 2**64 - 1), (2**64 + 7, dtypes.uint64, 7),
  (True, dtypes.int32, 1),
  # floats go toward zero before wrapping, like a C cast
  (3.9, dtypes.int8, 3), (-3.9, dtypes.int8, -3), (255.5, dtypes.int8, -1),
  # index is unbounded in the algebra
  (2**100, dtypes.index, 2**100), (-2**100, dtypes.index, -2**100),
])
def test_truncate_int_values(value: int | float, dt: DType, expected: int) -> None:
  got = truncate(value, dt)
  assert got == expected and type(got) is int


@given(st.integers(min_value=-2**80, max_value=2**80), st.sampled_from(INT_DTYPES))
def test_truncate_int_wraps_modulo_the_width(value: int, dt: DType) -> None:
  got = truncate(value, dt)
  assert dtypes.min(dt) <= got <= dtypes.max(dt)
  assert (got - value) % (1 << (8 * dt.itemsize)) == 0


@pytest.mark.parametrize("value,expected", [(0, False), (2, True), (0.0, False), (-0.5, True), (math.nan, True)])
def test_truncate_bool(value: int | float, expected: bool) -> None:
  assert truncate(value, dtypes.bool) is expected


# ---- truncate: float16 and float32 against numpy

@given(st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([dtypes.float16, dtypes.float32]))
@example(65504.0, dtypes.float16)              # largest float16
@example(65519.99, dtypes.float16)             # just under the overflow threshold, rounds down to 65504
@example(65520.0, dtypes.float16)              # halfway to 2**16, rounds to even which overflows to inf
@example(-1e300, dtypes.float16)
@example(2.0**-25, dtypes.float16)             # half the smallest subnormal: ties to even gives 0
@example(2.0**-25 + 2.0**-40, dtypes.float16)  # past the tie, gives the smallest subnormal
@example(3.4028234663852886e38, dtypes.float32)
@example(3.4028235677973366e38, dtypes.float32)
@example(3.402823669209385e38, dtypes.float32)  # halfway past the largest float32: overflows
@example(1e300, dtypes.float32)
@example(2.0**-150, dtypes.float32)
@example(1.5 * 2.0**-149, dtypes.float32)
@example(-0.0, dtypes.float32)
def test_truncate_float_rounds_like_numpy(value: float, dt: DType) -> None:
  with np.errstate(over="ignore"):  # overflowing to inf is part of what is compared
    expected = float(dtypes.to_numpy(dt).type(value))
  assert _same_float(truncate(value, dt), expected)


@pytest.mark.parametrize("dt", FLOAT_DTYPES, ids=_name)
def test_truncate_float_special_values(dt: DType) -> None:
  assert truncate(math.inf, dt) == math.inf and truncate(-math.inf, dt) == -math.inf
  assert math.isnan(truncate(math.nan, dt))
  assert _same_float(truncate(-0.0, dt), -0.0)
  assert truncate(1, dt) == 1.0 and type(truncate(1, dt)) is float


def test_truncate_float_overflow() -> None:
  assert truncate(1e300, dtypes.float32) == math.inf and truncate(-1e300, dtypes.float32) == -math.inf
  assert truncate(65520.0, dtypes.float16) == math.inf and truncate(65519.0, dtypes.float16) == 65504.0
  assert truncate(1e300, dtypes.float64) == 1e300


@given(st.floats(allow_nan=False))
def test_truncate_float64_is_identity(value: float) -> None:
  assert _same_float(truncate(value, dtypes.float64), value)


# ---- truncate: bfloat16

@pytest.mark.parametrize("value,expected", [
  (1.0, 1.0),
  (1 + 2**-8, 1.0),                         # 0x3F808000: a tie, 0x3F80 is even so it stays
  (1 + 3 * 2**-8, 1 + 2**-6),               # 0x3F818000: a tie, 0x3F81 is odd so it goes up to 0x3F82
  (1 + 2**-8 + 2**-20, 1 + 2**-7),          # 0x3F808008: past the tie, up to 0x3F81
  (0.1, 0.10009765625),                     # 0x3DCCCCCD: low half 0xCCCD is over half, up to 0x3DCD
  (-0.1, -0.10009765625),
  (1 / 3, 0.333984375),                     # 0x3EAAAAAB -> 0x3EAB
  (65504.0, 65536.0),                       # 0x477FE000 -> 0x4780
  (-2.5, -2.5),                             # 0xC0200000 is already exact
  ((2 - 2**-7) * 2.0**127, (2 - 2**-7) * 2.0**127),  # 0x7F7F0000, the largest bfloat16
  (3.4028234663852886e38, math.inf),        # 0x7F7FFFFF, the largest float32, rounds up past 0x7F7F
  (2.0**-133, 2.0**-133),                   # 0x00010000, a bfloat16 subnormal
  (2.0**-134, 0.0),                         # 0x00008000: a tie between 0 and 0x0001, goes to even 0
  (-0.0, -0.0),
  # rounds to float32 first (1 + 2**-8, a tie) and then to bfloat16, as torch does for float64 input; rounding
  # the float64 straight to bfloat16 would give 1 + 2**-7
  (1 + 2**-8 + 2**-30, 1.0),
])
def test_truncate_bfloat16_values(value: float, expected: float) -> None:
  assert _same_float(truncate(value, dtypes.bfloat16), expected)


@given(st.floats(width=32, allow_nan=False, allow_infinity=False))
def test_truncate_bfloat16_is_nearest_ties_to_even(value: float) -> None:
  got = truncate(value, dtypes.bfloat16)
  assert math.copysign(1.0, got) == math.copysign(1.0, value)
  bits = _f32_bits(abs(value))
  down = bits & 0xFFFF0000
  up = down + 0x10000

  def exact(b: int) -> Fraction:
    # 0x7F800000 is inf; rounding treats it as 2**128, where an unbounded exponent would continue
    return Fraction(2**128) if b == 0x7F800000 else Fraction(_f32_from_bits(b))

  below, above = Fraction(abs(value)) - exact(down), exact(up) - Fraction(abs(value))
  if below != above:
    want = down if below < above else up
  else:
    want = down if (down >> 16) % 2 == 0 else up
  assert _f32_bits(abs(got)) == want


# ---- limits

@pytest.mark.parametrize("dt", [*INT_DTYPES, dtypes.index], ids=_name)
def test_int_limits_match_numpy(dt: DType) -> None:
  info = np.iinfo(dtypes.to_numpy(dt))
  assert (dtypes.min(dt), dtypes.max(dt)) == (info.min, info.max)


def test_bool_and_float_limits() -> None:
  assert (dtypes.min(dtypes.bool), dtypes.max(dtypes.bool)) == (False, True)
  for dt in FLOAT_DTYPES:
    assert (dtypes.min(dt), dtypes.max(dt)) == (-math.inf, math.inf)


@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.float32, dtypes.float64], ids=_name)
def test_finfo_matches_numpy(dt: DType) -> None:
  info = np.finfo(dt.name)
  assert dtypes.finfo(dt) == (info.nexp, info.nmant)


def test_finfo_bfloat16_and_errors() -> None:
  assert dtypes.finfo(dtypes.bfloat16) == (8, 7)
  with pytest.raises(ValueError, match=r"dtypes\.int32"):
    dtypes.finfo(dtypes.int32)


# ---- from_py

@pytest.mark.parametrize("value,expected", [
  (True, dtypes.bool), (False, dtypes.bool),
  # rawgrad's default int is int32 (torch's is int64); ints that do not fit in int32 still get int64
  (0, dtypes.int32), (2**31 - 1, dtypes.int32), (-2**31, dtypes.int32),
  (2**31, dtypes.int64), (-2**31 - 1, dtypes.int64),
  (1.5, dtypes.float32), (math.inf, dtypes.float32), (1e300, dtypes.float32),
  ([], dtypes.float32), ([True, False], dtypes.bool), ([1, True], dtypes.int32), ([1, 2.0], dtypes.float32),
  ((1, 2), dtypes.int32), ([[1, 2], [3, 2**40]], dtypes.int64), ([[True], [1.0]], dtypes.float32),
  ([[[False]]], dtypes.bool),
], ids=repr)
def test_from_py(value: object, expected: DType) -> None:
  assert dtypes.from_py(value) == expected


@pytest.mark.parametrize("value,name", [("abc", "str"), (None, "NoneType"), (1j, "complex"), ([1, "a"], "str")])
def test_from_py_rejects(value: object, name: str) -> None:
  with pytest.raises(TypeError, match=name):
    dtypes.from_py(value)


# ---- numpy conversion

@pytest.mark.parametrize("dt", NUMPY_DTYPES, ids=_name)
def test_numpy_round_trip(dt: DType) -> None:
  np_dtype = dtypes.to_numpy(dt)
  assert np_dtype == np.dtype(dt.name) and np_dtype.itemsize == dt.itemsize
  assert dtypes.from_numpy(np_dtype) is dt
  assert dtypes.from_numpy(np_dtype.type) is dt
  assert dtypes.from_numpy(dt.name) is dt
  assert dtypes.from_numpy(np.zeros(2, dtype=np_dtype).dtype) is dt


def test_to_numpy_storage_types() -> None:
  # numpy has no bfloat16, so its bits travel as uint16 and come back as uint16, not bfloat16
  assert dtypes.to_numpy(dtypes.bfloat16) == np.dtype(np.uint16)
  assert dtypes.from_numpy(dtypes.to_numpy(dtypes.bfloat16)) == dtypes.uint16
  assert dtypes.to_numpy(dtypes.index) == np.dtype(np.int64)


@pytest.mark.parametrize("np_dtype,name", [(np.complex64, "complex64"), (np.complex128, "complex128"),
                                           ("U3", "<U3"), (object, "object")])
def test_from_numpy_rejects(np_dtype: object, name: str) -> None:
  with pytest.raises(TypeError, match=f"numpy dtype {name} has no rawgrad dtype"):
    dtypes.from_numpy(np_dtype)


@pytest.mark.parametrize("dt", [dtypes.float32.vec(4), dtypes.void], ids=repr)
def test_to_numpy_rejects(dt: DType) -> None:
  with pytest.raises(TypeError, match=f"{re.escape(repr(dt))} has no numpy equivalent"):
    dtypes.to_numpy(dt)


# ---- vec and ptr

def test_vec() -> None:
  v = dtypes.float32.vec(4)
  assert (v.name, v.count, v.itemsize, v.nbytes, v.scalar) == ("float32", 4, 4, 16, dtypes.float32)
  assert v == dtypes.float32.vec(4) and hash(v) == hash(dtypes.float32.vec(4))
  assert v != dtypes.float32.vec(2) and v != dtypes.float32 and v != dtypes.int32.vec(4)
  assert repr(v) == "dtypes.float32.vec(4)"
  assert dtypes.float32.vec(1) is dtypes.float32
  assert dtypes.float32.scalar is dtypes.float32


@pytest.mark.parametrize("count", [0, -1, -8])
def test_vec_rejects_non_positive_count(count: int) -> None:
  with pytest.raises(ValueError, match=f"vector length must be positive, got {count}"):
    dtypes.int8.vec(count)


def test_vec_of_vec_rejected() -> None:
  with pytest.raises(ValueError, match=r"dtypes\.int8\.vec\(4\)"):
    dtypes.int8.vec(4).vec(2)


def test_ptr() -> None:
  p = dtypes.float32.ptr()
  assert isinstance(p, PtrDType)
  assert (p.base, p.size, p.local) == (dtypes.float32, -1, False)
  assert (p.itemsize, p.count, p.kind, p.scalar) == (8, 1, "ptr", p)
  assert repr(p) == "dtypes.float32.ptr(-1)"
  lp = dtypes.half.vec(4).ptr(16, local=True)
  assert (lp.base, lp.size, lp.local) == (dtypes.float16.vec(4), 16, True)
  assert repr(lp) == "dtypes.float16.vec(4).ptr(16, local=True)"
  assert p == dtypes.float32.ptr(-1) and hash(p) == hash(dtypes.float32.ptr(-1))
  assert p != dtypes.float32.ptr(-1, local=True) and p != dtypes.float32.ptr(8) and p != dtypes.float64.ptr()


def test_one_dtype_object_per_dtype() -> None:
  import pickle
  from rawgrad.dtype import DType
  assert DType("float32", 4, "float", "f") is dtypes.float32
  assert dtypes.float32.vec(4) is dtypes.float32.vec(4) and dtypes.float32.vec(4).scalar is dtypes.float32
  assert pickle.loads(pickle.dumps(dtypes.half.vec(2))) is dtypes.half.vec(2)
  assert dtypes.float32 != dtypes.int32 and len({dtypes.float32, DType("float32", 4, "float", "f")}) == 1
