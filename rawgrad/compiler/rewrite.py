"""The rewrite engine: `UPat` patterns, `PatternMatcher` rule sets, and `graph_rewrite` to a fixed point."""
from __future__ import annotations

import inspect
import itertools
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

from rawgrad.compiler.ir import GroupOp, MathMixin, Ops, UOp
from rawgrad.dtype import DType, dtypes
from rawgrad.helpers import TRACK_REWRITES

_ANY_ARG = object()  # UPat's arg when it matches any arg (None is a real arg)


class Revisit:
  """Returned by a rule that cannot decide yet: the engine comes back to the node after the rest of the graph."""

  def __repr__(self) -> str:
    return "REVISIT"


REVISIT = Revisit()


class RewriteError(RuntimeError):
  pass


class RewriteStuck(RewriteError):
  """No rule can make progress: the nodes listed asked to be revisited, and nothing else changed."""

  def __init__(self, nodes: list[UOp], pass_name: str):
    self.nodes = nodes
    shown = "\n".join(f"  {node.op} {node.dtype} arg={node.arg!r}" for node in nodes[:5])
    more = f"\n  ... and {len(nodes) - 5} more" if len(nodes) > 5 else ""
    super().__init__(f"{pass_name}: rewrite is stuck; these nodes are waiting and nothing else can change:\n"
                     f"{shown}{more}")


class UPat(MathMixin):
  """A pattern over UOps.

  op: an Ops or a collection of them (None: any op). dtype: a DType or a collection (matches the dtype or its scalar).
  src: None (any sources), a tuple (these patterns in order), a list (these patterns in any order), or a single
  UPat (every source matches it, any count). arg: matched with `==` when given. name: capture the node under this
  name for the rule function. allow_any_len: with a tuple src, the patterns match a prefix of the sources."""

  def __init__(self, op: Ops | Iterable[Ops] | None = None, dtype: DType | Iterable[DType] | None = None,
               src: tuple[UPat, ...] | list[UPat] | UPat | None = None, arg: Any = _ANY_ARG, name: str | None = None,
               allow_any_len: bool = False):
    self.op: frozenset[Ops] | None = None if op is None else frozenset((op,) if isinstance(op, Ops) else op)
    self.dtype: frozenset | None = None if dtype is None else frozenset((dtype,) if isinstance(dtype, DType) else dtype)
    self.arg, self.name, self.allow_any_len = arg, name, allow_any_len
    self.src = src
    if isinstance(src, list): self._orders: list[tuple[UPat, ...]] | None = _unique_permutations(src)
    elif isinstance(src, tuple): self._orders = [src]
    else: self._orders = None

  # *** constructors ***

  @staticmethod
  def var(name: str | None = None, dtype: DType | Iterable[DType] | None = None) -> UPat:
    return UPat(dtype=dtype, name=name)

  @staticmethod
  def cvar(name: str | None = None, dtype: DType | Iterable[DType] | None = None) -> UPat:
    return UPat(Ops.CONST, dtype, name=name)

  @staticmethod
  def const(dtype: DType | Iterable[DType] | None, value: Any) -> UPat:
    return UPat(Ops.CONST, dtype, arg=value)

  @staticmethod
  def any(*patterns: UPat) -> UPat:
    return _AnyOf(patterns)

  def named(self, name: str) -> UPat:
    copy = UPat.__new__(type(self))
    copy.__dict__.update(self.__dict__)
    copy.name = name
    return copy

  def alu(self, op: Ops, *src: UPat) -> UPat:
    operands = [self, *src]
    return UPat(op, src=operands if op in GroupOp.Commutative else tuple(operands))

  def const_like(self, value: Any) -> UPat:
    return UPat.const(self.dtype, value)

  # *** matching ***

  def match(self, node: UOp, store: dict[str, UOp]) -> list[dict[str, UOp]]:
    """Every way this pattern matches `node`, each as the captures made (extending `store`)."""
    if self.op is not None and node.op not in self.op: return []
    if self.dtype is not None and node.dtype not in self.dtype and node.dtype.scalar not in self.dtype: return []
    if self.arg is not _ANY_ARG and not _args_equal(self.arg, node.arg): return []
    if self.name is not None:
      if self.name in store:
        if store[self.name] is not node: return []
      else:
        store = {**store, self.name: node}
    if self.src is None: return [store]
    if isinstance(self.src, UPat): return _match_sources((self.src,) * len(node.src), node.src, store)
    results: list[dict[str, UOp]] = []
    for order in self._orders:
      if len(order) != len(node.src) and not (self.allow_any_len and len(order) <= len(node.src)): continue
      results.extend(_match_sources(order, node.src, store))
    return results

  def __repr__(self) -> str:
    ops = "any" if self.op is None else "|".join(sorted(op.name for op in self.op))
    name = f" name={self.name}" if self.name else ""
    return f"UPat({ops}{name})"


