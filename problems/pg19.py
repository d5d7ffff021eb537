"""PG-19 (Rae et al., 2020) for `t2t-datagen --problem=pg19_length8k` (and the shorter
`pg19_length4k` / `pg19_length2k` for small machines).

Sources, first match wins:
  * `PG19_TFDS_DATA_DIR=<dir>`: a prepared tensorflow-datasets `pg19` (e.g. `tfds build pg19
    --data_dir=<dir>`), read split by split;
  * `PG19_DIR=<root>` (may be `gs://deepmind-gutenberg`), else `--tmp_dir` or `--tmp_dir/pg19`:
    the official layout `metadata.csv` + `train/`, `validation/`, `test/` of `<book_id>.txt`.
Reading (`problems.pg19_reading`, the same for the scorer and the probes): by default the
original release's: each line of a book stripped and encoded on its own, the lines' ids joined
without newlines; `PG19_READING=whole_text` encodes each book whole, newlines included (for
vocabularies built that way).
Vocabulary: T2T's SubwordTextEncoder stored as `vocab.pg19_length8k.<size>.subwords` in
`--data_dir` (the released file's name is `vocab.pg19_length8k.32768.subwords`). An existing file
of that name (in data_dir, or `PG19_VOCAB_FILE`) is used as it is; otherwise one of
`PG19_VOCAB_SIZE` (default 2**15) subwords is built from the first `PG19_VOCAB_MAX_CHARS`
(default 2e8) characters of the training books' stripped lines (whole texts with
`PG19_READING=whole_text`).
Each book's lines are packed greedily, whole, into examples of at most 8192 (4096, 2048) tokens
(`pg19_reading.pack`; a longer line is cut), the book's last example ending with EOS: no example
joins two books. pg19_length4k builds 2**13 subwords by default, pg19_length2k 2**12
(`vocab.pg19_length2k.4096.subwords`; the size is the build target, the file's line count is the
real size). Word counts per split are stored for word-level perplexity, and per book whether it
was read whole (`whole_text_books`).
"""
import csv
import io
import os

import tensorflow.compat.v1 as tf

from tensor2tensor.data_generators import text_encoder
from tensor2tensor.utils import registry

from problems import lm
from problems import pg19_reading
from problems import shards
from problems.errors import DataError
from problems.errors import require_dir
from routing_transformer.t2t import perplexity

SPLIT_DIRS = {"train": "train", "dev": "validation", "test": "test"}
TFDS_SPLITS = {"train": "train", "dev": "validation", "test": "test"}
HOW_TO_GET = ("Get PG-19 with `gsutil -m cp -r gs://deepmind-gutenberg <dir>` (or set "
              "PG19_DIR=gs://deepmind-gutenberg), then pass --tmp_dir=<dir> or PG19_DIR=<dir>; "
              "the layout is metadata.csv plus train/, validation/ and test/ folders of "
              "<book_id>.txt.")


def reading_of_env():
  """The reading datagen uses: PG19_READING (lines, the default, or whole_text)."""
  return pg19_reading.check(os.environ.get("PG19_READING", pg19_reading.LINES))


def read_metadata(root):
  """{book_id: title} from `metadata.csv` (id, title, date, url; no header), or {} if absent."""
  path = os.path.join(root, "metadata.csv")
  if not tf.io.gfile.exists(path):
    tf.logging.warning("PG-19: %s not found; book titles unknown.", path)
    return {}
  with tf.io.gfile.GFile(path) as f:
    rows = list(csv.reader(io.StringIO(f.read())))
  out = {}
  for row in rows:
    if row and row[0].strip().isdigit():
      out[int(row[0])] = row[1] if len(row) > 1 else ""
  return out


def decode_book(data, where):
  """Book bytes -> stripped text; DataError for non-UTF-8 or empty books."""
  try:
    text = data.decode("utf-8") if isinstance(data, bytes) else data
  except UnicodeDecodeError as e:
    raise DataError("PG-19 book %s is not UTF-8 text (%s). %s" % (where, e, HOW_TO_GET))
  text = text.strip()
  if not text:
    raise DataError("PG-19 book %s is empty; remove it or restore it from the source. %s"
                    % (where, HOW_TO_GET))
  return text


