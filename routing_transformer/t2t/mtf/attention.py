"""Local and routing attention written with Mesh-TensorFlow named dimensions (Roy et al.,
TACL 2021, Algorithm 1).

Tensors carry named dimensions instead of axes: q, k, v are [batch, heads, length, d_head]
(`heads` is whatever head dimension the caller uses, e.g. "heads" or "routing_heads"), so a
layout may split batch and heads over the mesh. The length and d_head dimensions must stay
unsplit: attention mixes positions, and the per-shard pieces below (the balanced top-k, cluster
gathers and scatters) run `mtf.slicewise` over whole sequences. They reuse the TF
implementation's functions, so both compute the same thing.
"""
import mesh_tensorflow as mtf
import numpy as np
import tensorflow.compat.v1 as tf

from routing_transformer.core.attention import routing as tf_routing

MASK = -1e9  # additive logit of a masked entry (exp underflows to exactly 0 in float32)
LN_EPSILON = 1e-6


def get_variable(mesh, name, shape, **kwargs):
  """`mtf.get_variable`, read once per slice and step: use this, never the raw variable.

  Mesh-TF lowers a float32 variable to the tf variable of each slice itself (`tf.cast` to the
  same dtype returns the variable), so every TF op that uses it does its own read. The backward
  einsum that computes dx = dy W (and the commitment loss's centroid lookup) is not an ancestor of
  W's (or the centroids') update, so such a read could run before or after the update of the same
  step, as the thread scheduling happened to go: gradients of the layers below were sometimes
  computed with updated weights. Here each slice is read once, by a `tf.identity` that every
  consumer shares: the forward pass reads it, every gradient and update depends on the forward
  pass, so the read runs before them (tests/test_mtf_model.py checks that the lowered train step
  reads no variable unordered with its update).
  """
  var = mtf.get_variable(mesh, name, shape, **kwargs)
  return mtf.slicewise(tf.identity, [var], splittable_dims=var.shape.dims,
                       grad_function=lambda op, dy: [dy], name="read")


def layer_norm_no_scale(x, dim, epsilon=LN_EPSILON):
  """LayerNorm without scale and bias over `dim`: mean 0, variance 1 (Algorithm 1, step 1)."""
  reduced = x.shape - dim
  mean = mtf.reduce_mean(x, output_shape=reduced)
  centred = x - mean
  variance = mtf.reduce_mean(mtf.square(centred), output_shape=reduced)
  return centred * mtf.rsqrt(variance + epsilon)


def ordered(x, dims):
  """x transposed to exactly `dims` (a list of Dimensions), as slicewise TF code expects."""
  shape = mtf.Shape(dims)
  return x if x.shape == shape else mtf.transpose(x, shape)


def relative_table_gather(table, offsets, rows_dim, cols_dim, rel_dim):
  """Shaw et al. relative embeddings for a static pattern.

  Args:
    table: [rel, d] with rel = 2R + 1 rows (row R is distance 0); replicated.
    offsets: (query_offsets, key_offsets) int lists; distance = key - query clipped to [-R, R].
    rows_dim, cols_dim: Dimensions of the query and key offsets.
    rel_dim: the table's row Dimension.
  Returns:
    [rows_dim, cols_dim, d] embeddings.
  """
  query_offsets, key_offsets = offsets
  radius = (rel_dim.size - 1) // 2
  d_dim = [d for d in table.shape.dims if d != rel_dim][0]
  table = ordered(table, [rel_dim, d_dim])
  distance = np.asarray(key_offsets)[np.newaxis, :] - np.asarray(query_offsets)[:, np.newaxis]
  rows = np.clip(distance, -radius, radius) + radius  # [q, m] table rows

  def grad(op, dy):  # the transpose of the gather: sum dy into the table rows
    dy = ordered(dy, [rows_dim, cols_dim, d_dim])
    return [mtf.slicewise(
        lambda g: tf.math.unsorted_segment_sum(tf.reshape(g, [-1, g.shape[-1]]),
                                               rows.reshape([-1]), rel_dim.size),
        [dy], output_shape=[rel_dim, d_dim], splittable_dims=[d_dim],
        name="relative_embeddings_grad")]

  return mtf.slicewise(lambda t: tf.gather(t, rows), [table],
                       output_shape=[rows_dim, cols_dim, d_dim], splittable_dims=[d_dim],
                       grad_function=grad, name="relative_embeddings")


