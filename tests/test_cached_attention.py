"""Cached (one-position) attention steps against the whole-sequence attention functions, and
strictly causal routing against its dense reference: the core alone, no Tensor2Tensor (runs in
both virtualenvs, `make test` and `make test-current`). The model-level cached decoding against
the full forward pass is in test_decoding.py / test_causal_window.py (T2T models)."""
import numpy as np
import pytest
import tensorflow as tf

import oracles
import reference
from routing_transformer.core.attention import causal_window as cw
from routing_transformer.core.attention import common
from routing_transformer.core.attention import incremental
from routing_transformer.core.attention import local
from routing_transformer.core.attention import routing


def qkv(rng, b=2, h=2, n=32, d=8):
  return [tf.constant(rng.standard_normal((b, h, n, d)), tf.float32) for _ in range(3)]


def tables(rng, d=8, radius=4):
  return [tf.constant(rng.standard_normal((2 * radius + 1, d)), tf.float32) for _ in range(2)]


@pytest.mark.parametrize("causal", [True, False])
def test_local_step_equals_local_attention_at_every_position(rng, causal):
  q, k, v = qkv(rng)
  rel_k, rel_v = tables(rng)
  padding = None if causal else tf.constant(np.arange(32)[None, :] >= [[32], [27]])
  full = local.local_attention(q, k, v, 8, 16, causal=causal, relative_keys=rel_k,
                               relative_values=rel_v, padding=padding)
  steps = [incremental.local_attention_step(q[:, :, t:t + 1], k, v, tf.constant(t), 8, 16,
                                            causal=causal, relative_keys=rel_k,
                                            relative_values=rel_v, padding=padding)
           for t in range(32)]
  np.testing.assert_allclose(tf.concat(steps, 2).numpy(), full.numpy(), atol=1e-5)


@pytest.mark.parametrize("share_qk,extensions", [
    (True, {}), (False, {}), (True, dict(exclude_self=True, logit_scale=[0.3, 2.0]))])
def test_routing_step_equals_the_prefix_rule_at_every_position(rng, share_qk, extensions):
  q, k, v = qkv(rng)
  rel_k, rel_v = tables(rng)
  mu = tf.constant(rng.standard_normal((2, 4, 8)), tf.float32)
  reference = oracles.prefix_routing_attention(q, k, v, mu, 8, share_qk=share_qk,
                                               relative_keys=rel_k, relative_values=rel_v,
                                               **extensions)
  q_hat = common.layer_norm_no_scale(q)
  k_hat = q_hat if share_qk else common.layer_norm_no_scale(k)
  scores = routing.centroid_scores(q_hat, mu)
  # Cache slots after t hold garbage on purpose: the step must ignore them.
  steps = []
  for t in range(32):
    future = tf.range(32)[tf.newaxis, tf.newaxis, :, tf.newaxis] > t
    noisy_k = tf.where(future, 100.0, k_hat)
    noisy_scores = tf.where(tf.range(32) > t, 1e3, scores)
    steps.append(incremental.routing_attention_step(q_hat[:, :, t:t + 1], noisy_k, v,
                                                    noisy_scores, tf.constant(t), 8, rel_k, rel_v,
                                                    **extensions))
  np.testing.assert_allclose(tf.concat(steps, 2).numpy(), reference.numpy(), atol=1e-5)


def test_prefix_rule_at_the_last_position_is_paper_routing(rng):
  q, k, v = qkv(rng)
  mu = tf.constant(rng.standard_normal((2, 4, 8)), tf.float32)
  prefix = oracles.prefix_routing_attention(q, k, v, mu, 8)
  full, _ = routing.routing_attention(q, k, v, mu, 8)
  np.testing.assert_allclose(prefix[:, :, -1].numpy(), full[:, :, -1].numpy(), atol=1e-6)


@pytest.mark.parametrize("axis", [2, 3])
def test_write_cache_replaces_exactly_one_slice(rng, axis):
  cache = rng.standard_normal((2, 3, 5, 6)).astype(np.float32)
  shape = list(cache.shape)
  shape[axis] = 1
  value = rng.standard_normal(shape).astype(np.float32)
  out = incremental.write_cache(tf.constant(cache), tf.constant(value), tf.constant(2),
                                axis=axis).numpy()
  expected = cache.copy()
  index = [slice(None)] * 4
  index[axis] = slice(2, 3)
  expected[tuple(index)] = value
  np.testing.assert_array_equal(out, expected)



