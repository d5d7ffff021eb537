"""Every attention kind equals the NumPy dense masked reference on random inputs."""
import numpy as np
import pytest
import tensorflow as tf

from routing_transformer.core import attention
import reference

ATOL = 2e-4


def _qkv(rng, b, h, n, d):
  return [rng.standard_normal((b, h, n, d)).astype(np.float32) for _ in range(3)]


def _padding(rng, b, n):
  pad = np.zeros((b, n), bool)
  for i in range(b):
    pad[i, n - rng.integers(1, n // 4 + 1):] = True  # trailing padding of different lengths
  return pad


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("with_padding", [False, True])
def test_full_attention(rng, causal, with_padding):
  q, k, v = _qkv(rng, 2, 3, 12, 8)
  pad = _padding(rng, 2, 12) if with_padding else None
  got = attention.full_attention(q, k, v, causal=causal, padding=pad).numpy()
  np.testing.assert_allclose(got, reference.full(q, k, v, causal, pad), atol=ATOL)


LOCAL_CASES = [
    # b, h, n, d, block, flange
    (2, 2, 16, 8, 4, 4),
    (1, 3, 24, 4, 4, 8),
    (2, 1, 32, 8, 8, 0),
    (1, 2, 16, 8, 16, 0),   # one block: local == full
    (2, 2, 20, 6, 5, 10),
]


@pytest.mark.parametrize("b,h,n,d,block,flange", LOCAL_CASES)
@pytest.mark.parametrize("causal", [True, False])
def test_local_attention(rng, b, h, n, d, block, flange, causal):
  q, k, v = _qkv(rng, b, h, n, d)
  got = attention.local_attention(q, k, v, block, flange, causal=causal).numpy()
  want = reference.local(q, k, v, block, flange, causal)
  np.testing.assert_allclose(got, want, atol=ATOL)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("radius", [2, 6, 40])
def test_local_attention_relative_and_padding(rng, causal, radius):
  b, h, n, d, block, flange = 2, 2, 24, 8, 4, 8
  q, k, v = _qkv(rng, b, h, n, d)
  rel_k = rng.standard_normal((2 * radius + 1, d)).astype(np.float32)
  rel_v = rng.standard_normal((2 * radius + 1, d)).astype(np.float32)
  pad = _padding(rng, b, n)
  got = attention.local_attention(q, k, v, block, flange, causal=causal, relative_keys=rel_k,
                                  relative_values=rel_v, padding=pad).numpy()
  want = reference.local(q, k, v, block, flange, causal, rel_k, rel_v, pad)
  np.testing.assert_allclose(got, want, atol=ATOL)


def test_local_single_block_equals_full(rng):
  q, k, v = _qkv(rng, 1, 2, 16, 8)
  got = attention.local_attention(q, k, v, 16, 0).numpy()
  np.testing.assert_allclose(got, attention.full_attention(q, k, v).numpy(), atol=ATOL)


ROUTING_CASES = [
    # b, h, n, d, clusters, window
    (2, 2, 16, 8, 4, 4),    # k * w == n
    (1, 3, 32, 4, 8, 8),    # overlapping clusters: k * w > n
    (2, 2, 32, 8, 2, 4),    # sparse coverage: k * w < n, many tokens in no cluster
    (1, 2, 12, 8, 3, 12),   # window == length
]


@pytest.mark.parametrize("b,h,n,d,clusters,window", ROUTING_CASES)
@pytest.mark.parametrize("causal,share_qk", [(True, True), (True, False), (False, True),
                                             (False, False)])
def test_routing_attention(rng, b, h, n, d, clusters, window, causal, share_qk):
  q, k, v = _qkv(rng, b, h, n, d)
  mu = reference.layer_norm(rng.standard_normal((h, clusters, d))).astype(np.float32)
  got, aux = attention.routing_attention(q, k, v, mu, window, causal=causal, share_qk=share_qk)
  want, clusters_want, loss_want = reference.routing(q, k, v, mu, window, causal, share_qk)
  np.testing.assert_allclose(got.numpy(), want, atol=ATOL)
  np.testing.assert_array_equal(aux["query_clusters"].numpy(), clusters_want)
  np.testing.assert_allclose(aux["commitment_loss"].numpy(), loss_want, rtol=1e-4)
  if clusters * window < n:  # tokens in no cluster get exactly 0 from routing heads
    assert np.any(np.all(got.numpy() == 0.0, axis=-1))


@pytest.mark.parametrize("causal,share_qk", [(True, True), (False, False)])
def test_routing_attention_relative_and_padding(rng, causal, share_qk):
  b, h, n, d, clusters, window = 2, 2, 24, 8, 4, 8
  q, k, v = _qkv(rng, b, h, n, d)
  mu = reference.layer_norm(rng.standard_normal((h, clusters, d))).astype(np.float32)
  rel_k = rng.standard_normal((7, d)).astype(np.float32)
  rel_v = rng.standard_normal((7, d)).astype(np.float32)
  pad = _padding(rng, b, n)
  got, aux = attention.routing_attention(q, k, v, mu, window, causal=causal, share_qk=share_qk,
                                         padding=pad, relative_keys=rel_k, relative_values=rel_v)
  want, _, loss_want = reference.routing(q, k, v, mu, window, causal, share_qk, pad, rel_k, rel_v)
  np.testing.assert_allclose(got.numpy(), want, atol=ATOL)
  np.testing.assert_allclose(aux["commitment_loss"].numpy(), loss_want, rtol=1e-4)
  # padding positions carry no k-means statistics
  np.testing.assert_array_equal(aux["weights"].numpy(), 1.0 - pad)


@pytest.mark.parametrize("causal,share_qk", [(True, True), (True, False), (False, True),
                                             (False, False)])
@pytest.mark.parametrize("exclude_self,logit_scale", [(True, None), (False, "heads"),
                                                      (True, 0.35)])
def test_routing_attention_extensions(rng, causal, share_qk, exclude_self, logit_scale):
  """routing_exclude_self / routing_logit_scale against the dense reference, with padding and
  relative positions (the first member of a causal cluster keeps itself: nothing else)."""
  b, h, n, d, clusters, window = 2, 3, 24, 8, 4, 8
  q, k, v = _qkv(rng, b, h, n, d)
  mu = reference.layer_norm(rng.standard_normal((h, clusters, d))).astype(np.float32)
  rel_k = rng.standard_normal((7, d)).astype(np.float32)
  rel_v = rng.standard_normal((7, d)).astype(np.float32)
  pad = _padding(rng, b, n)
  scale = np.array([0.2, 0.5, 1.5], np.float32) if logit_scale == "heads" else logit_scale
  got, _ = attention.routing_attention(q, k, v, mu, window, causal=causal, share_qk=share_qk,
                                       padding=pad, relative_keys=rel_k, relative_values=rel_v,
                                       exclude_self=exclude_self, logit_scale=scale)
  want, _, _ = reference.routing(q, k, v, mu, window, causal, share_qk, pad, rel_k, rel_v,
                                 exclude_self=exclude_self, logit_scale=scale)
  np.testing.assert_allclose(got.numpy(), want, atol=ATOL)
  plain, _ = attention.routing_attention(q, k, v, mu, window, causal=causal, share_qk=share_qk,
                                         padding=pad, relative_keys=rel_k, relative_values=rel_v)
  assert np.abs(got.numpy() - plain.numpy()).max() > 1e-2  # the switch changes the function


def test_exclude_self_keeps_a_lonely_query_on_itself():
  allowed = tf.constant([[True, False, False], [True, True, False], [False, False, False]])
  is_self = tf.eye(3, dtype=tf.bool)
  got = attention.common.exclude_self(allowed, is_self).numpy()
  np.testing.assert_array_equal(got, [[True, False, False], [True, False, False],
                                      [False, False, False]])


def test_routing_one_cluster_is_full_attention_on_normalised_vectors(rng):
  q, k, v = _qkv(rng, 1, 2, 16, 8)
  mu = reference.layer_norm(rng.standard_normal((2, 1, 8))).astype(np.float32)
  got, _ = attention.routing_attention(q, k, v, mu, 16)
  q_hat = reference.layer_norm(q).astype(np.float32)
  want = attention.full_attention(q_hat, q_hat, v, scale=1.0).numpy() / (1.0 + 1e-2)
  np.testing.assert_allclose(got.numpy(), want, atol=ATOL)


def test_routing_members_are_sorted_and_balanced(rng):
  q, k, v = _qkv(rng, 2, 2, 32, 8)
  mu = reference.layer_norm(rng.standard_normal((2, 4, 8))).astype(np.float32)
  _, aux = attention.routing_attention(q, k, v, mu, 8)
  idx = aux["query_indices"].numpy()
  assert idx.shape == (2, 2, 4, 8)
  assert np.all(np.diff(idx, axis=-1) > 0)


def test_graph_mode(rng):
  q, k, v = _qkv(rng, 1, 2, 16, 8)
  mu = reference.layer_norm(rng.standard_normal((2, 4, 8))).astype(np.float32)
  with tf.Graph().as_default():
    out, _ = attention.routing_attention(tf.constant(q), tf.constant(k), tf.constant(v), mu, 4)
    local = attention.local_attention(tf.constant(q), tf.constant(k), tf.constant(v), 4, 4)
    with tf.compat.v1.Session() as sess:
      got, got_local = sess.run([out, local])
  np.testing.assert_allclose(got, reference.routing(q, k, v, mu, 4)[0], atol=ATOL)
  np.testing.assert_allclose(got_local, reference.local(q, k, v, 4, 4), atol=ATOL)
