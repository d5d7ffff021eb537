"""Books of a PG-19-layout folder (metadata.csv; train/ validation/ test/ of <id>.txt) as token
ids of the checkpoint's vocabulary.

Books are read as `problems.pg19` reads them for datagen (UTF-8, stripped) and encoded with the
one PG-19 reading, `problems.pg19_reading.encode` (by default the original release's: each line
stripped and encoded, the lines joined without newlines; `reading="whole_text"` for vocabularies
built from whole texts), with no EOS, so a probe input is a stretch of a book exactly as datagen
gave it to the model. Encodings are cached (one .npy per book, keyed by the vocabulary and the
reading) because encoding PG-19 validation in Python takes minutes.
"""
import collections
import hashlib
import os
import re
import unicodedata

import numpy as np

from routing_transformer.tools.probes.errors import ProbeError

# The annotated book Sun et al. (2021, footnote 3) left out of PG-19 validation (49 of 50 books
# remain): its id (the Project Gutenberg ebook number, which PG-19 uses as book id) and its title.
CANTERBURY = ("2383", "The Canterbury Tales and Other Poems")
DEFAULT_EXCLUDE = {"dev": CANTERBURY}  # by datagen split name: --split=validation or dev
SPLITS = {"train": "train", "validation": "dev", "dev": "dev", "test": "test"}

Book = collections.namedtuple("Book", ["book_id", "title", "ids", "words", "chars"])
Book.__doc__ = """One book: id, title (metadata.csv), ids int32 [n], words (str.split()), chars."""


def vocab_key(encoder):
  """A short hash of the encoder's vocabulary (names the encoding cache)."""
  pieces = getattr(encoder, "all_subtoken_strings", None)
  text = "\n".join(pieces) if pieces is not None else "%s/%d" % (type(encoder).__name__,
                                                                 encoder.vocab_size)
  return hashlib.sha1(text.encode("utf-8")).hexdigest()[:12]


def encode_book(encoder, text, cache_path=None, reading="lines"):
  """int32 ids of a book's text read with `reading` (`pg19_reading.encode`; cached in
  `cache_path` when given)."""
  from problems import pg19_reading  # pylint: disable=g-import-not-at-top
  if cache_path and os.path.exists(cache_path):
    return np.load(cache_path)
  ids = np.asarray(pg19_reading.encode(encoder, text, reading), np.int32)
  if cache_path:
    os.makedirs(os.path.dirname(cache_path), exist_ok=True)
    tmp = cache_path + ".tmp.npy"
    np.save(tmp, ids)
    os.replace(tmp, cache_path)
  return ids


def normalize_title(title):
  """A title compared loosely: Unicode NFKC, lower case, every run of non-alphanumeric
  characters one space ("The Canterbury Tales, and Other Poems" -> "the canterbury tales and
  other poems")."""
  text = unicodedata.normalize("NFKC", str(title or "")).lower()
  return " ".join(re.sub(r"[^\w]+|_", " ", text).split())


def matches(book_id, title, name):
  """True when `name` is the book's id or its title (both normalized, `normalize_title`)."""
  name = str(name).strip()
  if name.isdigit():
    return int(name) == int(book_id)
  return bool(normalize_title(name)) and normalize_title(name) == normalize_title(title)


def load_books(books_dir, split, encoder, exclude=(), default_exclude=True, cache_dir=None,
               max_books=None, reading="lines"):
  """The books of a split, encoded.

  Args:
    books_dir: PG-19 layout root (metadata.csv, <split>/<id>.txt); local or gs://.
    split: "validation" (or "dev"), "test" or "train".
    encoder: the checkpoint's T2T text encoder.
    exclude: ids or titles to leave out; each must name a book of the split.
    default_exclude: also leave out DEFAULT_EXCLUDE of the split, Sun et al.'s choice: "The
      Canterbury Tales and Other Poems" of validation, matched by id or normalized title; a
      ProbeError naming the fix when the split has no such book.
    cache_dir: where to cache the encodings (None: no cache).
    max_books: keep only the first this many books (by id) after exclusions.
    reading: `problems.pg19_reading` reading: "lines" (the original release's) or "whole_text".
  Returns:
    (list of Book sorted by id, list of excluded (id, title)).
  """
  from problems import pg19  # pylint: disable=g-import-not-at-top
  from problems import pg19_reading  # pylint: disable=g-import-not-at-top
  from problems.errors import DataError  # pylint: disable=g-import-not-at-top
  try:
    pg19_reading.check(reading)
    pg19_reading.check_vocabulary(encoder, reading, "--reading=whole_text")
  except DataError as e:
    raise ProbeError(str(e))
  if split not in SPLITS:
    raise ProbeError("--split=%s: use one of validation, test, train" % split)
  if not os.path.isdir(books_dir) and not books_dir.startswith("gs://"):
    raise ProbeError("--books_dir=%s is not a folder; pass a PG-19 layout root (metadata.csv, "
                     "train/ validation/ test/ of <id>.txt)" % books_dir)
  try:
    source = pg19.FolderSource(books_dir)
    listed = source.books(SPLITS[split])
  except DataError as e:
    raise ProbeError("--books_dir=%s --split=%s: %s" % (books_dir, split, str(e).split(". ")[0]))
  names = list(exclude)
  for name in exclude:
    if not any(matches(i, source.titles.get(i), name) for i, _ in listed):
      raise ProbeError("--exclude=%s names no book of %s/%s; give a book id or its title as in "
                       "metadata.csv" % (name, books_dir, split))
  default = DEFAULT_EXCLUDE.get(SPLITS[split]) if default_exclude else None
  if default:
    if not any(matches(i, source.titles.get(i), name) for i, _ in listed for name in default):
      raise ProbeError(
          "--books_dir=%s --split=%s has no '%s' (id %s, or that title in metadata.csv) to leave "
          "out as Sun et al. did; pass --no_default_exclude to keep every book (with "
          "--exclude=ID if the book is there under another id and title)" % (
              books_dir, split, default[1], default[0]))
    names += list(default)
  key = "%s-%s" % (vocab_key(encoder), reading)
  books, excluded = [], []
  for book_id, path in listed:
    title = source.titles.get(book_id, "")
    if any(matches(book_id, title, name) for name in names):
      excluded.append((book_id, title))
      continue
    if max_books is not None and len(books) >= max_books:
      break
    _, text = source.read((book_id, path))
    cache = os.path.join(cache_dir, key, "%d.npy" % book_id) if cache_dir else None
    ids = encode_book(encoder, text, cache, reading)
    books.append(Book(book_id, title, ids, len(text.split()), len(text)))
  if not books:
    raise ProbeError("--books_dir=%s --split=%s: no books left after exclusions; choose another "
                     "split or fewer --exclude" % (books_dir, split))
  return books, excluded


def find_book(books, name):
  """Index of the book with this id or title; ProbeError naming the choices otherwise."""
  for i, b in enumerate(books):
    if matches(b.book_id, b.title, name):
      return i
  raise ProbeError("no book %r among %s; use a book id or title from metadata.csv" % (
      name, ", ".join(str(b.book_id) for b in books[:10])))
