"""Numerical health of training: stop at the first non-finite loss, gradient or centroid.

The check decides on the device, with no host op in the training step (it compiles with XLA):
`guarded_update(...)` computes one int `status` from the loss, every gradient and every routing
centroid (0: all finite, else the first non-finite one in that order), stores it with the global
step in a local status variable, and applies the update only when the status is 0 (`tf.cond`
between the update and a no-op). The status is sticky: after a non-finite step no later step of
the session applies anything. After the step, on the host, `NonFiniteHook` reads the status and
stops training with `NonFiniteTraining: step N: non-finite <loss | gradients (first: <variable>)
| centroids (first: <variable>)>` (the name comes from the index, host-side): the variables are
not updated by that step, the Estimator stops without writing a checkpoint, and the T2T binaries
print that line (`t2t.glue`) instead of a traceback, so the last checkpoint on disk is the last
healthy one. hparams `nan_guard` (default True) switches it; the T2T model applies it through
T2T's optimizer (`routing_transformer.t2t.patches`).
"""
import collections

import tensorflow.compat.v1 as tf

MARKER = "NonFiniteTraining"
COLLECTION = "routing_transformer_nonfinite_guard"  # the GuardRecords of a graph


class NonFiniteTraining(RuntimeError):
  """A training step met a non-finite loss, gradient or centroid and applied nothing (the T2T
  binaries print it as one line with the fix: `t2t.glue.non_finite_message`)."""


GuardRecord = collections.namedtuple("GuardRecord", "status names num_gradients")
GuardRecord.__doc__ = """One guarded update: `status` the local int64 variable [2] (status,
global step), `names` the checked tensors' names (index status - 1: "loss", the gradients'
variables, then the centroids), `num_gradients` how many of them are gradients."""


def all_finite(tensor):
  """bool scalar: every value of a tensor (or an IndexedSlices' values) is finite."""
  values = getattr(tensor, "values", tensor)  # IndexedSlices: only the rows it holds
  return tf.reduce_all(tf.math.is_finite(tf.convert_to_tensor(values)))


def status(loss, gradients, centroids):
  """int32 scalar: 0 when the loss, the gradients and the centroids are all finite, else
  1 + the index of the first non-finite one in [loss] + gradients + centroids."""
  flags = tf.stack([all_finite(t) for t in [loss] + list(gradients) + list(centroids)])
  bad = tf.logical_not(flags)
  first = tf.cast(tf.argmax(tf.cast(bad, tf.int32)), tf.int32)
  return tf.where(tf.reduce_any(bad), first + 1, 0)


def message(code, step, names, num_gradients):
  """The one-line MARKER message of a non-zero status `code` at global step `step`."""
  index = int(code) - 1
  if index == 0:
    family = "loss"
  elif index <= num_gradients:
    family = "gradients (first: %s)" % names[index]
  else:
    family = "centroids (first: %s)" % names[index]
  return "%s: step %d: non-finite %s" % (MARKER, int(step), family)


def guarded_update(update, loss, grads_and_vars, centroids, step):
  """Applies `update()` (a function building the update op) only when the loss, the gradients
  of grads_and_vars and the centroids are finite, decided on the device; returns the op.

  Registers a GuardRecord in the graph's COLLECTION for `NonFiniteHook` / `failure`."""
  pairs = [(g, v) for g, v in grads_and_vars if g is not None]
  names = ["loss"] + [v.op.name for _, v in pairs] + [c.op.name for c in centroids]
  centroids = [c.read_value() if hasattr(c, "read_value") else c for c in centroids]
  record = tf.Variable(lambda: tf.zeros([2], tf.int64), trainable=False,  # also inside XLA
                       name="nonfinite_status", collections=[tf.GraphKeys.LOCAL_VARIABLES],
                       use_resource=True)
  old = record.read_value()
  found = tf.stack([tf.cast(status(loss, [g for g, _ in pairs], centroids), tf.int64),
                    tf.cast(step, tf.int64)])
  new = tf.where(tf.equal(old[0], 0), found, old)  # sticky: the first failure stays
  with tf.control_dependencies([record.assign(new)]):
    ok = tf.equal(tf.identity(new[0]), 0)

  def apply():
    with tf.control_dependencies([update()]):
      return tf.constant(True)

  applied = tf.cond(ok, apply, lambda: tf.constant(False), name="nonfinite_guard")
  tf.add_to_collection(COLLECTION, GuardRecord(record, names, len(pairs)))
  return tf.group(applied)


def failure(session, graph=None):
  """The MARKER message of the first guard of `graph` (default: the session's) whose status
  shows a non-finite step, or None; reads the status variables (one small session run)."""
  records = (graph or session.graph).get_collection(COLLECTION)
  if not records:
    return None
  values = session.run([r.status for r in records])
  for record, (code, step) in zip(records, values):
    if code:
      return message(code, step, record.names, record.num_gradients)
  return None


class NonFiniteHook(tf.train.SessionRunHook):
  """After every step, stops training with NonFiniteTraining when a guarded update of the graph
  met a non-finite value (`failure`); does nothing in a graph without one."""

  def begin(self):
    self.records = tf.get_collection(COLLECTION)

  def after_run(self, run_context, run_values):
    del run_values
    if self.records:
      found = failure(run_context.session)
      if found:
        raise NonFiniteTraining(found)


def one_line(error):
  """The MARKER message of an error raised for a non-finite step, or None."""
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
