"""Mesh-TF attention and k-means against the TF implementation, on a 2-device placement mesh.

The layout splits batch and heads ("batch:b" and "heads:m" on a b x m mesh) so every test also
covers the slicewise pieces on shards.
"""
import numpy as np
import pytest
import tensorflow as tf

from routing_transformer.t2t import patches

patches.install(["tf_aliases"])  # mesh_tensorflow imports what TF 2.14 dropped
import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top,wrong-import-order

from routing_transformer.core import attention as tf_attention
from routing_transformer.core import kmeans as tf_kmeans
from routing_transformer.t2t.mtf import attention
from routing_transformer.t2t.mtf import kmeans

tf1 = tf.compat.v1
B, H, N, D, C, W = 2, 2, 32, 8, 4, 8
R = 5  # max relative position: tables of 2R + 1 rows
DIMS = dict(batch=mtf.Dimension("batch", B), heads=mtf.Dimension("heads", H),
            length=mtf.Dimension("length", N), d_head=mtf.Dimension("d_head", D),
            clusters=mtf.Dimension("clusters", C))
REL = mtf.Dimension("relative", 2 * R + 1)
SHAPE = [DIMS[k] for k in ("batch", "heads", "length", "d_head")]


def run_on_mesh(build, mesh_shape="batch:1;model:2", layout="batch:batch;heads:model",
                feeds=None):
  """Builds `build(mesh)` -> list of mtf tensors on a placement mesh and returns numpy values."""
  with tf.Graph().as_default():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    outputs, extra_ops = build(mesh)
    shape = mtf.convert_to_shape(mesh_shape)
    impl = mtf.placement_mesh_impl.PlacementMeshImpl(
        shape, mtf.convert_to_layout_rules(layout), [""] * shape.size)
    lowering = mtf.Lowering(graph, {mesh: impl}, autostack=False)
    tensors = [lowering.export_to_tf_tensor(t) for t in outputs]
    ops = [lowering.lowered_operation(op) for op in extra_ops]
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      sess.run(lowering.copy_masters_to_slices())
      values = sess.run(tensors)
      if ops:
        sess.run(ops)
        sess.run(lowering.copy_slices_to_masters())
        values.append(sess.run(feeds(graph)))
    return values


def imported(mesh, value, dims):
  return mtf.import_tf_tensor(mesh, tf.constant(value, tf.float32), mtf.Shape(dims))


@pytest.fixture
def inputs(rng):
  q, k, v = (rng.normal(size=(B, H, N, D)).astype(np.float32) for _ in range(3))
  mu = tf_kmeans.initial_means(H, C, D, seed=3).numpy()
  rel_k, rel_v = (rng.normal(size=(2 * R + 1, D)).astype(np.float32) * 0.3 for _ in range(2))
  padding = np.zeros((B, N), bool)
  padding[1, -5:] = True
  cotangent = rng.normal(size=(B, H, N, D)).astype(np.float32)
  return q, k, v, mu, rel_k, rel_v, padding, cotangent


def tf_routing_with_grads(q, k, v, mu, rel_k, rel_v, padding, cotangent, share_qk):
  qt, kt, vt = (tf.constant(x) for x in (q, k, v))
  with tf.GradientTape() as tape:
    tape.watch([qt, kt, vt])
    out, aux = tf_attention.routing_attention(
        qt, kt, vt, mu, W, causal=True, share_qk=share_qk, padding=padding,
        relative_keys=rel_k, relative_values=rel_v)
    objective = tf.reduce_sum(out * cotangent) + 100.0 * aux["commitment_loss"]
  grads = tape.gradient(objective, [qt, kt, vt],
                        unconnected_gradients=tf.UnconnectedGradients.ZERO)
  return out.numpy(), aux, [g.numpy() for g in grads]


def mtf_routing_with_grads(q, k, v, mu, rel_k, rel_v, padding, cotangent, share_qk, mesh_shape,
                           layout):
  def build(mesh):
    qm, km, vm = (imported(mesh, x, SHAPE) for x in (q, k, v))
    weights = imported(mesh, 1.0 - padding, [DIMS["batch"], DIMS["length"]])
    relative = (imported(mesh, rel_k, [REL, DIMS["d_head"]]),
                imported(mesh, rel_v, [REL, DIMS["d_head"]]), REL)
    centroids = imported(mesh, mu, [DIMS["heads"], DIMS["clusters"], DIMS["d_head"]])
    out, aux = attention.routing_attention(qm, km, vm, centroids, W, DIMS, share_qk=share_qk,
                                           weights=weights, relative=relative)
    objective = (mtf.reduce_sum(out * imported(mesh, cotangent, SHAPE)) +
                 aux["commitment_loss"] * 100.0)
    grads = mtf.gradients([objective], [qm, km, vm])
    grads = [g if g is not None else mtf.zeros_like(qm) for g in grads]
    return [out, aux["query_clusters"], aux["commitment_loss"]] + grads, []
  return run_on_mesh(build, mesh_shape, layout)