class FolderSource(object):
  """Books of the official layout under `root` (local path or gs://)."""

  def __init__(self, root):
    self.root = root
    self.titles = read_metadata(root)

  def books(self, split):
    folder = require_dir(os.path.join(self.root, SPLIT_DIRS[split]), "PG-19 " + split,
                         HOW_TO_GET)
    names = [n for n in tf.io.gfile.listdir(folder) if n.endswith(".txt")]
    bad = [n for n in names if not n[:-len(".txt")].isdigit()]
    if bad:
      raise DataError("PG-19: %s holds files not named <book_id>.txt, e.g. %r. %s"
                      % (folder, bad[0], HOW_TO_GET))
    if not names:
      raise DataError("PG-19: %s holds no <book_id>.txt books. %s" % (folder, HOW_TO_GET))
    missing = [n for n in names if self.titles and int(n[:-4]) not in self.titles]
    if missing:
      tf.logging.warning("PG-19: %d books of %s are not in metadata.csv, e.g. %s",
                         len(missing), folder, missing[0])
    return sorted((int(n[:-4]), os.path.join(folder, n)) for n in names)

  def read(self, book):
    book_id, path = book
    with tf.io.gfile.GFile(path, "rb") as f:
      return book_id, decode_book(f.read(), path)


class TfdsSource(object):
  """Books of a prepared tensorflow-datasets `pg19` in `data_dir`, read in blocks."""

  block = 64

  def __init__(self, data_dir):
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    self.tfds = tfds
    try:
      self.builder = tfds.builder("pg19", data_dir=data_dir)
      self.info = self.builder.info.splits
      self.builder.info.splits[TFDS_SPLITS["train"]]  # pylint: disable=pointless-statement
    except Exception as e:  # pylint: disable=broad-except
      raise DataError("PG-19: no prepared tensorflow-datasets pg19 in PG19_TFDS_DATA_DIR=%s "
                      "(%s). Prepare it with `tfds build pg19 --data_dir=%s`, or unset "
                      "PG19_TFDS_DATA_DIR to read the official layout." % (data_dir, e, data_dir))
    self.cache = (None, None)

  def books(self, split):
    n = self.info[TFDS_SPLITS[split]].num_examples
    return [(split, i) for i in range(n)]

  def read(self, book):
    split, i = book
    start = i - i % self.block
    key = (split, start)
    if self.cache[0] != key:
      end = min(start + self.block, self.info[TFDS_SPLITS[split]].num_examples)
      ds = self.builder.as_dataset(split="%s[%d:%d]" % (TFDS_SPLITS[split], start, end),
                                   shuffle_files=False)
      self.cache = (key, [(int(e["book_id"]), e["book_text"]) for e in self.tfds.as_numpy(ds)])
    book_id, text = self.cache[1][i - start]
    return book_id, decode_book(text, "%s (tfds %s #%d)" % (book_id, split, i))


def source(tmp_dir):
  """The PG-19 source named by the environment, else the official layout in tmp_dir."""
  tfds_dir = os.environ.get("PG19_TFDS_DATA_DIR")
  if tfds_dir:
    return TfdsSource(tfds_dir)
  root = os.environ.get("PG19_DIR")
  if not root:
    candidates = [d for d in (tmp_dir, os.path.join(tmp_dir or "", "pg19"),
                              os.path.join(tmp_dir or "", "deepmind-gutenberg"))
                  if d and tf.io.gfile.isdir(os.path.join(d, "train"))
                  or d and tf.io.gfile.isdir(os.path.join(d, "validation"))]
    root = candidates[0] if candidates else None
  if not root:
    raise DataError("PG-19: no train/ or validation/ folder under --tmp_dir=%s (nor %s/pg19); "
                    "set PG19_DIR or PG19_TFDS_DATA_DIR. %s" % (tmp_dir, tmp_dir, HOW_TO_GET))
  return FolderSource(root)


