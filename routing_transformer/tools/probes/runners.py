"""The perturbation, sequence-copy and suffix-identification probes for one model, resumable.

    plans = plan(("perturb", "copy", "suffix"), books, encoder, examples, lengths, model_length,
                 span, seed)                      # checked before anything is scored
    arrays = run_probe(spec, "perturb", plans["perturb"], book_ids, scorer, out_dir, books_key)

Perturbations and sequence copy run at the largest prefix length N on the token probe's own
examples (`sampling.as_rows`) and targets, so every probe and model sees the same targets;
suffix identification samples its examples once from `seed`. The NLLs of one (model, probe) go
to `<out>/shards/<label>/<probe>.npz` with a fingerprint of the model, the probe's protocol, its
examples and the books; a rerun loads a matching shard and does not even restore the model.
"""
import hashlib
import json
import os
import sys
import time

import numpy as np

from routing_transformer.tools.probes import perturbations as pt
from routing_transformer.tools.probes import run as run_lib
from routing_transformer.tools.probes import sampling
from routing_transformer.tools.probes import suffix as sx
from routing_transformer.tools.probes.errors import ProbeError

PROBES = ("token", "perturb", "copy", "suffix")
PERTURB_M = tuple(range(512, 7680 + 1, 512))  # the paper's m, capped by the first target
SUFFIX_PREFIXES = (200, 512, 1024, 2048, 4096, 8064)  # the paper's P, capped at L - suffix
SUFFIX_EXAMPLES = 1000


def parse_probes(value):
  """("token", ...) from "token,perturb" or a list; ProbeError naming the choices."""
  names = [p.strip() for p in (value.split(",") if isinstance(value, str) else value)
           if p.strip()]
  bad = [p for p in names if p not in PROBES]
  if bad or not names:
    raise ProbeError("--probes=%s: give some of %s, comma-separated" % (",".join(names),
                                                                      ",".join(PROBES)))
  return tuple(p for p in PROBES if p in names)


def parse_ints(value, flag):
  """[int] of "512,1024" (a list passes through); None for None."""
  if value is None or isinstance(value, (list, tuple)):
    return None if value is None else [int(v) for v in value]
  try:
    out = [int(v) for v in str(value).split(",") if v.strip()]
  except ValueError:
    raise ProbeError("--%s=%s: give comma-separated integers, e.g. 512,1024" % (flag, value))
  if not out:
    raise ProbeError("--%s is empty; give comma-separated integers, e.g. 512,1024" % flag)
  return out


def default_perturb_m(first_target):
  """The paper's m = 512, 1024, ..., 7680 up to the first target position."""
  out = [m for m in PERTURB_M if m <= first_target]
  if not out:
    raise ProbeError("the first target sits at position %d, below the paper's smallest m=512; "
                     "pass --perturb_m with values <= %d" % (first_target, first_target))
  return out


def default_suffix_prefixes(model_length, suffix_length):
  """The paper's P = 200, 512, 1024, 2048, 4096, 8064, capped at L - suffix_length."""
  cap = model_length - suffix_length
  if cap < 1:
    raise ProbeError("the model's length L=%d leaves no prefix before a %d-token suffix; pass "
                     "a shorter --suffix_length" % (model_length, suffix_length))
  return [p for p in SUFFIX_PREFIXES if p < cap] + [cap]


def _flagged(flag, fn, *args):
  try:
    return fn(*args)
  except ProbeError as e:
    raise ProbeError("--%s: %s" % (flag, e))