@pytest.mark.parametrize("share_qk", [True, False], ids=["share_qk", "separate_keys"])
@pytest.mark.parametrize("mesh_shape,layout", [
    ("batch:1;model:2", "heads:model"),
    ("batch:2;model:2", "batch:batch;heads:model"),
], ids=["heads_split_2", "batch2_heads2"])
def test_routing_attention_equals_tf(inputs, share_qk, mesh_shape, layout):
  """Output, assignments, commitment loss and gradients of q, k, v equal the TF implementation."""
  q, k, v, mu, rel_k, rel_v, padding, cotangent = inputs
  out, aux, grads = tf_routing_with_grads(*inputs, share_qk=share_qk)
  got = mtf_routing_with_grads(*inputs, share_qk=share_qk, mesh_shape=mesh_shape, layout=layout)
  np.testing.assert_allclose(got[0], out, atol=1e-5)
  np.testing.assert_array_equal(got[1], aux["query_clusters"].numpy())
  np.testing.assert_allclose(got[2], aux["commitment_loss"].numpy(), rtol=1e-5)
  assert np.abs(out).max() > 0.1  # a real computation, not zeros
  for want, have in zip(grads, got[3:]):
    np.testing.assert_allclose(have, want, atol=1e-4)


def test_local_attention_equals_tf(inputs):
  q, k, v, _, rel_k, rel_v, _, cotangent = inputs
  block, flange = 8, 16
  qt, kt, vt = (tf.constant(x) for x in (q, k, v))
  with tf.GradientTape() as tape:
    tape.watch(qt)
    want = tf_attention.local_attention(qt, kt, vt, block, flange, causal=True,
                                        relative_keys=rel_k, relative_values=rel_v, scale=1.0)
    objective = tf.reduce_sum(want * cotangent)
  want_grad = tape.gradient(objective, qt).numpy()

  def build(mesh):
    qm, km, vm = (imported(mesh, x, SHAPE) for x in (q, k, v))
    relative = (imported(mesh, rel_k, [REL, DIMS["d_head"]]),
                imported(mesh, rel_v, [REL, DIMS["d_head"]]), REL)
    out = attention.local_attention(qm, km, vm, block, flange, DIMS["length"], DIMS["d_head"],
                                    relative=relative)
    grad = mtf.gradients([mtf.reduce_sum(out * imported(mesh, cotangent, SHAPE))], [qm])[0]
    return [out, grad], []

  got, grad = run_on_mesh(build)
  np.testing.assert_allclose(got, want.numpy(), atol=1e-5)
  np.testing.assert_allclose(grad, want_grad, atol=1e-4)


def test_kmeans_ema_update_equals_tf(inputs):
  """One EMA step of the mtf k-means (batch split over 2 devices) equals the TF functions."""
  q, _, _, _, _, _, padding, _ = inputs
  weights = 1.0 - padding.astype(np.float32)
  decay = 0.9
  ema_count0 = np.zeros([H, C], np.float32)

  def build(mesh):
    with tf1.variable_scope("layer"):
      km = kmeans.MtfKMeans(mesh, DIMS["heads"], DIMS["clusters"], DIMS["d_head"], decay=decay)
    xm = attention.layer_norm_no_scale(imported(mesh, q, SHAPE), DIMS["d_head"])
    scores = attention.centroid_scores(xm, km.means, DIMS)
    assigned = mtf.argmax(scores, DIMS["clusters"])
    wm = imported(mesh, weights, [DIMS["batch"], DIMS["length"]])
    ops, step_counts = km.update([xm], [assigned], wm)
    return [km.means, step_counts], ops

  def read_masters(_):
    return {v.op.name.split("/")[-1]: v for v in tf1.global_variables()}

  # The initial centroids come from the variable's seeded initializer; recompute TF with them.
  init_means, got_counts, after = run_on_mesh(build, "batch:2", "batch:batch", read_masters)
  np.testing.assert_allclose(after["ema_count"], 0.0 * decay + (1 - decay) * got_counts,
                             rtol=1e-6)
  x_hat = tf_attention.layer_norm_no_scale(tf.constant(q))
  clusters = tf_kmeans.assignments(tf_attention.routing.centroid_scores(x_hat, init_means))
  counts, sums = tf_kmeans.cluster_statistics(x_hat, clusters, C, weights)
  np.testing.assert_allclose(got_counts, counts.numpy(), rtol=1e-6)
  assert got_counts.sum() == pytest.approx(H * weights.sum())  # both batch shards counted
  new_count, new_sums = tf_kmeans.ema_step(ema_count0, init_means, counts, sums, decay)
  np.testing.assert_allclose(after["ema_means"], new_sums.numpy(), atol=1e-5)
  np.testing.assert_allclose(after["means"], tf_kmeans.smoothed_means(new_count, new_sums),
                             atol=1e-4)
  np.testing.assert_allclose(  # initial centroids: LayerNorm without scale (mean 0, var 1)
      init_means.mean(-1), 0.0, atol=1e-5)


