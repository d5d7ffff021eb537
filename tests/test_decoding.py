"""Cached incremental decoding of the T2T model: cached == full forward, prompts, EOS,
sampling settings and beam search (the model built directly; t2t-decoder runs live in
test_t2t_binaries.py)."""
import numpy as np
import pytest
import tensorflow as tf

import routing_transformer  # pylint: disable=unused-import
from routing_transformer.core import decoding
from routing_transformer.core import layers
from routing_transformer.t2t import decode_settings
from routing_transformer.t2t import model as model_lib
from routing_transformer.core.attention import common
from routing_transformer.core.attention import incremental
from routing_transformer.core.attention import routing
from tensor2tensor.data_generators import problem_hparams
from tensor2tensor.utils import beam_search
import oracles
from test_cached_attention import qkv, tables
from test_model import VOCAB, small_hparams

tf1 = tf.compat.v1
EVAL = tf.estimator.ModeKeys.EVAL
SEARCH = beam_search.beam_search  # the T2T model's search (the core takes it as an argument)


def prefix_rule_patch(monkeypatch):
  """Full forward passes route every query i over its prefix only (the decode-time rule)."""
  real = layers.attention.routing_attention

  def patched(q, k, v, centroids, window, causal=True, share_qk=True, padding=None,
              relative_keys=None, relative_values=None, random_routing=False,
              legacy_causal_key_routing=False, **extensions):
    assert not legacy_causal_key_routing  # the cached decoder refuses it (fast_decode=False)
    _, aux = real(q, k, v, centroids, window, causal=causal, share_qk=share_qk, padding=padding,
                  relative_keys=relative_keys, relative_values=relative_values,
                  random_routing=random_routing, **extensions)
    out = oracles.prefix_routing_attention(q, k, v, centroids, window, share_qk=share_qk,
                                           relative_keys=relative_keys,
                                           relative_values=relative_values, **extensions)
    return out, aux

  monkeypatch.setattr(layers.attention, "routing_attention", patched)


def make_model(hparams, input_vocab=VOCAB):
  p_hparams = problem_hparams.test_problem_hparams(input_vocab, VOCAB, hparams)
  return model_lib.RoutingTransformer(hparams, EVAL, p_hparams)


def session_run(fetches, setup=None):
  with tf1.Session() as sess:
    sess.run(tf1.global_variables_initializer())
    if setup is not None:
      setup(sess)
    return sess.run(fetches)


LOCAL = dict(sparsity_cluster_num_heads=0, local_num_heads=4)
ARCHITECTURES = {
    "local": LOCAL,
    "full": dict(LOCAL, full_attention=True),
    "local_prenorm_timing_relu": dict(LOCAL, layer_preprocess_sequence="n",
                                      layer_postprocess_sequence="da", add_timing_signal=True,
                                      ffn_layer="dense_relu_dense", embedding_dims=16),
    "routing": {},
    "routing_no_share_qk": dict(share_qk=False),
    "routing_no_relative": dict(max_relative_position=0),
    "routing_exclude_self_learned_scale": dict(routing_exclude_self=True,
                                               routing_logit_scale="learned"),
    # routing_only_transformer_tiny1k's layout: routing heads in every layer, no local heads
    "routing_only": dict(local_num_heads=0, sparsity_cluster_num_heads=4, sparsity_skip_first=0,
                         routing_logit_scale="rsqrt_depth", routing_exclude_self=True),
}


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_cached_logits_equal_the_full_forward_pass(rng, monkeypatch, name):
  """Teacher-forced through the cache (the whole sequence as the prompt) at every position.

  Routing models are compared with a full pass under the same decode-time routing rule."""
  hparams = small_hparams(**ARCHITECTURES[name])
  tokens = rng.integers(2, VOCAB, (2, 64)).astype(np.int32)
  with tf.Graph().as_default():
    tf1.set_random_seed(3)
    model = make_model(hparams)
    if hparams.sparsity_cluster_num_heads:
      prefix_rule_patch(monkeypatch)
    full, _ = model({"targets": tokens[:, :, None, None]})
    monkeypatch.undo()
    cached = decoding.sample_loop(model, {"inputs": tf.constant(tokens)}, 4, return_logits=True)
    full, cached, forced = session_run([full, cached["logits"], cached["tokens"]])
  np.testing.assert_array_equal(forced, tokens)
  np.testing.assert_allclose(cached, full[:, :, 0, 0], atol=2e-5, rtol=1e-5)


