"""Twenty training steps with the original release's k-means counts, schedule and loss weight,
checked step by step against restatements of the original's TRAIN step (`oracles.original_*`).

The tiny routing model (`routing_transformer_test`: 2 layers, 2 routing heads in layer 1 with 4
clusters of 16 over 64 positions, dropouts 0, share_qk) with the paper schedule of
`base.sparse_transformer_local` and legacy_kmeans_counts=True trains 20 steps on 20 fixed
batches in one tf.compat.v1 session, through T2T's own path (the model's call, the sum of its
losses as `T2TModel.estimator_model_fn` sums them, `optimize`: Adafactor). It continues at global
step 9,990, so the steps cross the end of the schedule's flat phase (10,000). At every step, from
the tensors fetched in the step's session.run and the k-means variables read just before and
after it:
- the learning rate the optimizer receives is the original's schedule by hand;
- the total loss is the cross-entropy (NumPy, from the logits) plus beta * (e_q + e_k) (NumPy,
  from the routing queries and the centroids before the step; share_qk: 2 * beta * e);
- the centroids and EMA statistics after the step are the original's online_kmeans update of
  the state before it and the step's queries (float64), and so are the 20 steps chained.
The same 20 steps from the same weights with the switch off leave the original's counts (2
routing heads) and follow the per-head restatement.

Not covered: the original's own graph is not in the repository, so the forward pass (the queries,
the logits) and the Adafactor update are ours, fed to the restatements; the check is of the
original's formulas, not of its code run side by side. Batches have no padding (the original
counts padding in routing; see `routing_padding_as_original`) and share_qk holds (without it
the original makes two EMA updates per layer and step, one for the queries and one for the keys).
"""
import numpy as np
import pytest
import tensorflow as tf

import routing_transformer  # pylint: disable=unused-import
from routing_transformer.t2t import model as model_lib
from hparams import base
from hparams import sets
from tensor2tensor.data_generators import problem_hparams
import oracles

tf1 = tf.compat.v1
TRAIN = tf.estimator.ModeKeys.TRAIN
VOCAB = 40
STEPS = 20
FIRST_STEP = 9990  # global step of the first step: steps 9,990 .. 10,009
ORIGINAL_BETA, ORIGINAL_DECAY = 1e-4, 0.999  # its sparse_transformer_local


def original_hparams(legacy=True):
  """`routing_transformer_test` trained as the original trains (schedule of the paper sets)."""
  hparams = sets.routing_transformer_test()
  paper = base.sparse_transformer_local()
  for name in ("learning_rate_schedule", "learning_rate_constant", "learning_rate_warmup_steps"):
    setattr(hparams, name, getattr(paper, name))
  hparams.legacy_kmeans_counts = legacy
  return hparams


def fixed_batches(seed=0):
  """STEPS batches of 2 sequences of 64 tokens in 1..VOCAB-1 (no padding): [2, 64, 1, 1]."""
  rng = np.random.default_rng(seed)
  return [rng.integers(1, VOCAB, (2, 64, 1, 1)).astype(np.int32) for _ in range(STEPS)]


def summarized_tensor(graph, tag):
  """The tensor a tf.summary.scalar with this tag records (T2T's optimize writes the learning
  rate it hands the optimizer under "learning_rate")."""
  found = [op.inputs[1] for op in graph.get_operations() if op.type == "ScalarSummary" and
           tf.get_static_value(op.inputs[0]) == tag.encode()]
  assert len(found) == 1, (tag, found)
  return found[0]


