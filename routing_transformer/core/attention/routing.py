"""Routing attention (Algorithm 1 of Roy et al., 2021): attention inside balanced k-means clusters.

For routing heads with q, k, v of shape [b, h, n, d] and centroids mu of shape [h, c, d]:
normalise q and k (LayerNorm without scale), score every position against every centroid, let each
centroid c take the `window` = w best positions (sorted back into sequence order), attend inside
each w x w cluster block (causal triangle in causal mode, unscaled logits), and scatter the cluster
outputs back, dividing by how many clusters each position is in (+ 1e-2).
Cost O(n c d + c w^2 d); with c = n / w and w ~ sqrt(n) this is O(n^1.5 d).

`routing_attention` is those steps in order: `normalised_inputs` (1), `route` (2, 3: assignments,
commitment loss, members), `cluster_attention` (4 to 7). The original release's causal rule with
separate keys, which only its checkpoints need, is `legacy.causal_key_routing_attention`.
With recompute=True (hparam `recompute_attention`) the normalisation, the commitment loss and
steps 4 to 7 keep only q, k, v for the backward pass and run again there (`recomputed_routing`).
"""
import tensorflow as tf

from routing_transformer.core import kmeans
from routing_transformer.core import recompute as recompute_lib
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


def normalised_inputs(q, k, v, centroids, window, share_qk, padding, relative_keys,
                      relative_values, name):
  """Validated routing inputs, queries and keys normalised (step 1).

  q_hat and k_hat are in `common.compute_dtype` of q's dtype (float32 for bfloat16 q: the
  centroid scores, the k-means statistics and losses and the cluster attention are computed
  in float32); v keeps its dtype.

  Returns:
    (q_hat, k_hat [b, h, n, d] (the same tensor with share_qk), v, stop_gradient(centroids)
    [h, c, d], padding bool [b, n] or None, relative_keys, relative_values).
  """
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
  """What padding does in routing: (key mask, member padding, k-means padding).

  Ours (as_original=False): padding positions are masked as keys, lose every top-k tie with a
  real position and carry no k-means statistics or commitment loss. The original release
  (as_original=True, hparam `routing_padding_as_original`) routes them like real positions: they
  compete for cluster slots and enter the k-means statistics and the commitment loss; its decoder
  gives self-attention no padding mask (causal: no key mask), its encoder masks padding keys.

  Args:
    padding: bool [b, n] or None.
    causal: decoder self-attention.
    as_original: the original release's treatment.
  Returns:
    (key padding, member padding, k-means padding), each bool [b, n] or None.
  """
  if not as_original:
    return padding, padding, padding
  return (None if causal else padding), None, None


def members(scores, window, padding=None, random_routing=False):
  """`top_window` of the scores, or of uniform draws for the Random Transformer baseline."""
  if random_routing:
    scores = tf.random.uniform(tf.shape(scores))
  return top_window(scores, window, padding)


def route(q_hat, k_hat, mu, window, share_qk, route_keys, member_padding=None, weights=None,
          random_routing=False, with_loss=True):
  """Assignments, commitment loss and balanced cluster members (steps 2 and 3).

  Args:
    q_hat, k_hat: [b, h, n, d] normalised queries and keys (one tensor with share_qk).
    mu: [h, c, d] centroids (stop-gradient).
    window: w, members per cluster.
    share_qk: the keys are the queries.
    route_keys: without share_qk, the keys of cluster c are the top-w positions of the keys' own
      scores (non-causal attention); otherwise they are the query members.
    member_padding: optional bool [b, n]; these positions lose every top-k tie.
    weights: [b, n] k-means weight of each position (commitment loss, statistics); default 1.
    random_routing: members drawn at random (the Random Transformer baseline).
    with_loss: compute the commitment loss here (`recomputed_routing` computes it itself).
  Returns:
    aux dict: "q_hat", "k_hat", "weights", "query_clusters", "key_clusters" (without
    share_qk), "commitment_loss" (with_loss), "query_indices", "key_indices" (see
    `routing_attention`).
  """
  if weights is None:
    weights = position_weights(None, tf.shape(q_hat)[0], q_hat.shape[2])
  query_scores = centroid_scores(q_hat, mu)
  aux = {"q_hat": q_hat, "k_hat": k_hat, "weights": weights,
         "query_clusters": kmeans.assignments(query_scores)}
  aux["query_indices"] = members(query_scores, window, member_padding, random_routing)
  aux["key_indices"] = aux["query_indices"]
  if not share_qk:  # keys commit to (and, when routed, are routed by) their own centroids
    key_scores = centroid_scores(k_hat, mu)
    aux["key_clusters"] = kmeans.assignments(key_scores)
    if route_keys:
      aux["key_indices"] = members(key_scores, window, member_padding, random_routing)
  if with_loss:
    aux["commitment_loss"] = commitment(q_hat, k_hat, mu, aux, share_qk)
  return aux


