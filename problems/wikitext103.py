"""WikiText-103 (Merity et al., 2016) at the word level.

`t2t-datagen --problem=wikitext103_length4k` (also `_length2k`, `_length1k`) reads
`wiki.train.tokens`, `wiki.valid.tokens` and `wiki.test.tokens` from `WIKITEXT103_DIR`, or from
`--tmp_dir` or `--tmp_dir/wikitext-103`. Every line is its whitespace-separated words followed by
EOS (id 1); the vocabulary is every word of the training file, most frequent first, stored as
`vocab.wikitext103.tokens` in --data_dir (shared by the three lengths). Each split is one token
stream cut into consecutive non-overlapping windows: training windows of `length`, and the
evaluation windows likewise, so every token is scored exactly once. Evaluation reports perplexity
per token (words and EOS, the standard convention).
"""
import collections
import os

import numpy as np
import tensorflow.compat.v1 as tf

from tensor2tensor.data_generators import text_encoder
from tensor2tensor.utils import registry

from problems import lm
from problems import shards
from problems.errors import DataError
from problems.errors import require_file

FILES = {"train": "wiki.train.tokens", "dev": "wiki.valid.tokens", "test": "wiki.test.tokens"}
UNK = "<unk>"
VOCAB_FILENAME = "vocab.wikitext103.tokens"
HOW_TO_GET = ("Get the wikitext-103-v1 files of the Hugging Face dataset Salesforce/wikitext "
              "(https://huggingface.co/datasets/Salesforce/wikitext; the original zip is no longer "
              "served), write them as wiki.train.tokens, wiki.valid.tokens and wiki.test.tokens "
              "(docs/training.md, WikiText-103) and pass --tmp_dir=<folder holding them or "
              "wikitext-103/> or set WIKITEXT103_DIR.")


def find_root(tmp_dir):
  """The folder holding the wiki.*.tokens files."""
  given = os.environ.get("WIKITEXT103_DIR")
  candidates = [given] if given else [tmp_dir, os.path.join(tmp_dir or "", "wikitext-103")]
  for root in candidates:
    if root and tf.io.gfile.exists(os.path.join(root, FILES["train"])):
      return root
  raise DataError("WikiText-103: %s not found in %s. %s"
                  % (FILES["train"], " or ".join(c for c in candidates if c), HOW_TO_GET))


def read_lines(path):
  require_file(path, "WikiText-103", HOW_TO_GET)
  with tf.io.gfile.GFile(path, "rb") as f:
    data = f.read()
  try:
    return data.decode("utf-8").splitlines()
  except UnicodeDecodeError as e:
    raise DataError("WikiText-103: %s is not UTF-8 text (%s). %s" % (path, e, HOW_TO_GET))


def build_vocab(lines):
  """Words of `lines`, most frequent first (ties alphabetical), with <unk> included."""
  counts = collections.Counter(w for line in lines for w in line.split())
  if not counts:
    raise DataError("WikiText-103: the training file holds no words. %s" % HOW_TO_GET)
  counts.setdefault(UNK, 0)
  return [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def encode_lines(lines, encoder):
  """One int32 stream [n]: each line's word ids, then EOS."""
  ids = []
  for line in lines:
    ids.extend(encoder.encode(line))
    ids.append(lm.EOS_ID)
  return np.asarray(ids, dtype=np.int32)


class WikiText103(lm.LanguageModelProblem):
  """Word-level WikiText-103 in windows of `length` tokens."""

  num_shards = {"train": 10, "dev": 1, "test": 1}
  unit_name = "windows"
  how_to_get = HOW_TO_GET

  def feature_encoders(self, data_dir):
    path = lm.vocab_path(data_dir, VOCAB_FILENAME, self.name)
    return {"targets": text_encoder.TokenTextEncoder(path, replace_oov=UNK)}

  def build_encoder(self, data_dir, tmp_dir):
    path = os.path.join(data_dir, VOCAB_FILENAME)
    if not tf.io.gfile.exists(path):
      lines = read_lines(os.path.join(find_root(tmp_dir), FILES["train"]))
      encoder = text_encoder.TokenTextEncoder(None, vocab_list=build_vocab(lines),
                                              replace_oov=UNK)
      shards.write_then_rename(path, encoder.store_to_file)
      tf.logging.info("WikiText-103: vocabulary of %d tokens written to %s",
                      encoder.vocab_size, path)
    return text_encoder.TokenTextEncoder(path, replace_oov=UNK)

  def split_units(self, split, tmp_dir, encoder):
    lines = read_lines(os.path.join(find_root(tmp_dir), FILES[split]))
    if not any(line.strip() for line in lines):
      raise DataError("WikiText-103: %s holds no words. %s" % (FILES[split], HOW_TO_GET))
    return lm.windows(encode_lines(lines, encoder), self.length)  # views of one split's stream

  def encode_unit(self, unit, encoder):
    del encoder
    return [{"targets": lm.int_feature(unit)}], {"tokens": len(unit),
                                                  "words": int(np.sum(unit != lm.EOS_ID))}


@registry.register_problem
class Wikitext103Length4k(WikiText103):
  length = 4096


@registry.register_problem
class Wikitext103Length2k(WikiText103):
  length = 2048


@registry.register_problem
class Wikitext103Length1k(WikiText103):
  length = 1024
