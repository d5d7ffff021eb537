"""One-position attention over fixed-size caches, for incremental (cached) decoding.

At decode step t the new query attends to cached keys/values of positions 0..t (the caches have a
static length N; slots after t are ignored). Shapes: b = batch, h = heads, N = cache length,
d = depth, c = clusters, w = window.

Decode-time routing rule (the cached decoder's, causal as generation needs): at step t, cluster
membership is the top-w of the centroid scores over the prefix 0..t only (positions after t do
not compete). The query at t gets the average of its in-cluster attention over the clusters whose
top-w contains t (0 if none).
The tests check the cached decoder against the same rule computed for every position of a full
sequence (`prefix_routing_attention` in tests/oracles.py).
"""
import tensorflow as tf

from routing_transformer.core import kmeans
from routing_transformer.core.attention import common
from routing_transformer.core.attention import routing


def write_cache(cache, value, position, axis=2):
  """Returns `cache` with the slice at `position` along `axis` replaced by `value`.

  Args:
    cache: [..., N, ...] with N at `axis` (e.g. keys [b, h, N, d], scores [b, h, c, N]).
    value: the cache's shape with 1 at `axis`.
    position: int32 scalar.
    axis: the position axis (static).
  Returns:
    the updated cache (a scatter of only the new slice, no full-cache transposes).
  """
  axis = axis % cache.shape.rank
  lead = tf.shape(cache)[:axis]
  grid = tf.meshgrid(*[tf.range(lead[i]) for i in range(axis)], indexing="ij")
  indices = tf.stack([tf.reshape(g, [-1]) for g in grid] +
                     [tf.fill(tf.reshape(tf.reduce_prod(lead), [1]), position)], axis=1)
  updates = tf.reshape(value, tf.concat([[-1], tf.shape(value)[axis + 1:]], axis=0))
  return tf.tensor_scatter_nd_update(cache, indices, updates)