def inputs(rng, n, depth=8, clusters=3, heads=2):
  q, k, v = [rng.standard_normal((2, heads, n, depth)).astype(np.float32) for _ in range(3)]
  mu = rng.standard_normal((heads, clusters, depth)).astype(np.float32)
  rel = [rng.standard_normal((9, depth)).astype(np.float32) for _ in range(2)]
  return q, k, v, mu, rel


@pytest.mark.parametrize("n,window,clusters,share_qk,pad_last,relative", [
    (32, 8, 4, True, 0, False),
    (30, 8, 3, False, 0, True),   # n not a multiple of the window
    (32, 4, 2, True, 5, True),    # padding
    (64, 16, 4, True, 0, True),
    (24, 24, 1, True, 0, False),  # one cluster, window = n: dense causal attention
])
@pytest.mark.parametrize("extensions", [{}, dict(exclude_self=True, logit_scale=[0.4, 1.7])])
def test_matches_dense_reference(rng, n, window, clusters, share_qk, pad_last, relative,
                                 extensions):
  q, k, v, mu, (rel_k, rel_v) = inputs(rng, n, clusters=clusters)
  rel_k, rel_v = (rel_k, rel_v) if relative else (None, None)
  padding = None
  if pad_last:
    padding = np.zeros((2, n), bool)
    padding[1, -pad_last:] = True
  out, aux = cw.causal_window_attention(q, k, v, mu, window, share_qk=share_qk,
                                        padding=padding, relative_keys=rel_k,
                                        relative_values=rel_v, **extensions)
  expected, clusters_ref = reference.causal_window(q, k, v, mu, window, share_qk=share_qk,
                                                   padding=padding, rel_k=rel_k, rel_v=rel_v,
                                                   **extensions)
  real = np.ones((2, n), bool) if padding is None else ~padding
  mask = real[:, None, :, None]  # outputs at padding positions are not defined
  np.testing.assert_allclose(np.where(mask, out.numpy(), 0), np.where(mask, expected, 0),
                             atol=1e-5)
  np.testing.assert_array_equal(aux["query_clusters"].numpy(), clusters_ref)
  assert np.isfinite(aux["commitment_loss"].numpy())


def test_is_strictly_causal_and_xla_compiles(rng):
  q, k, v, mu, (rel_k, rel_v) = inputs(rng, 48)
  fn = lambda q, k, v: cw.causal_window_attention(q, k, v, mu, 8, relative_keys=rel_k,
                                                  relative_values=rel_v)[0]
  out = fn(q, k, v).numpy()
  for t in (0, 17, 40):
    changed = [x.copy() for x in (q, k, v)]
    for x in changed:
      x[:, :, t + 1:] = rng.standard_normal(x[:, :, t + 1:].shape)
    np.testing.assert_allclose(fn(*changed).numpy()[:, :, :t + 1], out[:, :, :t + 1], atol=1e-6)
  xla = tf.function(fn, jit_compile=True)(q, k, v).numpy()
  np.testing.assert_allclose(xla, out, atol=1e-5)


@pytest.mark.parametrize("share_qk,extensions", [
    (True, {}), (False, {}), (True, dict(exclude_self=True, logit_scale=[0.4, 1.7]))])
def test_cached_step_equals_full_attention_at_every_position(rng, share_qk, extensions):
  q, k, v, mu, (rel_k, rel_v) = inputs(rng, 40)
  full, _ = cw.causal_window_attention(q, k, v, mu, 8, share_qk=share_qk, relative_keys=rel_k,
                                       relative_values=rel_v, **extensions)
  q_hat = common.layer_norm_no_scale(q)
  k_hat = q_hat if share_qk else common.layer_norm_no_scale(k)
  cache = incremental.causal_window_cache(2, 2, 3, 8, 8)
  steps = []
  for t in range(40):
    out, cache = incremental.causal_window_step(q_hat[:, :, t:t + 1], k_hat[:, :, t:t + 1],
                                                v[:, :, t:t + 1], mu, cache, rel_k, rel_v,
                                                **extensions)
    steps.append(out)
  np.testing.assert_allclose(tf.concat(steps, 2).numpy(), full.numpy(), atol=1e-5)
  np.testing.assert_array_equal(cache["counts"].numpy().sum(-1), np.full((2, 2), 40))
