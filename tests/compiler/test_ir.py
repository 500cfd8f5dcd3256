"""The IR: hash-consing (and freeing), toposort, shapes of movement ops, value bounds, printing, exact ALU values."""
import gc
import hashlib
import math
import pickle
import random
import weakref
from typing import Any, Callable

import pytest

from rawgrad.compiler.ir import Ops, UOp, UOpMetaClass, as_index, cast_value, exec_alu
from rawgrad.compiler.symbolic import Variable, evaluate, simplify
from rawgrad.dtype import dtypes

INF = math.inf


def _index(value: int) -> UOp:
  return UOp.const(dtypes.index, value)


def _same_size(got: Any, want: Any) -> bool:
  """Sizes are ints or expressions; equal expressions simplify to the same node."""
  if isinstance(got, int) and isinstance(want, int): return got == want
  return simplify(as_index(got)) is simplify(as_index(want))


def _assert_shape(node: UOp, want: tuple) -> None:
  assert len(node.shape) == len(want), f"{node.shape} != {want}"
  for got_size, want_size in zip(node.shape, want):
    assert _same_size(got_size, want_size), f"{node.shape} != {want}"


# *** hash-consing ***

def test_equal_nodes_are_the_same_object_whatever_the_route() -> None:
  a, b = Variable("hc_a", 0, 9), Variable("hc_b", 0, 9)
  built = UOp(Ops.ADD, dtypes.index, (a, b))
  assert a + b is built
  assert a.alu(Ops.ADD, b) is built
  assert UOp(Ops.ADD, dtypes.index, [a, b]) is built  # a list of sources is the same as the tuple
  assert (a + 7).replace(src=(a, b)) is built
  assert pickle.loads(pickle.dumps(built)) is built
  assert UOp.const(dtypes.index, 3) is UOp(Ops.CONST, dtypes.index, arg=3)
  assert Variable("hc_a", 0, 9) is a
  # sources in another order, another dtype, another arg: other nodes
  assert b + a is not built
  assert UOp(Ops.ADD, dtypes.int64, (a, b)) is not built
  assert Variable("hc_a", 0, 10) is not a


def test_constants_keep_the_sign_of_zero_and_nan_equals_itself() -> None:
  zero, negative_zero = UOp.const(dtypes.float32, 0.0), UOp.const(dtypes.float32, -0.0)
  assert zero is not negative_zero
  assert math.copysign(1.0, negative_zero.arg) == -1.0 and math.copysign(1.0, zero.arg) == 1.0
  # nan != nan, but two nan constants are one node (two different nan objects here)
  assert UOp.const(dtypes.float32, float("nan")) is UOp.const(dtypes.float32, math.inf - math.inf)
  # inside tuple args too
  assert UOp(Ops.NOOP, arg=(1, 0.0)) is not UOp(Ops.NOOP, arg=(1, -0.0))
  assert UOp(Ops.NOOP, arg=(1, math.nan)) is UOp(Ops.NOOP, arg=(1, float("nan")))


def test_args_equal_in_python_but_of_other_types_are_other_nodes() -> None:
  # True == 1 == 1.0 in Python; as args they mean different things
  as_int = UOp(Ops.CONST, dtypes.int32, arg=1)
  as_bool = UOp(Ops.CONST, dtypes.int32, arg=True)
  as_float = UOp(Ops.CONST, dtypes.int32, arg=1.0)
  assert len({id(as_int), id(as_bool), id(as_float)}) == 3
  assert type(as_int.arg) is int and type(as_bool.arg) is bool and type(as_float.arg) is float
  assert UOp.const(dtypes.int32, 1) is as_int and UOp.const(dtypes.bool, 1) is UOp.const(dtypes.bool, True)


def test_tags_distinguish_nodes() -> None:
  a = Variable("tag_a", 0, 3)
  plain, tagged = a + 1, (a + 1).replace(tag="mine")
  assert tagged is not plain and tagged.tag == "mine"
  assert (a + 1).replace(tag="mine") is tagged
  assert (a + 1).replace(tag="other") is not tagged
  assert tagged.replace(tag=None) is plain


def test_unhashable_arg_is_a_clear_type_error() -> None:
  with pytest.raises(TypeError, match=r"UOp arg must be hashable, got list \[1, 2\] for Ops.NOOP"):
    UOp(Ops.NOOP, dtypes.void, (), [1, 2])
  with pytest.raises(TypeError, match="must be hashable, got dict"):
    UOp(Ops.CONST, dtypes.int32, arg={"a": 1})


