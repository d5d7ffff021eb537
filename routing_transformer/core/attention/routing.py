"""Routing attention (Roy et al., TACL 2021, Algorithm 1) of q, k, v [b, h, n, d], centroids
mu [h, c, d]: (1) normalise q, k (LayerNorm without scale); (2) assign each to its best centroid
(commitment loss); (3) each centroid takes its w best positions, in order; (4-6) attend inside
each w x w block (causal triangle, unscaled logits); (7) scatter back / (cluster count + 1e-2).
"""
import collections

import tensorflow as tf

from routing_transformer.core import kmeans
from routing_transformer.core.attention import common

COUNT_EPSILON = 1e-2

_FIELDS = ("q_hat", "k_hat", "weights", "query_clusters", "key_clusters", "query_indices",
           "key_indices", "commitment_loss", "member_count", "self_weight")


class Routed(collections.namedtuple("Routed", _FIELDS, defaults=(None,) * len(_FIELDS))):
  """What routing decided and measured; also read as `routed["q_hat"]`. q_hat, k_hat [b, h, n, d]
  (one tensor with share_qk); weights [b, n] (0 at padding); query_clusters, key_clusters int32
  [b, h, n] (key None with share_qk); query_indices, key_indices int32 [b, h, c, w];
  commitment_loss scalar; member_count, self_weight [b, h, n] (`routing_statistics`)."""
  __slots__ = ()

  def __getitem__(self, key):
    return getattr(self, key) if isinstance(key, str) else super().__getitem__(key)

  def __contains__(self, key):
    return getattr(self, key, None) is not None


def centroid_scores(x_hat, centroids):
  """Scores mu_c . x_i [b, h, c, n] of x_hat [b, h, n, d] and centroids [h, c, d]."""
  return tf.einsum("hcd,bhnd->bhcn", tf.cast(centroids, x_hat.dtype), x_hat)


def top_window(scores, window, padding=None):
  """The `window` best positions per centroid of scores [b, h, c, n], ascending: int32
  [b, h, c, w]; padding (optional bool [b, n]) loses every tie with real positions."""
  if padding is not None:
    scores = tf.where(padding[:, tf.newaxis, tf.newaxis, :], common.mask_value(scores.dtype),
                      scores)
  _, indices = tf.math.top_k(scores, k=window, sorted=False)
  return tf.sort(indices, axis=-1)


def gather_clusters(x, indices):
  """Cluster members [b, h, c, w, ...] of x [b, h, n, ...] at indices int32 [b, h, c, w]."""
  return tf.gather(x, indices, axis=2, batch_dims=2)


def scatter_clusters(values, indices, length):
  """Transpose of `gather_clusters`: values [b, h, c, w, d] summed at indices -> [b, h, n, d]."""
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


def normalised_inputs(q, k, v, centroids, window, share_qk, padding, relative_keys,
                      relative_values, name):
  """Step 1, validated: (q_hat, k_hat [b, h, n, d] in `compute_dtype` (one tensor with
  share_qk), v, stop_gradient(centroids) [h, c, d], padding bool [b, n] or None, tables)."""
  q, k, v, relative_keys, relative_values, _, n, depth = common.self_attention_inputs(
      q, k, v, relative_keys, relative_values, name)
  centroids = tf.convert_to_tensor(centroids)
  check_routing(n, depth, centroids, window, name)
  pad = common.key_padding(padding, None, n, name)
  wide = common.compute_dtype(q.dtype)
  q_hat = common.layer_norm_no_scale(q, dtype=wide)
  k_hat = q_hat if share_qk else common.layer_norm_no_scale(k, dtype=wide)
  # No gradient reaches the centroids through routing (top-k and argmax are discrete).
  return q_hat, k_hat, v, tf.stop_gradient(centroids), pad, relative_keys, relative_values


def padding_roles(padding, causal, as_original=False):
  """(key mask, member padding, k-means padding): padding everywhere, or as the original release
  (hparam `routing_padding_as_original`) routes padding as real, masks its keys only non-causal."""
  if not as_original:
    return padding, padding, padding
  return (None if causal else padding), None, None


