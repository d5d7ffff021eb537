"""routing_padding_as_original: padding routed as the original release routes it (its utils.py
passes no padding to decoder self-attention; its top-k and online k-means see every position),
against the dense reference, the original's own causal rule and its forward pass; ours (the
default) keeps padding out of membership, statistics and keys. The Scorer and the probes turn
the switch on for original-release checkpoints and say so."""
import json
import os
import zlib

import numpy as np
import pytest
import tensorflow as tf

import reference
from conftest import HParamsStandIn
from routing_transformer.core import attention
from routing_transformer.core import kmeans
from routing_transformer.core.attention import causal_window as cw
from test_scoring import SET, vocab_file, write_model  # pylint: disable=unused-import

tf1 = tf.compat.v1
B, H, N, D, C, W = 2, 2, 32, 8, 4, 8
REAL = (32, 22)  # row 1 is padding from position 22 on


def inputs(rng):
  """q, k, v, centroids, padding, tables; padding queries and keys point straight at a centroid
  (score = the largest possible), so they win every top-k slot they are allowed to compete for."""
  q, k, v = (rng.standard_normal((B, H, N, D)) for _ in range(3))
  mu = reference.layer_norm(rng.standard_normal((H, C, D)))
  pad = np.arange(N)[None, :] >= np.array(REAL)[:, None]
  for b in range(B):
    for h in range(H):
      for i in np.nonzero(pad[b])[0]:
        q[b, h, i] = k[b, h, i] = 3.0 * mu[h, i % C] + 0.01 * rng.standard_normal(D)
  rel = [rng.standard_normal((2 * 5 + 1, D)) * 0.3 for _ in range(2)]
  cast = lambda x: x.astype(np.float32)
  return cast(q), cast(k), cast(v), cast(mu), pad, [cast(t) for t in rel]


def padded_members(indices, pad):
  """How many cluster slots [b, h, c, w] hold a padding position."""
  return sum(int(np.isin(indices[b], np.nonzero(pad[b])[0]).sum()) for b in range(B))


@pytest.mark.parametrize("causal,share_qk", [(True, True), (True, False), (False, True),
                                             (False, False)])
def test_routing_with_original_padding_equals_the_dense_reference(rng, causal, share_qk):
  q, k, v, mu, pad, (rel_k, rel_v) = inputs(rng)
  got, aux = attention.routing_attention(q, k, v, mu, W, causal=causal, share_qk=share_qk,
                                         padding=pad, relative_keys=rel_k, relative_values=rel_v,
                                         padding_as_original=True)
  want, _, loss = reference.routing(q, k, v, mu, W, causal, share_qk, pad, rel_k, rel_v,
                                    padding_as_original=True)
  np.testing.assert_allclose(got.numpy(), want, atol=2e-4)
  np.testing.assert_allclose(aux["commitment_loss"].numpy(), loss, rtol=1e-4)
  np.testing.assert_array_equal(aux["weights"].numpy(), np.ones((B, N)))
  assert padded_members(aux["query_indices"].numpy(), pad) >= 2 * H  # padding holds slots
  if not share_qk and not causal:
    assert padded_members(aux["key_indices"].numpy(), pad) >= 2 * H
  # Ours (the default): padding never takes a slot a real position could have.
  ours, aux_ours = attention.routing_attention(q, k, v, mu, W, causal=causal, share_qk=share_qk,
                                               padding=pad, relative_keys=rel_k,
                                               relative_values=rel_v)
  assert padded_members(aux_ours["query_indices"].numpy(), pad) == 0
  np.testing.assert_array_equal(aux_ours["weights"].numpy(), 1.0 - pad)
  real = ~pad[:, None, :, None]
  assert np.abs(np.where(real, ours.numpy() - got.numpy(), 0)).max() > 1e-2


