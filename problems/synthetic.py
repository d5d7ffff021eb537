"""Synthetic long-range key-value recall: a language-modelling problem that needs no download.

Each sequence of the default layout (`synthetic_long_range`) is exactly `LENGTH` tokens:

  positions 0..31     v_1 k_1 ... v_16 k_16      16 distinct keys, each preceded by its value
  positions 32..479   f_0 f_1 ... f_7 f_0 ...    filler counting modulo `NUM_FILLERS`
  positions 480..511  k_j v_j ...                the same 16 pairs again, shuffled, key first

Predicting a value of the final section ("far" positions) needs the matching pair more than
448 positions back, beyond a local attention window of 64 + flange 64. For routing attention it
is one content-based hop: the query key k_j and the early k_j are the same token (so they share
a cluster), and the early k_j's position carries its value (the previous token) once a local
layer has looked one token back. Keys and values are random, the filler is trivially local.
Ids: 0 padding, 1 EOS (reserved, unused), then keys, values and fillers.
Other layouts (`Layout`: length, number of pairs; the filler fills the rest) are registered as
synthetic_long_range_pairs8 / _pairs32 (512 tokens) and synthetic_long_range_1k /
_1k_pairs32 (1024 tokens), so results are not tied to one layout.
"""
import collections

import numpy as np
import tensorflow.compat.v1 as tf

from tensor2tensor.data_generators import problem
from tensor2tensor.data_generators import text_encoder
from tensor2tensor.layers import common_layers
from tensor2tensor.layers import modalities
from tensor2tensor.utils import registry

from problems import lm
from problems import shards

LENGTH = 512
NUM_PAIRS = 16
NUM_KEYS = 32
NUM_VALUES = 32
NUM_FILLERS = 8
PAD_ID = 0
EOS_ID = 1
NUM_RESERVED = 2
KEY_START = NUM_RESERVED
VALUE_START = KEY_START + NUM_KEYS
FILLER_START = VALUE_START + NUM_VALUES
VOCAB_SIZE = FILLER_START + NUM_FILLERS
PAIRS_LENGTH = 2 * NUM_PAIRS
FILLER_START_POSITION = PAIRS_LENGTH
QUERY_START = LENGTH - PAIRS_LENGTH
TRAIN_SEED = 1
EVAL_SEED = 2


class Layout(collections.namedtuple("Layout", ["length", "num_pairs"])):
  """A sequence of `length` tokens: `num_pairs` "v k" pairs, filler, the pairs again "k v"."""

  @property
  def query_start(self):
    return self.length - 2 * self.num_pairs

  @property
  def filler_length(self):
    return self.length - 4 * self.num_pairs

  def far_positions(self):
    """Target positions of the values in the final section (each needs a far look-up)."""
    return [self.query_start + 2 * i + 1 for i in range(self.num_pairs)]


DEFAULT = Layout(LENGTH, NUM_PAIRS)


def far_positions(layout=DEFAULT):
  """The far target positions of `layout` (any layout with a `far_positions()` method)."""
  return layout.far_positions()


def far_mask(length=LENGTH, layout=DEFAULT):
  """Boolean [length] mask, True at the far positions that fall inside `length`."""
  mask = np.zeros([length], dtype=bool)
  positions = [p for p in far_positions(layout) if p < length]
  mask[positions] = True
  return mask


def _pairs(keys, values):
  """Interleaves [num, pairs] keys and values into [num, 2 * pairs] tokens."""
  return np.stack([keys, values], axis=-1).reshape(keys.shape[0], -1)