def local_attention_step(q, k_cache, v_cache, position, block_length, flange, causal=True,
                         relative_keys=None, relative_values=None, padding=None, scale=None):
  """The query at `position` attends to its local window (as `local_attention` would).

  Args:
    q: [b, h, 1, d] query of the new position.
    k_cache, v_cache: [b, h, N, d] keys/values (self-attention: written up to `position`).
    position: int32 scalar t, the query's position.
    block_length, flange: the layout of `local_attention` (query_shape, memory_flange).
    causal: keys after t are excluded and there is no look-ahead.
    relative_keys, relative_values: optional [2R + 1, d] Shaw tables.
    padding: optional bool [b, N], True at padding keys.
    scale: logit scale applied to q; default d ** -0.5.
  Returns:
    [b, h, 1, d].
  """
  length = k_cache.shape[2]
  depth = q.shape[-1]
  scale = depth ** -0.5 if scale is None else scale
  after = 0 if causal else flange
  start = (position // block_length) * block_length - flange
  keys = start + tf.range(flange + block_length + after)  # [W] key positions
  allowed = tf.logical_and(keys >= 0, keys < length)
  if causal:
    allowed = tf.logical_and(allowed, keys <= position)
  safe = tf.clip_by_value(keys, 0, length - 1)
  k = tf.gather(k_cache, safe, axis=2)  # [b, h, W, d]
  v = tf.gather(v_cache, safe, axis=2)
  q = q * scale
  logits = tf.matmul(q, k, transpose_b=True)  # [b, h, 1, W]
  query = tf.reshape(position, [1])
  if relative_keys is not None:
    rel_k = common.relative_embeddings(relative_keys, query, keys)[0]  # [W, d]
    logits += tf.einsum("bhqd,kd->bhqk", q, tf.cast(rel_k, logits.dtype))
  allowed = allowed[tf.newaxis, tf.newaxis, tf.newaxis, :]
  if padding is not None:
    pad = tf.gather(padding, safe, axis=1)  # [b, W]
    allowed = tf.logical_and(allowed, tf.logical_not(pad)[:, tf.newaxis, tf.newaxis, :])
  probs = common.masked_softmax(logits, allowed)
  out = tf.matmul(probs, v)
  if relative_values is not None:
    rel_v = common.relative_embeddings(relative_values, query, keys)[0]
    out += tf.einsum("bhqk,kd->bhqd", probs, tf.cast(rel_v, probs.dtype))
  if padding is not None:
    out = common.zero_empty_rows(out, allowed)
  return out


def routing_attention_step(q_hat, k_hat_cache, v_cache, score_cache, position, window,
                           relative_keys=None, relative_values=None, exclude_self=False,
                           logit_scale=None):
  """Causal routing attention of the query at `position` under the decode-time rule.

  Args:
    q_hat: [b, h, 1, d] normalised query (LayerNorm without scale) of the new position.
    k_hat_cache: [b, h, N, d] normalised keys (q_hat itself with share_qk), written up to t.
    v_cache: [b, h, N, d] values, written up to t.
    score_cache: [b, h, c, N] membership scores mu_c . q_hat_j, written up to t.
    position: int32 scalar t.
    window: w members per cluster (w <= N).
    relative_keys, relative_values: optional [2R + 1, d] tables (rank distance in the cluster).
    exclude_self, logit_scale: extensions, as in `routing.routing_attention`.
  Returns:
    [b, h, 1, d].
  """
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
  """Relative embeddings for integer rank distances of any shape: [...] -> [..., d]."""
  radius = (table.shape[0] - 1) // 2
  return tf.gather(table, tf.clip_by_value(distance, -radius, radius) + radius)


def local_ring_step(q, k_ring, v_ring, ring_positions, position, block_length, flange,
                    relative_keys=None, relative_values=None, scale=None):
  """Causal local attention of the query at `position` over a ring buffer of recent keys.

  The ring has R >= flange + block_length slots; slot p % R holds position p (written by the
  caller before this call), so the ring always holds the block and flange of the query and the
  per-token cost does not grow with the prefix.

  Args:
    q: [b, h, 1, d].
    k_ring, v_ring: [b, h, R, d].
    ring_positions: int32 [R], the position held by each slot (-1 = empty).
    position: int32 scalar t.
    block_length, flange: as in `local_attention` (query_shape, memory_flange).
    relative_keys, relative_values: optional [2R' + 1, d] Shaw tables.
    scale: logit scale applied to q; default d ** -0.5.
  Returns:
    [b, h, 1, d].
  """
  scale = q.shape[-1] ** -0.5 if scale is None else scale
  start = (position // block_length) * block_length - flange
  allowed = (ring_positions >= tf.maximum(start, 0)) & (ring_positions <= position)
  q = q * scale
  logits = tf.matmul(q, k_ring, transpose_b=True)  # [b, h, 1, R]
  query = tf.reshape(position, [1])
  if relative_keys is not None:
    rel_k = common.relative_embeddings(relative_keys, query, ring_positions)[0]
    logits += tf.einsum("bhqd,kd->bhqk", q, tf.cast(rel_k, logits.dtype))
  probs = common.masked_softmax(logits, allowed)
  out = tf.matmul(probs, v_ring)
  if relative_values is not None:
    rel_v = common.relative_embeddings(relative_values, query, ring_positions)[0]
    out += tf.einsum("bhqk,kd->bhqd", probs, tf.cast(rel_v, probs.dtype))
  return out


def causal_window_cache(batch, heads, num_clusters, window, depth, dtype=tf.float32):
  """Empty per-(head, cluster) caches of the last `window` keys/values for causal_window_step.

  Returns:
    dict: "keys", "values" [b, h, c, w, d]; "ordinals" int32 [b, h, c, w] (index of the held
    position within its cluster, -1 = empty); "counts" int32 [b, h, c] (positions seen).
  """
  return {"keys": tf.zeros([batch, heads, num_clusters, window, depth], dtype),
          "values": tf.zeros([batch, heads, num_clusters, window, depth], dtype),
          "ordinals": -tf.ones([batch, heads, num_clusters, window], tf.int32),
          "counts": tf.zeros([batch, heads, num_clusters], tf.int32)}


def causal_window_step(q_hat, k_hat, v, centroids, cache, relative_keys=None,
                       relative_values=None, exclude_self=False, logit_scale=None):
  """Strictly causal routing of one new position (exactly `causal_window_attention`'s output).

  Args:
    q_hat, k_hat: [b, h, 1, d] normalised query and key of the new position.
    v: [b, h, 1, d] its value.
    centroids: [h, c, d].
    cache: dict from `causal_window_cache` (or a previous step).
    relative_keys, relative_values: optional [2R + 1, d] tables (distance in cluster order).
    exclude_self, logit_scale: extensions, as in `routing.routing_attention`.
  Returns:
    (output [b, h, 1, d], updated cache). Cost O(c d + w d), independent of the prefix.
  """
  window = cache["keys"].shape[3]
  cluster = kmeans.assignments(routing.centroid_scores(q_hat, tf.stop_gradient(centroids)))
  cluster = cluster[:, :, 0]  # [b, h]
  ordinal = tf.gather(cache["counts"], cluster, batch_dims=2)  # [b, h]
  batch, heads = tf.shape(cluster)[0], tf.shape(cluster)[1]
  grid_b, grid_h = tf.meshgrid(tf.range(batch), tf.range(heads), indexing="ij")
  slot = tf.stack([grid_b, grid_h, cluster, ordinal % window], axis=-1)  # [b, h, 4]
  slot = tf.reshape(slot, [-1, 4])
  cache = {
      "keys": tf.tensor_scatter_nd_update(cache["keys"], slot,
                                          tf.reshape(k_hat, [-1, k_hat.shape[-1]])),
      "values": tf.tensor_scatter_nd_update(cache["values"], slot,
                                            tf.reshape(v, [-1, v.shape[-1]])),
      "ordinals": tf.tensor_scatter_nd_update(cache["ordinals"], slot,
                                              tf.reshape(ordinal, [-1])),
      "counts": tf.tensor_scatter_nd_update(
          cache["counts"], slot[:, :3], tf.reshape(ordinal, [-1]) + 1),
  }
  keys = tf.gather(cache["keys"], cluster, batch_dims=2)  # [b, h, w, d]
  values = tf.gather(cache["values"], cluster, batch_dims=2)
  ordinals = tf.gather(cache["ordinals"], cluster, batch_dims=2)  # [b, h, w]
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
