"""The one-hop long-range retrieval problems (problems/retrieval.py): layouts, determinism, far
positions beyond the local receptive field, refusals naming the fix, the far-accuracy metric."""
import numpy as np
import pytest

import t2t_usr_dir  # pylint: disable=unused-import
from problems import retrieval
from routing_transformer.core import cost
from tensor2tensor.utils import registry

R = retrieval.NUM_RESERVED
PLAIN = sorted(k for k, v in retrieval.LAYOUTS.items() if isinstance(v, retrieval.Layout))
MIXED = sorted(k for k, v in retrieval.LAYOUTS.items() if isinstance(v, retrieval.MixedLayout))


@pytest.mark.parametrize("name", PLAIN)
def test_every_layout_is_registered_and_its_sequences_hold_the_recall(name):
  layout = retrieval.LAYOUTS[name]
  assert registry.problem(name).layout == layout
  seqs = retrieval.generate_samples(5, 3, layout)
  assert seqs.shape == (3, layout.length) and seqs.dtype == np.int64
  assert seqs.min() >= R and seqs.max() < layout.vocab_size
  for seq in seqs:
    items = seq[:layout.num_items]
    keys = (items - layout.item_start) // layout.num_values
    assert ((items >= layout.item_start) & (items < layout.filler_start)).all()
    assert len(set(keys)) == layout.num_items  # distinct keys
    filler = seq[layout.num_items:layout.query_start]
    np.testing.assert_array_equal(
        filler, layout.filler_start + np.arange(layout.filler_length) % retrieval.NUM_FILLERS)
    queries, answers = seq[layout.query_start::2], seq[layout.query_start + 1::2]
    asked = queries - layout.query_token_start
    assert ((asked >= 0) & (asked < layout.num_keys)).all()
    assert len(set(asked)) == layout.num_queries
    stored = dict(zip(keys, range(layout.num_items)))
    for pos, key, answer in zip(layout.far_positions(), asked, answers):
      assert seq[pos] == answer == items[stored[key]]  # the target is the stored item itself
      assert pos - 1 - stored[key] >= layout.min_far_distance


def test_hand_layout():
  layout = retrieval.Layout(length=12, num_items=3, num_queries=2, num_keys=4, num_values=2)
  assert (layout.query_start, layout.filler_length, layout.min_far_distance) == (8, 5, 6)
  assert layout.far_positions() == [9, 11]
  assert (layout.item_start, layout.filler_start, layout.vocab_size) == (6, 14, 22)
  seq = retrieval.generate_samples(0, 1, layout)[0]
  enc = retrieval.RetrievalEncoder(layout)
  words = enc.decode(seq).split()
  assert words[3:8] == ["f0", "f1", "f2", "f3", "f4"]
  for q, a in ((words[8], words[9]), (words[10], words[11])):
    assert a in words[:3] and a.startswith("k%sv" % q[1:])
  assert enc.encode(" ".join(words)) == seq.tolist()


def test_generation_is_a_pure_function_of_seed_and_layout():
  layout = retrieval.LAYOUTS["long_range_retrieval_1k"]
  a, b = retrieval.generate_samples(3, 4, layout), retrieval.generate_samples(3, 4, layout)
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, retrieval.generate_samples(4, 4, layout))
  assert retrieval.TRAIN_SEED != retrieval.EVAL_SEED


def test_values_are_uniform_so_chance_is_one_over_values():
  layout = retrieval.LAYOUTS["long_range_retrieval_1k"]
  seqs = retrieval.generate_samples(0, 400, layout)
  answers = seqs[:, layout.query_start + 1::2]
  values = (answers - layout.item_start) % layout.num_values
  counts = np.bincount(values.ravel(), minlength=layout.num_values) / values.size
  np.testing.assert_allclose(counts, 1.0 / layout.num_values, atol=0.02)


