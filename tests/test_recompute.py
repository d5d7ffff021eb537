"""The memory switches (core/memory.py) give the plain step's values: recompute_layers (gradients,
loss, one k-means EMA update; also under XLA), recompute_attention and logits_chunk_size."""
import contextlib

import numpy as np
import pytest
import tensorflow as tf

import conftest
from routing_transformer.core import memory
from routing_transformer.t2t import model as model_lib
from test_model import EVAL, TRAIN, VOCAB, build, random_targets, small_hparams

tf1 = tf.compat.v1
KMEANS = ("/means:0", "/ema_count:0", "/ema_means:0")
LENGTH = 32


def tiny_hparams(**overrides):
  """2 layers (the second with 2 routing heads of 4 clusters x 8), length 32, hidden 16."""
  h = small_hparams(max_length=LENGTH, max_target_length=LENGTH, hidden_size=16,
                    embedding_dims=16, filter_size=32, sparsity_cluster_attention_window=8,
                    query_shape=(8,), memory_flange=(8,), memory_query_shape=(8,),
                    max_relative_position=9)
  for key, value in overrides.items():
    setattr(h, key, value)
  return h


def _step(hparams, features, initial=None, xla=False):
  """One step in a fresh graph: (values of every variable before, loss, gradients by variable
  name, k-means variables after, the graph)."""
  graph = tf.Graph()
  with graph.as_default():
    with tf.xla.experimental.jit_scope() if xla else contextlib.nullcontext():
      _, losses = build(hparams, TRAIN, features, input_vocab=VOCAB)
      loss = losses["training"] + losses["extra_loss"]
      variables = tf1.trainable_variables()
      grads = [tf.convert_to_tensor(g) for g in tf1.gradients(loss, variables)]
    kmeans = {v.name: v for v in tf1.global_variables() if v.name.endswith(KMEANS)}
    every = {v.name: v for v in tf1.global_variables()}
    # Few session.run signatures (each one prunes and optimises the graph again): the initial
    # values go in as feeds of the initializers' inputs, the variables come out in one fetch.
    feeds = {} if initial is None else {
        v.initializer.inputs[1]: initial[name] for name, v in every.items()}
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer(), feeds)
      before = sess.run(every)
      metadata = tf1.RunMetadata()
      loss_value, grad_values = sess.run(  # also runs the centroid update
          [loss, grads], options=tf1.RunOptions(output_partition_graphs=True),
          run_metadata=metadata)
      after = sess.run(kmeans)
  compiled = [n for g in metadata.partition_graphs for n in g.node if n.op == "_XlaRun"]
  assert bool(compiled) == xla  # jit_scope really compiled clusters with XLA
  grads = {v.name: g for v, g in zip(variables, grad_values)}
  return before, loss_value, grads, after, graph


# Each case builds and runs the step twice (a few seconds each); XLA compiles both.
CASES = [
    ("encoder_decoder", False, dict(num_encoder_layers=1)),
    ("separate_keys_no_ema_xla", True, dict(share_qk=False, ema=False)),
    # pre-norm (no postprocess tail) and a T2T norm (the whole block, postprocess included)
    ("pre_norm", False, dict(layer_preprocess_sequence="n", layer_postprocess_sequence="da")),
    ("t2t_l2_norm", False, dict(norm_type="l2")),
    # the attention recomputed inside the recomputed layers, separate keys
    ("attention_separate_keys", False, dict(share_qk=False, recompute_attention=True)),
    # bfloat16 activations: the post-norm tail's float32 sum leaves the block as float32
    ("bfloat16", False, dict(activation_dtype="bfloat16")),
]


