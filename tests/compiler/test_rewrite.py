"""The rewrite engine: what patterns match, how a PatternMatcher picks rules, and how graph_rewrite walks a graph."""
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rawgrad.compiler import rewrite
from rawgrad.compiler.ir import GroupOp, Ops, UOp
from rawgrad.compiler.rewrite import (REVISIT, REWRITE_TRACE, PatternMatcher, RewriteError, RewriteStuck, UPat,
                                      graph_rewrite, iter_matches, substitute)
from rawgrad.compiler.symbolic import Variable
from rawgrad.dtype import dtypes
from rawgrad.helpers import Context

a, b, c = Variable("rw_a", 0, 9), Variable("rw_b", 0, 9), Variable("rw_c", 0, 9)


def _i(value: int) -> UOp:
  return UOp.const(dtypes.index, value)


def _f32(name: str) -> UOp:
  return UOp(Ops.DEFINE_VAR, dtypes.float32, arg=(name, 0, 1))


def _matches(pattern: UPat, node: UOp) -> list[dict[str, UOp]]:
  return pattern.match(node, {})


# *** patterns ***

def test_op_sets() -> None:
  add_or_mul = UPat((Ops.ADD, Ops.MUL))
  assert _matches(add_or_mul, a + b) and _matches(add_or_mul, a * b)
  assert not _matches(add_or_mul, a.maximum(b)) and not _matches(add_or_mul, a)
  assert _matches(UPat(Ops.ADD), a + b) and not _matches(UPat(Ops.ADD), a * b)
  assert _matches(UPat(GroupOp.Comparison), a < b) and not _matches(UPat(GroupOp.Comparison), a + b)
  anything = UPat()
  assert all(_matches(anything, node) for node in (a, a + b, UOp.sink(a), _i(3)))


def test_dtype_match_includes_a_vector_dtypes_scalar() -> None:
  f32, f16 = _f32("f"), UOp(Ops.DEFINE_VAR, dtypes.float16, arg=("h", 0, 1))
  vector = UOp(Ops.VECTORIZE, dtypes.float32.vec(4), (f32,) * 4)
  pattern = UPat(dtype=dtypes.float32)
  assert _matches(pattern, f32) and _matches(pattern, vector)
  assert not _matches(pattern, f16) and not _matches(pattern, a)
  assert _matches(UPat(dtype=dtypes.float32.vec(4)), vector) and not _matches(UPat(dtype=dtypes.float32.vec(4)), f32)
  several = UPat(dtype=(dtypes.float16, dtypes.index))
  assert _matches(several, f16) and _matches(several, a) and not _matches(several, f32)


def test_captures_and_name_consistency() -> None:
  same = UPat(Ops.ADD, src=(UPat.var("x"), UPat.var("x")))
  assert _matches(same, a + a) == [{"x": a}]
  assert _matches(same, a + b) == []  # one name, two different nodes
  pair = UPat(Ops.ADD, src=(UPat.var("x"), UPat.var("y")), name="root")
  assert _matches(pair, a + b) == [{"x": a, "y": b, "root": a + b}]
  # a name bound outside the pattern must be the same node inside
  assert UPat.var("x").match(a, {"x": a}) == [{"x": a}]
  assert UPat.var("x").match(a, {"x": b}) == []
  # the name is checked across levels too: (x*y)+x
  nested = UPat(Ops.ADD, src=(UPat(Ops.MUL, src=(UPat.var("x"), UPat.var("y"))), UPat.var("x")))
  assert _matches(nested, a * b + a) == [{"x": a, "y": b}]
  assert _matches(nested, a * b + b) == []


