"""Strictly causal routing (routing_mode="causal_window") in the T2T model: exact cached decoding,
strict causality of the whole model, and the documented non-causality of "topk" (the attention
function against its dense reference, XLA and its cached steps: test_cached_attention.py)."""
import numpy as np
import pytest
import tensorflow as tf

import routing_transformer  # pylint: disable=unused-import
from routing_transformer.core import decoding
from routing_transformer.t2t import model as model_lib
from test_decoding import make_model, session_run
from test_model import VOCAB, small_hparams

tf1 = tf.compat.v1


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