@pytest.mark.parametrize("ema", [True, False])
def test_kmeans_loss_is_weighted_as_tf(inputs, ema):
  """MtfKMeans.loss weighs the commitment loss (and, without EMA, the codebook loss of queries
  and keys) as the TF k-means: the original's query term plus key term."""
  q, k, _, _, _, _, padding, _ = inputs
  weights = 1.0 - padding.astype(np.float32)
  commitment = 0.37

  def build(mesh):
    with tf1.variable_scope("layer"):
      km = kmeans.MtfKMeans(mesh, DIMS["heads"], DIMS["clusters"], DIMS["d_head"], ema=ema)
    xs = [attention.layer_norm_no_scale(imported(mesh, x, SHAPE), DIMS["d_head"]) for x in (q, k)]
    assigned = [mtf.argmax(attention.centroid_scores(x, km.means, DIMS), DIMS["clusters"])
                for x in xs]
    wm = imported(mesh, weights, [DIMS["batch"], DIMS["length"]])
    loss = km.loss(mtf.constant(mesh, commitment, mtf.Shape([])), xs, assigned, wm)
    return [km.means, loss], []

  means, got = run_on_mesh(build)
  x_hats = [tf_attention.layer_norm_no_scale(tf.constant(x)) for x in (q, k)]
  codebook = 0.0
  if not ema:
    codebook = np.mean([tf_kmeans.codebook_loss(
        x, means, tf_kmeans.assignments(tf_attention.routing.centroid_scores(x, means)),
        weights).numpy() for x in x_hats])
    assert codebook > 0
  assert got == pytest.approx(float(tf_kmeans.clustering_loss(commitment, 1e-4, codebook)),
                              rel=1e-5)
  assert got == pytest.approx(2 * (1e-4 * commitment + codebook), rel=1e-5)


RATE = 0.3


def _tf_weight_drop(probs, rate):
  """A deterministic stand-in for attention dropout: drops the weights below 0.05 and scales
  the rest by 1 / (1 - rate), an element-wise function of each weight alone, so both models
  give the same result exactly when they apply it to the same tensor (the weights)."""
  if not rate:
    return probs
  return tf.where(probs > 0.05, probs / (1.0 - rate), tf.zeros_like(probs))


def _mtf_weight_drop(probs):
  keep = mtf.cast(mtf.greater(probs, 0.05), probs.dtype)
  return probs * keep / (1.0 - RATE)


@pytest.mark.parametrize("kind", ["local", "routing"])
def test_attention_dropout_acts_on_the_weights_as_in_tf(inputs, monkeypatch, kind):
  """attention_dropout on the attention weights (after the softmax, before the products with
  the values and the relative values), as the TF model: with the same dropping rule both give
  the same output, which differs from the output without dropout."""
  from routing_transformer.core.attention import common  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(common, "attention_dropout", _tf_weight_drop)
  q, k, v, mu, rel_k, rel_v, _, _ = inputs
  qt, kt, vt = (tf.constant(x) for x in (q, k, v))
  block, flange = 8, 16
  if kind == "local":
    want, plain = (tf_attention.local_attention(
        qt, kt, vt, block, flange, causal=True, relative_keys=rel_k, relative_values=rel_v,
        scale=1.0, dropout_rate=rate).numpy() for rate in (RATE, 0.0))
  else:
    want, plain = (tf_attention.routing_attention(
        qt, kt, vt, mu, W, causal=True, share_qk=True, relative_keys=rel_k,
        relative_values=rel_v, dropout_rate=rate)[0].numpy() for rate in (RATE, 0.0))

  def build(mesh):
    qm, km, vm = (imported(mesh, x, SHAPE) for x in (q, k, v))
    relative = (imported(mesh, rel_k, [REL, DIMS["d_head"]]),
                imported(mesh, rel_v, [REL, DIMS["d_head"]]), REL)
    if kind == "local":
      out = attention.local_attention(qm, km, vm, block, flange, DIMS["length"], DIMS["d_head"],
                                      relative=relative, dropout=_mtf_weight_drop)
    else:
      centroids = imported(mesh, mu, [DIMS["heads"], DIMS["clusters"], DIMS["d_head"]])
      out, _ = attention.routing_attention(qm, km, vm, centroids, W, DIMS, share_qk=True,
                                           relative=relative, dropout=_mtf_weight_drop)
    return [out], []

  got, = run_on_mesh(build)
  assert np.abs(want - plain).max() > 0.05  # the stand-in dropped weights
  np.testing.assert_allclose(got, want, atol=1e-5)
