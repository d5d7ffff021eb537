"""The look-up study of research/notes/routing_learning.md: a plan of `retrieval_study.py` runs,
resumable.

    python research/lookup_study.py --phase A            # what makes a look-up learnable
    python research/lookup_study.py --phase B            # full / local / routing + switches
    python research/lookup_study.py --phase C            # why routing misses far look-ups
    python research/lookup_study.py --phase D            # which layout lets far look-ups learn
    python research/lookup_study.py --phase E            # the dense control, with/without local
    python research/lookup_study.py --phase F            # routing heads without local heads
    python research/lookup_study.py --phase G            # phase F's layout: seeds, clusters, self
    python research/lookup_study.py --phase H            # full attention for 30 minutes
    python research/lookup_study.py --phase I            # full attention's learning rate
    python research/lookup_study.py --phase J            # full attention at 512 tokens
    python research/lookup_study.py --phase K            # phase H at a learning rate of 0.01
    python research/lookup_study.py --phase L            # the paper's routing layout at 0.01
    python research/lookup_study.py --phase M            # phase K's third seed
    python research/lookup_study.py --phase N            # the paper layout + each switch
    python research/lookup_study.py --phase O            # phase A: positions, width, look-ups
    python research/lookup_study.py --report             # table + curves from the results

Each run is its own process (`research/retrieval_study.py`), appending one JSON line per
evaluation to `research/results/lookup_study.jsonl`; a run whose last step is already there is
skipped, so a study cut short (a session's end) continues where it stopped. `--only LABEL,...`
runs a subset; `--dry_run` lists what would run.
"""
import argparse
import collections
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "research", "results", "lookup_study.jsonl")

Run = collections.namedtuple("Run", "label model hparams_set hparams layout steps eval_every "
                                    "sequences seed control", defaults=("",))

ADAM = "optimizer=adam,learning_rate_schedule=constant*linear_warmup,learning_rate_constant=0.001"
PRE_NORM = "layer_preprocess_sequence=n,layer_postprocess_sequence=da"
# The schedule phases A-J ran with, the tiny sets' own until 2026-11-26: a warm-up to 0.05, then
# rsqrt decay. The sets now hold 0.01 after the warm-up (phases I-L), so these phases name it.
DECAYING_LR = ("learning_rate_schedule=constant*linear_warmup*rsqrt_normalized_decay,"
               "learning_rate_constant=0.05")
# The recipe phase A found (research/notes/routing_learning.md), with phases B-J's schedule.
RECIPE = "initializer_gain=1.0," + DECAYING_LR


def overrides(*parts):
  """Comma-joined hparams overrides; a later value of a name replaces an earlier one."""
  merged = {}
  for item in (x for part in parts for x in part.split(",") if x):
    name, value = item.split("=", 1)
    merged.pop(name, None)
    merged[name] = value
  return ",".join("%s=%s" % kv for kv in merged.items())


def phase_a():
  """Full attention at 256 tokens (look-ups 2-32 and 33-250 back), one change at a time."""
  layout, steps, every, seqs = "long_range_retrieval_256_mixed", 500, 100, 8
  full = "full_transformer_tiny1k"
  variants = [
      ("A control (paper gain 0.2)", "", (1, 2)),
      ("A initializer_gain=1.0", "initializer_gain=1.0", (1, 2)),
      ("A Adam 1e-3", ADAM, (1,)),
      ("A Adam 1e-3, gain 1.0", ADAM + ",initializer_gain=1.0", (1,)),
      ("A pre-norm", PRE_NORM, (1,)),
      ("A learning_rate_constant=0.2", "learning_rate_constant=0.2", (1,)),
      ("A Adafactor without parameter scale, 1e-3",
       "optimizer_adafactor_multiply_by_parameter_scale=False,learning_rate_constant=0.001",
       (1,)),
      ("A head_dense=False", "head_dense=False", (1,)),
      ("A initializer=normal_unit_scaling", "initializer=normal_unit_scaling", (1,)),
      ("A initializer_gain=0.5", "initializer_gain=0.5", (1,)),
      ("A initializer_gain=1.0, head_dense=False", "initializer_gain=1.0,head_dense=False", (1,)),
  ]
  def paper_gain(hp):  # the variants change one thing from the paper's gain 0.2
    return hp if "initializer_gain" in hp else ",".join(x for x in ("initializer_gain=0.2", hp)
                                                        if x)
  runs = [Run(label, "routing_transformer", full, overrides(DECAYING_LR, paper_gain(hp)), layout,
              steps, every, seqs, seed) for label, hp, seeds in variants for seed in seeds]
  runs.append(Run("A peer: T2T transformer_tiny", "transformer", "transformer_tiny",
                  "learning_rate_warmup_steps=100", layout, steps, every, seqs, 1))
  return runs


