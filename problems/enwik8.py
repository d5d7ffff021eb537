"""enwik8 (Hutter Prize; first 1e8 bytes of an English Wikipedia dump) at the byte level.

`t2t-datagen --problem=enwik8_length8k` reads `enwik8` or `enwik8.zip` from `ENWIK8_PATH`, or
from `--tmp_dir`; standard split: the first 90M bytes train, the next 5M dev, the last 5M test.
Ids are byte + 2 (T2T's ByteTextEncoder: 0 padding, 1 EOS), 258 in all; examples are
consecutive non-overlapping 8192-byte windows. Evaluation reports bits per byte.
"""
import io
import os
import zipfile

import numpy as np
import tensorflow.compat.v1 as tf

from tensor2tensor.data_generators import text_encoder
from tensor2tensor.utils import registry

from problems import lm
from problems.errors import DataError
from problems.errors import first_existing
from problems.errors import require_file
from routing_transformer.t2t import perplexity

STANDARD_SIZE = 100000000
STANDARD_SPLIT = (90000000, 5000000, 5000000)
NUM_RESERVED = text_encoder.NUM_RESERVED_TOKENS
HOW_TO_GET = ("Get it with `wget http://mattmahoney.net/dc/enwik8.zip` and pass the folder as "
              "--tmp_dir (or set ENWIK8_PATH to the file); enwik8.zip or the unzipped enwik8.")


def read_enwik8(path):
  """The raw bytes of `enwik8` or of the `enwik8` member of `enwik8.zip`."""
  require_file(path, "enwik8", HOW_TO_GET)
  with tf.io.gfile.GFile(path, "rb") as f:
    data = f.read()
  if path.endswith(".zip"):
    try:
      with zipfile.ZipFile(io.BytesIO(data)) as z:
        if "enwik8" not in z.namelist():
          raise DataError("enwik8: %s has no member named enwik8 (has %s). %s"
                          % (path, z.namelist()[:5], HOW_TO_GET))
        data = z.read("enwik8")
    except zipfile.BadZipFile as e:
      raise DataError("enwik8: %s is not a valid zip file (%s). %s" % (path, e, HOW_TO_GET))
  if not data:
    raise DataError("enwik8: %s holds no bytes. %s" % (path, HOW_TO_GET))
  return data


def split_bytes(data):
  """{"train", "dev", "test"} byte strings: 90M/5M/5M, or 90%/5%/5% of a non-standard file."""
  if len(data) == STANDARD_SIZE:
    a, b = STANDARD_SPLIT[0], STANDARD_SPLIT[0] + STANDARD_SPLIT[1]
  else:
    tf.logging.warning("enwik8: %d bytes, not the standard %d; splitting 90%%/5%%/5%%.",
                       len(data), STANDARD_SIZE)
    a, b = len(data) * 90 // 100, len(data) * 95 // 100
  return {"train": data[:a], "dev": data[a:b], "test": data[b:]}


def byte_ids(data):
  """bytes -> int64 ids [n] (byte + 2)."""
  return np.frombuffer(data, dtype=np.uint8).astype(np.int64) + NUM_RESERVED


@registry.register_problem
class Enwik8Length8k(lm.ByteVocabulary, lm.LanguageModelProblem):
  """enwik8 bytes in 8192-byte examples (T2T name: enwik8_length8k)."""

  length = 8192
  num_shards = {"train": 10, "dev": 1, "test": 1}
  unit_name = "windows"
  how_to_get = HOW_TO_GET

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self._splits = None

  def raw_path(self, tmp_dir):
    tmp_dir = tmp_dir or ""
    given = os.environ.get("ENWIK8_PATH")
    path = given or first_existing([os.path.join(tmp_dir, "enwik8"),
                                    os.path.join(tmp_dir, "enwik8.zip")])
    if not path:
      raise DataError("enwik8: neither enwik8 nor enwik8.zip in --tmp_dir=%s. %s"
                      % (tmp_dir, HOW_TO_GET))
    return path

  def split_units(self, split, tmp_dir, encoder):
    del encoder
    if self._splits is None:  # the file is read once for the three splits
      self._splits = split_bytes(read_enwik8(self.raw_path(tmp_dir)))
    return lm.windows(memoryview(self._splits[split]), self.length)  # views, not copies

  def encode_unit(self, unit, encoder):
    del encoder
    ids = byte_ids(unit)
    return [{"targets": lm.int_feature(ids)}], {"tokens": len(ids), "bytes": len(ids)}

  def report(self, total_nll, num_tokens, stats):
    out = perplexity.summary(total_nll, num_tokens)
    out["bits_per_byte"] = perplexity.bits_per_unit(total_nll, num_tokens, "byte")
    return out


@registry.register_problem
class Enwik8Length12k(Enwik8Length8k):
  """enwik8 bytes in 12288-byte examples, for the `enwik8_local*12k` sets (T2T name:
  enwik8_length12k)."""

  length = 12288