def commitment(q_hat, k_hat, mu, aux, share_qk):
  """The commitment loss of the queries (and, without share_qk, the mean with the keys') to
  their assigned centroids (aux "query_clusters", "key_clusters"; weights aux "weights")."""
  loss = kmeans.commitment_loss(q_hat, mu, aux["query_clusters"], aux["weights"])
  if not share_qk:
    loss = 0.5 * (loss + kmeans.commitment_loss(k_hat, mu, aux["key_clusters"], aux["weights"]))
  return loss


def cluster_attention(aux, v, window, causal, key_padding=None, relative_keys=None,
                      relative_values=None, exclude_self=False, logit_scale=None,
                      dropout_rate=0.0):
  """Attention inside every cluster and the scatter back (steps 4 to 7).

  Args:
    aux: from `route`; gains the diagnostics "member_count" and "self_weight".
    v: [b, h, n, d] values.
    window: w.
    causal: inside a cluster, key rank <= query rank (key position <= query position when the
      key members are the query members).
    key_padding: optional bool [b, n], masked as keys.
    relative_keys, relative_values: optional [2R + 1, d] tables (rank distances).
    exclude_self, logit_scale: the extensions of `routing_attention`.
    dropout_rate: attention dropout on the weights (`common.attention_dropout`).
  Returns:
    (output [b, h, n, d] of v's dtype, aux). Logits, softmax, values and the scatter are
    computed in q_hat's dtype (float32 when v is bfloat16).
  """
  q_hat, query_indices, key_indices = aux["q_hat"], aux["query_indices"], aux["key_indices"]
  n = q_hat.shape[2]
  q_c = gather_clusters(q_hat, query_indices)  # [b, h, c, w, d]
  shared = aux["k_hat"] is q_hat and key_indices is query_indices  # share_qk: one gather
  k_c = q_c if shared else gather_clusters(aux["k_hat"], key_indices)
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
  # The key members are the query members (causal, or share_qk): query rank r's own key is
  # rank r, so "is self" is the static identity [w, w] (members are distinct positions).
  members_shared = key_indices is query_indices
  if exclude_self:
    is_self = tf.eye(window, dtype=tf.bool) if members_shared else tf.equal(
        query_indices[..., :, tf.newaxis], key_indices[..., tf.newaxis, :])
    allowed = common.exclude_self(tf.broadcast_to(allowed, tf.shape(logits)), is_self)
  # A query whose allowed keys are all padding gets 0.
  probs = common.masked_softmax(logits, allowed, zero_empty=key_padding is not None)
  dropped = common.attention_dropout(probs, dropout_rate)
  out_c = tf.matmul(dropped, v_c)
  if relative_values is not None:
    out_c += common.relative_outputs(dropped, relative_values, 0, 0, causal=causal)

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
  aux["member_count"] = count[..., 0]
  aux["self_weight"] = (scatter_clusters(self_probs, query_indices, n) /
                        (count + COUNT_EPSILON))[..., 0]
  return tf.cast(summed / (count + COUNT_EPSILON), v.dtype), aux


