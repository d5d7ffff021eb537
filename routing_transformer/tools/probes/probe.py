"""The token-level probe end to end: books -> examples -> categories -> scores -> figures.

    result = probe(specs, books, encoder, lengths=[512, 1024], out_dir="probe_out")
    report.write(result, "probe_out")
"""
import hashlib
import math
import time

import numpy as np

from routing_transformer.tools.probes import categories as cats
from routing_transformer.tools.probes import report
from routing_transformer.tools.probes import run as run_lib
from routing_transformer.tools.probes import runners
from routing_transformer.tools.probes import sampling
from routing_transformer.tools.probes import scoring
from routing_transformer.tools.probes.errors import ProbeError

PAPER_LENGTHS = (512, 1024) + tuple(range(2048, 8192 + 1, 1024))
PAPER_TARGETS = 220000
PAPER_SPAN = (-50, -40)
PROFILE = 64  # positions from the end whose mean loss is reported
# Sun et al. (2021), footnote 4: "On one RTX8000 GPU, it takes around 104h to evaluate the entire
# PG-19 validation set with sequence length 8K and target sequence 10" (section 2.2: the
# validation set has ~3 million tokens).
PAPER_RATE = {"hours": 104.0, "validation_tokens": 3.0e6, "targets_per_input": 10,
              "length": 8192, "device": "one RTX8000",
              "source": "Sun et al. (2021), section 2.2 and footnote 4: ~104 h on one RTX8000 "
                        "for the ~3M-token PG-19 validation set at 8K, 10 targets per input"}


def default_lengths(model_length):
  """The paper's prefix lengths up to the model's length L."""
  out = [n for n in PAPER_LENGTHS if n <= model_length]
  if not out:
    raise ProbeError("the model's length L=%d is below the paper's shortest prefix 512; pass "
                     "--lengths, e.g. %d" % (model_length, model_length))
  return out


def check_lengths(lengths, model_length, span, profile):
  """ProbeError naming the fix for N above L or below what the span and profile need."""
  if not lengths:
    raise ProbeError("--lengths is empty; give prefix lengths, e.g. 512,1024,2048")
  if max(lengths) > model_length:
    raise ProbeError("N=%d is above the model's length L=%d; use prefix lengths <= %d"
                     % (max(lengths), model_length, model_length))
  need = max(-span[0], profile)
  if min(lengths) < need:
    raise ProbeError("N=%d is shorter than the %d tokens the target span %d:%d and the "
                     "--profile=%d need; use N >= %d or a shorter --span/--profile"
                     % (min(lengths), need, span[0], span[1], profile, need))


def scoring_offsets(span, profile, shortest):
  """Offsets from the input's end scored in each pass: the span, the profile and the END_SPANS
  that fit the shortest input."""
  reach = max([-span[0], profile] + [-a for a, _ in report.END_SPANS if -a <= shortest])
  return list(range(-reach, 0))


def word_scale(books, mode):
  """Perplexity scale: float (e.g. 1.248) or "exact" = tokens / words of the probed books."""
  if str(mode) == "exact":
    return sum(len(b.ids) for b in books) / float(sum(b.words for b in books))
  try:
    return float(mode)
  except ValueError:
    raise ProbeError("--word_scale=%s: give a number (1.248, the paper's) or 'exact'" % mode)


def target_categories(books, examples, full_length, frequent, ends, threshold):
  """Every target's categories, computed once from its full-length input (Sun et al.'s
  definition) and shared by every prefix length N.

  Args:
    books: [Book] (their ids).
    examples: sampling.Examples.
    full_length: the length of the full input (the longest N probed): the input of a target is
      book[end - full_length:end].
    frequent: bool [V] (categories.frequent_types).
    ends: bool [V] word ends (categories.word_ends) or None.
    threshold: "far" = last seen more than this many tokens back.
  Returns:
    {"frequency": int [E, k], "word": int [E, k] or None, "distance": int [E, k]} codes into
    categories.FREQUENCY, WORD and DISTANCE.
  """
  ids = [b.ids for b in books]
  tokens = np.stack([ids[b][t] for b, t in zip(examples.book, examples.targets)])
  codes = {"frequency": np.where(frequent[tokens], 0, 1), "word": None}
  if ends is not None:
    codes["word"] = np.stack([cats.word_position(ids[b], t, ends)
                              for b, t in zip(examples.book, examples.targets)])
  previous = {}
  distance = np.zeros_like(examples.targets)
  for i, (b, t) in enumerate(zip(examples.book, examples.targets)):
    if b not in previous:
      previous[b] = cats.previous_occurrence(ids[b])
    p = previous[b][t]
    distance[i] = np.where(p >= 0, t - p, -1)
  codes["distance"] = cats.distance_category(
      distance, sampling.positions(examples, full_length), threshold)
  return codes


