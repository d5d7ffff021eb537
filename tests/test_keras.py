"""Keras layers (routing_transformer.core.keras), in both virtualenvs: Keras 2.15 (tf.keras of TF
2.15.1, the T2T stack, `make test`) and Keras 3 on current TensorFlow (`make test-current`).

The layer equals the functional path (layers.self_attention) with the same weights; EMA only in
training, with the global batch's statistics under MirroredStrategy; XLA; `.keras` files keep the
centroids; Keras masks are honoured; mixed precision keeps k-means and softmax in float32; a
non-TensorFlow backend fails with one line."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from conftest import HParamsStandIn, ROOT
from routing_transformer.core import keras as rt_keras

keras = rt_keras.keras
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
  """Keras weight name (Keras 2: "layer/q:0", Keras 3: "q") -> the variable name
  layers.self_attention creates."""
  base = keras_name.split("/")[-1].split(":")[0]
  if base in ("q", "k", "v", "head_dense", "output_transform"):
    return base + "/kernel"
  if base in ("means", "ema_count", "ema_means"):
    return "routing/cluster_attention/" + base
  if base == "routing_logit_scale":
    return "routing/logit_scale"
  kind, table = base.split("_", 1)  # routing|local _ relative_positions_{keys,values}
  return "%s/%s/embeddings" % (kind, table)


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
  assert all(w is not layer.means for w in layer.trainable_weights)


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
  model.compile(optimizer=keras.optimizers.Adam(1e-3),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
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
  loaded = keras.models.load_model(path)
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


def test_keras_mask_is_honoured(rng):
  """Embedding(mask_zero=True) -> attention: outputs at real positions do not depend on what the
  padded positions hold (here: the embedding of id 0), also through the routing membership."""
  ids = rng.integers(1, 16, size=(2, LENGTH)).astype(np.int32)
  ids[1, 40:] = 0
  for causal in (False, True):
    inputs = keras.Input((LENGTH,), dtype="int32")
    embedding = keras.layers.Embedding(16, HIDDEN, mask_zero=True)
    attention = small_layer(causal=causal)
    model = keras.Model(inputs, attention(embedding(inputs)))
    unmasked = keras.Model(inputs, attention(keras.layers.Lambda(lambda x: x * 1.0)(
        keras.layers.Embedding(16, HIDDEN, name="plain")(inputs))))
    unmasked.get_layer("plain").set_weights(embedding.get_weights())
    before, before_unmasked = model(ids).numpy(), unmasked(ids).numpy()
    np.testing.assert_allclose(before[0], before_unmasked[0], rtol=1e-5, atol=1e-6)  # no padding
    table = embedding.get_weights()[0]
    table[0] = 10.0 * rng.normal(size=HIDDEN)
    embedding.set_weights([table])
    unmasked.get_layer("plain").set_weights([table])
    after, after_unmasked = model(ids).numpy(), unmasked(ids).numpy()
    np.testing.assert_allclose(after[:, :40], before[:, :40], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(after[0], before[0])
    # without the mask the padded vectors reach the real positions
    assert np.abs(after_unmasked[1, :40] - before_unmasked[1, :40]).max() > 1e-2


@pytest.mark.parametrize("policy,rtol,flips", [("mixed_float16", 0.02, 12),
                                               ("mixed_bfloat16", 0.1, 12)])
def test_mixed_precision_keeps_kmeans_and_softmax_in_float32(rng, policy, rtol, flips):
  keras.utils.set_random_seed(0)
  ids = rng.integers(1, 16, size=(2, LENGTH)).astype(np.int32)
  ids[1, 50:] = 0
  reference = tiny_lm()
  reference(ids)
  keras.mixed_precision.set_global_policy(policy)
  try:
    mixed = tiny_lm()
    mixed(ids)
  finally:
    keras.mixed_precision.set_global_policy("float32")
  mixed.set_weights(reference.get_weights())
  layer = mixed.attention_layers()[1]
  low = {"mixed_float16": tf.float16, "mixed_bfloat16": tf.bfloat16}[policy]
  assert tf.as_dtype(layer.compute_dtype) == low
  for weight in (layer.means, layer.ema_count, layer.ema_means):
    assert tf.as_dtype(weight.dtype) == tf.float32
  want, got = reference(ids, training=False).numpy(), mixed(ids, training=False)
  assert got.dtype == tf.float32
  # Per position: close, except where a near tie of routing scores resolves the other way in low
  # precision (a position joins another cluster's top-w, which moves the positions after it in
  # the next layer): at most `flips` of the 128 positions (Keras 3, seeds 0-4: 0-4 positions in
  # float16 over 2%, 1-4 in bfloat16 over 10%, medians 0.07% and 1%; Keras 2.15, seed 0: 7 in
  # float16), the median position well inside.
  error = np.abs(got.numpy() - want).max(axis=-1) / np.abs(want).max()
  assert np.sum(error > rtol) <= flips, np.sort(error.ravel())[-10:]
  assert np.median(error) < rtol / 4, np.median(error)
  assert float(mixed.losses[0]) == pytest.approx(float(reference.losses[0]), rel=rtol)
  # One EMA step in float32 from the low-precision activations: this step's counts and sums (the
  # EMA's increments) as the float32 model's, up to the few positions a near tie sends elsewhere.
  steps = []
  for model in (reference, mixed):
    km = model.attention_layers()[1]
    count, sums = km.ema_count.numpy(), km.ema_means.numpy()
    model(ids, training=True)
    steps.append(((km.ema_count.numpy() - km.decay * count) / (1 - km.decay),
                  (km.ema_means.numpy() - km.decay * sums) / (1 - km.decay)))
  assert tf.as_dtype(tf.convert_to_tensor(layer.means).dtype) == tf.float32
  (want_counts, want_sums), (counts, sums) = steps
  assert want_counts.sum() == pytest.approx(2 * (2 * LENGTH - 14), rel=1e-4)  # heads x real
  np.testing.assert_allclose(counts, want_counts, atol=4.01)
  np.testing.assert_allclose(sums, want_sums, atol=rtol * np.abs(want_sums).max())


def test_non_tensorflow_backend_fails_with_one_line(monkeypatch):
  monkeypatch.setattr(keras.backend, "backend", lambda: "jax")
  for make in (lambda: small_layer(), tiny_lm):
    with pytest.raises(rt_keras.BackendError) as error:
      make()
    message = str(error.value)
    assert "\n" not in message and "'jax'" in message and "KERAS_BACKEND=tensorflow" in message


def test_keras_backend_variable_in_a_fresh_process():
  """KERAS_BACKEND=jax: Keras 3 fails in our one line (whether jax is installed or not); Keras 2
  always computes with TensorFlow and ignores the variable."""
  env = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="3",
             PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
  run = subprocess.run([sys.executable, "-c", "import routing_transformer.core.keras as k; "
                        "print(k.keras.backend.backend())"],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
  if rt_keras.KERAS3:
    assert run.returncode != 0
    last = run.stderr.strip().splitlines()[-1]
    assert last == ("routing_transformer.core.keras.BackendError: routing_transformer.core.keras "
                    "needs Keras's TensorFlow backend, but Keras runs on 'jax': set "
                    "KERAS_BACKEND=tensorflow before keras is imported."), run.stderr
  else:
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["tensorflow"]


MIRRORED = r"""
import json, sys
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from routing_transformer.core import keras as rt_keras
keras = rt_keras.keras


