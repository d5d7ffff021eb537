"""Small pieces shared by the attention kinds: normalisation, masking, argument checks.

Shapes use b = batch, h = heads, n = length, d = depth per head.
"""
import tensorflow as tf


def layer_norm_no_scale(x, epsilon=1e-6):
  """LayerNorm with scale and bias disabled over the last axis: mean 0, variance 1.

  Args:
    x: [..., d] float tensor.
    epsilon: added to the variance.
  Returns:
    [..., d] tensor of x's dtype.
  """
  mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
  return (x - mean) * tf.math.rsqrt(variance + epsilon)


def mask_value(dtype):
  """A large negative logit for masked entries that stays finite in `dtype`."""
  dtype = tf.as_dtype(dtype)
  return tf.constant(-0.7 * dtype.max, dtype=dtype)


def masked_softmax(logits, allowed):
  """Softmax over the last axis restricted to `allowed` (masked entries get probability 0).

  A row with nothing allowed comes out uniform; callers that can produce such rows (only with
  padding) clear them with `zero_empty_rows`.

  Args:
    logits: [..., m] float tensor.
    allowed: bool tensor broadcastable to logits.
  Returns:
    [..., m] probabilities.
  """
  return tf.nn.softmax(tf.where(allowed, logits, mask_value(logits.dtype)))


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


def scale_logits(logits, scale):
  """logits [b, h, ...] times `scale`: None (unchanged), a float, or a per-head tensor [h]."""
  if scale is None:
    return logits
  scale = tf.cast(scale, logits.dtype)
  if scale.shape.rank == 1:
    scale = tf.reshape(scale, [1, -1] + [1] * (logits.shape.rank - 2))
  return logits * scale


def zero_empty_rows(out, allowed):
  """Sets out[..., i, :] to 0 where row i of `allowed` ([..., q, m]) has no allowed key."""
  return out * tf.cast(tf.reduce_any(allowed, axis=-1, keepdims=True), out.dtype)


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
