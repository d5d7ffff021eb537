"""attention_dropout drops the attention *weights* (after the softmax, before the values and the
relative-values products) of every head kind, as the original release's utils.py does, and only
in TRAIN mode; the head outputs are not dropped.

The weights are read out exactly by attending to one-hot values: with v_j = e_j the output of
query i is its (dropped) weight row."""
import math
import zlib

import numpy as np
import pytest
import tensorflow as tf

import reference
from conftest import HParamsStandIn
from routing_transformer.core import attention

tf1 = tf.compat.v1
B, H, N, D = 2, 2, 64, 8
RATE = 0.3


def inputs(rng):
  q, k = (tf.constant(rng.standard_normal((B, H, N, D)), tf.float32) for _ in range(2))
  one_hot = tf.constant(np.broadcast_to(np.eye(N, dtype=np.float32), (B, H, N, N)))
  mu = tf.constant(reference.layer_norm(rng.standard_normal((H, 1, D))), tf.float32)
  return q, k, one_hot, mu


def kinds(mu):
  """Every head kind as fn(q, k, v, **kw) -> [b, h, n, d_v]; one routing cluster holding every
  position (window = n), so each (query, key) pair is attended once."""
  return {
      "full": lambda q, k, v, **kw: attention.full_attention(q, k, v, **kw),
      "full_noncausal_padded": lambda q, k, v, **kw: attention.full_attention(
          q, k, v, causal=False, padding=np.arange(N)[None, :] >= np.array([[N], [N - 9]]),
          **kw),
      "local": lambda q, k, v, **kw: attention.local_attention(q, k, v, 8, 16, **kw),
      "local_noncausal": lambda q, k, v, **kw: attention.local_attention(q, k, v, 8, 8,
                                                                        causal=False, **kw),
      "full_attention_heads": lambda q, k, v, **kw: attention.local_attention(q, k, v, N, 0,
                                                                             **kw),
      "routing_topk": lambda q, k, v, **kw: attention.routing_attention(q, k, v, mu, N, **kw)[0],
      "routing_noncausal_separate_keys": lambda q, k, v, **kw: attention.routing_attention(
          q, k, v, mu, N, causal=False, share_qk=False, **kw)[0],
      "routing_legacy_keys": lambda q, k, v, **kw: attention.routing_attention(
          q, k, v, mu, N, share_qk=False, legacy_causal_key_routing=True, **kw)[0],
      "causal_window": lambda q, k, v, **kw: attention.causal_window_attention(
          q, k, v, mu, N, **kw)[0],
  }


KINDS = sorted(kinds(None))


def check_dropped_weights(dropped, weights, rate):
  """Each allowed weight is 0 or weight / (1 - rate); the zeros are a `rate` share of them."""
  allowed = weights > 0
  assert allowed.sum() > 2000
  kept = dropped[allowed] != 0
  np.testing.assert_allclose(dropped[allowed][kept], weights[allowed][kept] / (1 - rate),
                             rtol=1e-5)
  assert np.all(dropped[~allowed] == 0)  # masked keys stay masked
  share = 1.0 - kept.mean()
  assert abs(share - rate) < 5 * math.sqrt(rate * (1 - rate) / allowed.sum()), share


@pytest.mark.parametrize("kind", KINDS)
def test_dropout_zeroes_weights_and_rescales_the_rest(rng, kind):
  q, k, one_hot, mu = inputs(rng)
  fn = kinds(mu)[kind]
  weights = fn(q, k, one_hot).numpy()  # [b, h, n, n]: the weight rows (routing: / 1.01)
  tf.random.set_seed(5)
  dropped = fn(q, k, one_hot, dropout_rate=RATE).numpy()
  check_dropped_weights(dropped, weights, RATE)
  again = fn(q, k, one_hot, dropout_rate=RATE).numpy()
  allowed = weights > 0
  assert np.mean((dropped[allowed] != 0) != (again[allowed] != 0)) > 0.25  # fresh draws