def lm():
  return rt_keras.RoutingTransformerLM(vocab_size=16, length=64, hidden_size=32, filter_size=64,
                                       num_layers=1, skip_first=0, num_clusters=4, window=16,
                                       block_length=16, flange=16)


def one_step(model, ids):
  model.compile(optimizer=keras.optimizers.SGD(0.1),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  model.fit(ids, ids, batch_size=len(ids), epochs=1, verbose=0, shuffle=False)


ids = np.random.default_rng(0).integers(1, 16, size=(4, 64)).astype(np.int32)
ids[3, 40:] = 0
single = lm()
single(ids)
start = single.get_weights()
one_step(single, ids)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
  mirrored = lm()
  mirrored(ids)
  mirrored.set_weights(start)
  one_step(mirrored, ids)
out = {"replicas": strategy.num_replicas_in_sync}
for name, model in (("single", single), ("mirrored", mirrored)):
  layer = model.attention_layers()[0]
  out[name] = {w: getattr(layer, w).numpy().tolist() for w in ("means", "ema_count")}
layer = mirrored.attention_layers()[0]
variable = layer.means.value if rt_keras.KERAS3 else layer.means
out["per_replica"] = [np.asarray(v).tolist() for v in strategy.experimental_local_results(variable)]
print("RESULT" + json.dumps(out))
"""


def test_mirrored_fit_step_updates_centroids_with_the_global_batch():
  """One fit step under MirroredStrategy on 2 logical CPUs (2 examples per replica) leaves the
  centroids of a single-replica step on the same 4 examples, on both replicas (the counts are
  those of all 4 examples, not of one replica's 2)."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
             PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
  run = subprocess.run([sys.executable, "-c", MIRRORED], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=600)
  assert run.returncode == 0, run.stderr[-3000:]
  out = json.loads(run.stdout.split("RESULT", 1)[1])
  assert out["replicas"] == 2
  single, mirrored = out["single"], out["mirrored"]
  np.testing.assert_allclose(mirrored["ema_count"], single["ema_count"], rtol=1e-6)
  np.testing.assert_allclose(mirrored["means"], single["means"], rtol=1e-5, atol=1e-5)
  assert len(out["per_replica"]) == 2
  np.testing.assert_array_equal(out["per_replica"][0], out["per_replica"][1])
  np.testing.assert_array_equal(out["per_replica"][0], mirrored["means"])
  # per head (2): 4 examples x 64 positions less 24 padded, times 1 - decay (one replica: 2 x 64)
  np.testing.assert_allclose(np.sum(mirrored["ema_count"], axis=-1), [(4 * 64 - 24) * 1e-3] * 2,
                             rtol=1e-5)


def test_layers_round_trip_through_a_keras_file(rng, tmp_path):
  """A functional model of the layers (masking on, learned logit scale, causal_window block)
  saved as .keras loads back with the same configs, centroids and outputs."""
  ids = rng.integers(1, 16, size=(2, LENGTH)).astype(np.int32)
  ids[1, 50:] = 0
  inputs = keras.Input((LENGTH,), dtype="int32")
  x = keras.layers.Embedding(16, HIDDEN, mask_zero=True)(inputs)
  x = small_layer(logit_scale="learned", exclude_self=True, name="routing")(x)
  x = rt_keras.RoutingTransformerBlock(HIDDEN, filter_size=64, num_clusters=4, window=16,
                                       block_length=16, flange=16, routing_mode="causal_window",
                                       max_relative_position=17, name="block")(x)
  model = keras.Model(inputs, x)
  model(ids, training=True)  # one EMA step: the saved centroids are not the initial ones
  want = model(ids).numpy()
  path = str(tmp_path / "layers.keras")
  model.save(path)
  loaded = keras.models.load_model(path)
  for name in ("routing", "block"):
    assert loaded.get_layer(name).get_config() == model.get_layer(name).get_config()
  np.testing.assert_array_equal(loaded.get_layer("block").attention.means.numpy(),
                                model.get_layer("block").attention.means.numpy())
  np.testing.assert_allclose(loaded(ids).numpy(), want, rtol=1e-5, atol=1e-6)
