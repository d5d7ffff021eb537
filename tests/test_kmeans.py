"""Online k-means: EMA updates against hand computation, padding, combined q/k updates, the
original's loss weight and its legacy counts."""
import math

import numpy as np
import pytest
import tensorflow as tf

from routing_transformer.core import attention
from routing_transformer.core import kmeans
import oracles
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


def test_loss_is_twice_beta_commitment_and_codebook_without_ema():
  """The original sums the query and the key term (the keys are the queries with share_qk): the
  loss of a mean commitment 2.0 is 2 * 1e-4 * 2.0, plus twice the codebook loss without EMA."""
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
  assert got == pytest.approx(4e-4)
  assigned = means[0][clusters[0, 0]][None, None]
  codebook = np.mean((x.numpy() - assigned) ** 2)
  assert got_grad_loss == pytest.approx(4e-4 + 2 * codebook, rel=1e-5)
  assert np.abs(g).max() > 0


@pytest.mark.parametrize("share_qk", [True, False])
def test_clustering_loss_sums_the_query_and_key_terms(share_qk):
  """Hand numbers: one head, two positions, depth 3, centroids mu0 = (1, 0, -1), mu1 = (0, 1, -1).

  q = (1, 0, -1), (0, 1, -1) normalise to s * q with s = 1 / sqrt(2/3 + 1e-6) and go to mu0, mu1:
  e_q = 2 * 2 (s - 1)^2 / 6. Both keys (1, -1, 0) normalise to s * (1, -1, 0) and go to mu0:
  e_k = 2 ((s - 1)^2 + s^2 + 1) / 6. The original's loss is beta * (e_q + e_k), with the keys
  the queries under share_qk: 2 * beta * e_q."""
  s = 1.0 / math.sqrt(2.0 / 3.0 + 1e-6)
  e_q = 2 * 2 * (s - 1) ** 2 / 6
  e_k = 2 * ((s - 1) ** 2 + s ** 2 + 1) / 6
  want = 2 * 1e-4 * e_q if share_qk else 1e-4 * (e_q + e_k)
  q = np.array([[[[1.0, 0.0, -1.0], [0.0, 1.0, -1.0]]]], np.float32)
  k = np.array([[[[1.0, -1.0, 0.0], [1.0, -1.0, 0.0]]]], np.float32)
  mu = np.array([[[1.0, 0.0, -1.0], [0.0, 1.0, -1.0]]], np.float32)
  with tf.Graph().as_default():
    km = kmeans.OnlineKMeans(1, 2, 3, beta=1e-4, name="km")
    _, aux = attention.routing_attention(q, k, q, km.means, 2, share_qk=share_qk)
    x_hats, clusters = kmeans.routed_vectors(aux, share_qk)
    loss = km.loss(aux["commitment_loss"], x_hats, clusters, aux["weights"])
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run(km.means.assign(mu))
      got, commitment, assigned = sess.run([loss, aux["commitment_loss"], clusters])
  np.testing.assert_array_equal(assigned[0], [[[0, 1]]])
  if not share_qk:
    np.testing.assert_array_equal(assigned[1], [[[0, 0]]])
  # the routing function reports the mean of the two terms
  assert commitment == pytest.approx(e_q if share_qk else (e_q + e_k) / 2, rel=1e-5)
  assert got == pytest.approx(want, rel=1e-5)


def _counts_by_the_original_reshape(clusters, weights, num_clusters):
  """The original's online_kmeans: one-hot [b, h, n, c] (padding rows zero), reshaped to
  [-1, h, c] and summed over the first axis."""
  one_hot = np.eye(num_clusters)[clusters] * weights[:, None, :, None]
  return one_hot.reshape(-1, clusters.shape[1], num_clusters).sum(0)


