"""Base of the real-data problems: decoder-only records of `targets` ids, written restartably.

Ids: 0 is padding (the model masks it), 1 is EOS; every encoder here reserves both. A subclass
names its splits' sources and how one unit (a book, a window, an image) becomes examples; this
class writes the shards (`problems.shards`), builds or loads the vocabulary once, records per-split
statistics (tokens, words, ...) for evaluation, and fails with a `DataError` naming the command
to run when records are missing.
"""
import os

import tensorflow.compat.v1 as tf

from tensor2tensor.data_generators import problem
from tensor2tensor.data_generators import text_encoder
from tensor2tensor.layers import modalities

from problems import shards
from problems.errors import DataError
from routing_transformer.t2t import perplexity

PAD_ID = text_encoder.PAD_ID
EOS_ID = text_encoder.EOS_ID

VOCAB_MISMATCH = "VocabularyMismatch"
SPLITS = {"train": problem.DatasetSplit.TRAIN, "dev": problem.DatasetSplit.EVAL,
          "test": problem.DatasetSplit.TEST}


def windows(ids, length):
  """Splits ids [n] into consecutive non-overlapping windows of `length` (the last may be
  shorter)."""
  return [ids[i:i + length] for i in range(0, len(ids), length)]


def int_feature(ids):
  return [int(i) for i in ids]


class RecordsCheck(object):
  """Problem mixin: reading a split whose records are missing raises a DataError naming the
  t2t-datagen command (instead of an empty dataset or a deep TF error); a shard whose size
  differs from what datagen wrote raises a DataError naming it."""

  how_to_get = ""

  def require_records(self, data_dir, dataset_split):
    pattern = self.filepattern(data_dir, dataset_split)
    paths = tf.io.gfile.glob(pattern)
    if not paths:
      raise DataError(
          "%s: no records match %s. Generate them first: t2t-datagen "
          "--t2t_usr_dir=t2t_usr_dir --problem=%s --data_dir=%s --tmp_dir=<raw data>. %s"
          % (self.name, pattern, self.name, data_dir, self.how_to_get))
    shards.check_sizes(sorted(paths), self.dataset_filename())

  def dataset(self, mode, data_dir=None, *args, **kwargs):  # pylint: disable=keyword-arg-before-vararg
    split = kwargs.get("dataset_split") or (
        problem.DatasetSplit.TRAIN if mode == tf.estimator.ModeKeys.TRAIN
        else problem.DatasetSplit.EVAL)
    if data_dir:
      self.require_records(data_dir, split)
    ds = super().dataset(mode, data_dir, *args, **kwargs)
    hparams = kwargs.get("hparams")
    if hparams is not None and hparams.get("skip_corrupt_records", False):
      tf.logging.warning("%s: skipping corrupt or truncated records (skip_corrupt_records=True)",
                         self.name)
      ds = ds.apply(tf.data.experimental.ignore_errors(log_warning=True))
    return ds


