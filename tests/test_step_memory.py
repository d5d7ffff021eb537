"""Value tests of the layer's pieces against plain references: GEGLU against T2T's gelu block,
the per-kind q/k/v projections against the sliced heads, dense against tf.compat.v1.layers.dense,
the causal_window scoring against a dense reference (and its exact causality), the masked softmax
variants, local attention's memory product, top-k routing's self mask; and the benchmark tools'
arithmetic."""

import numpy as np
import pytest
import tensorflow as tf

from conftest import HParamsStandIn, benchmark_module
import routing_transformer  # pylint: disable=unused-import
from routing_transformer.core import heads
from routing_transformer.core import layers
from routing_transformer.core.attention import causal_window as cw
from routing_transformer.core.attention import common
from routing_transformer.core.attention import local
from routing_transformer.core.attention import routing
from tensor2tensor.layers import common_layers

tf1 = tf.compat.v1


def run_graph(fetches, feeds=None):
  with tf1.Session() as sess:
    sess.run(tf1.global_variables_initializer())
    return sess.run(fetches, feeds)


# --- GEGLU ------------------------------------------------------------------------------------

FFN = HParamsStandIn(ffn_layer="geglu", filter_size=24, hidden_size=8, relu_dropout=0.0)


def plain_geglu(x, w1, w2, w3):
  """The GEGLU block with T2T's gelu, as the original release computes it."""
  dot = lambda a, w: tf.tensordot(a, w, [[2], [0]])
  return dot(common_layers.gelu(dot(x, w1)) * dot(x, w2), w3)


def ffn_and_plain(rng, dtype, plain=False):
  """(y, gradients of sum(y * cotangent) w.r.t. x and the three kernels, graph) of layers.ffn
  (or, plain=True, of plain_geglu on the same variables) in a new graph."""
  graph = tf.Graph()
  with graph.as_default():
    tf1.set_random_seed(3)  # the same initial values in both graphs (the same ops before them)
    x = tf.constant(rng.standard_normal((2, 5, 8)), dtype)
    with tf1.variable_scope("ffn", initializer=tf1.random_normal_initializer(0.0, 0.5)):
      y = layers.ffn(x, FFN, train=True)
    kernels = [v for v in tf1.global_variables() if v.name.startswith("ffn/weight")]
    assert [v.name for v in kernels] == ["ffn/weight%d/kernel:0" % i for i in (1, 2, 3)]
    assert all(v.dtype.base_dtype == dtype for v in kernels)
    if plain:
      y = plain_geglu(x, *[tf.convert_to_tensor(v) for v in kernels])
    cotangent = tf.constant(rng.standard_normal((2, 5, 8)), dtype)
    grads = tf1.gradients(tf.reduce_sum(y * cotangent), [x] + kernels)
    values = run_graph([y, grads])
  return values, graph


@pytest.mark.parametrize("dtype,rtol", [(tf.float64, 1e-12), (tf.float32, 1e-5)])
def test_geglu_ffn_equals_the_t2t_gelu_block(dtype, rtol):
  (y, grads), _ = ffn_and_plain(np.random.default_rng(0), dtype)
  (y_plain, grads_plain), _ = ffn_and_plain(np.random.default_rng(0), dtype, plain=True)
  np.testing.assert_allclose(y, y_plain, rtol=rtol)
  for got, want, name in zip(grads, grads_plain, ["x", "weight1", "weight2", "weight3"]):
    assert np.abs(want).max() > 0, name
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * np.abs(want).max(), err_msg=name)


# what the backward pass reads of the forward's products: name -> the scopes that made them
# --- q/k/v per head kind ----------------------------------------------------------------------

def layer_hparams(**overrides):
  """One layer of 2 routing + 2 local heads of d = 8 (hidden 32), length 64."""
  values = dict(hidden_size=32, local_num_heads=2, sparsity_cluster_num_heads=2,
                sparsity_skip_first=0, sparsity_cluster_size=4,
                sparsity_cluster_attention_window=16, query_shape=(16,), memory_flange=(16,),
                max_length=64, max_target_length=64, share_qk=True, routing_mode="topk",
                random_routing=False, legacy_causal_key_routing=False,
                max_relative_position=9, local_relative=True, sparsity_cluster_relative=True,
                head_dense=True, attention_dropout=0.0, decay=0.999, beta=1e-4, ema=True)
  values.update(overrides)
  return HParamsStandIn(**values)


