"""One-position attention over fixed-size caches (static length N) for cached decoding: at step
t the new query attends to cached positions 0..t. b batch, h heads, d depth, c clusters, w window.

Decode-time routing rule (causal, as generation needs): at step t a cluster's members are the
top-w of the centroid scores over the prefix 0..t; the query at t gets the average of its
in-cluster attention over the clusters whose top-w contains t (0 if none).
"""
import tensorflow as tf

from routing_transformer.core import kmeans
from routing_transformer.core.attention import common
from routing_transformer.core.attention import routing


def write_cache(cache, value, position, axis=2):
  """`cache` [..., N, ...] (N at the static `axis`) with its slice at `position` replaced by
  `value` (the cache's shape with 1 at `axis`): a scatter of the new slice only."""
  axis = axis % cache.shape.rank
  lead = tf.shape(cache)[:axis]
  grid = tf.meshgrid(*[tf.range(lead[i]) for i in range(axis)], indexing="ij")
  indices = tf.stack([tf.reshape(g, [-1]) for g in grid] +
                     [tf.fill(tf.reshape(tf.reduce_prod(lead), [1]), position)], axis=1)
  updates = tf.reshape(value, tf.concat([[-1], tf.shape(value)[axis + 1:]], axis=0))
  return tf.tensor_scatter_nd_update(cache, indices, updates)