def generate_samples(seed, num, layout=DEFAULT):
  """Returns `num` int64 sequences [num, layout.length], a pure function of `seed`."""
  if not 0 < layout.num_pairs <= NUM_KEYS or layout.filler_length < 0:
    raise ValueError("%s: needs 1..%d pairs and 4 * pairs <= length" % (layout, NUM_KEYS))
  rng = np.random.default_rng(seed)
  key_ids = np.argsort(rng.random((num, NUM_KEYS)), axis=1)[:, :layout.num_pairs]
  value_ids = rng.integers(0, NUM_VALUES, size=(num, layout.num_pairs))
  order = np.argsort(rng.random((num, layout.num_pairs)), axis=1)
  keys = KEY_START + key_ids
  values = VALUE_START + value_ids
  first = _pairs(values, keys)  # value first: the key's position then carries its value
  last = _pairs(np.take_along_axis(keys, order, axis=1),
                np.take_along_axis(values, order, axis=1))
  filler_positions = np.arange(layout.filler_length)
  filler = np.broadcast_to(FILLER_START + filler_positions % NUM_FILLERS,
                           (num, filler_positions.size))
  return np.concatenate([first, filler, last], axis=1).astype(np.int64)


def token_name(i):
  """Readable name of one id: <pad>, <EOS>, k12, v7, f3."""
  i = int(i)
  if i == PAD_ID:
    return "<pad>"
  if i == EOS_ID:
    return "<EOS>"
  for prefix, start, count in (("k", KEY_START, NUM_KEYS), ("v", VALUE_START, NUM_VALUES),
                               ("f", FILLER_START, NUM_FILLERS)):
    if start <= i < start + count:
      return "%s%d" % (prefix, i - start)
  raise ValueError("Id %d is outside the synthetic vocabulary [0, %d)." % (i, VOCAB_SIZE))


def token_id(name):
  """Inverse of `token_name`."""
  if name == "<pad>":
    return PAD_ID
  if name == "<EOS>":
    return EOS_ID
  starts = {"k": (KEY_START, NUM_KEYS), "v": (VALUE_START, NUM_VALUES),
            "f": (FILLER_START, NUM_FILLERS)}
  start, count = starts.get(name[:1], (None, 0))
  index = int(name[1:]) if name[1:].isdigit() else -1
  if start is None or not 0 <= index < count:
    raise ValueError("Unknown synthetic token %r; expected k0..k%d, v0..v%d, f0..f%d, <pad> "
                     "or <EOS>." % (name, NUM_KEYS - 1, NUM_VALUES - 1, NUM_FILLERS - 1))
  return start + index


class SyntheticEncoder(text_encoder.TextEncoder):
  """Maps the synthetic ids to and from readable text such as `k12 v7 f3`."""

  def __init__(self):
    super().__init__(num_reserved_ids=NUM_RESERVED)

  @property
  def vocab_size(self):
    return VOCAB_SIZE

  def encode(self, s):
    return [token_id(name) for name in s.split()]

  def decode(self, ids, strip_extraneous=False):
    if strip_extraneous:
      ids = text_encoder.strip_ids(ids, list(range(NUM_RESERVED)))
    return " ".join(self.decode_list(ids))

  def decode_list(self, ids):
    return [token_name(i) for i in np.asarray(ids).reshape([-1])]


def _position_indicator(labels, positions):
  """Float tensor shaped like `labels`: 1.0 where the index on axis 1 is in `positions`."""
  index = tf.range(tf.shape(labels)[1])
  hit = tf.reduce_any(tf.equal(index[:, None], tf.constant(positions, tf.int32)[None, :]),
                      axis=1)
  hit = tf.reshape(tf.cast(hit, tf.float32), [1, -1] + [1] * (labels.shape.ndims - 2))
  return hit * tf.ones_like(labels, dtype=tf.float32)


def token_accuracy(predictions, labels, weights_fn):
  """Per-token correctness of argmax(predictions), padding weights, padded labels."""
  predictions, labels = common_layers.pad_with_zeros(predictions, labels)
  weights = (weights_fn or common_layers.weights_nonzero)(labels)
  outputs = tf.cast(tf.argmax(predictions, axis=-1), tf.int32)
  correct = tf.cast(tf.equal(outputs, tf.cast(labels, tf.int32)), tf.float32)
  return correct, weights, labels


def far_accuracy(predictions, labels, weights_fn=None, layout=DEFAULT):
  """Accuracy over the far positions only (T2T metric: returns scores and weights)."""
  with tf.variable_scope("far_accuracy", values=[predictions, labels]):
    correct, weights, labels = token_accuracy(predictions, labels, weights_fn)
    return correct, weights * _position_indicator(labels, far_positions(layout))