def local_attention(q, k, v, block_length, flange, length_dim, d_dim, relative=None,
                    dropout=None):
  """Causal blocked local attention (the paper's local heads), logits q . k without scaling.

  Each query block of `block_length` attends to itself (causal triangle) and to the
  `flange / block_length` previous blocks. Scale q beforehand (the model uses d_head ** -0.5).

  Args:
    q, k, v: [batch, heads, length, d_head] (any order; named dims).
    block_length: query block b (hparam query_shape).
    flange: memory flange m, a multiple of b (hparam memory_flange).
    length_dim, d_dim: the length and d_head Dimensions.
    relative: optional (keys_table, values_table, rel_dim): [rel, d_head] Shaw tables.
    dropout: optional function of the attention weights (attention dropout: after the softmax,
      before the products with the values and the relative values, as the TF model).
  Returns:
    [batch, heads, length, d_head] (the shape of q).
  """
  n = length_dim.size
  before = flange // block_length
  blocks_dim = mtf.Dimension("blocks", n // block_length)
  block_dim = mtf.Dimension("block", block_length)
  memory_dim = mtf.Dimension("memory", (before + 1) * block_length)

  def blocked(x):
    return mtf.replace_dimensions(x, length_dim, [blocks_dim, block_dim])

  def memory(x):  # [.., blocks, memory, d]: the `before` previous blocks, then the block
    xb = blocked(x)
    parts = [mtf.shift(xb, s, blocks_dim, wrap=False) for s in range(before, 0, -1)] + [xb]
    parts = [mtf.rename_dimension(p, "block", "memory_part") for p in parts]
    return mtf.rename_dimension(mtf.concat(parts, "memory_part"), "memory_part", "memory")

  q_b, k_m, v_m = blocked(q), memory(k), memory(v)
  batch_heads = [d for d in q.shape.dims if d not in (length_dim, d_dim)]
  logits_shape = batch_heads + [blocks_dim, block_dim, memory_dim]
  logits = mtf.einsum([q_b, k_m], output_shape=logits_shape)
  offsets = (list(range(block_length)), [j - flange for j in range(memory_dim.size)])
  if relative is not None:
    rel_k = relative_table_gather(relative[0], offsets, block_dim, memory_dim, relative[2])
    logits += mtf.einsum([q_b, rel_k], output_shape=logits_shape)
  mesh = q.mesh
  block_start = mtf.range(mesh, blocks_dim, tf.int32) * block_length
  key_offset = mtf.range(mesh, memory_dim, tf.int32) - flange
  query_offset = mtf.range(mesh, block_dim, tf.int32)
  allowed = mtf.logical_and(mtf.greater_equal(block_start + key_offset, 0),
                            mtf.less_equal(key_offset, query_offset))
  logits += mtf.cast(mtf.logical_not(allowed), logits.dtype) * MASK
  probs = mtf.softmax(logits, memory_dim)
  if dropout is not None:
    probs = dropout(probs)
  out_shape = batch_heads + [blocks_dim, block_dim, d_dim]
  out = mtf.einsum([probs, v_m], output_shape=out_shape)
  if relative is not None:
    rel_v = relative_table_gather(relative[1], offsets, block_dim, memory_dim, relative[2])
    out += mtf.einsum([probs, rel_v], output_shape=out_shape)
  return mtf.replace_dimensions(out, [blocks_dim, block_dim], length_dim)


# Cluster gathers and scatters: per-shard TF (tf.gather / unsorted_segment_sum), each the other's
# gradient. x is [batch, heads, length, d], indices [batch, heads, clusters, window].


def gather_clusters(x, indices, length_dim):
  """x [b, h, n, d] at indices [b, h, c, w] -> [b, h, c, w, d] (mtf; gradient: scatter)."""
  b, h, c, w = indices.shape.dims
  d = [dim for dim in x.shape.dims if dim not in (b, h, length_dim)][0]
  x = ordered(x, [b, h, length_dim, d])
  return mtf.slicewise(
      tf_routing.gather_clusters, [x, indices], output_shape=[b, h, c, w, d],
      splittable_dims=[b, h, d], name="gather_clusters",
      grad_function=lambda op, dy: [scatter_clusters(dy, op.inputs[1], length_dim), None])


def scatter_clusters(values, indices, length_dim):
  """Sums values [b, h, c, w, d] back onto positions: [b, h, n, d] (mtf; gradient: gather)."""
  b, h, c, w = indices.shape.dims
  d = [dim for dim in values.shape.dims if dim not in (b, h, c, w)][0]
  values = ordered(values, [b, h, c, w, d])
  return mtf.slicewise(
      lambda val, idx: tf_routing.scatter_clusters(val, idx, length_dim.size),
      [values, indices], output_shape=[b, h, length_dim, d], splittable_dims=[b, h, d],
      name="scatter_clusters",
      grad_function=lambda op, dy: [gather_clusters(dy, op.inputs[1], length_dim), None])


def cluster_members(scores, weights, window_dim, length_dim):
  """Balanced clusters: the `window` best positions of each centroid, in sequence order.

  Args:
    scores: [batch, heads, clusters, length] centroid scores.
    weights: [batch, length] float, 0 at padding (padding loses every tie).
    window_dim: Dimension w.
  Returns:
    int32 [batch, heads, clusters, window] (no gradient).
  """
  b, h, c = [d for d in scores.shape.dims if d != length_dim]
  scores = ordered(scores, [b, h, c, length_dim])
  weights = ordered(weights, [b, length_dim])
  return mtf.slicewise(
      lambda s, wt: tf_routing.top_window(s, window_dim.size, padding=wt < 0.5),
      [scores, weights], output_shape=[b, h, c, window_dim], output_dtype=tf.int32,
      splittable_dims=[b, h, c], grad_function=0, name="cluster_members")


def member_weights(weights, indices):
  """weights [b, n] at the cluster members indices [b, h, c, w] -> [b, h, c, w] (no gradient)."""
  b, h, c, w = indices.shape.dims
  length_dim = [d for d in weights.shape.dims if d != b][0]
  weights = ordered(weights, [b, length_dim])

  def fn(wt, idx):
    flat = tf.reshape(idx, [tf.shape(idx)[0], -1])
    return tf.reshape(tf.gather(wt, flat, batch_dims=1), tf.shape(idx))

  return mtf.slicewise(fn, [weights, indices], output_shape=indices.shape,
                       output_dtype=weights.dtype, splittable_dims=[b, h, c],
                       grad_function=0, name="member_weights")


def member_counts(indices, length_dim):
  """How many clusters hold each position: [b, h, c, w] -> float [b, h, n] (no gradient)."""
  b, h, c, w = indices.shape.dims

  def fn(idx):
    ones = tf.ones_like(idx, dtype=tf.float32)[..., tf.newaxis]
    return tf_routing.scatter_clusters(ones, idx, length_dim.size)[..., 0]

  return mtf.slicewise(fn, [indices], output_shape=[b, h, length_dim], output_dtype=tf.float32,
                       splittable_dims=[b, h], grad_function=0, name="member_counts")


def centroid_scores(x_hat, centroids, dims):
  """mu_c . x_i: [b, h, n, d], [h, c, d] -> [b, h, c, n]."""
  return mtf.einsum([centroids, x_hat], output_shape=[dims[key] for key in (
      "batch", "heads", "clusters", "length")])


def commitment_loss(x_hat, centroids, clusters, weights, clusters_dim, d_dim):
  """mean((x - stop_gradient(mu[assigned]))^2) over real positions, heads and depth (scalar)."""
  mu = mtf.einsum([mtf.one_hot(clusters, clusters_dim, dtype=x_hat.dtype),
                   mtf.stop_gradient(centroids)], output_shape=x_hat.shape)
  squared = mtf.reduce_sum(mtf.square(x_hat - mu), reduced_dim=d_dim)  # [b, h, n]
  heads = [d for d in squared.shape.dims if d not in weights.shape.dims]
  total = mtf.reduce_sum(weights) * float(mtf.Shape(heads).size * d_dim.size)
  return mtf.reduce_sum(squared * weights) / mtf.maximum(total, 1.0)


def routing_attention(q, k, v, centroids, window, dims, share_qk=True, weights=None,
                      relative=None, dropout=None):
  """Causal routing attention inside balanced clusters (Roy et al., TACL 2021,
  Algorithm 1), named dimensions.

  Args:
    q, k, v: [batch, heads, length, d_head] routing-head queries, keys, values.
    centroids: [heads, clusters, d_head] k-means centroids (no gradient flows to them here).
    window: w, members per cluster.
    dims: dict with Dimensions "batch", "heads", "length", "d_head", "clusters".
    share_qk: keys are the normalised queries (k ignored).
    weights: optional float [batch, length], 1 for real positions and 0 for padding (padding is
      masked as keys, never preferred as members, excluded from the commitment loss).
    relative: optional (keys_table, values_table, rel_dim) indexed by rank distance in a cluster.
    dropout: optional function of the attention weights (as in `local_attention`).
  Returns:
    (output [batch, heads, length, d_head], aux) with aux "q_hat", "k_hat", "query_clusters",
    "key_clusters" (only without share_qk), "commitment_loss" (scalar), "weights",
    "query_indices".
  """
  b, h, n, d, c = (dims[key] for key in ("batch", "heads", "length", "d_head", "clusters"))
  window_dim = mtf.Dimension("window", window)
  window_k = mtf.Dimension("window_k", window)
  q, k, v = (ordered(x, [b, h, n, d]) for x in (q, k, v))
  if weights is None:
    weights = mtf.ones(q.mesh, mtf.Shape([b, n]))
  q_hat = layer_norm_no_scale(q, d)
  k_hat = q_hat if share_qk else layer_norm_no_scale(k, d)
  mu = mtf.stop_gradient(centroids)
  scores = centroid_scores(q_hat, mu, dims)  # [b, h, c, n]
  query_clusters = mtf.argmax(scores, c)  # [b, h, n]
  indices = cluster_members(scores, weights, window_dim, n)
  loss = commitment_loss(q_hat, mu, query_clusters, weights, c, d)
  aux = {"q_hat": q_hat, "k_hat": k_hat, "query_clusters": query_clusters,
         "weights": weights, "query_indices": indices}
  if not share_qk:  # keys commit to their own centroids; causal: key members = query members
    aux["key_clusters"] = mtf.argmax(centroid_scores(k_hat, mu, dims), c)
    loss = 0.5 * (loss + commitment_loss(k_hat, mu, aux["key_clusters"], weights, c, d))
  aux["commitment_loss"] = loss

  q_c = gather_clusters(q_hat, indices, n)  # [b, h, c, w, d]
  k_c = q_c if share_qk else gather_clusters(k_hat, indices, n)
  v_c = gather_clusters(v, indices, n)
  k_c = mtf.rename_dimension(k_c, "window", "window_k")
  v_c = mtf.rename_dimension(v_c, "window", "window_k")
  logits_shape = [b, h, c, window_dim, window_k]
  logits = mtf.einsum([q_c, k_c], output_shape=logits_shape)
  ranks = list(range(window))
  if relative is not None:
    rel_k = relative_table_gather(relative[0], (ranks, ranks), window_dim, window_k, relative[2])
    logits += mtf.einsum([q_c, rel_k], output_shape=logits_shape)
  # Members are sorted, so "key position <= query position" is the lower triangle.
  allowed = mtf.cast(mtf.greater_equal(mtf.range(q.mesh, window_dim, tf.int32),
                                       mtf.range(q.mesh, window_k, tf.int32)), tf.float32)
  key_real = mtf.rename_dimension(member_weights(weights, indices), "window", "window_k")
  allowed = allowed * key_real  # [b, h, c, w, w_k]
  logits += (1.0 - allowed) * MASK
  probs = mtf.softmax(logits, window_k)
  if dropout is not None:
    probs = dropout(probs)
  out_shape = [b, h, c, window_dim, d]
  out_c = mtf.einsum([probs, v_c], output_shape=out_shape)
  if relative is not None:
    rel_v = relative_table_gather(relative[1], (ranks, ranks), window_dim, window_k, relative[2])
    out_c += mtf.einsum([probs, rel_v], output_shape=out_shape)
  out_c *= mtf.reduce_max(allowed, reduced_dim=window_k)  # a query with no real key gets 0
  summed = scatter_clusters(out_c, indices, n)
  count = member_counts(indices, n)
  return summed / (count + tf_routing.COUNT_EPSILON), aux
