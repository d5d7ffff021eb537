"""Synthetic long-range key-value problem: layout, determinism, metrics and datagen."""
import numpy as np
import pytest


@pytest.fixture(scope="module")
def synthetic():
  import routing_transformer  # pylint: disable=g-import-not-at-top,unused-import
  import problems  # pylint: disable=g-import-not-at-top,unused-import
  from problems import synthetic as module  # pylint: disable=g-import-not-at-top
  return module


@pytest.fixture(scope="module")
def samples(synthetic):
  return synthetic.generate_samples(7, 64)


def test_determinism(synthetic):
  first = synthetic.generate_samples(3, 8)
  np.testing.assert_array_equal(first, synthetic.generate_samples(3, 8))
  assert not np.array_equal(first, synthetic.generate_samples(4, 8))
  assert synthetic.TRAIN_SEED != synthetic.EVAL_SEED


def test_layout(synthetic, samples):
  s = synthetic
  assert samples.shape == (64, s.LENGTH) and samples.dtype == np.int64
  assert s.QUERY_START == 480 and s.NUM_PAIRS == 16
  for row in samples:
    values, keys = row[0:32:2], row[1:32:2]  # value first, then its key
    assert len(set(keys.tolist())) == 16
    assert ((keys >= s.KEY_START) & (keys < s.KEY_START + s.NUM_KEYS)).all()
    assert ((values >= s.VALUE_START) & (values < s.VALUE_START + s.NUM_VALUES)).all()
    filler = row[32:480]
    expected = s.FILLER_START + np.arange(448) % s.NUM_FILLERS
    np.testing.assert_array_equal(filler, expected)
    first = dict(zip(keys.tolist(), values.tolist()))
    last_keys, last_values = row[480::2], row[481::2]
    assert sorted(last_keys.tolist()) == sorted(keys.tolist())
    assert dict(zip(last_keys.tolist(), last_values.tolist())) == first


def test_far_positions(synthetic, samples):
  far = synthetic.far_positions()
  assert far == list(range(481, 512, 2))
  mask = synthetic.far_mask(synthetic.LENGTH)
  assert mask.dtype == bool and mask.sum() == 16 and mask[far].all()
  assert synthetic.far_mask(490).sum() == 5
  # A far target is the value that preceded its key (the previous token) in the first section.
  for row in samples[:8]:
    first = dict(zip(row[1:32:2].tolist(), row[0:32:2].tolist()))
    for p in far:
      assert row[p] == first[row[p - 1]]
      assert p - int(np.where(row[:32] == row[p - 1])[0][0]) > 448


@pytest.mark.parametrize("name,length,pairs", [
    ("synthetic_long_range", 512, 16), ("synthetic_long_range_pairs8", 512, 8),
    ("synthetic_long_range_pairs32", 512, 32), ("synthetic_long_range_1k", 1024, 16),
    ("synthetic_long_range_1k_pairs32", 1024, 32)])
def test_registered_layouts(synthetic, name, length, pairs):
  from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
  layout = registry.problem(name).layout
  assert layout == synthetic.Layout(length, pairs)
  rows = synthetic.generate_samples(5, 16, layout)
  assert rows.shape == (16, length)
  far = synthetic.far_positions(layout)
  assert len(far) == pairs and far[-1] == length - 1
  for row in rows:
    first = dict(zip(row[1:2 * pairs:2].tolist(), row[0:2 * pairs:2].tolist()))
    assert len(first) == pairs
    filler = row[2 * pairs:length - 2 * pairs]
    assert filler.size == length - 4 * pairs and (filler >= synthetic.FILLER_START).all()
    for p in far:
      assert row[p] == first[row[p - 1]]
      assert p - int(np.where(row[:2 * pairs] == row[p - 1])[0][0]) > length - 4 * pairs
  with pytest.raises(ValueError, match="pairs"):
    synthetic.generate_samples(1, 2, synthetic.Layout(64, 33))


def test_far_accuracy_of_another_layout_scores_its_own_positions(synthetic):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  layout = synthetic.Layout(1024, 16)
  targets = synthetic.generate_samples(2, 2, layout)
  vocab = synthetic.VOCAB_SIZE
  wrong = ~synthetic.far_mask(1024, layout)  # right at the far positions, wrong elsewhere
  logits = np.eye(vocab)[np.where(wrong, (targets + 1) % vocab, targets)]
  labels = tf.constant(targets[:, :, None, None])
  far = synthetic.layout_metric(synthetic.far_accuracy, layout)
  near = synthetic.layout_metric(synthetic.near_accuracy, layout)
  for metric, want in ((far, 1.0), (near, 0.0)):
    scores, weights = metric(tf.constant(logits[:, :, None, None, :]), labels)
    got = tf.reduce_sum(scores * weights) / tf.reduce_sum(weights)
    assert float(got) == want


