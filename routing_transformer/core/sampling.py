"""Token sampling for decoding: temperature, top-k (exactly k per row), nucleus (top-p), greedy.

Pure functions on logits [batch, vocab]; static shapes (XLA/TPU). Filters return logits with
excluded entries set to a large negative value, so they compose (top-k, then top-p).
"""
import tensorflow as tf

from routing_transformer.core.attention import common


def check_sampling(temperature=1.0, top_k=-1, top_p=1.0):
  """Validates sampling settings; raises ValueError naming the fix."""
  if temperature < 0:
    raise ValueError("sampling temperature must be >= 0 (0 is greedy), got %r." % temperature)
  if top_k is not None and top_k < -1:
    raise ValueError("top-k must be >= 0 (0 or -1 turn it off), got %r." % top_k)
  if top_p is not None and not 0.0 < top_p <= 1.0:
    raise ValueError("nucleus top-p must be in (0, 1] (1 turns it off), got %r." % top_p)


def top_k_filter(logits, k):
  """Keeps exactly the k largest logits of every row (ties broken by index), masks the rest.

  Args:
    logits: [b, v].
    k: int, 0 < k <= v.
  Returns:
    [b, v] logits, the others set to a large negative value.
  """
  _, indices = tf.math.top_k(logits, k=k)  # [b, k], distinct per row
  keep = tf.reduce_sum(tf.one_hot(indices, tf.shape(logits)[-1], dtype=tf.int32), axis=1) > 0
  return tf.where(keep, logits, common.mask_value(logits.dtype))


def nucleus_filter(logits, p):
  """Keeps, per row, the smallest set of most likely tokens whose probability reaches p.

  The most likely token is always kept; a token is kept when the probability mass of the tokens
  strictly more likely than it (in sorted order) is below p.

  Args:
    logits: [b, v].
    p: float in (0, 1].
  Returns:
    [b, v] logits, the others set to a large negative value.
  """
  logits = tf.convert_to_tensor(logits)
  if p >= 1.0:  # everything (float32 cumulative sums can reach 1 before the last token)
    return logits
  sorted_logits, order = tf.math.top_k(logits, k=tf.shape(logits)[-1])
  probs = tf.nn.softmax(sorted_logits)
  mass_before = tf.cumsum(probs, axis=-1, exclusive=True)
  keep_sorted = mass_before < p
  # Undo the sort: scatter the keep flags back to vocabulary order.
  keep = tf.gather(keep_sorted, tf.argsort(order, axis=-1), batch_dims=1)
  return tf.where(keep, logits, common.mask_value(logits.dtype))


def sample(logits, temperature=1.0, top_k=-1, top_p=1.0, seed=None):
  """Draws one token per row.

  Args:
    logits: [b, v] float.
    temperature: 0 for greedy (argmax); otherwise logits are divided by it.
    top_k: keep exactly k tokens per row before sampling; 0 or -1 = off (T2T's default -1).
    top_p: nucleus mass in (0, 1]; 1 = off.
    seed: optional op seed.
  Returns:
    int32 [b].
  """
  check_sampling(temperature, top_k, top_p)
  logits = tf.convert_to_tensor(logits)
  if temperature == 0:
    return tf.argmax(logits, axis=-1, output_type=tf.int32)
  logits = logits / tf.cast(temperature, logits.dtype)
  if top_k is not None and top_k > 0:
    logits = top_k_filter(logits, min(top_k, logits.shape[-1]))
  if top_p is not None and top_p < 1.0:
    logits = nucleus_filter(logits, top_p)
  return tf.random.categorical(logits, 1, dtype=tf.int32, seed=seed)[:, 0]