def recomputed_routing(q, k, v, mu, aux, window, causal, share_qk, key_padding=None,
                       relative_keys=None, relative_values=None, exclude_self=False,
                       logit_scale=None):
  """The normalisation, the commitment loss and `cluster_attention` (without dropout) as one
  function of q, k, v, the tables and the logit scale that keeps only them for the backward pass
  and re-runs there once the output's gradient has arrived (`recompute.recompute_function`).

  The routing decisions (aux's clusters and members, from `route` with_loss=False) come from the
  forward's q_hat, k_hat, which then carry no gradient: neither they nor the normalisation's
  intermediates, the differences to the centroids or the cluster weights [b, h, c, w, w] are
  kept, and the commitment loss's gradient [b, h, n, d] is computed with the attention's. The
  same values and gradients as the kept computation; the diagnostics carry no gradient.

  Args:
    q, k, v: [b, h, n, d] as given to `routing_attention` (k unused with share_qk).
    mu: [h, c, d] stop-gradient centroids; aux: from `route`.
    Others as in `cluster_attention`.
  Returns:
    (output [b, h, n, d] of v's dtype, aux with "commitment_loss", "member_count",
    "self_weight").
  """
  wide = aux["q_hat"].dtype
  scale_is_tensor = isinstance(logit_scale, (tf.Tensor, tf.Variable))
  decisions = {key: aux[key] for key in ("query_indices", "key_indices", "query_clusters",
                                        "key_clusters", "weights") if key in aux}

  def attend(q, k, v, rel_k, rel_v, scale):
    q_hat = common.layer_norm_no_scale(q, dtype=wide)
    k_hat = q_hat if share_qk else common.layer_norm_no_scale(k, dtype=wide)
    inner = dict(decisions, q_hat=q_hat, k_hat=k_hat)
    loss = commitment(q_hat, k_hat, mu, inner, share_qk)
    out, inner = cluster_attention(inner, v, window, causal, key_padding, rel_k, rel_v,
                                   exclude_self, scale if scale_is_tensor else logit_scale)
    return out, loss, inner["member_count"], inner["self_weight"]

  out, aux["commitment_loss"], aux["member_count"], aux["self_weight"] = (
      recompute_lib.recompute_function(
          attend, q, None if share_qk else k, v, relative_keys, relative_values,
          tf.convert_to_tensor(logit_scale) if scale_is_tensor else None, differentiable=2))
  return out, aux


def attend_in_clusters(aux, q, k, v, mu, window, causal, share_qk, key_padding, relative_keys,
                       relative_values, exclude_self, logit_scale, dropout_rate, recompute):
  """Steps 4 to 7: `cluster_attention`, or with recompute `recomputed_routing` (aux from
  `route` with_loss=not recompute)."""
  if not recompute:
    return cluster_attention(aux, v, window, causal, key_padding, relative_keys,
                             relative_values, exclude_self, logit_scale, dropout_rate)
  recompute_lib.refuse_dropout(dropout_rate, "routing_attention")
  return recomputed_routing(q, k, v, mu, aux, window, causal, share_qk, key_padding,
                            relative_keys, relative_values, exclude_self, logit_scale)


def routing_attention(q, k, v, centroids, window, causal=True, share_qk=True, padding=None,
                      relative_keys=None, relative_values=None, random_routing=False,
                      exclude_self=False, logit_scale=None, dropout_rate=0.0,
                      padding_as_original=False, recompute=False):
  """Content-based sparse attention inside balanced clusters (Roy et al., TACL 2021,
  Algorithm 1).

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
    dropout_rate: attention dropout on the weights (hparam `attention_dropout` in TRAIN mode).
    padding_as_original: padding as the original release treats it (`padding_roles`).
    recompute: the normalisation, the commitment loss and the cluster attention keep only q,
      k, v (and the tables, the scale) for the backward pass and run again there
      (`recomputed_routing`; refuses dropout).
  With bfloat16 (float16) q, k, v (hparam `activation_dtype`), everything after the
  normalisation (scores, k-means terms, cluster logits, softmax, values) is computed in float32
  and only the output is cast back.
  Returns:
    (output [b, h, n, d] of v's dtype, aux) where aux holds
      "query_clusters": int32 [b, h, n] argmax centroid of each q_hat,
      "key_clusters": the same for k_hat (only when not share_qk),
      "commitment_loss": float32 scalar mean((x - stop_gradient(mu[argmax x]))^2) over real
        positions (queries and, when not share_qk, keys averaged),
      "q_hat", "k_hat": [b, h, n, d] normalised vectors; "weights": [b, n] 1 for real positions,
        0 for padding (with the clusters, the k-means statistics),
      "query_indices", "key_indices": int32 [b, h, c, w] cluster members,
      "member_count", "self_weight": [b, h, n] diagnostics (`routing_statistics`).
  """
  q_hat, k_hat, v, mu, pad, rel_k, rel_v = normalised_inputs(
      q, k, v, centroids, window, share_qk, padding, relative_keys, relative_values,
      "routing_attention")
  key_pad, member_pad, kmeans_pad = padding_roles(pad, causal, padding_as_original)
  aux = route(q_hat, k_hat, mu, window, share_qk, not causal, member_pad,
              position_weights(kmeans_pad, tf.shape(q_hat)[0], q_hat.shape[2]), random_routing,
              with_loss=not recompute)
  return attend_in_clusters(aux, q, k, v, mu, window, causal, share_qk, key_pad, rel_k, rel_v,
                            exclude_self, logit_scale, dropout_rate, recompute)


def routing_statistics(member_count, self_weight, weights):
  """What holds routing heads back, as two scalars (TRAIN summaries;
  research/notes/routing_learning.md).

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
