"""Test oracles: slow, exact restatements of a rule.

`prefix_routing_attention` (built from the library's own functions) is the full-sequence form of
the decode-time routing rule: it runs `routing_attention` once per prefix, n times a normal pass,
so the cached decoder's one-position steps can be compared with it at every position.

`original_ema_step`, `original_commitment_loss` and `original_learning_rate` restate in NumPy /
plain Python what the original release computes in a TRAIN step (its `utils.py` online_kmeans
and embedding_lookup, its `sparse_transformer_local` schedule through T2T's learning_rate.py);
they use nothing from the library.
"""
import math

import numpy as np
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


# The original release's k-means and schedule constants (its utils.py online_kmeans, its
# sparse_transformer.py `sparse_transformer_local`).
ORIGINAL_EPSILON = 1e-5
ORIGINAL_SCHEDULE = "constant*rsqrt_normalized_decay"
ORIGINAL_LEARNING_RATE = 0.01
ORIGINAL_WARMUP_STEPS = 10000


def original_assignments(x, means):
  """argmax_c x . mu_c (the original's nearest_neighbor): [b, h, n, d], [h, c, d] -> [b, h, n]."""
  return np.einsum("bhnd,hcd->bhnc", x, means).argmax(-1)


def original_ema_step(x, weights, means, ema_count, ema_means, decay, legacy=True,
                      epsilon=ORIGINAL_EPSILON):
  """One TRAIN step of the original's online_kmeans (utils.py, EMA branch) in float64: argmax of
  x . mu, one-hot masked by padding, counts by the [-1, h, c] reshape (legacy) or per head, sums
  per head, assign_moving_average (var - (var - value) * (1 - decay)) of both, Laplace-smoothed
  counts, means = ema_means / smoothed counts.

  Args:
    x: [b, h, n, d] normalised vectors; weights: [b, n], 0 at padding.
    means, ema_count, ema_means: the state before the step, [h, c, d], [h, c], [h, c, d].
  Returns:
    (means, ema_count, ema_means, clusters [b, h, n]) after the step.
  """
  x, means = np.asarray(x, np.float64), np.asarray(means, np.float64)
  ema_count, ema_means = np.asarray(ema_count, np.float64), np.asarray(ema_means, np.float64)
  heads, num_clusters = means.shape[:2]
  clusters = original_assignments(x, means)
  hot = np.eye(num_clusters)[clusters] * np.asarray(weights, np.float64)[:, None, :, None]
  count = (hot.reshape(-1, heads, num_clusters).sum(0) if legacy else hot.sum((0, 2)))
  ema_count = ema_count - (ema_count - count) * (1 - decay)
  ema_means = ema_means - (ema_means - np.einsum("bhnc,bhnd->hcd", hot, x)) * (1 - decay)
  total = ema_count.sum(-1, keepdims=True)
  smoothed = (ema_count + epsilon) / (total + num_clusters * epsilon) * total
  return ema_means / smoothed[..., None], ema_count, ema_means, clusters


def original_commitment_loss(x, means):
  """The original's e_loss (utils.py embedding_lookup) in float64: the mean over every element of
  (x - mu[argmax x . mu])^2, x [b, h, n, d] (padding included), means [h, c, d]."""
  x, means = np.asarray(x, np.float64), np.asarray(means, np.float64)
  clusters = original_assignments(x, means)
  assigned = means[np.arange(means.shape[0])[None, :, None], clusters]
  return float(np.mean((x - assigned) ** 2))


def original_clustering_loss(q, means, beta, k=None):
  """A routing layer's clustering loss in the original (EMA): beta * e_q + beta * e_k, one
  cluster_items call for the queries and one for the keys; with share_qk (k=None) the keys are
  the queries, 2 * beta * e_q."""
  e_q = original_commitment_loss(q, means)
  return beta * e_q + beta * (e_q if k is None else original_commitment_loss(k, means))


def original_learning_rate(step, constant=ORIGINAL_LEARNING_RATE,
                           warmup_steps=ORIGINAL_WARMUP_STEPS):
  """The original's learning rate at global step `step` (the step's value before its update):
  T2T's `constant*rsqrt_normalized_decay`, constant * sqrt(warmup) / sqrt(max(step, warmup)):
  flat up to `warmup_steps`, then rsqrt decay; no warm-up."""
  return constant * math.sqrt(warmup_steps) / math.sqrt(max(step, warmup_steps))
