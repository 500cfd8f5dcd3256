"""Schedules remembered by the shape of the graph, so a repeated eager computation skips the scheduler.

Two realizes whose tensor graphs differ only in the buffers they read and in the values bound to variables (a random
draw's number, a symbolic size) get the same kernels. The key is the graph's nodes in toposort order (or a digest of
them), each by op, dtype, argument and its sources' positions, with the holes left out: which buffer a BUFFER node
names (its UNIQUE) and the value a BIND carries. A template keeps the first schedule with placeholders for the holes;
a hit fills them from the new graph: its buffers at the same positions, fresh buffers for the ones the schedule
creates, and the bound values its BIND nodes carry now.

Nothing else the scheduler reads may differ between graphs of one key: its decisions depend on the graph alone.
"""
from __future__ import annotations

import hashlib
import operator
import pickle
from dataclasses import dataclass
from typing import Callable

from rawgrad.compiler.ir import BOUND, Ops, UOp
from rawgrad.compiler.rangeify import Schedule, ScheduleItem, create_schedule
from rawgrad.compiler.rewrite import substitute
from rawgrad.helpers import LRUCache, getenv, unique_id

SCHEDULE_CACHE_SIZE = getenv("SCHEDULE_CACHE", 512)  # 0 turns the cache off
LARGE_GRAPH = 256  # nodes: a larger graph is keyed by a digest of its structure
_op_of = operator.attrgetter("op")


@dataclass(frozen=True)
class _Template:
  key: tuple | bytes                       # the structure it was made for (the cache is keyed by its hash)
  items: tuple[ScheduleItem, ...]          # buffers are placeholders; var_values hold the first graph's values
  bound_at: tuple[tuple[tuple[UOp, int], ...], ...]  # per item: (variable, position of the BIND it takes its value)
  inputs: tuple[tuple[int, UOp], ...]      # (position in the graph, placeholder) of each buffer the graph names
  fresh: tuple[UOp, ...]                   # placeholders of the buffers the schedule creates
  becomes: tuple[tuple[int, UOp], ...]     # (position of a node, its view in placeholders)


# keyed by the structure key's hash, computed once per lookup (a tuple's is not cached, and a dict lookup and the
# LRU's move each hash their key); a template made for another key of the same hash is a miss
_templates: LRUCache[int, _Template] = LRUCache(max(SCHEDULE_CACHE_SIZE, 1))
RECENT_GRAPHS = 4  # graphs whose nodes and structure key are kept (with the buffers they hold)
_recent_graphs: LRUCache[UOp, tuple[list[UOp], tuple | bytes | None, int | None]] = LRUCache(RECENT_GRAPHS)
stats = {"hits": 0, "misses": 0}


def cached_schedule(outputs: list[UOp], on_kernel: Callable[[ScheduleItem], None] | None = None) -> Schedule:
  """create_schedule(outputs, on_kernel), from a template when a graph of the same shape was scheduled before (then
  no kernel is built, and on_kernel is not called)."""
  if SCHEDULE_CACHE_SIZE <= 0: return create_schedule(outputs, on_kernel)
  graph = UOp.sink(*outputs)
  # a graph's nodes and key are functions of the graph alone: the last few graphs' are kept, for a realize of the same
  # graph again. Not on the root, as they were: a toposort holds its root, and that cycle kept every graph's buffers
  # (inputs made from data, the graphs realized outputs had) alive until the garbage collector ran: each Tensor(data)
  # of a loop was fresh memory, page faulted in as it was written (16 MB: 34 ms where 3 do)
  if (known := _recent_graphs.get(graph)) is None:
    nodes = list(graph.toposort)
    del graph.__dict__["toposort"]
    key = _structure_key(nodes)
    known = _recent_graphs.put(graph, (nodes, key, None if key is None else hash(key)))
  nodes, key, key_hash = known
  if key is None: return create_schedule(outputs, on_kernel)
  if (template := _templates.get(key_hash)) is not None and template.key == key:
    stats["hits"] += 1
    return _fill(template, nodes)
  stats["misses"] += 1
  schedule = create_schedule(outputs, on_kernel)
  if (template := _make_template(key, schedule, nodes)) is not None: _templates.put(key_hash, template)
  return schedule


