"""Real-data problems on miniature datasets in the official layouts (tests/datasets.py).

Data is generated once per problem (module-scoped fixtures): PG-19 through the stock
`t2t-datagen`, the others in-process as t2t-datagen does it (`generate`: its seed, then the
problem's generate_data), sparing a 10-s process start each; records are read back and compared
with the raw text, bytes and pixels; errors, restartability and the evaluation arithmetic are
checked in-process, a missing-data error also through the binary.
"""
import collections
import glob
import math
import os

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import datasets
from conftest import run_t2t

import t2t_usr_dir  # pylint: disable=unused-import
from problems import enwik8
from problems import lm
from problems import shards
from problems.errors import DataError
from routing_transformer.t2t import perplexity
from tensor2tensor.utils import registry

PG19_VOCAB = 300


def datagen(problem, data_dir, tmp_dir, env=None, check=True):
  """Runs stock t2t-datagen; returns the CompletedProcess."""
  proc = run_t2t("t2t-datagen", "--problem=" + problem, "--data_dir=%s" % data_dir,
                 "--tmp_dir=%s" % tmp_dir, env=env)
  if check:
    assert proc.returncode == 0, proc.stderr[-3000:]
  return proc


DATAGEN_SEED = 429459  # t2t-datagen's --random_seed default


def generate(problem, data_dir, tmp_dir):
  """What stock t2t-datagen does for a registered problem, in-process: its seeds, then
  problem.generate_data(data_dir, tmp_dir, task_id=None) (the binary itself: `datagen`)."""
  import random  # pylint: disable=g-import-not-at-top
  random.seed(DATAGEN_SEED)
  np.random.seed(DATAGEN_SEED)
  registry.problem(problem).generate_data(str(data_dir), str(tmp_dir), None)


def read_records(problem_name, data_dir, split):
  """List of feature dicts {name: np.array} of every record of `split` (raw, unprocessed)."""
  pattern = os.path.join(str(data_dir), "%s-%s*" % (problem_name, split))
  out = []
  for path in sorted(glob.glob(pattern)):
    for record in tf.io.tf_record_iterator(path):
      ex = tf.train.Example.FromString(record)
      row = {}
      for k, f in ex.features.feature.items():
        row[k] = (np.array(f.int64_list.value) if f.HasField("int64_list")
                  else list(f.bytes_list.value))
      out.append(row)
  return out


def dataset_targets(problem_name, data_dir, split, hparams=None):
  """`targets` of every example of a split through the problem's own reader (dataset())."""
  problem = registry.problem(problem_name)
  with tf.Graph().as_default():
    ds = problem.dataset(tf.estimator.ModeKeys.EVAL, str(data_dir), shuffle_files=False,
                         dataset_split=lm.SPLITS[split], hparams=hparams)
    nxt = tf.data.make_one_shot_iterator(ds).get_next()
    out = []
    with tf.Session() as sess:
      while True:
        try:
          out.append(sess.run(nxt)["targets"])
        except tf.errors.OutOfRangeError:
          return out


# ------------------------------------------------------------------------------------------ PG-19

@pytest.fixture(scope="module")
def pg19(tmp_path_factory):
  raw = tmp_path_factory.mktemp("pg19_raw")
  texts = datasets.make_pg19(str(raw))
  data_dir = tmp_path_factory.mktemp("pg19_data")
  proc = datagen("pg19_length8k", data_dir, raw, env={"PG19_VOCAB_SIZE": str(PG19_VOCAB)})
  return {"raw": raw, "texts": texts, "data_dir": data_dir, "log": proc.stderr}


def pg19_encoder(data_dir):
  return registry.problem("pg19_length8k").feature_encoders(str(data_dir))["targets"]


def books_from_records(records):
  by_book = collections.defaultdict(list)
  for r in records:
    by_book[int(r["book_id"][0])].append((int(r["chunk"][0]), r["targets"]))
  return {b: np.concatenate([t for _, t in sorted(chunks)]) for b, chunks in by_book.items()}


def plain_encoder(data_dir, problem_name="pg19_length8k"):
  """The stored vocabulary as T2T's own SubwordTextEncoder (no reading of ours)."""
  from tensor2tensor.data_generators import text_encoder  # pylint: disable=g-import-not-at-top
  path = glob.glob(os.path.join(str(data_dir), "vocab.%s.*.subwords" % problem_name))[0]
  return text_encoder.SubwordTextEncoder(path)


