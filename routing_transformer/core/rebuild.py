"""Tensors the backward pass rebuilds instead of keeping.

A tensor y = fn(*inputs) that is cheap to compute again from tensors the backward pass keeps
anyway (a LayerNorm's output from its input, which the norm's own gradient keeps; head_dense's
output from the heads, which head_dense's kernel gradient keeps) is marked `rebuildable`. A custom
gradient that reads its input x only for a product such as a kernel gradient x^T dy reads
`for_gradient(x, dy)` instead: x itself, or for a rebuildable x, fn re-run on its inputs once dy
has arrived (one re-run per graph, shared by every gradient that asks). The re-run runs the same
ops on the same values, so the gradients are the same bits, and y lives only in the forward pass
([b, n, hidden] per norm and block at bench-8k and PG-19).

Graph mode only (tf.compat.v1 graphs, tf.function): eagerly, a custom gradient holds its inputs
in Python anyway and nothing is marked. Nothing is marked either inside `off()`: a block's replay
(`recompute.recompute_block`) already runs in the backward pass, where rebuilding would only
compute its norms twice.
"""
import contextlib
import weakref

import tensorflow as tf

_RECIPES = weakref.WeakKeyDictionary()  # graph of y -> {y.ref(): (fn, inputs)}
_REBUILT = weakref.WeakKeyDictionary()  # graph the re-run is built in -> {y.ref(): re-run y}
_OFF = []


@contextlib.contextmanager
def off():
  """Within this context `rebuildable` marks nothing (a replay in the backward pass)."""
  _OFF.append(True)
  try:
    yield
  finally:
    _OFF.pop()


def _graph_mode(t):
  return not tf.executing_eagerly() and hasattr(t, "graph")


def rebuildable(y, fn, *inputs):
  """Marks y, which equals fn(*inputs) (the same ops on the same tensors), as rebuildable by
  `for_gradient`; fn must be pure (no variables created, no random numbers). Returns y."""
  if not _OFF and _graph_mode(y):
    _RECIPES.setdefault(y.graph, {})[y.ref()] = (fn, inputs)
  return y


def is_rebuildable(t):
  """Whether `for_gradient` would rebuild t."""
  return _graph_mode(t) and t.ref() in _RECIPES.get(t.graph, {})


def after(dy, *tensors):
  """Identities of `tensors` that run only once the incoming gradient dy exists: what a backward
  pass recomputes from them then runs in the backward pass. Without the wait nothing orders such
  a recomputation after the forward pass, and TF's executor runs it as soon as its inputs exist,
  keeping its output alive until the backward pass reads it."""
  with tf.control_dependencies([dy]):
    return [tf.identity(t) for t in tensors]


def for_gradient(t, dy):
  """t as a backward pass should read it: t itself, or for a rebuildable t its fn re-run on its
  inputs (themselves rebuilt where rebuildable) once dy has arrived."""
  if not is_rebuildable(t):
    return t
  graph = tf.compat.v1.get_default_graph()
  rebuilt = _REBUILT.setdefault(graph, {})
  if t.ref() not in rebuilt:
    fn, inputs = _RECIPES[t.graph][t.ref()]
    with tf.name_scope("rebuild"):
      ready = [for_gradient(x, dy) if is_rebuildable(x) else after(dy, x)[0] for x in inputs]
      rebuilt[t.ref()] = fn(*ready)
  return rebuilt[t.ref()]
