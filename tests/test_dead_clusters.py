"""Dead clusters: detection (kmeans.dead_mask, health.DeadClusterHook) and optional re-seeding."""
import numpy as np
import tensorflow.compat.v1 as tf

from routing_transformer.core import health
from routing_transformer.core import kmeans


def run(fetches, init=True):
  with tf.Session() as sess:
    if init:
      sess.run(tf.global_variables_initializer())
    return sess.run(fetches)


def test_dead_mask_and_numpy_detector_agree():
  counts = np.array([[100.0, 100.0, 1e-3, 100.0], [50.0, 0.0, 50.0, 50.0]], np.float32)
  with tf.Graph().as_default():
    mask = run(kmeans.dead_mask(tf.constant(counts)), init=False)
  assert mask.tolist() == [[False, False, True, False], [False, True, False, False]]
  assert health.dead_clusters(counts) == [(0, 2), (1, 1)]


def test_reseed_replaces_only_dead_centroids_consistently():
  candidates = np.arange(1, 13, dtype=np.float32).reshape(1, 4, 3)
  x_hat = np.random.RandomState(0).randn(1, 1, 6, 3).astype(np.float32)
  clusters = np.array([[[0, 1, 2, 0, 1, 2]]], np.int32)  # cluster 3 gets nobody
  weights = np.ones([1, 6], np.float32)
  results = {}
  for reseed in (False, True):
    with tf.Graph().as_default():
      km = kmeans.OnlineKMeans(1, 4, 3)
      counts, sums = kmeans.combined_statistics([tf.constant(x_hat)], [tf.constant(clusters)], 4,
                                                tf.constant(weights))
      op, _ = km.update_from_statistics(counts, sums, tf.constant(candidates) if reseed else None)
      with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        sess.run(km.ema_count.assign([[10.0, 10.0, 10.0, 0.0]]))
        sess.run(km.ema_means.assign(np.full([1, 4, 3], 0.5, np.float32)))
        sess.run(op)
        results[reseed] = sess.run([km.means, km.ema_count, km.ema_means,
                                    kmeans.smoothed_means(km.ema_count, km.ema_means)])
  plain, seeded = results[False], results[True]
  np.testing.assert_allclose(seeded[0][0, 3], candidates[0, 3])  # the dead one takes its seed
  np.testing.assert_allclose(seeded[0][0, :3], plain[0][0, :3], rtol=1e-6)  # the others: EMA
  np.testing.assert_allclose(seeded[1], plain[1])  # counts unchanged
  np.testing.assert_allclose(seeded[3], seeded[0], rtol=1e-5)  # stored stats give the same means


def test_reseed_candidates_come_from_real_positions():
  x_hat = np.arange(2 * 2 * 5 * 3, dtype=np.float32).reshape(2, 2, 5, 3)
  weights = np.array([[1, 1, 0, 0, 0], [0, 0, 0, 1, 0]], np.float32)
  with tf.Graph().as_default():
    out = run(kmeans.reseed_candidates(tf.constant(x_hat), tf.constant(weights), 16, seed=3),
              init=False)
  assert out.shape == (2, 16, 3)
  for head in range(2):
    real = {tuple(x_hat[b, head, n]) for b in range(2) for n in range(5) if weights[b, n]}
    assert {tuple(v) for v in out[head]} <= real


def test_hook_logs_dead_clusters_every_n_steps():
  with tf.Graph().as_default():
    with tf.variable_scope("decoder_layer_1/cluster_attention"):
      tf.get_variable("ema_count", initializer=tf.constant([[10.0, 10.0, 0.0, 10.0]]),
                      trainable=False)
    step = tf.train.get_or_create_global_step()
    train_op = tf.assign_add(step, 1)
    hook = health.DeadClusterHook(every_n_steps=2)
    with tf.train.MonitoredSession(hooks=[hook]) as sess:
      sess.run(train_op)
      sess.run(train_op)
  assert hook.found == {"decoder_layer_1/cluster_attention/ema_count": [(0, 2)]}