def phase_b(recipe=RECIPE):
  """1,024 tokens, look-ups 2-64, 65-191 and 192-1000 back: full, local and routing at equal
  steps with `recipe`, three seeds; then routing with each switch."""
  layout, steps, every, seqs = "long_range_retrieval_1k_mixed", 1000, 100, 4
  def models(seed):
    return [Run("B %s" % name, "routing_transformer", "%s_transformer_tiny1k" % name, recipe,
                layout, steps, every, seqs, seed) for name in ("routing", "local", "full")]
  runs = models(1)  # seed 1 of each, then the switches, then seeds 2 and 3
  switches = [
      ("routing_exclude_self", "routing_exclude_self=True"),
      ("routing_logit_scale=rsqrt_depth", "routing_logit_scale=rsqrt_depth"),
      ("routing_logit_scale=learned", "routing_logit_scale=learned"),
      ("share_qk=False", "share_qk=False"),
      ("routing_mode=causal_window", "routing_mode=causal_window"),
  ]
  for name, hp in switches:
    runs.append(Run("B routing + " + name, "routing_transformer", "routing_transformer_tiny1k",
                    ",".join(x for x in (recipe, hp) if x), layout, steps, every, seqs, 1))
  return runs + models(2) + models(3)


def phase_c(recipe=RECIPE):
  """Why routing misses far look-ups (1k mixed layout, 1,000 steps, `lookup_diagnostics`):
  routing's settings one at a time, and together, against the paper settings."""
  layout, steps, every, seqs = "long_range_retrieval_1k_mixed", 1000, 100, 4
  variants = [
      ("C routing", ""),
      ("C routing + exclude_self, rsqrt_depth",
       "routing_exclude_self=True,routing_logit_scale=rsqrt_depth"),
      ("C routing, 4 clusters x 256", "sparsity_cluster_size=4,sparsity_cluster_attention_window=256"),
      ("C routing + share_qk=False", "share_qk=False"),
      # one cluster of all 1,024 positions: routing heads attend densely with routing's logits
      # (shared, normalised q/k): is it the clustering or the logit form that does not learn?
      ("C routing, 1 cluster x 1024", "sparsity_cluster_size=1,sparsity_cluster_attention_window=1024"),
      ("C routing + exclude_self, rsqrt_depth, 1 cluster x 1024",
       "routing_exclude_self=True,routing_logit_scale=rsqrt_depth,sparsity_cluster_size=1,"
       "sparsity_cluster_attention_window=1024"),
      ("C routing + share_qk=False, rsqrt_depth, 1 cluster x 1024",
       "share_qk=False,routing_logit_scale=rsqrt_depth,sparsity_cluster_size=1,"
       "sparsity_cluster_attention_window=1024"),
      ("C routing, routing heads in both layers", "sparsity_skip_first=0"),
      ("C routing + exclude_self, learned scale, 1 cluster x 1024",
       "routing_exclude_self=True,routing_logit_scale=learned,sparsity_cluster_size=1,"
       "sparsity_cluster_attention_window=1024"),
  ]
  runs = [Run(label, "routing_transformer", "routing_transformer_tiny1k",
              ",".join(x for x in (recipe, hp) if x), layout, steps, every, seqs, 1)
          for label, hp in variants]
  # The control: the same places (layer 1 local; layer 2 two local heads and two dense heads over
  # all earlier positions, separate keys, 1/sqrt(d) logits) without the layer norm of routing's
  # queries and keys: standard dense heads (retrieval_study --control).
  runs.append(Run("C control: two standard dense heads in routing's places",
                  "routing_transformer", "routing_transformer_tiny1k",
                  recipe + ",share_qk=False,routing_logit_scale=rsqrt_depth,sparsity_cluster_size=1,"
                  "sparsity_cluster_attention_window=1024", layout, steps, every, seqs, 1,
                  "unnormalised_routing_qk"))
  return runs


