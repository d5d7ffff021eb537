"""Token sampling on logits [b, v]: temperature, top-k (exactly k per row), nucleus (top-p),
greedy. The filters mask excluded logits with a large negative value, so they compose."""
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
  """logits [b, v] with all but exactly the k largest of each row masked (ties by index)."""
  _, indices = tf.math.top_k(logits, k=k)  # [b, k], distinct per row
  keep = tf.reduce_sum(tf.one_hot(indices, tf.shape(logits)[-1], dtype=tf.int32), axis=1) > 0
  return tf.where(keep, logits, common.mask_value(logits.dtype))


def nucleus_filter(logits, p):
  """logits [b, v] with all but each row's smallest set of most likely tokens whose probability
  reaches p in (0, 1] masked: a token stays when the mass of the tokens before it in sorted
  order is below p (the most likely always)."""
  logits = tf.convert_to_tensor(logits)
  if p >= 1.0:  # everything (float32 cumulative sums can reach 1 before the last token)
    return logits
  sorted_logits, order = tf.math.top_k(logits, k=tf.shape(logits)[-1])
  probs = tf.nn.softmax(sorted_logits)
  mass_before = tf.cumsum(probs, axis=-1, exclusive=True)
  keep_sorted = mass_before < p
  # the keep flags back in vocabulary order
  keep = tf.gather(keep_sorted, tf.argsort(order, axis=-1), batch_dims=1)
  return tf.where(keep, logits, common.mask_value(logits.dtype))


def sample(logits, temperature=1.0, top_k=-1, top_p=1.0, seed=None):
  """One token per row, int32 [b], from logits [b, v]: greedy at temperature 0, else from
  logits / temperature filtered by top_k (0 or -1: off) and then top_p (1: off)."""
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