class _AnyOf(UPat):
  """Matches when any of its alternatives matches."""

  def __init__(self, alternatives: tuple[UPat, ...]):
    super().__init__()
    self.alternatives = alternatives
    ops = [alt.op for alt in alternatives]
    self.op = None if any(op is None for op in ops) else frozenset().union(*ops)

  def match(self, node: UOp, store: dict[str, UOp]) -> list[dict[str, UOp]]:
    results = [found for alt in self.alternatives for found in alt.match(node, store)]
    if self.name is not None: results = [r | {self.name: node} for r in results if r.get(self.name, node) is node]
    return results


def _args_equal(pattern_arg: Any, node_arg: Any) -> bool:
  # True == 1 in Python, but a pattern for the constant 1 must not match the boolean True; 1 does match 1.0
  if type(pattern_arg) in (int, float) and type(node_arg) in (int, float): return pattern_arg == node_arg
  return type(pattern_arg) is type(node_arg) and pattern_arg == node_arg


def _match_sources(patterns: tuple[UPat, ...], sources: tuple[UOp, ...], store: dict) -> list[dict]:
  stores = [store]
  for pattern, source in zip(patterns, sources):
    stores = [found for current in stores for found in pattern.match(source, current)]
    if not stores: break
  return stores


def _unique_permutations(patterns: list[UPat]) -> list[tuple[UPat, ...]]:
  seen: dict[tuple[int, ...], tuple[UPat, ...]] = {}
  for order in itertools.permutations(patterns):
    seen.setdefault(tuple(id(p) for p in order), order)
  return list(seen.values())


# *** rule sets ***

@dataclass(frozen=True)
class Rule:
  pattern: UPat
  function: Callable[..., Any]
  wants_ctx: bool

  @property
  def location(self) -> str:
    code = self.function.__code__
    return f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno}"


class PatternMatcher:
  """An ordered list of (pattern, function) rules. `rewrite(node)` returns the first non-None result of a rule
  whose pattern matches. Rules are indexed by the op at the pattern's root, so matching a node only tries the
  rules that can match its op."""

  def __init__(self, rules: list[tuple[UPat, Callable[..., Any]]]):
    self.rules = [Rule(pattern, function, "ctx" in inspect.signature(function).parameters)
                  for pattern, function in rules]
    self.by_op: dict[Ops, list[Rule]] = {op: [] for op in Ops}
    for rule in self.rules:
      for op in (rule.pattern.op if rule.pattern.op is not None else Ops):
        self.by_op[op].append(rule)

  def __add__(self, other: PatternMatcher) -> PatternMatcher:
    return PatternMatcher([(r.pattern, r.function) for r in self.rules + other.rules])

  def rewrite(self, node: UOp, ctx: Any = None) -> UOp | Revisit | None:
    return self.rewrite_traced(node, ctx)[0]

  def rewrite_traced(self, node: UOp, ctx: Any = None) -> tuple[UOp | Revisit | None, Rule | None]:
    for rule in self.by_op[node.op]:
      for captures in rule.pattern.match(node, {}):
        result = rule.function(ctx=ctx, **captures) if rule.wants_ctx else rule.function(**captures)
        if result is not None and result is not node: return result, rule
    return None, None


# *** graph rewriting ***

@dataclass(frozen=True)
class RewriteStep:
  """One rule firing, kept when TRACK_REWRITES=1 for the debugger."""
  pass_name: str
  rule: str
  before: UOp
  after: UOp


REWRITE_TRACE: list[RewriteStep] = []
MAX_REWRITES_PER_NODE = 10_000
# rules that keep producing new nodes (x -> f(x + 1)) never converge without ever rewriting one node in place
# 10,000 times; a whole rewrite firing this many rules per node of its input is taken to be such a loop
MAX_REWRITES_PER_INPUT_NODE = 1_000