def phase_d(recipe=RECIPE):
  """Which layout lets long-range heads learn the far look-ups (1k mixed, seed 1): four routing
  heads in layer 2 or in both layers, the dense-head control with four heads in layer 2 and with
  two in both layers; then full attention's seed 2."""
  layout, every, seqs = "long_range_retrieval_1k_mixed", 100, 4
  dense = ",share_qk=False,routing_logit_scale=rsqrt_depth,sparsity_cluster_size=1," \
          "sparsity_cluster_attention_window=1024"
  variants = [  # label, hparams, steps, control
      ("D routing, 4 routing heads in layer 2", "local_num_heads=0,sparsity_cluster_num_heads=4",
       1000, ""),
      ("D control: four standard dense heads in layer 2",
       "local_num_heads=0,sparsity_cluster_num_heads=4" + dense, 1000, "unnormalised_routing_qk"),
      ("D routing, 4 routing heads in both layers",
       "local_num_heads=0,sparsity_cluster_num_heads=4,sparsity_skip_first=0", 1000, ""),
      # near look-ups (within layer 1's local window) are learned by every layout, far ones only
      # by full attention: do far look-ups need long-range heads in both layers?
      ("D control: two standard dense heads in both layers", "sparsity_skip_first=0" + dense,
       1000, "unnormalised_routing_qk"),
  ]
  runs = [Run(label, "routing_transformer", "routing_transformer_tiny1k",
              ",".join(x for x in (recipe, hp) if x), layout, steps, every, seqs, 1, control)
          for label, hp, steps, control in variants]
  runs.append(Run("B full", "routing_transformer", "full_transformer_tiny1k", recipe, layout,
                  1000, every, seqs, 2))
  return runs


# Standard dense heads in routing's places: one cluster of all 1,024 positions, separate keys,
# raw queries and keys (`--control unnormalised_routing_qk`) and no routing logit scale, because
# `layers.projections` already scales every query by d^-0.5. (Phases C and D added
# routing_logit_scale=rsqrt_depth on top: logits q.k / d, sqrt(d) = 5.7x colder than standard.)
DENSE = "share_qk=False,sparsity_cluster_size=1,sparsity_cluster_attention_window=1024"


def phase_e(recipe=RECIPE):
  """Long-range heads with and without local heads (1k mixed, seed 1, 1,000 steps), the dense
  control at the standard 1/sqrt(d) logit scale: does it learn like full attention without
  local heads, and with four local heads in layer 1?"""
  layout, every, seqs = "long_range_retrieval_1k_mixed", 100, 4
  four = "local_num_heads=0,sparsity_cluster_num_heads=4"
  variants = [  # label, hparams, steps, control
      ("E control: four standard dense heads in both layers",
       four + ",sparsity_skip_first=0," + DENSE, 1000, "unnormalised_routing_qk"),
      ("E control: four standard dense heads in layer 2", four + "," + DENSE, 1000,
       "unnormalised_routing_qk"),
  ]
  return [Run(label, "routing_transformer", "routing_transformer_tiny1k",
              ",".join(x for x in (recipe, hp) if x), layout, steps, every, seqs, 1, control)
          for label, hp, steps, control in variants]


