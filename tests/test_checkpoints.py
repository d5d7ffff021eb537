"""Original-release checkpoints: the name table, conversion, restore and function preservation.

The original graph's variables (names and shapes, tiny config) are in
tests/data/original_variables_tiny.txt (a copy of the project's reference list).
"""
import json
import os

import numpy as np
import pytest
import tensorflow as tf

import reference
import routing_transformer  # pylint: disable=unused-import
from routing_transformer.tools import checkpoints
from routing_transformer.t2t import model as model_lib
from hparams import sets
from tensor2tensor.data_generators import problem_hparams

tf1 = tf.compat.v1
REFERENCE = os.path.join(os.path.dirname(__file__), "data", "original_variables_tiny.txt")
VOCAB, LENGTH, STEP = 256, 1024, 3530000
EVAL = tf.estimator.ModeKeys.EVAL


def reference_variables():
  """[(name, shape)] of the original graph for the tiny config."""
  out = []
  for line in open(REFERENCE):
    if line.strip() and not line.startswith("#"):
      name, shape, _ = line.rstrip("\n").split("\t")
      out.append((name, tuple(int(x) for x in shape.strip("[]").split(","))))
  return out


def reference_hparams():
  """The tiny config of the reference file, from the released model's set."""
  h = sets.pg19_local_cluster8k()
  h.max_length = h.max_target_length = h.batch_size = LENGTH
  h.hidden_size = h.embedding_dims = 128
  h.filter_size = 256
  h.num_decoder_layers = h.num_hidden_layers = 2
  h.sparsity_skip_first = 1
  h.local_num_heads = h.sparsity_cluster_num_heads = 2
  h.sparsity_cluster_size, h.sparsity_cluster_attention_window = 4, 256
  h.query_shape = h.memory_flange = h.memory_query_shape = (128,)
  h.max_relative_position = 129
  return h


def adafactor_slots(name, shape):
  """T2T Adafactor slot names/shapes of one variable (factored: vr, vc; else v); the slots of
  matrices carry the `training/` name scope that TF2's t2t-trainer gives them."""
  if len(shape) >= 2:
    name = "training/" + name
    return {name + "/Adafactor": shape[:-1], name + "/Adafactor_1": shape[:-2] + shape[-1:]}
  return {name + "/Adafactor": shape}


def original_values(rng, slots=True):
  """Random values under exactly the reference names (+ Adafactor slots, global_step)."""
  values = {}
  for name, shape in reference_variables():
    scale = 0.3 if "embedding" in name or "kernel" in name else 1.0
    values[name] = (rng.standard_normal(shape) * scale).astype(np.float32)
    if name.endswith("layer_norm_scale"):
      values[name] = 1.0 + 0.1 * values[name]
    if slots and "ema_" not in name:
      for slot, slot_shape in adafactor_slots(name, shape).items():
        values[slot] = rng.random(slot_shape).astype(np.float32)
  values["global_step"] = np.asarray(STEP, np.int64)
  return values


def write(values, directory):
  os.makedirs(directory, exist_ok=True)
  prefix = os.path.join(directory, "model.ckpt-%d" % STEP)
  checkpoints.write_checkpoint(prefix, values)
  return prefix


@pytest.fixture(scope="module")
def original(tmp_path_factory):
  values = original_values(np.random.default_rng(7))
  return values, write(values, str(tmp_path_factory.mktemp("original")))


def test_table_is_a_bijection_onto_our_variables():
  names = [n for n, _ in reference_variables()]
  ours = [checkpoints.from_original(n) for n in names]
  assert len(set(ours)) == len(names) == 38  # num_global_vars of the reference
  assert [checkpoints.to_original(n) for n in ours] == names
  assert checkpoints.from_original(names[0], "sparse_transformer") == names[0]
  expected = checkpoints.model_variables(reference_hparams(), VOCAB)
  shapes = dict(zip(ours, (s for _, s in reference_variables())))
  assert shapes == expected  # same names and shapes: nothing missing, nothing unused
  renamed = {o for o, n in zip(ours, names) if o.split("/", 1)[1] != n.split("/", 1)[1]}
  assert len(renamed) == 2 * 1 + 2 * 2 + 3 + 2  # head_dense x2, local tables x4, k-means, routing


