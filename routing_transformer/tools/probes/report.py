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

from routing_transformer.tools.probes import categories as cats

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


def summarize(nll, offsets, span, target_codes, scale, end_spans=END_SPANS, bootstrap=1000,
              seed=0):
  """Every figure of every (model, N).

  Args:
    nll: {label: {N: float [E, P]}} NLLs at `offsets` [P] from the inputs' ends.
    span: (start, end) of the targets.
    target_codes: {"frequency": int [E, k] into categories.FREQUENCY, "word": [E, k] into
      categories.WORD or None, "distance": [E, k] into categories.DISTANCE}: one category per
      target, the same for every N (probe.target_categories).
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
                ("distance", cats.DISTANCE, target_codes.get("distance"))]
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


def target_figure(nll, scale, weights):
  """figure of NLLs [E, K] or [R, E, K] (R runs averaged per target first); tokens = E x K
  targets, "runs" = R."""
  nll = np.asarray(nll, np.float64)
  runs = nll.shape[0] if nll.ndim == 3 else 1
  if nll.ndim == 3:
    nll = nll.mean(0)
  out = figure(nll.sum(1), np.full(len(nll), nll.shape[1]), scale, weights)
  out["runs"] = runs
  return out


def summarize_perturb(arrays, protocol, scale, weights):
  """{n, baseline, kinds: {kind: {m: figure}}, dropped: {m: {inputs, mean, total}}} of
  runners.score("perturb") arrays (weights: resample_weights over the inputs)."""
  out = {"n": protocol["n"], "baseline": target_figure(arrays["baseline"], scale, weights),
         "kinds": {}, "dropped": {}}
  for kind in protocol["kinds"]:
    out["kinds"][kind] = {str(m): target_figure(v, scale, weights)
                          for m, v in sorted(arrays["nll"][kind].items())}
  for m, c in sorted(arrays.get("dropped", {}).items()):
    out["dropped"][str(m)] = {"inputs": int(len(c)), "mean": float(np.mean(c)),
                              "total": int(np.sum(c))}
  return out


def summarize_copy(arrays, protocol, scale, weights):
  """{n, context, baseline, distances: {d: figure}} of runners.score("copy") arrays."""
  return {"n": protocol["n"], "context": protocol["context"],
          "baseline": target_figure(arrays["baseline"], scale, weights),
          "distances": {str(d): target_figure(v, scale, weights)
                        for d, v in sorted(arrays["nll"].items())}}


def summarize_suffix(arrays, protocol, bootstrap=1000, seed=0):
  """{chance, prefixes: {P: {examples, tokens, accuracy, ci, gold_nll}}}: accuracy = mean tie-
  shared credit (suffix.identification_credit), 95% percentile bootstrap over examples."""
  from routing_transformer.tools.probes import suffix  # pylint: disable=g-import-not-at-top
  out = {"chance": protocol["chance"], "prefixes": {}}
  weights = None
  for p, means in sorted(arrays["mean_nll"].items()):
    means = np.asarray(means, np.float64)
    if weights is None and bootstrap:
      weights = resample_weights(len(means), bootstrap, seed)
    credit = suffix.identification_credit(means)
    fig = {"examples": int(len(means)),
           "tokens": int(means.size * protocol["suffix_length"]),
           "accuracy": float(credit.mean()), "ci": None, "gold_nll": float(means[:, 0].mean())}
    if weights is not None:
      lo, hi = np.percentile(weights @ credit / len(credit), [2.5, 97.5])
      fig["ci"] = [float(lo), float(hi)]
    out["prefixes"][str(p)] = fig
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
  """Tables of every probe in the result: the token probe's (token_markdown), perturbations,
  sequence copy, suffix identification."""
  out = token_markdown(result, names) if lengths_of(result) else ""
  return out + perturb_markdown(result) + copy_markdown(result) + suffix_markdown(result)


def token_markdown(result, names=None):
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
  """PNGs of every probe in the result (token_plot, plot_perturbations, plot_copy, plot_suffix).
  Returns the paths."""
  paths = token_plot(result, out_dir, prefix) if lengths_of(result) else []
  for fn in (plot_perturbations, plot_copy, plot_suffix):
    paths += fn(result, out_dir, prefix)
  return paths


def token_plot(result, out_dir, prefix="probes"):
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
    ax.set_xlim(lengths[0] / 1.2, lengths[-1] * 1.2)  # a panel with no tokens has no data
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
    ax.set_xlim(lengths[0] / 1.2, lengths[-1] * 1.2)  # a panel with no tokens has no data
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


def _with(result, probe):
  return [(label, m[probe]) for label, m in result["models"].items() if m.get(probe)]


def _row(label, first, figs):
  return "| %s | %s |" % (" | ".join([label] + first), " | ".join(cell(f) for f in figs))


def _tokens_row(start, first, figures, columns):
  """The last row of a probe table: how many tokens each column scored."""
  return "%s %d | %s |" % (start, first["baseline"]["tokens"], " | ".join(
      str(figures[c]["tokens"]) for c in columns))


def _probe_table(result, probe, axis, prefix, title, lead, rows_of, figures_of):
  """A probe's markdown table: title(protocol), columns model, `lead`, then `prefix` + each value
  of the protocol's `axis`; rows_of(label, figures, protocol, columns) per model; the tokens row
  (figures_of(the first model's figures)). "" when no model ran the probe."""
  found = _with(result, probe)
  if not found:
    return ""
  p = result["protocol"][probe]
  columns = [str(x) for x in p[axis]]
  lines = [title(p), "| model | %s | " % " | ".join(lead) +
           " | ".join(prefix + c for c in columns) + " |",
           "|---" * (1 + len(lead) + len(columns)) + "|"]
  for label, f in found:
    lines += rows_of(label, f, p, columns)
  first = found[0][1]
  lines.append(_tokens_row("| tokens |" + " |" * (len(lead) - 1), first, figures_of(first),
                           columns))
  return "\n".join(lines) + "\n"


def perturb_markdown(result):
  """Per model: perplexity [95%] of the targets with the first m tokens perturbed, by kind."""
  def rows(label, f, p, ms):
    out = [_row(label, [kind, cell(f["baseline"])], [f["kinds"][kind].get(m) for m in ms])
           for kind in p["kinds"]]
    if f["dropped"]:
      out.append("| %s | tokens dropped per input (drop = control) | | %s |" % (
          label, " | ".join("%.1f" % f["dropped"][m]["mean"] for m in ms)))
    return out
  title = lambda p: ("\n**Perturbations** of the first m tokens of N=%d inputs (the token "
                     "probe's targets; %d runs of the random kinds, averaged): perplexity [95%% "
                     "bootstrap interval over inputs]; none = unperturbed" % (p["n"], p["runs"]))
  return _probe_table(result, "perturb", "m", "m=", title, ["kind", "none"], rows,
                      lambda f: next(iter(f["kinds"].values())))


def copy_markdown(result):
  """Per model: perplexity [95%] of the targets with their sequence copied d tokens before."""
  rows = lambda label, f, p, ds: [_row(label, [cell(f["baseline"])],
                                       [f["distances"].get(d) for d in ds])]
  title = lambda p: ("\n**Sequence copy**: the target sequence (with %d tokens before it) pasted "
                     "d tokens before the targets of N=%d inputs: perplexity [95%% bootstrap "
                     "interval over inputs]; none = no copy" % (p["context"], p["n"]))
  return _probe_table(result, "copy", "d", "d=", title, ["none"], rows,
                      lambda f: f["distances"])


def suffix_markdown(result):
  """Per model: suffix-identification accuracy [95%] by prefix length P (chance 1/6)."""
  found = _with(result, "suffix")
  if not found:
    return ""
  p = result["protocol"]["suffix"]
  ps = [str(x) for x in p["prefixes"]]

  def acc(f):
    if not f:
      return "-"
    if f.get("ci"):
      return "%.3f [%.3f, %.3f]" % (f["accuracy"], f["ci"][0], f["ci"][1])
    return "%.3f" % f["accuracy"]

  lines = ["\n**Suffix identification**: the gold next %d tokens vs %d negatives of the same "
           "book, after a prefix of P tokens ending at a sentence end: accuracy [95%% bootstrap "
           "interval over examples], chance %.3f" % (p["suffix_length"], p["negatives"],
                                                    p["chance"]),
           "| model | " + " | ".join("P=%s" % x for x in ps) + " |",
           "|---|" + "---|" * len(ps)]
  for label, f in found:
    lines.append("| %s | %s |" % (label, " | ".join(acc(f["prefixes"].get(x)) for x in ps)))
  lines.append("| examples | %s |" % " | ".join(
      str(found[0][1]["prefixes"][x]["examples"]) for x in ps))
  return "\n".join(lines) + "\n"


def _pyplot():
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def _curve(ax, xs, figs, key="ppl", **kw):
  y = np.array([f[key] if f and f.get(key) is not None else np.nan for f in figs], float)
  ci = np.array([(f or {}).get("ci") or [np.nan, np.nan] for f in figs], float)
  line, = ax.plot(xs, y, marker="o", **kw)
  ax.fill_between(xs, ci[:, 0], ci[:, 1], alpha=0.15, color=line.get_color())
  return line


def plot_perturbations(result, out_dir, prefix="probes"):
  """<prefix>_perturbations.png: perplexity vs m, one line per kind, one panel per model, the
  unperturbed perplexity as a dashed line (drop vs its control: solid vs dotted)."""
  found = _with(result, "perturb")
  if not found:
    return []
  plt = _pyplot()
  p = result["protocol"]["perturb"]
  fig, axes = plt.subplots(1, len(found), figsize=(4.6 * len(found), 3.6), squeeze=False)
  for ax, (label, f) in zip(axes.flat, found):
    for kind in p["kinds"]:
      _curve(ax, p["m"], [f["kinds"][kind].get(str(m)) for m in p["m"]], label=kind,
             linestyle=":" if kind == "drop_control" else "-")
    ax.axhline(f["baseline"]["ppl"], color="k", linestyle="--", lw=1, label="unperturbed")
    ax.set_title("%s: first m of N=%d perturbed (%d targets)" % (label, p["n"],
                                                                f["baseline"]["tokens"]),
                 fontsize=9)
    ax.set_xlabel("m (tokens perturbed)", fontsize=8)
    ax.set_ylabel("perplexity", fontsize=8)
    ax.legend(fontsize=7)
  fig.suptitle("Perturbed prefixes (bands: 95% bootstrap over inputs)", fontsize=10)
  return _save(plt, fig, out_dir, prefix + "_perturbations.png")


def _log2_axis(ax, values, xlabel, ylabel):
  """x on a log-2 scale with a tick (labelled) at every value of `values`."""
  ax.set_xlim(min(values) / 1.2, max(values) * 1.2)
  ax.set_xscale("log", base=2)
  ax.set_xticks(values)
  ax.set_xticklabels([str(v) for v in values], fontsize=7)
  ax.set_xlabel(xlabel, fontsize=8)
  ax.set_ylabel(ylabel, fontsize=8)


def _save(plt, fig, out_dir, name):
  """Lays out and writes fig as out_dir/name; [its path]."""
  fig.tight_layout()
  path = os.path.join(out_dir, name)
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return [path]


def plot_copy(result, out_dir, prefix="probes"):
  """<prefix>_copy.png: perplexity vs copy distance d per model (dashed: no copy)."""
  found = _with(result, "copy")
  if not found:
    return []
  plt = _pyplot()
  p = result["protocol"]["copy"]
  fig, ax = plt.subplots(figsize=(5.4, 3.8))
  for label, f in found:
    line = _curve(ax, p["d"], [f["distances"].get(str(d)) for d in p["d"]], label=label)
    ax.axhline(f["baseline"]["ppl"], color=line.get_color(), linestyle="--", lw=1)
  _log2_axis(ax, p["d"], "distance d of the copy before the targets", "perplexity")
  ax.set_title("Sequence copy, N=%d (%d targets; dashed: no copy; bands: 95%% bootstrap)"
               % (p["n"], found[0][1]["baseline"]["tokens"]), fontsize=9)
  ax.legend(fontsize=7)
  return _save(plt, fig, out_dir, prefix + "_copy.png")


def plot_suffix(result, out_dir, prefix="probes"):
  """<prefix>_suffix.png: suffix-identification accuracy vs prefix length P, chance line."""
  found = _with(result, "suffix")
  if not found:
    return []
  plt = _pyplot()
  p = result["protocol"]["suffix"]
  fig, ax = plt.subplots(figsize=(5.4, 3.8))
  for label, f in found:
    _curve(ax, p["prefixes"], [f["prefixes"].get(str(x)) for x in p["prefixes"]],
           key="accuracy", label=label)
  ax.axhline(p["chance"], color="k", linestyle="--", lw=1, label="chance 1/%d" % (
      p["negatives"] + 1))
  _log2_axis(ax, p["prefixes"], "prefix length P", "accuracy")
  ax.set_ylim(0, 1)
  ax.set_title("Suffix identification (%d examples; bands: 95%% bootstrap)" % p["examples"],
               fontsize=9)
  ax.legend(fontsize=7)
  return _save(plt, fig, out_dir, prefix + "_suffix.png")


def merge(results):
  """One result from several JSONs of the same protocol (their models side by side)."""
  base = dict(results[0])
  base["models"] = dict(base["models"])
  for r in results[1:]:
    same = all(r["protocol"].get(k) == base["protocol"].get(k)
               for k in ("perturb", "copy", "suffix")
               if k in r["protocol"] and k in base["protocol"])
    if not same or r["protocol"].get("examples_digest") != base["protocol"].get(
        "examples_digest"):
      from routing_transformer.tools.probes.errors import ProbeError  # pylint: disable=g-import-not-at-top
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