def examples_digest(examples, books):
  """Hex digest of the examples and the books' ids (their tokens: another vocabulary or
  reading gives other shards)."""
  h = hashlib.sha1()
  for a in examples:
    h.update(np.ascontiguousarray(a, np.int64).tobytes())
  h.update(",".join(str(b.book_id) for b in books).encode())
  for b in books:
    h.update(np.ascontiguousarray(b.ids, np.int64).tobytes())
  return h.hexdigest()[:16]


def probe(specs, books, encoder, lengths, model_length, out_dir, span=PAPER_SPAN,
          num_targets=PAPER_TARGETS, seed=0, far_threshold=2048, frequent_fraction=0.1,
          frequency_corpus=None, scale=report.WORD_SCALE, profile=PROFILE, bootstrap=1000,
          batch_size=1, make_score_fn=None, t2t_usr_dir=None, vocab=None, stream="stderr",
          extra=None, probes=("token",), options=None, reading="lines"):
  """Runs the probes for every model spec; returns the result dict (report.write writes it).

  Args:
    specs: [run.ModelSpec].
    books: [data.Book] (encoded with the models' vocabulary).
    encoder: the vocabulary's encoder (word pieces; vocab size).
    lengths: prefix lengths N.
    model_length: the smallest L of the models (N above it is an error).
    out_dir: where the shards go (resume).
    span: target offsets from the input's end; k = span length.
    num_targets: targets in all (inputs = ceil(num_targets / k)).
    far_threshold: "far" = last seen more than this many tokens back.
    frequency_corpus: id arrays whose counts define "frequent" (default: the probed books).
    scale: perplexity scale (report.WORD_SCALE or probe.word_scale(books, "exact")).
    make_score_fn: spec -> score_fn (default: scoring.build_scorer + make_score_fn); called at
      most once per model, not at all when every shard of the model is there.
    probes: some of runners.PROBES ("token", "perturb", "copy", "suffix"); the others run at
      the largest N on the same examples and targets (runners.plan).
    options: keyword arguments of runners.plan (m and d lists, runs, kinds, suffix settings).
    reading: how the books were read (`problems.pg19_reading`; data.load_books), passed to the
      default scorers.
  """
  probes = runners.parse_probes(probes)
  lengths = sorted(set(int(n) for n in lengths))
  check_lengths(lengths, model_length, span, profile)
  k = span[1] - span[0]
  num_inputs = int(math.ceil(num_targets / float(k)))
  examples = sampling.sample_examples([len(b.ids) for b in books], num_inputs, span,
                                      max(lengths), seed)
  corpus = frequency_corpus if frequency_corpus is not None else [b.ids for b in books]
  frequent = cats.frequent_types(corpus, encoder.vocab_size, frequent_fraction)
  ends = cats.word_ends(encoder)
  codes = target_categories(books, examples, max(lengths), frequent, ends, far_threshold)
  offsets = scoring_offsets(span, profile, min(lengths))
  digest = examples_digest(examples, books)
  plans = runners.plan(probes, books, encoder, examples, lengths, model_length, span, seed,
                       **(options or {}))
  if make_score_fn is None:
    def make_score_fn(spec):
      return scoring.make_score_fn(scoring.build_scorer(
          spec.checkpoint, spec.hparams_set, vocab if vocab is not None else encoder,
          spec.hparams, spec.as_local, batch_size, t2t_usr_dir, reading=reading))
  started = time.time()
  nll, seconds, other = {}, {}, {}
  ids = [b.ids for b in books]
  for spec in specs:  # one model at a time: restored once (when anything is left), then closed
    scorer = runners.Lazy(make_score_fn, spec)
    if "token" in probes:
      n, s = run_lib.run([spec], books, examples, lengths, offsets, out_dir, scorer.shared,
                         batch_size, digest, stream)
      nll.update(n)
      seconds.update(s)
    other[spec.label] = {name: runners.run_probe(spec, name, plans[name], ids, scorer, out_dir,
                                                 digest, batch_size, stream)
                         for name in plans}
    scorer.close()
  figures = report.summarize(nll, offsets, span, codes, scale, bootstrap=bootstrap, seed=seed)
  weights = (report.resample_weights(len(examples.end), bootstrap, seed) if bootstrap else None)
  models = {}
  for spec in specs:
    speed = {str(n): {"seconds": seconds[spec.label][n],
                      "input_tokens_per_s": len(examples.end) * n / max(seconds[spec.label][n],
                                                                       1e-9)}
             for n in lengths if spec.label in seconds}
    models[spec.label] = {"checkpoint": spec.checkpoint, "hparams_set": str(spec.hparams_set),
                          "hparams": spec.hparams, "as_local": bool(spec.as_local),
                          "figures": figures.get(spec.label, {}), "speed": speed}
    for name, (arrays, took) in other[spec.label].items():
      protocol = plans[name]["protocol"]
      if name == "suffix":
        models[spec.label][name] = report.summarize_suffix(arrays, protocol, bootstrap, seed)
      else:
        summarize = report.summarize_perturb if name == "perturb" else report.summarize_copy
        models[spec.label][name] = summarize(arrays, protocol, scale, weights)
      models[spec.label][name]["seconds"] = took
  protocol = {
      "books": [[b.book_id, b.title, int(len(b.ids)), b.words] for b in books],
      "lengths": lengths, "span": list(span), "k": k, "inputs": len(examples.end),
      "targets": int(examples.targets.size), "seed": seed, "far_threshold": far_threshold,
      "categories_from_length": max(lengths), "reading": reading,
      "frequent_fraction": frequent_fraction,
      "frequency_corpus": "probed books" if frequency_corpus is None else "given corpus",
      "frequent_types": int(frequent.sum()), "word_scale": scale, "offsets": offsets,
      "end_spans": ["%d:%d" % s for s in report.END_SPANS], "bootstrap": bootstrap,
      "interval": "95% percentile bootstrap over inputs", "examples_digest": digest,
      "wall_seconds": time.time() - started, "probes": list(probes)}
  for name, p in plans.items():
    protocol[name] = p["protocol"]
  result = {"protocol": protocol, "models": models}
  result.update(extra or {})
  return result


