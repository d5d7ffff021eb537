"""Small pieces shared by the attention kinds: normalisation, masking, argument checks.

Shapes use b = batch, h = heads, n = length, d = depth per head.
"""
import tensorflow as tf

from routing_transformer.core import norm
from routing_transformer.core import rebuild
from routing_transformer.core import slicing


# LayerNorm without scale, routing's normalisation; defined in core/norm.py, which the k-means
# imports without importing this package.
layer_norm_no_scale = norm.layer_norm_no_scale
compute_dtype = norm.compute_dtype
slice_axis = slicing.slice_axis  # x[..., start:start + size, ...] along an axis, as tf.slice


def mask_value(dtype):
  """A large negative logit for masked entries that stays finite in `dtype`."""
  dtype = tf.as_dtype(dtype)
  return tf.constant(-0.7 * dtype.max, dtype=dtype)


def masked_softmax(logits, allowed, zero_empty=False):
  """Softmax over the last axis restricted to `allowed` (masked entries get probability 0).

  A row with nothing allowed comes out uniform, or 0 with `zero_empty` (what callers that can
  produce such rows, only with padding, ask for: `zero_empty_rows` of the probabilities). The
  backward pass keeps only the probabilities and the mask and builds one [..., m] select
  (`kept_output_softmax`).

  Low-precision logits (bfloat16, float16: hparam `activation_dtype`) are masked and normalised
  in float32 (`float32_softmax`); the probabilities come back in the logits' dtype.

  Args:
    logits: [..., m] float tensor.
    allowed: bool tensor broadcastable to logits.
    zero_empty: Python bool.
  Returns:
    [..., m] probabilities of the logits' dtype.
  """
  return kept_output_softmax(logits, allowed, zero_empty)


def float32_softmax(logits, allowed):
  """`masked_softmax` of low-precision logits computed in float32, the probabilities rounded
  back to the logits' dtype (`kept_output_softmax`)."""
  return kept_output_softmax(logits, allowed)


def _softmax_gradient(p, dp, allowed=None):
  """TF's softmax gradient p (dp - sum(dp p)) of probabilities p [..., m] under dp, 0 where not
  `allowed` when given (as through a masking `where`, also in a row with nothing allowed, which
  the softmax makes uniform)."""
  dx = p * (dp - tf.reduce_sum(dp * p, axis=-1, keepdims=True))
  return dx if allowed is None else tf.where(allowed, dx, tf.zeros([], dx.dtype))


def kept_output_softmax(logits, allowed, zero_empty=False):
  """`masked_softmax` whose backward pass keeps only its output p (in the logits' dtype) and
  the mask, and computes dlogits = p (dp - sum(dp p)) (TF's softmax gradient), 0 where masked
  (as through the masking `where`; p is 0 there except in a row with nothing allowed), in
  float32 for low-precision logits (no float32 copy kept). The masking `where`'s own gradient is
  not built: under T2T's gated gradients (`gate_gradients=GATE_OP`) it also computed the mask
  value's [..., m] gradient. With `zero_empty` the rows with nothing allowed
  are 0 in p (`zero_empty_rows`): their gradient is 0, as through the zeroing's product, and
  neither the uniform rows' probabilities nor a second [..., m] tensor is kept.

  Args:
    logits: [..., m] float tensor.
    allowed: bool tensor broadcastable to logits.
    zero_empty: Python bool.
  Returns:
    [..., m] probabilities of the logits' dtype.
  """
  dtype = logits.dtype.base_dtype
  wide = tf.float32 if dtype in norm.LOW_PRECISION else dtype

  @tf.custom_gradient
  def softmax(x):
    probs = tf.nn.softmax(tf.where(allowed, tf.cast(x, wide), mask_value(wide)))
    if zero_empty:
      probs = zero_empty_rows(probs, allowed)
    probs = tf.cast(probs, dtype)

    def grad(dprobs):
      # a low-precision output's widened copy: made in the backward pass, not kept from before
      p, dp = tf.cast(rebuild.after(dprobs, probs)[0], wide), tf.cast(dprobs, wide)
      # with zero_empty p is 0 wherever masked; else a uniform row's masked entries need the mask
      return tf.cast(_softmax_gradient(p, dp, None if zero_empty else allowed), dtype)

    return probs, grad

  return softmax(logits)