class LanguageModelProblem(RecordsCheck, problem.Problem):
  """Records {"targets": ids}; subclasses set `length`, `num_shards` and the source hooks."""

  length = 8192
  num_shards = {"train": 100, "dev": 1, "test": 1}
  unit_name = "units"
  how_to_get = ""  # one sentence: where the raw data comes from

  # ---- hooks for subclasses ----
  def build_encoder(self, data_dir, tmp_dir):
    """Builds (or loads) and stores the vocabulary in data_dir; returns the encoder."""
    raise NotImplementedError

  def split_units(self, split, tmp_dir, encoder):
    """List of the units (books, windows, images) of `split` ("train", "dev" or "test")."""
    raise NotImplementedError

  def encode_unit(self, unit, encoder):
    """unit -> (list of example dicts, stats dict with at least "tokens")."""
    raise NotImplementedError

  def report(self, total_nll, num_tokens, stats):
    """The figures the evaluation prints for `total_nll` nats over `num_tokens` tokens."""
    del stats
    return perplexity.summary(total_nll, num_tokens)

  # ---- T2T Problem API ----
  @property
  def batch_size_means_tokens(self):
    return True

  def max_length(self, model_hparams):
    del model_hparams
    return self.length

  def shard_paths(self, data_dir, split):
    return self.data_filepaths(SPLITS[split], data_dir, self.num_shards[split], shuffled=True)

  def generate_data(self, data_dir, tmp_dir, task_id=-1):
    del task_id
    tf.io.gfile.makedirs(data_dir)
    name = self.dataset_filename()
    encoder = None
    for split in self.num_shards:
      paths = self.shard_paths(data_dir, split)
      if all(shards.shard_complete(p, name) for p in paths):
        tf.logging.info("%s %s: all %d shards complete, skipped.", name, split, len(paths))
        continue
      encoder = encoder or self.build_encoder(data_dir, tmp_dir)
      units = self.split_units(split, tmp_dir, encoder)
      if not units:
        raise DataError("%s: the %s split is empty. %s" % (name, split, self.how_to_get))
      stats = shards.write_split(paths, name, units, lambda u: self.encode_unit(u, encoder),
                                 "%s %s" % (name, split), self.unit_name,
                                 shuffle=split == "train")
      tf.logging.info("%s %s: %s", name, split, stats)
    shards.remove_if_empty(shards.side_dir(data_dir, name, "incomplete"))  # left by older runs

  def split_stats(self, data_dir, split):
    """Summed per-shard statistics of a generated split (tokens, examples, words, ...)."""
    return shards.split_stats(self.shard_paths(data_dir, split), self.dataset_filename())

  def hparams(self, defaults, model_hparams):
    del model_hparams
    defaults.modality = {"targets": modalities.ModalityType.SYMBOL}
    defaults.vocab_size = {"targets": self._encoders["targets"].vocab_size}

  def example_reading_spec(self):
    return {"targets": tf.VarLenFeature(tf.int64)}, None

  def dataset(self, mode, data_dir=None, *args, **kwargs):  # pylint: disable=keyword-arg-before-vararg
    """Records checked against the vocabulary: an id >= its size fails naming the mismatch."""
    ds = super().dataset(mode, data_dir, *args, **kwargs)
    if not data_dir or not kwargs.get("preprocess", True):
      return ds
    vocab = self.get_feature_encoders(data_dir)["targets"].vocab_size

    def check(example):
      ids = example["targets"]
      ok = tf.reduce_all(tf.logical_and(ids >= 0, ids < vocab))
      assertion = tf.debugging.Assert(ok, [
          "%s: records hold ids >= the vocabulary size %d of %s (max id:" % (
              VOCAB_MISMATCH, vocab, data_dir), tf.reduce_max(ids),
          "); the vocabulary file does not match the data: regenerate the records with "
          "t2t-datagen for this vocabulary, or restore the vocabulary they were made with"])
      with tf.control_dependencies([assertion]):
        example["targets"] = tf.identity(ids)
      return example

    return ds.map(check)


def vocab_path(data_dir, filename, problem_name):
  """Path of a stored vocabulary; DataError naming the datagen command when missing."""
  path = os.path.join(data_dir or "", filename)
  if not data_dir or not tf.io.gfile.exists(path):
    raise DataError("%s: vocabulary %s not found in --data_dir=%s. Run t2t-datagen "
                    "--t2t_usr_dir=t2t_usr_dir --problem=%s --data_dir=... first (or copy the "
                    "vocabulary file there)." % (problem_name, filename, data_dir, problem_name))
  return path


class ByteVocabulary(object):
  """Problem mixin: T2T's ByteTextEncoder (id = byte + 2, 258 ids); nothing to build or store."""

  def feature_encoders(self, data_dir):
    del data_dir
    return {"targets": text_encoder.ByteTextEncoder()}

  def build_encoder(self, data_dir, tmp_dir):
    del data_dir, tmp_dir
    return text_encoder.ByteTextEncoder()
