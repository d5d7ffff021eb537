"""Keras API: the layer equals the T2T functional path with the same weights; EMA only in training;
XLA; save/load keeps the centroids."""

import numpy as np
import pytest
import tensorflow as tf

from conftest import HParamsStandIn
from routing_transformer.core import keras as rt_keras

tf1 = tf.compat.v1
HIDDEN, LENGTH = 32, 64


def small_layer(**overrides):
  config = dict(hidden_size=HIDDEN, local_heads=2, routing_heads=2, num_clusters=4, window=16,
                block_length=16, flange=16, max_relative_position=17)
  config.update(overrides)
  return rt_keras.RoutingSelfAttention(**config)


def hparams_of(layer):
  """The T2T hparams (attributes read by layers.self_attention) of a Keras layer's config."""
  return HParamsStandIn(
      hidden_size=layer.hidden_size, local_num_heads=layer.local_heads,
      sparsity_cluster_num_heads=layer.routing_heads, sparsity_skip_first=0,
      sparsity_cluster_size=layer.num_clusters,
      sparsity_cluster_attention_window=layer.window, query_shape=(layer.block_length,),
      memory_flange=(layer.flange,), share_qk=layer.share_qk, routing_mode=layer.routing_mode,
      random_routing=False, legacy_causal_key_routing=False,
      max_relative_position=layer.max_relative_position,
      local_relative=layer.local_relative, sparsity_cluster_relative=layer.routing_relative,
      head_dense=layer.head_dense, attention_dropout=0.0, decay=layer.decay, beta=layer.beta,
      ema=True, routing_exclude_self=layer.exclude_self, routing_logit_scale=layer.logit_scale)


def t2t_name(keras_name):
  """Keras weight name -> the variable name layers.self_attention creates."""
  base = keras_name.split("/", 1)[1].split(":")[0]
  if base in ("q", "k", "v", "head_dense", "output_transform"):
    return base + "/kernel"
  if base in ("means", "ema_count", "ema_means"):
    return "routing/cluster_attention/" + base
  if base == "routing/logit_scale":
    return base
  return base + "/embeddings"  # routing|local/relative_positions_{keys,values}


def functional(layer, x, padding, train):
  """layers.self_attention in a tf.compat.v1 graph with the Keras layer's weights.

  Returns (y, commitment loss, means after one EMA step (train) or None)."""
  from routing_transformer.core import layers  # pylint: disable=g-import-not-at-top
  names = {t2t_name(w.name): w.numpy() for w in layer.weights}
  with tf.Graph().as_default():
    y, loss, step = layers.self_attention(tf.constant(x), hparams_of(layer), 0,
                                          None if padding is None else tf.constant(padding),
                                          causal=layer.causal, train=train)
    update = step.km.update_from_statistics(*step.statistics())[0] if step else tf.no_op()
    variables = {v.op.name: v for v in tf1.global_variables()}
    assert sorted(names) == sorted(variables), (sorted(names), sorted(variables))
    with tf1.Session() as sess:
      for name, value in names.items():
        variables[name].load(value, sess)
      y, loss = sess.run([y, loss])
      sess.run(update)
      means = sess.run(variables["routing/cluster_attention/means"]) if step else None
  return y, loss, means


@pytest.mark.parametrize("overrides,use_padding", [
    ({}, False),
    ({"routing_mode": "causal_window"}, True),
    ({"causal": False, "share_qk": False, "max_relative_position": 0}, True),
    ({"local_heads": 0, "routing_heads": 4, "head_dense": False}, False),
    ({"exclude_self": True, "logit_scale": "learned"}, True),
    ({"routing_mode": "causal_window", "exclude_self": True, "logit_scale": "rsqrt_depth"}, False),
], ids=["topk", "causal_window_padding", "encoder_separate_qk", "routing_only",
        "exclude_self_learned_scale", "causal_window_extensions"])
