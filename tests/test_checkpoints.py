"""Original-release checkpoints: the name table, conversion, restore and function preservation.

The original graph's variables (names and shapes, tiny config) are in
tests/data/original_variables_tiny.txt (a copy of the project's reference list).
"""
import os

import numpy as np
import pytest
import tensorflow as tf

import routing_transformer  # pylint: disable=unused-import
from routing_transformer import checkpoints
from routing_transformer import model as model_lib
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
  """T2T Adafactor slot names/shapes of one variable (factored: vr, vc; else v)."""
  if len(shape) >= 2:
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
  assert head in stored and head + "/Adafactor_1" in stored  # slots renamed with their variable
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