@pytest.mark.parametrize("case,xla,overrides", CASES, ids=[c[0] for c in CASES])
def test_recompute_equals_the_plain_step(rng, case, xla, overrides):
  del case
  features = {"targets": random_targets(rng, length=LENGTH, pad_from=28)}
  if overrides.get("num_encoder_layers"):
    features["inputs"] = random_targets(rng, length=LENGTH, pad_from=20)
  before, loss, grads, after, _ = _step(tiny_hparams(**overrides), features, xla=xla)
  before2, loss2, grads2, after2, _ = _step(
      tiny_hparams(recompute_layers=True, **overrides), features, before, xla=xla)
  assert set(before2) == set(before)  # recompute creates no variables
  np.testing.assert_allclose(loss2, loss, rtol=1e-6)
  assert set(grads2) == set(grads) and len(grads) > 10
  for name, g in grads.items():
    np.testing.assert_allclose(grads2[name], g, rtol=1e-5, atol=1e-6, err_msg=name)
  assert set(after2) == set(after) and after
  for name, value in after.items():  # one EMA step from the same statistics
    np.testing.assert_allclose(after2[name], value, rtol=1e-5, atol=1e-7, err_msg=name)
    if overrides.get("ema", True) or not name.endswith("/means:0"):
      assert np.abs(value - before[name]).max() > 0, name  # the update ran


def test_recompute_refuses_random_numbers_inside_blocks(rng):
  with tf.Graph().as_default():
    with pytest.raises(model_lib.HParamsError, match="relu_dropout"):
      build(tiny_hparams(recompute_layers=True, relu_dropout=0.1), TRAIN,
            {"targets": random_targets(rng, length=LENGTH)})


def test_recompute_is_off_by_default_and_ignored_outside_training(rng):
  assert small_hparams().recompute_layers is False
  with tf.Graph().as_default():
    build(tiny_hparams(recompute_layers=True, relu_dropout=0.1),
          tf.estimator.ModeKeys.EVAL, {"targets": random_targets(rng, length=LENGTH)})


def test_recompute_with_variables_equals_the_plain_function():
  """memory.recompute around a function that makes variables (tf.compat.v1.get_variable): the
  same outputs and gradients (input and variables) as the plain function; the replay reuses
  the forward's variables, a side output carries no gradient."""
  x_value = np.random.default_rng(2).normal(size=(3, 4))

  def fn(x, replay=False):
    del replay
    w = tf1.get_variable("w", [4, 5], tf.float64, tf1.random_normal_initializer(seed=1))
    y = tf.tanh(tf.matmul(x, w))
    return y, tf.reduce_sum(tf.square(y)), tf.reduce_max(y)

  values = []
  for recomputed in (False, True):
    with tf.Graph().as_default():
      x = tf.constant(x_value)
      with tf1.variable_scope("block"):
        y, loss, side = memory.recompute(fn, [x], differentiable=2) if recomputed else fn(x)
      variables = tf1.trainable_variables()
      assert [v.name for v in variables] == ["block/w:0"]
      grads = tf1.gradients([y, loss], [x] + variables, [tf.ones_like(y) * 0.3, None])
      with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        values.append(sess.run([y, loss, side] + grads))
  for got, want in zip(values[1], values[0]):
    np.testing.assert_allclose(got, want, rtol=1e-12)


def model_step(hparams, features, initial=None, mode=TRAIN):
  """(variables before, training loss, gradients by variable name, logits) of the model in a
  new graph, the variables initialised from `initial` when given."""
  graph = tf.Graph()
  with graph.as_default():
    tf1.set_random_seed(1)
    logits, losses = build(hparams, mode, features)
    loss = losses["training"]
    variables = tf1.trainable_variables()
    grads = [tf.convert_to_tensor(g) for g in tf1.gradients(loss, variables)]
    every = {v.name: v for v in tf1.global_variables()}
    feeds = {} if initial is None else {
        v.initializer.inputs[1]: initial[name] for name, v in every.items()}
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer(), feeds)
      before = sess.run(every)
      loss_value, grad_values, logits_value = sess.run([loss, grads, logits])
  return before, loss_value, {v.name: g for v, g in zip(variables, grad_values)}, logits_value


