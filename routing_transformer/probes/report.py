"""Probe figures: perplexities with bootstrap intervals, one JSON, markdown tables, PNG plots.

Perplexity = exp(scale x mean token NLL): scale 1.248 (the RT paper's subwords per word on PG-19,
as Sun et al.) or tokens / words of the probed books ("exact"). 95% intervals: percentile
bootstrap over inputs (inputs resampled with replacement, every figure of a resample from the
same inputs; `bootstrap` resamples, seeded).
"""
import json
import math
import os

import numpy as np

from routing_transformer.probes import categories as cats

WORD_SCALE = 1.248
END_SPANS = ((-11, -1), (-15, -5), (-20, -10), (-50, -40))


def resample_weights(num_inputs, bootstrap, seed):
  """int32 [bootstrap, E]: how often each input is drawn in each resample."""
  rng = np.random.default_rng(seed)
  return rng.multinomial(num_inputs, np.full(num_inputs, 1.0 / num_inputs),
                         size=bootstrap).astype(np.int32)


def figure(sums, counts, scale, weights):
  """{tokens, nll, ppl, ci} of per-input NLL sums [E] and token counts [E]."""
  tokens = int(np.sum(counts))
  if tokens == 0:
    return {"tokens": 0, "nll": None, "ppl": None, "ci": None}
  mean = float(np.sum(sums) / tokens)
  out = {"tokens": tokens, "nll": mean, "ppl": math.exp(scale * mean), "ci": None}
  if weights is not None and len(weights):
    n = weights @ counts.astype(np.float64)
    s = weights @ sums
    ratio = s[n > 0] / n[n > 0]
    lo, hi = np.percentile(np.exp(scale * ratio), [2.5, 97.5])
    out["ci"] = [float(lo), float(hi)]
  return out


def masked_figure(nll, mask, scale, weights):
  mask = np.asarray(mask, bool)
  return figure(np.where(mask, nll, 0.0).sum(1), mask.sum(1), scale, weights)


def summarize(nll, offsets, span, target_codes, distance_codes, scale, end_spans=END_SPANS,
              bootstrap=1000, seed=0):
  """Every figure of every (model, N).

  Args:
    nll: {label: {N: float [E, P]}} NLLs at `offsets` [P] from the inputs' ends.
    span: (start, end) of the targets.
    target_codes: {"frequency": int [E, k] into categories.FREQUENCY, "word": [E, k] into
      categories.WORD or None}.
    distance_codes: {N: int [E, k] into categories.DISTANCE}.
    scale: perplexity = exp(scale x mean NLL).
  Returns:
    {label: {str(N): {"categories": {name: figure}, "end_spans": {"a:b": figure},
     "position_nll": [P] mean NLL by offset}}}.
  """
  offsets = list(map(int, offsets))
  cols = [offsets.index(o) for o in range(span[0], span[1])]
  out, weights = {}, None
  for label, by_length in nll.items():
    out[label] = {}
    for n, values in sorted(by_length.items()):
      if weights is None:
        weights = resample_weights(len(values), bootstrap, seed) if bootstrap else None
      t = values[:, cols]
      figs = {"all": masked_figure(t, np.ones_like(t, bool), scale, weights)}
      groups = [("frequency", cats.FREQUENCY, target_codes.get("frequency")),
                ("word", cats.WORD, target_codes.get("word")),
                ("distance", cats.DISTANCE, distance_codes.get(n))]
      for _, names, codes in groups:
        if codes is None:
          continue
        for i, name in enumerate(names):
          figs[name] = masked_figure(t, codes == i, scale, weights)
      spans = {}
      for a, b in end_spans:
        if -a <= len(offsets) and a in offsets:
          c = [offsets.index(o) for o in range(a, b)]
          spans["%d:%d" % (a, b)] = masked_figure(values[:, c], np.ones([len(values), len(c)],
                                                                        bool), scale, weights)
      out[label][str(n)] = {"categories": figs, "end_spans": spans,
                            "position_nll": [float(x) for x in values.mean(0)]}
  return out


def cell(fig):
  if not fig or fig["ppl"] is None:
    return "-"
  if fig.get("ci"):
    return "%.1f [%.1f, %.1f]" % (fig["ppl"], fig["ci"][0], fig["ci"][1])
  return "%.1f" % fig["ppl"]


def lengths_of(result):
  return sorted({int(n) for m in result["models"].values() for n in m["figures"]})


def markdown(result, names=None):
  """Tables: per category, models x N (perplexity [95% interval]; token counts below)."""
  lengths = lengths_of(result)
  models = result["models"]
  first = next(iter(models.values()))["figures"]
  available = list(next(iter(first.values()))["categories"])
  names = [c for c in (names or available) if c in available]
  lines = []
  for name in names:
    lines.append("\n**%s** targets: perplexity [95%% bootstrap interval over inputs] by prefix "
                 "length N" % name)
    lines.append("| model | " + " | ".join("N=%d" % n for n in lengths) + " |")
    lines.append("|---|" + "---|" * len(lengths))
    for label, m in models.items():
      figs = [m["figures"].get(str(n), {}).get("categories", {}).get(name) for n in lengths]
      lines.append("| %s | %s |" % (label, " | ".join(cell(f) for f in figs)))
    tokens = [next(iter(models.values()))["figures"].get(str(n), {}).get("categories", {})
              .get(name, {}).get("tokens", 0) for n in lengths]
    lines.append("| tokens | %s |" % " | ".join(str(t) for t in tokens))
  spans = list(next(iter(first.values()))["end_spans"])
  if spans:
    lines.append("\n**End of input**: perplexity of the targets at each span from the input's "
                 "end, by N")
    lines.append("| model | span | " + " | ".join("N=%d" % n for n in lengths) + " |")
    lines.append("|---|---|" + "---|" * len(lengths))
    for label, m in models.items():
      for s in spans:
        figs = [m["figures"].get(str(n), {}).get("end_spans", {}).get(s) for n in lengths]
        lines.append("| %s | [%s] | %s |" % (label, s, " | ".join(cell(f) for f in figs)))
  return "\n".join(lines) + "\n"


