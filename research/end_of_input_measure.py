"""End-of-input artifact: loss by position vs N, and non-causality, for one checkpoint.

    python research/end_of_input_measure.py RUN_DIR HPARAMS_SET HPARAMS OUT_NPZ MAX_WINDOWS

(research/notes/probes_end_of_input.md, appendix: BOOKS and DATA are the folders of its commands.)
"""
import argparse
import glob
import time

import numpy as np

from routing_transformer.tools import score

BOOKS, DATA = "/tmp/probes2/books", "/tmp/probes2/data"
VOCAB = DATA + "/vocab.pg19_length2k.4096.subwords"
L, NS, CUT, TAIL = 2048, (512, 1024, 2048), 64, 64


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  for name in ("run_dir", "hparams_set", "hparams", "out", "max_windows"):
    parser.add_argument(name)
  args = parser.parse_args(argv)
  run_dir, hparams_set, hparams, out, max_windows = (
      args.run_dir, args.hparams_set, args.hparams, args.out, args.max_windows)
  t0 = time.time()
  scorer = score.Scorer(run_dir, hparams_set, VOCAB, hparams=hparams, batch_size=4,
                        reading="whole_text")  # the books as that datagen read them
  books = []
  for path in sorted(glob.glob(BOOKS + "/test/*.txt") + glob.glob(BOOKS + "/validation/*.txt")):
    with open(path, encoding="utf-8") as f:
      books.append(np.array(scorer.encode(f.read().strip()) + [1], np.int64))
  ends = [(b, e) for b, book in enumerate(books) for e in range(L, len(book) + 1, L)]
  ends = ends[::max(1, -(-len(ends) // int(max_windows)))]
  res = {"windows": len(ends), "tokens": [len(b) for b in books]}
  full = None
  for n in NS:  # left truncation: the same last tokens for every N
    ll = scorer.score_ids([(list(books[b][e - n:e]), 0) for b, e in ends])
    nll = -np.stack(ll).astype(np.float64)  # [W, n]
    res["profile_%d" % n] = nll[:, -256:]  # last 256 positions of every window
    if n == L:
      full = nll
  # Non-causality at N = L: the tokens from CUT before the end are (a) removed (padding) or
  # (b) replaced by the same positions of another window; compare log p at positions < L - CUT.
  c = L - CUT
  trunc = -np.stack(scorer.score_ids([(list(books[b][e - L:e - CUT]), 0) for b, e in ends]))
  other = ends[len(ends) // 2:] + ends[:len(ends) // 2]
  repl = -np.stack(scorer.score_ids([
      (list(books[b][e - L:e - CUT]) + list(books[ob][oe - CUT:oe]), 0)
      for (b, e), (ob, oe) in zip(ends, other)]))
  # only x[L-2] changed: the input of the last position (x[L-1] is a target only, never an input)
  last1 = -np.stack(scorer.score_ids([
      (list(books[b][e - L:e - 2]) + [int(books[ob][oe - 2]), int(books[b][e - 1])], 0)
      for (b, e), (ob, oe) in zip(ends, other)]))
  res.update(cut=c, full=full, truncated=trunc[:, :c] - full[:, :c],
             replaced=repl[:, :c] - full[:, :c], last_token=last1[:, :L - 2] - full[:, :L - 2])
  res["seconds"] = time.time() - t0
  np.savez(out, **res)
  print("done %s: %d windows, %.0f s" % (out, len(ends), res["seconds"]))


if __name__ == "__main__":
  main()
