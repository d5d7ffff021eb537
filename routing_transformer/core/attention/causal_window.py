"""Strictly causal routing (`routing_mode="causal_window"`, an extension beyond the paper).

Position i joins its best centroid a_i (argmax mu . q_hat_i) and attends to the <= w most recent
positions j <= i of that cluster, itself included: strictly causal, so cached decoding is exact.
Positions are sorted by (cluster, position); query s then attends to sorted indices (s - w, s]
of its cluster: blocks of w with one block of look-back (2w keys), masked to the same cluster,
then un-sorted. Cost O(n w d). A query's slot in its block depends on later positions, so its
output must not depend on the slot: the softmax sums in key order (`common.masked_softmax`, ordered;
a vectorised sum moved earlier outputs by ~1e-6) over 2w keys (blocks of w / 2 are not exact).
Logits are unscaled q_hat . k_hat; relative positions use the distance in the cluster's order.
"""
import tensorflow as tf

from routing_transformer.core import kmeans
from routing_transformer.core.attention import common
from routing_transformer.core.attention import routing


def sort_by_cluster(clusters):
  """int32 [b, h, n] assignments -> [b, h, n] order sorting positions by (cluster, position):
  order[s] = the position at sorted index s."""
  n = clusters.shape[-1]
  keys = clusters * n + tf.range(n)  # distinct, so the sort is exact
  return tf.argsort(keys, axis=-1, stable=True)


def look_back_blocks(x, window, fill=0):
  """[b, h, nb * w, ...] -> [b, h, nb, 2w, ...]: each block with the block before it (the
  first block's look-back is `fill`)."""
  shape = x.shape.as_list()
  num_blocks = shape[2] // window
  blocks = tf.reshape(x, [-1, shape[1], num_blocks, window] + shape[3:])
  padded = tf.pad(blocks, [[0, 0], [0, 0], [1, 0]] + [[0, 0]] * (len(shape) - 2),
                  constant_values=fill)
  return tf.concat([common.slice_axis(padded, 2, 0, num_blocks), blocks], axis=3)


