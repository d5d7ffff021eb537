"""legacy_causal_key_routing: the original release's causal routing with share_qk=False (keys and
values picked by the keys' own centroid scores, rank-triangle mask), checked against a NumPy
rendering of its utils.py rule (reference.original_causal_routing)."""
import numpy as np
import pytest
import tensorflow as tf

import reference
from routing_transformer.core import attention

B, H, N, D, C, W, R = 2, 2, 48, 8, 4, 16, 5


def inputs(rng):
  q, k, v = (rng.normal(size=(B, H, N, D)).astype(np.float32) for _ in range(3))
  mu = reference.layer_norm(rng.normal(size=(H, C, D))).astype(np.float32)
  rel_k, rel_v = (rng.normal(size=(2 * R + 1, D)).astype(np.float32) * 0.3 for _ in range(2))
  return q, k, v, mu, rel_k, rel_v


def routed(q, k, v, mu, rel_k, rel_v, **kwargs):
  out, aux = attention.routing_attention(q, k, v, mu, W, relative_keys=rel_k,
                                         relative_values=rel_v, **kwargs)
  return out.numpy(), aux


def test_legacy_rule_equals_numpy_rendering_of_the_original(rng):
  q, k, v, mu, rel_k, rel_v = inputs(rng)
  ours, aux = routed(q, k, v, mu, rel_k, rel_v, causal=True, share_qk=False,
                     legacy_causal_key_routing=True)
  want = reference.original_causal_routing(q.astype(np.float64), k.astype(np.float64),
                                           v.astype(np.float64), mu.astype(np.float64), W,
                                           rel_k, rel_v)
  np.testing.assert_allclose(ours, want, rtol=1e-4, atol=1e-5)
  # The key lists really differ from the query lists, so the test exercises the legacy rule.
  assert np.mean(aux["key_indices"].numpy() != aux["query_indices"].numpy()) > 0.3


def test_default_rule_differs_from_the_original_with_separate_keys(rng):
  q, k, v, mu, rel_k, rel_v = inputs(rng)
  ours, _ = routed(q, k, v, mu, rel_k, rel_v, causal=True, share_qk=False)
  want = reference.original_causal_routing(q, k, v, mu, W, rel_k, rel_v)
  assert np.abs(ours - want).max() > 0.05
  spec, _, _ = reference.routing(q, k, v, mu, W, causal=True, share_qk=False, rel_k=rel_k,
                                 rel_v=rel_v)  # Algorithm 1: key members = query members
  np.testing.assert_allclose(ours, spec, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal,share_qk", [(True, True), (False, False), (False, True)])
def test_legacy_switch_changes_nothing_else(rng, causal, share_qk):
  q, k, v, mu, rel_k, rel_v = inputs(rng)
  off, _ = routed(q, k, v, mu, rel_k, rel_v, causal=causal, share_qk=share_qk)
  on, _ = routed(q, k, v, mu, rel_k, rel_v, causal=causal, share_qk=share_qk,
                 legacy_causal_key_routing=True)
  np.testing.assert_array_equal(on, off)


def test_legacy_rule_compiles_with_xla(rng):
  q, k, v, mu, rel_k, rel_v = inputs(rng)
  fn = tf.function(lambda *a: attention.routing_attention(
      *a, W, causal=True, share_qk=False, relative_keys=rel_k, relative_values=rel_v,
      legacy_causal_key_routing=True)[0], jit_compile=True)
  eager, _ = routed(q, k, v, mu, rel_k, rel_v, causal=True, share_qk=False,
                    legacy_causal_key_routing=True)
  np.testing.assert_allclose(fn(q, k, v, mu).numpy(), eager, rtol=1e-4, atol=1e-5)


def test_off_in_every_set_and_refused_where_it_cannot_apply():
  import hparams  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
  from routing_transformer.core import decoding  # pylint: disable=g-import-not-at-top
  from routing_transformer.t2t import model as model_lib  # pylint: disable=g-import-not-at-top
  for name in hparams.PROJECT_SETS:
    h = registry.hparams(name)
    assert h.legacy_causal_key_routing is False, name
  h = registry.hparams("pg19_local_cluster8k")
  decoding.check_cached_decoding(h)  # share_qk=True: cached decoding is exact
  h.share_qk, h.legacy_causal_key_routing = False, True
  model_lib.check_hparams(h)
  with pytest.raises(decoding.DecodeError, match="--hparams=fast_decode=False"):
    decoding.check_cached_decoding(h)
  h.routing_mode = "causal_window"
  with pytest.raises(model_lib.HParamsError, match="use it with routing_mode='topk'"):
    model_lib.check_hparams(h)