def test_cached_encoder_decoder_logits_equal_the_full_forward_pass(rng):
  hparams = small_hparams(num_encoder_layers=1, **LOCAL)
  targets = rng.integers(2, VOCAB, (2, 64)).astype(np.int32)
  inputs = rng.integers(2, VOCAB, (2, 64)).astype(np.int32)
  inputs[1, 50:] = 0  # source padding
  with tf.Graph().as_default():
    model = make_model(hparams)
    full, _ = model({"targets": targets[:, :, None, None], "inputs": inputs[:, :, None, None]})
    cached = decoding.sample_loop(model, {"inputs": tf.constant(inputs),
                                          "partial_targets": tf.constant(targets)}, 4,
                                  return_logits=True)
    full, cached = session_run([full, cached["logits"]])
  np.testing.assert_allclose(cached, full[:, :, 0, 0], atol=2e-5, rtol=1e-5)


def test_greedy_is_deterministic_follows_the_logits_and_keeps_ragged_prompts(rng):
  prompt = np.zeros((2, 9), np.int32)
  prompt[0, :5] = rng.integers(2, VOCAB, 5)
  prompt[1, :9] = rng.integers(2, VOCAB, 9)
  with tf.Graph().as_default():
    model = make_model(small_hparams())
    first = decoding.sample_loop(model, {"inputs": tf.constant(prompt)}, 12, return_logits=True)
    second = decoding.sample_loop(model, {"inputs": tf.constant(prompt)}, 12)
    a, b = session_run([first, second["outputs"]])
  np.testing.assert_array_equal(a["outputs"], b)
  assert list(a["prompt_length"]) == [5, 9]
  for row, length in enumerate([5, 9]):
    np.testing.assert_array_equal(a["tokens"][row, :length], prompt[row, :length])
    generated = a["tokens"][row, length:length + 12]
    np.testing.assert_array_equal(a["outputs"][row], generated)
    predicted = a["logits"][row, length:length + 12, 1:].argmax(-1) + 1  # PAD never emitted
    stop = np.flatnonzero(generated == decoding.EOS_ID)
    upto = stop[0] + 1 if stop.size else 12
    np.testing.assert_array_equal(generated[:upto], predicted[:upto])
    assert (generated[upto:] == 0).all()
    assert (a["tokens"][row, length + 12:] == 0).all()  # nothing written after the budget


def test_generation_stops_at_eos(rng):
  prompt = rng.integers(2, VOCAB, (2, 3)).astype(np.int32)
  with tf.Graph().as_default():
    model = make_model(small_hparams())
    out = decoding.sample_loop(model, {"inputs": tf.constant(prompt)}, 10, temperature=1.0,
                               top_p=0.9)
    bias = [v for v in tf1.global_variables() if "final_dense_2/bias" in v.name][0]
    eos_bias = tf1.assign(bias, tf.one_hot(decoding.EOS_ID, VOCAB) * 100.0)
    outputs = session_run(out["outputs"], setup=lambda sess: sess.run(eos_bias))
  np.testing.assert_array_equal(outputs[:, 0], [decoding.EOS_ID] * 2)
  assert (outputs[:, 1:] == 0).all()


