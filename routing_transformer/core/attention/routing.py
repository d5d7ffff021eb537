"""Routing attention (Algorithm 1 of Roy et al., 2021): attention inside balanced k-means clusters.

For routing heads with q, k, v of shape [b, h, n, d] and centroids mu of shape [h, c, d]:
normalise q and k (LayerNorm without scale), score every position against every centroid, let each
centroid c take the `window` = w best positions (sorted back into sequence order), attend inside
each w x w cluster block (causal triangle in causal mode, unscaled logits), and scatter the cluster
outputs back, dividing by how many clusters each position is in (+ 1e-2).
Cost O(n c d + c w^2 d); with c = n / w and w ~ sqrt(n) this is O(n^1.5 d).
"""
import tensorflow as tf

from routing_transformer.core import kmeans
from routing_transformer.core.attention import common

COUNT_EPSILON = 1e-2


def centroid_scores(x_hat, centroids):
  """Dot products of normalised vectors with centroids.

  Args:
    x_hat: [b, h, n, d].
    centroids: [h, c, d].
  Returns:
    [b, h, c, n] scores mu_c . x_i.
  """
  return tf.einsum("hcd,bhnd->bhcn", tf.cast(centroids, x_hat.dtype), x_hat)


def top_window(scores, window, padding=None):
  """Balanced cluster membership: the `window` best positions per centroid, in sequence order.

  Args:
    scores: [b, h, c, n].
    window: w, members per cluster (w <= n).
    padding: optional bool [b, n]; padding positions lose every tie with real positions.
  Returns:
    int32 [b, h, c, w], ascending along the last axis.
  """
  if padding is not None:
    scores = tf.where(padding[:, tf.newaxis, tf.newaxis, :], common.mask_value(scores.dtype),
                      scores)
  _, indices = tf.math.top_k(scores, k=window, sorted=False)
  return tf.sort(indices, axis=-1)


def gather_clusters(x, indices):
  """Gathers cluster members.

  Args:
    x: [b, h, n, ...].
    indices: int32 [b, h, c, w].
  Returns:
    [b, h, c, w, ...].
  """
  return tf.gather(x, indices, axis=2, batch_dims=2)


def scatter_clusters(values, indices, length):
  """Sums cluster outputs back onto their positions (the transpose of `gather_clusters`).

  Args:
    values: [b, h, c, w, d].
    indices: int32 [b, h, c, w] positions in [0, length).
    length: n.
  Returns:
    [b, h, n, d]: out[i] = sum of values at the (c, w) slots whose index is i.
  """
  shape = tf.shape(values)
  batch, heads, depth = shape[0], shape[1], shape[4]
  offsets = tf.reshape(tf.range(batch * heads) * length, [batch, heads, 1, 1])
  segments = tf.reshape(indices + offsets, [-1])
  summed = tf.math.unsorted_segment_sum(tf.reshape(values, [-1, depth]), segments,
                                        batch * heads * length)
  return tf.reshape(summed, [batch, heads, length, values.shape[4]])


def position_weights(padding, batch, length, dtype=tf.float32):
  """[b, n] weights: 1 for real positions, 0 for padding (all ones without padding)."""
  if padding is None:
    return tf.ones([batch, length], dtype)
  return 1.0 - tf.cast(padding, dtype)


def check_routing(length, depth, centroids, window, name):
  """Validates the centroid table and the window; raises ValueError naming the fix."""
  if centroids.shape.rank != 3 or centroids.shape[2] != depth:
    raise ValueError(
        "%s: centroids must have shape [heads, num_clusters, %d], got %s."
        % (name, depth, centroids.shape))
  if not 0 < window <= length:
    raise ValueError(
        "%s: window %d must be in [1, length=%d]; lower sparsity_cluster_attention_window or "
        "raise max_length." % (name, window, length))


