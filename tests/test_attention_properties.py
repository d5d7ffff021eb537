"""Causality, gradients, XLA compilation and argument errors of the attention functions."""
import numpy as np
import pytest
import tensorflow as tf

from routing_transformer.core import attention
import reference


def _qkv(rng, b, h, n, d):
  return [tf.constant(rng.standard_normal((b, h, n, d)).astype(np.float32)) for _ in range(3)]


def _perturb_after(x, t, rng):
  noise = rng.standard_normal(x.shape).astype(np.float32)
  keep = (np.arange(x.shape[2]) <= t)[None, None, :, None]
  return tf.constant(np.where(keep, x.numpy(), x.numpy() + 3.0 * noise))


@pytest.mark.parametrize("kind", ["full", "local", "local_relative"])
@pytest.mark.parametrize("t", [0, 5, 13, 22])
def test_causal_kinds_ignore_the_future(rng, kind, t):
  q, k, v = _qkv(rng, 2, 2, 24, 8)
  rel = tf.constant(rng.standard_normal((9, 8)).astype(np.float32))

  def run(q, k, v):
    if kind == "full":
      return attention.full_attention(q, k, v)
    if kind == "local":
      return attention.local_attention(q, k, v, 4, 8)
    return attention.local_attention(q, k, v, 4, 8, relative_keys=rel, relative_values=rel)

  before = run(q, k, v).numpy()
  after = run(*[_perturb_after(x, t, rng) for x in (q, k, v)]).numpy()
  np.testing.assert_array_equal(before[:, :, :t + 1], after[:, :, :t + 1])
  assert not np.allclose(before[:, :, t + 1:], after[:, :, t + 1:])  # the perturbation is real


def test_routing_is_causal_for_fixed_membership(rng):
  """With membership fixed (keys only perturbed via v after t), outputs at <= t do not change."""
  q, k, v = _qkv(rng, 1, 2, 32, 8)
  mu = reference.layer_norm(rng.standard_normal((2, 4, 8))).astype(np.float32)
  before, _ = attention.routing_attention(q, k, v, mu, 8)
  after, _ = attention.routing_attention(q, k, _perturb_after(v, 10, rng), mu, 8)
  np.testing.assert_array_equal(before.numpy()[:, :, :11], after.numpy()[:, :, :11])


def _pointed_at_centroid(x, mu, t, rng):
  """x [b, h, n, d] with every position after t replaced by 3 mu[h, 0] (+ a little noise):
  those positions take centroid 0's best scores, so cluster memberships change."""
  x = x.copy()
  for h in range(x.shape[1]):
    x[:, h, t + 1:] = 3.0 * mu[h, 0] + 0.01 * rng.standard_normal(x[:, h, t + 1:].shape)
  return x


def _visible_keys(indices, n):
  """For every (b, h, query i): the tuple over the clusters holding i of the members <= i
  (what i attends to, in rank order); a query's output depends on nothing else."""
  b, h, c, _ = indices.shape
  out = np.empty((b, h, n), object)
  for bi in range(b):
    for hi in range(h):
      for i in range(n):
        out[bi, hi, i] = tuple(sorted(tuple(int(m) for m in indices[bi, hi, ci] if m <= i)
                                      for ci in range(c) if i in indices[bi, hi, ci]))
  return out


@pytest.mark.parametrize("share_qk", [True, False])
@pytest.mark.parametrize("t", [9, 20])
def test_topk_leak_is_exactly_the_membership_change(rng, share_qk, t):
  """routing_mode="topk" is not causal (docs/keras.md, routing_mode: "which past keys a query
  sees can depend on later tokens"): with future queries/keys moved onto one centroid, earlier
  queries leave or enter clusters. Measured: an earlier output changes if and only if the keys
  it sees change, and some do."""
  n, window = 32, 8
  q, k, v = (rng.standard_normal((2, 2, n, 8)).astype(np.float32) for _ in range(3))
  mu = reference.layer_norm(rng.standard_normal((2, 4, 8))).astype(np.float32)
  rel = tf.constant(rng.standard_normal((9, 8)).astype(np.float32))
  run = lambda q, k: attention.routing_attention(q, k, v, mu, window, share_qk=share_qk,
                                                 relative_keys=rel, relative_values=rel)
  before, aux_before = run(q, k)
  after, aux_after = run(_pointed_at_centroid(q, mu, t, rng), _pointed_at_centroid(k, mu, t, rng))
  seen = [_visible_keys(a["query_indices"].numpy(), n)[..., :t + 1]
          for a in (aux_before, aux_after)]
  moved = seen[0] != seen[1]
  change = np.abs(before.numpy() - after.numpy())[:, :, :t + 1].max(-1)
  assert moved.sum() >= 2  # the leak is there
  np.testing.assert_array_less(change[~moved], 1e-6)  # and nothing else leaks
  assert change.max() > 1e-2