def test_generation_never_emits_padding(rng):
  prompt = rng.integers(2, VOCAB, (2, 3)).astype(np.int32)
  with tf.Graph().as_default():
    model = make_model(small_hparams())
    greedy = decoding.sample_loop(model, {"inputs": tf.constant(prompt)}, 10)["outputs"]
    sampled = decoding.sample_loop(model, {"inputs": tf.constant(prompt)}, 10, temperature=1.0,
                                   top_p=0.9)["outputs"]
    bias = [v for v in tf1.global_variables() if "final_dense_2/bias" in v.name][0]
    pad_bias = tf1.assign(bias, tf.one_hot(0, VOCAB) * 100.0)  # PAD is by far the likeliest
    greedy, sampled = session_run([greedy, sampled], setup=lambda sess: sess.run(pad_bias))
  for row in np.concatenate([greedy, sampled]):
    stop = np.flatnonzero(row == decoding.EOS_ID)
    upto = stop[0] if stop.size else len(row)
    assert (row[:upto] > 0).all(), row  # 0 appears only after an EOS


def test_unconditional_sampling_and_top_k_one_is_greedy(rng):
  with tf.Graph().as_default():
    model = make_model(small_hparams())
    features = {"targets": tf.zeros([3, 1, 1, 1], tf.int32)}  # batch size only
    greedy = decoding.sample_loop(model, features, 20)["outputs"]
    top1 = decoding.sample_loop(model, features, 20, temperature=1.0, top_k=1)["outputs"]
    sampled = decoding.sample_loop(model, features, 20, temperature=1.0, top_p=0.8)["outputs"]
    greedy, top1, sampled = session_run([greedy, top1, sampled])
  assert greedy.shape == sampled.shape == (3, 20)
  np.testing.assert_array_equal(top1, greedy)
  assert ((sampled >= 0) & (sampled < VOCAB)).all()  # 0 only after an EOS


def test_prompt_longer_than_the_model_fails_clearly(rng):
  prompt = rng.integers(2, VOCAB, (1, 65)).astype(np.int32)
  with tf.Graph().as_default():
    model = make_model(small_hparams())
    out = decoding.sample_loop(model, {"inputs": tf.constant(prompt)}, 4)
    with pytest.raises(tf.errors.InvalidArgumentError, match="prompt longer than"):
      session_run(out["outputs"])


def test_beam_search_forces_the_prompt_and_beats_greedy(rng):
  # Keras' unseeded initializers draw their seeds from Python's `random`: seed it, so the model
  # (and whether T2T's beam search, which prefers a finished beam, beats greedy on it) is fixed.
  tf.keras.utils.set_random_seed(5)
  hparams = small_hparams(**LOCAL)
  prompt = rng.integers(2, VOCAB, (2, 6)).astype(np.int32)
  with tf.Graph().as_default():
    tf1.set_random_seed(5)
    model = make_model(hparams)
    beam = decoding.beam_decode(model, {"inputs": tf.constant(prompt)}, 5, beam_size=4,
                                beam_search=SEARCH)
    greedy = decoding.sample_loop(model, {"inputs": tf.constant(prompt)}, 5, return_logits=True)
    beam, greedy = session_run([beam, greedy])
  assert beam["outputs"].shape == (2, 5)
  logits = greedy["logits"].copy()
  logits[..., 0] = -1e9  # generation never emits PAD
  log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  for row in range(2):
    tokens = greedy["tokens"][row, 6:11]
    stop = np.flatnonzero(tokens == decoding.EOS_ID)
    upto = stop[0] + 1 if stop.size else 5
    greedy_score = sum(log_probs[row, 6 + j, tokens[j]] for j in range(upto))
    assert beam["scores"][row] >= greedy_score - 1e-3


@pytest.mark.parametrize("heads,alpha", [({}, 0.0), (LOCAL, 0.6)], ids=["routing", "local"])
def test_beam_search_gives_each_prompt_what_it_gives_it_alone(rng, heads, alpha):
  """A short prompt batched with a long one gets the continuation and score it gets alone (T2T's
  search would run it to the long prompt's end and rank its beams there)."""
  tf.keras.utils.set_random_seed(7)
  prompts = [rng.integers(2, VOCAB, n).astype(np.int32) for n in (1, 9, 4)]
  batch = np.zeros((3, 9), np.int32)
  for row, prompt in enumerate(prompts):
    batch[row, :prompt.size] = prompt
  with tf.Graph().as_default():
    tf1.set_random_seed(7)
    model = make_model(small_hparams(**heads))
    together = decoding.beam_decode(model, {"inputs": tf.constant(batch)}, 6, beam_size=4,
                                    alpha=alpha, beam_search=SEARCH)
    alone = [decoding.beam_decode(model, {"inputs": tf.constant(p[None])}, 6, beam_size=4,
                                  alpha=alpha, beam_search=SEARCH) for p in prompts]
    together, alone = session_run([together, alone])
  for row in range(3):
    np.testing.assert_array_equal(together["outputs"][row], alone[row]["outputs"][0])
    np.testing.assert_allclose(together["scores"][row], alone[row]["scores"][0], rtol=1e-5)