def test_vocab_range(synthetic, samples):
  assert samples.min() >= synthetic.NUM_RESERVED
  assert samples.max() < synthetic.VOCAB_SIZE
  assert synthetic.VOCAB_SIZE == 2 + 32 + 32 + 8


def test_encoder_round_trip(synthetic, samples):
  encoder = synthetic.SyntheticEncoder()
  assert encoder.vocab_size == synthetic.VOCAB_SIZE
  text = encoder.decode(samples[0])
  assert text.split()[:2] == ["v%d" % (samples[0, 0] - 34), "k%d" % (samples[0, 1] - 2)]
  assert encoder.encode(text) == samples[0].tolist()
  assert encoder.decode([0, 1, 2]) == "<pad> <EOS> k0"
  with pytest.raises(ValueError, match="Unknown synthetic token"):
    encoder.encode("k99")


def _logits(targets, vocab, wrong_mask=None):
  """One-hot logits [batch, length, 1, 1, vocab] of `targets`, shifted by one where wrong."""
  predicted = targets.copy()
  if wrong_mask is not None:
    predicted[:, wrong_mask] = (predicted[:, wrong_mask] + 1) % vocab
  return np.eye(vocab, dtype=np.float32)[predicted][:, :, None, None, :]


def _mean(metric_fn, logits, labels):
  scores, weights = metric_fn(logits, labels)
  scores, weights = np.asarray(scores), np.asarray(weights)
  return float((scores * weights).sum() / weights.sum())


def test_metrics_on_crafted_logits(synthetic, samples):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  targets = samples[:4].copy()
  targets[:, -3:] = 0  # padding is ignored
  labels = tf.constant(targets[:, :, None, None])
  vocab = synthetic.VOCAB_SIZE
  perfect = tf.constant(_logits(targets, vocab))
  assert _mean(synthetic.far_accuracy, perfect, labels) == 1.0
  assert _mean(synthetic.near_accuracy, perfect, labels) == 1.0
  wrong_far = tf.constant(_logits(targets, vocab, synthetic.far_mask()))
  assert _mean(synthetic.far_accuracy, wrong_far, labels) == 0.0
  assert _mean(synthetic.near_accuracy, wrong_far, labels) == 1.0
  wrong_near = tf.constant(_logits(targets, vocab, ~synthetic.far_mask()))
  assert _mean(synthetic.far_accuracy, wrong_near, labels) == 1.0
  assert _mean(synthetic.near_accuracy, wrong_near, labels) == 0.0
  _, weights = synthetic.far_accuracy(perfect, labels)
  assert float(np.asarray(weights).sum()) == 4 * 14  # far positions 509 and 511 are padding


def test_eval_metric_fns(synthetic, samples):
  import inspect  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
  prob = registry.problem("synthetic_long_range")
  fns = prob.eval_metric_fns(None)
  assert "accuracy" in fns and "neg_log_perplexity" in fns
  targets = samples[:2]
  labels = tf.constant(targets[:, :, None, None])
  wrong_near = tf.constant(_logits(targets, synthetic.VOCAB_SIZE, ~synthetic.far_mask()))
  for name, fn, want in (("far_accuracy", synthetic.far_accuracy, 1.0),
                         ("near_accuracy", synthetic.near_accuracy, 0.0)):
    # the plain signature T2T's metric wrapper inspects, and the module's metric on this layout
    assert inspect.getfullargspec(fns[name]).args == ["predictions", "labels", "weights_fn"]
    assert _mean(fns[name], wrong_near, labels) == _mean(fn, wrong_near, labels) == want


def test_generate_data_and_read_back(synthetic, tmp_path, monkeypatch):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
  cls = synthetic.SyntheticLongRange
  monkeypatch.setattr(cls, "num_train", 12)
  monkeypatch.setattr(cls, "num_eval", 5)
  prob = registry.problem("synthetic_long_range")
  data_dir = str(tmp_path)
  prob.generate_data(data_dir, str(tmp_path / "tmp"))
  names = sorted(p.name for p in tmp_path.iterdir() if p.is_file())
  assert names == ["synthetic_long_range-dev-00000-of-00001"] + [
      "synthetic_long_range-train-%05d-of-00004" % i for i in range(4)]
  hp = prob.get_hparams()
  assert hp.vocab_size["targets"] == synthetic.VOCAB_SIZE
  expected = {
      tf.estimator.ModeKeys.TRAIN: synthetic.generate_samples(synthetic.TRAIN_SEED, 12),
      tf.estimator.ModeKeys.EVAL: synthetic.generate_samples(synthetic.EVAL_SEED, 5),
  }
  for mode, rows in expected.items():
    dataset = prob.dataset(mode, data_dir, shuffle_files=False)
    got = [ex["targets"].numpy() for ex in dataset]
    assert len(got) == len(rows)
    assert all(t.shape == (synthetic.LENGTH,) for t in got)
    assert sorted(t.tolist() for t in got) == sorted(r.tolist() for r in rows)
