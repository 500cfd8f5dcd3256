"""The import graph of rawgrad: no cycles, and every layer imports only itself and the layers below it.

The graph is read from the source (module- and function-level imports, relative ones resolved), so an import that
runs only in a rarely taken branch counts too. Imports under `if TYPE_CHECKING:` never run and only name types for
annotations; they are left out. rawgrad/autogen is generated code and only imported.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "rawgrad"

# lowest first; a module may import modules of its own layer and of the layers before it
LAYERS: list[tuple[str, ...]] = [
  ("rawgrad.dtype", "rawgrad.helpers", "rawgrad.errors", "rawgrad.autogen"),
  ("rawgrad.compiler",),
  ("rawgrad.runtime",),
  ("rawgrad.drivers",),   # the runtime's device registry loads them by name; they implement its interfaces
  ("rawgrad.engine",),
  ("rawgrad.tensor_ops",),
  ("rawgrad.tensor",),
  ("rawgrad.nn", "rawgrad.tensor_jit"),
  ("rawgrad", "rawgrad.tools"),  # the public names (loaded on first use) and the command-line tools
]


def _module_name(path: Path) -> str:
  parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> dict[str, Path]:
  return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py")) if "autogen" not in path.parts}


MODULES = _sources()


def _is_type_checking(node: ast.If) -> bool:
  test = node.test
  return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
         (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
  """Every import statement at any depth, except the bodies of `if TYPE_CHECKING:`."""
  found: list[ast.Import | ast.ImportFrom] = []
  pending = [tree]
  while pending:
    node = pending.pop()
    if isinstance(node, (ast.Import, ast.ImportFrom)): found.append(node)
    if isinstance(node, ast.If) and _is_type_checking(node):
      pending.extend(node.orelse)
      continue
    pending.extend(ast.iter_child_nodes(node))
  return sorted(found, key=lambda node: node.lineno)


def _known(name: str) -> str | None:
  """The rawgrad module (or package) that importing `name` runs: the longest prefix of it that is a module."""
  parts = name.split(".")
  while parts:
    candidate = ".".join(parts)
    if candidate in MODULES or candidate.startswith("rawgrad.autogen"): return candidate
    parts.pop()
  return None


def _imported(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
  if isinstance(node, ast.Import): names = [alias.name for alias in node.names]
  else:
    if node.level:
      package = module.split(".") if MODULES[module].name == "__init__.py" else module.split(".")[:-1]
      base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
    else:
      base = node.module or ""
    # `from package import name` imports the submodule package.name when there is one
    names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
  return [target for name in names if name.split(".")[0] == "rawgrad" and (target := _known(name)) is not None]


def import_graph() -> dict[str, dict[str, int]]:
  """module -> {imported module: line of the first import of it}."""
  graph: dict[str, dict[str, int]] = {}
  for module, path in MODULES.items():
    edges: dict[str, int] = {}
    for node in _import_nodes(ast.parse(path.read_text(), str(path))):
      for target in _imported(module, node):
        if target != module: edges.setdefault(target, node.lineno)
    graph[module] = edges
  return graph


GRAPH = import_graph()


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
  """One import cycle as [a, b, ..., a], or None."""
  state: dict[str, str] = {}  # "active" while on the current path, "done" once every path from it is explored
  for start in sorted(graph):
    if start in state: continue
    path, iterators = [start], [iter(sorted(graph[start]))]
    state[start] = "active"
    while path:
      target = next(iterators[-1], None)
      if target is None:
        state[path.pop()] = "done"
        iterators.pop()
      elif state.get(target) == "active":
        return path[path.index(target):] + [target]
      elif target not in state and target in graph:
        state[target] = "active"
        path.append(target)
        iterators.append(iter(sorted(graph[target])))
  return None


def layer_of(module: str) -> int:
  matches = [(len(prefix), index) for index, layer in enumerate(LAYERS) for prefix in layer
             if module == prefix or module.startswith(prefix + ".")]
  if not matches: raise AssertionError(f"{module} belongs to no layer of LAYERS; add it to one")
  return max(matches)[1]


def layering_violations(graph: dict[str, dict[str, int]]) -> list[str]:
  return [f"{module} (line {line}) imports {target}: {'/'.join(LAYERS[layer_of(target)])} is above "
          f"{'/'.join(LAYERS[layer_of(module)])}"
          for module, edges in sorted(graph.items()) for target, line in sorted(edges.items())
          if layer_of(target) > layer_of(module)]


# *** the checks on the graph itself ***

def test_graph_sees_module_and_function_level_imports() -> None:
  assert "rawgrad.compiler.ir" in GRAPH["rawgrad.compiler.symbolic"]
  assert "rawgrad.tensor" in GRAPH["rawgrad.nn"]
  relative = ast.parse("def f():\n  from . import ir\n  from .codegen.opt import kernel\n")
  assert [t for n in _import_nodes(relative) for t in _imported("rawgrad.compiler.symbolic", n)] == \
         ["rawgrad.compiler.ir", "rawgrad.compiler.codegen.opt.kernel"]
  skipped = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n  import rawgrad.tensor\nelse:\n"
                      "  import rawgrad.dtype\n")
  assert [t for n in _import_nodes(skipped) for t in _imported("rawgrad.compiler.ir", n)] == ["rawgrad.dtype"]


def test_find_cycle_names_the_cycle() -> None:
  graph = {"a": {"b": 1}, "b": {"c": 1}, "c": {"b": 1}, "d": {}}
  assert find_cycle(graph) == ["b", "c", "b"]
  assert find_cycle({"a": {"b": 1}, "b": {}}) is None


def test_layer_of_takes_the_longest_prefix() -> None:
  assert layer_of("rawgrad.tensor_ops.shape") == 5 and layer_of("rawgrad.tensor") == 6
  assert layer_of("rawgrad") == len(LAYERS) - 1
  assert layering_violations({"rawgrad.runtime.device": {"rawgrad.engine.jit": 3}}) == \
         ["rawgrad.runtime.device (line 3) imports rawgrad.engine.jit: rawgrad.engine is above rawgrad.runtime"]


# *** the rules ***

def test_no_import_cycles() -> None:
  cycle = find_cycle(GRAPH)
  assert cycle is None, "import cycle: " + ", ".join(
    f"{module} imports {after} (line {GRAPH[module][after]})" for module, after in zip(cycle, cycle[1:]))


def test_every_module_imports_only_its_layer_and_those_below() -> None:
  assert layering_violations(GRAPH) == []


def _forbidden_above(package: str) -> list[str]:
  layer = layer_of(package)
  return [prefix for above in LAYERS[layer + 1:] for prefix in above if prefix != "rawgrad"]


@pytest.mark.parametrize("package", ["rawgrad.compiler", "rawgrad.runtime", "rawgrad.engine"])
def test_importing_a_layer_loads_nothing_above_it(package: str) -> None:
  """What really runs, importlib included: importing every module of the layer loads no module of a layer above."""
  modules = sorted(module for module in MODULES if module == package or module.startswith(package + "."))
  forbidden = _forbidden_above(package)
  script = (f"import importlib, sys\nfor name in {modules!r}: importlib.import_module(name)\n"
            f"print('\\n'.join(sorted(m for m in sys.modules if m.startswith({tuple(forbidden)!r}))))")
  result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=PACKAGE.parent,
                          timeout=120)
  assert result.returncode == 0, result.stderr
  assert result.stdout.split() == [], f"importing {package} loaded modules of the layers above it"


def test_import_rawgrad_compiler_alone() -> None:
  script = "import rawgrad.compiler, sys; print(sorted(m for m in sys.modules if m.startswith('rawgrad')))"
  result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=PACKAGE.parent,
                          timeout=120)
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == "['rawgrad', 'rawgrad.compiler']"


def test_the_public_names_load_on_first_use() -> None:
  script = ("import sys, rawgrad\nassert not [m for m in sys.modules if m.startswith('rawgrad.')], sys.modules\n"
            "from rawgrad import *\nimport rawgrad.tensor_jit\n"
            "assert Tensor is rawgrad.tensor.Tensor and jit is rawgrad.tensor_jit.jit and rawgrad.jit is jit\n"
            "assert set(rawgrad.__all__) <= set(dir(rawgrad))\n"
            "try:\n  rawgrad.Tensr\nexcept AttributeError as e:\n  print(e)\n")
  result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=PACKAGE.parent,
                          timeout=120)
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == "module 'rawgrad' has no attribute 'Tensr'"
