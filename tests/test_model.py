"""The T2T model built directly (no binaries): shapes, losses, causality, centroid updates."""
import numpy as np
import pytest
import tensorflow as tf

import routing_transformer  # pylint: disable=unused-import
from routing_transformer.t2t import model as model_lib
from hparams import base
from tensor2tensor.data_generators import problem_hparams
from tensor2tensor.utils import expert_utils

tf1 = tf.compat.v1
VOCAB = 40
TRAIN, EVAL = tf.estimator.ModeKeys.TRAIN, tf.estimator.ModeKeys.EVAL


def small_hparams(**overrides):
  """A small model from the paper's base, without its residual dropout (the tests compare values
  across graphs; dropout has tests of its own)."""
  h = base.sparse_transformer_local()
  h.layer_prepostprocess_dropout = 0.0
  h.max_length = h.max_target_length = 64
  h.batch_size = 128
  h.hidden_size = h.embedding_dims = 32
  h.filter_size = 64
  h.num_decoder_layers = h.num_hidden_layers = 2
  h.local_num_heads, h.sparsity_cluster_num_heads, h.sparsity_skip_first = 2, 2, 1
  h.sparsity_cluster_size, h.sparsity_cluster_attention_window = 4, 16
  h.query_shape = h.memory_flange = h.memory_query_shape = (16,)
  h.max_relative_position = 17
  for key, value in overrides.items():
    setattr(h, key, value)
  return h


def build(hparams, mode, features, shards=1, input_vocab=VOCAB):
  p_hparams = problem_hparams.test_problem_hparams(input_vocab, VOCAB, hparams)
  dp = expert_utils.Parallelism([""] * shards, reuse=tf1.AUTO_REUSE) if shards > 1 else None
  model = model_lib.RoutingTransformer(hparams, mode, p_hparams, data_parallelism=dp)
  features = {k: tf.convert_to_tensor(v) for k, v in features.items()}
  sharded = {k: [v] if shards == 1 else tf.split(v, shards) for k, v in features.items()}
  logits, losses = model.model_fn_sharded(sharded)
  return (logits[0] if shards == 1 else tf.concat(logits, 0)), losses


def random_targets(rng, batch=2, length=64, pad_from=None):
  t = rng.integers(1, VOCAB, (batch, length, 1, 1)).astype(np.int32)
  if pad_from is not None:
    t[:, pad_from:] = 0
  return t


def run(fetches, init=True, feed=None, steps=1):
  with tf1.Session() as sess:
    if init:
      sess.run(tf1.global_variables_initializer())
    out = None
    for _ in range(steps):
      out = sess.run(fetches, feed)
    return out


@pytest.mark.parametrize("encoder_layers", [0, 1])
def test_forward_shapes_and_finite_loss(rng, encoder_layers):
  h = small_hparams(num_encoder_layers=encoder_layers)
  targets = random_targets(rng, pad_from=50)
  features = {"targets": targets}
  if encoder_layers:
    features["inputs"] = random_targets(rng, pad_from=40)
  with tf.Graph().as_default():
    logits, losses = build(h, TRAIN, features, input_vocab=VOCAB + 7)
    assert logits.shape.as_list() == [2, 64, 1, 1, VOCAB]
    if encoder_layers:
      table = [v for v in tf1.global_variables() if "input_embeddings/embedding" in v.name]
      assert table and table[0].shape[0] == VOCAB + 7
    values = run(losses)
  assert np.isfinite(values["training"]) and values["training"] > 0
  assert 0 < values["extra_loss"] < 1e-2  # beta * commitment


def test_shorter_batches_are_padded_to_the_static_length(rng):
  with tf.Graph().as_default():
    logits, _ = build(small_hparams(), EVAL, {"targets": random_targets(rng, 2, 40)})
    assert logits.shape.as_list() == [2, 40, 1, 1, VOCAB]


