"""Full (dense) softmax attention: the O(n^2) baseline every sparse kind is measured against."""
import tensorflow as tf

from routing_transformer.core.attention import common


def full_attention(q, k, v, causal=True, padding=None, scale=None, dropout_rate=0.0):
  """Dense scaled dot-product attention.

  Args:
    q: [b, h, n, d] queries.
    k: [b, h, m, d] keys (m = n when causal).
    v: [b, h, m, d_v] values.
    causal: query i attends to keys j <= i.
    padding: optional [b, m] bool/int, True or nonzero marks padding keys (masked out).
    scale: logit scale; default d ** -0.5.
    dropout_rate: attention dropout on the weights (`common.attention_dropout`); 0 in
      evaluation and decoding.
  Returns:
    [b, h, n, d_v]; a query with no allowed key gets 0.
  """
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
