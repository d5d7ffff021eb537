"""Numerical health of training: stop at the first non-finite loss, gradient or centroid.

`guarding(...)` (used by `RoutingTransformer.optimize`) makes T2T's optimizer check, before it
applies a step, that the loss, every gradient and every routing centroid are finite. If not, the
step fails with `NonFiniteTraining: step N: non-finite <loss | gradients (first: <variable>) |
centroids (first: <variable>)>`: the variables are not updated by that step, the Estimator stops
without writing a checkpoint, and the T2T binaries print that line (`t2t_glue`) instead of a
traceback, so the last checkpoint on disk is the last healthy one. On TPU (XLA) the check is
skipped (Assert does not compile there). hparams `nan_guard` (default True) switches it.
"""
import contextlib

import tensorflow.compat.v1 as tf

MARKER = "NonFiniteTraining"
_ACTIVE = []  # stack of (loss, centroid variables) set by `guarding`


def _first_bad(tensors, names):
  """(all finite: bool scalar, name of the first non-finite tensor: string scalar)."""
  flags = tf.stack([tf.reduce_all(tf.math.is_finite(t)) for t in tensors])
  first = tf.argmin(tf.cast(flags, tf.int32))
  return tf.reduce_all(flags), tf.gather(tf.constant(names), first)


def check(loss, grads_and_vars, centroids, step):
  """Assert op: loss, gradients and centroids finite, else one MARKER message naming the first
  non-finite family (in that order) and, for gradients and centroids, the first variable."""
  loss_ok = tf.reduce_all(tf.math.is_finite(loss))
  pairs = [(g, v) for g, v in grads_and_vars if g is not None]
  grads = [tf.convert_to_tensor(g) for g, _ in pairs]
  grads_ok, bad_grad = _first_bad(grads, [v.op.name for _, v in pairs])
  if centroids:
    cents_ok, bad_cent = _first_bad([c.read_value() if hasattr(c, "read_value") else c
                                     for c in centroids], [c.op.name for c in centroids])
  else:
    cents_ok, bad_cent = tf.constant(True), tf.constant("")
  family = tf.case([(tf.logical_not(loss_ok), lambda: tf.constant("loss")),
                    (tf.logical_not(grads_ok), lambda: tf.strings.join(
                        ["gradients (first: ", bad_grad, ")"]))],
                   default=lambda: tf.strings.join(["centroids (first: ", bad_cent, ")"]))
  message = tf.strings.join([MARKER + ": step ", tf.strings.as_string(step), ": non-finite ",
                             family])
  return tf.debugging.Assert(loss_ok & grads_ok & cents_ok, [message], summarize=1)


@contextlib.contextmanager
def guarding(loss, centroids):
  """While active, T2T's ConditionalOptimizer.apply_gradients checks `check(...)` first."""
  install()
  _ACTIVE.append((loss, list(centroids)))
  try:
    yield
  finally:
    _ACTIVE.pop()


def install():
  """Wraps tensor2tensor's ConditionalOptimizer.apply_gradients once (idempotent)."""
  from tensor2tensor.utils import optimize  # pylint: disable=g-import-not-at-top
  original = optimize.ConditionalOptimizer.apply_gradients
  if getattr(original, "_health_guard", False):
    return

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    if _ACTIVE:
      grads_and_vars = list(grads_and_vars)
      loss, centroids = _ACTIVE[-1]
      assertion = check(loss, grads_and_vars, centroids, tf.train.get_or_create_global_step())
      with tf.control_dependencies([assertion]):
        grads_and_vars = [(None if g is None else tf.identity(g), v) for g, v in grads_and_vars]
    return original(self, grads_and_vars, global_step=global_step, name=name)

  apply_gradients._health_guard = True  # pylint: disable=protected-access
  optimize.ConditionalOptimizer.apply_gradients = apply_gradients


def one_line(error):
  """The MARKER message of a TF error raised by `check`, or None."""
  text = str(getattr(error, "message", error))
  start = text.find(MARKER)
  if start < 0:
    return None
  return text[start:].split("]")[0].split("\n")[0].strip()


def dead_clusters(ema_count, fraction=None):
  """[(head, cluster)] of a numpy ema_count [h, c] whose share is below fraction / c."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from routing_transformer.core import kmeans  # pylint: disable=g-import-not-at-top
  fraction = kmeans.DEAD_FRACTION if fraction is None else fraction
  counts = np.asarray(ema_count, dtype=np.float64)
  share = counts / np.maximum(counts.sum(axis=-1, keepdims=True), 1e-9)
  return [tuple(int(i) for i in hc) for hc in np.argwhere(share < fraction / counts.shape[-1])]


class DeadClusterHook(tf.train.SessionRunHook):
  """Every `every_n_steps` training steps, logs a warning naming the routing centroids whose
  EMA occupancy (an average over ~1 / (1 - decay) steps) is ~0: dead clusters."""

  def __init__(self, every_n_steps=1000):
    self.every_n_steps = every_n_steps
    self.found = {}  # variable name -> [(head, cluster)] at the last check

  def begin(self):
    self.counts = [v for v in tf.global_variables() if v.op.name.endswith("/ema_count")]
    self.step = tf.train.get_or_create_global_step()
    self.timer = tf.train.SecondOrStepTimer(every_steps=self.every_n_steps)

  def before_run(self, run_context):
    del run_context
    return tf.train.SessionRunArgs(self.step)

  def after_run(self, run_context, run_values):
    step = int(run_values.results)
    if not self.counts or not self.timer.should_trigger_for_step(step):
      return
    self.timer.update_last_triggered_step(step)
    values = run_context.session.run(self.counts)
    for var, value in zip(self.counts, values):
      dead = dead_clusters(value)
      self.found[var.op.name] = dead
      if dead:
        tf.logging.warning(
            "routing: %d dead cluster(s) (EMA occupancy ~0) in %s at step %d, (head, cluster): "
            "%s. They attend to nothing; hparams reseed_dead_clusters=True re-seeds them from "
            "recent queries.", len(dead), var.op.name.replace("/ema_count", ""), step, dead[:16])
