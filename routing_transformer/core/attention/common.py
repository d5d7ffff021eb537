"""Pieces shared by the attention kinds: normalisation, the masked softmax, dropout, Shaw
relative positions, argument checks. b = batch, h = heads, n = length, d = depth per head."""
import tensorflow as tf

from routing_transformer.core import kmeans
from routing_transformer.core import memory


layer_norm_no_scale = kmeans.layer_norm_no_scale  # routing's normalisation
compute_dtype = kmeans.compute_dtype


def mask_value(dtype):
  """A large negative logit for masked entries that stays finite in `dtype`."""
  dtype = tf.as_dtype(dtype)
  return tf.constant(-0.7 * dtype.max, dtype=dtype)


def slice_axis(x, axis, start, size):
  """x[..., start:start + size, ...] along `axis`, as tf.slice."""
  rank = x.shape.rank
  axis %= rank
  begin, sizes = [0] * rank, [-1] * rank
  begin[axis], sizes[axis] = start, size
  return tf.slice(x, begin, sizes)


def masked_softmax(logits, allowed, zero_empty=False, ordered=False):
  """Softmax [..., m] over the last axis where `allowed` (else 0), in `compute_dtype`; zero_empty:
  rows with nothing allowed are 0; ordered: the denominator a cumsum in key order (same bits
  wherever a row's entries sit: causal_window's cached and whole outputs agree)."""
  dtype = logits.dtype.base_dtype
  x = tf.where(allowed, tf.cast(logits, compute_dtype(dtype)),
               mask_value(compute_dtype(dtype)))
  if ordered:
    e = tf.exp(x - tf.stop_gradient(tf.reduce_max(x, axis=-1, keepdims=True)))
    last = e.shape.rank - 1
    probs = e / slice_axis(tf.cumsum(e, axis=last), last, e.shape[-1] - 1, 1)
  else:
    probs = tf.nn.softmax(x)
  if zero_empty:
    probs = zero_empty_rows(probs, allowed)
  return tf.cast(probs, dtype)


def attention_dropout(probs, rate):
  """Dropout of the attention weights at `rate` in [0, 1), as the original release and T2T."""
  if not rate:
    return probs
  if not 0.0 < rate < 1.0:
    raise ValueError("attention dropout rate %r must be in [0, 1); set attention_dropout "
                     "accordingly." % (rate,))
  return tf.nn.dropout(probs, rate=rate)


def exclude_self(allowed, is_self):
  """allowed bool [..., q, m] without each query's own position (is_self) where the row allows
  another key: with shared QK a query's logit with itself is the largest (as Reformer does)."""
  others = tf.logical_and(allowed, tf.logical_not(is_self))
  return tf.where(tf.reduce_any(others, axis=-1, keepdims=True), others, allowed)


def scale_logits(logits, scale):
  """logits [b, h, ...] times `scale`: None (unchanged), a float, or a per-head tensor [h]."""
  if scale is None:
    return logits
  scale = tf.cast(scale, logits.dtype)
  if scale.shape.rank == 1:
    scale = tf.reshape(scale, [1, -1] + [1] * (logits.shape.rank - 2))
  return logits * scale


def zero_empty_rows(x, allowed):
  """x[..., i, :] set to 0 where row i of `allowed` [..., q, m] allows no key."""
  return x * tf.cast(tf.reduce_any(allowed, axis=-1, keepdims=True), x.dtype)


def relative_embeddings(table, query_offsets, key_offsets):
  """Shaw et al. (2018) embeddings [q, m, d] of table [2R + 1, d] (row R: distance 0) for the
  distances key_offsets [m] - query_offsets [q], clipped to [-R, R]."""
  rows = table.shape[0]
  radius = (rows - 1) // 2
  distance = key_offsets[tf.newaxis, :] - query_offsets[:, tf.newaxis]
  index = tf.clip_by_value(distance, -radius, radius) + radius
  return tf.gather(table, index)


def relative_distance_rows(table, first_distance, num_distances):
  """Rows [num_distances, d] of a Shaw table for the distances first_distance + u, clipped."""
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
  """Music Transformer "skewing": distance-indexed rel [..., q, u] (t = j - i + q - 1) ->
  key-indexed [..., q, k], out[i, j] = rel[i, j - i + q - 1] where that is < u (u >= k + 1;
  other entries read the next row: callers mask them)."""
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
  """The transpose of `skew`: [..., q, k] -> [..., q, u], probs[i, j] summed at [i, j - i + q - 1];
  with u < k + q - 1, pairs with j - i + q - 1 >= u must be 0 (masked)."""
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
  """The distances' rows the skew reads: all q + k - 1, or with `causal` k + 1 from the smallest
  when they reach distance 0 (entries of distances > 0 are then garbage, masked)."""
  first = key_start - (query_start + num_queries - 1)
  columns = num_keys + num_queries - 1
  if causal and num_queries > 1 and first + num_keys >= 1:  # distance 0 is within k + 1 rows
    columns = min(columns, num_keys + 1)
  return tf.cast(relative_distance_rows(table, first, columns), dtype)


def relative_logits(x, table, query_start, key_start, num_keys, causal=False):
  """Shaw relative logits [..., q, k]: x [..., q, d] . table[clip(key_j - query_i)], one matmul
  and a `skew`; with causal only keys up to their query are right (mask the others)."""
  num_queries = x.shape[-2]
  rows = _distance_rows(table, query_start, num_queries, key_start, num_keys, causal, x.dtype)
  rel = tf.tensordot(x, rows, [[x.shape.rank - 1], [1]])  # [..., q, columns]
  return skew(rel, num_keys)


def relative_outputs(probs, table, query_start, key_start, causal=False):
  """Shaw relative value term [..., q, d]: sum_j probs_ij table[clip(key_j - query_i)] of probs
  [..., q, k], as `unskew` times the distinct distances' rows (causal: probs 0 after the query)."""
  num_queries, num_keys = probs.shape[-2], probs.shape[-1]
  rows = _distance_rows(table, query_start, num_queries, key_start, num_keys, causal,
                        probs.dtype)
  # a memory.recompute_tensors block: the backward pass unskews probs again, not kept
  return memory.recompute_tensors(
      lambda p, r: tf.tensordot(unskew(p, r.shape[0]), r, [[p.shape.rank - 1], [0]]), probs,
      rows)


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
  """Validated (q, k, v, relative_keys, relative_values, heads, length, depth)."""
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
