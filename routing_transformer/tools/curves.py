"""Training curves of t2t-trainer runs: loss vs step and vs wall time (log scale), in one PNG.

    python -m routing_transformer.tools.curves --out curves.png routing=RUN_A local=RUN_B [--tag loss]

Each RUN is a t2t-trainer --output_dir: the training scalars come from its own event files, the
evaluation scalars (markers joined by a dashed line) from its eval*/ subdirectories. Training
losses are single batches: they are drawn faint, with their exponential moving average (over
SPAN_FRACTION of the run's steps) on top. Wall time is counted from the first training event of
each run. `plot_runs` also takes denser training points (e.g. the `loss = ..., step = ...` lines
t2t-trainer logs every --log_step_count_steps, which `scripts/demo.py` passes).
"""
import argparse
import glob
import math
import os

TAG = "loss"
SPAN_FRACTION = 1.0 / 20  # EMA time constant, as a share of the run's last step


def pyplot():
  """matplotlib's pyplot on the file-only Agg backend (imported on first use, not with us)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def PlainLogFormatter(ticker, **kwargs):  # pylint: disable=invalid-name
  """matplotlib's LogFormatter (which picks the ticks to label) writing 7.5 and 0.4 rather than
  7.5x10^0 and 4e-01."""

  class Plain(ticker.LogFormatter):

    def _num_to_string(self, x, vmin, vmax):
      return "%g" % x
  return Plain(**kwargs)


def read_scalars(paths, tag):
  """(step, wall_time, value) of every `tag` event in the event files (every scalar event when
  tag is None), sorted by step."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  points = []
  for path in paths:
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if tag is None or value.tag == tag:
          points.append((int(event.step), float(event.wall_time), float(value.simple_value)))
  return sorted(points)


def last_per_step(points):
  """One point per step (the last written: Estimator may evaluate the final step twice)."""
  return sorted({p[0]: p for p in sorted(points, key=lambda p: p[1])}.values())


def with_wall_times(steps_values, timed):
  """[(step, value)] -> [(step, wall_time, value)], wall times interpolated between the
  (step, wall_time, _) points of `timed` (the run's training events)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  known = last_per_step(timed)
  times = np.interp([s for s, _ in steps_values], [p[0] for p in known], [p[1] for p in known])
  return [(s, float(t), v) for (s, v), t in zip(steps_values, times)]


def run_curves(run_dir, tag=TAG, train_points=None):
  """{"train": [...], "eval": [...]} (step, wall_time, value) points of one t2t-trainer run;
  train_points [(step, value)], when given, replace the training events of `tag`."""
  train_files = glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))
  train = read_scalars(train_files, tag)
  if train_points and train:
    train = with_wall_times(train_points, read_scalars(train_files, None))
  return {
      "train": train,
      "eval": last_per_step(read_scalars(
          glob.glob(os.path.join(run_dir, "eval*", "events.out.tfevents.*")), tag)),
  }


def ema(steps, values, span):
  """Exponential moving average over uneven steps: s_0 = v_0, s_i = a s_(i-1) + (1 - a) v_i with
  a = exp(-(step_i - step_(i-1)) / span)."""
  smoothed = []
  for i, value in enumerate(values):
    if i == 0 or not math.isfinite(smoothed[-1]):
      smoothed.append(value)
    else:
      a = math.exp(-(steps[i] - steps[i - 1]) / span)
      smoothed.append(a * smoothed[-1] + (1 - a) * value)
  return smoothed


def final_numbers(data):
  """{label: {"step", "train_ema", "eval", "eval_step", "evals"}} of plot_runs' data (NaN
  where a run has no evaluation)."""
  table = {}
  for label, curves in data.items():
    last_eval = curves["eval"][-1] if curves["eval"] else (None, None, float("nan"))
    table[label] = {"step": curves["train"][-1][0], "train_ema": curves["smoothed"][-1],
                    "eval": last_eval[2], "eval_step": last_eval[0],
                    "evals": len(curves["eval"])}
  return table


def final_markdown(table, tag=TAG):
  lines = ["| run | last step | train %s (EMA) | eval %s (at step) | evaluations |" % (tag, tag),
           "|---|---|---|---|---|"]
  for label, row in table.items():
    lines.append("| %s | %d | %.4f | %.4f (%s) | %d |" % (
        label, row["step"], row["train_ema"], row["eval"], row["eval_step"], row["evals"]))
  return "\n".join(lines)


def plot_runs(runs, path, tag=TAG, train_points=None):
  """Plots `tag` of every run against step (left) and wall minutes (right); returns the data.

  Args:
    runs: list of (label, run_dir).
    path: output PNG.
    train_points: optional {label: [(step, value)]} denser training points (from the log).
  Returns:
    {label: run_curves(run_dir) plus "smoothed": the EMA of the training values}.
  """
  plt = pyplot()
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top
  data = {}
  fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4))
  for i, (label, run_dir) in enumerate(runs):
    curves = data[label] = run_curves(run_dir, tag, (train_points or {}).get(label))
    if not curves["train"]:
      raise SystemExit("curves: no '%s' scalars in the event files of %s; is it a t2t-trainer "
                       "--output_dir?" % (tag, run_dir))
    colour = "C%d" % i
    start = curves["train"][0][1]
    steps, times, values = zip(*curves["train"])
    curves["smoothed"] = ema(steps, values, max(steps[-1] * SPAN_FRACTION, 1.0))
    minutes = [(t - start) / 60 for t in times]
    for ax, x in ((by_step, steps), (by_time, minutes)):
      ax.plot(x, values, color=colour, alpha=0.25, linewidth=0.8)
      ax.plot(x, curves["smoothed"], color=colour, linewidth=2, label=label + " train (EMA)")
    if curves["eval"]:
      steps, times, values = zip(*curves["eval"])
      minutes = [(t - start) / 60 for t in times]
      for ax, x in ((by_step, steps), (by_time, minutes)):
        ax.plot(x, values, "o--", color=colour, markeredgecolor="k", linewidth=1,
                label=label + " eval")
  by_step.set_xlabel("step")
  by_time.set_xlabel("wall time (minutes)")
  for ax in (by_step, by_time):
    ax.set_yscale("log")  # the first steps' drop would flatten everything after it
    ax.yaxis.set_major_formatter(PlainLogFormatter(ticker, labelOnlyBase=False))
    ax.yaxis.set_minor_formatter(PlainLogFormatter(ticker, labelOnlyBase=False,
                                                   minor_thresholds=(2, 0.5)))
    ax.set_ylabel(tag + " (log scale)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
  by_step.set_title("training (faint: single batches) and evaluation %s" % tag, fontsize=10)
  by_time.set_title("the same against wall time", fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return data


def parse_run(text):
  """"label=dir" or "dir" (label = the directory name) -> (label, dir)."""
  if "=" in text:
    label, run_dir = text.split("=", 1)
  else:
    label, run_dir = os.path.basename(os.path.normpath(text)), text
  if not os.path.isdir(run_dir):
    raise SystemExit("curves: %s is not a directory; pass t2t-trainer output dirs as "
                     "label=DIR." % run_dir)
  return label, run_dir


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("runs", nargs="+", help="label=RUN_DIR (t2t-trainer --output_dir)")
  parser.add_argument("--out", default="curves.png")
  parser.add_argument("--tag", default=TAG, help="scalar tag to plot (default: loss)")
  args = parser.parse_args(argv)
  data = plot_runs([parse_run(r) for r in args.runs], args.out, args.tag)
  print(final_markdown(final_numbers(data), args.tag))
  print("curves: wrote %s" % args.out)


if __name__ == "__main__":
  main()