def line_ids(plain, text):
  """The original release's reading, by hand: every line stripped and encoded, ids joined."""
  return [i for line in text.split("\n") for i in plain.encode(line.strip())]


def escaped(plain, ids):
  """The subword strings of ids, concatenated (T2T writes a newline as the escape \\10;)."""
  return "".join(plain.all_subtoken_strings[i] for i in ids)


def check_packing(records, pieces, length):
  """One book's records (in chunk order) are its pieces packed greedily, whole: the records
  concatenate to the pieces (+ EOS); every record ends where a piece ends (unless the piece alone
  is longer than `length`); and the next record's first piece did not fit."""
  pieces = [list(p) for p in pieces] + [[lm.EOS_ID]]  # the book's EOS: a piece of its own
  assert [i for r in records for i in r] == [i for p in pieces for i in p]
  offsets = np.cumsum([0] + [len(p) for p in pieces[:-1]]).tolist()
  starts = {o: len(p) for o, p in zip(offsets, pieces)}  # piece start -> its length
  done = 0
  for record, following in zip(records, records[1:]):
    assert 0 < len(record) <= length
    done += len(record)
    if done in starts:  # the record ends at a piece end: the next piece did not fit
      assert len(record) + starts[done] > length
    else:  # cut inside a piece longer than a record
      assert any(len(p) > length for p in pieces)
    assert following


def test_pg19_reading_pieces_and_greedy_packing_by_hand():
  from problems import pg19_reading  # pylint: disable=g-import-not-at-top
  text = "  THE TITLE  \r\n\n\tFirst line, indented.\n   \nlast\n"
  assert pg19_reading.pieces(text) == ["THE TITLE", "First line, indented.", "last"]
  assert pg19_reading.pieces(text, "whole_text") == [text]
  assert pg19_reading.pieces("\n \n") == [] and pg19_reading.pieces("", "whole_text") == []
  # whole pieces: [1 2] | [3 4 5] + [6] | [7..13] cut at 4, its rest + EOS
  pieces = [[1, 2], [3, 4, 5], [], [6], [7, 8, 9, 10, 11, 12, 13]]
  assert pg19_reading.pack(pieces, 4, eos_id=99) == [[1, 2], [3, 4, 5, 6], [7, 8, 9, 10],
                                                     [11, 12, 13, 99]]
  assert pg19_reading.pack(pieces, 4) == [[1, 2], [3, 4, 5, 6], [7, 8, 9, 10], [11, 12, 13]]
  assert pg19_reading.pack([[1, 2, 3, 4]], 4, eos_id=99) == [[1, 2, 3, 4], [99]]
  # one piece (whole_text) = consecutive windows of the ids and EOS
  ids = list(range(2, 25))
  for length in (1, 3, 8, 23, 24, 30):
    assert pg19_reading.pack([ids], length, lm.EOS_ID) == lm.windows(ids + [lm.EOS_ID], length)
  with pytest.raises(DataError, match="use lines"):
    pg19_reading.pieces(text, "line")


def test_pg19_records_are_the_books_read_as_stripped_lines(pg19):
  """Records = each line stripped and encoded with T2T's own encoder, ids joined (the original
  release's reading), one EOS per book, packed greedily by whole lines; the vocabulary, built
  from stripped lines, has no newline subword, and no record holds a newline escape."""
  from problems import pg19_reading  # pylint: disable=g-import-not-at-top
  plain = plain_encoder(pg19["data_dir"])
  assert pg19_reading.newline_subwords(plain) == []
  for split, folder in (("train", "train"), ("dev", "validation"), ("test", "test")):
    records = read_records("pg19_length8k", pg19["data_dir"], split)
    books = books_from_records(records)
    assert set(books) == set(pg19["texts"][folder])
    for book_id, ids in books.items():
      text = pg19["texts"][folder][book_id]
      assert ids[-1] == lm.EOS_ID and np.sum(ids == lm.EOS_ID) == 1  # EOS ends every book
      assert ids[:-1].tolist() == line_ids(plain, text)
      assert "\\10;" not in escaped(plain, ids[:-1])
      assert "\\10;" in escaped(plain, plain.encode(text))  # whole text: newline escapes
      chunks = sorted((int(r["chunk"][0]), r["targets"].tolist()) for r in records
                      if int(r["book_id"][0]) == book_id)
      check_packing([c for _, c in chunks],
                    [plain.encode(l.strip()) for l in text.split("\n") if l.strip()], 8192)