@registry.register_problem
class Pg19Length8k(lm.LanguageModelProblem):
  """PG-19 books, subword vocabulary, examples of <= 8192 tokens (T2T name: pg19_length8k)."""

  length = 8192
  num_shards = {"train": 100, "dev": 1, "test": 1}
  unit_name = "books"
  how_to_get = HOW_TO_GET
  default_vocab_size = 2**15

  @property
  def vocab_size_target(self):
    return int(os.environ.get("PG19_VOCAB_SIZE", self.default_vocab_size))

  @property
  def vocab_filename(self):
    return "vocab.%s.%d.subwords" % (self.dataset_filename(), self.vocab_size_target)

  def stored_vocab(self, data_dir):
    """The vocabulary datagen stored in data_dir: `vocab.pg19_length8k.<size>.subwords`, the
    one of PG19_VOCAB_SIZE if set, else the only one there."""
    if "PG19_VOCAB_SIZE" in os.environ or not data_dir:
      return lm.vocab_path(data_dir, self.vocab_filename, self.name)
    found = sorted(tf.io.gfile.glob(os.path.join(
        data_dir, "vocab.%s.*.subwords" % self.dataset_filename())))
    if len(found) > 1:
      raise DataError("%s: several vocabularies in %s (%s); set PG19_VOCAB_SIZE to choose."
                      % (self.name, data_dir, ", ".join(os.path.basename(f) for f in found)))
    return found[0] if found else lm.vocab_path(data_dir, self.vocab_filename, self.name)

  def feature_encoders(self, data_dir):
    """The stored vocabulary as a `pg19_reading.Encoder`: encode(text) reads text as datagen read
    the books (PG19_READING), e.g. t2t-decoder's prompts."""
    return {"targets": pg19_reading.Encoder(self.stored_vocab(data_dir), reading_of_env())}

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self._source = None

  def source(self, tmp_dir):
    if self._source is None:
      self._source = source(tmp_dir)
    return self._source

  def vocab_texts(self, tmp_dir, max_chars):
    """What the vocabulary is built from: the training books read as PG19_READING reads them
    (stripped lines, or whole texts), up to `max_chars` characters in all."""
    src = self.source(tmp_dir)
    books = (src.read(book)[1] for book in src.books("train"))
    return pg19_reading.vocab_pieces(books, reading_of_env(), max_chars)

  def build_encoder(self, data_dir, tmp_dir):
    path = os.path.join(data_dir, self.vocab_filename)
    given = os.environ.get("PG19_VOCAB_FILE")
    if given and not tf.io.gfile.exists(path):
      if not tf.io.gfile.exists(given):
        raise DataError("PG19_VOCAB_FILE=%s does not exist. The released vocabulary is "
                        "vocab.pg19_length8k.32768.subwords." % given)
      shards.write_then_rename(path, lambda tmp: tf.io.gfile.copy(given, tmp, overwrite=True))
    reading = reading_of_env()
    if tf.io.gfile.exists(path):
      tf.logging.info("PG-19: using the vocabulary %s (reading: %s)", path, reading)
      encoder = pg19_reading.Encoder(path, reading)
      try:
        pg19_reading.check_vocabulary(encoder, reading, "PG19_READING=whole_text")
      except DataError as e:
        raise DataError("PG-19: %s: %s" % (path, e))
      return encoder
    max_chars = int(float(os.environ.get("PG19_VOCAB_MAX_CHARS", 2e8)))
    tf.logging.info("PG-19: building a %d-subword vocabulary from up to %d characters of the "
                    "training books (reading: %s; set PG19_VOCAB_FILE to use a given one).",
                    self.vocab_size_target, max_chars, reading)
    encoder = text_encoder.SubwordTextEncoder.build_from_generator(
        self.vocab_texts(tmp_dir, max_chars), self.vocab_size_target)
    shards.write_then_rename(path, encoder.store_to_file)
    return pg19_reading.Encoder(path, reading)

  def split_units(self, split, tmp_dir, encoder):
    del encoder
    return self.source(tmp_dir).books(split)

  def encode_unit(self, unit, encoder):
    """One book -> its examples (`pg19_reading.pack` of its pieces, EOS last) and statistics."""
    book_id, text = self._source.read(unit)
    reading = getattr(encoder, "reading", reading_of_env())
    packed = pg19_reading.pack(pg19_reading.encode_pieces(encoder, text, reading), self.length,
                               lm.EOS_ID)
    examples = [{"targets": lm.int_feature(w), "book_id": [book_id], "chunk": [k]}
                for k, w in enumerate(packed)]
    return examples, {"tokens": sum(len(w) for w in packed),
                      "words": perplexity.count_words(text), "books": 1, "chars": len(text),
                      "whole_text_books": int(reading == pg19_reading.WHOLE_TEXT)}

  def report(self, total_nll, num_tokens, stats):
    """Subword and word-level perplexity. The denominator is the official PG-19 word count when
    the evaluated split is the whole official one (same number of books), else the words
    counted at datagen (`str.split()`)."""
    words, source = stats.get("words"), "counted"
    official = {"dev": "validation", "test": "test"}.get(stats.get("split"))
    if official and stats.get("books") == perplexity.PG19_BOOKS[official]:
      words, source = perplexity.PG19_WORDS[official], "official"
    out = perplexity.summary(total_nll, num_tokens, words)
    out.update(counted_words=stats.get("words"), word_count=source)
    return out


@registry.register_problem
class Pg19Length4k(Pg19Length8k):
  """PG-19 cut into examples of <= 4096 subwords (smaller machines); 8,192-subword vocabulary
  by default (PG19_VOCAB_SIZE sets it)."""

  length = 4096
  num_shards = {"train": 10, "dev": 1, "test": 1}
  default_vocab_size = 2**13


@registry.register_problem
class Pg19Length2k(Pg19Length4k):
  """PG-19 cut into examples of <= 2048 subwords: small machines and `make demo` (the
  Shakespeare books of `problems.shakespeare` in the PG-19 layout); 4,096-subword vocabulary by
  default."""

  length = 2048
  default_vocab_size = 2**12