@pytest.mark.parametrize("kind", ["local", "routing_topk", "causal_window"])
def test_the_relative_values_product_uses_the_same_dropped_weights(rng, kind):
  """v_j = [e_j, 0] and relative values r_t = [0, e'_t] (t the distance, never clipped): the
  first half of the output is the dropped weight by key, the second by distance; they agree."""
  q, k, one_hot, mu = inputs(rng)
  radius = N
  v = tf.concat([one_hot, tf.zeros([B, H, N, 2 * radius + 1])], axis=-1)
  rel_v = np.concatenate([np.zeros((2 * radius + 1, N)), np.eye(2 * radius + 1)], axis=1)
  rel_v = tf.constant(rel_v, tf.float32)
  tf.random.set_seed(7)
  out = kinds(mu)[kind](q, k, v, relative_values=rel_v, dropout_rate=RATE).numpy()
  by_key, by_distance = out[..., :N], out[..., N:]
  i = np.arange(N)[:, None]
  if kind == "local":
    distance = np.arange(N)[None, :] - i  # key position - query position
  else:  # routing: rank distances; with one cluster holding every position, ranks = positions
    distance = np.arange(N)[None, :] - i
  remapped = np.take_along_axis(by_distance, np.broadcast_to(distance + radius, by_key.shape),
                                axis=-1)
  np.testing.assert_allclose(remapped, by_key, atol=1e-6)
  assert np.mean(by_key[by_key != 0] > 0) == 1.0 and np.mean(by_key == 0) > 0.5


@pytest.mark.parametrize("kind", KINDS)
def test_rate_zero_is_the_function_without_dropout(rng, kind):
  q, k, v, mu = inputs(rng)
  v = tf.constant(rng.standard_normal((B, H, N, D)), tf.float32)
  fn = kinds(mu)[kind]
  np.testing.assert_array_equal(fn(q, k, v, dropout_rate=0.0).numpy(), fn(q, k, v).numpy())


def test_rate_outside_the_unit_interval_is_refused(rng):
  q, k, v, _ = inputs(rng)
  with pytest.raises(ValueError, match="must be in"):
    attention.full_attention(q, k, v, dropout_rate=1.0)


def layer_hparams(**overrides):
  h = HParamsStandIn(
      hidden_size=32, local_num_heads=2, sparsity_cluster_num_heads=2, sparsity_skip_first=0,
      sparsity_cluster_size=2, sparsity_cluster_attention_window=16, query_shape=(8,),
      memory_flange=(8,), memory_query_shape=(8,), share_qk=True, routing_mode="topk",
      random_routing=False, legacy_causal_key_routing=False, max_relative_position=0,
      local_relative=True, sparsity_cluster_relative=True, head_dense=False,
      attention_dropout=0.5, decay=0.999, beta=1e-4, ema=True, max_length=32,
      max_target_length=32)
  h.__dict__.update(overrides)
  return h


def initialize(sess):
  """Initialises the graph's variables, the dense kernels to values fixed by their names (the
  Keras-made initial kernels differ between graphs even under one graph seed)."""
  sess.run(tf1.global_variables_initializer())
  for var in tf1.global_variables():
    if var.op.name.endswith("kernel"):
      shape = var.shape.as_list()
      var.load(np.random.default_rng(zlib.crc32(var.op.name.encode())).normal(
          0, shape[0] ** -0.5, shape).astype(np.float32), sess)