@pytest.mark.parametrize("share_qk,relative", [(True, True), (False, False), (False, True)])
def test_causal_window_stays_causal_when_future_membership_changes(rng, share_qk, relative):
  """routing_mode="causal_window" with future queries/keys moved onto one centroid (their
  clusters and so every cluster's sorted order change): outputs at <= t stay the same."""
  n, window = 48, 8
  q, k, v = (rng.standard_normal((2, 2, n, 8)).astype(np.float32) for _ in range(3))
  mu = reference.layer_norm(rng.standard_normal((2, 3, 8))).astype(np.float32)
  rel = tf.constant(rng.standard_normal((9, 8)).astype(np.float32)) if relative else None
  run = lambda q, k, v: attention.causal_window_attention(
      q, k, v, mu, window, share_qk=share_qk, relative_keys=rel, relative_values=rel)
  before, aux_before = run(q, k, v)
  for t in (0, 17, 40):
    v_after = v.copy()
    v_after[:, :, t + 1:] = rng.standard_normal(v_after[:, :, t + 1:].shape)
    after, aux_after = run(_pointed_at_centroid(q, mu, t, rng),
                           _pointed_at_centroid(k, mu, t, rng), v_after)
    clusters = [a["query_clusters"].numpy() for a in (aux_before, aux_after)]
    assert np.mean(clusters[0][..., t + 1:] != clusters[1][..., t + 1:]) > 0.3
    np.testing.assert_array_equal(clusters[0][..., :t + 1], clusters[1][..., :t + 1])
    np.testing.assert_allclose(after.numpy()[:, :, :t + 1], before.numpy()[:, :, :t + 1],
                               atol=1e-6)
    assert np.abs(after.numpy()[:, :, t + 1:] - before.numpy()[:, :, t + 1:]).max() > 1e-2


def _layer_norm(x):
  mean = tf.reduce_mean(x, -1, keepdims=True)
  return (x - mean) * tf.math.rsqrt(tf.reduce_mean(tf.square(x - mean), -1, keepdims=True) +
                                    1e-6)


def _dense(q, k, v, allowed, distance=None, rel_k=None, rel_v=None):
  """Dense masked attention in TensorFlow (float64): q, k, v [b, h, n, d] (q scaled), allowed
  bool [b, h, n, m] (NumPy), distance int [b, h, n, m] into the Shaw tables (clipped)."""
  shape = tuple(q.shape.as_list()[:3]) + (k.shape[2],)
  allowed = tf.constant(np.broadcast_to(allowed, shape))
  logits = tf.einsum("bhid,bhjd->bhij", q, k)
  rows = None
  if rel_k is not None or rel_v is not None:
    radius = ((rel_k if rel_k is not None else rel_v).shape[0] - 1) // 2
    rows = np.clip(np.broadcast_to(distance, shape), -radius, radius) + radius
  if rel_k is not None:
    logits += tf.einsum("bhid,bhijd->bhij", q, tf.gather(rel_k, rows))
  probs = tf.nn.softmax(tf.where(allowed, logits, tf.constant(-1e30, logits.dtype)))
  probs *= tf.cast(tf.reduce_any(allowed, -1, keepdims=True), probs.dtype)  # empty rows: 0
  out = tf.einsum("bhij,bhjd->bhid", probs, v)
  if rel_v is not None:
    out += tf.einsum("bhij,bhijd->bhid", probs, tf.gather(rel_v, rows))
  return out