@pytest.mark.parametrize("layout,message", [
    (retrieval.Layout(64, 9, 4, 8, 4), "use num_keys >= 9"),
    (retrieval.Layout(64, 4, 5, 8, 4), "num_queries <= num_items = 4"),
    (retrieval.Layout(16, 8, 8, 8, 4), "use length >= 24"),
    (retrieval.Layout(64, 4, 4, 8, 1), "num_values >= 2"),
])
def test_layouts_that_cannot_hold_their_items_are_refused(layout, message):
  with pytest.raises(retrieval.LayoutError, match=message) as error:
    retrieval.generate_samples(0, 1, layout)
  assert "\n" not in str(error.value) and error.value.one_line


@pytest.mark.parametrize("name", PLAIN)
def test_far_items_lie_beyond_the_local_sets_receptive_field(name):
  import hparams  # pylint: disable=g-import-not-at-top,unused-import
  layout = retrieval.LAYOUTS[name]
  for set_name in ("local_transformer_tiny1k", "routing_transformer_tiny1k",
                   "local_transformer_tiny", "pg19_local_tiny2k"):
    hp = registry.hparams(set_name)
    hp.max_length = hp.max_target_length = max(layout.length, hp.max_length)
    assert layout.min_far_distance > cost.local_receptive_field(hp)
    retrieval.check_layout(layout, hp)  # accepted
  full = registry.hparams("full_transformer_tiny1k")
  full.max_length = full.max_target_length = layout.length
  assert cost.local_receptive_field(full) >= layout.min_far_distance
  retrieval.check_layout(layout, full)  # the ceiling reaches everything, by design


def test_a_model_whose_local_heads_reach_the_items_is_refused():
  import hparams  # pylint: disable=g-import-not-at-top,unused-import
  hp = registry.hparams("local_transformer_tiny1k")  # reach 63 + 2 x 64 = 191
  assert cost.local_receptive_field(hp) == 191
  near = retrieval.Layout(1024, num_items=400, num_queries=300, num_keys=400, num_values=8)
  assert near.min_far_distance == 1024 - 600 - 399  # 25 <= 191
  with pytest.raises(retrieval.LayoutError, match=r"reach 191 positions back.*use length >= "
                     r"%d " % (191 + 400 + 600)):
    retrieval.check_layout(near, hp)
  with pytest.raises(retrieval.LayoutError, match="max_length=2048,max_target_length=2048"):
    retrieval.check_layout(retrieval.LAYOUTS["long_range_retrieval_2k"], hp)


def test_the_stock_trainer_path_refuses_in_one_line():
  """problem.get_hparams(model hparams), as trainer_lib.create_hparams calls it."""
  import hparams  # pylint: disable=g-import-not-at-top,unused-import
  problem = registry.problem("long_range_retrieval_1k")
  hp = registry.hparams("local_transformer_tiny")  # 512 tokens
  with pytest.raises(retrieval.LayoutError, match="static length is 512"):
    problem.get_hparams(hp)
  problem = registry.problem("long_range_retrieval_1k")
  p_hparams = problem.get_hparams(registry.hparams("local_transformer_tiny1k"))
  assert p_hparams.vocab_size["targets"] == problem.layout.vocab_size


def test_far_accuracy_counts_exactly_the_far_positions():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  layout = retrieval.Layout(length=12, num_items=3, num_queries=2, num_keys=4, num_values=2)
  problem = registry.problem("long_range_retrieval_1k")
  problem.layout = layout  # this instance only
  metric = problem.eval_metric_fns(None)["far_accuracy"]
  labels = retrieval.generate_samples(1, 2, layout)
  predictions = labels.copy()
  predictions[0, 9] = labels[0, 9] + 1   # one far miss
  predictions[1, 4] = labels[1, 4] + 1   # a near miss: not counted
  logits = tf.one_hot(predictions, layout.vocab_size)[:, :, None, None, :]
  correct, weights = metric(logits, tf.constant(labels)[:, :, None, None])
  weights = np.asarray(weights).reshape(2, 12)
  assert weights.sum() == 4 and (weights[:, [9, 11]] == 1).all()
  assert (np.asarray(correct).reshape(2, 12) * weights).sum() == 3


# --- mixed layouts: near and far look-ups in one sequence ----------------------------------------


