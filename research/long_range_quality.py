"""What makes routing heads learn: equal-step runs of routing variants against local attention.

    python research/long_range_quality.py --task long_range [--problems synthetic_long_range,...]
        [--configs local,paper,exclude_self,...] [--seeds 1,2,3] [--steps 2500] [--eval_every 500]
    python research/long_range_quality.py --task books --books_data DIR [...]

Every run is stock t2t-trainer on the same data for the same steps, evaluated every `eval_every`
steps; the routing variants differ from `paper` only in the hparams of CONFIGS (each an
extension switch, off in every paper hparams set), and `local` replaces the routing heads by
local heads (same size). Tasks:
  long_range  synthetic_long_range layouts (problems.synthetic): far accuracy (chance 1/32) at
              every evaluation; sets routing_transformer_tiny / local_transformer_tiny.
  books       pg19_length2k (make demo's Shakespeare books, already generated in --books_data):
              validation loss at every evaluation, then test subword and word-level perplexity
              (routing_transformer.tools.evaluate); sets pg19_local_cluster_tiny2k / pg19_local_tiny2k.
Runs are resumable (a finished run is read back, not repeated). Writes <output>/<task>.json
(every run), <task>.md (mean and spread over seeds) and <task>.png (curves, mean over seeds).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "benchmarks"))  # the suite's helpers
import common  # pylint: disable=g-import-not-at-top,wrong-import-position

sys.path.insert(0, os.path.join(common.ROOT, "scripts"))
import t2t_runs  # pylint: disable=g-import-not-at-top,wrong-import-position

# Every switch is spelled out in every config, so a config means the same whatever the defaults
# of the tiny sets are.
PAPER = dict(routing_exclude_self=False, routing_logit_scale="none")
CONFIGS = {
    "local": None,  # the local-only set of the task
    "paper": {},
    "exclude_self": dict(routing_exclude_self=True),
    "scale_rsqrt": dict(routing_logit_scale="rsqrt_depth"),
    "scale_learned": dict(routing_logit_scale="learned"),
    "exclude_self+scale_rsqrt": dict(routing_exclude_self=True, routing_logit_scale="rsqrt_depth"),
    "exclude_self+scale_learned": dict(routing_exclude_self=True, routing_logit_scale="learned"),
    "all_layers": dict(sparsity_skip_first=0),
    "exclude_self+all_layers": dict(routing_exclude_self=True, sparsity_skip_first=0),
    "beta_1e-3": dict(beta=1e-3),
    "causal_window": dict(routing_mode="causal_window"),
    "exclude_self+causal_window": dict(routing_exclude_self=True, routing_mode="causal_window"),
}
TASKS = {
    "long_range": dict(routing="routing_transformer_tiny", local="local_transformer_tiny",
                       problems=["synthetic_long_range"], metric="far_accuracy", better=max,
                       steps=2500, eval_steps=25),
    "books": dict(routing="pg19_local_cluster_tiny2k", local="pg19_local_tiny2k",
                  problems=["pg19_length2k"], metric="word_perplexity", better=min,
                  steps=1000, eval_steps=30),
}


def length_overrides(problem_name):
  """Hparams a tiny 512-token synthetic set needs for a longer layout (4 sequences a batch,
  clusters x window = length)."""
  from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
  layout = getattr(registry.problem(problem_name), "layout", None)
  if layout is None or layout.length == 512:
    return {}
  return dict(max_length=layout.length, max_target_length=layout.length,
              batch_size=4 * layout.length, sparsity_cluster_size=layout.length // 64)


def hparams_string(values):
  return ",".join("%s=%s" % (k, v) for k, v in sorted(values.items()))


def data_dir_for(task, problem, args):
  if task == "books":
    return args.books_data
  path = os.path.join(args.output, "data", problem)
  if not os.path.exists(os.path.join(path, problem + "-dev-00000-of-00001")):
    os.makedirs(path, exist_ok=True)
    t2t_runs.log("t2t-datagen --problem=" + problem, "quality")
    t2t_runs.t2t("t2t-datagen", ["--problem=" + problem, "--data_dir=" + path,
                                 "--tmp_dir=" + os.path.join(args.output, "tmp")],
                 path + ".datagen.log")
  return path


def run_one(task, problem, config, seed, args):
  """Trains (unless done) and returns the run's record."""
  spec = TASKS[task]
  name = "%s/%s/%s/seed%d" % (task, problem, config, seed)
  run_dir = os.path.join(args.output, "runs", name)
  record_path = run_dir + ".json"
  if os.path.exists(record_path):
    with open(record_path) as f:
      return json.load(f)
  data_dir = data_dir_for(task, problem, args)
  overrides = length_overrides(problem) if task == "long_range" else {}
  if config == "local":
    hparams_set = spec["local"]
  else:
    hparams_set = spec["routing"]
    overrides.update(PAPER, **CONFIGS[config])
  os.makedirs(os.path.dirname(run_dir), exist_ok=True)
  t2t_runs.log("%s: %d steps, %s %s" % (name, args.steps, hparams_set,
                                        hparams_string(overrides)), "quality")
  seconds = t2t_runs.train(run_dir, problem, hparams_set, data_dir, args.steps,
                           args.eval_steps, hparams_string(overrides), args.eval_every, seed)
  history = t2t_runs.eval_history(run_dir)
  record = {"task": task, "problem": problem, "config": config, "seed": seed,
            "hparams_set": hparams_set, "hparams": hparams_string(overrides),
            "steps": max(history), "wall_seconds": seconds,
            "steps_per_sec": t2t_runs.train_speed(run_dir),
            "curve": {str(step): values for step, values in history.items()}}
  record.update(history[max(history)])
  if task == "books":  # test perplexities of the final checkpoint
    out = run_dir + ".test.json"
    t2t_runs.python_module("routing_transformer.tools.evaluate", [
        "--problem=" + problem, "--data_dir=" + data_dir, "--hparams_set=" + hparams_set,
        "--hparams=" + hparams_string(overrides), "--checkpoint=" + run_dir, "--split=test",
        "--batch_size=4", "--output_json=" + out], run_dir + ".evaluate.log")
    with open(out) as f:
      test = json.load(f)
    record.update(test_token_perplexity=test["token_perplexity"],
                  word_perplexity=test["word_perplexity"], bits_per_word=test["bits_per_word"])
  with open(record_path, "w") as f:
    json.dump(record, f, indent=1)
  return record


