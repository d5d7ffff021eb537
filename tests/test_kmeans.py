"""Online k-means: EMA updates against hand computation, padding, combined q/k updates."""
import math

import numpy as np
import pytest
import tensorflow as tf

from routing_transformer.core import attention
from routing_transformer.core import kmeans
import reference

EPS = 1e-5


def _smoothed(count, total, k=2):
  return (count + EPS) / (total + k * EPS) * total


def _hand_ema(decay):
  """Three steps for h=1, c=2, d=2, written out number by number."""
  # initial state
  c0, c1 = 0.0, 0.0
  s0, s1 = [1.0, 0.0], [0.0, 1.0]
  steps = []
  batches = [
      # (sum of x in cluster 0, count 0, sum in cluster 1, count 1)
      ([1.0 + 0.8, 0.0 + 0.2], 2.0, [0.0, 1.0], 1.0),
      ([0.5, -0.5], 1.0, [0.3 + 0.1 + 0.2, 0.9 + 1.1 + 0.7], 3.0),
      ([2.0 + 1.0, 0.0 + 0.0], 2.0, [0.0, 0.0], 0.0),
  ]
  for sum0, n0, sum1, n1 in batches:
    c0 = decay * c0 + (1 - decay) * n0
    c1 = decay * c1 + (1 - decay) * n1
    s0 = [decay * a + (1 - decay) * b for a, b in zip(s0, sum0)]
    s1 = [decay * a + (1 - decay) * b for a, b in zip(s1, sum1)]
    total = c0 + c1
    m0 = [a / _smoothed(c0, total) for a in s0]
    m1 = [a / _smoothed(c1, total) for a in s1]
    steps.append((np.array([[c0, c1]]), np.array([[s0, s1]]), np.array([[m0, m1]])))
  return steps


def _batches():
  """The x vectors and assignments behind `_hand_ema`, plus a padding row with huge values."""
  xs = [
      [[1.0, 0.0], [0.8, 0.2], [0.0, 1.0], [50.0, 50.0]],
      [[0.5, -0.5], [0.3, 0.9], [0.1, 1.1], [0.2, 0.7]],
      [[2.0, 0.0], [1.0, 0.0], [-9.0, 9.0], [-7.0, 7.0]],
  ]
  assign = [[0, 0, 1, 1], [0, 1, 1, 1], [0, 0, 1, 1]]
  padding = [[0, 0, 0, 1], [0, 0, 0, 0], [0, 0, 1, 1]]
  return [(np.array(x, np.float32)[None, None], np.array(a, np.int32)[None, None],
           1.0 - np.array(p, np.float32)[None]) for x, a, p in zip(xs, assign, padding)]


@pytest.mark.parametrize("decay", [0.5, 0.999])
def test_ema_three_steps_match_hand_computation(decay):
  steps = _hand_ema(decay)
  with tf.Graph().as_default():
    km = kmeans.OnlineKMeans(heads=1, num_clusters=2, depth=2, decay=decay, name="km")
    x_ph = tf.compat.v1.placeholder(tf.float32, [1, 1, 4, 2])
    c_ph = tf.compat.v1.placeholder(tf.int32, [1, 1, 4])
    w_ph = tf.compat.v1.placeholder(tf.float32, [1, 4])
    update, _ = km.update([x_ph], [c_ph], w_ph)
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run([km.means.assign([[[1.0, 0.0], [0.0, 1.0]]]),
                km.ema_means.assign([[[1.0, 0.0], [0.0, 1.0]]])])
      for (x, clusters, weights), (count, sums, means) in zip(_batches(), steps):
        sess.run(update, {x_ph: x, c_ph: clusters, w_ph: weights})
        got_count, got_sums, got_means = sess.run([km.ema_count, km.ema_means, km.means])
        np.testing.assert_allclose(got_count, count, rtol=1e-6)
        np.testing.assert_allclose(got_sums, sums, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(got_means, means, rtol=1e-4)


def test_empty_cluster_keeps_a_finite_mean():
  count = tf.constant([[3.0, 0.0]])
  sums = tf.constant([[[3.0, 3.0], [0.0, 0.0]]])
  means = kmeans.smoothed_means(count, sums).numpy()
  assert np.all(np.isfinite(means))
  np.testing.assert_allclose(means[0, 0], [3.0 / _smoothed(3.0, 3.0)] * 2, rtol=1e-6)


def test_query_and_key_statistics_are_one_update():
  rng = np.random.default_rng(0)
  xq, xk = (rng.standard_normal((2, 1, 6, 3)).astype(np.float32) for _ in range(2))
  cq, ck = (rng.integers(0, 2, (2, 1, 6)).astype(np.int32) for _ in range(2))
  ohq, ohk = np.eye(2)[cq], np.eye(2)[ck]
  with tf.Graph().as_default():
    km = kmeans.OnlineKMeans(heads=1, num_clusters=2, depth=3, decay=0.9, name="km")
    update, _ = km.update([tf.constant(xq), tf.constant(xk)], [tf.constant(cq), tf.constant(ck)],
                          tf.ones([2, 6]))
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      start, means = sess.run([km.ema_means, km.means])
      np.testing.assert_array_equal(start, means)  # ema_means starts equal to the means
      sess.run(update)
      count, sums = sess.run([km.ema_count, km.ema_means])
  want_count = 0.1 * (ohq.sum((0, 2)) + ohk.sum((0, 2)))
  want_sums = 0.9 * start + 0.1 * (np.einsum("bhnc,bhnd->hcd", ohq, xq) +
                                   np.einsum("bhnc,bhnd->hcd", ohk, xk))
  np.testing.assert_allclose(count, want_count, rtol=1e-6)
  np.testing.assert_allclose(sums, want_sums, rtol=1e-5, atol=1e-6)


def test_padding_excluded_from_statistics_through_routing_attention():
  rng = np.random.default_rng(3)
  q = rng.standard_normal((1, 2, 16, 4)).astype(np.float32)
  mu = reference.layer_norm(rng.standard_normal((2, 4, 4))).astype(np.float32)
  pad = np.zeros((1, 16), bool)
  pad[0, 12:] = True
  q_padded = q.copy()
  q_padded[:, :, 12:] = 100.0 * rng.standard_normal((1, 2, 4, 4))  # garbage in padding
  _, aux = attention.routing_attention(q_padded, q_padded, q_padded, mu, 4, padding=pad)
  counts, sums = kmeans.cluster_statistics(aux["q_hat"], aux["query_clusters"], 4, aux["weights"])
  _, aux_ref = attention.routing_attention(q[:, :, :12], q[:, :, :12], q[:, :, :12], mu, 4)
  counts_ref, sums_ref = kmeans.cluster_statistics(aux_ref["q_hat"], aux_ref["query_clusters"], 4,
                                                   aux_ref["weights"])
  np.testing.assert_allclose(counts.numpy(), counts_ref.numpy())
  np.testing.assert_allclose(sums.numpy(), sums_ref.numpy(), rtol=1e-5, atol=1e-5)
  assert counts.numpy().sum() == 2 * 12
  np.testing.assert_allclose(aux["commitment_loss"].numpy(), aux_ref["commitment_loss"].numpy(),
                             rtol=1e-5)


def test_occupancy_statistics():
  stats = kmeans.occupancy(tf.constant([[6.0, 2.0, 0.0, 0.0], [2.0, 2.0, 2.0, 2.0]]))
  assert stats["occupancy_min"].numpy() == 0.0
  assert stats["occupancy_max"].numpy() == pytest.approx(0.75)
  want_entropy = 0.5 * (-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)) + math.log(4))
  assert stats["occupancy_entropy"].numpy() == pytest.approx(want_entropy, rel=1e-5)
  assert stats["dead_clusters"].numpy() == 2