def phase_f(recipe=RECIPE):
  """Routing heads without local heads (1k mixed, seed 1, 1,000 steps; phase E: the dense control
  learns there like full attention): four routing heads in both layers, 8 clusters x 128, at the
  standard logit scale, with shared and with separate keys."""
  layout, every, seqs = "long_range_retrieval_1k_mixed", 100, 4
  four = "local_num_heads=0,sparsity_cluster_num_heads=4,sparsity_skip_first=0"
  variants = [
      ("F routing, 4 routing heads in both layers + rsqrt_depth",
       four + ",routing_logit_scale=rsqrt_depth"),
      ("F routing, 4 routing heads in both layers + rsqrt_depth, share_qk=False",
       four + ",routing_logit_scale=rsqrt_depth,share_qk=False"),
  ]
  return [Run(label, "routing_transformer", "routing_transformer_tiny1k",
              ",".join(x for x in (recipe, hp) if x), layout, 1000, every, seqs, 1)
          for label, hp in variants]


def phase_g(recipe=RECIPE):
  """The layout phase F found (four routing heads in both layers, no local heads, logits scaled
  by 1/sqrt(d)): seeds 2 and 3, then 4 clusters x 256 and self exclusion beside it (seed 1),
  then self exclusion's seeds 2 and 3."""
  layout, every, seqs = "long_range_retrieval_1k_mixed", 100, 4
  base = "local_num_heads=0,sparsity_cluster_num_heads=4,sparsity_skip_first=0," \
         "routing_logit_scale=rsqrt_depth"
  label = "F routing, 4 routing heads in both layers + rsqrt_depth"
  runs = [Run(label, "routing_transformer", "routing_transformer_tiny1k",
              ",".join((recipe, base)), layout, 1000, every, seqs, seed) for seed in (2, 3)]
  variants = [
      ("G the same, 4 clusters x 256", "sparsity_cluster_size=4,sparsity_cluster_attention_window=256"),
      ("G the same + routing_exclude_self", "routing_exclude_self=True"),
  ]
  runs += [Run(name, "routing_transformer", "routing_transformer_tiny1k",
               ",".join((recipe, base, hp)), layout, 1000, every, seqs, 1)
           for name, hp in variants]
  # self exclusion took seed 1 to full attention's level: seeds 2 and 3 (after full's seed 3)
  return runs + [r._replace(seed=seed) for r in runs[-1:] for seed in (2, 3)]


def phase_h(recipe=RECIPE):
  """Full attention for 30 minutes of training: phase B's full model (now in query blocks,
  full.causal_full_attention, 2.4x the steps per second) for 3,000 steps, seeds 1 and 2; then
  `routing_only_transformer_tiny1k` for as many steps (seed 1), for the equal-step ratio."""
  layout, every, seqs = "long_range_retrieval_1k_mixed", 250, 4
  runs = [Run("H full, 3,000 steps", "routing_transformer", "full_transformer_tiny1k", recipe,
              layout, 3000, every, seqs, seed) for seed in (1, 2)]
  return runs + [Run("H routing_only_transformer_tiny1k, 3,000 steps", "routing_transformer",
                     "routing_only_transformer_tiny1k", recipe, layout, 3000, every, seqs, 1)]


CONSTANT_LR = "learning_rate_schedule=constant*linear_warmup"
HELD_LR = CONSTANT_LR + ",learning_rate_constant=0.01"  # phase I's best: phase K's recipe


def phase_i(recipe=RECIPE):
  """Full attention's learning rate (phase H: 0.05 after the 100-step warm-up, then decaying as
  rsqrt(step / 100): 0.016 at step 1,000, 0.009 at 3,000), seed 1, 1,500 steps each: held at
  0.05 (started for 3,000 steps, stopped at 1,500 at chance), the decay from 0.02, held at 0.01."""
  layout, every, seqs, steps = "long_range_retrieval_1k_mixed", 250, 4, 1500
  variants = [
      ("I full, constant learning rate", CONSTANT_LR),
      ("I full, learning_rate_constant=0.02", "learning_rate_constant=0.02"),
      ("I full, constant learning rate 0.01", HELD_LR),
  ]
  return [Run(label, "routing_transformer", "full_transformer_tiny1k", ",".join((recipe, hp)),
              layout, steps, every, seqs, 1) for label, hp in variants]