def members(scores, window, padding=None, random_routing=False):
  """`top_window` of the scores, or of uniform draws for the Random Transformer baseline."""
  if random_routing:
    scores = tf.random.uniform(tf.shape(scores))
  return top_window(scores, window, padding)


def route(q_hat, k_hat, mu, window, share_qk, route_keys, member_padding=None, weights=None,
          random_routing=False):
  """Steps 2 and 3: assignments, commitment loss, balanced cluster members -> Routed.

  q_hat, k_hat [b, h, n, d], mu [h, c, d] (stop-gradient); route_keys: without share_qk, keys'
  members are their own top-w (else the queries'); member_padding: optional bool [b, n], losing
  every top-k tie; weights: [b, n] k-means weights (default 1); random_routing: random members.
  """
  if weights is None:
    weights = position_weights(None, tf.shape(q_hat)[0], q_hat.shape[2])
  query_scores = centroid_scores(q_hat, mu)
  query_clusters = kmeans.assignments(query_scores)
  query_indices = key_indices = members(query_scores, window, member_padding, random_routing)
  key_clusters = None
  loss = kmeans.commitment_loss(q_hat, mu, query_clusters, weights)
  if not share_qk:  # keys commit to (and, when routed, are routed by) their own centroids
    key_scores = centroid_scores(k_hat, mu)
    key_clusters = kmeans.assignments(key_scores)
    loss = 0.5 * (loss + kmeans.commitment_loss(k_hat, mu, key_clusters, weights))
    if route_keys:
      key_indices = members(key_scores, window, member_padding, random_routing)
  return Routed(q_hat, k_hat, weights, query_clusters, key_clusters, query_indices, key_indices,
                loss)


def cluster_attention(aux, v, window, causal, key_padding=None, relative_keys=None,
                      relative_values=None, exclude_self=False, logit_scale=None,
                      dropout_rate=0.0):
  """Steps 4 to 7: (output [b, h, n, d] of v's dtype, aux with member_count, self_weight) of
  aux (`route`) and v [b, h, n, d]; causal: key rank <= query rank; the rest as in
  `routing_attention`."""
  q_hat, query_indices, key_indices = aux.q_hat, aux.query_indices, aux.key_indices
  n = q_hat.shape[2]
  q_c = gather_clusters(q_hat, query_indices)  # [b, h, c, w, d]
  shared = aux.k_hat is q_hat and key_indices is query_indices  # share_qk: one gather
  k_c = q_c if shared else gather_clusters(aux.k_hat, key_indices)
  v_c = gather_clusters(tf.cast(v, q_hat.dtype), key_indices)
  logits = tf.matmul(q_c, k_c, transpose_b=True)  # [b, h, c, w, w]
  ranks = tf.range(window)
  if relative_keys is not None:
    logits += common.relative_logits(q_c, relative_keys, 0, 0, window, causal=causal)
  logits = common.scale_logits(logits, logit_scale)
  allowed = tf.ones([1, 1, 1, 1, window], tf.bool)
  if causal:  # members are sorted: key position <= query position is the lower triangle
    allowed = (ranks[:, tf.newaxis] >= ranks[tf.newaxis, :])[tf.newaxis, tf.newaxis, tf.newaxis]
  if key_padding is not None:
    key_pad = tf.gather(key_padding, tf.reshape(key_indices, [tf.shape(key_padding)[0], -1]),
                        batch_dims=1)
    key_pad = tf.reshape(key_pad, tf.shape(key_indices))[:, :, :, tf.newaxis, :]
    allowed = tf.logical_and(allowed, tf.logical_not(key_pad))
  # Key members = query members (causal, or share_qk): "is self" is the identity [w, w].
  members_shared = key_indices is query_indices
  if exclude_self:
    is_self = tf.eye(window, dtype=tf.bool) if members_shared else tf.equal(
        query_indices[..., :, tf.newaxis], key_indices[..., tf.newaxis, :])
    allowed = common.exclude_self(tf.broadcast_to(allowed, tf.shape(logits)), is_self)
  probs = common.masked_softmax(logits, allowed)
  dropped = common.attention_dropout(probs, dropout_rate)
  out_c = tf.matmul(dropped, v_c)
  if relative_values is not None:
    out_c += common.relative_outputs(dropped, relative_values, 0, 0, causal=causal)
  if key_padding is not None:  # a query whose allowed keys are all padding gets 0
    out_c = common.zero_empty_rows(out_c, allowed)  # (on the output: no second [w, w] copy)

  summed = scatter_clusters(out_c, query_indices, n)
  ones = tf.ones_like(query_indices, dtype=summed.dtype)[..., tf.newaxis]
  count = scatter_clusters(ones, query_indices, n)  # [b, h, n, 1]
  # Diagnostics (graph mode computes them only where used: the TRAIN summaries).
  if members_shared:  # the diagonal of the [w, w] weights
    self_probs = tf.expand_dims(tf.linalg.diag_part(probs), -1)  # [b, h, c, w, 1]
  else:
    is_self = tf.cast(tf.equal(query_indices[..., :, tf.newaxis],
                               key_indices[..., tf.newaxis, :]), probs.dtype)
    self_probs = tf.reduce_sum(probs * is_self, axis=-1, keepdims=True)  # [b, h, c, w, 1]
  if key_padding is not None:
    self_probs = common.zero_empty_rows(self_probs, allowed)
  self_weight = scatter_clusters(self_probs, query_indices, n) / (count + COUNT_EPSILON)
  aux = aux._replace(member_count=count[..., 0], self_weight=self_weight[..., 0])
  return tf.cast(summed / (count + COUNT_EPSILON), v.dtype), aux


