"""Online k-means of one routing layer in Mesh-TensorFlow (Roy et al., TACL 2021).

Variables (named dims; `heads` may be split over the mesh like the routing heads):
  means      [heads, clusters, d_head]  centroids (init LayerNorm-without-scale of N(0, 1))
  ema_count  [heads, clusters]          EMA of cluster sizes (init 0), non-trainable
  ema_means  [heads, clusters, d_head]  EMA of cluster sums (init = means), non-trainable
The statistics are einsums that reduce over batch and length, so Mesh-TF sums them over every
shard of a split batch: all processors apply the same update and keep identical centroids.
"""
import zlib

import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from routing_transformer.core import kmeans as tf_kmeans
from routing_transformer.core.attention import common
from routing_transformer.t2t.mtf import attention


def stateless_means_initializer(seed):
  """Initializer: LayerNorm (no scale) of N(0, 1) with a fixed seed (means and ema_means match)."""

  def init(shape, dtype=tf.float32, partition_info=None):  # pylint: disable=unused-argument
    x = tf.random.stateless_normal(shape, seed=[seed, 0], dtype=tf.float32)
    return tf.cast(common.layer_norm_no_scale(x, attention.LN_EPSILON), dtype)

  return init


def cluster_statistics(x_hat, clusters, weights, clusters_dim, heads_dim, d_dim):
  """Cluster sizes [heads, clusters] and sums [heads, clusters, d] of one batch (padding excluded)."""
  one_hot = mtf.one_hot(clusters, clusters_dim, dtype=tf.float32) * weights  # [b, h, n, c]
  counts = mtf.reduce_sum(one_hot, output_shape=[heads_dim, clusters_dim])
  sums = mtf.einsum([one_hot, mtf.cast(x_hat, tf.float32)],
                    output_shape=[heads_dim, clusters_dim, d_dim])
  return counts, sums


class MtfKMeans(object):
  """The centroids of one routing layer; build inside the layer's tf variable scope."""

  def __init__(self, mesh, heads_dim, clusters_dim, d_dim, decay=tf_kmeans.DECAY,
               beta=tf_kmeans.BETA, epsilon=tf_kmeans.EPSILON, ema=True,
               name="cluster_attention"):
    self.heads_dim, self.clusters_dim, self.d_dim = heads_dim, clusters_dim, d_dim
    self.decay, self.beta, self.epsilon, self.ema = decay, beta, epsilon, ema
    with tf.variable_scope(name):
      seed = zlib.crc32(tf.get_variable_scope().name.encode()) % (2 ** 31)
      init = stateless_means_initializer(seed)
      shape = mtf.Shape([heads_dim, clusters_dim, d_dim])
      self.means = attention.get_variable(mesh, "means", shape, initializer=init,
                                          trainable=not ema)
      self.ema_count = attention.get_variable(mesh, "ema_count",
                                              mtf.Shape([heads_dim, clusters_dim]),
                                              initializer=tf.zeros_initializer(), trainable=False)
      self.ema_means = attention.get_variable(mesh, "ema_means", shape, initializer=init,
                                              trainable=False)

  def update(self, x_hats, clusters, weights):
    """EMA update ops (TRAIN mode) from this step's assignments, queries and keys combined.

    Args:
      x_hats: list of [b, h, n, d] normalised vectors.
      clusters: matching list of int32 [b, h, n] assignments.
      weights: [b, n], 1 for real positions, 0 for padding.
    Returns:
      (list of mtf assign Operations, counts [h, c] of this step).
    """
    stats = [cluster_statistics(x, a, weights, self.clusters_dim, self.heads_dim, self.d_dim)
             for x, a in zip(x_hats, clusters)]
    counts = mtf.add_n([s[0] for s in stats])
    sums = mtf.add_n([s[1] for s in stats])
    new_count, new_sums = tf_kmeans.ema_step(self.ema_count, self.ema_means, counts, sums,
                                             self.decay)
    total = mtf.reduce_sum(new_count, reduced_dim=self.clusters_dim)  # [h]
    smoothed = (new_count + self.epsilon) / (total + self.clusters_dim.size * self.epsilon) * total
    new_means = new_sums / smoothed
    ops = [mtf.assign(self.ema_count, new_count), mtf.assign(self.ema_means, new_sums)]
    if self.ema:  # with ema=False the codebook loss's gradient moves the means
      ops.append(mtf.assign(self.means, new_means))
    return ops, counts

  def loss(self, commitment, x_hats=(), clusters=(), weights=None):
    """The k-means loss weighted as `tf_kmeans.clustering_loss`: ROUTED_SETS * beta * commitment;
    with ema=False plus ROUTED_SETS times the mean codebook loss mean((sg(x) - mu)^2)."""
    total = commitment * (tf_kmeans.ROUTED_SETS * self.beta)
    if not self.ema:
      for x_hat, assigned in zip(x_hats, clusters):
        mu = mtf.einsum([mtf.one_hot(assigned, self.clusters_dim, dtype=x_hat.dtype), self.means],
                        output_shape=x_hat.shape)
        squared = mtf.reduce_sum(mtf.square(mtf.stop_gradient(x_hat) - mu),
                                 reduced_dim=self.d_dim)
        denom = mtf.reduce_sum(weights) * float(self.heads_dim.size * self.d_dim.size)
        total += (mtf.reduce_sum(squared * weights) / mtf.maximum(denom, 1.0) *
                  (tf_kmeans.ROUTED_SETS / len(x_hats)))
    return total