def test_there_are_mixed_layouts_at_256_1k_and_4k():
  assert {retrieval.LAYOUTS[m].length for m in MIXED} >= {256, 1024, 4096}


@pytest.mark.parametrize("name", MIXED)
def test_mixed_sequences_hold_each_look_up_at_its_distance(name):
  layout = retrieval.LAYOUTS[name]
  assert registry.problem(name).layout == layout
  seqs, dists = retrieval.generate_mixed_samples(7, 6, layout, with_distances=True)
  assert seqs.shape == dists.shape == (6, layout.length) and seqs.dtype == np.int64
  assert seqs.min() >= R and seqs.max() < layout.vocab_size
  filler = layout.filler_start + np.arange(layout.length) % retrieval.NUM_FILLERS
  per_band = np.zeros(len(layout.bands), int)
  for seq, dist in zip(seqs, dists):
    answers = np.nonzero(dist >= 0)[0]
    assert len(answers) == layout.num_pairs
    used = set()
    for a in answers:
      q, d = a - 1, dist[a]
      key = seq[q] - layout.query_token_start
      assert 0 <= key < layout.num_keys and key not in used  # one look-up per key
      used.add(key)
      assert seq[a] == seq[q - d] and (seq[a] - layout.item_start) // layout.num_values == key
      assert np.sum(seq[:a] == seq[a]) == 1  # the item is stored once before its answer
      band = [i for i, (lo, hi) in enumerate(layout.bands) if lo <= d <= hi]
      assert len(band) == 1
      per_band[band[0]] += 1
    special = np.zeros(layout.length, bool)
    special[answers] = special[answers - 1] = True
    special[[a - 1 - dist[a] for a in answers]] = True
    assert special.sum() == 3 * layout.num_pairs  # no two look-ups share a position
    np.testing.assert_array_equal(seq[~special], filler[~special])
  # the bands take turns: equal shares up to one look-up per sequence
  assert per_band.max() - per_band.min() <= len(seqs)


def test_mixed_generation_is_a_pure_function_of_seed_and_layout():
  layout = retrieval.LAYOUTS["long_range_retrieval_1k_mixed"]
  a = retrieval.generate_mixed_samples(3, 4, layout)
  np.testing.assert_array_equal(a, retrieval.generate_mixed_samples(3, 4, layout))
  assert not np.array_equal(a, retrieval.generate_mixed_samples(4, 4, layout))


@pytest.mark.parametrize("name", MIXED)
def test_answer_distances_from_the_tokens_alone_equal_the_generators(name):
  layout = retrieval.LAYOUTS[name]
  seqs, dists = retrieval.generate_mixed_samples(2, 3, layout, with_distances=True)
  np.testing.assert_array_equal(retrieval.answer_distances(seqs, layout), dists)


def test_mixed_values_are_uniform():
  layout = retrieval.LAYOUTS["long_range_retrieval_256_mixed"]
  seqs, dists = retrieval.generate_mixed_samples(0, 300, layout, with_distances=True)
  values = (seqs[dists >= 0] - layout.item_start) % layout.num_values
  counts = np.bincount(values, minlength=layout.num_values) / values.size
  np.testing.assert_allclose(counts, 1.0 / layout.num_values, atol=0.02)


@pytest.mark.parametrize("layout,message", [
    (retrieval.MixedLayout(256, 9, 8, 4, ((2, 9),)), "use num_keys >= 9"),
    (retrieval.MixedLayout(256, 4, 8, 1, ((2, 9),)), "num_values >= 2"),
    (retrieval.MixedLayout(256, 4, 8, 4, ()), "at least one distance band"),
    (retrieval.MixedLayout(256, 4, 8, 4, ((2, 255),)), r"hi <= length - 2 = 254"),
    (retrieval.MixedLayout(256, 4, 8, 4, ((0, 9),)), "1 <= lo <= hi"),
    (retrieval.MixedLayout(60, 16, 16, 4, ((2, 9),)), "use length >= 96 or num_pairs <= 10"),
])
def test_mixed_layouts_that_cannot_hold_their_look_ups_are_refused(layout, message):
  with pytest.raises(retrieval.LayoutError, match=message) as error:
    retrieval.generate_mixed_samples(0, 1, layout)
  assert "\n" not in str(error.value) and error.value.one_line