def routing_attention(q, k, v, centroids, window, causal=True, share_qk=True, padding=None,
                      relative_keys=None, relative_values=None, random_routing=False,
                      exclude_self=False, logit_scale=None, legacy_causal_key_routing=False,
                      dropout_rate=0.0, padding_as_original=False):
  """Content-based sparse attention inside balanced clusters (Algorithm 1).

  Args:
    q, k, v: [b, h, n, d] (k ignored with share_qk); centroids: [h, c, d]; window: w.
    causal: in-cluster causal mask, key members = query members; else keys routed on their own.
    padding: optional [b, n] bool/int, True at padding (masked keys, last in ties, no k-means).
    relative_keys, relative_values: optional [2R + 1, d] tables of the rank distance.
    random_routing: the Random Transformer baseline (paper Table 1).
    exclude_self, logit_scale: extensions (off in the paper; `common.exclude_self`).
    legacy_causal_key_routing: the original release's causal rule with separate keys (its
      `clustered_local_attention_helper`): keys' own top-w, masked by rank; for its checkpoints.
    dropout_rate: attention dropout; padding_as_original: `padding_roles`.
  Returns:
    (output [b, h, n, d] of v's dtype, Routed); bfloat16 routes and attends in float32.
  """
  q_hat, k_hat, v, mu, pad, rel_k, rel_v = normalised_inputs(
      q, k, v, centroids, window, share_qk, padding, relative_keys, relative_values,
      "routing_attention")
  key_pad, member_pad, kmeans_pad = padding_roles(pad, causal, padding_as_original)
  route_keys = not causal or (legacy_causal_key_routing and not share_qk)
  aux = route(q_hat, k_hat, mu, window, share_qk, route_keys, member_pad,
              position_weights(kmeans_pad, tf.shape(q_hat)[0], q_hat.shape[2]), random_routing)
  return cluster_attention(aux, v, window, causal, key_pad, rel_k, rel_v, exclude_self,
                           logit_scale, dropout_rate)


def routing_statistics(member_count, self_weight, weights):
  """TRAIN summaries over real positions: "no_cluster_share" (queries in no cluster, output 0)
  and the routed ones' mean "self_attention_share"."""
  weights = tf.cast(weights, tf.float32)[:, tf.newaxis, :] * tf.ones_like(self_weight,
                                                                          tf.float32)
  routed = tf.cast(member_count > 0, tf.float32) * weights
  return {
      "no_cluster_share": 1.0 - tf.reduce_sum(routed) / tf.maximum(tf.reduce_sum(weights), 1.0),
      "self_attention_share": tf.reduce_sum(tf.cast(self_weight, tf.float32) * routed) /
                              tf.maximum(tf.reduce_sum(routed), 1.0),
  }
