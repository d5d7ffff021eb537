"""Shaw relative positions over distinct distances + skewing equal the gathered [q, k, d] table."""
import numpy as np
import pytest
import tensorflow as tf

from routing_transformer.core.attention import common

# (queries, keys, query_start, key_start, R): local causal / non-causal blocks, routing ranks,
# causal_window (queries at w.., keys 0..2w), one query, with and without clipped distances.
CASES = [
    (4, 12, 0, -8, 2), (4, 12, 0, -8, 20), (4, 20, 0, -8, 5), (5, 5, 0, 0, 1), (5, 5, 0, 0, 9),
    (3, 6, 3, 0, 2), (3, 6, 3, 0, 8), (1, 7, 0, -4, 2), (6, 2, 0, 0, 3), (2, 1, 0, 0, 0),
]


def _naive(x, probs, table, qs, ks, causal=False):
  del causal
  q, k = x.shape[-2], probs.shape[-1]
  emb = common.relative_embeddings(table, qs + tf.range(q), ks + tf.range(k))  # [q, k, d]
  return (tf.einsum("...qd,qkd->...qk", x, emb), tf.einsum("...qk,qkd->...qd", probs, emb))


def _fast(x, probs, table, qs, ks, causal=False):
  return (common.relative_logits(x, table, qs, ks, probs.shape[-1], causal=causal),
          common.relative_outputs(probs, table, qs, ks, causal=causal))


def _values_and_grads(fn, x, probs, table, qs, ks, causal=False):
  """Values and gradients; with causal, keys after their query are masked as attention does
  (their logits unused, their probabilities 0)."""
  q, k = x.shape[-2], probs.shape[-1]
  allowed = tf.constant((ks + np.arange(k))[None, :] <= (qs + np.arange(q))[:, None]
                        if causal else np.ones((q, k), bool))
  with tf.GradientTape() as tape:
    tape.watch([x, probs, table])
    logits, out = fn(x, probs * tf.cast(allowed, probs.dtype), table, qs, ks, causal)
    logits = tf.where(allowed, logits, tf.zeros_like(logits))
    loss = tf.reduce_sum(tf.sin(logits)) + tf.reduce_sum(out * tf.cos(out))
  return [logits, out] + [tf.convert_to_tensor(g) for g in tape.gradient(loss, [x, probs, table])]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_skewed_equals_gathered_values_and_gradients(rng, case, causal):
  q, k, qs, ks, radius = case
  d = 3
  x = tf.constant(rng.standard_normal((2, 3, q, d)))  # float64: exact up to summation order
  probs = tf.constant(rng.standard_normal((2, 3, q, k)))
  table = tf.constant(rng.standard_normal((2 * radius + 1, d)))
  fast = _values_and_grads(_fast, x, probs, table, qs, ks, causal)
  naive = _values_and_grads(_naive, x, probs, table, qs, ks, causal)
  for a, b in zip(fast, naive):
    assert a.shape == b.shape
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12, atol=1e-12)


def test_unknown_batch_and_xla(rng):
  """Graph mode with an unknown batch axis and XLA give the same numbers (float32)."""
  q, k, qs, ks, radius = 4, 12, 0, -8, 5
  x = rng.standard_normal((2, 3, q, 8)).astype(np.float32)
  probs = rng.standard_normal((2, 3, q, k)).astype(np.float32)
  table = tf.constant(rng.standard_normal((2 * radius + 1, 8)).astype(np.float32))
  spec = [tf.TensorSpec([None, 3, q, 8]), tf.TensorSpec([None, 3, q, k])]
  graph = tf.function(lambda a, p: _fast(a, p, table, qs, ks), input_signature=spec)
  xla = tf.function(lambda a, p: _fast(a, p, table, qs, ks), jit_compile=True)
  naive = _naive(tf.constant(x), tf.constant(probs), table, qs, ks)
  for got in (graph(x, probs), xla(x, probs)):
    for a, b in zip(got, naive):
      assert a.shape == b.shape
      np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-5)


def test_skew_and_unskew_are_transposes(rng):
  rel = rng.standard_normal((2, 5, 5 + 7 - 1))
  probs = rng.standard_normal((2, 5, 7))
  skewed = common.skew(tf.constant(rel), 7).numpy()
  unskewed = common.unskew(tf.constant(probs), 11).numpy()
  for i in range(5):
    for j in range(7):
      assert skewed[:, i, j].tolist() == rel[:, i, j - i + 4].tolist()
  np.testing.assert_allclose(np.sum(skewed * probs), np.sum(rel * unskewed), rtol=1e-12)
  with pytest.raises(ValueError, match="num_keys"):
    common.skew(tf.constant(rel), 13)
  short = rng.standard_normal((2, 5, 8))  # k + 1 columns: the pairs with j - i + 4 < 8
  skewed = common.skew(tf.constant(short), 7).numpy()
  for i in range(5):
    for j in range(7):
      if j - i + 4 < 8:
        assert skewed[:, i, j].tolist() == short[:, i, j - i + 4].tolist()
  np.testing.assert_allclose(np.sum(skewed * probs),
                             np.sum(short * common.unskew(tf.constant(probs), 8).numpy()),
                             rtol=1e-12)


@pytest.mark.parametrize("axis,start,size", [(-1, 3, 5), (2, 1, 2), (0, 0, 1)])
def test_slice_axis_equals_strided_slice_values_and_gradients(rng, axis, start, size):
  """common.slice_axis (tf.slice, whose gradient is a Pad) = the strided slice it replaces."""
  x = tf.constant(rng.normal(size=(2, 3, 4, 9)))
  index = [slice(None)] * 4
  index[axis] = slice(start, start + size)
  with tf.GradientTape(persistent=True) as tape:
    tape.watch(x)
    ours, theirs = common.slice_axis(x, axis, start, size), x[tuple(index)]
    weights = tf.constant(rng.normal(size=theirs.shape))
    loss_ours, loss_theirs = tf.reduce_sum(ours * weights), tf.reduce_sum(theirs * weights)
  np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
  np.testing.assert_array_equal(tape.gradient(loss_ours, x).numpy(),
                                tape.gradient(loss_theirs, x).numpy())