def sliced_reference(x, hp, padding, causal):
  """The layer as computed before the per-kind projections: whole q/k/v projections sliced by
  strided slices into the kinds (reads the variables of a layers.self_attention already built
  in the current scope)."""
  num_routing, _, depth = layers.head_counts(hp, 0)
  total = hp.local_num_heads + hp.sparsity_cluster_num_heads

  def project(name):
    kernel = tf.convert_to_tensor(layers.dense_kernel(name, hp.hidden_size, hp.hidden_size))
    return heads.split_heads(layers.matmul(x, kernel), total)

  q, k, v = project("q") * depth ** -0.5, project("k"), project("v")
  km, rel_k, rel_v = layers.routing_variables(hp, 0)
  config = layers.head_config(hp, x.shape[1])
  out_r, _ = heads.routing_heads_attention(
      q[:, :num_routing], k[:, :num_routing], v[:, :num_routing], km.means, config, causal,
      padding, (rel_k, rel_v), layers.routing_options(hp, 0))
  out_l = heads.local_heads_attention(q[:, num_routing:], k[:, num_routing:],
                                      v[:, num_routing:], config, causal, padding,
                                      layers.local_variables(hp, 0))
  return layers.attention_output(tf.concat([out_r, out_l], axis=1), hp)


@pytest.mark.parametrize("overrides,causal,use_padding", [
    ({}, True, False),
    ({"share_qk": False}, True, True),
    ({"routing_mode": "causal_window"}, True, True),
    ({"share_qk": False}, False, True),  # encoder self-attention
])
def test_per_kind_projections_equal_the_sliced_heads(rng, overrides, causal, use_padding):
  """layers.self_attention (per-kind projections, tf.split) against the whole projections
  sliced per kind: the same outputs and gradients (x, every kernel and table)."""
  hp = layer_hparams(**overrides)
  padding = None
  if use_padding:
    padding = np.zeros((2, 64), bool)
    padding[1, 50:] = True
  with tf.Graph().as_default():
    x = tf.constant(rng.standard_normal((2, 64, 32)), tf.float32)
    pad = None if padding is None else tf.constant(padding)
    with tf1.variable_scope("layer"):
      y, _, _ = layers.self_attention(x, hp, 0, pad, causal=causal)
    with tf1.variable_scope("layer", reuse=True):
      y_ref = sliced_reference(x, hp, pad, causal)
    variables = tf1.trainable_variables()
    cotangent = tf.constant(rng.standard_normal((2, 64, 32)), tf.float32)
    if padding is not None:  # outputs at padding positions are not defined
      cotangent *= tf.constant(~padding[:, :, None], tf.float32)
    grads = tf1.gradients(tf.reduce_sum(y * cotangent), [x] + variables)
    grads_ref = tf1.gradients(tf.reduce_sum(y_ref * cotangent), [x] + variables)
    names = ["x"] + [v.name for v in variables]
    assert [g is None for g in grads] == [g is None for g in grads_ref] == [False] * len(names)
    dense = lambda gs: [tf.convert_to_tensor(g) for g in gs]  # gathers give IndexedSlices
    y, y_ref, grads, grads_ref = run_graph([y, y_ref, dense(grads), dense(grads_ref)])
  real = np.ones((2, 64), bool) if padding is None else ~padding
  np.testing.assert_allclose(y[real], y_ref[real], rtol=1e-5, atol=1e-6)
  for got, want, name in zip(grads, grads_ref, names):
    assert np.abs(want).max() > 0, name
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=name)


def test_kernels_made_apart_start_as_dense_makes_them():
  """dense, dense_kernel and dense_variables give their kernels the initializer
  tf.compat.v1.layers.dense gives its own (without a scope initializer: Keras' glorot_uniform,
  not get_variable's), so the per-kind projections, GEGLU and the output layer start from the
  same kind of draw as before; with a scope initializer, that one."""
  def initializer_ops(graph, name):
    return sorted(op.type for op in graph.get_operations()
                  if op.name.startswith(name + "/kernel/Initializer/"))

  for scope_initializer in (None, tf1.random_normal_initializer(0.0, 0.5)):
    with tf.Graph().as_default() as graph:
      with tf1.variable_scope("s", initializer=scope_initializer):
        tf1.layers.dense(tf.zeros([2, 3, 4]), 5, name="reference")
        layers.dense(tf.zeros([2, 3, 4]), 5, "a")
        layers.dense_kernel("b", 4, 5)
        layers.dense_variables("c", 4, 5)
      want = initializer_ops(graph, "s/reference")
      assert want and all(initializer_ops(graph, "s/" + name) == want for name in "abc")