def summarise(records, metric):
  """{(problem, config): (mean, sd, n, values)} of `metric` over seeds."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  groups = {}
  for r in records:
    groups.setdefault((r["problem"], r["config"]), []).append(r[metric])
  return {key: (float(np.mean(v)), float(np.std(v, ddof=1)) if len(v) > 1 else 0.0, len(v), v)
          for key, v in groups.items()}


def markdown(task, records, configs):
  spec = TASKS[task]
  columns = [spec["metric"]] + (["loss", "test_token_perplexity"] if task == "books" else
                                ["near_accuracy", "loss"])
  stats = {c: summarise(records, c) for c in columns}
  lines = ["| problem | config | seeds | steps | %s |" % " | ".join(columns),
           "|---|---|---|---|" + "---|" * len(columns)]
  for problem in dict.fromkeys(r["problem"] for r in records):
    for config in configs:
      key = (problem, config)
      if key not in stats[columns[0]]:
        continue
      steps = max(r["steps"] for r in records if (r["problem"], r["config"]) == key)
      cells = []
      for c in columns:
        mean, sd, n, values = stats[c][key]
        cells.append("%.4g ± %.2g (%s)" % (mean, sd, ", ".join("%.4g" % v for v in values))
                     if n > 1 else "%.4g" % mean)
      lines.append("| %s | %s | %d | %d | %s |" % (problem, config, stats[columns[0]][key][2],
                                                   steps, " | ".join(cells)))
  return "\n".join(lines) + "\n\nMean ± sample standard deviation over seeds (values).\n"


def plot(task, records, configs, path):
  """One panel per problem: the curve metric (mean over seeds) against steps, per config."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from routing_transformer.tools import curves  # pylint: disable=g-import-not-at-top
  plt = curves.pyplot()
  tag = "far_accuracy" if task == "long_range" else "loss"
  problems = list(dict.fromkeys(r["problem"] for r in records))
  fig, axes = plt.subplots(1, len(problems), figsize=(6 * len(problems), 4.2), squeeze=False)
  for ax, problem in zip(axes[0], problems):
    for i, config in enumerate(configs):
      runs = [r for r in records if r["problem"] == problem and r["config"] == config]
      if not runs:
        continue
      steps = sorted(set.intersection(*[set(int(s) for s in r["curve"]) for r in runs]))
      values = np.array([[r["curve"][str(s)][tag] for s in steps] for r in runs])
      ax.plot(steps, values.mean(0), "-o", color="C%d" % (i % 10), markersize=3,
              label="%s (%d seed%s)" % (config, len(runs), "s" if len(runs) > 1 else ""))
      if len(runs) > 1:
        ax.fill_between(steps, values.min(0), values.max(0), color="C%d" % (i % 10), alpha=0.12)
    if task == "long_range":
      ax.axhline(1.0 / 32, color="k", linestyle="--", linewidth=1, label="chance 1/32")
    ax.set_title(problem)
    ax.set_xlabel("training step")
    ax.set_ylabel("eval far accuracy" if task == "long_range" else "validation loss (nats)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--task", choices=sorted(TASKS), default="long_range")
  parser.add_argument("--problems", default=None, help="comma-separated (default per task)")
  parser.add_argument("--configs", default="local,paper,exclude_self",
                      help="comma-separated names of CONFIGS: %s" % ", ".join(CONFIGS))
  parser.add_argument("--seeds", default="1")
  parser.add_argument("--steps", type=int, default=None)
  parser.add_argument("--eval_every", type=int, default=500)
  parser.add_argument("--eval_steps", type=int, default=None)
  parser.add_argument("--books_data", default=os.path.join(common.ROOT, "demo_output", "data"),
                      help="data_dir of pg19_length2k (make demo writes it)")
  parser.add_argument("--output", default=os.path.join(common.ROOT, "research", "results",
                                                       "quality"))
  args = parser.parse_args(argv)
  spec = TASKS[args.task]
  args.steps = args.steps or spec["steps"]
  args.eval_steps = args.eval_steps or spec["eval_steps"]
  configs = args.configs.split(",")
  unknown = [c for c in configs if c not in CONFIGS]
  if unknown:
    sys.exit("unknown config(s) %s; choose from %s" % (", ".join(unknown), ", ".join(CONFIGS)))
  problems = args.problems.split(",") if args.problems else spec["problems"]
  info = common.start("long_range_quality", task=args.task, steps=args.steps)
  import t2t_usr_dir  # pylint: disable=g-import-not-at-top,unused-import
  records = [run_one(args.task, p, c, int(s), args) for p in problems for c in configs
             for s in args.seeds.split(",")]
  for r in records:
    common.emit(dict({k: v for k, v in r.items() if k != "curve"}, record="run"))
  table = markdown(args.task, records, configs)
  print("\n" + table)
  os.makedirs(args.output, exist_ok=True)
  with open(os.path.join(args.output, args.task + ".md"), "w") as f:
    f.write(table)
  plot(args.task, records, configs, os.path.join(args.output, args.task + ".png"))
  common.save(args.output, args.task + ".json", {"machine": info, "runs": records})


if __name__ == "__main__":
  main()