@pytest.mark.parametrize("overrides", [
    dict(sparsity_cluster_num_heads=0, local_num_heads=4),
    dict(sparsity_cluster_num_heads=0, local_num_heads=4, full_attention=True),
    dict(sparsity_cluster_num_heads=0, local_num_heads=4, ffn_layer="dense_relu_dense",
         layer_preprocess_sequence="n", layer_postprocess_sequence="da", head_dense=False),
])
def test_local_only_model_is_causal(rng, overrides):
  h = small_hparams(**overrides)
  targets = random_targets(rng)
  with tf.Graph().as_default():
    ph = tf1.placeholder(tf.int32, [2, 64, 1, 1])
    logits, _ = build(h, EVAL, {"targets": ph})
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      base_logits = sess.run(logits, {ph: targets})
      for t in (0, 17, 40, 61):
        changed = targets.copy()
        changed[:, t + 1:] = rng.integers(1, VOCAB, changed[:, t + 1:].shape)
        new_logits = sess.run(logits, {ph: changed})
        # logits at position i predict target i from targets < i
        np.testing.assert_allclose(new_logits[:, :t + 2], base_logits[:, :t + 2], atol=1e-5)
        assert not np.allclose(new_logits[:, t + 2:], base_logits[:, t + 2:])


def test_commitment_loss_gradient_reaches_query_projection(rng):
  with tf.Graph().as_default():
    _, losses = build(small_hparams(), TRAIN, {"targets": random_targets(rng)})
    q_kernel = [v for v in tf1.global_variables()
                if "decoder_layer_1" in v.name and v.name.endswith("/q/kernel:0")][0]
    grad = tf1.gradients(losses["extra_loss"], [q_kernel])[0]
    assert np.abs(run(grad)).max() > 0


def _means_var():
  return [v for v in tf1.global_variables() if v.name.endswith("cluster_attention/means:0")][0]


@pytest.mark.parametrize("mode", [TRAIN, EVAL])
def test_centroids_move_only_in_train(rng, mode):
  with tf.Graph().as_default():
    _, losses = build(small_hparams(), mode, {"targets": random_targets(rng)})
    means = _means_var()
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      before = sess.run(means)
      sess.run(losses)
      after = sess.run(means)
  if mode == TRAIN:
    assert np.abs(after - before).max() > 0
  else:
    np.testing.assert_array_equal(after, before)


def test_without_ema_only_the_gradient_moves_the_centroids(rng):
  """ema=False: the train step's EMA update leaves the (trainable) means alone; one optimizer
  step on the codebook + commitment loss moves them."""
  with tf.Graph().as_default():
    _, losses = build(small_hparams(ema=False), TRAIN, {"targets": random_targets(rng)})
    means = _means_var()
    assert means in tf1.trainable_variables()
    step = tf1.train.GradientDescentOptimizer(1.0).minimize(losses["extra_loss"],
                                                            var_list=[means])
    ema_count = [v for v in tf1.global_variables() if v.name.endswith("/ema_count:0")][0]
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      before = sess.run(means)
      sess.run(losses)
      np.testing.assert_array_equal(sess.run(means), before)
      assert sess.run(ema_count).sum() > 0  # the update ran: only the statistics moved
      sess.run(step)
      assert np.abs(sess.run(means) - before).max() > 0


def test_data_parallel_shards_share_one_centroid_update(rng):
  """Two shards: one EMA step from the shard-averaged statistics (not one update per shard)."""
  h = small_hparams()
  targets = random_targets(rng, batch=4, pad_from=48)
  with tf.Graph().as_default():
    _, losses = build(h, TRAIN, {"targets": targets}, shards=2)
    count = [v for v in tf1.global_variables() if v.name.endswith("ema_count:0")]
    assert len(count) == 1  # the shards reuse the layer's variables
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      sess.run(losses["extra_loss"])
      ema_count = sess.run(count[0])
  tokens_per_shard = 2 * 48  # two sequences of 48 real tokens per shard
  np.testing.assert_allclose(ema_count.sum(axis=-1), (1 - h.decay) * tokens_per_shard, rtol=1e-5)