@pytest.mark.parametrize("use_bias", [False, True])
def test_dense_equals_the_compat_v1_dense_layer(rng, use_bias):
  """`layers.dense` creates the variables tf.compat.v1.layers.dense creates (names, shapes), its
  ops in the same name scope, and with the same variable values gives the same output and the
  same gradients of x, kernel and bias (float64)."""
  with tf.Graph().as_default() as graph:
    x = tf.constant(rng.standard_normal((2, 6, 4)))
    dy = tf.constant(rng.standard_normal((2, 6, 5)))
    want = tf1.layers.dense(x, 5, use_bias=use_bias, name="reference")
    got = layers.dense(x, 5, "ours", use_bias=use_bias)
    ours, reference = [[v for v in tf1.global_variables() if v.name.startswith(name + "/")]
                       for name in ("ours", "reference")]
    assert [v.name.replace("ours/", "reference/") for v in ours] == [v.name for v in reference]
    assert [v.shape for v in ours] == [v.shape for v in reference]
    assert graph.get_operation_by_name("ours/Tensordot/MatMul").type == "MatMul"
    copy = [a.assign(b) for a, b in zip(ours, reference)]
    grads = [tf.gradients(y, [x] + variables, dy) for y, variables in ((got, ours),
                                                                      (want, reference))]
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      sess.run(copy)
      (got, want), (grads, grads_ref) = sess.run([(got, want), grads])
  np.testing.assert_allclose(got, want, rtol=1e-12)
  for g, r in zip(grads, grads_ref):
    np.testing.assert_allclose(g, r, rtol=1e-12)


# --- causal_window scoring --------------------------------------------------------------------

def dense_causal_window(q, k, v, centroids, window, share_qk, padding, rel_k, rel_v):
  """Strictly causal routing as one dense [n, n] softmax per head, in TensorFlow (so it has
  gradients): allowed = same cluster, j <= i, rank distance > -window, key not padding;
  relative positions by rank distance. Returns (output [b, h, n, d], probabilities [b, h, n, n])."""
  q_hat = common.layer_norm_no_scale(q)
  k_hat = q_hat if share_qk else common.layer_norm_no_scale(k)
  n = q.shape[2]
  scores = tf.einsum("hcd,bhnd->bhnc", tf.stop_gradient(centroids), q_hat)
  clusters = tf.argmax(scores, axis=-1, output_type=tf.int32)  # [b, h, n]
  one_hot = tf.one_hot(clusters, centroids.shape[1], dtype=tf.int32)
  rank = tf.reduce_sum(tf.cumsum(one_hot, axis=2, exclusive=True) * one_hot, axis=-1)
  distance = rank[..., tf.newaxis, :] - rank[..., :, tf.newaxis]  # key rank - query rank
  same = tf.equal(clusters[..., :, tf.newaxis], clusters[..., tf.newaxis, :])
  causal = tf.range(n)[tf.newaxis, :] <= tf.range(n)[:, tf.newaxis]
  allowed = same & causal & (distance > -window)
  if padding is not None:
    allowed &= ~tf.constant(padding)[:, tf.newaxis, tf.newaxis, :]
  radius = (rel_k.shape[0] - 1) // 2
  index = tf.clip_by_value(distance, -radius, radius) + radius  # [b, h, n, n]
  logits = tf.einsum("bhid,bhjd->bhij", q_hat, k_hat)
  logits += tf.einsum("bhid,bhijd->bhij", q_hat, tf.gather(rel_k, index))
  logits = tf.where(allowed, logits, tf.constant(-1e30, logits.dtype))
  probs = tf.nn.softmax(logits) * tf.cast(allowed, logits.dtype)
  out = tf.einsum("bhij,bhjd->bhid", probs, v)
  out += tf.einsum("bhij,bhijd->bhid", probs, tf.gather(rel_v, index))
  return out, probs


@pytest.mark.parametrize("n,window,clusters,share_qk,pad_last", [
    (32, 8, 4, True, 0),   # blocks of 8, one look-back block
    (30, 8, 3, False, 3),  # n not a multiple of the block; padding
    (35, 5, 3, True, 0),   # odd window
    (24, 24, 1, True, 4),  # one cluster, window = n: dense causal attention
])
def test_causal_window_gradients_equal_a_dense_reference(rng, n, window, clusters, share_qk,
                                                         pad_last):
  q, k, v = [tf.constant(rng.standard_normal((2, 2, n, 8))) for _ in range(3)]
  mu = tf.constant(rng.standard_normal((2, clusters, 8)))
  rel_k, rel_v = [tf.constant(rng.standard_normal((9, 8))) for _ in range(2)]
  padding = None
  if pad_last:
    padding = np.zeros((2, n), bool)
    padding[1, -pad_last:] = True
  real = np.ones((2, n), bool) if padding is None else ~padding
  cotangent = tf.constant(rng.standard_normal((2, 2, n, 8)) * real[:, None, :, None])
  inputs = [q, v, rel_k, rel_v] + ([] if share_qk else [k])
  with tf.GradientTape(persistent=True) as tape:
    tape.watch(inputs)
    out, aux = cw.causal_window_attention(q, k, v, mu, window, share_qk=share_qk,
                                          padding=padding, relative_keys=rel_k,
                                          relative_values=rel_v)
    want, probs = dense_causal_window(q, k, v, mu, window, share_qk, padding, rel_k, rel_v)
    loss, loss_want = tf.reduce_sum(out * cotangent), tf.reduce_sum(want * cotangent)
  mask = real[:, None, :, None]
  np.testing.assert_allclose(np.where(mask, out, 0), np.where(mask, want, 0), atol=1e-12)
  self_weight = np.einsum("bhii->bhi", probs.numpy())  # the weight on itself
  np.testing.assert_allclose(np.where(real[:, None], aux["self_weight"], 0),
                             np.where(real[:, None], self_weight, 0), atol=1e-12)
  for got, expected in zip(tape.gradient(loss, inputs), tape.gradient(loss_want, inputs)):
    got, expected = tf.convert_to_tensor(got), tf.convert_to_tensor(expected)  # gathers: slices
    assert np.abs(expected).max() > 0
    np.testing.assert_allclose(got, expected, atol=1e-11)


