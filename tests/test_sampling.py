"""Sampling: nucleus stays inside the top-p set, top-k keeps exactly k per row, greedy, errors."""
import numpy as np
import pytest
import tensorflow as tf

from routing_transformer.core import sampling


def _probs(logits):
  e = np.exp(logits - logits.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _nucleus_set(logits, p):
  """Reference: smallest most-likely prefix whose mass reaches p (by sorted order)."""
  if p >= 1.0:
    return set(range(logits.shape[-1]))
  probs = _probs(logits.astype(np.float64))
  order = np.argsort(-probs, kind="stable")
  keep, mass = [], 0.0
  for i in order:
    if mass >= p:
      break
    keep.append(i)
    mass += probs[i]
  return set(keep)


def test_nucleus_never_leaves_the_top_p_set():
  logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05],
                            [0.05, 0.05, 0.1, 0.8],
                            [0.25, 0.25, 0.25, 0.25]], np.float32))
  # p = 0.78 keeps every cumulative mass at least 0.02 away from p, so float32 rounding of the
  # softmax on any CPU cannot move a token across the boundary (0.5 + 0.3 == 0.8 exactly would).
  top_p = 0.78
  draws = sampling.sample(np.repeat(logits, 400, axis=0), top_p=top_p, seed=3).numpy()
  draws = draws.reshape(3, 400)
  for row, p_logits in enumerate(logits):
    allowed = _nucleus_set(p_logits, top_p)
    assert set(draws[row].tolist()) <= allowed, (row, allowed, set(draws[row].tolist()))
    assert set(draws[row].tolist()) == allowed  # and every allowed token does occur
  assert _nucleus_set(logits[0], top_p) == {0, 1}
  assert _nucleus_set(logits[1], top_p) == {3}
  assert _nucleus_set(logits[2], top_p) == {0, 1, 2, 3}


def test_nucleus_filter_matches_reference_on_random_rows():
  rng = np.random.default_rng(0)
  logits = rng.standard_normal((16, 50)).astype(np.float32) * 3
  for p in (0.1, 0.5, 0.9, 1.0):
    kept = sampling.nucleus_filter(logits, p).numpy() > -1e30
    for row in range(16):
      assert set(np.nonzero(kept[row])[0].tolist()) == _nucleus_set(logits[row], p)


def test_top_k_keeps_exactly_k_per_row_with_different_rows():
  rng = np.random.default_rng(1)
  logits = rng.standard_normal((5, 30)).astype(np.float32)
  logits[2] = 0.0  # all ties: still exactly k
  for k in (1, 3, 7):
    kept = sampling.top_k_filter(logits, k).numpy() > -1e30
    np.testing.assert_array_equal(kept.sum(-1), k)
    for row in (0, 1, 3, 4):
      assert set(np.nonzero(kept[row])[0]) == set(np.argsort(-logits[row])[:k])
    draws = sampling.sample(np.repeat(logits, 50, axis=0), top_k=k, seed=5).numpy()
    draws = draws.reshape(5, 50)
    for row in range(5):
      assert set(draws[row].tolist()) <= set(np.nonzero(kept[row])[0].tolist())


def test_greedy_is_deterministic_argmax():
  rng = np.random.default_rng(2)
  logits = rng.standard_normal((8, 20)).astype(np.float32)
  a = sampling.sample(logits, temperature=0.0).numpy()
  b = sampling.sample(logits, temperature=0.0, top_p=0.5, top_k=3).numpy()
  np.testing.assert_array_equal(a, logits.argmax(-1))
  np.testing.assert_array_equal(a, b)


def test_t2t_default_top_k_minus_one_is_off_with_nucleus():
  logits = np.zeros((2, 10), np.float32)
  draws = sampling.sample(np.repeat(logits, 200, axis=0), top_k=-1, top_p=1.0, seed=1).numpy()
  assert len(set(draws.tolist())) == 10


@pytest.mark.parametrize("kwargs,message", [
    (dict(top_p=0.0), "top-p must be in"),
    (dict(top_p=1.5), "top-p must be in"),
    (dict(top_k=-2), "top-k must be >= 0"),
    (dict(temperature=-1.0), "temperature must be >= 0"),
])
def test_bad_settings_raise(kwargs, message):
  with pytest.raises(ValueError, match=message):
    sampling.sample(np.zeros((1, 4), np.float32), **kwargs)


def test_sampling_compiles_with_xla():
  logits = tf.constant(np.random.default_rng(3).standard_normal((4, 16)), tf.float32)
  fn = tf.function(lambda x: (sampling.nucleus_filter(sampling.top_k_filter(x, 5), 0.7)),
                   jit_compile=True)
  np.testing.assert_allclose(fn(logits).numpy(),
                             sampling.nucleus_filter(sampling.top_k_filter(logits, 5), 0.7))