def paper_rate(length=8192):
  """Seconds per forward pass of `length` tokens at the rate Sun et al. measured (footnote 4:
  about 104 h on one RTX8000 to evaluate the whole PG-19 validation set, ~3M tokens, with 8K
  inputs and 10 targets per input, i.e. ~300K passes of 8,192 tokens: 1.248 s a pass), scaled
  linearly to `length`."""
  passes = PAPER_RATE["validation_tokens"] / PAPER_RATE["targets_per_input"]
  return PAPER_RATE["hours"] * 3600.0 / passes * length / float(PAPER_RATE["length"])


def paper_estimate(hparams, vocab_size, tokens_per_s=None, accelerator_flops=1e14,
                   inputs=PAPER_TARGETS // 10, lengths=PAPER_LENGTHS):
  """Time of the paper's token-level protocol (22K inputs x 9 prefix lengths, each a pass of the
  model's static length L): at the paper's measured rate (`paper_rate`, one RTX8000), from a
  FLOP model at `accelerator_flops`, and with our measured tokens/s when given.

  The FLOP model counts only matmul FLOPs: at the paper's rate the released model runs at
  `paper_rate_flops_per_s` (about 5.7e12 FLOP/s), so an assumed 1e14 FLOP/s is ~18x faster
  than the paper's GPU ran it.
  """
  length = hparams.max_target_length or hparams.max_length
  per_token = scoring.forward_flops_per_token(hparams, vocab_size, length)
  passes = inputs * len(lengths)
  tokens = passes * length
  per_pass = paper_rate(length)
  out = {"flops_per_token": per_token, "passes": passes, "pass_tokens": length,
         "tokens": tokens, "flops": per_token * tokens,
         "paper_rate_seconds_per_pass": per_pass,
         "paper_rate_hours": passes * per_pass / 3600.0,
         "paper_rate_device": PAPER_RATE["device"],
         "paper_rate_flops_per_s": per_token * length / per_pass,
         "paper_rate_source": PAPER_RATE["source"],
         "accelerator_flops_per_s": accelerator_flops,
         "accelerator_hours": per_token * tokens / accelerator_flops / 3600.0}
  if tokens_per_s:
    out["this_machine_hours"] = tokens / tokens_per_s / 3600.0
  return out