def test_pg19_examples_respect_length_and_never_join_books(pg19):
  records = read_records("pg19_length8k", pg19["data_dir"], "train")
  assert all(0 < len(r["targets"]) <= 8192 for r in records)
  assert all(len(set(r["book_id"])) == 1 for r in records)
  per_book = collections.Counter(int(r["book_id"][0]) for r in records)
  assert per_book[101] >= 2 and per_book[102] == 1  # the long book is cut


def test_pg19_vocabulary_round_trips_and_stats(pg19):
  encoder = pg19_encoder(pg19["data_dir"])
  plain = plain_encoder(pg19["data_dir"])
  assert 100 < encoder.vocab_size <= 1.1 * PG19_VOCAB  # a 30-word corpus has no 300 subwords
  for text in ("Dr. Watson's café — «naïve» 1984!", "unseen w0rds\tand ünïcödé ✓"):
    assert encoder.decode(encoder.encode(text)) == text
  # the problem's encoder reads text as the books were read (t2t-decoder's prompts)
  assert encoder.encode("  two lines,\n\n then more  ") == line_ids(plain, "two lines,\nthen more")
  problem = registry.problem("pg19_length8k")
  for split, folder in (("train", "train"), ("dev", "validation")):
    stats = problem.split_stats(str(pg19["data_dir"]), split)
    texts = pg19["texts"][folder]
    assert stats["books"] == len(texts) and stats["whole_text_books"] == 0
    assert stats["words"] == sum(len(t.split()) for t in texts.values())
    assert stats["tokens"] == sum(len(line_ids(plain, t)) + 1 for t in texts.values())
  assert "books" in pg19["log"] and "tokens/s" in pg19["log"]  # progress output


def test_datagen_scorer_and_probes_read_books_through_one_function(pg19):
  """The same ids from the records, from pg19_reading.encode, from the probes' load_books and
  from the scorer's encoding, for every validation book."""
  from problems import pg19_reading  # pylint: disable=g-import-not-at-top
  from routing_transformer.tools.probes import data  # pylint: disable=g-import-not-at-top
  encoder = pg19_encoder(pg19["data_dir"])
  books, excluded = data.load_books(str(pg19["raw"]), "validation", encoder,
                                    default_exclude=False)
  assert not excluded
  records = books_from_records(read_records("pg19_length8k", pg19["data_dir"], "dev"))
  for book in books:
    text = pg19["texts"]["validation"][book.book_id]
    want = records[book.book_id][:-1].tolist()
    assert book.ids.tolist() == want
    assert pg19_reading.encode(encoder, text) == want
    assert pg19_reading.encode(plain_encoder(pg19["data_dir"]), text) == want


def test_pg19_whole_text_reading_is_a_named_option(pg19, tmp_path, monkeypatch):
  """PG19_READING=whole_text: each book encoded with its newlines and cut into consecutive
  windows (the data of this project before the line reading); a vocabulary built from whole
  texts is refused by the line reading, naming the option."""
  from problems import pg19_reading  # pylint: disable=g-import-not-at-top
  from tensor2tensor.data_generators import text_encoder  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv("PG19_DIR", str(pg19["raw"]))
  monkeypatch.setenv("PG19_VOCAB_SIZE", str(PG19_VOCAB))
  monkeypatch.setenv("PG19_READING", "whole_text")
  out = tmp_path / "whole"
  os.makedirs(str(out))
  for vocab in glob.glob(os.path.join(str(pg19["data_dir"]), "vocab.*")):
    tf.io.gfile.copy(vocab, os.path.join(str(out), os.path.basename(vocab)))
  problem = registry.problem("pg19_length8k")
  problem.generate_data(str(out), "/nonexistent")
  plain = plain_encoder(out)
  records = read_records("pg19_length8k", out, "train")
  for book_id, text in pg19["texts"]["train"].items():
    chunks = sorted((int(r["chunk"][0]), r["targets"].tolist()) for r in records
                    if int(r["book_id"][0]) == book_id)
    assert [c for _, c in chunks] == lm.windows(plain.encode(text) + [lm.EOS_ID], 8192)
  assert problem.split_stats(str(out), "dev")["whole_text_books"] == 2
  # a vocabulary built from whole texts has newline subwords; the line reading refuses it
  whole = text_encoder.SubwordTextEncoder()
  whole.build_from_token_counts({"the": 9, "book": 9, ".\n": 9, "\n\n": 9}, min_count=1)
  assert pg19_reading.newline_subwords(whole)
  whole.store_to_file(str(tmp_path / ("vocab.pg19_length8k.%d.subwords" % PG19_VOCAB)))
  monkeypatch.setenv("PG19_READING", "lines")
  with pytest.raises(DataError, match="built from whole texts.*PG19_READING=whole_text"):
    problem.generate_data(str(tmp_path), "/nonexistent")
  monkeypatch.setenv("PG19_READING", "words")
  with pytest.raises(DataError, match="use lines"):
    problem.generate_data(str(tmp_path / "other"), "/nonexistent")


