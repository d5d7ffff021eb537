"""Books of a PG-19-layout folder (metadata.csv; train/ validation/ test/ of <id>.txt) as token
ids of the checkpoint's vocabulary.

Books are read as `problems.pg19` reads them for datagen (UTF-8, stripped) and encoded whole with
the model's SubwordTextEncoder (no EOS), so a probe input is a stretch of a book exactly as the
model saw books in training. Encodings are cached (one .npy per book, keyed by the vocabulary)
because encoding PG-19 validation in Python takes minutes.
"""
import collections
import hashlib
import os

import numpy as np

from routing_transformer.tools.probes.errors import ProbeError

# The annotated book Sun et al. (2021) left out of PG-19 validation (49 of 50 books remain).
DEFAULT_EXCLUDE = {"validation": ("The Canterbury Tales and Other Poems",)}
SPLITS = {"train": "train", "validation": "dev", "dev": "dev", "test": "test"}

Book = collections.namedtuple("Book", ["book_id", "title", "ids", "words", "chars"])
Book.__doc__ = """One book: id, title (metadata.csv), ids int32 [n], words (str.split()), chars."""


def vocab_key(encoder):
  """A short hash of the encoder's vocabulary (names the encoding cache)."""
  pieces = getattr(encoder, "all_subtoken_strings", None)
  text = "\n".join(pieces) if pieces is not None else "%s/%d" % (type(encoder).__name__,
                                                                 encoder.vocab_size)
  return hashlib.sha1(text.encode("utf-8")).hexdigest()[:12]


def encode_book(encoder, text, cache_path=None):
  """int32 ids of a book's text (cached in `cache_path` when given)."""
  if cache_path and os.path.exists(cache_path):
    return np.load(cache_path)
  ids = np.asarray(encoder.encode(text), np.int32)
  if cache_path:
    os.makedirs(os.path.dirname(cache_path), exist_ok=True)
    tmp = cache_path + ".tmp.npy"
    np.save(tmp, ids)
    os.replace(tmp, cache_path)
  return ids


def matches(book_id, title, name):
  """True when `name` is the book's id or (case-insensitively) its title."""
  name = str(name).strip()
  return name == str(book_id) or name.lower() == (title or "").strip().lower()


def load_books(books_dir, split, encoder, exclude=(), default_exclude=True, cache_dir=None,
               max_books=None):
  """The books of a split, encoded.

  Args:
    books_dir: PG-19 layout root (metadata.csv, <split>/<id>.txt); local or gs://.
    split: "validation" (or "dev"), "test" or "train".
    encoder: the checkpoint's T2T text encoder.
    exclude: ids or titles to leave out; each must name a book of the split.
    default_exclude: also leave out DEFAULT_EXCLUDE[split] when present (Sun et al.'s choice).
    cache_dir: where to cache the encodings (None: no cache).
    max_books: keep only the first this many books (by id) after exclusions.
  Returns:
    (list of Book sorted by id, list of excluded (id, title)).
  """
  from problems import pg19  # pylint: disable=g-import-not-at-top
  from problems.errors import DataError  # pylint: disable=g-import-not-at-top
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
  if default_exclude:
    names += [t for t in DEFAULT_EXCLUDE.get(split, ()) if t not in names]
  for name in exclude:
    if not any(matches(i, source.titles.get(i), name) for i, _ in listed):
      raise ProbeError("--exclude=%s names no book of %s/%s; give a book id or its title as in "
                       "metadata.csv" % (name, books_dir, split))
  key = vocab_key(encoder)
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
    ids = encode_book(encoder, text, cache)
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
