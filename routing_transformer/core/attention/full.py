"""Full (dense) softmax attention: the O(n^2) baseline every sparse kind is measured against."""
import tensorflow as tf

from routing_transformer.core.attention import common


def full_attention(q, k, v, causal=True, padding=None, scale=None, dropout_rate=0.0):
  """Dense scaled dot-product attention: q [b, h, n, d], k [b, h, m, d], v [b, h, m, d_v] ->
  [b, h, n, d_v]. causal: query i attends to keys j <= i (m = n); padding: optional [b, m],
  nonzero at padding keys; scale: default d ** -0.5; dropout_rate: on the weights. A query with
  no allowed key gets 0."""
  q, k, v = (tf.convert_to_tensor(x) for x in (q, k, v))
  _, _, n, depth = common.check_qkv(q, k, v, "full_attention")
  m = k.shape[2]
  if causal and m != n:
    raise ValueError("full_attention: causal attention needs as many keys (%d) as queries (%d)."
                     % (m, n))
  if scale is None:
    scale = depth ** -0.5
  logits = tf.einsum("bhqd,bhkd->bhqk", q * scale, k)
  allowed = tf.ones([1, 1, 1, m], tf.bool)
  if causal:
    allowed = (tf.range(n)[:, tf.newaxis] >= tf.range(m)[tf.newaxis, :])[tf.newaxis, tf.newaxis]
  pad = common.key_padding(padding, None, m, "full_attention")
  if pad is not None:
    allowed = tf.logical_and(allowed, tf.logical_not(pad)[:, tf.newaxis, tf.newaxis, :])
  probs = common.attention_dropout(common.masked_softmax(logits, allowed), dropout_rate)
  out = tf.einsum("bhqk,bhkd->bhqd", probs, v)
  if pad is not None:  # a query whose allowed keys are all padding gets 0
    out = common.zero_empty_rows(out, allowed)
  return out


def causal_block_length(length, *tables):
  """The query block of `causal_full_attention`: the smallest divisor of `length` >= R (the
  relative `tables`' radius, [2R + 1, d] or None) and >= length / 8, so at most 1/16 of the
  causal triangle is computed and masked; the whole length when R >= length."""
  radius = max([(t.shape[0] - 1) // 2 for t in tables if t is not None] or [0])
  least = min(max(radius, -(-length // 8), 1), length)
  return next(b for b in range(least, length + 1) if length % b == 0)


def causal_full_attention(q, k, v, relative_keys=None, relative_values=None, padding=None,
                          scale=None, dropout_rate=0.0):
  """Dense causal self-attention, q, k, v [b, h, n, d] -> [b, h, n, d], in query blocks that
  skip the keys after the block: `local.local_attention` with one block of the whole length.

  Query block t (length B, `causal_block_length`) scores blocks 0..t-2 (far keys, at distance
  <= -B <= -R, where the relative table is clipped to its row r_0) and t-1..t (the band).
  Subtracting r_0 from the table leaves the softmax unchanged, so far keys need no relative
  term, and the values' is r_0 * (sum of the weights) + the band's from the shifted table.
  Arguments as `local.local_attention`; a query with no allowed key gets 0.
  """
  name = "causal_full_attention"
  q, k, v, relative_keys, relative_values, heads, n, depth = common.self_attention_inputs(
      q, k, v, relative_keys, relative_values, name)
  block = causal_block_length(n, relative_keys, relative_values)
  if scale is None:
    scale = depth ** -0.5
  shift = lambda table: None if table is None else table - table[:1]
  band_keys, band_values = shift(relative_keys), shift(relative_values)
  pad = common.key_padding(padding, None, n, name)
  keep = None if pad is None else tf.logical_not(pad)[:, tf.newaxis, tf.newaxis, :]  # [b,1,1,n]
  q_blocks = tf.split(q * scale, n // block, axis=2)
  outputs = []
  for t, q_t in enumerate(q_blocks):
    start = max(t - 1, 0) * block  # the band's first key
    width = (t + 1) * block - start
    k_band, v_band = (common.slice_axis(x, 2, start, width) for x in (k, v))
    logits = [tf.einsum("bhqd,bhkd->bhqk", q_t, k_band)]
    if band_keys is not None:
      logits[0] += common.relative_logits(q_t, band_keys, t * block, start, width, causal=True)
    # [B, width]: the band's causal triangle
    allowed = [tf.range(width)[tf.newaxis, :] <= tf.range(block)[:, tf.newaxis] + t * block - start]
    if start:  # far keys 0..start-1, all allowed
      k_far, v_far = (common.slice_axis(x, 2, 0, start) for x in (k, v))
      logits.insert(0, tf.einsum("bhqd,bhkd->bhqk", q_t, k_far))
      allowed.insert(0, tf.ones([block, start], tf.bool))
    allowed = tf.concat(allowed, axis=1)[tf.newaxis, tf.newaxis]
    if keep is not None:
      allowed = tf.logical_and(allowed, common.slice_axis(keep, 3, 0, start + width))
    probs = common.attention_dropout(
        common.masked_softmax(tf.concat(logits, axis=-1), allowed, zero_empty=pad is not None),
        dropout_rate)
    band_probs = common.slice_axis(probs, 3, start, width)
    out = tf.einsum("bhqk,bhkd->bhqd", band_probs, v_band)
    if start:
      out += tf.einsum("bhqk,bhkd->bhqd", common.slice_axis(probs, 3, 0, start), v_far)
    if band_values is not None:
      out += common.relative_outputs(band_probs, band_values, t * block, start, causal=True)
      out += tf.reduce_sum(probs, axis=-1, keepdims=True) * tf.cast(relative_values[0],
                                                                     probs.dtype)
    outputs.append(out)
  return tf.concat(outputs, axis=2)