def plan(probes, books, encoder, examples, lengths, model_length, span, seed, perturb_m=None,
         perturb_runs=5, perturb_kinds=pt.KINDS, drop_rule="next", copy_distances=None,
         copy_context=0, suffix_prefixes=None, suffix_examples=SUFFIX_EXAMPLES,
         suffix_length=sx.SUFFIX_LENGTH, suffix_negatives=sx.NEGATIVES):
  """{probe: {"protocol": dict (JSON), "rows"/"suffix_examples": arrays}} of the non-token
  probes asked, every parameter checked (ProbeError naming the flag) before any scoring.

  examples: the token probe's sampling.Examples (sampled for the largest N of `lengths`).
  """
  ids = [b.ids for b in books]
  n = max(lengths)
  targets = sampling.positions(examples, n)  # [E, k], the same in every row
  first = int(targets.min())
  out = {}
  if "perturb" in probes:
    kinds = [k for k in (perturb_kinds.split(",") if isinstance(perturb_kinds, str)
                         else perturb_kinds) if k]
    if not kinds or any(k not in pt.KINDS for k in kinds):
      raise ProbeError("--perturb_kinds=%s: give some of %s" % (",".join(kinds),
                                                                 ",".join(pt.KINDS)))
    if drop_rule not in pt.DROP_RULES:
      raise ProbeError("--drop_rule=%s: use one of %s" % (drop_rule, ", ".join(pt.DROP_RULES)))
    ms = parse_ints(perturb_m, "perturb_m") or default_perturb_m(first)
    for m in ms:
      _flagged("perturb_m", pt.check_prefix_length, m, targets)
    if perturb_runs < 1:
      raise ProbeError("--perturb_runs=%d: give at least 1 run" % perturb_runs)
    if "replace" in kinds and sum(len(b) >= max(ms) for b in ids) < 2:
      raise ProbeError("--perturb_m=%d: 'replace' needs another book of at least m tokens; use "
                       "smaller m or more books" % max(ms))
    out["perturb"] = {"protocol": {"n": n, "m": sorted(ms), "runs": int(perturb_runs),
                                   "kinds": [k for k in pt.KINDS if k in kinds],
                                   "drop_rule": drop_rule, "pad_id": pt.PAD_ID, "seed": int(seed),
                                   "targets": int(targets.size)},
                      "rows": sampling.as_rows(examples), "targets": targets}
  if "copy" in probes:
    if copy_context < 0:
      raise ProbeError("--copy_context=%d: give 0 or more tokens" % copy_context)
    ds = parse_ints(copy_distances, "copy_distances") or pt.copy_distances(first, copy_context)
    for d in ds:
      _flagged("copy_distances", pt.check_distance, d, targets[0], copy_context)
    out["copy"] = {"protocol": {"n": n, "d": sorted(ds), "context": int(copy_context),
                                "targets": int(targets.size)},
                   "rows": sampling.as_rows(examples), "targets": targets}
  if "suffix" in probes:
    ps = (parse_ints(suffix_prefixes, "suffix_prefixes")
          or default_suffix_prefixes(model_length, suffix_length))
    for p in ps:
      if not 1 <= p <= model_length - suffix_length:
        raise ProbeError("--suffix_prefixes: prefix %d + suffix %d exceeds the model's length "
                         "L=%d; use prefixes in 1..%d" % (p, suffix_length, model_length,
                                                          model_length - suffix_length))
    if suffix_examples < 1 or suffix_negatives < 1:
      raise ProbeError("--suffix_examples and --suffix_negatives must be >= 1")
    table = sx.sentence_end_table(encoder)
    ends = [sx.sentence_ends(b, table) for b in ids]
    ex = _flagged("suffix_examples", sx.sample_suffix_examples, ids, ends, suffix_examples,
                  max(ps), suffix_length, suffix_negatives, seed)
    out["suffix"] = {"protocol": {"prefixes": sorted(ps), "examples": int(suffix_examples),
                                  "suffix_length": int(suffix_length),
                                  "negatives": int(suffix_negatives),
                                  "chance": 1.0 / (1 + suffix_negatives),
                                  "examples_digest": digest_of([ex])},
                     "suffix_examples": ex}
  return out


def digest_of(arrays, text=""):
  h = hashlib.sha1(text.encode())
  for a in arrays:
    h.update(np.ascontiguousarray(a, np.int64).tobytes())
  return h.hexdigest()


def fingerprint(spec, name, probe_plan, books_key):
  """Hex digest of what determines a (model, probe) shard."""
  arrays = [probe_plan[k] for k in ("rows", "targets", "suffix_examples") if k in probe_plan]
  return digest_of(arrays, json.dumps([spec.checkpoint, str(spec.hparams_set), spec.hparams,
                                       bool(spec.as_local), name, probe_plan["protocol"],
                                       books_key], sort_keys=True))


def shard_path(out_dir, label, name):
  safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in label)
  return os.path.join(out_dir, "shards", safe, "%s.npz" % name)


def flatten(tree, prefix=""):
  """{"a__b__c": array} of nested dicts of arrays (npz keys)."""
  out = {}
  for k, v in tree.items():
    key = "%s__%s" % (prefix, k) if prefix else str(k)
    if isinstance(v, dict):
      out.update(flatten(v, key))
    else:
      out[key] = np.asarray(v)
  return out