def ordered_softmax(logits, allowed):
  """`masked_softmax` whose denominator adds each row in key order (the last entry of a
  cumulative sum, a sequential scan), not in the order of a vectorised reduction: a row's
  probabilities are then bit for bit the same wherever its allowed entries sit in the row (the
  masked entries add exact zeros), which a reduction over SIMD lanes and accumulators does not
  give once a row spans several packets (causal_window at w >= 32 on AVX2). The row maximum is
  exact in any order and carries no gradient (the softmax does not depend on it). The backward
  pass is the softmax's, p (dp - sum(dp p)), masked entries 0, and keeps only the output: the
  division's own gradient read e, the sum and -e / sum^2, the last computed before the incoming
  gradient existed, so the executor ran it in the forward pass and kept it until the backward.

  Args and returns as `masked_softmax`.
  """
  @tf.custom_gradient
  def softmax(logits):
    x = tf.where(allowed, logits, mask_value(logits.dtype))
    e = tf.exp(x - tf.reduce_max(x, axis=-1, keepdims=True))
    last = e.shape.rank - 1
    total = slice_axis(tf.cumsum(e, axis=last), last, e.shape[-1] - 1, 1)  # [..., 1]
    probs = e / total

    return probs, lambda dprobs: _softmax_gradient(probs, dprobs, allowed)

  return softmax(logits)


def attention_dropout(probs, rate):
  """Attention dropout on the softmax weights (hparam `attention_dropout`, TRAIN mode only).

  Each weight is zeroed with probability `rate` and the others are scaled by 1 / (1 - rate),
  before the products with the values and with the relative-value table, as the original release
  (utils.py `dot_product_attention`, `dot_product_attention_relative`) and T2T do.

  Args:
    probs: [..., m] attention weights.
    rate: Python float in [0, 1); 0 returns `probs` itself.
  Returns:
    [..., m].
  """
  if not rate:
    return probs
  if not 0.0 < rate < 1.0:
    raise ValueError("attention dropout rate %r must be in [0, 1); set attention_dropout "
                     "accordingly." % (rate,))
  return tf.nn.dropout(probs, rate=rate)


def exclude_self(allowed, is_self):
  """`allowed` without each query's own position where the row allows another key.

  Shared-QK attention (Reformer's LSH attention does the same): a normalised query's logit with
  itself is the largest possible, so a routing head would mostly attend to its own position; a
  query attends to itself only when nothing else is allowed.

  Args:
    allowed: bool [..., q, m].
    is_self: bool broadcastable to allowed, True where key m is query q's own position.
  Returns:
    bool [..., q, m].
  """
  others = tf.logical_and(allowed, tf.logical_not(is_self))
  return tf.where(tf.reduce_any(others, axis=-1, keepdims=True), others, allowed)


def times_constant(x, factor):
  """x * factor for a Python number `factor`; 1 returns x itself. The gradient is dy * factor
  only: TF's Mul gradient also computes the factor's, sum(x dy), which an optimizer's
  gate_gradients=GATE_OP (T2T's) runs, so the plain product keeps x for the backward pass.

  Args:
    x: float tensor; factor: Python int or float (anything else: the plain product).
  Returns:
    x * factor, the same values as the plain product.
  """
  if not isinstance(factor, (int, float)) or isinstance(factor, bool):
    return x * factor
  if factor == 1:
    return x

  @tf.custom_gradient
  def product(t):
    return t * factor, lambda dy: dy * factor

  return product(x)


def scale_logits(logits, scale):
  """logits [b, h, ...] times `scale`: None (unchanged), a float, or a per-head tensor [h]."""
  if scale is None:
    return logits
  scale = tf.cast(scale, logits.dtype)
  if scale.shape.rank == 1:
    scale = tf.reshape(scale, [1, -1] + [1] * (logits.shape.rank - 2))
  return logits * scale


