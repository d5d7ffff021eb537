"""Strictly causal routing (routing_mode="causal_window"): dense reference, XLA, exact cached
decoding, strict causality of the whole model, and the documented non-causality of "topk"."""
import numpy as np
import pytest
import tensorflow as tf

import reference
import routing_transformer  # pylint: disable=unused-import
from routing_transformer.core import decoding
from routing_transformer.t2t import model as model_lib
from routing_transformer.core.attention import causal_window as cw
from routing_transformer.core.attention import common
from routing_transformer.core.attention import incremental
from test_decoding import make_model, session_run
from test_model import VOCAB, small_hparams

tf1 = tf.compat.v1


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


def causal_hparams(mode, **overrides):
  # Routing heads in every layer (sparsity_skip_first=0); clusters * window < length is fine
  # for causal_window (every position is in exactly one cluster).
  settings = dict(routing_mode=mode, sparsity_skip_first=0, sparsity_cluster_size=3,
                  sparsity_cluster_attention_window=8)
  settings.update(overrides)
  return small_hparams(**settings)


@pytest.mark.parametrize("overrides", [{}, {"share_qk": False}, {
    "routing_exclude_self": True, "routing_logit_scale": "learned"}])
def test_cached_decoding_equals_the_full_forward_pass_exactly(rng, overrides):
  tokens = rng.integers(2, VOCAB, (2, 64)).astype(np.int32)
  with tf.Graph().as_default():
    tf1.set_random_seed(7)
    model = make_model(causal_hparams("causal_window", **overrides))
    full, _ = model({"targets": tokens[:, :, None, None]})
    cached = decoding.sample_loop(model, {"inputs": tf.constant(tokens)}, 4, return_logits=True)
    full, cached = session_run([full, cached["logits"]])
  np.testing.assert_allclose(cached, full[:, :, 0, 0], atol=2e-5, rtol=1e-5)


def later_token_influence(mode, rng, cut=40):
  """Max change of the logits at positions <= cut when tokens after `cut` change."""
  tokens = rng.integers(2, VOCAB, (2, 64)).astype(np.int32)
  changed = tokens.copy()
  changed[:, cut + 1:] = rng.integers(2, VOCAB, (2, 64 - cut - 1))
  with tf.Graph().as_default():
    tf1.set_random_seed(11)
    # topk needs clusters * window >= length (8 x 8 = 64).
    model = make_model(causal_hparams(mode, sparsity_cluster_size=8))
    ids = tf1.placeholder(tf.int32, [2, 64, 1, 1])
    logits, _ = model({"targets": ids})
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      before = sess.run(logits, {ids: tokens[:, :, None, None]})
      after = sess.run(logits, {ids: changed[:, :, None, None]})
  return np.abs(before[:, :cut + 1] - after[:, :cut + 1]).max()


def test_causal_window_model_is_strictly_causal(rng):
  assert later_token_influence("causal_window", rng) < 1e-5


def test_topk_routing_is_not_strictly_causal(rng):
  """Documents the difference: in paper routing a later token changes which keys an earlier
  query sees (its cluster's top-k is taken over the whole sequence)."""
  assert later_token_influence("topk", rng) > 1e-3


def test_causal_window_hparams_pass_checks_with_few_clusters():
  hparams = causal_hparams("causal_window")
  model_lib.check_hparams(hparams)  # 3 clusters x window 8 < length 64 is fine here
  hparams.routing_mode = "topk"
  with pytest.raises(model_lib.HParamsError, match="sparsity_cluster_size"):
    model_lib.check_hparams(hparams)
  hparams.routing_mode = "lsh"
  with pytest.raises(model_lib.HParamsError, match="routing_mode='lsh'"):
    model_lib.check_hparams(hparams)
