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


CLEAN_IMPORT = r"""
import json, sys
import tensorflow as tf
tf.keras.layers.Layer  # TensorFlow's and Keras' own import-time finders first
before = {"meta_path": [type(f).__name__ for f in sys.meta_path], "excepthook": sys.excepthook}
from tensorflow.python.framework import ops
attributes = {name: getattr(ops, name, None) for name in
              ("Tensor", "IndexedSlices", "register_tensor_conversion_function")}
import routing_transformer
import routing_transformer.core.attention
import routing_transformer.core.layers
import routing_transformer.core.decoding
import routing_transformer.core.health
import routing_transformer.core.keras
print(json.dumps({
    "tensor2tensor": sorted(m for m in sys.modules if m.split(".")[0] == "tensor2tensor"),
    "patches_module": "routing_transformer.t2t.patches" in sys.modules,
    "t2t_modules": sorted(m for m in sys.modules if m.startswith("routing_transformer.t2t")),
    "ops_unchanged": all(getattr(ops, n, None) is v for n, v in attributes.items()),
    "ops_aliases": sorted(n for n in attributes if getattr(ops, n, None) is not None),
    "meta_path_unchanged": [type(f).__name__ for f in sys.meta_path] == before["meta_path"],
    "excepthook_unchanged": sys.excepthook is before["excepthook"],
}))
"""


def test_importing_the_package_and_the_core_changes_nothing_outside_it():
  """`import routing_transformer` and the core's modules load no tensor2tensor module and leave
  TensorFlow, sys.meta_path and sys.excepthook as they were (the patches of T2T/TF are applied
  only by routing_transformer.t2t.patches.install())."""
  import json  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  root = os.path.dirname(ROOT)
  run = subprocess.run([sys.executable, "-c", CLEAN_IMPORT], capture_output=True, text=True,
                       cwd=root, env=dict(os.environ, PYTHONPATH=root, TF_CPP_MIN_LOG_LEVEL="3"),
                       timeout=300)
  assert run.returncode == 0, run.stderr[-3000:]
  found = json.loads(run.stdout.strip().splitlines()[-1])
  assert found["tensor2tensor"] == []
  assert not found["patches_module"] and found["t2t_modules"] == []
  assert found["ops_unchanged"] and found["ops_aliases"] == []  # TF 2.15: the aliases are gone
  assert found["meta_path_unchanged"] and found["excepthook_unchanged"]


def test_the_core_imports_nothing_of_tensor2tensor():
  """No module of routing_transformer/core names tensor2tensor in an import (also inside
  functions)."""
  import ast  # pylint: disable=g-import-not-at-top,redefined-outer-name,reimported
  core = os.path.join(ROOT, "core")
  found = []
  for folder, _, files in os.walk(core):
    for name in files:
      if not name.endswith(".py"):
        continue
      path = os.path.join(folder, name)
      for node in ast.walk(ast.parse(open(path).read())):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        found += ["%s: %s" % (os.path.relpath(path, ROOT), n) for n in names
                  if n.split(".")[0] == "tensor2tensor"]
  assert found == []


def test_the_cores_gelu_is_t2ts_bit_for_bit():
  """layers.gelu (the core's own, for GEGLU) gives Tensor2Tensor's common_layers.gelu values
  exactly, in float32 and bfloat16, and the same gradients."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensor2tensor.layers import common_layers  # pylint: disable=g-import-not-at-top
  from routing_transformer.core import layers  # pylint: disable=g-import-not-at-top
  x = np.concatenate([np.linspace(-12.0, 12.0, 4001),
                      np.random.default_rng(0).standard_normal(4000) * 3.0]).astype(np.float32)
  for dtype in (tf.float32, tf.bfloat16):
    t = tf.cast(tf.constant(x), dtype)
    with tf.GradientTape(persistent=True) as tape:
      tape.watch(t)
      ours, theirs = layers.gelu(t), common_layers.gelu(t)
    np.testing.assert_array_equal(tf.cast(ours, tf.float32).numpy(),
                                  tf.cast(theirs, tf.float32).numpy())
    np.testing.assert_array_equal(tf.cast(tape.gradient(ours, t), tf.float32).numpy(),
                                  tf.cast(tape.gradient(theirs, t), tf.float32).numpy())