def test_convert_restores_into_our_model_with_nothing_missing_or_unused(original, tmp_path):
  _, prefix = original
  report, written = checkpoints.convert(prefix, str(tmp_path / "ours"), reference_hparams(),
                                        strict=True)
  assert report.missing == [] and report.unused == [] and report.shape_mismatches == []
  assert len(report.renamed) == 38 and report.global_step == STEP
  assert report.slots and not any(report.slots.values())  # Adafactor slots dropped
  assert tf.train.latest_checkpoint(str(tmp_path / "ours")) == written
  stored = set(checkpoints.read_variables(written))
  with tf.Graph().as_default():
    logits = build_logits(model_lib.RoutingTransformer)
    tf1.train.get_or_create_global_step()
    names = {v.op.name for v in tf1.global_variables()}
    assert stored == names
    with tf1.Session() as sess:
      tf1.train.Saver().restore(sess, written)  # raises on any missing variable
      assert np.isfinite(sess.run(logits, {"targets:0": tokens()})).all()


def tokens(batch=1):
  rng = np.random.default_rng(3)
  return rng.integers(1, VOCAB, (batch, LENGTH, 1, 1)).astype(np.int32)


def build_logits(cls):
  hparams = reference_hparams()
  p_hparams = problem_hparams.test_problem_hparams(VOCAB, VOCAB, hparams)
  targets = tf1.placeholder(tf.int32, [1, LENGTH, 1, 1], name="targets")
  logits, _ = cls(hparams, EVAL, p_hparams)({"targets": targets})
  return logits


def test_converted_logits_equal_our_model_under_our_names(original, tmp_path):
  values, prefix = original
  _, converted = checkpoints.convert(prefix, str(tmp_path / "converted"), reference_hparams())
  with tf.Graph().as_default():
    logits = build_logits(model_lib.RoutingTransformer)
    variables = tf1.global_variables()
    saver = tf1.train.Saver()
    with tf1.Session() as sess:
      for v in variables:  # our names, the same values
        v.load(values[checkpoints.to_original(v.op.name)], sess)
      ours = saver.save(sess, str(tmp_path / "ours" / "model.ckpt"))
      table = "decoder_layer_1/self_attention/self_attention/%s/relative_positions_keys/embeddings"
      local, routed = [next(v for v in variables if v.op.name.endswith(table % s))
                       for s in ("local", "routing")]
      local.load(values[checkpoints.to_original(routed.op.name)], sess)  # a wrong mapping
      routed.load(values[checkpoints.to_original(local.op.name)], sess)
      swapped = sess.run(logits, {"targets:0": tokens()})
      results = []
      for path in (converted, ours):
        saver.restore(sess, path)
        results.append(sess.run(logits, {"targets:0": tokens()}))
  np.testing.assert_array_equal(results[0], results[1])
  assert np.abs(results[0] - swapped).max() > 1e-3  # the comparison can see a wrong table


def test_sparse_transformer_scope_keeps_original_names(original, tmp_path):
  _, prefix = original
  report, written = checkpoints.convert(prefix, str(tmp_path), reference_hparams(),
                                        model="sparse_transformer", optimizer_slots="map")
  assert not report.missing and not report.unused
  stored = checkpoints.read_variables(written)
  head = "sparse_transformer/body/decoder_layer_0/self_attention/self_attention/head_dense/kernel"
  assert head in stored and "training/" + head + "/Adafactor_1" in stored  # renamed with it
  bias = "sparse_transformer/body/final_dense_2/bias"
  assert stored[bias + "/Adafactor"][0] == (VOCAB,)
  assert set(checkpoints.TRAINER_STATE) <= set(stored)  # what t2t-trainer restores to resume
  assert "training/" + bias + "/Adafactor" in report.zero_slots  # the slots t2t-trainer wants
  assert stored["training/" + bias + "/Adafactor"][0] == (VOCAB,)
  means = ("sparse_transformer/body/decoder_layer_1/self_attention/self_attention/routing/"
           "cluster_attention/means")
  assert means in stored and means + "/Adafactor" not in stored  # EMA centroids: no slots