def local_attention_step(q, k_cache, v_cache, position, block_length, flange, causal=True,
                         relative_keys=None, relative_values=None, padding=None, scale=None):
  """`local.local_attention` of the query q [b, h, 1, d] at `position` t over k_cache, v_cache
  [b, h, N, d] (written up to t) -> [b, h, 1, d]; padding: optional bool [b, N]."""
  length, scale = k_cache.shape[2], q.shape[-1] ** -0.5 if scale is None else scale
  start = (position // block_length) * block_length - flange
  keys = start + tf.range(flange + block_length + (0 if causal else flange))  # [W] positions
  allowed = tf.logical_and(keys >= 0, keys < length)
  if causal:
    allowed = tf.logical_and(allowed, keys <= position)
  safe = tf.clip_by_value(keys, 0, length - 1)
  allowed = allowed[tf.newaxis, tf.newaxis, tf.newaxis, :]
  if padding is not None:
    pad = tf.gather(padding, safe, axis=1)  # [b, W]
    allowed = tf.logical_and(allowed, tf.logical_not(pad)[:, tf.newaxis, tf.newaxis, :])
  out = _attend(q * scale, tf.gather(k_cache, safe, axis=2), tf.gather(v_cache, safe, axis=2),
                position, keys, allowed, relative_keys, relative_values)
  if padding is not None:
    out = common.zero_empty_rows(out, allowed)
  return out


def routing_attention_step(q_hat, k_hat_cache, v_cache, score_cache, position, window,
                           relative_keys=None, relative_values=None, exclude_self=False,
                           logit_scale=None):
  """Routing attention of the normalised query q_hat [b, h, 1, d] at `position` t under the
  decode-time rule -> [b, h, 1, d]. Caches written up to t: k_hat_cache, v_cache [b, h, N, d],
  score_cache [b, h, c, N] (mu_c . q_hat_j). Relative tables by rank distance in the cluster;
  exclude_self, logit_scale as `routing.routing_attention`."""
  length = score_cache.shape[-1]
  future = tf.range(length) > position  # [N]
  members = routing.top_window(score_cache, window,
                               tf.broadcast_to(future, [tf.shape(score_cache)[0], length]))
  contains = tf.reduce_any(tf.equal(members, position), axis=-1)  # [b, h, c]
  rank = tf.reduce_sum(tf.cast(members < position, tf.int32), axis=-1)  # t's rank where member
  k = routing.gather_clusters(k_hat_cache, members)  # [b, h, c, w, d]
  v = routing.gather_clusters(v_cache, members)
  q = q_hat[:, :, :, tf.newaxis, :]  # [b, h, 1, 1, d] against [b, h, c, w, d]
  logits = tf.matmul(q, k, transpose_b=True)[:, :, :, 0, :]  # [b, h, c, w]
  distance = tf.range(window)[tf.newaxis, tf.newaxis, tf.newaxis, :] - rank[..., tf.newaxis]
  if relative_keys is not None:
    rel_k = _rank_embeddings(relative_keys, distance)  # [b, h, c, w, d]
    logits += tf.reduce_sum(q * tf.cast(rel_k, q.dtype), axis=-1)
  logits = common.scale_logits(logits, logit_scale)
  allowed = members <= position
  if exclude_self:
    allowed = common.exclude_self(allowed, tf.equal(members, position))
  probs = common.masked_softmax(logits, allowed)
  out = tf.matmul(probs[:, :, :, tf.newaxis, :], v)[:, :, :, 0, :]  # [b, h, c, d]
  if relative_values is not None:
    rel_v = _rank_embeddings(relative_values, distance)
    out += tf.reduce_sum(probs[..., tf.newaxis] * tf.cast(rel_v, probs.dtype), axis=-2)
  weight = tf.cast(contains, out.dtype)[..., tf.newaxis]
  summed = tf.reduce_sum(out * weight, axis=2)  # [b, h, d]
  count = tf.reduce_sum(weight, axis=2)
  return (summed / (count + routing.COUNT_EPSILON))[:, :, tf.newaxis, :]


def _rank_embeddings(table, distance):
  """Rows of `table` [2R + 1, d] for int rank distances [...] -> [..., d] (clipped to R)."""
  radius = (table.shape[0] - 1) // 2
  return tf.gather(table, tf.clip_by_value(distance, -radius, radius) + radius)


def local_ring_step(q, k_ring, v_ring, ring_positions, position, block_length, flange,
                    relative_keys=None, relative_values=None, scale=None):
  """Causal `local_attention_step` over a ring of R >= flange + block_length slots, k_ring,
  v_ring [b, h, R, d] (slot p % R holds position p, written by the caller; ring_positions int32
  [R], -1 = empty): the cost per token does not grow with the prefix."""
  scale = q.shape[-1] ** -0.5 if scale is None else scale
  start = (position // block_length) * block_length - flange
  allowed = (ring_positions >= tf.maximum(start, 0)) & (ring_positions <= position)
  return _attend(q * scale, k_ring, v_ring, position, ring_positions, allowed, relative_keys,
                 relative_values)


def _attend(q, k, v, position, keys, allowed, relative_keys, relative_values):
  """Softmax attention of the scaled query q [b, h, 1, d] at `position` over k, v [b, h, W, d]
  at positions `keys` [W], masked by `allowed` -> [b, h, 1, d]."""
  logits = tf.matmul(q, k, transpose_b=True)  # [b, h, 1, W]
  query = tf.reshape(position, [1])
  if relative_keys is not None:
    rel_k = common.relative_embeddings(relative_keys, query, keys)[0]  # [W, d]
    logits += tf.einsum("bhqd,kd->bhqk", q, tf.cast(rel_k, logits.dtype))
  probs = common.masked_softmax(logits, allowed)
  out = tf.matmul(probs, v)
  if relative_values is not None:
    rel_v = common.relative_embeddings(relative_values, query, keys)[0]
    out += tf.einsum("bhqk,kd->bhqd", probs, tf.cast(rel_v, probs.dtype))
  return out


def causal_window_cache(batch, heads, num_clusters, window, depth, dtype=tf.float32):
  """Empty caches of each (head, cluster)'s last w keys / values for `causal_window_step`:
  "keys", "values" [b, h, c, w, d]; "ordinals" int32 [b, h, c, w] (the held position's index in
  its cluster, -1 = empty); "counts" int32 [b, h, c] (positions seen)."""
  return {"keys": tf.zeros([batch, heads, num_clusters, window, depth], dtype),
          "values": tf.zeros([batch, heads, num_clusters, window, depth], dtype),
          "ordinals": -tf.ones([batch, heads, num_clusters, window], tf.int32),
          "counts": tf.zeros([batch, heads, num_clusters], tf.int32)}


def causal_window_step(q_hat, k_hat, v, centroids, cache, relative_keys=None,
                       relative_values=None, exclude_self=False, logit_scale=None):
  """`causal_window_attention` of one new position: q_hat, k_hat, v [b, h, 1, d], centroids
  [h, c, d], `cache` from `causal_window_cache` -> (output [b, h, 1, d], updated cache), in
  O(c d + w d)."""
  window = cache["keys"].shape[3]
  cluster = kmeans.assignments(
      routing.centroid_scores(q_hat, tf.stop_gradient(centroids)))[:, :, 0]  # [b, h]
  ordinal = tf.gather(cache["counts"], cluster, batch_dims=2)  # [b, h]
  grid_b, grid_h = tf.meshgrid(tf.range(tf.shape(cluster)[0]), tf.range(tf.shape(cluster)[1]),
                               indexing="ij")
  slot = tf.reshape(tf.stack([grid_b, grid_h, cluster, ordinal % window], axis=-1), [-1, 4])
  new = {"keys": tf.reshape(k_hat, [-1, k_hat.shape[-1]]), "ordinals": tf.reshape(ordinal, [-1]),
         "values": tf.reshape(v, [-1, v.shape[-1]])}
  cache = dict({name: tf.tensor_scatter_nd_update(cache[name], slot, x) for name, x in new.items()},
               counts=tf.tensor_scatter_nd_update(cache["counts"], slot[:, :3],
                                                  new["ordinals"] + 1))
  # [b, h, w, d] keys and values, [b, h, w] ordinals of the query's cluster
  keys, values, ordinals = (tf.gather(cache[name], cluster, batch_dims=2)
                            for name in ("keys", "values", "ordinals"))
  logits = tf.matmul(q_hat, keys, transpose_b=True)  # [b, h, 1, w]
  distance = (ordinals - ordinal[..., tf.newaxis])[:, :, tf.newaxis, :]  # [b, h, 1, w]
  if relative_keys is not None:
    rel_k = _rank_embeddings(relative_keys, distance)  # [b, h, 1, w, d]
    logits += tf.reduce_sum(q_hat[:, :, :, tf.newaxis, :] * tf.cast(rel_k, q_hat.dtype), -1)
  logits = common.scale_logits(logits, logit_scale)
  allowed = (ordinals >= 0)[:, :, tf.newaxis, :]
  if exclude_self:  # the slot just written holds the new position
    allowed = common.exclude_self(allowed, tf.equal(distance, 0))
  probs = common.masked_softmax(logits, allowed)
  out = tf.matmul(probs, values)
  if relative_values is not None:
    rel_v = _rank_embeddings(relative_values, distance)
    out += tf.reduce_sum(probs[..., tf.newaxis] * tf.cast(rel_v, probs.dtype), axis=-2)
  return out, cache
