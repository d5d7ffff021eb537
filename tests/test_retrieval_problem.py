"""The one-hop long-range retrieval problems (problems/retrieval.py): layouts, determinism, far
positions beyond the local receptive field, refusals naming the fix, the far-accuracy metric."""
import numpy as np
import pytest

import t2t_usr_dir  # pylint: disable=unused-import
from problems import retrieval
from routing_transformer.core import cost
from tensor2tensor.utils import registry

R = retrieval.NUM_RESERVED


@pytest.mark.parametrize("name", sorted(retrieval.LAYOUTS))
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


@pytest.mark.parametrize("name", sorted(retrieval.LAYOUTS))
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