def test_missing_and_mismatched_variables_are_listed_and_nothing_is_written(rng, tmp_path):
  values = original_values(rng, slots=False)
  gone = ("sparse_transformer/body/decoder_layer_1/self_attention/self_attention/attention_nd/"
          "dense/kernel")
  del values[gone]
  prefix = write(values, str(tmp_path / "src"))
  hparams = reference_hparams()
  hparams.filter_size = 512
  with pytest.raises(checkpoints.CheckpointError) as error:
    checkpoints.convert(prefix, str(tmp_path / "out"), hparams)
  message = str(error.value)
  assert "MISSING in the checkpoint (1): " + checkpoints.from_original(gone) in message
  assert "SHAPE MISMATCHES (6;" in message  # weight1..3 of two layers
  assert "ffn/weight1/kernel [128, 256] vs [128, 512]" in message
  assert not os.path.exists(str(tmp_path / "out"))


def test_cli_reports_one_line_errors(tmp_path, capsys):
  with pytest.raises(SystemExit) as exit_info:
    checkpoints.main(["--from", str(tmp_path / "nothing"), "--to", str(tmp_path / "out")])
  assert str(exit_info.value).startswith("error: checkpoint ")
  assert "\n" not in str(exit_info.value)
  with pytest.raises(SystemExit) as exit_info:
    checkpoints.main(["--from", str(tmp_path), "--to", str(tmp_path / "out")])
  assert "no checkpoint in directory" in str(exit_info.value)


def original_forward(w, ids, h):
  """NumPy forward pass of the original release's SparseTransformer LM (its utils.py semantics),
  reading weights by the original names written out here; ids [n] -> logits [n, vocab]."""
  top = "sparse_transformer/body/"

  def dense(x, name, bias=False):
    return x @ w[top + name + "/kernel"] + (w[top + name + "/bias"] if bias else 0.0)

  def post_norm(x, name):  # T2T layer_postprocess "dan": layer_norm(x + y)
    return (reference.layer_norm(x) * w[top + name + "/layer_norm/layer_norm_scale"] +
            w[top + name + "/layer_norm/layer_norm_bias"])

  def gelu(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))

  heads = h.local_num_heads + h.sparsity_cluster_num_heads
  depth = h.hidden_size // heads
  n = len(ids)
  split = lambda t: t.reshape(n, heads, depth).transpose(1, 0, 2)[np.newaxis]
  x = w[top + "embeddings/embedding"][np.concatenate([[0], ids[:-1]])]
  x = dense(x, "emb_dense", bias=True)
  for i in range(h.num_decoder_layers):
    block = "decoder_layer_%d/self_attention/" % i
    att = block + "self_attention/"
    nd = top + att + "attention_nd/"
    routed = h.sparsity_cluster_num_heads if i >= h.sparsity_skip_first else 0
    q = split(dense(x, att + "q")) * depth ** -0.5
    k, v = split(dense(x, att + "k")), split(dense(x, att + "v"))
    outs = []
    if routed and h.share_qk:  # cluster heads come first; share_qk: keys are the queries
      cl = nd + "cluster_attention/cluster_attention/"
      outs.append(reference.routing(
          q[:, :routed], q[:, :routed], v[:, :routed], w[cl + "means"],
          h.sparsity_cluster_attention_window, causal=True, share_qk=True,
          rel_k=w[cl + "relative_positions_keys/embeddings"],
          rel_v=w[cl + "relative_positions_values/embeddings"])[0])
    elif routed:  # separate keys: routed by their own scores, rank-triangle mask
      cl = nd + "cluster_attention/cluster_attention/"
      outs.append(reference.original_causal_routing(
          q[:, :routed], k[:, :routed], v[:, :routed], w[cl + "means"],
          h.sparsity_cluster_attention_window,
          rel_k=w[cl + "relative_positions_keys/embeddings"],
          rel_v=w[cl + "relative_positions_values/embeddings"]))
    outs.append(reference.local(
        q[:, routed:], k[:, routed:], v[:, routed:], h.query_shape[0], h.memory_flange[0],
        causal=True, rel_k=w[nd + "local_nd/relative_positions_keys/embeddings"],
        rel_v=w[nd + "local_nd/relative_positions_values/embeddings"], scale=1.0))
    o = np.concatenate(outs, axis=1)[0] @ w[nd + "dense/kernel"]  # [heads, n, d], shared map
    o = dense(o.transpose(1, 0, 2).reshape(n, h.hidden_size), att + "output_transform")
    x = post_norm(x + o, block + "layer_postprocess")
    f = dense(gelu(dense(x, block + "ffn/weight1")) * dense(x, block + "ffn/weight2"),
              block + "ffn/weight3")
    x = post_norm(x + f, block + "layer_postprocess_1")
  return dense(x, "final_dense_2", bias=True)