def zero_empty_rows(x, allowed):
  """Sets x[..., i, :] to 0 where row i of `allowed` ([..., q, m]) has no allowed key.

  Applied (through `masked_softmax(..., zero_empty=True)`) to the probabilities (where a row with nothing allowed comes out uniform) before the
  value and relative-value products: with causal relative values, `unskew` would carry such a
  row's weights on keys after its query into the distances of the next rows."""
  return x * tf.cast(tf.reduce_any(allowed, axis=-1, keepdims=True), x.dtype)


def relative_embeddings(table, query_offsets, key_offsets):
  """Gathers Shaw et al. (2018) relative position embeddings for a static pattern.

  The distance is key_offset - query_offset clipped to [-R, R], where the table has 2R + 1 rows
  (row R is distance 0).

  Args:
    table: [2R + 1, d] embeddings.
    query_offsets: int [q] positions of the queries (any common origin).
    key_offsets: int [m] positions of the keys (same origin).
  Returns:
    [q, m, d] embeddings.
  """
  rows = table.shape[0]
  radius = (rows - 1) // 2
  distance = key_offsets[tf.newaxis, :] - query_offsets[:, tf.newaxis]
  index = tf.clip_by_value(distance, -radius, radius) + radius
  return tf.gather(table, index)


def relative_distance_rows(table, first_distance, num_distances):
  """Rows of a Shaw table for the consecutive distances first_distance + u, u < num_distances.

  Distances are clipped to [-R, R] (the table has 2R + 1 rows, row R is distance 0). A plain
  slice when no distance is clipped, else a gather of the small [2R + 1, d] table.

  Returns:
    [num_distances, d].
  """
  radius = (table.shape[0] - 1) // 2
  last = first_distance + num_distances - 1
  if -radius <= first_distance and last <= radius:
    return table[first_distance + radius:last + radius + 1]
  distances = tf.range(first_distance, last + 1)
  return tf.gather(table, tf.clip_by_value(distances, -radius, radius) + radius)


def _lead_dims(x, trailing):
  """Dims of x before its last `trailing` axes (static where known)."""
  dynamic = tf.shape(x)
  return [d if d is not None else dynamic[i]
          for i, d in enumerate(x.shape.as_list()[:x.shape.rank - trailing])]


def _check_span(what, u, keys, queries):
  """Refuses a distance span u outside [keys + 1, keys + queries - 1] (one query: [keys, keys])."""
  if u < keys + min(queries - 1, 1) or u > keys + queries - 1:
    raise ValueError("%s %d must lie in [num_keys + 1, num_keys + queries - 1] = [%d, %d]."
                     % (what, u, keys + min(queries - 1, 1), keys + queries - 1))


def skew(rel, num_keys):
  """Distance-indexed logits to key-indexed logits (Music Transformer "skewing", no gather).

  Args:
    rel: [..., q, u]: rel[i, t] belongs to distance index t = j - i + q - 1 of query i and
      key j; u = num_keys + q - 1 covers every (i, j), and any num_keys + 1 <= u covers the
      pairs with t < u (the others read entries of the next row: callers mask them).
    num_keys: k.
  Returns:
    [..., q, k] with out[i, j] = rel[i, j - i + q - 1] where j - i + q - 1 < u.
  """
  q, u = rel.shape[-2], rel.shape[-1]
  _check_span("skew: last axis", u, num_keys, q)
  if q == 1:
    return rel
  lead = _lead_dims(rel, 2)
  # Row i of the result starts at flat index i * u + (q - 1 - i) = (q - 1) + i * (u - 1).
  flat = slice_axis(tf.reshape(rel, lead + [q * u]), -1, q - 1, q * (u - 1))
  out = tf.reshape(flat, lead + [q, u - 1])
  return out if u - 1 == num_keys else slice_axis(out, -1, 0, num_keys)