@pytest.mark.parametrize("share_qk", [True, False])
def test_causal_original_padding_is_routing_without_padding(rng, share_qk):
  """The original's decoder gives self-attention no padding: membership, keys, loss and the
  k-means weights are those of an unpadded call, exactly."""
  q, k, v, mu, pad, (rel_k, rel_v) = inputs(rng)
  kwargs = dict(share_qk=share_qk, relative_keys=rel_k, relative_values=rel_v)
  got, aux = attention.routing_attention(q, k, v, mu, W, padding=pad, padding_as_original=True,
                                         **kwargs)
  want, aux_want = attention.routing_attention(q, k, v, mu, W, **kwargs)
  np.testing.assert_array_equal(got.numpy(), want.numpy())
  for key in ("query_indices", "key_indices", "commitment_loss", "weights"):
    np.testing.assert_array_equal(aux[key].numpy(), aux_want[key].numpy())
  got, aux = cw.causal_window_attention(q, k, v, mu, W, padding=pad, padding_as_original=True,
                                        **kwargs)
  want, aux_want = cw.causal_window_attention(q, k, v, mu, W, **kwargs)
  np.testing.assert_array_equal(got.numpy(), want.numpy())
  np.testing.assert_array_equal(aux["weights"].numpy(), np.ones((B, N)))
  np.testing.assert_array_equal(aux["commitment_loss"].numpy(), aux_want["commitment_loss"])


def test_legacy_keys_with_original_padding_equal_the_original_rule(rng):
  """Separate keys in causal mode (legacy_causal_key_routing) with padding: the original's own
  rule (reference.original_causal_routing, which has no padding) at every position."""
  q, k, v, mu, pad, (rel_k, rel_v) = inputs(rng)
  kwargs = dict(causal=True, share_qk=False, padding=pad, relative_keys=rel_k,
                relative_values=rel_v, legacy_causal_key_routing=True)
  got, _ = attention.routing_attention(q, k, v, mu, W, padding_as_original=True, **kwargs)
  want = reference.original_causal_routing(q.astype(np.float64), k.astype(np.float64),
                                           v.astype(np.float64), mu.astype(np.float64), W,
                                           rel_k, rel_v)
  np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-5)
  ours, _ = attention.routing_attention(q, k, v, mu, W, **kwargs)
  real = ~pad[:, None, :, None]
  assert np.abs(np.where(real, ours.numpy() - want, 0)).max() > 1e-2


@pytest.mark.parametrize("as_original", [False, True])
def test_kmeans_statistics_count_padding_only_as_the_original(rng, as_original):
  """Counts and sums by hand: one-hot argmax of every position (original) or of the real ones."""
  q, k, v, mu, pad, _ = inputs(rng)
  _, aux = attention.routing_attention(q, k, v, mu, W, padding=pad,
                                       padding_as_original=as_original)
  x_hats, clusters = kmeans.routed_vectors(aux, True)
  counts, sums = kmeans.combined_statistics(x_hats, clusters, C, aux["weights"])
  q_hat = aux["q_hat"].numpy().astype(np.float64)
  one_hot = np.eye(C)[aux["query_clusters"].numpy()]  # [b, h, n, c]
  weight = np.ones((B, N)) if as_original else 1.0 - pad
  one_hot = one_hot * weight[:, None, :, None]
  np.testing.assert_allclose(counts.numpy(), one_hot.sum((0, 2)), rtol=1e-6)
  np.testing.assert_allclose(sums.numpy(), np.einsum("bhnc,bhnd->hcd", one_hot, q_hat),
                             rtol=1e-4, atol=1e-4)
  assert counts.numpy().sum() == H * (B * N if as_original else sum(REAL))


def layer_hparams(**overrides):
  h = HParamsStandIn(
      hidden_size=32, local_num_heads=2, sparsity_cluster_num_heads=2, sparsity_skip_first=0,
      sparsity_cluster_size=4, sparsity_cluster_attention_window=8, query_shape=(8,),
      memory_flange=(8,), share_qk=True, routing_mode="topk", random_routing=False,
      legacy_causal_key_routing=False, max_relative_position=5, local_relative=True,
      sparsity_cluster_relative=True, head_dense=True, attention_dropout=0.0, decay=0.999,
      beta=1e-4, ema=True, max_length=32, max_target_length=32)
  h.__dict__.update(overrides)
  return h