def test_legacy_counts_interleave_heads_as_the_original():
  """Hand numbers: b=2, h=2, n=4, c=3; batch 1 has padding at position 3. The original's count
  row j sums positions i = j mod 2 of both heads; the sums stay per head."""
  clusters = np.array([[[0, 1, 0, 1], [2, 2, 2, 2]],
                       [[1, 1, 1, 1], [0, 0, 0, 0]]], np.int32)
  weights = np.array([[1, 1, 1, 1], [1, 1, 1, 0]], np.float32)
  x_hat = np.random.default_rng(8).standard_normal((2, 2, 4, 5)).astype(np.float32)
  legacy, legacy_sums = kmeans.cluster_statistics(x_hat, clusters, 3, weights, legacy_counts=True)
  per_head, sums = kmeans.cluster_statistics(x_hat, clusters, 3, weights)
  np.testing.assert_array_equal(legacy.numpy(), [[4, 2, 2], [1, 3, 2]])
  np.testing.assert_array_equal(per_head.numpy(), [[2, 5, 0], [3, 0, 4]])
  np.testing.assert_array_equal(legacy.numpy(),
                                _counts_by_the_original_reshape(clusters, weights, 3))
  np.testing.assert_array_equal(legacy_sums.numpy(), sums.numpy())
  want_sums = np.einsum("bhnc,bhnd->hcd", np.eye(3)[clusters] * weights[:, None, :, None], x_hat)
  np.testing.assert_allclose(sums.numpy(), want_sums, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("heads,length", [(3, 5), (2, 7), (1, 6)])
def test_legacy_counts_equal_the_original_reshape(heads, length):
  """Lengths that heads do not divide interleave across batch rows too; one head: per head."""
  rng = np.random.default_rng(heads * 10 + length)
  clusters = rng.integers(0, 4, (3, heads, length)).astype(np.int32)
  weights = (rng.random((3, length)) > 0.2).astype(np.float32)
  x_hat = rng.standard_normal((3, heads, length, 2)).astype(np.float32)
  counts, _ = kmeans.cluster_statistics(x_hat, clusters, 4, weights, legacy_counts=True)
  want = _counts_by_the_original_reshape(clusters, weights, 4)
  np.testing.assert_allclose(counts.numpy(), want)
  per_head = (np.eye(4)[clusters] * weights[:, None, :, None]).sum((0, 2))
  assert np.allclose(want, per_head) == (heads == 1)


def test_three_legacy_steps_match_the_original_update():
  """legacy_counts: three steps of the model's update path (KMeansStep, shard_update) from the same
  centroids and batches equal a NumPy restatement of the original's update, step by step."""
  b, h, n, d, c, decay = 2, 2, 5, 4, 3, 0.9
  rng = np.random.default_rng(11)
  means0 = reference.layer_norm(rng.standard_normal((h, c, d))).astype(np.float32)
  batches = [reference.layer_norm(rng.standard_normal((b, h, n, d))).astype(np.float32)
             for _ in range(3)]
  weights = np.ones((b, n), np.float32)
  weights[1, -1] = 0.0
  with tf.Graph().as_default():
    km = kmeans.OnlineKMeans(h, c, d, decay=decay, legacy_counts=True, name="km")
    x_ph = tf.compat.v1.placeholder(tf.float32, [b, h, n, d])
    clusters = kmeans.assignments(attention.routing.centroid_scores(x_ph, km.means))
    update, _ = kmeans.shard_update([kmeans.KMeansStep(km, [x_ph], [clusters], weights)])
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run([km.means.assign(means0), km.ema_means.assign(means0)])
      state = (means0.astype(np.float64), np.zeros((h, c)), means0.astype(np.float64))
      per_head = state
      for x in batches:
        got_clusters, _ = sess.run([clusters, update], {x_ph: x})
        got = sess.run([km.means, km.ema_count, km.ema_means])
        *state, want_clusters = oracles.original_ema_step(x, weights, *state, decay)
        np.testing.assert_array_equal(got_clusters, want_clusters)
        for got_value, want_value in zip(got, state):
          np.testing.assert_allclose(got_value, want_value, rtol=2e-6, atol=1e-7)
        per_head = oracles.original_ema_step(x, weights, *per_head, decay, legacy=False)[:3]
  assert not np.allclose(per_head[1], state[1], rtol=1e-3)  # the switch changes the counts


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