class _Rewriter:
  """The work-list machine behind graph_rewrite. Work items are (node, stage, current):
  stage 0 visits a node, 1 continues once the sources of `current` are done, 2 finishes a node whose rules turned it
  into `current`, 3 retries a node whose rule asked to be revisited."""

  def __init__(self, matcher: PatternMatcher, ctx: Any, bottom_up: bool, name: str, cache: RewriteCache | None):
    self.matcher, self.ctx, self.bottom_up, self.name = matcher, ctx, bottom_up, name
    self.memo = cache.results if cache is not None else None
    self.replaced: dict[UOp, UOp] = {}
    self.in_progress: set[UOp] = set()
    self.deferred: set[UOp] = set()        # nodes with a work item waiting for a later round
    self.asked_revisit: list[UOp] = []     # nodes whose own rule returned REVISIT this round
    self.tracing = bool(TRACK_REWRITES)

  def rules_to_fixed_point(self, node: UOp) -> UOp | Revisit:
    for _ in range(MAX_REWRITES_PER_NODE):
      result, rule = self.matcher.rewrite_traced(node, self.ctx)
      if result is None: return node
      if result is REVISIT: return REVISIT
      if not isinstance(result, UOp):
        raise RewriteError(f"{self.name}: rule at {rule.location} returned {type(result).__name__}, not a UOp")
      self.fired += 1
      if self.fired > MAX_REWRITES_PER_INPUT_NODE and self.fired > self.budget():
        raise RewriteError(f"{self.name}: rules fired {self.fired} times on a graph of {len(self.root.toposort)} "
                           f"nodes without converging (last at {rule.location}, making a {result.op})")
      if self.tracing: REWRITE_TRACE.append(RewriteStep(self.name, rule.location, node, result))
      node = result
    raise RewriteError(f"{self.name}: rules do not converge at {node.op} after {MAX_REWRITES_PER_NODE} rewrites")

  def budget(self) -> int:
    # only asked once the rules fired more often than any graph allows: walking every input to count its nodes made
    # a third of the cost of simplifying small index expressions
    return MAX_REWRITES_PER_INPUT_NODE * len(self.root.toposort)

  def run(self, root: UOp) -> UOp:
    self.root, self.fired = root, 0
    stack: list[tuple[UOp, int, UOp | None]] = [(root, 0, None)]
    rounds_without_progress = 0
    while True:
      finished_before = len(self.replaced)
      self.asked_revisit = []
      waiting = self.drain(stack)
      if root in self.replaced: return self.replaced[root]
      rounds_without_progress = 0 if len(self.replaced) > finished_before else rounds_without_progress + 1
      # a rule may change the context without finishing a node, so only a second idle round proves it is stuck
      if rounds_without_progress >= 2: raise RewriteStuck(self.asked_revisit or [w[0] for w in waiting], self.name)
      # items deferred first (children) are retried first
      stack = list(reversed(waiting))

  def drain(self, stack: list[tuple[UOp, int, UOp | None]]) -> list[tuple[UOp, int, UOp | None]]:
    """Process the stack until it is empty; return the items that must wait for a later round."""
    waiting: list[tuple[UOp, int, UOp | None]] = []
    while stack:
      item = stack.pop()
      node, stage, current = item
      # a new visit (stage 0) of a node whose item is waiting must not clear the mark, or it looks like a cycle
      if stage != 0: self.deferred.discard(node)
      if node in self.replaced: continue
      if stage == 0 and self.memo is not None and (known := self._remembered(node)) is not None:
        self.replaced[node] = known
        continue
      if stage == 0:
        if node in self.in_progress:
          if node in self.deferred: continue
          raise RewriteError(f"{self.name}: a rule rewrote a node into a graph that contains it again ({node.op}); "
                             "this rewrite would never finish")
        self.in_progress.add(node)
        self.begin(node, stack, waiting)
      elif stage == 3: self.begin(node, stack, waiting)
      elif stage == 1: self.after_sources(item, stack, waiting)
      elif current in self.replaced: self.finish(node, self.replaced[current])
      else: self.wait(item, waiting)
    return waiting

  def begin(self, node: UOp, stack: list, waiting: list) -> None:
    if not self.bottom_up:
      stack.append((node, 1, node))
      stack.extend((source, 0, None) for source in reversed(node.src) if source not in self.replaced)
      return
    result = self.rules_to_fixed_point(node)
    if result is REVISIT:
      self.asked_revisit.append(node)
      self.wait((node, 3, None), waiting)
      return
    stack.append((node, 1, result))
    stack.extend((source, 0, None) for source in reversed(result.src) if source not in self.replaced)

  def after_sources(self, item: tuple, stack: list, waiting: list) -> None:
    node, _, current = item
    if any(source not in self.replaced for source in current.src):
      self.wait(item, waiting)
      return
    new_sources = tuple(self.replaced[source] for source in current.src)
    rebuilt = current if all(a is b for a, b in zip(new_sources, current.src)) else current.replace(src=new_sources)
    if self.bottom_up:
      # the node's own rules already ran; new sources may let them fire again
      if rebuilt is current: self.finish(node, current)
      else: self.continue_with(node, rebuilt, stack)
      return
    result = self.rules_to_fixed_point(rebuilt)
    if result is REVISIT:
      self.asked_revisit.append(node)
      self.wait(item, waiting)
    elif result is rebuilt: self.finish(node, rebuilt)
    else: self.continue_with(node, result, stack)

  def continue_with(self, node: UOp, result: UOp, stack: list) -> None:
    """`node` became `result`, which must itself be rewritten (its sources may be new)."""
    if result in self.replaced:
      self.finish(node, self.replaced[result])
      return
    stack.append((node, 2, result))
    stack.append((result, 0, None))

  def wait(self, item: tuple, waiting: list) -> None:
    self.deferred.add(item[0])
    waiting.append(item)

  def finish(self, node: UOp, result: UOp) -> None:
    self.replaced[node] = result
    self.in_progress.discard(node)
    # results are held weakly too: a strong value could keep another entry's key (and so a whole graph) alive
    if self.memo is not None: self.memo[node] = _SAME if result is node else weakref.ref(result)

  def _remembered(self, node: UOp) -> UOp | None:
    known = self.memo.get(node)
    if known is None or known is _SAME: return None if known is None else node
    return known()