def test_pg19_given_vocab_file_is_used_as_is(pg19, tmp_path, monkeypatch):
  vocab = glob.glob(os.path.join(str(pg19["data_dir"]), "vocab.pg19_length8k.*.subwords"))[0]
  monkeypatch.setenv("PG19_VOCAB_FILE", vocab)
  monkeypatch.setenv("PG19_VOCAB_SIZE", "32768")  # the released file's name
  monkeypatch.setenv("PG19_DIR", str(pg19["raw"]))
  problem = registry.problem("pg19_length8k")
  problem.generate_data(str(tmp_path), "/nonexistent")
  stored = tmp_path / "vocab.pg19_length8k.32768.subwords"
  assert stored.read_bytes() == open(vocab, "rb").read()
  assert (read_records("pg19_length8k", tmp_path, "dev")[0]["targets"].tolist()
          in [r["targets"].tolist() for r in read_records("pg19_length8k", pg19["data_dir"],
                                                          "dev")])


def test_pg19_tfds_source_gives_the_same_records(pg19, tmp_path, monkeypatch):
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  from tensorflow_datasets.datasets.pg19 import pg19_dataset_builder  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(pg19_dataset_builder, "_DATA_DIR", tfds.core.Path(str(pg19["raw"])))
  tfds_dir = str(tmp_path / "tfds")
  tfds.builder("pg19", data_dir=tfds_dir).download_and_prepare(
      download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  monkeypatch.setenv("PG19_TFDS_DATA_DIR", tfds_dir)
  out = tmp_path / "data"
  os.makedirs(str(out))
  for vocab in glob.glob(os.path.join(str(pg19["data_dir"]), "vocab.*")):
    tf.io.gfile.copy(vocab, os.path.join(str(out), os.path.basename(vocab)))
  monkeypatch.setenv("PG19_VOCAB_SIZE", str(PG19_VOCAB))
  registry.problem("pg19_length8k").generate_data(str(out), "/nonexistent")
  for split in ("train", "dev", "test"):
    ours = sorted(r["targets"].tolist() for r in read_records("pg19_length8k", out, split))
    ref = sorted(r["targets"].tolist() for r in read_records("pg19_length8k", pg19["data_dir"],
                                                             split))
    assert ours == ref


def test_pg19_bad_inputs_name_the_fix(tmp_path, monkeypatch):
  monkeypatch.delenv("PG19_DIR", raising=False)
  monkeypatch.delenv("PG19_TFDS_DATA_DIR", raising=False)
  monkeypatch.setenv("PG19_VOCAB_SIZE", str(PG19_VOCAB))
  problem = registry.problem("pg19_length8k")
  with pytest.raises(DataError, match="deepmind-gutenberg"):
    problem.generate_data(str(tmp_path / "d1"), str(tmp_path / "nothing"))
  raw = tmp_path / "raw"
  datasets.make_pg19(str(raw), books={"train": {1: 50}, "validation": {2: 20}, "test": {3: 20}})
  (raw / "validation" / "5.txt").write_text("  \n")
  with pytest.raises(DataError, match=r"5\.txt is empty"):
    registry.problem("pg19_length8k").generate_data(str(tmp_path / "d2"), str(raw))
  (raw / "validation" / "5.txt").write_bytes(b"\xff\xfe bad bytes")
  with pytest.raises(DataError, match="not UTF-8"):
    registry.problem("pg19_length8k").generate_data(str(tmp_path / "d3"), str(raw))
  (raw / "validation" / "5.txt").unlink()
  (raw / "validation" / "notes.txt").write_text("x")
  with pytest.raises(DataError, match="<book_id>.txt"):
    registry.problem("pg19_length8k").generate_data(str(tmp_path / "d4"), str(raw))
  with pytest.raises(DataError, match="t2t-datagen"):  # training before datagen
    registry.problem("pg19_length8k").dataset(tf.estimator.ModeKeys.TRAIN,
                                              str(tmp_path / "empty"))


def test_datagen_missing_data_is_one_line_without_traceback(tmp_path):
  proc = datagen("enwik8_length8k", tmp_path / "d", tmp_path / "empty", check=False)
  assert proc.returncode != 0
  assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
  lines = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
  assert len(lines) == 1 and "enwik8.zip" in lines[0] and "mattmahoney.net" in lines[0]


# ----------------------------------------------------------------------------------------- enwik8

@pytest.fixture(scope="module")
def enwik8_data(tmp_path_factory):
  raw = tmp_path_factory.mktemp("enwik8_raw")
  data = datasets.make_enwik8(str(raw), size=200000)
  data_dir = tmp_path_factory.mktemp("enwik8_data")
  generate("enwik8_length8k", data_dir, raw)
  return {"bytes": data, "data_dir": data_dir}


def test_enwik8_split_and_bytes_round_trip(enwik8_data):
  data, n = enwik8_data["bytes"], len(enwik8_data["bytes"])
  expected = {"train": data[:n * 90 // 100], "dev": data[n * 90 // 100:n * 95 // 100],
              "test": data[n * 95 // 100:]}
  for split, raw in expected.items():
    records = read_records("enwik8_length8k", enwik8_data["data_dir"], split)
    assert all(len(r["targets"]) <= 8192 for r in records)
    if split != "train":  # unshuffled: windows in order
      got = bytes((np.concatenate([r["targets"] for r in records]) - 2).astype(np.uint8))
      assert got == raw
    else:
      assert sorted(bytes((r["targets"] - 2).astype(np.uint8)) for r in records) == sorted(
          raw[i:i + 8192] for i in range(0, len(raw), 8192))


def test_enwik8_standard_split_sizes():
  parts = enwik8.split_bytes(b"x" * enwik8.STANDARD_SIZE)
  assert [len(parts[s]) for s in ("train", "dev", "test")] == [90000000, 5000000, 5000000]


def test_enwik8_bad_zip_and_wrong_member(tmp_path):
  (tmp_path / "enwik8.zip").write_bytes(b"not a zip")
  with pytest.raises(DataError, match="not a valid zip"):
    enwik8.read_enwik8(str(tmp_path / "enwik8.zip"))
  import zipfile  # pylint: disable=g-import-not-at-top
  with zipfile.ZipFile(str(tmp_path / "other.zip"), "w") as z:
    z.writestr("enwik9", b"abc")
  with pytest.raises(DataError, match="no member named enwik8"):
    enwik8.read_enwik8(str(tmp_path / "other.zip"))


def test_interrupted_datagen_leaves_no_shard_and_a_rerun_finishes(enwik8_data, tmp_path,
                                                                  monkeypatch):
  raw = tmp_path / "raw"
  datasets.make_enwik8(str(raw), size=200000)
  out = tmp_path / "data"
  problem = registry.problem("enwik8_length8k")
  calls = {"n": 0}
  original = problem.encode_unit

  def dying(unit, encoder):
    calls["n"] += 1
    if calls["n"] == 8:  # 22 windows in shards of 3, 3, 2, ...: inside the 3rd shard
      raise KeyboardInterrupt("killed")
    return original(unit, encoder)

  monkeypatch.setattr(problem, "encode_unit", dying)
  with pytest.raises(KeyboardInterrupt):
    problem.generate_data(str(out), str(raw))
  pattern = problem.filepattern(str(out), lm.SPLITS["train"])
  visible = tf.io.gfile.glob(pattern)
  assert len(visible) == 2  # only the complete shards carry T2T's names
  assert all(shards.shard_complete(p, "enwik8_length8k") for p in visible)
  monkeypatch.setattr(problem, "encode_unit", original)
  problem.generate_data(str(out), str(raw))
  for split in ("train", "dev", "test"):
    ours = sorted(r["targets"].tolist() for r in read_records("enwik8_length8k", out, split))
    ref = sorted(r["targets"].tolist()
                 for r in read_records("enwik8_length8k", enwik8_data["data_dir"], split))
    assert ours == ref
  assert problem.split_stats(str(out), "train")["bytes"] == 180000
  assert not [p for p in os.listdir(str(out)) if p.endswith("-incomplete")]  # nothing left over


# ----------------------------------------------------------------------------------- WikiText-103

@pytest.fixture(scope="module")
def wikitext(tmp_path_factory):
  raw = tmp_path_factory.mktemp("wt_raw")
  lines = datasets.make_wikitext103(str(raw))
  data_dir = tmp_path_factory.mktemp("wt_data")
  generate("wikitext103_length1k", data_dir, raw)
  return {"lines": lines, "data_dir": data_dir}


def test_wikitext_vocab_from_train_and_windows_cover_the_stream(wikitext):
  encoder = registry.problem("wikitext103_length1k").feature_encoders(
      str(wikitext["data_dir"]))["targets"]
  train_words = collections.Counter(w for l in wikitext["lines"]["train"] for w in l.split())
  assert encoder.vocab_size == len(train_words) + 2  # + <pad>, <EOS>
  most_common = train_words.most_common(1)[0][0]
  assert encoder.decode([2]) == most_common
  for split, name in (("dev", "valid"), ("test", "test")):
    records = read_records("wikitext103_length1k", wikitext["data_dir"], split)
    assert all(len(r["targets"]) <= 1024 for r in records)
    stream = np.concatenate([r["targets"] for r in records])
    expected = []
    for line in wikitext["lines"][name]:
      expected += [w if w in train_words else "<unk>" for w in line.split()] + ["<EOS>"]
    assert [encoder.decode([int(i)]) for i in stream] == expected


def test_wikitext_lengths_share_the_vocabulary(wikitext, tmp_path):
  raw = tmp_path / "raw"
  datasets.make_wikitext103(str(raw))
  out = tmp_path / "data"
  registry.problem("wikitext103_length2k").generate_data(str(out), str(raw))
  assert ((out / "vocab.wikitext103.tokens").read_bytes()
          == (wikitext["data_dir"] / "vocab.wikitext103.tokens").read_bytes())
  a = np.concatenate([r["targets"] for r in read_records("wikitext103_length2k", out, "test")])
  b = np.concatenate([r["targets"] for r in read_records("wikitext103_length1k",
                                                         wikitext["data_dir"], "test")])
  assert a.tolist() == b.tolist()


# ---------------------------------------------------------------------------------------- images

def test_cifar10_records_are_raster_scan_pixels(tmp_path):
  raw = tmp_path / "raw"
  batches = datasets.make_cifar10(str(raw), as_tar=True)
  generate("cifar10_pixels", tmp_path / "data", raw)
  for split, names in (("train", ["data_batch_%d" % i for i in range(1, 6)]),
                       ("test", ["test_batch"])):
    expected = datasets.raster(np.concatenate([batches[n] for n in names]), 32)
    got = dataset_targets("cifar10_pixels", tmp_path / "data", split)
    assert all(t.shape == (3072,) for t in got)
    assert sorted(map(bytes, (np.stack(got) - 2).astype(np.uint8))) == sorted(map(bytes,
                                                                                   expected))


def test_imagenet64_records_are_raster_scan_pixels(tmp_path):
  raw = tmp_path / "raw"
  arrays = datasets.make_imagenet64(str(raw))
  generate("imagenet64_pixels", tmp_path / "data", raw)
  got = np.stack(dataset_targets("imagenet64_pixels", tmp_path / "data", "dev"))
  assert got.shape == (3, 12288)
  np.testing.assert_array_equal(got - 2, datasets.raster(arrays["val_data.npz"], 64))
  train = dataset_targets("imagenet64_pixels", tmp_path / "data", "train")
  assert len(train) == 20


def test_image_format_errors(tmp_path):
  (tmp_path / "cifar-10-batches-py").mkdir()
  for name in ["data_batch_%d" % i for i in range(1, 6)] + ["test_batch"]:
    (tmp_path / "cifar-10-batches-py" / name).write_bytes(b"garbage")
  with pytest.raises(DataError, match="not a CIFAR python batch"):
    registry.problem("cifar10_pixels").generate_data(str(tmp_path / "d"), str(tmp_path))
  np.savez(str(tmp_path / "val_data.npz"), data=np.zeros((2, 100), np.uint8))
  for i in range(1, 11):
    np.savez(str(tmp_path / ("train_data_batch_%d.npz" % i)), data=np.zeros((2, 12288), np.uint8))
  with pytest.raises(DataError, match=r"uint8 \[n, 12288\]"):
    registry.problem("imagenet64_pixels").generate_data(str(tmp_path / "d2"), str(tmp_path))
  with pytest.raises(DataError, match="Imagenet64_train_npz.zip"):
    registry.problem("imagenet64_pixels").generate_data(str(tmp_path / "d3"),
                                                        str(tmp_path / "none"))


# ------------------------------------------------------------------------------------ evaluation

def test_perplexity_arithmetic():
  s = perplexity.summary(100.0, 50, 20)
  assert s["token_perplexity"] == pytest.approx(math.exp(2.0))
  assert s["word_perplexity"] == pytest.approx(math.exp(5.0))
  assert s["bits_per_word"] == pytest.approx(5.0 / math.log(2))
  problem = registry.problem("pg19_length8k")
  official = problem.report(1000.0, 400, {"split": "test", "books": 100, "words": 123})
  assert official["words"] == 6966499 and official["word_count"] == "official"
  assert official["word_perplexity"] == pytest.approx(math.exp(1000.0 / 6966499))
  partial = problem.report(1000.0, 400, {"split": "test", "books": 7, "words": 123})
  assert partial["words"] == 123 and partial["word_count"] == "counted"
  assert perplexity.count_words("a  b\nc\t d ") == 4
  with pytest.raises(ValueError, match="empty"):
    perplexity.perplexity(1.0, 0, "word")


LONG = "max_length=8192,max_target_length=8192,sparsity_cluster_attention_window=2048"


def save_random_checkpoint(out_dir, problem_name, data_dir, hparams_set, overrides):
  from tensor2tensor.utils import trainer_lib  # pylint: disable=g-import-not-at-top
  with tf.Graph().as_default():
    hp = trainer_lib.create_hparams(hparams_set, overrides, data_dir=str(data_dir),
                                    problem_name=problem_name)
    model = registry.model("routing_transformer")(hp, tf.estimator.ModeKeys.EVAL,
                                                  hp.problem_hparams)
    model({"targets": tf.zeros([1, hp.max_target_length, 1, 1], tf.int32)})
    tf.train.get_or_create_global_step()
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      return tf.train.Saver().save(sess, os.path.join(str(out_dir), "model.ckpt"), 0)


def hand_total_nll(checkpoint, problem_name, data_dir, hparams_set, overrides, examples):
  """Sum over examples of T2T's own mean training loss x non-padding tokens, one at a time."""
  from tensor2tensor.utils import trainer_lib  # pylint: disable=g-import-not-at-top
  with tf.Graph().as_default():
    hp = trainer_lib.create_hparams(hparams_set, overrides, data_dir=str(data_dir),
                                    problem_name=problem_name)
    targets = tf.placeholder(tf.int32, [1, None])
    model = registry.model("routing_transformer")(hp, tf.estimator.ModeKeys.EVAL,
                                                  hp.problem_hparams)
    _, losses = model({"targets": targets[:, :, tf.newaxis, tf.newaxis]})
    total = 0.0
    with tf.Session() as sess:
      tf.train.Saver().restore(sess, checkpoint)
      for ids in examples:
        loss = sess.run(losses["training"], {targets: ids[np.newaxis]})
        total += float(loss) * len(ids)
    return total


def test_word_level_perplexity_matches_hand_computation(pg19, tmp_path):
  from routing_transformer.tools import evaluate  # pylint: disable=g-import-not-at-top
  ckpt = save_random_checkpoint(tmp_path, "pg19_length8k", pg19["data_dir"],
                                "routing_transformer_test", LONG)
  report = evaluate.evaluate("pg19_length8k", "routing_transformer_test", str(tmp_path),
                             str(pg19["data_dir"]), "dev", hparams_overrides=LONG,
                             batch_size=2)
  records = read_records("pg19_length8k", pg19["data_dir"], "dev")
  total = hand_total_nll(ckpt, "pg19_length8k", pg19["data_dir"], "routing_transformer_test",
                         LONG, [r["targets"] for r in records])
  words = sum(len(t.split()) for t in pg19["texts"]["validation"].values())
  tokens = sum(len(r["targets"]) for r in records)
  assert report["tokens"] == tokens and report["words"] == words
  assert report["word_count"] == "counted"  # 2 books, not the official 50
  assert report["total_nll"] == pytest.approx(total, rel=1e-4)
  assert report["word_perplexity"] == pytest.approx(math.exp(total / words), rel=1e-3)
  assert report["token_perplexity"] == pytest.approx(math.exp(total / tokens), rel=1e-4)
  assert report["bits_per_word"] == pytest.approx(total / words / math.log(2), rel=1e-4)


def test_corrupt_shard_fails_clearly_or_is_skipped_when_asked(tmp_path):
  from tensor2tensor.utils import trainer_lib  # pylint: disable=g-import-not-at-top
  from routing_transformer.t2t import glue as t2t_glue  # pylint: disable=g-import-not-at-top
  from problems import synthetic  # pylint: disable=g-import-not-at-top
  problem = synthetic.SyntheticLongRange()
  problem.num_train, problem.num_eval = 40, 8
  problem.generate_data(str(tmp_path), str(tmp_path))
  shard = sorted(glob.glob(str(tmp_path / "synthetic_long_range-dev*")))[0]
  data = bytearray(open(shard, "rb").read())
  data[len(data) // 2] ^= 0xFF  # one flipped byte: that record's CRC fails
  with open(shard, "wb") as f:
    f.write(bytes(data))

  def read_all(overrides):
    hp = trainer_lib.create_hparams("routing_transformer_test", overrides)
    return dataset_targets("synthetic_long_range", tmp_path, "dev", hp)

  with pytest.raises(tf.errors.DataLossError) as error:
    read_all("")
  message = t2t_glue.corrupt_record_message(error.value)
  assert "corrupt or truncated" in message and "skip_corrupt_records=True" in message
  assert 0 < len(read_all("skip_corrupt_records=True")) < 8


def test_shard_cut_at_a_record_boundary_fails_naming_the_shard(tmp_path):
  """TF reads a shard cut after a whole record as a shorter shard without any error; the size
  datagen stored catches it."""
  from problems import synthetic  # pylint: disable=g-import-not-at-top
  problem = synthetic.SyntheticLongRange()
  problem.num_train, problem.num_eval = 40, 8
  problem.generate_data(str(tmp_path), str(tmp_path))
  assert len(dataset_targets("synthetic_long_range", tmp_path, "dev")) == 8
  shard = sorted(glob.glob(str(tmp_path / "synthetic_long_range-dev*")))[0]
  records = list(tf.io.tf_record_iterator(shard))
  data = open(shard, "rb").read()
  with open(shard, "wb") as f:
    f.write(data[:len(data) - (16 + len(records[-1]))])  # the last record, framing included
  assert len(list(tf.io.tf_record_iterator(shard))) == len(records) - 1  # TF does not notice
  with pytest.raises(DataError, match="is truncated or was changed") as error:
    dataset_targets("synthetic_long_range", tmp_path, "dev")
  assert os.path.basename(shard) in str(error.value) and "re-run t2t-datagen" in str(error.value)


def test_vocabulary_that_does_not_match_the_records_fails_clearly(pg19, tmp_path):
  import shutil  # pylint: disable=g-import-not-at-top
  data = tmp_path / "data"
  shutil.copytree(str(pg19["data_dir"]), str(data))
  vocab = glob.glob(str(data / "vocab.pg19_length8k.*.subwords"))[0]
  lines = open(vocab, encoding="utf-8").read().splitlines()
  with open(vocab, "w", encoding="utf-8") as f:
    f.write("\n".join(lines[:40]) + "\n")  # a smaller vocabulary than the records were made with
  with pytest.raises(tf.errors.InvalidArgumentError) as error:
    dataset_targets("pg19_length8k", data, "dev")
  assert "VocabularyMismatch" in str(error.value) and "does not match the data" in str(error.value)
  assert len(dataset_targets("pg19_length8k", pg19["data_dir"], "dev")) == 2  # the right one