def unflatten(flat):
  """Inverse of flatten; keys that are integers come back as int."""
  out = {}
  for key, v in flat.items():
    parts = [int(p) if p.lstrip("-").isdigit() else p for p in key.split("__")]
    node = out
    for p in parts[:-1]:
      node = node.setdefault(p, {})
    node[parts[-1]] = v
  return out


def load_shard(path, digest):
  """(arrays, seconds) of a finished shard with this fingerprint, else None."""
  found = run_lib.read_shard(path, digest)
  if found is None:
    return None
  arrays, seconds = found
  return unflatten({k[2:]: v for k, v in arrays.items() if k.startswith("a_")}), seconds


def save_shard(path, digest, arrays, seconds):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = path + ".tmp.npz"
  np.savez(tmp, fingerprint=digest, seconds=seconds,
           **{"a_" + k: v for k, v in flatten(arrays).items()})
  os.replace(tmp, path)


def score(name, probe_plan, book_ids, score_fn, batch_rows, progress=None):
  """The NLL arrays of one probe (perturbations.py / suffix.py runners)."""
  p = probe_plan["protocol"]
  if name == "perturb":
    res = pt.run_perturbations(book_ids, probe_plan["rows"], p["n"], probe_plan["targets"],
                               score_fn, p["m"], p["runs"], p.get("seed", 0), p["kinds"],
                               p["pad_id"], p["drop_rule"], batch_rows, progress)
    return {"baseline": res["baseline"], "nll": res["nll"], "dropped": res["dropped"]}
  if name == "copy":
    res = pt.run_sequence_copy(book_ids, probe_plan["rows"], p["n"], probe_plan["targets"],
                               score_fn, p["d"], p["context"], batch_rows, progress)
    return {"baseline": res["baseline"], "nll": res["nll"]}
  if name == "suffix":
    candidates = 1 + p["negatives"]
    res = sx.run_suffix_identification(book_ids, probe_plan["suffix_examples"], p["prefixes"],
                                       score_fn, p["suffix_length"],
                                       getattr(score_fn, "length", None),
                                       max(1, batch_rows // candidates), progress)
    return {"mean_nll": res["mean_nll"]}
  raise ProbeError("no probe %r; use some of %s" % (name, ",".join(PROBES)))


def run_probe(spec, name, probe_plan, book_ids, scorer, out_dir, books_key="", batch_rows=None,
              stream="stderr"):
  """(arrays, seconds) of one (model, probe): the shard when it matches, else scored and saved.

  scorer: a Lazy (the model is restored only when something is left to score).
  """
  stream = sys.stderr if stream == "stderr" else stream
  digest = fingerprint(spec, name, probe_plan, books_key)
  path = shard_path(out_dir, spec.label, name)
  found = load_shard(path, digest)
  if found is not None:
    if stream:
      stream.write("[probes] %s: %s already scored (%s)\n" % (spec.label, name, path))
    return found

  def progress(message):
    if stream:
      stream.write("[probes %s] %s: %s\n" % (time.strftime("%H:%M:%S"), spec.label, message))
      stream.flush()

  score_fn = scorer.get()
  start = time.time()
  arrays = score(name, probe_plan, book_ids, score_fn,
                 batch_rows or getattr(score_fn, "batch_size", 1) or 1, progress)
  took = time.time() - start
  save_shard(path, digest, arrays, took)
  return unflatten(flatten(arrays)), took


class Lazy(object):
  """One model's score_fn, built by make_score_fn(spec) on first use, closed once at the end."""

  def __init__(self, make_score_fn, spec):
    self.make, self.spec, self.fn = make_score_fn, spec, None

  def get(self):
    if self.fn is None:
      self.fn = self.make(self.spec)
    return self.fn

  def shared(self, spec=None):
    """The score_fn without its close (for run.run, which closes what it is given)."""
    del spec
    fn = self.get()

    def view(inputs, targets):
      return fn(inputs, targets)

    view.length = getattr(fn, "length", float("inf"))
    view.batch_size = getattr(fn, "batch_size", 1)
    return view

  def close(self):
    close = getattr(self.fn, "close", None)
    if close:
      close()
    self.fn = None