@pytest.mark.parametrize("legacy", [False, True])
def test_legacy_kmeans_counts_reach_the_centroid_update(rng, legacy):
  """legacy_kmeans_counts=True: one train step's EMA counts are the original's counts of the
  step's assignments (one-hot [b, h, n, c] reshaped to [-1, h, c], summed); False: per head."""
  h = small_hparams(legacy_kmeans_counts=legacy)
  targets = random_targets(rng, pad_from=50)
  with tf.Graph().as_default():
    p_hparams = problem_hparams.test_problem_hparams(VOCAB, VOCAB, h)
    model = model_lib.RoutingTransformer(h, TRAIN, p_hparams)
    _, losses = model.model_fn_sharded({"targets": [tf.constant(targets)]})
    (steps,) = model._kmeans_steps.values()  # pylint: disable=protected-access
    count = [v for v in tf1.global_variables() if v.name.endswith("ema_count:0")][0]
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      _, clusters, weights = sess.run([losses["extra_loss"], steps[0].clusters[0],
                                       steps[0].weights])
      ema_count = sess.run(count)
  one_hot = np.eye(h.sparsity_cluster_size)[clusters] * weights[:, None, :, None]
  interleaved = one_hot.reshape(-1, one_hot.shape[1], one_hot.shape[3]).sum(0)
  per_head = one_hot.sum((0, 2))
  assert not np.allclose(interleaved, per_head)
  np.testing.assert_allclose(ema_count, (1 - h.decay) * (interleaved if legacy else per_head),
                             rtol=1e-5)


def test_random_routing_builds_and_trains(rng):
  with tf.Graph().as_default():
    _, losses = build(small_hparams(random_routing=True), TRAIN,
                      {"targets": random_targets(rng)})
    assert np.isfinite(run(losses)["training"])


BAD_HPARAMS = [
    (dict(local_num_heads=3), "not divisible"),
    (dict(max_length=60, max_target_length=60), "not a multiple of query_shape"),
    (dict(memory_flange=(24,)), "memory_flange=24 is not a multiple"),
    (dict(sparsity_cluster_size=2), "leaves tokens out of every cluster"),
    (dict(sparsity_cluster_attention_window=128), "exceeds the length"),
    (dict(sparsity_cluster_size=0), "needs sparsity_cluster_size > 0"),
]


@pytest.mark.parametrize("overrides,message", BAD_HPARAMS)
def test_inconsistent_hparams_fail_with_the_fix(overrides, message):
  with pytest.raises(model_lib.HParamsError, match=message):
    model_lib.check_hparams(small_hparams(**overrides))


@pytest.mark.parametrize("overrides,message", [
    ("max_length=500,max_target_length=500",
     "not a multiple of query_shape=64; use e.g. max_length=512"),
    ("sparsity_cluster_size=4", "use sparsity_cluster_size >= 8"),
    ("local_num_heads=3",
     "hidden_size=128 is not divisible by local_num_heads + sparsity_cluster_num_heads = 5"),
    ("sparsity_cluster_size=0", "needs sparsity_cluster_size > 0"),
])
def test_tiny_set_errors_name_the_fix(overrides, message):
  """The one-line errors t2t-trainer prints for `--hparams_set=routing_transformer_tiny
  --hparams=...` (test_t2t_binaries runs two of them through the binary)."""
  import hparams  # pylint: disable=g-import-not-at-top,unused-import
  from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
  hp = registry.hparams("routing_transformer_tiny")
  hp.parse(overrides)
  with pytest.raises(model_lib.HParamsError) as error:
    model_lib.check_hparams(hp)
  assert message in str(error.value) and "\n" not in str(error.value)


def test_every_project_hparams_set_passes_the_model_checks():
  import hparams  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
  assert len(hparams.PROJECT_SETS) >= 13 + 24 + 1 + 4
  for name in hparams.PROJECT_SETS:
    model_lib.check_hparams(registry.hparams(name))