@pytest.mark.parametrize("routing_mode", ["topk", "causal_window"])
def test_layer_with_the_switch_ignores_decoder_padding(rng, routing_mode):
  """self_attention with routing_padding_as_original=True and padding equals the unpadded
  layer: output, loss and the k-means statistics the model updates with (all 2 x 32 positions);
  without the switch they differ."""
  from routing_transformer.core import layers  # pylint: disable=g-import-not-at-top
  x = rng.standard_normal((B, N, 32)).astype(np.float32)
  pad = np.arange(N)[None, :] >= np.array(REAL)[:, None]

  def run(padding, switch):
    hparams = layer_hparams(routing_mode=routing_mode, routing_padding_as_original=switch)
    assert layers.head_config(hparams).routing_padding_as_original is switch
    with tf.Graph().as_default():
      tf1.set_random_seed(1)
      pad_tensor = tf.constant(pad)  # in both graphs: the same op ids, the same initial values
      y, loss, step = layers.self_attention(
          tf.constant(x), hparams, 0, None if padding is None else pad_tensor, train=True)
      with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        for var in tf1.global_variables():  # Keras-made initial kernels differ between graphs
          if var.op.name.endswith("kernel"):
            shape = var.shape.as_list()
            var.load(np.random.default_rng(zlib.crc32(var.op.name.encode())).normal(
                0, shape[0] ** -0.5, shape).astype(np.float32), sess)
        return sess.run([y, loss, step.statistics()])

  on, unpadded, off = run(pad, True), run(None, False), run(pad, False)
  np.testing.assert_array_equal(on[0], unpadded[0])
  np.testing.assert_array_equal(on[1], unpadded[1])
  np.testing.assert_array_equal(on[2][0], unpadded[2][0])
  assert on[2][0].sum() == 2 * B * N and off[2][0].sum() == 2 * sum(REAL)
  assert off[1] != on[1]


def test_switch_is_off_in_every_set():
  import hparams  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
  for name in hparams.PROJECT_SETS:
    assert registry.hparams(name).routing_padding_as_original is False, name


def test_converted_release_scores_padded_inputs_as_the_original(rng, tmp_path):
  """Random weights under the original names, a 64-token input whose last 24 targets are
  padding: with the switch our converted model's logits equal the NumPy forward pass of the
  original architecture at every position; without it the real positions differ."""
  from routing_transformer.t2t import model as model_lib  # pylint: disable=g-import-not-at-top
  from routing_transformer.tools import checkpoints  # pylint: disable=g-import-not-at-top
  from tensor2tensor.data_generators import problem_hparams  # pylint: disable=g-import-not-at-top
  import test_checkpoints as tc  # pylint: disable=g-import-not-at-top
  h = tc.reference_hparams()
  h.max_length = h.max_target_length = h.batch_size = 64
  h.hidden_size = h.embedding_dims = 32
  h.filter_size = 48
  h.sparsity_cluster_attention_window = 16
  h.query_shape = h.memory_flange = h.memory_query_shape = (16,)
  h.max_relative_position = 9
  vocab = 50
  shapes = {checkpoints.to_original(n): s for n, s in
            checkpoints.model_variables(h, vocab).items()}
  values = {n: (rng.standard_normal(s) * (0.5 if len(s) > 1 else 0.2)).astype(np.float32)
            for n, s in shapes.items() if n != "global_step"}
  _, converted = checkpoints.convert(tc.write(values, str(tmp_path / "original")),
                                     str(tmp_path / "ours"), h, strict=True)
  assert checkpoints.is_original_release(converted)
  ids = rng.integers(1, vocab, 64).astype(np.int32)
  ids[40:] = 0
  logits = {}
  for switch in (True, False):
    h.routing_padding_as_original = switch
    with tf.Graph().as_default():
      p_hparams = problem_hparams.test_problem_hparams(vocab, vocab, h)
      out, _ = model_lib.RoutingTransformer(h, tf.estimator.ModeKeys.EVAL, p_hparams)(
          {"targets": tf.constant(ids[None, :, None, None])})
      with tf1.Session() as sess:
        tf1.train.Saver().restore(sess, converted)
        logits[switch] = sess.run(out).reshape(64, vocab)
  expected = tc.original_forward({n: v.astype(np.float64) for n, v in values.items()}, ids, h)
  np.testing.assert_allclose(logits[True], expected, rtol=2e-4, atol=2e-4)
  assert np.abs(logits[False][:40] - expected[:40]).max() > 1e-3