def causal_window_attention(q, k, v, centroids, window, share_qk=True, padding=None,
                            relative_keys=None, relative_values=None, exclude_self=False,
                            logit_scale=None, dropout_rate=0.0, padding_as_original=False):
  """Strictly causal routing attention: q, k, v [b, h, n, d] (k unused with share_qk),
  centroids [h, c, d], w = `window` -> (output [b, h, n, d] of v's dtype, aux).

  padding: optional [b, n], True at padding (masked as keys, out of the k-means statistics and
  the commitment loss; with `padding_as_original` as the original release, `routing.padding_roles`).
  relative_keys / relative_values: [2R + 1, d] tables by distance in the cluster's order (0: the
  query itself). exclude_self, logit_scale, dropout_rate, the float32 routing of bfloat16 inputs
  and aux ("query_clusters", "commitment_loss", "q_hat", "k_hat", "weights", "key_clusters"
  without share_qk, "member_count", "self_weight") as `routing.routing_attention`.
  """
  q_hat, k_hat, v, mu, pad, relative_keys, relative_values = routing.normalised_inputs(
      q, k, v, centroids, window, share_qk, padding, relative_keys, relative_values,
      "causal_window_attention")
  _, heads, n, depth = q_hat.shape.as_list()
  pad, _, kmeans_pad = routing.padding_roles(pad, True, padding_as_original)
  weights = routing.position_weights(kmeans_pad, tf.shape(q_hat)[0], n)
  clusters = kmeans.assignments(routing.centroid_scores(q_hat, mu))  # [b, h, n]
  loss = kmeans.commitment_loss(q_hat, mu, clusters, weights)
  aux = {"q_hat": q_hat, "k_hat": k_hat, "weights": weights, "query_clusters": clusters}
  if not share_qk:  # keys live at their position's cluster; they still commit to their own
    aux["key_clusters"] = kmeans.assignments(routing.centroid_scores(k_hat, mu))
    loss = 0.5 * (loss + kmeans.commitment_loss(k_hat, mu, aux["key_clusters"], weights))
  aux["commitment_loss"] = loss

  order = sort_by_cluster(clusters)  # [b, h, n]
  padded_n = -(-n // window) * window
  extra = padded_n - n

  def sorted_blocks(x, fill=0):
    x = tf.gather(x, order, axis=2, batch_dims=2)
    if extra:
      x = tf.pad(x, [[0, 0], [0, 0], [0, extra]] + [[0, 0]] * (x.shape.rank - 3),
                 constant_values=fill)
    return x

  q_s = sorted_blocks(q_hat)  # [b, h, N, d]
  k_s = look_back_blocks(sorted_blocks(k_hat), window)  # [b, h, nb, 2w, d]
  v_s = look_back_blocks(sorted_blocks(tf.cast(v, q_hat.dtype)), window)
  c_s = sorted_blocks(clusters, fill=-1)  # [b, h, N]; -1 marks the filler slots
  c_k = look_back_blocks(c_s, window, fill=-2)  # [b, h, nb, 2w]; -2: before the sequence
  num_blocks = padded_n // window
  q_b = tf.reshape(q_s, [-1, heads, num_blocks, window, depth])
  c_q = tf.reshape(c_s, [-1, heads, num_blocks, window])

  logits = tf.matmul(q_b, k_s, adjoint_b=True)  # [b, h, nb, w, 2w] (as `local.memory_product`)
  query_index = tf.range(window)[:, tf.newaxis] + window  # sorted offset within the 2w keys
  key_index = tf.range(2 * window)[tf.newaxis, :]
  distance = key_index - query_index  # [w, 2w], in (-2w, w)
  allowed = tf.logical_and(distance <= 0, distance > -window)[tf.newaxis, tf.newaxis, tf.newaxis]
  allowed = tf.logical_and(allowed, tf.equal(c_q[..., tf.newaxis], c_k[:, :, :, tf.newaxis, :]))
  if pad is not None:
    p_k = look_back_blocks(sorted_blocks(tf.cast(pad, tf.int32)[:, tf.newaxis, :] *
                                         tf.ones_like(clusters), fill=1), window, fill=1)
    allowed = tf.logical_and(allowed, tf.equal(p_k, 0)[:, :, :, tf.newaxis, :])
  if relative_keys is not None:
    logits += common.relative_logits(q_b, relative_keys, window, 0, 2 * window, causal=True)
  logits = common.scale_logits(logits, logit_scale)
  if exclude_self:  # the query's own slot is at sorted distance 0
    allowed = common.exclude_self(allowed, tf.equal(distance, 0))
  probs = common.masked_softmax(logits, allowed, ordered=True)  # the same in every slot of a block
  dropped = common.attention_dropout(probs, dropout_rate)
  if pad is not None:  # a query whose allowed keys are all padding gets 0
    dropped = common.zero_empty_rows(dropped, allowed)
  out = tf.matmul(dropped, v_s)
  if relative_values is not None:
    out += common.relative_outputs(dropped, relative_values, window, 0, causal=True)
  out = common.slice_axis(tf.reshape(out, [-1, heads, padded_n, v.shape[-1]]), 2, 0, n)
  unsort = tf.argsort(order, axis=-1)
  # diagnostics: every query is in its cluster; its weight on itself (key slot w + its own)
  self_probs = tf.linalg.diag_part(probs, k=window)  # [b, h, nb, w]
  self_probs = tf.reshape(self_probs, [-1, heads, padded_n])[:, :, :n]
  aux["member_count"] = tf.ones_like(self_probs)
  aux["self_weight"] = tf.gather(self_probs, unsort, axis=2, batch_dims=2)
  return tf.cast(tf.gather(out, unsort, axis=2, batch_dims=2), v.dtype), aux