def _stack(per_head):
  """[[x of (b, h)] per h] per b -> array [b, h, ...]."""
  return np.array([[np.asarray(x) for x in row] for row in per_head])


def _dense_routing(q, k, v, mu, window, causal, share_qk, pad, rel_k, rel_v):
  """Dense routing (membership from reference.routing_pattern on the float64 inputs, then
  differentiable in q, k, v and the tables): sum over clusters / (count + 0.01)."""
  q_hat = _layer_norm(q)
  k_hat = q_hat if share_qk else _layer_norm(k)
  b, h, n, _ = q.shape
  patterns = [[reference.routing_pattern(q_hat.numpy()[bi, hi], k_hat.numpy()[bi, hi], mu[hi],
                                         window, causal, share_qk,
                                         None if pad is None else pad[bi])
               for hi in range(h)] for bi in range(b)]
  total, count = 0.0, 0.0
  for c in range(mu.shape[1]):
    in_q = _stack([[p[c][0] for p in row] for row in patterns])[..., np.newaxis]
    allowed = _stack([[p[c][1] for p in row] for row in patterns])
    distance = _stack([[p[c][2] for p in row] for row in patterns])
    total += tf.constant(in_q, tf.float64) * _dense(q_hat, k_hat, v, allowed, distance, rel_k,
                                                    rel_v)
    count += in_q.astype(np.float64)
  return total / tf.constant(count + 0.01)


def _dense_causal_window(q, k, v, mu, window, share_qk, rel_k, rel_v):
  q_hat = _layer_norm(q)
  k_hat = q_hat if share_qk else _layer_norm(k)
  clusters = np.einsum("hcd,bhnd->bhnc", mu, q_hat.numpy()).argmax(-1)
  patterns = [[reference.causal_window_pattern(a, window) for a in row] for row in clusters]
  allowed = _stack([[p[0] for p in row] for row in patterns])
  distance = _stack([[p[1] for p in row] for row in patterns])
  return _dense(q_hat, k_hat, v, allowed, distance, rel_k, rel_v)


# "_start_padded": the first 6 positions of the second sequence are padding, so its first
# queries have no allowed key (their probabilities must not reach later rows through the causal
# relative-value term). "full_attention_heads" (one causal block of the whole length) runs
# full.causal_full_attention's query blocks: 24 positions in 4 blocks of 6 with relative
# tables of radius 5, in 8 blocks of 3 without ("_no_tables").
GRADIENT_CASES = ["full", "full_noncausal_padded", "local", "local_noncausal_padded",
                  "local_start_padded", "full_attention_heads", "full_attention_heads_no_tables",
                  "full_attention_heads_start_padded", "routing", "routing_separate_keys",
                  "routing_noncausal_padded", "routing_start_padded", "causal_window",
                  "causal_window_separate_keys"]