def unskew(probs, num_distances):
  """The transpose of `skew`: [..., q, k] -> [..., q, u] (u = num_distances), the sum of
  probs[i, j] at [i, j - i + q - 1]; with u < k + q - 1, the probabilities of pairs with
  j - i + q - 1 >= u land elsewhere and must be 0 (masked)."""
  q, k = probs.shape[-2], probs.shape[-1]
  _check_span("unskew: num_distances", num_distances, k, q)
  if q == 1:
    return probs
  lead = _lead_dims(probs, 2)
  rank = probs.shape.rank
  padded = probs
  if num_distances - 1 > k:
    padded = tf.pad(probs, [[0, 0]] * (rank - 1) + [[0, num_distances - 1 - k]])  # [.., q, u - 1]
  flat = tf.reshape(padded, lead + [q * (num_distances - 1)])
  flat = tf.pad(flat, [[0, 0]] * (rank - 2) + [[q - 1, 1]])  # q - 1 + q (u - 1) + 1 = q u
  return tf.reshape(flat, lead + [q, num_distances])


def _distance_rows(table, query_start, num_queries, key_start, num_keys, causal, dtype):
  """The rows of the distances the skew reads: all q + k - 1, or with `causal` (keys after
  their query masked) those up to distance 0 when that takes fewer columns: k + 1 columns from
  the smallest distance, whose skew is one slice (entries of distances > 0 are then garbage)."""
  first = key_start - (query_start + num_queries - 1)
  columns = num_keys + num_queries - 1
  if causal and num_queries > 1 and first + num_keys >= 1:  # distance 0 is within k + 1 rows
    columns = min(columns, num_keys + 1)
  return tf.cast(relative_distance_rows(table, first, columns), dtype)


def relative_logits(x, table, query_start, key_start, num_keys, causal=False):
  """Shaw relative logits x_i . table[clip(key_j - query_i)] for consecutive offsets.

  Equal to einsum("...qd,qkd->...qk", x, relative_embeddings(table, query_start + range(q),
  key_start + range(k))), computed as x . rows over the distinct distances (one matmul)
  followed by `skew`, without the [q, k, d] table. With causal=True only the entries with
  key offset <= query offset are computed (the others hold other finite values: mask them).

  Args:
    x: [..., q, d] queries.
    table: [2R + 1, d].
    query_start, key_start: Python ints, offsets of the first query and key (common origin).
    num_keys: k.
    causal: the caller masks keys after their query.
  Returns:
    [..., q, k].
  """
  num_queries = x.shape[-2]
  rows = _distance_rows(table, query_start, num_queries, key_start, num_keys, causal, x.dtype)
  rel = tf.tensordot(x, rows, [[x.shape.rank - 1], [1]])  # [..., q, columns]
  return skew(rel, num_keys)


def relative_outputs(probs, table, query_start, key_start, causal=False):
  """Shaw relative value term sum_j probs_ij table[clip(key_j - query_i)] for consecutive offsets.

  Equal to einsum("...qk,qkd->...qd", probs, relative_embeddings(...)), computed as `unskew`
  (probabilities summed per distance) times the rows of the distinct distances. With
  causal=True, probs must be 0 for keys after their query (masked).

  Args:
    probs: [..., q, k].
    table: [2R + 1, d].
    query_start, key_start: Python ints, as in `relative_logits`.
    causal: as in `relative_logits`.
  Returns:
    [..., q, d].
  """
  num_queries, num_keys = probs.shape[-2], probs.shape[-1]
  rows = _distance_rows(table, query_start, num_queries, key_start, num_keys, causal,
                        probs.dtype)
  return _distance_weighted_rows(probs, rows)