MIXED_512 = "mixed:512,32,32,8,2-64/65-191/192-500"


def phase_j(recipe=RECIPE):
  """Full attention at 512 tokens (phase H's 32 look-ups, keys and values; far band 192-500, beyond
  the tiny sets' local reach of 191), 8 sequences a step (phase H's 4,096 tokens), seeds 1-3."""
  return [Run("J full, 512 tokens", "routing_transformer", "full_transformer_tiny1k", recipe,
              MIXED_512, 2000, 250, 8, seed) for seed in (1, 2, 3)]


def held_run(label, hparams_set, seed, recipe=RECIPE):
  """A run of phases K-M: phase H's task and 3,000 steps at phase I's best rate, 0.01 held."""
  return Run(label, "routing_transformer", hparams_set, ",".join((recipe, HELD_LR)),
             "long_range_retrieval_1k_mixed", 3000, 250, 4, seed)


def phase_k(recipe=RECIPE):
  """Phase H with phase I's best learning rate, 0.01 held after the warm-up: full attention for
  3,000 steps, seeds 1 and 2, then `routing_only_transformer_tiny1k` (seeds 1 and 2) and
  `local_transformer_tiny1k` (seed 1) at equal steps."""
  return ([held_run("K full, constant learning rate 0.01, 3,000 steps", "full_transformer_tiny1k",
                    seed, recipe) for seed in (1, 2)] +
          [held_run("K routing_only_transformer_tiny1k, constant learning rate 0.01",
                    "routing_only_transformer_tiny1k", seed, recipe) for seed in (1, 2)] +
          [held_run("K local_transformer_tiny1k, constant learning rate 0.01",
                    "local_transformer_tiny1k", 1, recipe)])


def phase_l(recipe=RECIPE):
  """Phase K's held rate for the paper's routing layout (`routing_transformer_tiny1k`: local heads
  in both layers, 2 routing heads from layer 2, unscaled logits), seeds 1 and 2, and
  `local_transformer_tiny1k`'s seed 2, at phase K's 3,000 steps."""
  paper = "L routing_transformer_tiny1k, constant learning rate 0.01"
  return [held_run(paper, "routing_transformer_tiny1k", 1, recipe),
          held_run("K local_transformer_tiny1k, constant learning rate 0.01",
                   "local_transformer_tiny1k", 2, recipe),
          held_run(paper, "routing_transformer_tiny1k", 2, recipe)]


def phase_m(recipe=RECIPE):
  """Phase K's third seed: full attention, `routing_only_transformer_tiny1k` and
  `local_transformer_tiny1k` at the held rate, seed 3 (the same labels as phase K's runs)."""
  return [run._replace(seed=3) for run in phase_k(recipe) if run.seed == 1]


def phase_n(recipe=RECIPE):
  """The paper's routing layout (`routing_transformer_tiny1k`, phase L) at the held rate with each
  routing switch beside it, one at a time, seed 1, 3,000 steps: both switches of
  `routing_only_transformer_tiny1k` together first, then each alone, the learned logit scale,
  separate keys and strictly causal routing; last the paper layout's third seed."""
  paper = "routing_transformer_tiny1k"
  variants = [
      ("N paper layout + rsqrt_depth + routing_exclude_self",
       "routing_logit_scale=rsqrt_depth,routing_exclude_self=True"),
      ("N paper layout + rsqrt_depth", "routing_logit_scale=rsqrt_depth"),
      ("N paper layout + routing_exclude_self", "routing_exclude_self=True"),
      ("N paper layout + routing_logit_scale=learned", "routing_logit_scale=learned"),
      ("N paper layout + share_qk=False", "share_qk=False"),
      ("N paper layout + routing_mode=causal_window", "routing_mode=causal_window"),
  ]
  runs = [held_run(label, paper, 1, recipe) for label, _ in variants]
  runs = [run._replace(hparams=overrides(run.hparams, hp)) for run, (_, hp) in zip(runs, variants)]
  return runs + [r._replace(seed=3) for r in phase_l(recipe) if r.hparams_set == paper][:1]


