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


def _grads(fn, tensors):
  with tf.GradientTape() as tape:
    tape.watch(tensors)
    out = fn(*tensors)
    loss = tf.reduce_sum(out * tf.cos(out))
  return tape.gradient(loss, tensors)


@pytest.mark.parametrize("kind", ["full", "local", "routing", "routing_nonshared_noncausal"])
def test_gradients_finite_and_nonzero(rng, kind):
  q, k, v = _qkv(rng, 2, 2, 16, 8)
  rel_k = tf.constant(rng.standard_normal((9, 8)).astype(np.float32))
  rel_v = tf.constant(rng.standard_normal((9, 8)).astype(np.float32))
  mu = tf.constant(reference.layer_norm(rng.standard_normal((2, 4, 8))).astype(np.float32))

  def fn(q, k, v, rel_k, rel_v):
    if kind == "full":
      return attention.full_attention(q, k, v) + 0.0 * (rel_k[0, 0] + rel_v[0, 0])
    if kind == "local":
      return attention.local_attention(q, k, v, 4, 4, relative_keys=rel_k, relative_values=rel_v)
    causal = kind == "routing"
    out, aux = attention.routing_attention(q, k, v, mu, 4, causal=causal, share_qk=causal,
                                           relative_keys=rel_k, relative_values=rel_v)
    return out + aux["commitment_loss"]

  tensors = [q, k, v, rel_k, rel_v]
  grads = _grads(fn, tensors)
  names = ["q", "k", "v", "relative_keys", "relative_values"]
  for name, g in zip(names, grads):
    if kind == "full" and name.startswith("relative"):
      continue
    if kind == "routing" and name == "k":  # share_qk: k is not used
      assert g is None
      continue
    assert g is not None, name
    g = tf.convert_to_tensor(g)
    assert np.all(np.isfinite(g.numpy())), name
    assert np.abs(g.numpy()).max() > 0, name


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