@tf.custom_gradient
def _distance_weighted_rows(probs, rows):
  """unskew(probs) . rows; the backward pass recomputes unskew(probs) (a pad and a reshape)
  instead of keeping the [..., q, q + k - 1] per-distance weights alive from the forward pass
  (probs itself is kept anyway by the softmax and the value matmul). The recomputation waits
  for the incoming gradient: without that wait nothing orders it after the forward pass, and
  the executor ran it early, keeping every layer's per-distance weights alive until the
  backward pass."""
  num_keys, num_distances = probs.shape[-1], rows.shape[0]
  axis = probs.shape.rank - 1
  out = tf.tensordot(unskew(probs, num_distances), rows, [[axis], [0]])

  def grad(dout):
    dprobs = skew(tf.tensordot(dout, rows, [[axis], [1]]), num_keys)
    per_distance = tf.reshape(unskew(rebuild.after(dout, probs)[0], num_distances),
                              [-1, num_distances])
    drows = tf.matmul(per_distance, tf.reshape(dout, [-1, rows.shape[1]]), transpose_a=True)
    return dprobs, drows

  return out, grad


def check_qkv(q, k, v, name):
  """Validates ranks and depths of q, k, v ([b, h, n, d]); returns (b, h, n, d) as Python ints."""
  for arg, t in (("q", q), ("k", k), ("v", v)):
    if t.shape.rank != 4:
      raise ValueError(
          "%s: %s must have rank 4 [batch, heads, length, depth], got shape %s; reshape the "
          "projected activations to [batch, heads, length, depth] first." % (name, arg, t.shape))
  if q.shape[-1] != k.shape[-1]:
    raise ValueError(
        "%s: q depth %s differs from k depth %s; project queries and keys to the same depth."
        % (name, q.shape[-1], k.shape[-1]))
  if k.shape[:3] != v.shape[:3]:
    raise ValueError(
        "%s: k shape %s and v shape %s differ in [batch, heads, length]; keys and values must "
        "describe the same positions." % (name, k.shape, v.shape))
  if q.shape[:2] != k.shape[:2]:
    raise ValueError(
        "%s: q shape %s and k shape %s differ in [batch, heads]." % (name, q.shape, k.shape))
  if q.shape[2] is None or k.shape[2] is None:
    raise ValueError(
        "%s: the length axis must be static (TPU/XLA); pad inputs to a fixed length." % name)
  return q.shape[0], q.shape[1], q.shape[2], q.shape[3]


def optional_tensors(*values):
  """Converts each value to a tensor, leaving None as None."""
  return tuple(None if x is None else tf.convert_to_tensor(x) for x in values)


def self_attention_inputs(q, k, v, relative_keys, relative_values, name):
  """Converts and validates self-attention inputs ([b, h, n, d], equal lengths, tables).

  Returns:
    (q, k, v, relative_keys, relative_values, heads, length, depth).
  """
  q, k, v = (tf.convert_to_tensor(x) for x in (q, k, v))
  relative_keys, relative_values = optional_tensors(relative_keys, relative_values)
  _, heads, n, depth = check_qkv(q, k, v, name)
  if k.shape[2] != n:
    raise ValueError("%s: keys have length %d but queries %d; self-attention needs equal "
                     "lengths." % (name, k.shape[2], n))
  check_relative_table(relative_keys, depth, "relative_keys", name)
  check_relative_table(relative_values, v.shape[-1], "relative_values", name)
  return q, k, v, relative_keys, relative_values, heads, n, depth


def check_relative_table(table, depth, arg, name):
  """Validates a relative position table [2R + 1, d]."""
  if table is None:
    return
  if table.shape.rank != 2 or table.shape[0] % 2 != 1 or table.shape[1] != depth:
    raise ValueError(
        "%s: %s must have shape [2 * max_relative_position + 1, %d], got %s."
        % (name, arg, depth, table.shape))


def key_padding(padding, batch, length, name):
  """Validates `padding` ([b, n], True/nonzero = padding) and returns it as bool [b, n] or None."""
  if padding is None:
    return None
  padding = tf.convert_to_tensor(padding)
  if padding.shape.rank != 2 or padding.shape[1] != length:
    raise ValueError(
        "%s: padding must have shape [batch, %d] (True or 1 where the position is padding), got "
        "%s." % (name, length, padding.shape))
  if padding.dtype != tf.bool:
    padding = tf.not_equal(padding, tf.zeros_like(padding))
  return padding