def phase_o():
  """Phase A's candidates it left out, one at a time, at the paper's gain 0.2 and at gain 1.0
  (phase A's task, schedule and 500 steps, seed 1): relative positions off, a model of half the
  width (hidden and embedding 64), 4 look-ups per sequence instead of 16; then the gain-1.0
  control again (phase A's, on this machine)."""
  layout, steps, every, seqs = "long_range_retrieval_256_mixed", 500, 100, 8
  variants = [("relative positions off", "max_relative_position=0", layout),
              ("hidden and embedding 64", "hidden_size=64,embedding_dims=64", layout),
              ("4 look-ups per sequence", "", "mixed:256,4,16,8,2-32/33-250")]
  runs = [Run("O %s, gain %s" % (name, gain), "routing_transformer", "full_transformer_tiny1k",
              overrides(DECAYING_LR, "initializer_gain=" + gain, hp), where, steps, every, seqs, 1)
          for gain in ("0.2", "1.0") for name, hp, where in variants]
  return runs + [Run("O control, gain 1.0", "routing_transformer", "full_transformer_tiny1k",
                     overrides(DECAYING_LR, "initializer_gain=1.0"), layout, steps, every, seqs,
                     1)]


PHASES = {"A": phase_a, "B": phase_b, "C": phase_c, "D": phase_d, "E": phase_e, "F": phase_f,
          "G": phase_g, "H": phase_h, "I": phase_i, "J": phase_j, "K": phase_k,
          "L": phase_l, "M": phase_m, "N": phase_n, "O": phase_o}


def load(path=RESULTS):
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def key(record):
  return (record["label"], record["seed"])


def finished(records, run):
  return any(key(r) == (run.label, run.seed) and r["step"] >= run.steps for r in records)


def run_one(run, out):
  cmd = [sys.executable, os.path.join(ROOT, "research", "retrieval_study.py"),
         "--model", run.model, "--hparams_set", run.hparams_set,
         "--hparams", overrides(run.hparams),
         "--layout", run.layout, "--steps", str(run.steps), "--eval_every", str(run.eval_every),
         "--sequences", str(run.sequences), "--seed", str(run.seed), "--label", run.label,
         "--out", out] + (["--control", run.control] if run.control else [])
  return subprocess.call(cmd, cwd=ROOT)


def final(records):
  """{(label, seed): last record} in the order first seen."""
  out = collections.OrderedDict()
  for r in records:
    out[key(r)] = r
  return out


def fmt(x):
  return "-" if x is None else "%.2f" % x


