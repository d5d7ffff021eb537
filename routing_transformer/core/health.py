"""Numerical health of training: stop at the first non-finite loss, gradient or centroid.

Decided on the device (no host op: the step compiles with XLA): `guarded_update` computes one
int status (0: all finite, else 1 + the index of the first non-finite value among the loss, the
gradients and the routing centroids), keeps it with the global step in a local variable (sticky:
after a failure no later step applies anything) and applies the update only at 0. On the host,
`NonFiniteHook` then stops training with `NonFiniteTraining: step N: non-finite <loss |
gradients (first: <variable>) | centroids (first: <variable>)>`, before a checkpoint of the bad
step is written. hparams `nan_guard` (default True) switches it.
"""
import collections

import tensorflow.compat.v1 as tf

MARKER = "NonFiniteTraining"
COLLECTION = "routing_transformer_nonfinite_guard"  # the GuardRecords of a graph


class NonFiniteTraining(RuntimeError):
  """A training step met a non-finite loss, gradient or centroid and applied nothing."""


GuardRecord = collections.namedtuple("GuardRecord", "status names num_gradients")
GuardRecord.__doc__ = """One guarded update: `status` int64 variable [2] (status, global step),
`names` of the checked tensors ("loss", the gradients' variables, the centroids)."""


def all_finite(tensor):
  """bool scalar: every value of a tensor (or an IndexedSlices' values) is finite."""
  values = getattr(tensor, "values", tensor)  # IndexedSlices: only the rows it holds
  return tf.reduce_all(tf.math.is_finite(tf.convert_to_tensor(values)))


def status(loss, gradients, centroids):
  """int32 scalar: 0 when all are finite, else 1 + the index of the first non-finite one in
  [loss] + gradients + centroids."""
  flags = tf.stack([all_finite(t) for t in [loss] + list(gradients) + list(centroids)])
  bad = tf.logical_not(flags)
  return tf.where(tf.reduce_any(bad), tf.cast(tf.argmax(tf.cast(bad, tf.int32)), tf.int32) + 1, 0)


def message(code, step, names, num_gradients):
  """The one-line MARKER message of a non-zero status `code` at global step `step`."""
  index = int(code) - 1
  family = "loss" if index == 0 else "%s (first: %s)" % (
      "gradients" if index <= num_gradients else "centroids", names[index])
  return "%s: step %d: non-finite %s" % (MARKER, int(step), family)


def guarded_update(update, loss, grads_and_vars, centroids, step):
  """The op applying `update()` (which builds the update op) only when the loss, the gradients
  and the centroids are finite; registers a GuardRecord in the graph's COLLECTION."""
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
  """The MARKER message of the first guard of `graph` (default: the session's) that met a
  non-finite step, or None."""
  records = (graph or session.graph).get_collection(COLLECTION)
  if not records:
    return None
  values = session.run([r.status for r in records])
  for record, (code, step) in zip(records, values):
    if code:
      return message(code, step, record.names, record.num_gradients)
  return None


class NonFiniteHook(tf.train.SessionRunHook):
  """Raises NonFiniteTraining after a step whose guarded update met a non-finite value."""

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
  return None if start < 0 else text[start:].split("]")[0].split("\n")[0].strip()


def dead_clusters(ema_count, fraction=None):
  """[(head, cluster)] of a numpy ema_count [h, c] whose share is below fraction / c."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from routing_transformer.core import kmeans  # pylint: disable=g-import-not-at-top
  fraction = kmeans.DEAD_FRACTION if fraction is None else fraction
  counts = np.asarray(ema_count, dtype=np.float64)
  share = counts / np.maximum(counts.sum(axis=-1, keepdims=True), 1e-9)
  return [tuple(int(i) for i in hc) for hc in np.argwhere(share < fraction / counts.shape[-1])]


class DeadClusterHook(tf.train.SessionRunHook):
  """Every `every_n_steps` steps, warns of routing centroids whose EMA occupancy is ~0."""

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