def test_layer_equals_functional_self_attention(rng, overrides, use_padding):
  layer = small_layer(**overrides)
  x = rng.normal(size=(2, LENGTH, HIDDEN)).astype(np.float32)
  padding = None
  if use_padding:
    padding = np.zeros((2, LENGTH), bool)
    padding[1, 50:] = True
  y = layer(tf.constant(x), padding=padding, training=False)  # builds; no EMA step
  want_y, want_loss, want_means = functional(layer, x, padding, train=True)
  np.testing.assert_allclose(y.numpy(), want_y, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(float(layer.losses[-1]), want_loss, rtol=1e-5)
  layer(tf.constant(x), padding=padding, training=True)  # one EMA step
  np.testing.assert_allclose(layer.means.numpy(), want_means, rtol=1e-4, atol=1e-6)


def test_ema_updates_only_when_training(rng):
  layer = small_layer()
  x = tf.constant(rng.normal(size=(2, LENGTH, HIDDEN)).astype(np.float32))
  layer(x)
  before = [w.numpy() for w in (layer.means, layer.ema_count, layer.ema_means)]
  np.testing.assert_array_equal(before[0], before[2])  # ema_means starts at the means
  layer(x, training=False)
  tf.function(lambda: layer(x, training=False), jit_compile=True)()
  for w, b in zip((layer.means, layer.ema_count, layer.ema_means), before):
    np.testing.assert_array_equal(w.numpy(), b)
  layer(x, training=True)
  # One step by hand: every position (2 x 64, 2 heads) lands in some cluster.
  np.testing.assert_allclose(layer.ema_count.numpy().sum(axis=-1), [2 * LENGTH * 1e-3] * 2,
                             rtol=1e-5)
  assert not np.allclose(layer.means.numpy(), before[0])


def test_xla_training_call_equals_eager(rng):
  x = tf.constant(rng.normal(size=(2, LENGTH, HIDDEN)).astype(np.float32))
  eager, compiled = small_layer(routing_mode="causal_window"), None
  eager(x)
  compiled = small_layer(routing_mode="causal_window")
  compiled(x)
  compiled.set_weights(eager.get_weights())
  want = eager(x, training=True)
  got = tf.function(lambda: compiled(x, training=True), jit_compile=True)()
  np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(compiled.means.numpy(), eager.means.numpy(), rtol=1e-5, atol=1e-6)


def test_gradients_reach_projections_not_centroids(rng):
  layer = small_layer()
  x = tf.constant(rng.normal(size=(1, LENGTH, HIDDEN)).astype(np.float32))
  with tf.GradientTape() as tape:
    y = layer(x, training=True)
    loss = tf.reduce_sum(y ** 2) + tf.add_n(layer.losses)
  grads = tape.gradient(loss, layer.trainable_weights)
  assert all(g is not None and np.any(tf.convert_to_tensor(g).numpy() != 0) for g in grads)
  assert layer.means not in layer.trainable_weights


def test_bad_config_fails_with_one_line():
  with pytest.raises(ValueError, match="not divisible by local_heads"):
    rt_keras.RoutingSelfAttention(hidden_size=30, local_heads=2, routing_heads=2)
  with pytest.raises(ValueError, match="routing_mode='sorted' is not supported"):
    rt_keras.RoutingSelfAttention(hidden_size=32, routing_mode="sorted")


def tiny_lm():
  return rt_keras.RoutingTransformerLM(vocab_size=16, length=LENGTH, hidden_size=HIDDEN,
                                       filter_size=64, num_layers=2, num_clusters=4, window=16,
                                       block_length=16, flange=16, max_relative_position=17)


def test_lm_fit_moves_centroids_and_keras_file_round_trip(rng, tmp_path):
  model = tiny_lm()
  ids = rng.integers(1, 16, size=(4, LENGTH)).astype(np.int32)
  model.compile(optimizer=tf.keras.optimizers.Adam(1e-3), jit_compile=True,
                loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  model(ids)
  routing_layer = model.attention_layers()[1]
  start = routing_layer.means.numpy()
  model.fit(ids, ids, batch_size=2, epochs=1, verbose=0)
  assert len(model.losses) == 1  # layer 0 is all local (skip_first=1)
  assert not np.allclose(routing_layer.means.numpy(), start)
  assert routing_layer.ema_count.numpy().sum() > 0
  want = model(ids, training=False).numpy()

  path = str(tmp_path / "lm.keras")
  model.save(path)
  loaded = tf.keras.models.load_model(path)
  np.testing.assert_array_equal(loaded.attention_layers()[1].means.numpy(),
                                routing_layer.means.numpy())
  np.testing.assert_array_equal(loaded.attention_layers()[1].ema_count.numpy(),
                                routing_layer.ema_count.numpy())
  np.testing.assert_allclose(loaded(ids, training=False).numpy(), want, rtol=1e-5, atol=1e-6)


def test_lm_later_positions_do_not_change_earlier_logits_causal_window(rng):
  model = rt_keras.RoutingTransformerLM(vocab_size=16, length=LENGTH, hidden_size=HIDDEN,
                                        filter_size=64, num_clusters=4, window=16,
                                        block_length=16, flange=16,
                                        routing_mode="causal_window")
  ids = rng.integers(1, 16, size=(1, LENGTH)).astype(np.int32)
  changed = ids.copy()
  changed[:, 40:] = rng.integers(1, 16, size=(1, LENGTH - 40))
  a, b = model(ids).numpy(), model(changed).numpy()
  np.testing.assert_array_equal(a[:, :41], b[:, :41])  # position i sees tokens < i
  assert not np.allclose(a[:, 41:], b[:, 41:])