def near_accuracy(predictions, labels, weights_fn=None, layout=DEFAULT):
  """Accuracy over the non-far, non-padding positions."""
  with tf.variable_scope("near_accuracy", values=[predictions, labels]):
    correct, weights, labels = token_accuracy(predictions, labels, weights_fn)
    return correct, weights * (1.0 - _position_indicator(labels, far_positions(layout)))


def layout_metric(metric, layout):
  """`metric` bound to `layout`, with the plain signature T2T inspects (getargspec)."""

  def fn(predictions, labels, weights_fn=None):
    return metric(predictions, labels, weights_fn, layout)

  return fn


class GeneratedSequences(lm.RecordsCheck, problem.Problem):
  """A problem whose splits are `generate(seed, num, layout)` sequences (no download), one seed
  per split (`seeds`: train, eval), written restartably (`problems.shards`)."""

  layout = None
  num_train = 20000
  num_eval = 1000
  num_train_shards = 4
  num_eval_shards = 1
  seeds = (None, None)

  @staticmethod
  def generate(seed, num, layout):
    raise NotImplementedError

  @property
  def dataset_splits(self):
    return [
        {"split": problem.DatasetSplit.TRAIN, "shards": self.num_train_shards,
         "seed": self.seeds[0], "num": self.num_train},
        {"split": problem.DatasetSplit.EVAL, "shards": self.num_eval_shards,
         "seed": self.seeds[1], "num": self.num_eval},
    ]

  @property
  def batch_size_means_tokens(self):
    return True

  def generate_data(self, data_dir, tmp_dir, task_id=-1):
    """Writes the splits restartably (`problems.shards`): complete shards are kept."""
    del tmp_dir, task_id
    tf.io.gfile.makedirs(data_dir)
    for split in self.dataset_splits:
      paths = self.data_filepaths(split["split"], data_dir, split["shards"], shuffled=True)
      samples = self.generate(split["seed"], split["num"], self.layout)
      shards.write_split(paths, self.dataset_filename(), list(samples),
                         lambda row: ([{"targets": row.tolist()}], {"tokens": len(row)}),
                         "%s %s" % (self.name, split["split"]), "sequences", shuffle=False)


@registry.register_problem
class SyntheticLongRange(GeneratedSequences):
  """Key-value recall across `LENGTH` tokens (T2T name: synthetic_long_range)."""

  layout = DEFAULT
  seeds = (TRAIN_SEED, EVAL_SEED)
  generate = staticmethod(generate_samples)

  def feature_encoders(self, data_dir):
    del data_dir
    return {"targets": SyntheticEncoder()}

  def hparams(self, defaults, model_hparams):
    del model_hparams
    defaults.modality = {"targets": modalities.ModalityType.SYMBOL}
    defaults.vocab_size = {"targets": VOCAB_SIZE}

  def example_reading_spec(self):
    return {"targets": tf.VarLenFeature(tf.int64)}, None

  def eval_metric_fns(self, model_hparams):
    metric_fns = dict(super().eval_metric_fns(model_hparams))
    metric_fns["far_accuracy"] = layout_metric(far_accuracy, self.layout)
    metric_fns["near_accuracy"] = layout_metric(near_accuracy, self.layout)
    return metric_fns


@registry.register_problem
class SyntheticLongRangePairs8(SyntheticLongRange):
  """512 tokens, 8 pairs: a longer filler (480 tokens)."""

  layout = Layout(512, 8)


@registry.register_problem
class SyntheticLongRangePairs32(SyntheticLongRange):
  """512 tokens, 32 pairs (every key): a shorter filler (384 tokens), more recalls."""

  layout = Layout(512, 32)


@registry.register_problem("synthetic_long_range_1k")
class SyntheticLongRange1k(SyntheticLongRange):
  """1024 tokens, 16 pairs: a 960-token filler."""

  layout = Layout(1024, 16)


@registry.register_problem("synthetic_long_range_1k_pairs32")
class SyntheticLongRange1kPairs32(SyntheticLongRange):
  """1024 tokens, 32 pairs: an 896-token filler."""

  layout = Layout(1024, 32)