@pytest.mark.parametrize("kind", GRADIENT_CASES)
def test_gradients_equal_the_dense_masked_reference(rng, kind):
  """d(sum(W * out)) / d(q, k, v, relative tables) in float64 against the same attention written
  densely (a softmax over an explicit [n, n] allowed set; routing membership held fixed, as it
  is piecewise constant), differentiated by TensorFlow."""
  b, h, n, d = 2, 2, 24, 8
  f64 = lambda x: tf.constant(x, tf.float64)
  q, k, v = (f64(rng.standard_normal((b, h, n, d))) for _ in range(3))
  rel_k, rel_v = (f64(rng.standard_normal((2 * 5 + 1, d)) * 0.5) for _ in range(2))
  mu = reference.layer_norm(rng.standard_normal((h, 3, d)))
  pad = np.arange(n)[None, :] >= np.array([[n], [n - 5]])
  if kind.endswith("start_padded"):
    pad = np.arange(n)[None, :] < np.array([[0], [6]])
  weights = f64(rng.standard_normal((b, h, n, d)))
  tri = np.tri(n, n, dtype=bool)
  relative = kind not in ("full", "full_noncausal_padded", "full_attention_heads_no_tables")

  def pair(q, k, v, rel_k, rel_v):
    """(ours, dense) outputs."""
    if kind == "full":
      return attention.full_attention(q, k, v), _dense(q * d ** -0.5, k, v, tri)
    if kind == "full_noncausal_padded":
      return (attention.full_attention(q, k, v, causal=False, padding=pad),
              _dense(q * d ** -0.5, k, v, ~pad[:, None, None, :]))
    if kind.startswith(("local", "full_attention_heads")):
      causal = kind != "local_noncausal_padded"
      block, flange = (n, 0) if kind.startswith("full_attention_heads") else (4, 8)
      padding = pad if kind.endswith("padded") else None
      allowed, distance = reference.local_pattern(n, block, flange, causal)
      allowed = allowed[None, None] & (True if padding is None else ~pad[:, None, None, :])
      if not relative:
        rel_k = rel_v = None
      return (attention.local_attention(q, k, v, block, flange, causal=causal, padding=padding,
                                        relative_keys=rel_k, relative_values=rel_v),
              _dense(q * d ** -0.5, k, v, allowed, distance, rel_k, rel_v))
    if kind.startswith("routing"):
      causal = kind != "routing_noncausal_padded"
      share_qk = kind == "routing"
      padding = pad if kind.endswith("padded") else None
      out, _ = attention.routing_attention(q, k, v, mu, 6, causal=causal, share_qk=share_qk,
                                           padding=padding, relative_keys=rel_k,
                                           relative_values=rel_v)
      return out, _dense_routing(q, k, v, mu, 6, causal, share_qk, padding, rel_k, rel_v)
    share_qk = kind == "causal_window"
    out, _ = attention.causal_window_attention(q, k, v, mu, 6, share_qk=share_qk,
                                               relative_keys=rel_k, relative_values=rel_v)
    return out, _dense_causal_window(q, k, v, mu, 6, share_qk, rel_k, rel_v)

  tensors = [q, k, v, rel_k, rel_v]
  with tf.GradientTape(persistent=True) as tape:
    tape.watch(tensors)
    ours, dense = pair(*tensors)
    losses = [tf.reduce_sum(weights * ours), tf.reduce_sum(weights * dense)]
  np.testing.assert_allclose(ours.numpy(), dense.numpy(), rtol=1e-9, atol=1e-11)
  grads = [tape.gradient(loss, tensors) for loss in losses]
  names = ["q", "k", "v", "relative_keys", "relative_values"]
  for name, got, want in zip(names, *grads):
    unused = (name == "k" and kind in ("routing", "causal_window")) or (
        name.startswith("relative") and not relative)
    if unused:  # share_qk: keys are the queries; full attention has no tables
      assert got is None and want is None, name
      continue
    got, want = tf.convert_to_tensor(got).numpy(), tf.convert_to_tensor(want).numpy()
    assert np.abs(want).max() > 1e-3, name
    np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-10, err_msg=name)


def test_commitment_loss_gradient_equals_the_dense_reference(rng):
  """d commitment_loss / d(q, k) (separate keys, padding): mean over real positions, heads and
  depth of (x_hat - mu[argmax])^2, queries and keys averaged."""
  b, h, n, d = 2, 2, 16, 8
  q, k, v = (tf.constant(rng.standard_normal((b, h, n, d)), tf.float64) for _ in range(3))
  mu = reference.layer_norm(rng.standard_normal((h, 4, d)))
  pad = np.arange(n)[None, :] >= np.array([[n], [n - 3]])
  real = tf.constant((1.0 - pad)[:, None, :, None])
  with tf.GradientTape(persistent=True) as tape:
    tape.watch([q, k])
    _, aux = attention.routing_attention(q, k, v, mu, 4, causal=False, share_qk=False,
                                         padding=pad)
    dense = 0.0
    for x in (q, k):
      x_hat = _layer_norm(x)
      assigned = np.einsum("hcd,bhnd->bhnc", mu, x_hat.numpy()).argmax(-1)
      centroid = mu[np.arange(h)[None, :, None], assigned]  # [b, h, n, d]
      dense += 0.5 * tf.reduce_sum(real * tf.square(x_hat - centroid)) / (
          float(np.sum(1.0 - pad)) * h * d)
  np.testing.assert_allclose(aux["commitment_loss"].numpy(), dense.numpy(), rtol=1e-5)
  for x in (q, k):
    np.testing.assert_allclose(tape.gradient(aux["commitment_loss"], x).numpy(),
                               tape.gradient(dense, x).numpy(), rtol=1e-5, atol=1e-9)