@pytest.mark.parametrize("overrides", [
    {}, {"recompute_layers": True}, {"share_qk": False}, {"routing_mode": "causal_window"},
    {"local_num_heads": 5, "sparsity_cluster_num_heads": 3},
    {"local_num_heads": 5, "sparsity_cluster_num_heads": 3, "recompute_layers": True}])
def test_model_gradients_with_recompute_attention_equal_the_plain_step(rng, overrides):
  """The whole training step (2 layers of local and routing heads, padding) with
  recompute_attention, alone and inside recompute_layers: the same loss and gradients; with 5
  local heads their groups are uneven (2, 2, 1; the first layer has local heads alone)."""
  features = {"targets": random_targets(rng, length=64, pad_from=50)}
  before, loss, grads, _ = model_step(small_hparams(**overrides), features)
  _, loss2, grads2, _ = model_step(small_hparams(recompute_attention=True, **overrides),
                                   features, before)
  np.testing.assert_allclose(loss2, loss, rtol=1e-7)
  assert set(grads2) == set(grads) and len(grads) > 10
  for name, g in grads.items():
    np.testing.assert_allclose(grads2[name], g, rtol=1e-5, atol=1e-7, err_msg=name)


def test_recompute_attention_refuses_random_numbers(rng):
  with tf.Graph().as_default(), pytest.raises(ValueError, match="recompute_attention"):
    build(small_hparams(recompute_attention=True, attention_dropout=0.1), TRAIN,
          {"targets": random_targets(rng)})


# --- chunked output projection + cross-entropy (logits_chunk_size) ----------------------------

def sparse_xent(logits, labels):
  return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)


def loss_values(rng, chunk):
  """(loss, gradients w.r.t. x, kernel, bias) of the chunked loss (chunk > 0) or the plain one
  (chunk 0) on the same random inputs (float64; b 2, n 7, e 4, vocab 11)."""
  with tf.Graph().as_default():
    x = tf.constant(rng.standard_normal((2, 7, 4)))
    kernel = tf.constant(rng.standard_normal((4, 11)))
    bias = tf.constant(rng.standard_normal(11))
    labels = tf.constant(rng.integers(0, 11, (2, 7)), tf.int32)
    weights = tf.constant(rng.integers(0, 2, (2, 7)), tf.float64)
    if chunk:
      loss = memory.chunked_loss(x, kernel, bias, labels, weights, chunk, sparse_xent)
    else:
      loss = tf.reduce_sum(sparse_xent(memory.project(x, kernel, bias), labels) * weights)
    grads = tf1.gradients(3.0 * loss, [x, kernel, bias])
    with tf1.Session() as sess:
      return sess.run([loss, grads])


@pytest.mark.parametrize("chunk", [1, 3, 7, 10])
def test_chunked_loss_and_gradients_equal_the_plain_loss(chunk):
  loss, grads = loss_values(np.random.default_rng(5), chunk)
  loss_plain, grads_plain = loss_values(np.random.default_rng(5), 0)
  np.testing.assert_allclose(loss, loss_plain, rtol=1e-13)
  for got, want in zip(grads, grads_plain):
    assert np.abs(want).max() > 0
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)
  assert memory.chunk_bounds(7, 3) == [(0, 3), (3, 3), (6, 1)]