@pytest.mark.parametrize("share_qk", [True, False], ids=["share_qk", "separate_keys_legacy"])
def test_converted_model_computes_the_original_function(rng, tmp_path, share_qk):
  """Random weights under the original names; our converted model's logits equal an
  independent NumPy forward pass of the original architecture (small config, 64 tokens).
  With share_qk=False the model needs legacy_causal_key_routing=True to compute it."""
  h = reference_hparams()
  h.share_qk = share_qk
  h.legacy_causal_key_routing = not share_qk
  h.max_length = h.max_target_length = h.batch_size = 64
  h.hidden_size = h.embedding_dims = 32
  h.filter_size = 48
  h.sparsity_cluster_attention_window = 16
  h.query_shape = h.memory_flange = h.memory_query_shape = (16,)
  h.max_relative_position = 9  # < block + flange: clipping is exercised
  vocab = 50
  shapes = {checkpoints.to_original(n): s for n, s in
            checkpoints.model_variables(h, vocab).items()}
  values = {n: (rng.standard_normal(s) * (0.5 if len(s) > 1 else 0.2)).astype(np.float32)
            for n, s in shapes.items() if n != "global_step"}
  prefix = write(values, str(tmp_path / "original"))
  _, converted = checkpoints.convert(prefix, str(tmp_path / "ours"), h, strict=True)
  ids = rng.integers(1, vocab, 64).astype(np.int32)
  with tf.Graph().as_default():
    p_hparams = problem_hparams.test_problem_hparams(vocab, vocab, h)
    logits, _ = model_lib.RoutingTransformer(h, EVAL, p_hparams)(
        {"targets": tf.constant(ids[None, :, None, None])})
    with tf1.Session() as sess:
      tf1.train.Saver().restore(sess, converted)
      ours = sess.run(logits).reshape(64, vocab)
  expected = original_forward({n: v.astype(np.float64) for n, v in values.items()}, ids, h)
  np.testing.assert_allclose(ours, expected, rtol=2e-4, atol=2e-4)


def with_hparams_json(values, directory, hparams, **extra):
  """Writes the checkpoint and, beside it, hparams.json as T2T writes it (lists for tuples)."""
  prefix = write(values, directory)
  stored = dict(hparams.values(), **extra)
  with open(os.path.join(directory, "hparams.json"), "w") as f:
    json.dump(stored, f)
  return prefix