def train(legacy, batches, initial=None):
  """Trains len(batches) steps from `initial` (variable name -> value; None: a fresh, seeded
  initialisation) starting at global step FIRST_STEP.

  Returns:
    (records, initial): one dict per step with the pre-step global step "step", "lr", "total"
    (T2T's total_loss), "training", "extra", "logits", "targets" and per routing layer
    "layers" (q_hat, clusters, weights), "before" and "after" (means, ema_count, ema_means).
  """
  hparams = original_hparams(legacy)
  with tf.Graph().as_default() as graph:
    tf1.set_random_seed(31)
    targets = tf1.placeholder(tf.int32, batches[0].shape, name="targets")
    model = model_lib.RoutingTransformer(
        hparams, TRAIN, problem_hparams.test_problem_hparams(VOCAB, VOCAB, hparams))
    logits, losses = model({"targets": targets})
    train_op = model.optimize(sum(losses[key] for key in sorted(losses)))
    kmeans_steps = model._kmeans_steps  # pylint: disable=protected-access
    steps = [shard_steps[0] for shard_steps in kmeans_steps.values()]  # one shard
    assert len(steps) == 1 and steps[0].km.heads == 2 and len(steps[0].x_hats) == 1
    fetches = {"lr": summarized_tensor(graph, "learning_rate"),
               "total": graph.get_tensor_by_name("total_loss:0"),
               "training": losses["training"], "extra": losses["extra_loss"], "logits": logits,
               "layers": [(s.x_hats[0], s.clusters[0], s.weights) for s in steps],
               "train": train_op}
    state = {"step": tf1.train.get_or_create_global_step(),
             "kmeans": [(s.km.means, s.km.ema_count, s.km.ema_means) for s in steps]}
    variables = tf1.global_variables()
    with tf1.Session() as sess:
      sess.run([tf1.global_variables_initializer(),
                tf1.local_variables_initializer()])  # and the non-finite guard's status
      if initial is None:
        initial = {v.op.name: value for v, value in zip(variables, sess.run(variables))}
      assert sorted(initial) == sorted(v.op.name for v in variables)
      for v in variables:
        v.load(initial[v.op.name], sess)
      state["step"].load(FIRST_STEP, sess)
      before = sess.run(state)
      records = []
      for batch in batches:
        record = sess.run(fetches, {targets: batch})
        after = sess.run(state)
        record.update(targets=batch, step=before["step"], before=before["kmeans"],
                      after=after["kmeans"])
        records.append(record)
        before = after
  return records, initial


@pytest.fixture(scope="module")
def runs():
  """The 20 steps with legacy_kmeans_counts on, and off from the same weights and batches."""
  batches = fixed_batches()
  legacy, initial = train(True, batches)
  per_head, _ = train(False, batches, initial)
  return {"legacy": legacy, "per_head": per_head}


def cross_entropy(logits, targets):
  """Mean -log softmax(logits)[target] over non-padding targets (float64), as the original's
  body computes its "training" loss."""
  targets = targets.reshape(targets.shape[:2])
  logits = logits.reshape(targets.shape + (-1,)).astype(np.float64)
  top = logits.max(-1, keepdims=True)
  log_z = np.log(np.exp(logits - top).sum(-1)) + top[..., 0]
  picked = np.take_along_axis(logits, targets[..., None], -1)[..., 0]
  weights = (targets != 0).astype(np.float64)
  return float(((log_z - picked) * weights).sum() / weights.sum())


def test_the_model_is_set_as_the_original_trains():
  """Facts of the original's sparse_transformer_local (its sparse_transformer.py) and the tiny
  configuration the comparison needs."""
  hparams = original_hparams()
  assert hparams.learning_rate_schedule == oracles.ORIGINAL_SCHEDULE
  assert hparams.learning_rate_constant == oracles.ORIGINAL_LEARNING_RATE
  assert hparams.learning_rate_warmup_steps == oracles.ORIGINAL_WARMUP_STEPS
  assert (hparams.beta, hparams.decay) == (ORIGINAL_BETA, ORIGINAL_DECAY)
  assert hparams.ema and hparams.share_qk and hparams.optimizer == "adafactor"
  assert hparams.sparsity_cluster_num_heads == 2 and hparams.sparsity_skip_first == 1
  assert hparams.num_decoder_layers == 2
  for name in ("dropout", "attention_dropout", "relu_dropout", "layer_prepostprocess_dropout",
               "target_dropout", "label_smoothing", "weight_decay"):
    assert getattr(hparams, name) == 0, name
  assert not base.sparse_transformer_local().legacy_kmeans_counts  # off by default


def test_learning_rate_is_the_originals_schedule_at_every_step(runs):
  records = runs["legacy"]
  assert [r["step"] for r in records] == list(range(FIRST_STEP, FIRST_STEP + STEPS))
  got = np.array([r["lr"] for r in records])
  want = np.array([oracles.original_learning_rate(r["step"]) for r in records])
  np.testing.assert_allclose(got, want, rtol=1e-6)
  # flat through step 10,000 (index 10), then rsqrt decay: 0.01 * sqrt(10000 / 10009) at the end
  assert np.all(got[:11] == got[0]) and np.all(np.diff(got[10:]) < 0)
  np.testing.assert_allclose(got[[0, -1]], [0.01, 0.01 * (10000 / 10009) ** 0.5], rtol=1e-6)