def kept_and_values(graph, got, want, wrt, loss, gate_gradients=False, dtype=None):
  """Gradients of loss(got) and of loss(want) with respect to `wrt` in `graph`: (the forward
  tensors each backward pass reads, benchmarks/common.py kept_for_backward, for got and for
  want; the values [got, want, *dgot, *dwant], cast to `dtype` when given)."""
  common_bench = benchmark_module("common")
  with graph.as_default():
    dgot = tf1.gradients(loss(got), wrt, gate_gradients=gate_gradients)
    dwant = tf1.gradients(loss(want), wrt, gate_gradients=gate_gradients)
    kept = [common_bench.kept_for_backward(graph, d)[0] for d in (dgot, dwant)]
    fetches = [got, want] + dgot + dwant
    with tf1.Session(graph=graph) as sess:
      values = sess.run([tf.cast(t, dtype) for t in fetches] if dtype else fetches)
  return kept[0], kept[1], values


@pytest.mark.parametrize("dtype", [tf.float64, tf.float32, tf.bfloat16])
def test_zero_empty_softmax_is_the_zeroed_softmax_and_keeps_only_its_output(rng, dtype):
  """masked_softmax(..., zero_empty=True) against the softmax of the masked logits followed by
  zero_empty_rows: the same values (bit for bit in float32 and float64), the same gradient
  (empty rows get 0), and its backward pass reads one [..., m] tensor, its output, where the
  softmax-then-product keeps two (the softmax's output for its gradient, the zeroed product for
  the product with the values)."""
  logits_np = rng.standard_normal((2, 5, 24)) * 3.0
  allowed_np = rng.random((2, 5, 24)) < 0.5
  allowed_np[:, 1] = False  # empty rows
  cotangent_np = rng.standard_normal((2, 5, 3))
  graph = tf.Graph()
  with graph.as_default():
    logits = tf.exp(tf.constant(logits_np, dtype)) - 1.0  # an op: its kept outputs are counted
    allowed, cotangent = tf.constant(allowed_np), tf.constant(cotangent_np, dtype)
    v = tf.exp(tf.constant(rng.standard_normal((2, 24, 3)), dtype))
    got = common.masked_softmax(logits, allowed, zero_empty=True)
    wide = tf.float32 if dtype == tf.bfloat16 else dtype
    want = tf.cast(common.zero_empty_rows(common.masked_softmax(tf.cast(logits, wide), allowed),
                                          allowed), dtype)
  kept_got, kept_want, values = kept_and_values(
      graph, got, want, [logits, v],
      lambda p: tf.reduce_sum(tf.cast(tf.matmul(p, v) * cotangent, wide)), dtype=tf.float64)
  got_v, want_v, dgot_v, dwant_v = values[0], values[1], values[2], values[4]
  assert got.dtype == dtype
  assert not got_v[:, 1].any() and not dgot_v[:, 1].any()
  if dtype == tf.bfloat16:  # float32 inside, rounded once
    np.testing.assert_array_equal(got_v, want_v)
    np.testing.assert_allclose(dgot_v, dwant_v, rtol=0.02, atol=0.02)
  else:
    np.testing.assert_array_equal(got_v, want_v)
    np.testing.assert_allclose(dgot_v, dwant_v, rtol=1e-5 if dtype == tf.float32 else 1e-12,
                               atol=1e-7 if dtype == tf.float32 else 1e-15)


