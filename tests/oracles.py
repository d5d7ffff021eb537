"""Test oracles built from the library's own functions (slow, exact restatements of a rule).

`prefix_routing_attention` is the full-sequence form of the decode-time routing rule: it runs
`routing_attention` once per prefix, n times a normal pass, so the cached decoder's one-position
steps can be compared with it at every position.
"""
import tensorflow as tf

from routing_transformer.core.attention import routing


def prefix_routing_attention(q, k, v, centroids, window, share_qk=True, relative_keys=None,
                             relative_values=None, exclude_self=False, logit_scale=None):
  """Causal routing attention where query i is routed over the prefix 0..i only.

  The full-sequence form of the decode-time rule (the reference of the cached decoder). Costs n
  times `routing_attention` (it runs it once per prefix, batched), so use it on short sequences.

  Args:
    q, k, v: [b, h, n, d] routing-head queries, keys (ignored with share_qk), values.
    centroids: [h, c, d].
    window: w.
    share_qk: keys are the queries.
    relative_keys, relative_values: optional [2R + 1, d] tables.
    exclude_self, logit_scale: extensions, as in `routing.routing_attention`.
  Returns:
    [b, h, n, d].
  """
  q, k, v = (tf.convert_to_tensor(x) for x in (q, k, v))
  batch, heads, n, depth = q.shape
  tile = lambda x: tf.reshape(tf.tile(x[tf.newaxis], [n, 1, 1, 1, 1]), [n * batch, heads, n, -1])
  prefix = tf.range(n)
  padding = prefix[tf.newaxis, :] > prefix[:, tf.newaxis]  # [n prefixes, n]: j after i
  padding = tf.reshape(tf.tile(padding[:, tf.newaxis], [1, batch, 1]), [n * batch, n])
  out, _ = routing.routing_attention(tile(q), tile(k), tile(v), centroids, window, causal=True,
                                     share_qk=share_qk, padding=padding,
                                     relative_keys=relative_keys, relative_values=relative_values,
                                     exclude_self=exclude_self, logit_scale=logit_scale)
  out = tf.reshape(out, [n, batch, heads, n, depth])  # [prefix i, b, h, position, d]
  diagonal = tf.gather(tf.transpose(out, [0, 3, 1, 2, 4]), prefix[:, tf.newaxis], batch_dims=1)
  return tf.transpose(diagonal[:, 0], [1, 2, 0, 3])  # out[i, position i] -> [b, h, n, d]