def test_sampling_settings_resolve_t2t_defaults_and_overrides():
  hparams = small_hparams()
  assert decode_settings.sampling_settings(hparams) == (0.0, -1, 0.9)  # argmax: greedy
  hparams.sampling_method = "random"
  assert decode_settings.sampling_settings(hparams) == (1.0, -1, 0.9)
  from tensor2tensor.utils import hparam  # pylint: disable=g-import-not-at-top
  decode_hp = hparam.HParams(**decode_settings.UNSET)
  decode_hp.nucleus_sampling, decode_hp.sampling_temp, decode_hp.sampling_keep_top_k = 0.8, 0.7, 5
  assert decode_settings.sampling_settings(hparams, decode_hp) == (0.7, 5, 0.8)
  for name, value, message in (("nucleus_sampling", 1.5, "top-p"), ("nucleus_sampling", -0.2,
                                                                    "top-p"),
                               ("sampling_keep_top_k", -3, "top-k"),
                               ("sampling_method", "beam", "sampling_method")):
    bad = hparam.HParams(**decode_settings.UNSET)
    bad.set_hparam(name, value)
    with pytest.raises(decoding.DecodeError, match=message):
      decode_settings.sampling_settings(hparams, bad)


def test_random_sampling_names_the_inherited_top_p():
  """sampling_method=random alone keeps the set's nucleus_sampling=0.9, and says so."""
  from tensor2tensor.utils import hparam  # pylint: disable=g-import-not-at-top
  hparams = small_hparams()
  decode_hp = hparam.HParams(**decode_settings.UNSET)
  assert decode_settings.inherited_top_p_note(hparams, decode_hp) is None  # argmax: greedy
  decode_hp.sampling_method = "random"
  assert decode_settings.sampling_settings(hparams, decode_hp) == (1.0, -1, 0.9)
  note = decode_settings.inherited_top_p_note(hparams, decode_hp)
  assert "nucleus_sampling=0.9" in note and "nucleus_sampling=1.0" in note
  decode_hp.nucleus_sampling = 0.9  # set explicitly: no note
  assert decode_settings.inherited_top_p_note(hparams, decode_hp) is None
  decode_hp.nucleus_sampling = 1.0
  assert decode_settings.sampling_settings(hparams, decode_hp) == (1.0, -1, 1.0)
  assert decode_settings.inherited_top_p_note(hparams, decode_hp) is None


def test_decode_steps_compile_with_xla(rng):
  """The one-position attention and the cache write compile with XLA (TPU proxy)."""
  q, k, v = qkv(rng)
  rel_k, rel_v = tables(rng)
  mu = tf.constant(rng.standard_normal((2, 4, 8)), tf.float32)
  q_hat = common.layer_norm_no_scale(q)
  scores = routing.centroid_scores(q_hat, mu)

  def step(t):
    k_cache = incremental.write_cache(q_hat, q_hat[:, :, 3:4], t)
    routed = incremental.routing_attention_step(q_hat[:, :, 5:6], k_cache, v, scores, t, 8,
                                                rel_k, rel_v)
    local_out = incremental.local_attention_step(q[:, :, 5:6], k, v, t, 8, 16,
                                                 relative_keys=rel_k, relative_values=rel_v)
    return routed, local_out

  compiled = tf.function(step, jit_compile=True)
  for t in (5, 17):
    for eager, xla in zip(step(tf.constant(t)), compiled(tf.constant(t))):
      np.testing.assert_allclose(xla.numpy(), eager.numpy(), atol=1e-5)