@pytest.mark.parametrize("adjoint_b", [True, False], ids=["logits", "outputs"])
@pytest.mark.parametrize("before,after", [(1, 0), (2, 0), (1, 1)])
def test_memory_product_rebuilds_the_blocks_for_its_gradient(rng, before, after, adjoint_b):
  """local.memory_product against the plain matmul of local.memory_blocks: the same values and
  the same gradients of both operands bit for bit (the same ops run), the values also equal to
  the einsum it replaced, and its backward pass reads x [b, h, n, d], not the blocks
  [b, h, nb, W, d]."""
  block, width = 4, (before + 1 + after) * 4
  a_width, out_width = (6, width) if adjoint_b else (width, 6)
  equation = "bhnqd,bhnkd->bhnqk" if adjoint_b else "bhnqk,bhnkd->bhnqd"
  graph = tf.Graph()
  with graph.as_default():
    a = tf.exp(tf.constant(rng.standard_normal((2, 3, 5, block, a_width)), tf.float32))
    x = tf.exp(tf.constant(rng.standard_normal((2, 3, 5 * block, 6)), tf.float32))
    cotangent = tf.constant(rng.standard_normal((2, 3, 5, block, out_width)), tf.float32)
    got = local.memory_product(a, x, block, before, after, adjoint_b=adjoint_b)
    blocks = local.memory_blocks(x, block, before, after)
    want = tf.matmul(a, blocks, adjoint_b=adjoint_b)
    einsum = tf.einsum(equation, a, blocks)
  kept_got, kept_want, values = kept_and_values(
      graph, got, want, [a, x], lambda y: tf.reduce_sum(y * cotangent))
  np.testing.assert_array_equal(values[0], values[1])
  np.testing.assert_array_equal(values[2], values[4])
  np.testing.assert_array_equal(values[3], values[5])
  with tf1.Session(graph=graph) as session:
    np.testing.assert_allclose(session.run(einsum), values[0], rtol=1e-6)


@pytest.mark.parametrize("dtype", [tf.float64, tf.float32])
@pytest.mark.parametrize("causal,key_start", [(True, 0), (True, -8), (False, -4)])
def test_relative_outputs_recompute_the_unskewed_weights(rng, dtype, causal, key_start):
  """common.relative_outputs (a memory.recompute_tensors block) against the plain product of
  `unskew` and the distances' rows: the same values and gradients of the weights and the table
  bit for bit (the same ops run), and its backward pass reads the weights [..., q, k] (which the
  product with the values keeps anyway), not the unskewed [..., q, u] copy."""
  q, k, d = 4, 12, 3
  graph = tf.Graph()
  with graph.as_default():
    probs = tf.exp(tf.constant(rng.standard_normal((2, 3, q, k)), dtype))
    table = tf.exp(tf.constant(rng.standard_normal((2 * 16 + 1, d)), dtype))
    cotangent = tf.constant(rng.standard_normal((2, 3, q, d)), dtype)
    got = common.relative_outputs(probs, table, 0, key_start, causal=causal)
    rows = common._distance_rows(table, 0, q, key_start, k, causal, dtype)  # pylint: disable=protected-access
    unskewed = common.unskew(probs, rows.shape[0])
    want = tf.tensordot(unskewed, rows, [[3], [0]])
  kept_got, kept_want, values = kept_and_values(
      graph, got, want, [probs, table], lambda y: tf.reduce_sum(y * cotangent))
  for got_v, want_v in zip(values[0:1] + values[2:4], values[1:2] + values[4:6]):
    np.testing.assert_array_equal(got_v, want_v)
  assert np.abs(values[3]).max() > 0
  assert [v[2] for v in kept_want.values() if v[3][-1] != d] == ["Pad"], kept_want  # unskewed
  assert [v[1] for v in kept_got.values() if v[3][-1] != d] == [probs.op.name], kept_got


def test_ordered_softmax_equals_the_softmax_and_its_gradient(rng):
  """masked_softmax(ordered=True) (causal_window's: a sequential denominator) against tf.nn.softmax of
  the masked logits, float64: values and gradients; a row with nothing allowed is uniform as
  with masked_softmax; and a row's values do not move when its entries shift within the row."""
  logits = tf.constant(rng.standard_normal((3, 4, 40)) * 3.0)
  allowed = tf.constant(rng.random((3, 4, 40)) < 0.6)
  allowed = tf.concat([allowed[:, :3], tf.zeros([3, 1, 40], tf.bool)], axis=1)  # empty rows
  cotangent = tf.constant(rng.standard_normal((3, 4, 40)))
  with tf.GradientTape(persistent=True) as tape:
    tape.watch(logits)
    got = common.masked_softmax(logits, allowed, ordered=True)
    want = common.masked_softmax(logits, allowed)
    loss, loss_want = tf.reduce_sum(got * cotangent), tf.reduce_sum(want * cotangent)
  np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-15)
  np.testing.assert_allclose(got[:, 3], np.full((3, 40), 1 / 40), rtol=1e-14)
  np.testing.assert_allclose(tape.gradient(loss, logits), tape.gradient(loss_want, logits),
                             rtol=1e-12, atol=1e-14)
  window = rng.standard_normal(37).astype(np.float32)  # 37 entries shifted through 64 slots
  rows = np.full((27, 64), -1e30, np.float32)
  for shift in range(27):
    rows[shift, shift:shift + 37] = window
  probs = common.masked_softmax(tf.constant(rows), tf.constant(rows > -1e29), ordered=True).numpy()
  for shift in range(27):
    np.testing.assert_array_equal(probs[shift, shift:shift + 37], probs[0, :37])