def test_ordered_sources_versus_any_permutation() -> None:
  ordered = UPat(Ops.ADD, src=(UPat.var("x"), UPat.cvar("k")))
  assert _matches(ordered, a + 1) == [{"x": a, "k": _i(1)}]
  assert _matches(ordered, 1 + a) == []
  unordered = UPat(Ops.ADD, src=[UPat.var("x"), UPat.cvar("k")])
  assert _matches(unordered, a + 1) == [{"x": a, "k": _i(1)}]
  assert _matches(unordered, 1 + a) == [{"x": a, "k": _i(1)}]
  # both orders of two general patterns are tried: two ways to match
  both = UPat(Ops.ADD, src=[UPat.var("x"), UPat.var("y")])
  assert _matches(both, a + b) == [{"x": a, "y": b}, {"x": b, "y": a}]
  # the same pattern object twice is one order, not two
  twice = UPat.var("z")
  assert len(_matches(UPat(Ops.ADD, src=[twice, twice]), a + a)) == 1
  # a permutation still needs the right count
  assert _matches(UPat(Ops.WHERE, src=[UPat.var(), UPat.var()]), (a < b).where(a, b)) == []


def test_one_pattern_for_every_source() -> None:
  all_constants = UPat(Ops.SINK, src=UPat(Ops.CONST))
  assert _matches(all_constants, UOp.sink(_i(1), _i(2), _i(3)))
  assert _matches(all_constants, UOp.sink(_i(1)))
  assert _matches(all_constants, UOp.sink())  # no sources: every one of them matches
  assert not _matches(all_constants, UOp.sink(_i(1), a, _i(3)))
  # a name inside a repeated pattern must be the same node each time
  repeated = UPat(Ops.SINK, src=UPat.var("x"))
  assert _matches(repeated, UOp.sink(a, a, a)) == [{"x": a}]
  assert _matches(repeated, UOp.sink(a, b)) == []


def test_allow_any_len_matches_a_prefix() -> None:
  node = UOp.sink(a, b, c)
  prefix = UPat(Ops.SINK, src=(UPat.var("first"), UPat.var("second")))
  assert _matches(prefix, node) == []
  prefix_any = UPat(Ops.SINK, src=(UPat.var("first"), UPat.var("second")), allow_any_len=True)
  assert _matches(prefix_any, node) == [{"first": a, "second": b}]
  assert _matches(prefix_any, UOp.sink(a, b)) == [{"first": a, "second": b}]
  assert _matches(prefix_any, UOp.sink(a)) == []  # more patterns than sources
  assert _matches(UPat(Ops.SINK, src=(), allow_any_len=True), node) == [{}]


def test_arg_match() -> None:
  one = UPat(Ops.CONST, arg=1)
  assert _matches(one, UOp.const(dtypes.int32, 1))
  assert _matches(one, UOp.const(dtypes.float32, 1.0))  # 1 == 1.0: the same number
  assert not _matches(one, UOp.const(dtypes.bool, True))  # True == 1 in Python, but it is a boolean
  assert not _matches(UPat(Ops.CONST, arg=True), UOp.const(dtypes.int32, 1))
  assert _matches(UPat(Ops.CONST, arg=True), UOp.const(dtypes.bool, True))
  assert not _matches(one, UOp.const(dtypes.int32, 2))
  # no arg given matches any arg; arg=None is a real arg
  assert _matches(UPat(Ops.CONST), UOp.const(dtypes.int32, 7))
  assert _matches(UPat(Ops.ADD, arg=None), a + b) and not _matches(UPat(Ops.CONST, arg=None), _i(0))
  assert _matches(UPat(Ops.RANGE, arg=(0, "loop")), UOp.range(4, 0))
  assert not _matches(UPat(Ops.RANGE, arg=(1, "loop")), UOp.range(4, 0))
  assert _matches(UPat.const(dtypes.index, 3), _i(3)) and not _matches(UPat.const(dtypes.int32, 3), _i(3))


def test_any_of_alternatives() -> None:
  either = UPat.any(UPat(Ops.ADD, src=(UPat.var("x"), UPat.cvar("k"))), UPat(Ops.MUL, src=(UPat.var("x"), UPat.var())))
  assert _matches(either, a + 1) == [{"x": a, "k": _i(1)}]
  assert _matches(either, a * b) == [{"x": a}]
  assert _matches(either, a.maximum(b)) == []
  assert either.op == frozenset({Ops.ADD, Ops.MUL})
  named = either.named("whole")
  assert _matches(named, a * b) == [{"x": a, "whole": a * b}]
  assert named.match(a * b, {"whole": b}) == []
  # inside another pattern, with a name shared with the outside
  outer = UPat(Ops.MAX, src=(UPat.var("x"), UPat.any(UPat.cvar("k"), UPat.var("x"))))
  assert _matches(outer, a.maximum(a)) == [{"x": a}]
  assert _matches(outer, a.maximum(3)) == [{"x": a, "k": _i(3)}]
  assert _matches(outer, a.maximum(b)) == []