def table(records, prefix=""):
  """Markdown rows, one per run (label starting with `prefix`), in the order run."""
  lines = ["| run | seed | steps | s | steps/s | near acc | far acc | by band | eval loss "
           "(answers) | routing: no-cluster / self share | far items: co-clustered / rank |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
  for (label, seed), r in final(records).items():
    if not label.startswith(prefix):
      continue
    acc = r["accuracy"]
    bands = ", ".join("%s %s" % (k[1:].replace("_", "-"), fmt(v)) for k, v in acc.items()
                      if k.startswith("d"))
    diag = r.get("diagnostics") or {}
    nc = [v for k, v in sorted(diag.items()) if k.endswith("no_cluster_share")]
    ss = [v for k, v in sorted(diag.items()) if k.endswith("self_attention_share")]
    routing = "%.2f / %.2f" % (nc[-1], ss[-1]) if nc and ss else "-"
    # Records without lookup_positions measured the positions one before the query and the item
    # (before 2026-11-26 the diagnostic ignored the model's shift of its targets): void.
    look = (r.get("lookup_diagnostics") or {}) if r.get("lookup_positions") == "model" else {}
    co = [v for k, v in sorted(look.items()) if k.endswith("item_cocluster")]
    rank = [v for k, v in sorted(look.items()) if k.endswith("item_rank")]
    items = "%.2f / %.2f" % (co[-1], rank[-1]) if co and rank else "-"
    lines.append("| %s | %d | %d | %.0f | %.2f | %s | %s | %s | %.2f | %s | %s |" % (
        label, seed, r["step"], r["seconds"], r["steps_per_second"], fmt(acc.get("near")),
        fmt(acc.get("far")), bands, r["eval_answer_loss"], routing, items))
  return "\n".join(lines)


# The runs of the summary plot (docs/images/lookup_study.png): routing that learns beside full,
# local and the paper's routing, all seeds.
SUMMARY = {"B full": "full attention", "G the same + routing_exclude_self":
           "routing_only_transformer_tiny1k", "B routing": "routing, paper layout and logits",
           "B local": "local"}


def plot(records, path, prefix, labels=None):
  """Near and far accuracy over training of the runs whose label starts with `prefix` (or is a
  key of the dict `labels`, shown as its value), every seed, one colour per label."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  curves = collections.OrderedDict()
  order = list(labels or ())
  for r in sorted(records, key=lambda r: order.index(r["label"]) if r["label"] in order else -1):
    if (r["label"] in labels) if labels else r["label"].startswith(prefix):
      curves.setdefault((r["label"], r["seed"]), []).append(r)
  fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
  colors = {}
  bands = []  # the layout's nearest and farthest distance bands (the same for every model)
  for (label, seed), rs in curves.items():
    color = colors.setdefault(label, "C%d" % (len(colors) % 10))
    keys = [k for k in rs[0]["accuracy"] if k.startswith("d")]
    bands = [keys[0], keys[-1]]
    for ax, group in zip(axes, bands):
      ax.plot([r["step"] for r in rs], [r["accuracy"].get(group) for r in rs], color=color,
              alpha=0.8, label=(labels or {}).get(label, label)
              if seed == min(s for l, s in curves if l == label) else None)
  for ax, group, where in zip(axes, bands, ("within", "beyond")):
    ax.set_title("look-ups %s tokens back (%s the local reach)" % (
        group[1:].replace("_", "-"), where))
    ax.set_xlabel("training step")
    ax.axhline(1.0 / 8, color="gray", ls=":", lw=1)
    ax.grid(alpha=0.3)
  axes[0].set_ylabel("accuracy (chance 1/8, dotted)")
  axes[1].legend(fontsize=7, loc="upper left")
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--phase", choices=sorted(PHASES), default="A")
  parser.add_argument("--recipe", default=RECIPE, help="phase B's hparams for every model")
  parser.add_argument("--only", default="", help="comma-separated labels")
  parser.add_argument("--out", default=RESULTS)
  parser.add_argument("--dry_run", action="store_true")
  parser.add_argument("--report", action="store_true")
  args = parser.parse_args(argv)
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  if args.report:
    records = load(args.out)
    for phase in PHASES:
      if any(r["label"].startswith(phase + " ") for r in records):
        print("\nPhase %s\n\n%s" % (phase, table(records, phase + " ")))
    for phase in PHASES:
      if any(r["label"].startswith(phase + " ") for r in records):
        path = os.path.join(os.path.dirname(args.out), "lookup_study_%s.png" % phase)
        plot(records, path, phase + " ")
        print("wrote", path)
    path = os.path.join(os.path.dirname(args.out), "lookup_study.png")
    plot(records, path, None, SUMMARY)
    print("wrote", path)
    return 0
  runs = PHASES[args.phase]() if args.phase in ("A", "O") else PHASES[args.phase](args.recipe)
  if args.only:
    runs = [r for r in runs if r.label in args.only.split(",")]
  todo = [r for r in runs if not finished(load(args.out), r)]
  print("lookup_study: %d of %d runs to do" % (len(todo), len(runs)), flush=True)
  started = time.time()
  for i, run in enumerate(todo):
    print("[%d/%d, %.0f min] %s, seed %d" % (i + 1, len(todo), (time.time() - started) / 60,
                                             run.label, run.seed), flush=True)
    if args.dry_run:
      continue
    kept = [r for r in load(args.out) if key(r) != (run.label, run.seed)]  # a cut-short run
    with open(args.out, "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in kept)
    if run_one(run, args.out):
      print("lookup_study: run failed: %s seed %d" % (run.label, run.seed), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
