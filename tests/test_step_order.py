"""A training step reads the global step before it increments it, as TF1's
`Optimizer.apply_gradients(global_step=...)` orders it, so training is reproducible.

T2T 1.15.7's `ConditionalOptimizer.apply_gradients` on TF2 put `assign_add(global_step, 1)` in a
control dependency of the update with no order against the reads of the learning-rate schedule
and of Adafactor's decay rate: a step read its own number or the next as the threads ran
(`patches.step_order` restores TF1's order). Checked through the model's own training
path (`T2TModel.optimize`: T2T's optimize_loss, ConditionalOptimizer, Adafactor), from step 0:
- Adafactor's decay rate at every step is `1 - (step + 1)^-0.8` of the step's number before the
  update: exactly 0.0 at the first step (0.42565 when it read 1);
- the learning rate is the schedule at that number;
- two runs from one graph seed, with residual dropout 0.1 on, give bit-identical losses and
  variables over 20 steps;
- the TPU path's CrossShardOptimizer hands the global step through to the same order.
"""
import numpy as np
import pytest
import tensorflow as tf

import routing_transformer  # pylint: disable=unused-import
from routing_transformer.t2t import model as model_lib
from hparams import sets
from tensor2tensor.data_generators import problem_hparams
from tensor2tensor.utils import adafactor
from tensor2tensor.utils import optimize

tf1 = tf.compat.v1
TRAIN = tf.estimator.ModeKeys.TRAIN
VOCAB = 40
STEPS = 20


def step_hparams():
  """`routing_transformer_test` (Adafactor with the paper's "pow" decay, a linear warm-up: the
  rate changes every step) with residual dropout 0.1."""
  hparams = sets.routing_transformer_test()
  assert hparams.optimizer == "adafactor" and hparams.optimizer_adafactor_decay_type == "pow"
  assert "linear_warmup" in hparams.learning_rate_schedule
  hparams.layer_prepostprocess_dropout = 0.1
  return hparams


def batches(seed=0):
  rng = np.random.default_rng(seed)
  return [rng.integers(1, VOCAB, (2, 64, 1, 1)).astype(np.int32) for _ in range(STEPS)]


def train(monkeypatch, hparams=None, steps=STEPS):
  """Trains `steps` steps from step 0 with graph seed 7; per step the pre-step global step, the
  decay rate and learning rate the update used, the total loss; and every variable at the end."""
  rates = []
  original = adafactor.adafactor_decay_rate_pow
  monkeypatch.setattr(adafactor, "adafactor_decay_rate_pow",
                      lambda exponent: rates.append(original(exponent)) or rates[-1])
  hparams = hparams or step_hparams()
  with tf.Graph().as_default() as graph:
    tf1.set_random_seed(7)
    targets = tf1.placeholder(tf.int32, [2, 64, 1, 1])
    model = model_lib.RoutingTransformer(
        hparams, TRAIN, problem_hparams.test_problem_hparams(VOCAB, VOCAB, hparams))
    _, losses = model({"targets": targets})
    train_op = model.optimize(sum(losses[key] for key in sorted(losses)))
    assert len(rates) == 1, rates  # Adafactor's decay rate: one tensor for every variable
    learning_rate = [op.inputs[1] for op in graph.get_operations()
                     if op.type == "ScalarSummary" and
                     tf.get_static_value(op.inputs[0]) == b"learning_rate"][0]
    step = tf1.train.get_or_create_global_step()
    fetches = {"decay": rates[0], "lr": learning_rate,
               "total": graph.get_tensor_by_name("total_loss:0"), "train": train_op}
    records = []
    with tf1.Session() as sess:
      sess.run([tf1.global_variables_initializer(), tf1.local_variables_initializer()])
      for batch in batches()[:steps]:
        before = sess.run(step)
        record = sess.run(fetches, {targets: batch})
        record["step"] = before
        assert sess.run(step) == before + 1
        records.append(record)
      variables = {v.op.name: value for v, value in
                   zip(tf1.global_variables(), sess.run(tf1.global_variables()))}
  return records, variables


@pytest.fixture(scope="module")
def two_runs():
  with pytest.MonkeyPatch.context() as monkeypatch:
    first = train(monkeypatch)
  with pytest.MonkeyPatch.context() as monkeypatch:
    second = train(monkeypatch)
  return first, second


def test_decay_rate_reads_the_step_before_the_update(two_runs):
  for records, _ in two_runs:
    assert [r["step"] for r in records] == list(range(STEPS))
    assert records[0]["decay"] == 0.0  # 1 - (0 + 1)^-0.8, where reading step 1 gave 0.42565
    got = np.array([r["decay"] for r in records], np.float64)  # 1 - (s + 2)^-0.8 if it read s + 1
    want = 1.0 - (np.arange(STEPS) + 1.0) ** -0.8
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)


def test_learning_rate_reads_the_step_before_the_update(two_runs):
  """The rate of step s is T2T's schedule at s (a read of s + 1 would show: it rises every step)."""
  from tensor2tensor.utils import learning_rate as t2t_lr  # pylint: disable=g-import-not-at-top
  with tf.Graph().as_default():
    step = tf1.train.get_or_create_global_step()
    rate = t2t_lr.learning_rate_schedule(step_hparams())
    with tf1.Session() as sess:
      sess.run([tf1.global_variables_initializer(), tf1.local_variables_initializer()])
      want = []
      for s in range(STEPS):
        step.load(s, sess)
        want.append(sess.run(rate))
  assert len(set(want)) == STEPS
  for records, _ in two_runs:
    np.testing.assert_array_equal([r["lr"] for r in records], want)


def test_two_runs_from_one_seed_are_bit_identical(two_runs):
  (first, first_vars), (second, second_vars) = two_runs
  np.testing.assert_array_equal([r["total"] for r in first], [r["total"] for r in second])
  assert sorted(first_vars) == sorted(second_vars)
  assert any(name.endswith("/ema_means") for name in first_vars)  # k-means state compared too
  for name, value in first_vars.items():
    np.testing.assert_array_equal(value, second_vars[name], err_msg=name)
  # and the model trained: the loss moved (dropout is on, so compare the mean of the halves)
  totals = np.array([r["total"] for r in first])
  assert totals[10:].mean() < totals[:10].mean()


def test_cross_shard_optimizer_keeps_the_order(monkeypatch):
  """The TPU path wraps ConditionalOptimizer in CrossShardOptimizer, which hands global_step on:
  the decay rate still reads the step before its increment. (One replica on the CPU: its
  cross-replica sum, a TPU-only op, is the identity here.)"""
  from tensorflow.python.tpu.ops import tpu_ops  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(tpu_ops, "cross_replica_sum", lambda x, group_assignment=None: x)
  hparams = step_hparams()
  with tf.Graph().as_default():
    step = tf1.train.get_or_create_global_step()
    var = tf1.get_variable("w", initializer=tf.ones([4, 4]))
    loss = tf.reduce_sum(var * var)
    opt = optimize.ConditionalOptimizer("adafactor", 0.01, hparams, use_tpu=False)
    decay = opt._opt._decay_rate  # pylint: disable=protected-access
    wrapped = tf1.tpu.CrossShardOptimizer(opt)
    train_op = wrapped.apply_gradients(opt.compute_gradients(loss, [var]), global_step=step)
    with tf1.Session() as sess:
      sess.run([tf1.global_variables_initializer(), tf1.local_variables_initializer()])
      for s in range(5):
        got, _ = sess.run([decay, train_op])
        np.testing.assert_allclose(got, 1.0 - (s + 1.0) ** -0.8, rtol=1e-6, atol=0)
        assert sess.run(step) == s + 1