def plot(result, out_dir, prefix="probes"):
  """PNGs: perplexity vs N per category (models on one figure), end-of-input spans vs N, mean
  loss by position near the end. Returns the paths."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  models = result["models"]
  lengths = lengths_of(result)
  first = next(iter(models.values()))["figures"][str(lengths[0])]
  names = list(first["categories"])
  paths = []

  def series(m, getter):
    ys, lo, hi = [], [], []
    for n in lengths:
      f = getter(m["figures"].get(str(n), {}))
      ys.append(f["ppl"] if f and f["ppl"] else np.nan)
      ci = (f or {}).get("ci") or [np.nan, np.nan]
      lo.append(ci[0])
      hi.append(ci[1])
    return np.array(ys), np.array(lo), np.array(hi)

  cols = min(3, len(names))
  rows = -(-len(names) // cols)
  fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.3 * rows), squeeze=False)
  for ax, name in zip(axes.flat, names):
    for label, m in models.items():
      y, lo, hi = series(m, lambda f, name=name: f.get("categories", {}).get(name))
      ax.plot(lengths, y, marker="o", label=label)
      ax.fill_between(lengths, lo, hi, alpha=0.2)
    counts = [next(iter(models.values()))["figures"].get(str(n), {}).get("categories", {})
              .get(name, {}).get("tokens", 0) for n in lengths]
    ax.set_title("%s (%s tokens)" % (name, "%d" % counts[0] if min(counts) == max(counts) else
                                     "%d..%d by N" % (counts[0], counts[-1])), fontsize=9)
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths)
    ax.set_xticklabels([str(n) for n in lengths], fontsize=7)
    ax.set_xlabel("prefix length N", fontsize=8)
    ax.set_ylabel("perplexity", fontsize=8)
  for ax in list(axes.flat)[len(names):]:
    ax.axis("off")
  axes.flat[0].legend(fontsize=7)
  fig.suptitle("Perplexity of the targets by prefix length (bands: 95% bootstrap over inputs)",
               fontsize=10)
  fig.tight_layout()
  paths.append(os.path.join(out_dir, prefix + "_categories.png"))
  fig.savefig(paths[-1], dpi=110)
  plt.close(fig)

  spans = list(first["end_spans"])
  fig, axes = plt.subplots(1, len(models) + 1, figsize=(4.2 * (len(models) + 1), 3.4),
                           squeeze=False)
  for ax, (label, m) in zip(axes.flat, models.items()):
    for s in spans:
      y, lo, hi = series(m, lambda f, s=s: f.get("end_spans", {}).get(s))
      ax.plot(lengths, y, marker="o", label="[%s]" % s)
      ax.fill_between(lengths, lo, hi, alpha=0.15)
    ax.set_title("%s: end-of-input spans" % label, fontsize=9)
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths)
    ax.set_xticklabels([str(n) for n in lengths], fontsize=7)
    ax.set_xlabel("prefix length N", fontsize=8)
    ax.set_ylabel("perplexity", fontsize=8)
    ax.legend(fontsize=7)
  ax = axes.flat[-1]
  offsets = result["protocol"]["offsets"]
  for label, m in models.items():
    ax.plot(offsets, m["figures"][str(lengths[-1])]["position_nll"], label=label, lw=1)
  ax.set_title("mean loss by position, N=%d (%d inputs)" % (lengths[-1],
                                                            result["protocol"]["inputs"]),
               fontsize=9)
  ax.set_xlabel("offset from the input's end", fontsize=8)
  ax.set_ylabel("mean NLL (nats)", fontsize=8)
  ax.legend(fontsize=7)
  fig.tight_layout()
  paths.append(os.path.join(out_dir, prefix + "_end_of_input.png"))
  fig.savefig(paths[-1], dpi=110)
  plt.close(fig)
  return paths


def merge(results):
  """One result from several JSONs of the same protocol (their models side by side)."""
  base = dict(results[0])
  base["models"] = dict(base["models"])
  for r in results[1:]:
    if r["protocol"].get("examples_digest") != base["protocol"].get("examples_digest"):
      from routing_transformer.probes.errors import ProbeError  # pylint: disable=g-import-not-at-top
      raise ProbeError("the JSONs to merge were sampled differently (other books, seed, span or "
                       "N); rerun them with the same protocol flags")
    for label, m in r["models"].items():
      base["models"][label if label not in base["models"] else label + "'"] = m
  return base


def write(result, out_dir, prefix="probes"):
  """<out_dir>/<prefix>.json, .md and the PNGs; returns the paths."""
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, prefix + ".json")
  with open(path, "w") as f:
    json.dump(result, f, indent=1)
  md = os.path.join(out_dir, prefix + ".md")
  with open(md, "w") as f:
    f.write(markdown(result))
  return [path, md] + plot(result, out_dir, prefix)