def test_commitment_loss_gradient_reaches_queries(rng):
  q, k, v = _qkv(rng, 1, 2, 16, 8)
  mu = tf.constant(reference.layer_norm(rng.standard_normal((2, 4, 8))).astype(np.float32))
  with tf.GradientTape() as tape:
    tape.watch([q, mu])
    _, aux = attention.routing_attention(q, k, v, mu, 4)
    loss = aux["commitment_loss"]
  g_q, g_mu = tape.gradient(loss, [q, mu])
  assert np.abs(g_q.numpy()).max() > 0
  assert g_mu is None or np.abs(g_mu.numpy()).max() == 0  # centroids are stop-gradient here


@pytest.mark.parametrize("kind", ["local", "routing", "routing_noncausal"])
def test_xla_forward_backward_matches(rng, kind):
  q, k, v = _qkv(rng, 2, 2, 32, 8)
  rel = tf.constant(rng.standard_normal((9, 8)).astype(np.float32))
  mu = tf.constant(reference.layer_norm(rng.standard_normal((2, 4, 8))).astype(np.float32))
  pad = tf.constant(np.arange(32)[None, :] >= np.array([[32], [27]]))

  def step(q, k, v):
    with tf.GradientTape() as tape:
      tape.watch([q, k, v])
      if kind == "local":
        out = attention.local_attention(q, k, v, 8, 8, relative_keys=rel, relative_values=rel,
                                        padding=pad)
        extra = 0.0
      else:
        causal = kind == "routing"
        out, aux = attention.routing_attention(q, k, v, mu, 8, causal=causal, share_qk=causal,
                                               padding=pad, relative_keys=rel,
                                               relative_values=rel)
        extra = aux["commitment_loss"]
      loss = tf.reduce_sum(tf.square(out)) + extra
    return [out, loss] + tape.gradient(loss, [q, v])

  eager = step(q, k, v)
  compiled = tf.function(step, jit_compile=True)(q, k, v)
  for a, b in zip(eager, compiled):
    np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-4, rtol=1e-4)


BAD_LOCAL = [
    (dict(n=30, block=4, flange=4), "multiple of block_length"),
    (dict(n=32, block=4, flange=6), "flange"),
    (dict(n=32, block=0, flange=0), "block_length"),
]


@pytest.mark.parametrize("args,message", BAD_LOCAL)
def test_local_bad_arguments(rng, args, message):
  q, k, v = _qkv(rng, 1, 2, args["n"], 8)
  with pytest.raises(ValueError, match=message):
    attention.local_attention(q, k, v, args["block"], args["flange"])


def test_routing_bad_arguments(rng):
  q, k, v = _qkv(rng, 1, 2, 16, 8)
  mu = tf.zeros([2, 4, 8])
  with pytest.raises(ValueError, match="window 32 must be in"):
    attention.routing_attention(q, k, v, mu, 32)
  with pytest.raises(ValueError, match="centroids must have shape"):
    attention.routing_attention(q, k, v, tf.zeros([2, 4, 6]), 4)
  with pytest.raises(ValueError, match="relative_keys must have shape"):
    attention.routing_attention(q, k, v, mu, 4, relative_keys=tf.zeros([8, 8]))


def test_rank_and_depth_mismatch(rng):
  q, k, v = _qkv(rng, 1, 2, 16, 8)
  with pytest.raises(ValueError, match="rank 4"):
    attention.full_attention(q[0], k[0], v[0])
  with pytest.raises(ValueError, match="q depth 8 differs from k depth 4"):
    attention.local_attention(q, k[..., :4], v, 4, 4)
  with pytest.raises(ValueError, match="padding must have shape"):
    attention.local_attention(q, k, v, 4, 4, padding=tf.zeros([1, 15]))
