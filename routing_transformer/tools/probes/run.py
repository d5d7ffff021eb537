"""Scoring every (model, prefix length N) of a probe, resumable, with progress on stderr.

For each model the checkpoint is restored once; each input of each N is scored in one pass
(`scoring.make_score_fn`) at the positions `offsets` from its end (the targets' span, the
end-of-input spans and the loss-by-position profile together). The NLLs of one (model, N) go to
`<out>/shards/<label>/N<N>.npz` with a fingerprint of everything that determines them; a rerun
loads the shards whose fingerprint matches and scores only the rest.
"""
import collections
import hashlib
import json
import os
import sys
import time

import numpy as np

from routing_transformer.tools.probes import sampling
from routing_transformer.tools.probes.errors import ProbeError

ModelSpec = collections.namedtuple("ModelSpec", ["label", "checkpoint", "hparams_set", "hparams",
                                                 "as_local"])
ModelSpec.__new__.__defaults__ = ("", False)


def fingerprint(spec, examples, offsets, length, books_key):
  """Hex digest of what determines a shard: model, examples, offsets, N, books."""
  h = hashlib.sha1()
  h.update(json.dumps([spec.checkpoint, str(spec.hparams_set), spec.hparams, bool(spec.as_local),
                       list(map(int, offsets)), int(length), books_key]).encode())
  for a in examples:
    h.update(np.ascontiguousarray(a, np.int64).tobytes())
  return h.hexdigest()


def shard_path(out_dir, label, length):
  safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in label)
  return os.path.join(out_dir, "shards", safe, "N%d.npz" % length)


def read_shard(path, digest):
  """({name: array}, seconds) of a finished .npz shard with this fingerprint, else None."""
  if not os.path.exists(path):
    return None
  with np.load(path) as z:
    if str(z["fingerprint"]) != digest:
      return None
    return {k: z[k] for k in z.files}, float(z["seconds"])


def load_shard(path, digest):
  """(nll [E, P], seconds) of a finished shard with this fingerprint, else None."""
  found = read_shard(path, digest)
  return None if found is None else (found[0]["nll"], found[1])


def save_shard(path, digest, nll, seconds):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = path + ".tmp.npz"
  np.savez(tmp, nll=nll, seconds=seconds, fingerprint=digest)
  os.replace(tmp, path)


class Progress(object):
  """Inputs done / total, input tokens/s and ETA on stderr, at most every `every` seconds."""

  def __init__(self, total_inputs, stream="stderr", every=5.0):
    self.total, self.done, self.tokens = total_inputs, 0, 0
    self.stream = sys.stderr if stream == "stderr" else stream
    self.every = every
    self.start = self.last = time.time()

  def skip(self, inputs):
    self.total -= inputs

  def update(self, label, length, inputs, tokens, force=False):
    self.done += inputs
    self.tokens += tokens
    now = time.time()
    if self.stream is None or (not force and now - self.last < self.every):
      return
    self.last = now
    rate = self.done / max(now - self.start, 1e-9)
    eta = (self.total - self.done) / max(rate, 1e-9)
    self.stream.write("[probes %s] %s N=%d: %d/%d inputs, %.0f tokens/s, ETA %dm%02ds\n" % (
        time.strftime("%H:%M:%S"), label, length, self.done, self.total,
        self.tokens / max(now - self.start, 1e-9), eta // 60, eta % 60))
    self.stream.flush()


def score_length(score_fn, books, examples, length, offsets, batch, progress=None, label=""):
  """nll [E, P] of the inputs of prefix length N at offsets [P] from their ends."""
  num = len(examples.end)
  out = np.zeros([num, len(offsets)], np.float64)
  positions = np.broadcast_to(length + np.asarray(offsets), (batch, len(offsets)))
  for a in range(0, num, batch):
    rows = sampling.Examples(examples.book[a:a + batch], examples.end[a:a + batch], None)
    ids = sampling.inputs(books, rows, length)
    out[a:a + len(ids)] = score_fn(ids, positions[:len(ids)])
    if progress is not None:
      progress.update(label, length, len(ids), len(ids) * length)
  return out


def run(specs, books, examples, lengths, offsets, out_dir, make_score_fn, batch_size=1,
        books_key="", stream="stderr"):
  """Scores every (model, N); returns ({label: {N: nll [E, P]}}, {label: {N: seconds}}).

  make_score_fn(spec) builds a model's score_fn (called at most once per model, and not at all
  when every shard of the model is already there).
  """
  ids = [b.ids for b in books]
  lengths = sorted(lengths)
  offsets = np.asarray(offsets)
  progress = Progress(len(specs) * len(lengths) * len(examples.end), stream)
  stream = progress.stream
  nll, seconds = {}, {}
  for spec in specs:
    nll[spec.label], seconds[spec.label] = {}, {}
    todo = []
    for n in lengths:
      digest = fingerprint(spec, examples, offsets, n, books_key)
      found = load_shard(shard_path(out_dir, spec.label, n), digest)
      if found is None:
        todo.append((n, digest))
      else:
        nll[spec.label][n], seconds[spec.label][n] = found
        progress.skip(len(examples.end))
    if not todo:
      if stream:
        stream.write("[probes] %s: all %d prefix lengths already scored (%s)\n"
                     % (spec.label, len(lengths), os.path.join(out_dir, "shards")))
      continue
    score_fn = make_score_fn(spec)
    if max(lengths) > score_fn.length:
      raise ProbeError("N=%d is above %s's length L=%d; use prefix lengths <= %d"
                       % (max(lengths), spec.label, score_fn.length, score_fn.length))
    for n, digest in todo:
      start = time.time()
      values = score_length(score_fn, ids, examples, n, offsets,
                            batch_size or getattr(score_fn, "batch_size", 1), progress,
                            spec.label)
      took = time.time() - start
      save_shard(shard_path(out_dir, spec.label, n), digest, values, took)
      nll[spec.label][n], seconds[spec.label][n] = values, took
    progress.update(spec.label, lengths[-1], 0, 0, force=True)
    close = getattr(score_fn, "close", None)
    if close:
      close()
  return nll, seconds