def routing_attention(q, k, v, centroids, window, causal=True, share_qk=True, padding=None,
                      relative_keys=None, relative_values=None, random_routing=False,
                      exclude_self=False, logit_scale=None, legacy_causal_key_routing=False):
  """Content-based sparse attention inside balanced clusters (SPEC section 2).

  Args:
    q, k, v: [b, h, n, d] routing-head queries, keys, values.
    centroids: [h, c, d] k-means centroids (queries and keys share them).
    window: w, members per cluster.
    causal: in-cluster causal mask (key position <= query position); key members = query
      members. Non-causal: keys are routed separately (unless share_qk) and not masked.
    share_qk: keys are the queries (k_hat = q_hat); `k` is then ignored.
    padding: optional [b, n] bool/int, True or nonzero marks padding (masked as keys, never
      preferred as members, excluded from the commitment loss and the k-means statistics).
    relative_keys, relative_values: optional [2R + 1, d] tables indexed by the rank distance
      inside the sorted cluster.
    random_routing: the Random Transformer baseline (paper Table 1): cluster members are drawn
      uniformly at random instead of by centroid scores (the k-means outputs are still computed).
    exclude_self: extension (off in the paper): a query does not attend to its own position
      when its cluster allows it another key (`common.exclude_self`).
    logit_scale: extension: None (the paper's unscaled q_hat . k_hat logits), a float or a
      per-head [h] tensor multiplying the logits (relative logits included).
    legacy_causal_key_routing: the original release's rule for causal mode with share_qk=False:
      keys/values of cluster c are the top-w positions of the keys' own scores (not the query
      members), and the mask allows key rank <= query rank inside the cluster (ranks in two
      different position lists). Only for its checkpoints; no effect with share_qk or non-causal.
  Returns:
    (output [b, h, n, d], aux) where aux holds
      "query_clusters": int32 [b, h, n] argmax centroid of each q_hat,
      "key_clusters": the same for k_hat (only when not share_qk),
      "commitment_loss": float32 scalar mean((x - stop_gradient(mu[argmax x]))^2) over real
        positions (queries and, when not share_qk, keys averaged),
      "q_hat", "k_hat": [b, h, n, d] normalised vectors; "weights": [b, n] 1 for real positions,
        0 for padding (with the clusters, the k-means statistics),
      "query_indices", "key_indices": int32 [b, h, c, w] cluster members.
  """
  name = "routing_attention"
  q, k, v, relative_keys, relative_values, _, n, depth = common.self_attention_inputs(
      q, k, v, relative_keys, relative_values, name)
  centroids = tf.convert_to_tensor(centroids)
  check_routing(n, depth, centroids, window, name)
  pad = common.key_padding(padding, None, n, name)

  q_hat = common.layer_norm_no_scale(q)
  k_hat = q_hat if share_qk else common.layer_norm_no_scale(k)
  weights = position_weights(pad, tf.shape(q)[0], n)
  # No gradient reaches the centroids through routing (top-k and argmax are discrete).
  mu = tf.stop_gradient(centroids)
  query_scores = centroid_scores(q_hat, mu)
  query_clusters = kmeans.assignments(query_scores)
  member_scores = tf.random.uniform(tf.shape(query_scores)) if random_routing else query_scores
  query_indices = top_window(member_scores, window, pad)
  loss = kmeans.commitment_loss(q_hat, mu, query_clusters, weights)
  aux = {"q_hat": q_hat, "k_hat": k_hat, "weights": weights, "query_clusters": query_clusters,
         "query_indices": query_indices}
  key_indices = query_indices
  if not share_qk:  # keys commit to (and, non-causal, are routed by) their own centroids
    key_scores = centroid_scores(k_hat, mu)
    aux["key_clusters"] = kmeans.assignments(key_scores)
    loss = 0.5 * (loss + kmeans.commitment_loss(k_hat, mu, aux["key_clusters"], weights))
    if not causal or legacy_causal_key_routing:
      key_indices = top_window(
          tf.random.uniform(tf.shape(key_scores)) if random_routing else key_scores, window, pad)
  aux["key_indices"] = key_indices
  aux["commitment_loss"] = loss

  q_c = gather_clusters(q_hat, query_indices)  # [b, h, c, w, d]
  k_c = q_c if share_qk else gather_clusters(k_hat, key_indices)
  v_c = gather_clusters(v, key_indices)
  logits = tf.matmul(q_c, k_c, transpose_b=True)  # [b, h, c, w, w]
  ranks = tf.range(window)
  if relative_keys is not None:
    logits += common.relative_logits(q_c, relative_keys, 0, 0, window, causal=causal)
  logits = common.scale_logits(logits, logit_scale)
  allowed = tf.ones([1, 1, 1, 1, window], tf.bool)
  # Members are sorted, so key position <= query position is the lower triangle (with legacy
  # key routing the same rank triangle, over two different member lists).
  if causal:
    allowed = (ranks[:, tf.newaxis] >= ranks[tf.newaxis, :])[tf.newaxis, tf.newaxis, tf.newaxis]
  if pad is not None:
    key_pad = tf.gather(pad, tf.reshape(key_indices, [tf.shape(pad)[0], -1]), batch_dims=1)
    key_pad = tf.reshape(key_pad, tf.shape(key_indices))[:, :, :, tf.newaxis, :]
    allowed = tf.logical_and(allowed, tf.logical_not(key_pad))
  if exclude_self:
    allowed = common.exclude_self(tf.broadcast_to(allowed, tf.shape(logits)), tf.equal(
        query_indices[..., :, tf.newaxis], key_indices[..., tf.newaxis, :]))
  probs = common.masked_softmax(logits, allowed)
  out_c = tf.matmul(probs, v_c)
  if relative_values is not None:
    out_c += common.relative_outputs(probs, relative_values, 0, 0, causal=causal)
  if pad is not None:  # a query whose allowed keys are all padding gets 0
    out_c = common.zero_empty_rows(out_c, allowed)

  summed = scatter_clusters(out_c, query_indices, n)
  ones = tf.ones_like(query_indices, dtype=summed.dtype)[..., tf.newaxis]
  count = scatter_clusters(ones, query_indices, n)  # [b, h, n, 1]
  # Diagnostics (graph mode computes them only where used: the TRAIN summaries).
  is_self = tf.cast(tf.equal(query_indices[..., :, tf.newaxis], key_indices[..., tf.newaxis, :]),
                    probs.dtype)
  self_probs = tf.reduce_sum(probs * is_self, axis=-1, keepdims=True)  # [b, h, c, w, 1]
  aux["member_count"] = count[..., 0]
  aux["self_weight"] = (scatter_clusters(self_probs, query_indices, n) /
                        (count + COUNT_EPSILON))[..., 0]
  return summed / (count + COUNT_EPSILON), aux


def routing_statistics(member_count, self_weight, weights):
  """What holds routing heads back, as two scalars (TRAIN summaries; docs/routing_learning.md).

  Args:
    member_count: [b, h, n] number of clusters each query is in (aux "member_count").
    self_weight: [b, h, n] attention weight of each query on its own position (aux
      "self_weight"; combined over its clusters as the output is).
    weights: [b, n] 1 for real positions, 0 for padding.
  Returns:
    dict of float32 scalars: "no_cluster_share", the share of real queries in no cluster (their
    routing output is 0); "self_attention_share", the mean weight on self over the real queries
    that are in a cluster.
  """
  weights = tf.cast(weights, tf.float32)[:, tf.newaxis, :] * tf.ones_like(self_weight,
                                                                          tf.float32)
  routed = tf.cast(member_count > 0, tf.float32) * weights
  return {
      "no_cluster_share": 1.0 - tf.reduce_sum(routed) / tf.maximum(tf.reduce_sum(weights), 1.0),
      "self_attention_share": tf.reduce_sum(tf.cast(self_weight, tf.float32) * routed) /
                              tf.maximum(tf.reduce_sum(routed), 1.0),
  }