@pytest.mark.parametrize("overrides,length,pad_from", [
    ({}, 64, 50),
    (dict(label_smoothing=0.1, hidden_size=48, embedding_dims=32), 64, None),
    ({"recompute_layers": True}, 40, 30),  # shorter than the static length 64
])
def test_model_chunked_loss_equals_the_t2t_loss(rng, overrides, length, pad_from):
  """logits_chunk_size=16 (4 chunks of the 64 positions): the training loss and every gradient
  equal T2T's loss on the whole logits (label smoothing, final_dense_1, padding, recompute)."""
  features = {"targets": random_targets(rng, length=length, pad_from=pad_from)}
  before, loss, grads, logits = model_step(small_hparams(**overrides), features)
  before2, loss2, grads2, logits2 = model_step(small_hparams(logits_chunk_size=16, **overrides),
                                               features, before)
  assert set(before2) == set(before)  # the same variables
  np.testing.assert_allclose(loss2, loss, rtol=1e-6)
  assert set(grads2) == set(grads) and len(grads) > 10
  for name, g in grads.items():
    np.testing.assert_allclose(grads2[name], g, rtol=1e-5, atol=1e-6, err_msg=name)
  # The logits are still there for whoever fetches them (computed whole then).
  np.testing.assert_allclose(logits2, logits, rtol=1e-5, atol=1e-5)


def test_train_logits_give_the_eval_loss(rng):
  """TRAIN returns the logits of all max_length positions (T2T's loss pads the targets with
  weight-0 zeros to that length); its loss equals the EVAL loss on the sliced logits."""
  features = {"targets": random_targets(rng, length=40, pad_from=33)}
  before, loss, _, logits = model_step(small_hparams(), features)
  _, loss_eval, _, logits_eval = model_step(small_hparams(), features, before, mode=EVAL)
  assert logits.shape == (2, 64, 1, 1, VOCAB) and logits_eval.shape == (2, 40, 1, 1, VOCAB)
  np.testing.assert_allclose(loss, loss_eval, rtol=1e-6)
  np.testing.assert_allclose(logits[:, :40], logits_eval, rtol=1e-5, atol=1e-6)


def test_train_logits_are_sliced_when_the_loss_needs_the_targets_length(rng):
  """With targets_mask (T2T multiplies the [b, 40] mask into the loss weights), TRAIN slices the
  logits to the targets' length; its loss is the EVAL loss (the same mask)."""
  mask = np.ones((2, 40), np.float32)
  mask[:, 30:] = 0.0
  features = {"targets": random_targets(rng, length=40), "targets_mask": mask}
  before, loss, _, logits = model_step(small_hparams(), features)
  _, loss_eval, _, _ = model_step(small_hparams(), features, before, mode=EVAL)
  _, loss_unmasked, _, _ = model_step(small_hparams(), {"targets": features["targets"]}, before)
  assert logits.shape == (2, 40, 1, 1, VOCAB)
  np.testing.assert_allclose(loss, loss_eval, rtol=1e-6)
  # at initialisation every token's loss is near ln(VOCAB), so dropping a quarter of them moves
  # the mean by ~1e-4, far above float32 rounding (~5e-7 here)
  assert abs(loss - loss_unmasked) > 1e-5


def test_chunked_loss_refuses_what_it_does_not_compute(rng):
  features = {"targets": random_targets(rng), "targets_mask": np.ones((2, 64), np.float32)}
  with tf.Graph().as_default():
    with pytest.raises(model_lib.HParamsError, match="targets_mask.*logits_chunk_size=0"):
      build(small_hparams(logits_chunk_size=16), TRAIN, features)
  assert small_hparams().logits_chunk_size == 0  # off by default (and in every paper set)


# --- the feed-forward block a chunk of positions at a time (ffn_chunk_size) -------------------

def ffn_values(rng, chunk, ffn_layer):
  """(FFN output, gradients w.r.t. x and every FFN variable) of `layers.ffn` in training, chunked
  (chunk > 0) or whole, float64 on the same random inputs (b 2, n 7, hidden 4, filter 6)."""
  from routing_transformer.core import layers  # pylint: disable=g-import-not-at-top
  hparams = small_hparams(hidden_size=4, filter_size=6, ffn_layer=ffn_layer, relu_dropout=0.0,
                          ffn_chunk_size=chunk)
  with tf.Graph().as_default():
    x = tf.constant(rng.standard_normal((2, 7, 4)))
    with tf1.variable_scope("ffn", initializer=tf1.random_normal_initializer(seed=3,
                                                                             dtype=tf.float64)):
      y = layers.ffn(x, hparams, train=True)
    variables = sorted(tf1.trainable_variables(), key=lambda v: v.name)
    upstream = tf.constant(rng.standard_normal((2, 7, 4)))  # a gradient that differs per position
    grads = tf1.gradients(y, [x] + variables, upstream)
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      return sess.run([y, grads]), [v.name for v in variables]


