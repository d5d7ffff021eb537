"""The library's modules import each other without cycles (also counting imports inside
functions), so every module can be imported, and reasoned about, on its own."""
import ast
import os

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    "routing_transformer")


def module_name(path):
  rel = os.path.relpath(path, os.path.dirname(ROOT))[:-len(".py")].replace(os.sep, ".")
  return rel[:-len(".__init__")] if rel.endswith(".__init__") else rel


def imported_modules(path, known):
  """The project modules a file imports anywhere (module level or inside functions)."""
  found = set()
  for node in ast.walk(ast.parse(open(path).read())):
    if isinstance(node, ast.Import):
      names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      names = [node.module] + ["%s.%s" % (node.module, alias.name) for alias in node.names]
    else:
      continue
    found.update(n for n in names if n in known)
  return found


def import_graph():
  paths = [os.path.join(d, f) for d, _, files in os.walk(ROOT) for f in files
           if f.endswith(".py")]
  known = {module_name(p) for p in paths}
  return {module_name(p): imported_modules(p, known) - {module_name(p)} for p in paths}


def find_cycle(graph):
  """One import cycle as a list of modules [a, b, ..., a], or None."""
  state = {}

  def visit(node, stack):
    state[node] = "open"
    for nxt in sorted(graph.get(node, ())):
      if state.get(nxt) == "open":
        return stack[stack.index(nxt):] + [nxt]
      if nxt not in state:
        cycle = visit(nxt, stack + [nxt])
        if cycle:
          return cycle
    state[node] = "done"
    return None

  for start in sorted(graph):
    if start not in state:
      cycle = visit(start, [start])
      if cycle:
        return cycle
  return None


def test_find_cycle_reports_a_cycle():
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
  assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles():
  graph = import_graph()
  assert "routing_transformer.t2t.model" in graph and "routing_transformer.tools.checkpoints" in graph
  assert "routing_transformer.t2t.model" in graph["routing_transformer.tools.checkpoints"]
  # A package imports its submodules (attention/__init__); that is not a cycle.
  graph = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in graph.items()}
  assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


LAYERS = ("routing_transformer.core", "routing_transformer.t2t", "routing_transformer.tools")


def layer_of(module):
  return next((i for i, p in enumerate(LAYERS) if module == p or module.startswith(p + ".")), None)


def upward_imports(graph):
  """[(importer, imported)] where a lower layer imports a higher one (core < t2t < tools)."""
  return sorted((m, d) for m, deps in graph.items() for d in deps
                if layer_of(m) is not None and layer_of(d) is not None and layer_of(d) > layer_of(m))


def test_upward_imports_are_found():
  fake = {"routing_transformer.core.layers": {"routing_transformer.t2t.model"},
          "routing_transformer.tools.score": {"routing_transformer.core.layers"}}
  assert upward_imports(fake) == [("routing_transformer.core.layers", "routing_transformer.t2t.model")]


def test_imports_point_from_tools_to_t2t_to_core():
  graph = import_graph()
  assert {layer_of(m) for m in graph} >= {0, 1, 2}
  assert upward_imports(graph) == []


def test_old_module_paths_forward_to_the_new_ones():
  import importlib  # pylint: disable=g-import-not-at-top
  import routing_transformer  # pylint: disable=g-import-not-at-top,unused-import
  from routing_transformer import _moved  # pylint: disable=g-import-not-at-top
  assert _moved.new_name("routing_transformer.tools.probes.errors") is None
  for old, new in (("routing_transformer.probes.errors", "routing_transformer.tools.probes.errors"),
                   ("routing_transformer.perplexity", "routing_transformer.t2t.perplexity")):
    assert _moved.new_name(old) == new
    assert importlib.import_module(old) is importlib.import_module(new)
  for old, new in _moved.MOVED.items():
    path = os.path.join(ROOT, *new.split("."))
    assert os.path.isdir(path) or os.path.isfile(path + ".py"), old