def constant_value_layer(run_layer, hparams, x):
  """Runs `run_layer(x)` ([b, n, hidden] graph tensor -> output) with the value projection
  giving v = 1 everywhere (x[..., 0] = 1, v kernel row 0 = 1) and output_transform = identity,
  so the output is the heads' outputs side by side; returns them [b, n, heads, d]."""
  with tf.Graph().as_default():
    tf1.set_random_seed(3)
    y = run_layer(tf.constant(x))
    variables = {v.op.name: v for v in tf1.global_variables()}
    with tf1.Session() as sess:
      initialize(sess)
      for name, var in variables.items():
        if name.endswith("v/kernel"):
          value = np.zeros(var.shape.as_list(), np.float32)
          value[0] = 1.0
          var.load(value, sess)
        if name.endswith("output_transform/kernel"):
          var.load(np.eye(hparams.hidden_size, dtype=np.float32), sess)
      out = sess.run(y)
  heads = hparams.local_num_heads + hparams.sparsity_cluster_num_heads
  return out.reshape(out.shape[:2] + (heads, hparams.hidden_size // heads))


def layer_input(rng, n=32):
  x = rng.standard_normal((2, n, 32)).astype(np.float32)
  x[..., 0] = 1.0
  return x


@pytest.mark.parametrize("routing_mode", ["topk", "causal_window"])
def test_the_layer_drops_weights_not_head_outputs_and_only_in_train(rng, routing_mode):
  """With v = 1 every head output is (sum of kept weights) / (1 - p) in all d channels: equal
  channels (a dropped *output* would zero single channels), not all 1 (weights were dropped).
  train=False equals attention_dropout=0 exactly."""
  from routing_transformer.core import layers  # pylint: disable=g-import-not-at-top
  x = layer_input(rng)

  def run(hparams, train):
    return constant_value_layer(
        lambda t: layers.self_attention(t, hparams, 0, None, causal=True, train=train)[0],
        hparams, x)

  hparams = layer_hparams(routing_mode=routing_mode)
  dropped = run(hparams, True)
  np.testing.assert_allclose(dropped, np.broadcast_to(dropped[..., :1], dropped.shape),
                             rtol=1e-5, atol=1e-6)
  plain = run(layer_hparams(routing_mode=routing_mode, attention_dropout=0.0), True)
  assert np.abs(dropped - plain).max() > 0.1  # some weights were dropped in every kind
  assert np.all(np.abs(dropped - plain).max(axis=(0, 1, 3)) > 0.1)  # in every head
  np.testing.assert_array_equal(run(hparams, False), plain)


def test_encdec_attention_drops_weights_only_in_train(rng):
  from routing_transformer.core import layers  # pylint: disable=g-import-not-at-top
  x, memory = layer_input(rng), layer_input(rng)
  padding = np.arange(32)[None, :] >= np.array([[32], [25]])

  def run(hparams, train):
    return constant_value_layer(
        lambda t: layers.encdec_attention(t, tf.constant(memory), hparams,
                                          tf.constant(padding), train=train), hparams, x)

  hparams = layer_hparams()
  plain = run(layer_hparams(attention_dropout=0.0), True)
  np.testing.assert_allclose(plain, 1.0, rtol=1e-5)  # weights sum to 1, v = 1
  np.testing.assert_array_equal(run(hparams, False), plain)
  dropped = run(hparams, True)
  np.testing.assert_allclose(dropped, np.broadcast_to(dropped[..., :1], dropped.shape),
                             rtol=1e-5, atol=1e-6)
  assert np.abs(dropped - plain).max() > 0.1


@pytest.mark.parametrize("routing_mode", ["topk", "causal_window"])
def test_cached_decoding_steps_never_drop(rng, routing_mode):
  """self_attention's cached decoding steps with attention_dropout=0.9 equal
  attention_dropout=0."""
  from routing_transformer.core import layers  # pylint: disable=g-import-not-at-top
  x = layer_input(rng)

  def steps(rate):
    hparams = layer_hparams(routing_mode=routing_mode, attention_dropout=rate,
                            sparsity_cluster_size=4)
    with tf.Graph().as_default(), tf1.variable_scope("layer", reuse=tf1.AUTO_REUSE):
      tf1.set_random_seed(3)
      cache = layers.self_attention_cache(hparams, 0, 2, 32)
      outs = []
      for t in range(6):
        y, _, _ = layers.self_attention(tf.constant(x[:, t:t + 1]), hparams, 0, cache=cache,
                                        position=tf.constant(t))
        outs.append(y)
      with tf1.Session() as sess:
        initialize(sess)
        return sess.run(outs)

  for a, b in zip(steps(0.9), steps(0.0)):
    np.testing.assert_array_equal(a, b)


def test_keras_layer_drops_weights_only_in_training(rng):
  from routing_transformer.core import keras as rt_keras  # pylint: disable=g-import-not-at-top
  layer = rt_keras.RoutingSelfAttention(32, local_heads=2, routing_heads=2, num_clusters=2,
                                        window=16, block_length=8, flange=8, head_dense=False,
                                        attention_dropout=0.5)
  x = tf.constant(layer_input(rng))
  layer(x)
  v = np.zeros((32, 32), np.float32)
  v[0] = 1.0
  layer.v_kernel.assign(v)
  layer.output_kernel.assign(np.eye(32, dtype=np.float32))
  plain = layer(x, training=False).numpy().reshape(2, 32, 4, 8)
  before = layer.means.numpy()
  dropped = layer(x, training=True).numpy().reshape(2, 32, 4, 8)
  layer.means.assign(before)
  np.testing.assert_allclose(dropped, np.broadcast_to(dropped[..., :1], dropped.shape),
                             rtol=1e-5, atol=1e-6)
  assert np.abs(dropped - plain).max() > 0.1
  np.testing.assert_array_equal(layer(x, training=False).numpy().reshape(2, 32, 4, 8), plain)