def test_scorer_runs_original_release_checkpoints_with_original_padding(vocab_file, tmp_path,
                                                                        capsys):
  from routing_transformer.tools import checkpoints  # pylint: disable=g-import-not-at-top
  from routing_transformer.tools import score  # pylint: disable=g-import-not-at-top
  from routing_transformer.tools.probes import scoring  # pylint: disable=g-import-not-at-top
  from tensor2tensor.data_generators import text_encoder  # pylint: disable=g-import-not-at-top
  size = text_encoder.SubwordTextEncoder(vocab_file).vocab_size
  write_model(str(tmp_path / "ours"), size, seed=4)
  write_model(str(tmp_path / "orig"), size, names=checkpoints.to_original, seed=4)
  write_model(str(tmp_path / "converted"), size, seed=4)
  with open(str(tmp_path / "converted" / checkpoints.ORIGINAL_RELEASE_FILE), "w") as f:
    json.dump({"checkpoint": "model.ckpt-1", "source": "gs://somewhere"}, f)
  write_model(str(tmp_path / "trained_on"), size, seed=4)  # the record names another step
  with open(str(tmp_path / "trained_on" / checkpoints.ORIGINAL_RELEASE_FILE), "w") as f:
    json.dump({"checkpoint": "model.ckpt-0"}, f)
  texts = ["a cat ran home", "the dogs sang"]  # padded windows
  scores, switch, notes = {}, {}, {}
  for sub, overrides in (("ours", ""), ("orig", ""), ("converted", ""), ("trained_on", ""),
                         ("ours_switched", "routing_padding_as_original=True"),
                         ("orig_off", "routing_padding_as_original=False")):
    path = str(tmp_path / sub.replace("_switched", "").replace("_off", ""))
    scorer = score.Scorer(path, SET, vocab_file, overrides, batch_size=2)
    scores[sub] = scorer.score(texts)
    switch[sub] = scorer.hparams.get("routing_padding_as_original", False)
    notes[sub] = scorer.notes
    scorer.close()
  assert switch == {"ours": False, "orig": True, "converted": True, "trained_on": False,
                    "ours_switched": True, "orig_off": False}
  assert [len(notes[s]) for s in ("ours", "orig", "converted", "orig_off")] == [0, 1, 1, 0]
  assert "routing_padding_as_original=True" in notes["orig"][0]
  for a, b, c in zip(scores["orig"], scores["ours_switched"], scores["converted"]):
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)
  assert max(np.abs(a - b).max() for a, b in zip(scores["orig"], scores["ours"])) > 1e-4
  text = tmp_path / "t.txt"
  text.write_text(texts[0])
  score.main(["--checkpoint", str(tmp_path / "orig"), "--hparams_set", SET, "--vocab",
              vocab_file, "--text_file", str(text)])
  assert json.loads(capsys.readouterr().out)["notes"] == notes["orig"]
  scorer = scoring.build_scorer(str(tmp_path / "converted"), SET, vocab_file)
  assert scoring.make_score_fn(scorer).notes == notes["converted"]
  err = capsys.readouterr().err
  assert "[probes] %s: original-release checkpoint: routing_padding_as_original=True" % (
      tmp_path / "converted") in err
  scorer.close()
  local = scoring.build_scorer(str(tmp_path / "orig"), SET, vocab_file, as_local=True)
  assert local.hparams.sparsity_skip_first == 2  # the derived local model has no routing heads
  assert local.notes == [] and not local.hparams.get("routing_padding_as_original")
  assert "[probes]" not in capsys.readouterr().err
  local.close()


def test_converter_writes_the_record_and_prints_the_note(rng, tmp_path, capsys):
  from routing_transformer.tools import checkpoints  # pylint: disable=g-import-not-at-top
  import test_checkpoints as tc  # pylint: disable=g-import-not-at-top
  prefix = tc.with_hparams_json(tc.original_values(rng, slots=False), str(tmp_path / "src"),
                                tc.reference_hparams())
  assert checkpoints.is_original_release(prefix)  # original names
  checkpoints.main(["--from", prefix, "--to", str(tmp_path / "out"), "--hparams_json", "use"])
  out = capsys.readouterr().out.strip().splitlines()
  assert "routing_padding_as_original=True" in out[-1]  # share_qk: no legacy line after it
  written = tf.train.latest_checkpoint(str(tmp_path / "out"))
  with open(os.path.join(str(tmp_path / "out"), checkpoints.ORIGINAL_RELEASE_FILE)) as f:
    assert json.load(f)["checkpoint"] == os.path.basename(written)
  assert checkpoints.is_original_release(written)
  ours = {checkpoints.from_original(n): s for n, s in checkpoints.read_variables(prefix).items()}
  assert not checkpoints.is_original_release(str(tmp_path / "nowhere" / "model.ckpt-1"), ours)
  local = tc.reference_hparams()
  local.sparsity_skip_first = local.num_decoder_layers
  assert checkpoints.padding_note(local) is None