def sorted_offsets(clusters, block):
  """Each position's slot within its query block of the cluster-sorted order: [b, h, n]."""
  order = np.argsort(clusters * clusters.shape[-1] + np.arange(clusters.shape[-1]), axis=-1,
                     kind="stable")
  return np.argsort(order, axis=-1) % block


@pytest.mark.parametrize("window,relative,share_qk", [
    (8, False, True), (16, False, True), (16, True, True), (32, True, False), (64, False, True)])
def test_causal_window_earlier_outputs_are_bit_exact_when_later_positions_change(
    rng, window, relative, share_qk):
  """Strict causality holds exactly, not within a tolerance: new q, k, v after position t move
  the earlier queries to other slots of the cluster-sorted blocks (the clusters of the later
  positions change), and every output up to t stays bit for bit the same (eager and graph; at
  w >= 32 only with the ordered softmax denominator)."""
  n, heads, depth = 128, 2, 8
  q, k, v = [rng.standard_normal((1, heads, n, depth)).astype(np.float32) for _ in range(3)]
  mu = rng.standard_normal((heads, max(2, n // window), depth)).astype(np.float32)
  rel_k, rel_v = [rng.standard_normal((9, depth)).astype(np.float32) if relative else None
                  for _ in range(2)]

  def attend(q, k, v):
    return cw.causal_window_attention(q, k, v, mu, window, share_qk=share_qk,
                                      relative_keys=rel_k, relative_values=rel_v)

  graph_attend = tf.function(attend)
  out, aux = attend(q, k, v)
  graph_out = graph_attend(q, k, v)[0].numpy()
  block = window  # query blocks of w
  offsets = sorted_offsets(aux["query_clusters"].numpy(), block)
  moved = 0
  for t in (30, 63, 90):
    changed = [x.copy() for x in (q, k, v)]
    for x in changed:
      x[:, :, t + 1:] = rng.standard_normal(x[:, :, t + 1:].shape)
    new_out, new_aux = attend(*changed)
    new_offsets = sorted_offsets(new_aux["query_clusters"].numpy(), block)
    moved += np.sum(new_offsets[..., :t + 1] != offsets[..., :t + 1])
    np.testing.assert_array_equal(new_out.numpy()[:, :, :t + 1], out.numpy()[:, :, :t + 1])
    np.testing.assert_array_equal(graph_attend(*changed)[0].numpy()[:, :, :t + 1],
                                  graph_out[:, :, :t + 1])
  assert moved > 0  # the earlier queries did change slots


# --- top-k routing's self mask ----------------------------------------------------------------

def topk_cluster_attention(q, v, mu, window, causal, exclude_self, compare):
  """cluster_attention of share_qk top-k routing: (output, self_weight); compare=True hands it
  the key members as another tensor, so it takes the member-index comparison path (the
  computation before the static identity)."""
  q_hat = common.layer_norm_no_scale(q)
  aux = routing.route(q_hat, q_hat, tf.stop_gradient(mu), window, True, not causal)
  if compare:
    aux = aux._replace(key_indices=tf.identity(aux.query_indices))
  out, aux = routing.cluster_attention(aux, v, window, causal, exclude_self=exclude_self)
  return out, aux.self_weight


@pytest.mark.parametrize("causal,exclude_self", [(True, False), (True, True), (False, True)])
def test_topk_self_mask_from_a_static_identity_is_exact(rng, causal, exclude_self):
  """With the key members the query members, "is self" is the identity [w, w] and the self
  weight the diagonal: outputs and self weights bit for bit those of the [b, h, c, w, w]
  member-index comparisons, gradients equal (float64), and no rank-5 comparison is built."""
  q, v = [tf.constant(rng.standard_normal((2, 2, 32, 8))) for _ in range(2)]
  mu = tf.constant(rng.standard_normal((2, 4, 8)))
  results = []
  for compare in (False, True):
    with tf.GradientTape() as tape:
      tape.watch([q, v])
      out, self_weight = topk_cluster_attention(q, v, mu, 8, causal, exclude_self, compare)
      loss = tf.reduce_sum(out * tf.sin(tf.range(8, dtype=out.dtype)))
    results.append([out, self_weight] + tape.gradient(loss, [q, v]))
  (out, self_weight, dq, dv), (out_ref, self_weight_ref, dq_ref, dv_ref) = results
  np.testing.assert_array_equal(out.numpy(), out_ref.numpy())
  np.testing.assert_array_equal(self_weight.numpy(), self_weight_ref.numpy())
  if not exclude_self:  # then a routed query's weight on itself is positive
    assert self_weight.numpy().max() > 0
  # The reference gathers the keys apart from the queries, so q's gradient adds the two gathers'
  # gradients in another order: equal up to float64 rounding.
  for got, want in ((dq, dq_ref), (dv, dv_ref)):
    assert np.abs(want.numpy()).max() > 0
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12, atol=1e-15)


# --- the benchmark's useful FLOPs ---------------------------------------------------------------

def test_useful_flops_per_token_hand_numbers():
  """benchmarks/train_step.py's count: bench-8k routing is 121 MFLOP/token (the figure of the
  performance issue); causal block pairs by hand."""
  train_step = benchmark_module("train_step")
  assert train_step.causal_pairs(8, 4, 4) == (0 + 10) + (16 + 10)
  assert train_step.causal_pairs(8, 4, 8) == 36  # the flange is cut at the start
  n = 8192
  local_pairs = train_step.causal_pairs(n, 256, 256)
  assert local_pairs == 256 * 256 * 31 + 32 * 256 * 257 // 2
  layer = (4 * 2 * 512 ** 2 + 2 * 8 * 64 ** 2 + 3 * 2 * 512 * 2048 +
           6 * local_pairs * 8 * 64 / n + 2 * (16 * 512 * 513 // 2 * 8 * 64 + 2 * 64 * 16 * n) / n)
  per_token = 3 * (2 * 512 * 512 + 4 * layer + 2 * 512 * 256)
  routing = train_step.model_hparams("routing", n)
  assert train_step.useful_flops_per_token(routing, 256) == pytest.approx(per_token, rel=1e-12)
  assert round(per_token / 1e6) == 121
  full = train_step.model_hparams("full", 1024)
  assert full.full_attention and full.sparsity_cluster_num_heads == 0
  assert train_step.model_hparams("routing", 32768).sparsity_cluster_size == 64


def test_matmul_share_counts_onednn_ops_as_the_ops_they_stand_for():
  """bench-peers' profile on a oneDNN build (AVX-512 machines) names the matmuls _MklMatMul,
  _MklEinsum, _MklFusedMatMul: they are matmuls; _MklSoftmax and plain Mul are not."""
  peers = benchmark_module("peers")
  by_op = [("_MklMatMul", 50.0), ("_MklEinsum", 10.0), ("_MklFusedMatMul", 5.0),
           ("BatchMatMulV2", 5.0), ("_MklSoftmax", 10.0), ("Mul", 20.0)]
  assert peers.matmul_share(by_op, peers.TF_MATMUL_OPS) == pytest.approx(0.7)
  assert peers.matmul_share([("aten::mm", 3.0), ("aten::mul", 1.0)],
                            peers.TORCH_MATMUL_OPS) == pytest.approx(0.75)
  assert peers.matmul_share([], peers.TF_MATMUL_OPS) == 0.0


def test_steady_matmul_rate_takes_the_higher_of_start_and_end():
  """bench-peers and bench-memory measure the matmul rate at their start and end: each rate is
  the higher, both are kept, and a spread beyond STEADY_SPREAD marks the run as disturbed."""
  common = benchmark_module("common")
  start = {"record": "matmul", "framework": "tensorflow", "gflops": 107.0,
           "gflops_bfloat16": 393.0}
  end = {"record": "matmul", "framework": "tensorflow", "gflops": 208.0, "gflops_bfloat16": 350.0}
  rate = common.steady_matmul_rate(start, end)
  assert (rate["gflops"], rate["gflops_bfloat16"]) == (208.0, 393.0)
  assert (rate["gflops_start"], rate["gflops_end"]) == (107.0, 208.0)
  assert rate["spread"] == pytest.approx(107.0 / 208.0) and not rate["steady"]
  assert rate["framework"] == "tensorflow" and start["gflops"] == 107.0  # a copy
  steady = common.steady_matmul_rate({"gflops": 200.0}, {"gflops": 190.0})
  assert steady["gflops"] == 200.0 and steady["steady"] and "gflops_bfloat16" not in steady
  assert common.unsteady_warning({"tensorflow": steady}) is None
  warning = common.unsteady_warning({"tensorflow": steady, "pytorch": rate})
  assert warning.startswith("WARNING: the pytorch matmul rate moved") and "0.51" in warning
  train_memory = benchmark_module("train_memory")
  records = [{"status": "ok", "tokens_per_sec": 1000.0, "useful_flops_per_token": 1.5e8},
             {"status": "timeout"}]
  train_memory.add_utilisation(records, rate["gflops"])
  assert records[0]["utilisation"] == pytest.approx(1.5e11 / 208e9)
  assert "utilisation" not in records[1]


def test_peers_processes_report_medians_and_their_spread():
  """bench-peers --processes 3: a side's s/step, tokens/s and peaks are the medians of its
  processes (one process's peak 0.5 GiB off leaves them alone), each process's values kept."""
  peers = benchmark_module("peers")
  runs = [dict(name="routing", seconds_per_step=t, tokens_per_sec=8192 / t, peak_rss_mb=m,
               baseline_rss_mb=900.0 + i, parameters=7) for i, (t, m) in
          enumerate([(5.0, 3600.0), (6.0, 4100.0), (5.5, 3700.0)])]
  record = peers.median_record(runs)
  assert record["seconds_per_step"] == 5.5 and record["peak_rss_mb"] == 3700.0
  assert record["tokens_per_sec"] == pytest.approx(8192 / 5.5)
  assert record["baseline_rss_mb"] == 901.0 and record["parameters"] == 7
  assert [r["peak_rss_mb"] for r in record["runs"]] == [3600.0, 4100.0, 3700.0]
  assert peers.median_record(runs[:1]) == runs[0]  # one process: its record as it is
  (line,) = peers.spread_lines({"routing": record, "peer": peers.median_record(runs[:1])})
  assert line.startswith("routing: 3 processes, peak RSS 3.52-4.00 GiB (median 3.61)")
  assert "s/step 5.00-6.00 (median 5.50)" in line


def test_interleaved_times_alternate_the_order_and_ratio_within_rounds():
  """bench-peers --interleave: every round calls each configuration once, in order in even
  rounds and reversed in odd ones, warm-up rounds untimed; a configuration's ratio is the median
  of its per-round ratios to the reference, so a round where the machine ran slow for all of them
  (round 2 below) leaves the ratio alone."""
  common = benchmark_module("common")
  calls, now = [], [0.0]
  durations = {"a": [9.0, 1.0, 1.0, 3.0, 1.0], "b": [9.0, 1.2, 1.1, 3.3, 1.1],
               "c": [9.0, 2.0, 2.0, 6.0, 2.0]}  # one row per round, the first a warm-up

  def fn(name):
    def call():
      now[0] += durations[name][sum(1 for c in calls if c == name)]
      calls.append(name)
    return call

  times = common.interleaved_times({n: fn(n) for n in "abc"}, rounds=4, warmup=1,
                                   clock=lambda: now[0])
  assert "".join(calls) == "abc" + "cba" + "abc" + "cba" + "abc"
  expected = {"a": [1.0, 1.0, 3.0, 1.0], "b": [1.2, 1.1, 3.3, 1.1], "c": [2.0, 2.0, 6.0, 2.0]}
  assert set(times) == set(expected)
  for name, seconds in expected.items():
    assert times[name] == pytest.approx(seconds)
  summary = common.interleaved_summary(times, "a")
  assert summary["a"]["over_reference"] == 1.0
  assert summary["a"]["seconds_per_step"] == pytest.approx(1.0)
  assert summary["b"]["seconds_per_step"] == pytest.approx(1.15)
  assert summary["b"]["over_reference"] == pytest.approx(1.1)  # rounds' ratios 1.2, 1.1, 1.1, 1.1
  assert summary["c"]["over_reference"] == pytest.approx(2.0)
  table = benchmark_module("peers").interleaved_table(
      {"steps": 4, "reference": "a", "names": ["a", "b", "c"], "configurations": summary})
  assert "| b | 1.15 | 1.100 |" in table and "| c | 2.00 | 2.000 |" in table


def test_peak_bytes_without_allocator_statistics_runs_fn_and_reports_none(monkeypatch):
  """TF's default CPU allocator without oneDNN (an AVX2-only CPU) keeps no statistics and
  reset_memory_stats raises: peak_bytes still runs fn once and reports None, so bench-peers'
  matmul rate (common.matmul_gflops) is measured there too (it failed on 2026-11-27)."""
  common = benchmark_module("common")
  calls = []

  def no_statistics(device):
    raise ValueError("Cannot reset memory stats for device " + device)

  monkeypatch.setattr(tf.config.experimental, "reset_memory_stats", no_statistics)
  assert common.peak_bytes(lambda: calls.append(1)) is None and calls == [1]
  seconds, peak = common.time_fn(lambda: calls.append(1), repeats=3, warmup=1)
  assert peak is None and seconds >= 0 and len(calls) == 1 + 1 + 1 + 3
  assert common.matmul_gflops(size=64, repeats=1) > 0


def test_kept_for_backward_counts_what_the_needed_gradient_ops_read():
  """benchmarks/common.py's kept tensors (what the tests here read off the graph): what the
  gradient ops the fetches need read from the forward pass, in bytes (y = tanh(x w): dw reads x
  and tanh's output y; the gradient of x, which would read w, is not fetched, so w is not kept)."""
  common = benchmark_module("common")
  graph = tf.Graph()
  with graph.as_default():
    x = tf.exp(tf.constant(np.ones((4, 3), np.float32)))
    w = tf.exp(tf.constant(np.ones((3, 5), np.float32)))
    y = tf.tanh(tf.reshape(tf.matmul(x, w), [20]))
    dw, = tf1.gradients(tf.reduce_sum(tf.reshape(y, [4, 5])), [w])
    kept, _, _ = common.kept_for_backward(graph, [dw])
  floats = {name: value[0] for name, value in kept.items() if value[0] >= 48}
  assert floats == {x.name: 4 * 3 * 4, y.name: 20 * 4}, kept