@pytest.mark.parametrize("ffn_layer", ["geglu", "dense_relu_dense"])
@pytest.mark.parametrize("chunk", [1, 3, 7, 10])
def test_chunked_ffn_values_and_gradients_equal_the_whole_ffn(ffn_layer, chunk):
  (y, grads), names = ffn_values(np.random.default_rng(8), chunk, ffn_layer)
  (y_plain, grads_plain), names_plain = ffn_values(np.random.default_rng(8), 0, ffn_layer)
  assert names == names_plain and len(names) == (3 if ffn_layer == "geglu" else 4)
  assert np.abs(y_plain).max() > 0
  np.testing.assert_allclose(y, y_plain, rtol=1e-13, atol=1e-14)
  for got, want, name in zip(grads, grads_plain, ["x"] + names):
    assert np.abs(want).max() > 0, name
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13, err_msg=name)


@pytest.mark.parametrize("overrides", [
    {"recompute_layers": True}, {"ffn_layer": "dense_relu_dense", "logits_chunk_size": 16}])
def test_model_chunked_ffn_equals_the_plain_step(rng, overrides):
  """ffn_chunk_size=24 (chunks of 24, 24 and 16 of the 64 positions): the training loss and every
  gradient equal the plain step's, inside recompute_layers and beside chunked logits."""
  features = {"targets": random_targets(rng, length=64, pad_from=50)}
  before, loss, grads, _ = model_step(small_hparams(**overrides), features)
  _, loss2, grads2, _ = model_step(small_hparams(ffn_chunk_size=24, **overrides), features,
                                   before)
  np.testing.assert_allclose(loss2, loss, rtol=1e-6)
  assert set(grads2) == set(grads) and len(grads) > 10
  for name, g in grads.items():
    np.testing.assert_allclose(grads2[name], g, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("overrides", [
    dict(recompute_layers=True, ffn_chunk_size=8), dict(ffn_chunk_size=8, logits_chunk_size=8),
    dict(recompute_layers=True, recompute_attention=True, ffn_chunk_size=8,
         logits_chunk_size=8)], ids=["layers_ffn", "ffn_logits", "all"])
def test_grappler_optimizes_the_steps_with_memory_switches(rng, overrides):
  """Grappler's arithmetic optimizer (which turns gelu's pow(x, 3) into multiplications; without
  it pow took 16% of bench-8k's step) accepts the gradients with the memory switches, e.g.
  recompute_layers with ffn_chunk_size, where no gradient reads the re-run block's feed-forward
  output: the chunks' re-runs wait through control inputs, not through identities of the split's
  outputs, which it hoisted above the split into a cycle ("couldn't be sorted in topological
  order")."""
  from tensorflow.core.protobuf import config_pb2  # pylint: disable=g-import-not-at-top
  from tensorflow.python.grappler import tf_optimizer  # pylint: disable=g-import-not-at-top
  graph = tf.Graph()
  with graph.as_default():
    _, losses = build(tiny_hparams(**overrides), TRAIN,
                      {"targets": random_targets(rng, length=LENGTH)})
    for grad in tf1.gradients(losses["training"], tf1.trainable_variables()):
      if grad is not None:
        graph.add_to_collection("train_op", tf.convert_to_tensor(grad).op)
    meta_graph = tf1.train.export_meta_graph(graph=graph)
  config = config_pb2.ConfigProto()
  config.graph_options.rewrite_options.optimizers.extend(
      ["common_subgraph_elimination", "constfold", "arithmetic"])
  optimized = tf_optimizer.OptimizeGraph(config, meta_graph)  # raised InvalidArgumentError
  assert len(optimized.node) > 100


def test_chunked_ffn_refuses_relu_dropout_and_bad_sizes(rng):
  features = {"targets": random_targets(rng)}
  with tf.Graph().as_default(), pytest.raises(ValueError, match="relu_dropout.*ffn_chunk_size"):
    build(small_hparams(ffn_chunk_size=16, relu_dropout=0.1), TRAIN, features)
  with tf.Graph().as_default(), pytest.raises(model_lib.HParamsError,
                                              match="ffn_chunk_size=-1 must be 0"):
    build(small_hparams(ffn_chunk_size=-1), TRAIN, features)
  assert small_hparams().ffn_chunk_size == 0  # off by default (and in every paper set)


@pytest.mark.parametrize("chunk", [None, 64], ids=["block", "chunks"])
def test_recompute_tensors_replays_after_the_forward_pass_under_grappler(rng, chunk):
  """recompute_tensors' re-run (GEGLU's, as in layers.ffn) runs in the backward pass in a session
  with Grappler's default rewrites: no tensor of the block's size under its gradient is computed
  before the forward pass ends. Control inputs on the re-run's ops were not enough: the
  arithmetic optimizer turned gelu's pow(a, 3) into a * square(a) with a new square without
  them, which the executor ran in the forward pass and kept (64 MiB per layer at bench-8k)."""
  from routing_transformer.core import layers  # pylint: disable=g-import-not-at-top
  n, e, f = 256, 32, 256
  graph = tf.Graph()
  with graph.as_default():
    w1, w2, w3, w4 = [tf1.get_variable("w%d" % i, initializer=rng.standard_normal(s).astype(
        np.float32) * 0.1) for i, s in enumerate([(e, f), (e, f), (f, e), (e, e)], 1)]
    x = tf.constant(rng.standard_normal((1, n, e)).astype(np.float32))
    geglu = lambda x, w1, w2, w3: layers.matmul(
        layers.gelu(layers.matmul(x, w1)) * layers.matmul(x, w2), w3)
    if chunk:
      y = memory.chunked(geglu, [x], [tf.convert_to_tensor(w) for w in (w1, w2, w3)], chunk)
    else:
      a, b = layers.matmul(x, w1), layers.matmul(x, w2)
      y = memory.recompute_tensors(lambda a, b, w: layers.matmul(layers.gelu(a) * b, w), a, b,
                                   tf.convert_to_tensor(w3))
    for i in range(4):  # more forward pass after the block
      y = tf.tanh(layers.matmul(y, w4), name="last" if i == 3 else None)
    loss = tf.reduce_sum(tf.square(y))
    grads = tf1.gradients(loss, [w1, w2, w3, w4])
    with tf1.Session(config=conftest.grappler_config()) as sess:
      sess.run(tf1.global_variables_initializer())
      metadata = tf1.RunMetadata()
      sess.run(grads, options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE),
               run_metadata=metadata)
  nodes = [s for d in metadata.step_stats.dev_stats for s in d.node_stats]
  forward_end = max(s.all_start_micros + s.all_end_rel_micros for s in nodes
                    if s.node_name == "last")
  size = (chunk or n) * f * 4  # bytes of the block's (or a chunk's) [.., f] tensors
  early = [s.node_name for s in nodes if "IdentityN_grad" in s.node_name and s.output and sum(
      o.tensor_description.allocation_description.requested_bytes for o in s.output) >= size
           and s.all_start_micros < forward_end]
  replayed = [s.node_name for s in nodes if "IdentityN_grad" in s.node_name]
  assert len(replayed) > 10  # the re-run ran, under the name this test reads
  assert early == []