class RewriteCache:
  """Results of a matcher whose rules need no context, kept across graph_rewrite calls: a node rewritten once is
  looked up afterwards. Entries are weak: they go when their node does."""

  def __init__(self) -> None:
    self.results: weakref.WeakKeyDictionary[UOp, Any] = weakref.WeakKeyDictionary()


_SAME = object()  # memo value for "this node is already at its fixed point"


def graph_rewrite(root: UOp, matcher: PatternMatcher, ctx: Any = None, bottom_up: bool = False,
                  name: str | None = None, cache: RewriteCache | None = None) -> UOp:
  """Rewrite the graph under `root` until no rule matches anywhere.

  Default order: a node's sources are rewritten first, then the node (rebuilt on the new sources) is rewritten
  until no rule matches; a rule's result is itself rewritten the same way. With bottom_up=True a node's rules run
  before its sources are visited (they see the original sources), then its result's sources are rewritten.
  A rule may return REVISIT to be asked again after the rest of the graph; if a whole round makes no progress,
  RewriteStuck names the waiting nodes. Shared subgraphs are rewritten once; with a `cache`, across calls too (only
  for matchers whose rules use no ctx)."""
  if cache is not None and ctx is not None: raise ValueError("a rewrite cache is only valid without a context")
  return _Rewriter(matcher, ctx, bottom_up, name or "graph_rewrite", cache).run(root)


def substitute(root: UOp, mapping: dict[UOp, UOp], order: dict[UOp, None] | None = None) -> UOp:
  """Replace each occurrence of a key of `mapping` by its value, once (replacements are not searched again). `order`
  is root's toposort where the caller has it (walked without caching it on root)."""
  if not mapping: return root
  new: dict[UOp, UOp] = {}
  for node in root.toposort if order is None else order:
    if node in mapping:
      new[node] = mapping[node]
      continue
    sources = tuple(new[source] for source in node.src)
    new[node] = node if all(a is b for a, b in zip(sources, node.src)) else node.replace(src=sources)
  return new[root]


def iter_matches(pattern: UPat, root: UOp) -> Iterator[tuple[UOp, dict[str, UOp]]]:
  """Every node under root that the pattern matches, with its first capture set."""
  for node in root.toposort:
    if found := pattern.match(node, {}): yield node, found[0]


__all__ = ["UPat", "PatternMatcher", "RewriteCache", "graph_rewrite", "substitute", "REVISIT", "RewriteError",
           "RewriteStuck", "REWRITE_TRACE", "RewriteStep", "iter_matches", "dtypes"]