def test_total_loss_is_cross_entropy_plus_the_originals_clustering_loss(runs):
  """total = CE + sum over routing layers of beta * (e_q + e_k) = CE + 2 * beta * e (share_qk),
  e from the fetched routing queries and the centroids the step routed with."""
  for i, record in enumerate(runs["legacy"]):
    ce = cross_entropy(record["logits"], record["targets"])
    clustering = sum(
        oracles.original_clustering_loss(q_hat, means, ORIGINAL_BETA)
        for (q_hat, _, _), (means, _, _) in zip(record["layers"], record["before"]))
    np.testing.assert_allclose(record["training"], ce, rtol=1e-5, err_msg="step %d" % i)
    np.testing.assert_allclose(record["extra"], clustering, rtol=1e-5, err_msg="step %d" % i)
    np.testing.assert_allclose(record["total"], ce + clustering, rtol=2e-6,
                               err_msg="step %d" % i)


def _check_update(record, legacy, i):
  """The variables after the step against the original's update of the state before it."""
  for (q_hat, clusters, weights), before, after in zip(record["layers"], record["before"],
                                                       record["after"]):
    *want, want_clusters = oracles.original_ema_step(q_hat, weights, *before, ORIGINAL_DECAY,
                                                     legacy=legacy)
    np.testing.assert_array_equal(clusters, want_clusters, err_msg="step %d" % i)
    for name, got, value in zip(("means", "ema_count", "ema_means"), after, want):
      np.testing.assert_allclose(got, value, rtol=2e-6, atol=1e-7,
                                 err_msg="step %d %s" % (i, name))


def test_centroids_after_every_step_are_the_originals_update(runs):
  records = runs["legacy"]
  for i, record in enumerate(records):
    _check_update(record, True, i)
  # Chained: the original's update applied 20 times from the first state, fed the steps' queries.
  state = [tuple(np.float64(v) for v in layer) for layer in records[0]["before"]]
  for record in records:
    state = [oracles.original_ema_step(q_hat, weights, *layer, ORIGINAL_DECAY)[:3]
             for (q_hat, _, weights), layer in zip(record["layers"], state)]
  for got, want in zip(records[-1]["after"], state):
    for got_value, want_value in zip(got, want):
      np.testing.assert_allclose(got_value, want_value, rtol=1e-5, atol=1e-6)


def _interleaved_and_per_head(clusters, num_clusters):
  hot = np.eye(num_clusters)[clusters]
  return hot.reshape(-1, clusters.shape[1], num_clusters).sum(0), hot.sum((0, 2))


def test_without_the_switch_the_counts_leave_the_originals(runs):
  """legacy_kmeans_counts=False, same weights and batches: every step whose assignments give
  different interleaved and per-head counts (2 routing heads) ends with EMA counts off the
  original's restatement by 0.001 times that difference; the per-head restatement holds."""
  records = runs["per_head"]
  # The same weights and batch: the first step's forward pass is the legacy run's.
  np.testing.assert_allclose(records[0]["logits"], runs["legacy"][0]["logits"], rtol=1e-6,
                             atol=1e-6)
  differing = 0
  for i, record in enumerate(records):
    _check_update(record, False, i)
    (q_hat, clusters, weights), before, after = (record["layers"][0], record["before"][0],
                                                 record["after"][0])
    original = oracles.original_ema_step(q_hat, weights, *before, ORIGINAL_DECAY)
    interleaved, per_head = _interleaved_and_per_head(clusters, before[1].shape[-1])
    np.testing.assert_allclose(after[1] - original[1],
                               (1 - ORIGINAL_DECAY) * (per_head - interleaved), atol=1e-6,
                               err_msg="step %d" % i)
    if not np.array_equal(interleaved, per_head):
      differing += 1
      assert not np.allclose(after[1], original[1], rtol=1e-5, atol=0), "step %d" % i
  assert differing == STEPS, differing  # every step here: 2 heads, 4 clusters
  # and the counts feed back: from the second step on the two runs' losses part
  assert not np.isclose(records[1]["total"], runs["legacy"][1]["total"], rtol=1e-5, atol=0)