def test_mixed_layout_longer_than_the_model_is_refused_through_get_hparams():
  import hparams  # pylint: disable=g-import-not-at-top,unused-import
  problem = registry.problem("long_range_retrieval_1k_mixed")
  with pytest.raises(retrieval.LayoutError, match="static length is 512"):
    problem.get_hparams(registry.hparams("local_transformer_tiny"))
  p_hparams = problem.get_hparams(registry.hparams("routing_transformer_tiny1k"))
  assert p_hparams.vocab_size["targets"] == problem.layout.vocab_size


def _metric_values(metric, labels, predictions, vocab):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  logits = tf.one_hot(predictions, vocab)[:, :, None, None, :]
  correct, weights = metric(logits, tf.constant(labels)[:, :, None, None])
  shape = labels.shape
  return np.asarray(correct).reshape(shape), np.asarray(weights).reshape(shape)


def test_band_metrics_count_exactly_the_answers_of_their_band():
  import hparams  # pylint: disable=g-import-not-at-top,unused-import
  layout = retrieval.LAYOUTS["long_range_retrieval_1k_mixed"]
  labels, dists = retrieval.generate_mixed_samples(5, 2, layout, with_distances=True)
  predictions = labels.copy()
  near = np.argwhere((dists >= 2) & (dists <= 64))[0]
  far = np.argwhere(dists >= 192)[:3]
  predictions[tuple(near)] += 1  # one miss in the nearest band
  for f in far:
    predictions[tuple(f)] += 1  # three misses beyond the local reach
  predictions[0, 0] += 1  # position 0 answers no look-up: in no band
  hp = registry.hparams("routing_transformer_tiny1k")  # local reach 191
  fns = retrieval.mixed_metric_fns(layout, hp)
  assert set(fns) == {"accuracy_d2_64", "accuracy_d65_191", "accuracy_d192_1000",
                      "near_accuracy", "far_accuracy"}
  for name, lo, hi, misses in (("accuracy_d2_64", 2, 64, 1), ("accuracy_d65_191", 65, 191, 0),
                               ("accuracy_d192_1000", 192, 1000, 3), ("near_accuracy", 1, 191, 1),
                               ("far_accuracy", 192, 1024, 3)):
    correct, weights = _metric_values(fns[name], labels, predictions, layout.vocab_size)
    in_band = (dists >= lo) & (dists <= hi)
    np.testing.assert_array_equal(weights, in_band.astype(np.float32))
    assert (weights * (1 - correct)).sum() == misses
  assert set(retrieval.mixed_metric_fns(layout)) == {
      "accuracy_d2_64", "accuracy_d65_191", "accuracy_d192_1000"}  # no model: bands only
  problem = registry.problem("long_range_retrieval_1k_mixed")
  assert "far_accuracy" in problem.eval_metric_fns(hp)
  for twin in ("full_transformer_tiny1k", "routing_only_transformer_tiny1k"):
    # full attention and routing heads alone split where their local twin would
    correct, weights = _metric_values(
        retrieval.mixed_metric_fns(layout, registry.hparams(twin))["far_accuracy"], labels,
        predictions, layout.vocab_size)
    np.testing.assert_array_equal(weights, (dists > 191).astype(np.float32))


def test_full_attention_reaches_everything_but_as_local_gives_its_twins_reach():
  import hparams  # pylint: disable=g-import-not-at-top,unused-import
  full = registry.hparams("full_transformer_tiny1k")
  assert cost.local_receptive_field(full) == 1023
  assert cost.local_receptive_field(full, as_local=True) == 191 == cost.local_receptive_field(
      registry.hparams("local_transformer_tiny1k"))
  routing_only = registry.hparams("routing_only_transformer_tiny1k")  # no local heads at all
  assert cost.local_receptive_field(routing_only) == 0
  assert cost.local_receptive_field(routing_only, as_local=True) == 191
