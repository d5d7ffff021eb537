"""The non-finite guard: a step with a NaN loss, gradient or centroid updates nothing (decided on
the device), the hook then stops training naming the family and the step, and the last
checkpoint stays healthy."""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import t2t_usr_dir  # pylint: disable=unused-import
from routing_transformer.core import health
from routing_transformer.t2t import glue
from tensor2tensor.data_generators import problem_hparams
from tensor2tensor.utils import registry
from tensor2tensor.utils import trainer_lib


def build_training(hparams_set="routing_transformer_test", overrides=""):
  """Tiny model in TRAIN mode; returns (train_op, loss scale and gradient-poison placeholders)."""
  hp = trainer_lib.create_hparams(hparams_set, overrides)
  hp.problem_hparams = problem_hparams.test_problem_hparams(40, 40, hp)
  model = registry.model("routing_transformer")(hp, tf.estimator.ModeKeys.TRAIN,
                                                hp.problem_hparams)
  ids = tf.constant(np.random.RandomState(0).randint(2, 40, size=(2, 64, 1, 1)), tf.int32)
  _, losses = model({"targets": ids, "inputs": ids})
  loss = tf.add_n(list(losses.values()))
  scale = tf.placeholder_with_default(1.0, [])
  poison = tf.placeholder_with_default(1.0, [])
  first = tf.trainable_variables()[0]
  # poison = 0: the loss stays finite (sqrt(0) * 1) but its gradient is inf * 0 = NaN;
  # poison = 1 adds sqrt(S) * 0 = 0 with a zero gradient.
  loss = loss * scale + tf.sqrt(poison * tf.reduce_sum(tf.square(first))) * (1.0 - poison)
  return model.optimize(loss), scale, poison, first


def test_nan_loss_and_gradient_stop_the_step_without_a_poisoned_checkpoint(tmp_path):
  with tf.Graph().as_default():  # one graph for both checks
    train_op, scale, poison, first = build_training()
    init = [tf.global_variables_initializer(), tf.local_variables_initializer()]
    step = tf.train.get_global_step()
    with tf.train.MonitoredTrainingSession(checkpoint_dir=str(tmp_path),
                                           hooks=[health.NonFiniteHook()],
                                           save_checkpoint_steps=1,
                                           save_summaries_steps=None,
                                           save_graph_def=False) as sess:  # no graph.pbtxt
      initial = sess.run(first)
      for _ in range(2):
        sess.run(train_op)
      before = sess.run(first)
      assert not np.array_equal(before, initial)  # healthy steps apply their update
      with pytest.raises(health.NonFiniteTraining) as loss_error:
        sess.run(train_op, {scale: float("nan")})
    assert health.one_line(loss_error.value) == health.MARKER + ": step 2: non-finite loss"
    assert glue.non_finite_message(loss_error.value).startswith(
        "training stopped: NonFiniteTraining: step 2: non-finite loss. No checkpoint")
    latest = tf.train.latest_checkpoint(str(tmp_path))
    reader = tf.train.load_checkpoint(latest)
    np.testing.assert_array_equal(reader.get_tensor(first.op.name), before)
    for name in reader.get_variable_to_shape_map():
      value = reader.get_tensor(name)
      if isinstance(value, np.ndarray) and value.dtype.kind == "f":
        assert np.all(np.isfinite(value)), name

    with tf.Session() as sess:  # fresh variables: a NaN gradient with a finite loss
      sess.run(init)
      before = sess.run([first, step])
      assert health.failure(sess) is None
      sess.run(train_op, {poison: 0.0})  # decided on the device: no error inside the step
      np.testing.assert_array_equal(sess.run(first), before[0])  # the step applied nothing
      assert sess.run(step) == before[1]  # not even the global step
      message = health.failure(sess)
      sess.run(train_op)  # a finite step after it: still nothing applied (the status sticks)
      np.testing.assert_array_equal(sess.run(first), before[0])
      assert health.failure(sess) == message
  assert message == (health.MARKER + ": step 0: non-finite gradients (first: %s)" %
                     first.op.name)


def test_status_names_the_first_non_finite_centroid():
  with tf.Graph().as_default():
    good = tf.constant([1.0, 2.0], name="good/means")
    bad = tf.constant([[1.0, np.nan]], name="decoder_layer_1/means")
    var = tf.Variable(1.0, name="w")
    applied = tf.Variable(0, name="applied")
    update = health.guarded_update(lambda: applied.assign_add(1), tf.constant(1.0),
                                   [(tf.constant(0.5), var)], [good, bad],
                                   tf.constant(7, tf.int64))
    with tf.Session() as sess:
      sess.run([tf.global_variables_initializer(), tf.local_variables_initializer()])
      sess.run(update)
      assert sess.run(applied) == 0
      assert health.failure(sess) == (
          health.MARKER + ": step 7: non-finite centroids (first: decoder_layer_1/means)")


@pytest.mark.parametrize("values,code", [
    ((1.0, [0.5, 2.0], [[1.0]]), 0),
    ((np.inf, [np.nan, 2.0], [[np.nan]]), 1),  # the loss first
    ((1.0, [0.5, np.nan], [[np.nan]]), 3),  # then the gradients, in order
    ((1.0, [0.5, 2.0], [[np.inf]]), 4),
])
def test_status_codes(values, code):
  loss, grads, cents = values
  result = health.status(tf.constant(loss), [tf.constant(g) for g in grads],
                         [tf.constant(c) for c in cents])
  assert int(result) == code


def test_guard_can_be_switched_off():
  with tf.Graph().as_default():
    train_op, scale, _, first = build_training(overrides="nan_guard=False")
    assert not tf.get_collection(health.COLLECTION)
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      sess.run(train_op, {scale: float("nan")})  # no check: the step runs
      assert not np.all(np.isfinite(sess.run(first)))


def test_reseeding_model_trains_a_step(monkeypatch):
  from routing_transformer.core import kmeans  # pylint: disable=g-import-not-at-top
  calls = {"n": 0}
  reseed_candidates = kmeans.reseed_candidates

  def counted(*args, **kwargs):
    calls["n"] += 1
    return reseed_candidates(*args, **kwargs)

  monkeypatch.setattr(kmeans, "reseed_candidates", counted)
  with tf.Graph().as_default():
    train_op, _, _, _ = build_training(overrides="reseed_dead_clusters=True")
    with tf.Session() as sess:
      sess.run([tf.global_variables_initializer(), tf.local_variables_initializer()])
      sess.run(train_op)
      means = [v for v in tf.global_variables() if v.op.name.endswith("/means")]
      assert means and all(np.all(np.isfinite(m)) for m in sess.run(means))
  assert calls["n"] > 0  # the hparam reached the centroid update


@pytest.mark.parametrize("overrides,hooks", [
    ("", ["NonFiniteHook", "DeadClusterHook"]),
    ("nan_guard=False,dead_cluster_check_steps=0", []),
])
def test_t2t_training_gets_the_stop_hook(overrides, hooks):
  """What t2t-trainer adds to the Estimator's training hooks (T2TModel.get_train_hooks)."""
  import types  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import t2t_model  # pylint: disable=g-import-not-at-top
  hp = trainer_lib.create_hparams("routing_transformer_test", overrides)
  got = t2t_model.T2TModel.get_train_hooks("routing_transformer",
                                           types.SimpleNamespace(hparams=hp))
  assert [type(h).__name__ for h in got] == hooks