def test_operator_sugar() -> None:
  plus_constant = UPat.var("x") + UPat.cvar("k")
  assert _matches(plus_constant, a + 5) == [{"x": a, "k": _i(5)}]
  assert _matches(plus_constant, 5 + a) == [{"x": a, "k": _i(5)}]  # ADD is commutative: both orders
  assert _matches(plus_constant, a + b) == []
  times_one = UPat.var("x") * 1
  assert _matches(times_one, a * 1) == [{"x": a}] and _matches(times_one, 1 * a) == [{"x": a}]
  assert _matches(times_one, a * 2) == []
  # IDIV is not commutative: one order only
  divided = UPat.var("x") // UPat.cvar("k")
  assert _matches(divided, a // 2) and not _matches(divided, 2 // a)
  less = UPat.var("x") < 4
  assert _matches(less, a < 4) and not _matches(less, a < 5)
  # typed sugar: the constant takes the variable's dtype
  bool_and = UPat.var("x", dtypes.bool) & True
  assert _matches(bool_and, (a < b) & True) and not _matches(bool_and, (a < b) & False)


# *** PatternMatcher ***

def test_rules_are_only_tried_on_their_ops() -> None:
  calls: list[Ops] = []

  def count(node: UOp) -> None:
    calls.append(node.op)

  matcher = PatternMatcher([(UPat(Ops.ADD, name="node"), count)])
  graph = UOp.sink(*[(a * k).maximum(b * k) for k in range(20)])
  assert graph_rewrite(graph, matcher) is graph
  assert calls == []  # dozens of MUL and MAX nodes, the ADD rule never tried
  assert matcher.by_op[Ops.MUL] == [] and len(matcher.by_op[Ops.ADD]) == 1
  graph_rewrite(UOp.sink(a + b, a * b), matcher)
  assert calls == [Ops.ADD]
  # a rule for any op is filed under every op
  everywhere = PatternMatcher([(UPat(name="node"), count)])
  assert all(len(everywhere.by_op[op]) == 1 for op in Ops)


def test_rules_get_ctx_when_they_ask_for_it() -> None:
  seen: list[Any] = []

  def with_ctx(ctx: Any, x: UOp) -> None:
    seen.append(("ctx", ctx, x))

  def without_ctx(x: UOp) -> None:
    seen.append(("plain", x))

  matcher = PatternMatcher([(UPat(Ops.DEFINE_VAR, name="x"), with_ctx), (UPat(Ops.DEFINE_VAR, name="x"), without_ctx)])
  context = object()
  assert matcher.rewrite(a, context) is None
  assert seen == [("ctx", context, a), ("plain", a)]
  assert [rule.wants_ctx for rule in matcher.rules] == [True, False]
  graph_rewrite(a, matcher, ctx="the context")
  assert seen[2] == ("ctx", "the context", a)


def test_first_matching_rule_wins() -> None:
  calls: list[str] = []

  def first(x: UOp) -> UOp:
    calls.append("first")
    return b

  def second(x: UOp) -> UOp:
    calls.append("second")
    return c

  def declines(x: UOp) -> None:
    calls.append("declines")

  assert PatternMatcher([(UPat.var("x"), first), (UPat.var("x"), second)]).rewrite(a) is b
  assert calls == ["first"]
  calls.clear()
  # a rule returning None (or the node itself) passes to the next rule
  assert PatternMatcher([(UPat.var("x"), declines), (UPat.var("x"), lambda x: x), (UPat.var("x"), second)]).rewrite(
    a) is c
  assert calls == ["declines", "second"]
  # rules of two matchers added together keep their order
  combined = PatternMatcher([(UPat.var("x"), second)]) + PatternMatcher([(UPat.var("x"), first)])
  assert combined.rewrite(a) is c


# *** graph_rewrite ***

def _rename(x: UOp) -> UOp | None:
  """v0 -> v1 -> ... -> v5: a chain of rewrites, one step per rule firing."""
  name, low, high = x.arg
  if not name.startswith("chain_v") or name == "chain_v5": return None
  return UOp.variable(f"chain_v{int(name[-1]) + 1}", low, high)


def test_rewrites_run_to_a_fixed_point() -> None:
  v0, v5 = UOp.variable("chain_v0", 0, 3), UOp.variable("chain_v5", 0, 3)
  matcher = PatternMatcher([(UPat(Ops.DEFINE_VAR, name="x"), _rename)])
  assert graph_rewrite(v0, matcher) is v5
  assert graph_rewrite((v0 + 1) * v0, matcher) is (v5 + 1) * v5
  assert graph_rewrite((v0 + 1) * v0, matcher, bottom_up=True) is (v5 + 1) * v5


def test_a_rules_result_is_rewritten_inside_too() -> None:
  p, q = Variable("fp_p", 0, 3), Variable("fp_q", 0, 3)
  matcher = PatternMatcher([
    (UPat(Ops.DEFINE_VAR, arg=("fp_p", 0, 3)), lambda: (q * 1 + 0) * 1),
    (UPat.var("x") * 1, lambda x: x),
    (UPat.var("x") + 0, lambda x: x),
  ])
  for bottom_up in (False, True):
    assert graph_rewrite(p, matcher, bottom_up=bottom_up) is q
    assert graph_rewrite(UOp.sink(p + 2, p * 1), matcher, bottom_up=bottom_up) is UOp.sink(q + 2, q)


@pytest.mark.parametrize("bottom_up", [False, True])
def test_shared_subgraph_is_rewritten_once(bottom_up: bool) -> None:
  fired: list[UOp] = []

  def expand(node: UOp, x: UOp) -> UOp:
    fired.append(node)
    return x + x

  shared = a * 2
  graph = UOp.sink(shared + 1, shared + 2, shared.maximum(shared), shared)
  result = graph_rewrite(graph, PatternMatcher([(UPat(Ops.MUL, src=(UPat.var("x"), UPat.cvar()), name="node"),
                                                  expand)]), bottom_up=bottom_up)
  assert fired == [shared]
  doubled = a + a
  assert result is UOp.sink(doubled + 1, doubled + 2, doubled.maximum(doubled), doubled)


def _logging_matcher() -> PatternMatcher:
  def rename(ctx: list, node: UOp) -> UOp:
    ctx.append(f"rename {node.render()}")
    return b

  def log(ctx: list, node: UOp) -> None:
    ctx.append(node.render())

  return PatternMatcher([(UPat(Ops.DEFINE_VAR, arg=a.arg, name="node"), rename), (UPat(name="node"), log)])


def test_default_order_sees_sources_rewritten_first() -> None:
  log: list[str] = []
  assert graph_rewrite((a * 2) + 3, _logging_matcher(), ctx=log) is (b * 2) + 3
  assert log[0] == "rename rw_a"  # a leaf first
  assert log[-1] == "((rw_b*2)+3)"
  # every node above the rewritten leaf is seen only with the new source
  assert not any("rw_a" in entry for entry in log[1:])
  assert log.index("(rw_b*2)") < log.index("((rw_b*2)+3)")


def test_bottom_up_order_sees_the_original_node_first() -> None:
  log: list[str] = []
  assert graph_rewrite((a * 2) + 3, _logging_matcher(), ctx=log, bottom_up=True) is (b * 2) + 3
  assert log[:3] == ["((rw_a*2)+3)", "(rw_a*2)", "rename rw_a"]  # the root first, with its original sources
  # once its sources changed, a node is rebuilt and its rules run again
  assert log[-1] == "((rw_b*2)+3)" and "(rw_b*2)" in log


def test_a_rule_can_wait_for_another_part_of_the_graph() -> None:
  attempts: list[bool] = []

  def waits(ctx: dict, x: UOp) -> Any:
    attempts.append(ctx["ready"])
    return c if ctx["ready"] else REVISIT

  def sets_flag(ctx: dict, x: UOp) -> UOp:
    ctx["ready"] = True
    return x.replace(arg=("rw_done", 0, 9))

  matcher = PatternMatcher([(UPat(Ops.DEFINE_VAR, arg=a.arg, name="x"), waits),
                            (UPat(Ops.DEFINE_VAR, arg=b.arg, name="x"), sets_flag)])
  done = Variable("rw_done", 0, 9)
  for bottom_up in (False, True):
    attempts.clear()
    # a comes first in either order, so it must ask again after b has been rewritten
    result = graph_rewrite(UOp.sink(a + 1, b), matcher, ctx={"ready": False}, bottom_up=bottom_up)
    assert result is UOp.sink(c + 1, done)
    assert attempts[0] is False and attempts[-1] is True
    # a waiting node used by several others: the other users wait too, none of them is mistaken for a cycle
    attempts.clear()
    result = graph_rewrite(UOp.sink(a + 1, a * 2, a, b), matcher, ctx={"ready": False}, bottom_up=bottom_up)
    assert result is UOp.sink(c + 1, c * 2, c, done)


@pytest.mark.parametrize("bottom_up", [False, True])
def test_a_rule_that_always_waits_is_stuck(bottom_up: bool) -> None:
  stuck = Variable("rw_stuck", 0, 1)
  matcher = PatternMatcher([(UPat(Ops.DEFINE_VAR, arg=stuck.arg), lambda: REVISIT)])
  started = time.perf_counter()
  with pytest.raises(RewriteStuck, match=r"(?s)my_pass: rewrite is stuck.*Ops.DEFINE_VAR dtypes.index "
                                         r"arg=\('rw_stuck', 0, 1\)") as error:
    graph_rewrite(UOp.sink(stuck * 3, a + 1), matcher, bottom_up=bottom_up, name="my_pass")
  assert time.perf_counter() - started < 1.0
  assert error.value.nodes == [stuck]
  assert isinstance(error.value, RewriteError)


@pytest.mark.parametrize("bottom_up", [False, True])
def test_a_rule_that_rebuilds_its_own_node_is_an_error(bottom_up: bool) -> None:
  # x -> noop(x): the result contains x, which would be rewritten again forever
  matcher = PatternMatcher([(UPat(Ops.DEFINE_VAR, name="x"), lambda x: UOp(Ops.NOOP, x.dtype, (x,)))])
  with pytest.raises(RewriteError, match="a rule rewrote a node into a graph that contains it again"):
    graph_rewrite(a + 1, matcher, bottom_up=bottom_up)


def test_rules_that_never_settle_are_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setattr(rewrite, "MAX_REWRITES_PER_NODE", 500)
  swap = PatternMatcher([(UPat(Ops.ADD, src=(UPat.var("x"), UPat.var("y"))), lambda x, y: y + x)])
  with pytest.raises(RewriteError, match="my_pass: rules do not converge at Ops.ADD after 500 rewrites"):
    graph_rewrite(UOp.sink(a + b), swap, name="my_pass")
  count_up = PatternMatcher([(UPat(Ops.ADD, src=(UPat.var("x"), UPat.cvar("k"))), lambda x, k: x + (k.arg + 1))])
  with pytest.raises(RewriteError, match="do not converge"):
    graph_rewrite(a + 1, count_up, bottom_up=True)


def test_a_rule_must_return_a_uop() -> None:
  def bad(x: UOp) -> int:
    return 3

  matcher = PatternMatcher([(UPat(Ops.DEFINE_VAR, name="x"), bad)])
  with pytest.raises(RewriteError, match=rf"rule at test_rewrite.py:{bad.__code__.co_firstlineno} returned int"):
    graph_rewrite(a + 1, matcher)


def test_substitute_swaps_in_one_step() -> None:
  expression = (a + b * 2) < a
  assert substitute(expression, {a: b, b: a}) is ((b + a * 2) < b)
  assert substitute(expression, {}) is expression
  assert substitute(expression, {c: a}) is expression
  # a replacement is not searched again: b's replacement contains b
  assert substitute(a + b, {b: b * 2}) is a + b * 2
  assert substitute(a + b, {a + b: c}) is c


def test_iter_matches_finds_every_matching_node() -> None:
  graph = UOp.sink(a + 1, (a + 1) * 2, b + 3)
  found = list(iter_matches(UPat.var("x") + UPat.cvar("k"), graph))
  assert [(node, captures["k"].arg) for node, captures in found] == [(a + 1, 1), (b + 3, 3)]


def test_tracking_records_each_rule_firing() -> None:
  def to_b(x: UOp) -> UOp:
    return b

  def drop_times_one(x: UOp) -> UOp:
    return x

  matcher = PatternMatcher([(UPat(Ops.DEFINE_VAR, arg=a.arg, name="x"), to_b), (UPat.var("x") * 1, drop_times_one)])
  REWRITE_TRACE.clear()
  graph_rewrite(a * 1 + 2, matcher, name="untracked")
  assert REWRITE_TRACE == []  # tracking is off by default
  with Context(TRACK_REWRITES=1):
    assert graph_rewrite(a * 1 + 2, matcher, name="tracked") is b + 2
  steps = [(step.pass_name, step.rule, step.before, step.after) for step in REWRITE_TRACE]
  assert steps == [
    ("tracked", f"test_rewrite.py:{to_b.__code__.co_firstlineno}", a, b),
    ("tracked", f"test_rewrite.py:{drop_times_one.__code__.co_firstlineno}", b * 1, b),
  ]
  REWRITE_TRACE.clear()


# *** property: rewriting with no rules changes nothing ***

@st.composite
def dags(draw: st.DrawFn) -> UOp:
  nodes: list[UOp] = [Variable(f"dag_{i}", 0, draw(st.integers(0, 5))) for i in range(draw(st.integers(1, 3)))]
  nodes += [_i(draw(st.integers(-3, 3))) for _ in range(draw(st.integers(0, 2)))]
  roots: list[UOp] = []
  for _ in range(draw(st.integers(1, 25))):
    kind = draw(st.sampled_from(["add", "mul", "max", "idiv", "where", "cast"]))
    x, y = draw(st.sampled_from(nodes)), draw(st.sampled_from(nodes))
    if kind == "add": nodes.append(x + y)
    elif kind == "mul": nodes.append(x * y)
    elif kind == "max": nodes.append(x.maximum(y))
    elif kind == "idiv": nodes.append(x // y)
    elif kind == "where": nodes.append((x < y).where(y, draw(st.sampled_from(nodes))))
    else: roots.append(UOp(Ops.CAST, dtypes.int32, (x,)))  # other dtypes only at the top, ALU ops need one dtype
  # several roots that share subgraphs
  return UOp.sink(*roots, *draw(st.lists(st.sampled_from(nodes), min_size=1, max_size=4)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags(), st.booleans())
def test_no_rules_returns_the_identical_root(root: UOp, bottom_up: bool) -> None:
  assert graph_rewrite(root, PatternMatcher([]), bottom_up=bottom_up) is root
  # rules that always decline are the same as none
  declining = PatternMatcher([(UPat(name="x"), lambda x: None), (UPat(GroupOp.ALU, name="x"), lambda x: x)])
  assert graph_rewrite(root, declining, bottom_up=bottom_up) is root


def test_rules_that_keep_making_new_nodes_raise_instead_of_looping() -> None:
  """x + c -> NOOP(x + (c+1)) rewrites a fresh node each time, never the same node in place: the per-graph budget
  catches it."""
  x = UOp.variable("grow", 0, 10)
  growing = PatternMatcher([(UPat(Ops.ADD, src=(UPat.var("a"), UPat.cvar("c"))),
                             lambda a, c: UOp(Ops.NOOP, dtypes.index, (a + (c.arg + 1),)))])
  start = time.monotonic()
  with pytest.raises(RewriteError, match="without converging"):
    graph_rewrite(x + 1, growing)
  assert time.monotonic() - start < 10


def test_a_rewrite_that_converges_does_not_walk_its_input_to_size_the_budget() -> None:
  """The budget is sized from the input's nodes only when the rules fired that often: simplifying a small index
  expression (thousands of them in a cold MNIST step) must not pay a walk of the whole input first."""
  r = UOp.range(16, 0)
  expression = r * 4 + UOp.variable("budget_n", 0, 9) + 3
  assert graph_rewrite(expression, PatternMatcher([])) is expression
  assert "toposort" not in expression.__dict__