def test_initial_means_are_normalised():
  means = kmeans.initial_means(3, 5, 16, seed=1).numpy()
  np.testing.assert_allclose(means.mean(-1), 0.0, atol=1e-5)
  np.testing.assert_allclose(means.var(-1), 1.0, rtol=1e-3)


def test_loss_is_beta_times_commitment_and_codebook_without_ema():
  rng = np.random.default_rng(5)
  x = tf.constant(rng.standard_normal((1, 1, 6, 3)).astype(np.float32))
  clusters = rng.integers(0, 2, (1, 1, 6)).astype(np.int32)
  with tf.Graph().as_default():
    km = kmeans.OnlineKMeans(1, 2, 3, ema=True, name="a")
    km_grad = kmeans.OnlineKMeans(1, 2, 3, ema=False, name="b")
    x_g = tf.constant(x.numpy())
    loss = km.loss(tf.constant(2.0))
    loss_grad = km_grad.loss(tf.constant(2.0), [x_g], [tf.constant(clusters)], tf.ones([1, 6]))
    grad = tf.gradients(loss_grad, [km_grad.means])[0]
    assert km.means not in tf.compat.v1.trainable_variables()
    assert km_grad.means in tf.compat.v1.trainable_variables()
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      got, got_grad_loss, g, means = sess.run([loss, loss_grad, grad, km_grad.means])
  assert got == pytest.approx(2e-4)
  assigned = means[0][clusters[0, 0]][None, None]
  codebook = np.mean((x.numpy() - assigned) ** 2)
  assert got_grad_loss == pytest.approx(2e-4 + codebook, rel=1e-5)
  assert np.abs(g).max() > 0


def test_without_ema_the_update_tracks_statistics_but_leaves_the_means_to_the_gradient():
  rng = np.random.default_rng(6)
  x = rng.standard_normal((1, 1, 6, 3)).astype(np.float32)
  clusters = np.array([[[0, 0, 1, 0, 1, 0]]], np.int32)
  with tf.Graph().as_default():
    km = kmeans.OnlineKMeans(1, 2, 3, ema=False, decay=0.5, name="grad")
    update, _ = km.update([tf.constant(x)], [tf.constant(clusters)], tf.ones([1, 6]))
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      before = sess.run(km.means)
      sess.run(update)
      means, count, sums = sess.run([km.means, km.ema_count, km.ema_means])
  np.testing.assert_array_equal(means, before)  # not overwritten by the EMA
  np.testing.assert_allclose(count, [[0.5 * 4, 0.5 * 2]])
  want = 0.5 * before + 0.5 * np.stack([x[0, 0, clusters[0, 0] == c].sum(0) for c in (0, 1)])[None]
  np.testing.assert_allclose(sums, want, rtol=1e-5)