def _structure_key(nodes: list[UOp]) -> tuple | bytes | None:
  """The graph with its holes left out (UOp.local_key), as a tuple (a digest of it for a large graph, whose tuple
  would cost more memory than its schedule); None where a bound value's node is also used as a value elsewhere (its
  value would be both a hole and part of the shape)."""
  position = {node: i for i, node in enumerate(nodes)}.__getitem__
  parts = tuple([(node.local_key, tuple(map(position, node.src))) for node in nodes])
  if Ops.BIND in map(_op_of, nodes):
    for node in nodes:
      if node.op is not Ops.BIND and any(source.tag == BOUND for source in node.src): return None
  if len(parts) <= LARGE_GRAPH: return parts
  return hashlib.blake2b(pickle.dumps(parts), digest_size=16).digest()


def _placeholder(buffer: UOp) -> UOp:
  return buffer.replace(src=(UOp(Ops.UNIQUE, arg=("placeholder", unique_id())), *buffer.src[1:]))


def _make_template(key: tuple | bytes, schedule: Schedule, nodes: list[UOp]) -> _Template | None:
  position = {node: i for i, node in enumerate(nodes)}
  inputs = {node: _placeholder(node) for node in nodes if node.op is Ops.BUFFER}
  fresh: dict[UOp, UOp] = {}
  items, bound_at = [], []
  for item in schedule.items:
    for buffer in item.buffers:
      if buffer not in inputs and buffer not in fresh: fresh[buffer] = _placeholder(buffer)
    if any(bind not in position for _, bind in item.binds): return None
    placeholders = {**inputs, **fresh}
    items.append(ScheduleItem(item.ast, tuple(placeholders[b] for b in item.buffers), item.var_values, item.dims,
                              item.operations, outputs=item.outputs))
    bound_at.append(tuple((variable, position[bind]) for variable, bind in item.binds))
  placeholders = {**inputs, **fresh}
  becomes = []
  for node, view in schedule.becomes_map.items():
    if node not in position: continue  # a node of the cleaned graph only: no tensor holds it
    # a view with a symbolic size (a BIND) is not kept: its value would be a hole too
    order = view.walked()   # not cached on the view: a toposort holds its node, a cycle that keeps the buffer
    if any(leaf not in placeholders for leaf in order if leaf.op in (Ops.BUFFER, Ops.BIND)): return None
    becomes.append((position[node], substitute(view, placeholders, order)))
  named = tuple((position[node], placeholder) for node, placeholder in inputs.items())
  return _Template(key, tuple(items), tuple(bound_at), named, tuple(fresh.values()), tuple(becomes))


def _fill(template: _Template, nodes: list[UOp]) -> Schedule:
  """The template's schedule for this graph: its buffers, fresh buffers for the created ones, its bound values."""
  buffers = {placeholder: nodes[i] for i, placeholder in template.inputs}
  for placeholder in template.fresh:
    buffers[placeholder] = UOp(Ops.BUFFER, placeholder.dtype, (UOp(Ops.UNIQUE, arg=unique_id()), placeholder.src[1]),
                               placeholder.arg)
  items = []
  for item, bound_at in zip(template.items, template.bound_at):
    var_values = item.var_values
    if bound_at:
      values = dict(var_values)
      for variable, i in bound_at: values[variable] = nodes[i].src[1].arg
      var_values = tuple(values.items())
    items.append(ScheduleItem(item.ast, tuple(buffers[b] for b in item.buffers), var_values, item.dims,
                              item.operations, tuple((variable, nodes[i]) for variable, i in bound_at), item.outputs))
  becomes = {nodes[i]: buffers.get(view) or substitute(view, buffers) for i, view in template.becomes}
  return Schedule(items, becomes)
