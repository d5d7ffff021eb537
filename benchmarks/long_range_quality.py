"""Long-range quality: local-only vs topk routing vs causal_window routing on synthetic_long_range.

    python benchmarks/long_range_quality.py [--steps 8000] [--output benchmarks/results/quality]

Trains `local_transformer_tiny`, `routing_transformer_tiny` (routing_mode="topk", the paper) and
`routing_transformer_tiny_causal` (routing_mode="causal_window") through stock t2t-trainer for
the same number of steps on the same data (generated locally, no download), evaluates each on
the same eval set, and reports eval loss, far/near accuracy (far = values whose key-value pair is
448+ positions back; chance 1/32), wall time and training tokens/s. One JSON line per model, a
markdown table, and <output>/quality.{json,md}.
"""
import argparse
import glob
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # pylint: disable=g-import-not-at-top,wrong-import-position

sys.path.insert(0, os.path.join(common.ROOT, "scripts"))
import t2t_runs  # pylint: disable=g-import-not-at-top,wrong-import-position

PROBLEM = "synthetic_long_range"

MODELS = [("local", "local_transformer_tiny"), ("topk routing", "routing_transformer_tiny"),
          ("causal_window routing", "routing_transformer_tiny_causal")]
TOKENS_PER_STEP = 2048  # batch_size of the tiny sets: 4 sequences of 512


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--steps", type=int, default=8000)
  parser.add_argument("--eval_steps", type=int, default=25)
  parser.add_argument("--output", default=os.path.join(common.ROOT, "benchmarks", "results",
                                                       "quality"))
  parser.add_argument("--data_dir", default=None, help="reuse synthetic_long_range data")
  args = parser.parse_args(argv)
  os.makedirs(args.output, exist_ok=True)
  data_dir = args.data_dir or os.path.join(args.output, "data")
  os.makedirs(data_dir, exist_ok=True)
  if not glob.glob(os.path.join(data_dir, PROBLEM + "-dev-*")):
    t2t_runs.log("t2t-datagen --problem=%s" % PROBLEM)
    t2t_runs.t2t("t2t-datagen", ["--problem=" + PROBLEM, "--data_dir=" + data_dir,
                             "--tmp_dir=" + os.path.join(args.output, "tmp")],
             os.path.join(args.output, "datagen.log"))
  results = []
  for name, hparams_set in MODELS:
    run_dir = os.path.join(args.output, hparams_set)
    t2t_runs.log("%s (%s): %d steps (log %s.log)" % (name, hparams_set, args.steps, run_dir))
    seconds = t2t_runs.train(run_dir, PROBLEM, hparams_set, data_dir, args.steps, args.eval_steps)
    metrics = t2t_runs.eval_metrics(run_dir)
    steps_per_sec = t2t_runs.train_speed(run_dir)
    record = {"record": "point", "model": name, "hparams_set": hparams_set,
              "steps": metrics.get("step"), "eval_loss": metrics.get("loss"),
              "far_accuracy": metrics.get("far_accuracy"),
              "near_accuracy": metrics.get("near_accuracy"),
              "wall_seconds": seconds, "steps_per_sec": steps_per_sec,
              "train_tokens_per_sec": steps_per_sec * TOKENS_PER_STEP}
    common.emit(record)
    results.append(record)
  lines = ["| model | hparams set | steps | eval loss | far accuracy | near accuracy | "
           "train tokens/s | wall s |", "|---|---|---|---|---|---|---|---|"]
  for r in results:
    lines.append("| %s | `%s` | %d | %.4f | %.3f | %.3f | %.0f | %.0f |" % (
        r["model"], r["hparams_set"], r["steps"], r["eval_loss"], r["far_accuracy"],
        r["near_accuracy"], r["train_tokens_per_sec"], r["wall_seconds"]))
  table = "\n".join(lines) + "\n\nChance on the far positions: 1/32 = 0.031.\n"
  print("\n" + table)
  with open(os.path.join(args.output, "quality.md"), "w") as f:
    f.write(table)
  common.save(args.output, "quality.json", {"machine": common.machine(), "results": results})


if __name__ == "__main__":
  main()