def test_hparams_json_differences_are_named_in_one_report(rng, tmp_path):
  """--hparams_json=check: every model-relevant difference with both values, unknown names set
  there, nothing about training-only settings, and nothing written."""
  original = reference_hparams()
  original.share_qk, original.max_relative_position = False, 65
  original.learning_rate_constant = 0.5  # training only: not reported
  prefix = with_hparams_json(original_values(rng, slots=False), str(tmp_path / "src"), original,
                             sparsity_strided_num_heads=2, hash_items=False)
  with pytest.raises(checkpoints.CheckpointError) as error:
    checkpoints.resolve_hparams(prefix, reference_hparams())
  message = str(error.value)
  assert "differs from the given hparams in 2 hparam(s): max_relative_position (hparams.json " \
      "65, the given hparams 129); share_qk (hparams.json False, the given hparams True)" in message
  assert "unknown to this model (ignored): sparsity_strided_num_heads=2" in message
  assert "hash_items" not in message and "learning_rate" not in message
  assert "--hparams_json=use" in message and "\n" not in message
  with pytest.raises(SystemExit) as exit_info:
    checkpoints.main(["--from", prefix, "--to", str(tmp_path / "out"), "--hparams_set",
                      "pg19_local_cluster8k"])
  assert str(exit_info.value).startswith("error: ") and "hparams.json differs from " \
      "--hparams_set=pg19_local_cluster8k in " in str(exit_info.value)
  assert not os.path.exists(str(tmp_path / "out"))
  assert checkpoints.resolve_hparams(prefix, reference_hparams(), mode="ignore").share_qk


def test_cli_builds_from_hparams_json_and_prints_computed_sizes(rng, tmp_path, capsys):
  """--hparams_json=use without --hparams_set: the tiny shapes come from hparams.json; the
  printed parameter count and vocabulary are the checkpoint's; share_qk=False gets the
  legacy_causal_key_routing line; a --vocab file larger than the embedding is refused."""
  original = reference_hparams()
  original.share_qk = False
  prefix = with_hparams_json(original_values(rng, slots=False), str(tmp_path / "src"), original)
  vocab = tmp_path / "vocab.pg19_length8k.32768.subwords"  # the name says nothing
  vocab.write_text("".join("'w%d_'\n" % i for i in range(VOCAB + 1)))
  with pytest.raises(SystemExit) as exit_info:
    checkpoints.main(["--from", prefix, "--to", str(tmp_path / "bad"), "--hparams_json", "use",
                      "--vocab", str(vocab)])
  assert "has %d subwords but the checkpoint's embedding only %d rows" % (VOCAB + 1, VOCAB) \
      in str(exit_info.value)
  assert not os.path.exists(str(tmp_path / "bad"))
  vocab.write_text("".join("'w%d_'\n" % i for i in range(200)))
  checkpoints.main(["--from", prefix, "--to", str(tmp_path / "out"), "--hparams_json", "use",
                    "--vocab", str(vocab)])
  out = capsys.readouterr().out
  trainable = sum(int(np.prod(s)) for n, s in reference_variables()
                  if not n.endswith(("means", "ema_count", "ema_means")))
  kmeans = sum(int(np.prod(s)) for n, s in reference_variables()
               if n.endswith(("means", "ema_count", "ema_means")))
  assert "parameters: %d (%.1fM) trainable, %d in k-means" % (trainable, trainable / 1e6,
                                                              kmeans) in out
  assert "vocabulary: %d embedding rows, %d output columns; --vocab file: 200 subwords" % (
      VOCAB, VOCAB) in out
  # which layers route, from the checkpoint's k-means variables (sparsity_skip_first = 1 of 2)
  assert "clustering (routing) heads: decoder layer 1 of 2 (2 heads x 4 clusters); layer 0: " \
      "local heads only" in out
  assert "--hparams=legacy_causal_key_routing=True" in out.strip().splitlines()[-1]
  assert tf.train.latest_checkpoint(str(tmp_path / "out"))