def _big_graph(prefix: str) -> UOp:
  """A few thousand nodes with sharing, printed and bounded so the cached properties (which make cycles) are set."""
  ranges = [UOp.range(Variable(f"{prefix}_n{i}", 1, 64), i) for i in range(6)]
  terms = []
  for i in range(400):
    index = sum((r * ((i + j) % 7 + 1) for j, r in enumerate(ranges)), _index(i))
    terms.append((index // (i % 5 + 2)) % 13 < i % 11)
  root = UOp.sink(*terms)
  assert root.vmin is None and len(root.toposort) > 3000
  repr(terms[0]), terms[0].render(), simplify(terms[1])
  return root


def test_nodes_nobody_references_are_freed() -> None:
  gc.collect()
  size_before = len(UOpMetaClass.cache)
  root = _big_graph("leak")
  created = len(UOpMetaClass.cache) - size_before
  assert created > 3000
  some_variable = next(node for node in root.toposort if node.op is Ops.DEFINE_VAR)
  watch_root, watch_leaf = weakref.ref(root), weakref.ref(some_variable)
  del root, some_variable
  gc.collect()
  assert watch_root() is None and watch_leaf() is None
  assert len(UOpMetaClass.cache) <= size_before
  live = [reference() for reference in UOpMetaClass.cache.values()]
  assert not any(node is not None and node.op is Ops.DEFINE_VAR and node.arg[0].startswith("leak_") for node in live)


def test_a_chain_of_cached_toposorts_is_freed_by_one_collection() -> None:
  # each cached toposort contains its own node (a cycle); the cache must not pin the next cycle down the chain,
  # or every gc pass would free only one layer
  gc.collect()
  size_before = len(UOpMetaClass.cache)
  node = Variable("layers", 0, 1)
  for i in range(300):
    node = node * 2 + i
    assert len(node.toposort) > 0
  watch = weakref.ref(node.src[0])
  del node
  gc.collect()
  assert watch() is None
  assert len(UOpMetaClass.cache) <= size_before


def test_churn_never_returns_a_node_with_other_sources() -> None:
  # freed nodes' memory is reused at once: a new source may sit where a freed one was
  for i in range(3000):
    left, right = Variable(f"churn_{i % 13}", 0, i % 5), UOp.const(dtypes.index, i % 17)
    node = UOp(Ops.ADD, dtypes.index, (left, right))
    assert node.src[0] is left and node.src[1] is right
    del left, right, node


def test_freed_node_is_rebuilt_as_a_new_equal_node() -> None:
  node = Variable("rebuilt", 0, 5) * 3
  watch = weakref.ref(node)
  del node
  gc.collect()
  assert watch() is None
  # the freed node's key must not hand back anything stale
  again = Variable("rebuilt", 0, 5) * 3
  assert again.op is Ops.MUL and again.src[1].arg == 3 and again.src[0].arg == ("rebuilt", 0, 5)
  assert Variable("rebuilt", 0, 5) * 3 is again


# *** toposort ***

def _check_toposort(root: UOp) -> list[UOp]:
  order = list(root.toposort)
  position = {node: i for i, node in enumerate(order)}
  assert len(position) == len(order), "a node appears twice"
  for node in order:
    for source in node.src: assert position[source] < position[node], f"{source.op} after its user {node.op}"
  assert order[-1] is root
  return order


def test_toposort_puts_sources_first_and_every_node_once() -> None:
  a, b = Variable("ts_a", 0, 9), Variable("ts_b", 0, 9)
  shared = a * b
  root = UOp.sink(shared + a, shared * 2, shared)
  order = _check_toposort(root)
  expected = {a, b, shared, shared + a, _index(2), shared * 2, root}
  assert set(order) == expected and len(order) == len(expected)
  assert order.count(shared) == 1
  # left sources first: the first leaf reached is the first source of the first source
  assert order[:3] == [a, b, shared]
  assert list(root.walk()) == order


def test_toposort_of_a_diamond_lattice_is_linear() -> None:
  # each level uses the previous one twice: 2**40 paths, 2*40+1 nodes
  node = Variable("lattice", 0, 1)
  for _ in range(40): node = node + node
  order = _check_toposort(node)
  assert len(order) == 41


def test_toposort_of_a_deep_chain_does_not_recurse() -> None:
  node = Variable("chain", 0, 1)
  for i in range(5000): node = node + i
  assert len(_check_toposort(node)) == 5000 + 5001


def _reference_order(root: UOp) -> list[UOp]:
  """Sources first, left to right, each node once: the recursive walk toposort's order is defined by."""
  order: dict[UOp, None] = {}
  def visit(node: UOp) -> None:
    if node in order: return
    for source in node.src: visit(source)
    order[node] = None
  visit(root)
  return list(order)


@pytest.mark.parametrize("seed", range(20))
def test_toposort_over_sorted_subgraphs_keeps_the_order_of_a_full_walk(seed: int) -> None:
  """A node whose sources (or their sources) have their toposort already merges those orders instead of walking them:
  the order must be the same as a walk over the whole graph, whichever subgraphs were sorted before."""
  rng = random.Random(seed)
  nodes = [Variable(f"order{seed}_{i}", 0, 9) for i in range(4)]
  for _ in range(60):
    picks = [rng.choice(nodes) for _ in range(rng.choice((1, 2, 3)))]
    nodes.append(UOp(Ops.SINK, dtypes.void, tuple(picks), arg=len(nodes)))
  for node in rng.sample(nodes, 15): _ = node.toposort
  root = UOp.sink(*rng.sample(nodes, 6))
  assert list(root.toposort) == _reference_order(root)


def _reference_digest(node: UOp) -> bytes:
  fingerprint = hashlib.blake2b(repr((node.op.value, node.dtype, node.arg, node.tag)).encode(), digest_size=12)
  for source in node.src: fingerprint.update(_reference_digest(source))
  return fingerprint.digest()


def test_digest_fingerprints_the_whole_subgraph() -> None:
  a, b = Variable("dg_a", 0, 9), Variable("dg_b", 0, 9)
  shared = a * b
  lower = shared + a
  assert lower.digest == _reference_digest(lower)  # digested before its user: the user does not walk into it
  root = UOp.sink(lower, shared * 2, shared)
  assert root.digest == _reference_digest(root)
  assert (a + b).digest != (b + a).digest and Variable("dg_c", 0, 9).digest != Variable("dg_c", 0, 8).digest


def test_digest_of_a_deep_chain_does_not_recurse() -> None:
  node = Variable("dg_chain", 0, 1)
  for i in range(5000): node = node + i
  assert len(node.digest) == 12 and node.digest != node.src[0].digest


def _on(device: str, value: float = 1.0) -> UOp:
  return UOp.const(dtypes.float32, value, (UOp(Ops.DEVICE, arg=device),))


def _add(a: UOp, b: UOp) -> UOp:
  return UOp(Ops.ADD, dtypes.float32, (a, b))


def test_device_is_the_first_device_in_toposort_order() -> None:
  mixed = UOp.sink(_add(_on("CPU:1"), _on("CPU:2")), _on("CPU:3"))
  assert mixed.device == "CPU:1"
  assert mixed.device == next(node.arg for node in mixed.toposort if node.op is Ops.DEVICE)
  # a source that already knows its device answers for its subgraph
  known = _add(_on("CPU:2", 2.0), _on("CPU:4"))
  assert known.device == "CPU:2" and _add(known, _on("CPU:5")).device == "CPU:2"
  with pytest.raises(ValueError, match="SINK has no device"): _ = UOp.sink(Variable("no_device", 0, 1)).device


def test_device_of_a_deep_chain_does_not_recurse() -> None:
  node = _on("CPU:7")
  for i in range(5000): node = _add(node, _on("CPU:8", float(i)))
  assert node.device == "CPU:7"


# *** shapes ***

def _buffer(size: int = 24, dtype: Any = dtypes.float32) -> UOp:
  return UOp(Ops.BUFFER, dtype, arg=size)


def test_shapes_of_movement_ops() -> None:
  x = _buffer().reshape((2, 3, 4))
  assert _buffer().shape == (24,) and x.shape == (2, 3, 4) and x.ndim == 3
  assert x.permute((2, 0, 1)).shape == (4, 2, 3)
  assert x.shrink(((0, 1), (1, 3), (0, 4))).shape == (1, 2, 4)
  assert x.shrink(((0, 1), (1, 3), (0, 4))).expand((5, 2, 4)).shape == (5, 2, 4)
  assert x.pad(((1, 0), (0, 2), (3, 3))).shape == (3, 5, 10)
  assert x.flip((0, 2)).shape == (2, 3, 4) and x.flip((2, 0, 2)).arg == (0, 2)
  assert x.reshape((6, 4)).reshape((24,)).shape == (24,)
  assert x.reshape((2, 1, 3, 1, 4)).shape == (2, 1, 3, 1, 4)
  # elementwise ops and casts keep the shape; a WHERE takes it from its values
  assert (x + x).shape == (2, 3, 4) and x.cast(dtypes.float16).shape == (2, 3, 4)
  condition = x < x
  assert condition.dtype == dtypes.bool and condition.shape == (2, 3, 4)
  assert condition.where(x, x).shape == (2, 3, 4)
  # sizes are index constants among the sources, ints in the shape
  assert all(s.op is Ops.CONST and s.dtype == dtypes.index for s in x.src[1:])
  assert all(type(size) is int for size in x.pad(((1, 0), (0, 2), (3, 3))).shape)


def test_movement_ops_that_change_nothing_return_the_node() -> None:
  x = _buffer().reshape((2, 3, 4))
  assert x.reshape((2, 3, 4)) is x
  assert x.expand((2, 3, 4)) is x
  assert x.permute((0, 1, 2)) is x
  assert x.pad(((0, 0), (0, 0), (0, 0))) is x
  assert x.shrink(((0, 2), (0, 3), (0, 4))) is x
  assert x.flip(()) is x


def test_reduce_keeps_reduced_axes_as_one() -> None:
  x = _buffer().reshape((2, 3, 4))
  assert UOp(Ops.REDUCE_AXIS, dtypes.float32, (x,), (Ops.ADD, (0, 2))).shape == (1, 3, 1)
  assert UOp(Ops.REDUCE_AXIS, dtypes.float32, (x,), (Ops.MAX, (1,))).shape == (2, 1, 4)
  assert UOp(Ops.REDUCE_AXIS, dtypes.float32, (x,), (Ops.ADD, ())).shape == (2, 3, 4)


def test_symbolic_sizes() -> None:
  n, m = Variable("shape_n", 1, 10), Variable("shape_m", 2, 8)
  row = _buffer(4).reshape((1, 4))
  x = row.expand((n, 4))
  assert x.shape[0] is n and x.shape[1] == 4
  # the variable is an ordinary source, so a graph walk finds it
  assert n in x.toposort and n in x.src
  assert x.reshape((n, 2, 2)).shape[0] is n
  _assert_shape(x.pad(((1, 2), (0, m))), (n + 3, m + 4))
  _assert_shape(x.shrink(((1, n), (0, 4))), (n - 1, 4))
  _assert_shape(x.shrink(((0, 2), (m - 2, m))), (2, 2))
  _assert_shape(x.pad(((0, m), (0, 0))).shrink(((m, n + m), (1, 3))), (n, 2))
  assert x.permute((1, 0)).shape == (4, n) and x.flip((0,)).shape == (n, 4)
  _assert_shape(UOp(Ops.REDUCE_AXIS, dtypes.float32, (x.pad(((0, m), (0, 0))),), (Ops.ADD, (1,))), (n + m, 1))
  # a shape's expression has the values the sizes have
  padded = x.pad(((1, 2), (0, m))).shape
  assert evaluate(padded[0], {n: 7}) == 10 and evaluate(padded[1], {m: 5}) == 9


def test_shape_of_kernel_level_nodes_is_none() -> None:
  r = UOp.range(4, 0)
  assert r.shape is None and (r * 2).shape is None and UOp.const(dtypes.int32, 1).shape is None
  with pytest.raises(ValueError, match="RANGE has no shape"): _ = r.ndim
  with pytest.raises(ValueError, match="cannot reshape Ops.RANGE: it is not a tensor-level node"): r.reshape((4,))


@pytest.mark.parametrize("build, message", [
  (lambda x: x.reshape((5, 5)), r"cannot reshape \(2, 3, 4\) \(24 elements\) to \(5, 5\) \(25 elements\)"),
  (lambda x: x.reshape((-1, 24)), r"reshape to negative size \(-1, 24\)"),
  (lambda x: x.expand((2, 3, 8)), r"cannot expand \(2, 3, 4\) to \(2, 3, 8\): only axes of size 1 can grow"),
  (lambda x: x.expand((2, 3)), r"cannot expand \(2, 3, 4\) to \(2, 3\)"),
  (lambda x: x.permute((0, 0, 1)), r"permute order \(0, 0, 1\) is not a permutation of the 3 axes of \(2, 3, 4\)"),
  (lambda x: x.permute((0, 1)), r"permute order \(0, 1\) is not a permutation of the 3 axes of \(2, 3, 4\)"),
  (lambda x: x.pad(((1, 1),)), r"pad needs one \(before, after\) pair per axis of \(2, 3, 4\), got \(\(1, 1\),\)"),
  (lambda x: x.pad(((0, 0), (0, 0), (1,))), r"pad needs one \(before, after\) pair per axis"),
  (lambda x: x.pad(((-1, 0), (0, 0), (0, 0))), r"pad amounts must be non-negative, got \(\(-1, 0\), "),
  (lambda x: x.shrink(((0, 3), (0, 3), (0, 4))), r"shrink bounds \(\(0, 3\), \(0, 3\), \(0, 4\)\) do not fit in "
                                                 r"shape \(2, 3, 4\)"),
  (lambda x: x.shrink(((1, 0), (0, 3), (0, 4))), r"shrink bounds .* do not fit in shape \(2, 3, 4\)"),
  (lambda x: x.shrink(((0, 2),)), r"shrink needs one \(begin, end\) pair per axis of \(2, 3, 4\)"),
  (lambda x: x.flip((3,)), r"flip axes \(3,\) out of range for \(2, 3, 4\)"),
  (lambda x: x.flip((-1,)), r"flip axes \(-1,\) out of range for \(2, 3, 4\)"),
])
def test_bad_movement_is_a_clear_value_error(build: Callable[[UOp], UOp], message: str) -> None:
  with pytest.raises(ValueError, match=message): build(_buffer().reshape((2, 3, 4)))


def test_symbolic_expand_must_start_from_one() -> None:
  n = Variable("shape_e", 1, 10)
  x = _buffer(4).reshape((1, 4)).expand((n, 4))
  with pytest.raises(ValueError, match="only axes of size 1 can grow"): x.expand((5, 4))
  assert x.expand((n, 4)) is x


def test_sizes_must_be_index_ints() -> None:
  x = _buffer().reshape((2, 3, 4))
  with pytest.raises(TypeError, match="a size must be an int or an index UOp, got float 4.0"): x.reshape((4.0, 6))
  with pytest.raises(TypeError, match="a size must have dtype index, got dtypes.int32"):
    x.pad(((0, UOp.const(dtypes.int32, 1)), (0, 0), (0, 0)))


# *** value bounds ***

a = Variable("bound_a", 2, 9)      # positive
b = Variable("bound_b", -3, 4)     # contains zero
c = Variable("bound_c", -9, -2)    # negative
n = Variable("bound_n", 1, 10)


def _int32(name: str, low: int, high: int) -> UOp:
  return UOp.variable(name, low, high, dtypes.int32)


@pytest.mark.parametrize("build, low, high", [
  (lambda: UOp.const(dtypes.index, 5), 5, 5),
  (lambda: UOp.const(dtypes.bool, True), True, True),
  (lambda: a, 2, 9),
  (lambda: a.bind(4), 2, 9),  # a bound variable still ranges over its declared values
  (lambda: UOp.range(4, 0), 0, 3),
  (lambda: UOp.range(n, 0), 0, 9),
  (lambda: UOp.range(0, 0), 0, 0),
  (lambda: UOp(Ops.SPECIAL, dtypes.index, (_index(8),), "gidx0"), 0, 7),
  (lambda: a + b, -1, 13),
  (lambda: a - c, 4, 18),
  (lambda: a * b, -27, 36),
  (lambda: a * c, -81, -4),
  (lambda: c * c, 4, 81),
  (lambda: a * -2, -18, -4),
  (lambda: a // 2, 1, 4),
  (lambda: b // 2, -1, 2),      # truncating: -3 // 2 is -1
  (lambda: c // 2, -4, -1),
  (lambda: a // -2, -4, -1),
  (lambda: a // n, 0, 9),
  (lambda: a // b, -INF, INF),  # the divisor may be zero
  (lambda: a % 4, 0, 3),
  (lambda: a % 20, 0, 9),       # sound, not tight
  (lambda: b % 4, -3, 3),       # the remainder takes the sign of the dividend
  (lambda: c % 4, -3, 0),
  (lambda: a % b, -INF, INF),
  (lambda: b.maximum(0), 0, 4),
  (lambda: a.maximum(c), 2, 9),
  (lambda: a < 10, True, True),
  (lambda: a < 2, False, False),
  (lambda: a < 5, False, True),
  (lambda: c < a, True, True),
  (lambda: a.ne(20), True, True),
  (lambda: a.ne(5), False, True),
  (lambda: UOp.const(dtypes.index, 3).ne(UOp.const(dtypes.index, 3)), False, False),
  (lambda: (a < 10) & (a < 5), False, True),
  (lambda: (a < 10) & (a < 20), True, True),
  (lambda: (a < 2) & (a < 20), False, False),
  (lambda: a & 3, 0, 3),
  (lambda: (a < 2) | (a < 5), False, True),
  (lambda: (a < 2) | (a < 10), True, True),
  (lambda: UOp.const(dtypes.bool, True) ^ UOp.const(dtypes.bool, True), False, False),
  (lambda: (a < 5) ^ True, False, True),
  (lambda: a << 2, 8, 36),
  (lambda: a >> 1, 1, 4),
  (lambda: c >> 1, -5, -1),
  (lambda: (b < 0).where(a, c), -9, 9),
  (lambda: (a < 10).where(a, c), 2, 9),
  (lambda: (a < 2).where(a, c), -9, -2),
  (lambda: _int32("bound_i", -3, 4).cast(dtypes.int8), -3, 4),
  (lambda: _int32("bound_i", -3, 4).cast(dtypes.uint8), 0, 255),       # -1 wraps to 255
  (lambda: _int32("bound_i", 100, 200).cast(dtypes.int8), -128, 127),  # 200 wraps
  (lambda: _int32("bound_i", -3, 4).cast(dtypes.bool), False, True),
  (lambda: _int32("bound_i", 1, 4).cast(dtypes.bool), True, True),
  (lambda: _int32("bound_i", -4, -1).cast(dtypes.bool), True, True),
  (lambda: _int32("bound_i", 0, 0).cast(dtypes.bool), False, False),
  (lambda: _int32("bound_i", 0, 3).cast(dtypes.bool), False, True),
  (lambda: (a < 5).cast(dtypes.int32), 0, 1),
  (lambda: _int32("bound_i", -3, 4).cast(dtypes.float32), -INF, INF),
  (lambda: UOp.variable("bound_i8", 100, 120, dtypes.int8) + UOp.const(dtypes.int8, 20), -128, 127),  # may wrap
  (lambda: UOp.variable("bound_i8", 100, 120, dtypes.int8) + UOp.const(dtypes.int8, 7), 107, 127),
  (lambda: UOp.variable("bound_u8", 0, 10, dtypes.uint8) - UOp.const(dtypes.uint8, 1), 0, 255),
  (lambda: UOp.variable("bound_f", 0, 1, dtypes.float32) + 1.0, -INF, INF),
  (lambda: UOp(Ops.CONST, dtypes.index.vec(2), arg=(1, 2)), -INF, INF),
  (lambda: UOp.variable("bound_i32", 0, 5, dtypes.int32) * UOp.variable("bound_j32", 0, 5, dtypes.int32).cast(
    dtypes.int32), 0, 25),
])
def test_bounds(build: Callable[[], UOp], low: Any, high: Any) -> None:
  node = build()
  assert (node.vmin, node.vmax) == (low, high)
  assert type(node.vmin) is type(low) and type(node.vmax) is type(high)


def test_bounds_of_unbounded_index_products() -> None:
  unbounded = a // b
  assert ((unbounded * 2).vmin, (unbounded * 2).vmax) == (-INF, INF)
  assert (unbounded % 4).vmin == -3 and (unbounded % 4).vmax == 3
  assert ((a // b).maximum(0).vmin, (a // b).maximum(0).vmax) == (0, INF)


def test_bounds_hold_for_every_value() -> None:
  expressions = [(a * b + c) // 3, (b * c) % 5, (a - b * 2).maximum(c), ((b < 1).where(a * 3, c) + b) // -2,
                 ((a + b) * (c + 5)) % (a + 1)]
  for expression in expressions:
    seen = [evaluate(expression, {a: x, b: y, c: z}) for x in range(2, 10) for y in range(-3, 5) for z in range(-9, -1)]
    assert expression.vmin <= min(seen) and max(seen) <= expression.vmax, expression.render()


def test_cast_to_bool_bounds_do_not_fold_a_value_that_can_be_zero() -> None:
  i = _int32("fold_i", -3, 5)
  choice = i.cast(dtypes.bool).where(UOp.const(dtypes.int32, 1), UOp.const(dtypes.int32, 2))
  simplified = simplify(choice)
  assert [evaluate(simplified, {i: v}) for v in (-1, 0, 1)] == [1, 2, 1]


def test_bounds_of_non_values_are_none() -> None:
  assert (UOp.sink(a).vmin, UOp.sink(a).vmax) == (None, None)
  assert UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(16), arg=0).vmin is None


def test_bounds_of_a_deep_expression() -> None:
  # a sum of a few thousand terms: the bounds must not recurse once per level
  total = Variable("deep_0", 0, 5)
  for i in range(3000): total = Variable(f"deep_{i + 1}", 0, 3) + total * 1
  assert (total.vmin, total.vmax) == (0, 5 + 3 * 3000)


# *** printing ***

r0, r1 = UOp.range(4, 0), UOp.range(3, 1)


@pytest.mark.parametrize("node, text", [
  (r0 * 2 + r1, "((r0*2)+r1)"),
  (a // 4 - 1, "((bound_a//4)+(1*-1))"),  # `- 1` builds `+ 1*-1`
  (a % 4, "(bound_a%4)"),
  (a / 4, "(bound_a/4)"),
  (a < 5, "(bound_a<5)"),
  (a.ne(5), "(bound_a!=5)"),
  (a.eq(5), "((bound_a!=5)^True)"),
  ((a & 3) | (a ^ 1), "((bound_a&3)|(bound_a^1))"),
  ((a << 2) >> r0, "((bound_a<<2)>>r0)"),
  ((a < 5).where(r0, r1), "((bound_a<5)?r0:r1)"),
  (_int32("render_i", 0, 3).cast(dtypes.int8), "(int8)render_i"),
  (a.maximum(0), "max(bound_a, 0)"),
  (a.bind(3) + 1, "(bound_a+1)"),
  (UOp.const(dtypes.float32, -0.0), "-0.0"),
  (UOp.const(dtypes.bool, False), "False"),
  (UOp(Ops.INVALID, dtypes.index), "INVALID"),
  (UOp.sink(r0, a), "sink(r0, bound_a)"),
  (UOp(Ops.SQRT, dtypes.float32, (UOp.const(dtypes.float32, 2.0),)), "sqrt(2.0)"),
])
def test_render(node: UOp, text: str) -> None:
  assert node.render() == text


def test_repr_writes_a_shared_node_once() -> None:
  shared = UOp.range(4, 0)
  text = repr(UOp.sink(shared * 2 + shared, shared))
  assert text.count("Ops.RANGE") == 1
  assert text.count("x0:=UOp(Ops.RANGE, dtypes.index, arg=(0, 'loop')") == 1
  assert text.count("x0") == 3  # defined once, then referred to twice
  assert text.startswith("UOp(Ops.SINK, dtypes.void, src=(\n")
  nested = repr(shared * 2 + shared).splitlines()
  assert nested == [
    "UOp(Ops.ADD, dtypes.index, src=(",
    "  UOp(Ops.MUL, dtypes.index, src=(",
    "    x0:=UOp(Ops.RANGE, dtypes.index, arg=(0, 'loop'), src=(",
    "      UOp(Ops.CONST, dtypes.index, arg=4))),",
    "    UOp(Ops.CONST, dtypes.index, arg=2))),",
    "  x0))",
  ]


def test_repr_without_sharing_names_nothing() -> None:
  text = repr((a + 1).replace(tag="t"))
  assert "x0" not in text and ":=" not in text
  assert "tag='t'" in text and "arg=('bound_a', 2, 9)" in text


def test_repr_of_two_shared_nodes_numbers_them_in_order() -> None:
  first, second = Variable("repr_p", 0, 1), Variable("repr_q", 0, 1)
  text = repr(UOp.sink(first + second, first * second))
  assert text.index("x0:=") < text.index("x1:=")
  assert "x0:=UOp(Ops.DEFINE_VAR, dtypes.index, arg=('repr_p', 0, 1))" in text
  assert "x1:=UOp(Ops.DEFINE_VAR, dtypes.index, arg=('repr_q', 0, 1))" in text


# *** exact values of ALU ops and casts (what test_symbolic.py does not cover) ***

@pytest.mark.parametrize("value, dtype, expected", [
  (3.9, dtypes.int32, 3),
  (-3.9, dtypes.int32, -3),           # toward zero, not floor
  (300, dtypes.uint8, 44),
  (-1, dtypes.uint8, 255),
  (128, dtypes.int8, -128),
  (2**40 + 5, dtypes.int32, 5),
  (2.5, dtypes.bool, True),
  (0.0, dtypes.bool, False),
  (-0.0, dtypes.bool, False),
  (math.nan, dtypes.bool, True),
  (7, dtypes.float32, 7.0),
  (16777217, dtypes.float32, 16777216.0),  # float32 has 24 bits of mantissa
  (0.1, dtypes.float32, 0.10000000149011612),
  (1e40, dtypes.float32, INF),
  (70000.0, dtypes.float16, INF),
  (True, dtypes.int32, 1),
  (True, dtypes.float32, 1.0),
])
def test_cast_value(value: Any, dtype: Any, expected: Any) -> None:
  got = cast_value(value, dtype)
  assert got == expected and type(got) is type(expected)
  assert exec_alu(Ops.CAST, dtype, (value,)) == expected


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_cast_of_non_finite_float_to_int_raises(value: float) -> None:
  with pytest.raises(ValueError, match="cannot convert"): cast_value(value, dtypes.int32)


@pytest.mark.parametrize("op, dtype, operands, expected", [
  (Ops.ADD, dtypes.float32, (1, 2), 3.0),                   # int operands become floats
  (Ops.MULACC, dtypes.float32, (1e8, 1.0, 1.0), 1e8),       # rounded to float32
  (Ops.MULACC, dtypes.int8, (100, 2, 1), -55),              # wraps
  (Ops.WHERE, dtypes.int32, (True, 1, 2), 1),
  (Ops.WHERE, dtypes.int32, (False, 1, 2), 2),
  (Ops.AND, dtypes.int32, (12, 10), 8),
  (Ops.OR, dtypes.int32, (12, 10), 14),
  (Ops.XOR, dtypes.int32, (12, 10), 6),
  (Ops.XOR, dtypes.uint8, (0xFF, 0x0F), 0xF0),
  (Ops.AND, dtypes.bool, (True, False), False),
  (Ops.OR, dtypes.bool, (True, False), True),
  (Ops.CMPNE, dtypes.bool, (math.nan, math.nan), True),
  (Ops.CMPLT, dtypes.bool, (math.nan, 1.0), False),
  (Ops.MAX, dtypes.float32, (math.nan, 1.0), "nan"),
  (Ops.MAX, dtypes.int8, (-5, 3), 3),
  (Ops.RECIPROCAL, dtypes.float32, (0.0,), INF),
  (Ops.RECIPROCAL, dtypes.float32, (-0.0,), -INF),
  (Ops.RECIPROCAL, dtypes.float32, (3.0,), 0.3333333432674408),
  (Ops.SIN, dtypes.float32, (INF,), "nan"),
  (Ops.SIN, dtypes.float32, (0.0,), 0.0),
  (Ops.EXP2, dtypes.float32, (-2000.0,), 0.0),
  (Ops.EXP2, dtypes.float32, (3.0,), 8.0),
  (Ops.LOG2, dtypes.float32, (-1.0,), "nan"),
  (Ops.LOG2, dtypes.float32, (INF,), INF),
  (Ops.SQRT, dtypes.float32, (2.0,), 1.4142135381698608),
  (Ops.TRUNC, dtypes.float32, (INF,), INF),
  (Ops.TRUNC, dtypes.int32, (7,), 7),
  (Ops.FDIV, dtypes.float32, (-1.0, -0.0), INF),
  (Ops.IDIV, dtypes.uint8, (250, 7), 35),
  (Ops.MOD, dtypes.index, (-(2**70) - 1, 2**35), -1),      # index never wraps
  (Ops.SHL, dtypes.int32, (1, 31), -2**31),
  (Ops.SHR, dtypes.int64, (-1, 63), -1),
  (Ops.ADD, dtypes.bfloat16, (1.0, 2**-9), 1.0),
])
def test_exec_alu(op: Ops, dtype: Any, operands: tuple, expected: Any) -> None:
  got = exec_alu(op, dtype, operands)
  if expected == "nan": assert got != got
  else: assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize("op, value, sign", [
  (Ops.TRUNC, -0.5, -1.0),   # C's trunc keeps the sign: trunc(-0.5) is -0.0
  (Ops.TRUNC, 0.5, 1.0),
  (Ops.SQRT, -0.0, -1.0),
  (Ops.SIN, -0.0, -1.0),
])
def test_signed_zero_results(op: Ops, value: float, sign: float) -> None:
  got = exec_alu(op, dtypes.float32, (value,))
  assert got == 0.0 and math.copysign(1.0, got) == sign


@pytest.mark.parametrize("op, dtype, operands, error", [
  (Ops.IDIV, dtypes.int32, (5, 0), ZeroDivisionError),
  (Ops.MOD, dtypes.int32, (5, 0), ZeroDivisionError),
  (Ops.SHL, dtypes.int32, (1, 32), ValueError),
  (Ops.SHL, dtypes.uint8, (1, 8), ValueError),
  (Ops.SHR, dtypes.int64, (1, -1), ValueError),
])
def test_undefined_behaviour_raises(op: Ops, dtype: Any, operands: tuple, error: type) -> None:
  with pytest.raises(error): exec_alu(op, dtype, operands)
