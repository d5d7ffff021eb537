"""Training curves of t2t-trainer runs: loss vs step and vs wall time (log scale), in one PNG.

    python -m routing_transformer.curves --out curves.png routing=RUN_A local=RUN_B [--tag loss]

Each RUN is a t2t-trainer --output_dir: the training scalars come from its own event files, the
evaluation scalars (drawn as markers) from its eval*/ subdirectories. Wall time is counted from
the first training event of each run.
"""
import argparse
import glob
import os

TAG = "loss"


def pyplot():
  """matplotlib's pyplot on the file-only Agg backend (imported on first use, not with us)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def read_scalars(paths, tag):
  """(step, wall_time, value) of every `tag` event in the event files, sorted by step."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  points = []
  for path in paths:
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.tag == tag:
          points.append((int(event.step), float(event.wall_time), float(value.simple_value)))
  return sorted(points)


def run_curves(run_dir, tag=TAG):
  """{"train": [...], "eval": [...]} scalar points of one t2t-trainer run."""
  return {
      "train": read_scalars(glob.glob(os.path.join(run_dir, "events.out.tfevents.*")), tag),
      "eval": read_scalars(glob.glob(os.path.join(run_dir, "eval*", "events.out.tfevents.*")),
                           tag),
  }


def plot_runs(runs, path, tag=TAG):
  """Plots `tag` of every run against step (left) and wall minutes (right); returns the data.

  Args:
    runs: list of (label, run_dir).
    path: output PNG.
  Returns:
    {label: run_curves(run_dir)}.
  """
  plt = pyplot()
  data = {}
  fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4))
  for i, (label, run_dir) in enumerate(runs):
    curves = data[label] = run_curves(run_dir, tag)
    if not curves["train"]:
      raise SystemExit("curves: no '%s' scalars in the event files of %s; is it a t2t-trainer "
                       "--output_dir?" % (tag, run_dir))
    colour = "C%d" % i
    start = curves["train"][0][1]
    steps, times, values = zip(*curves["train"])
    by_step.plot(steps, values, color=colour, label=label + " train")
    by_time.plot([(t - start) / 60 for t in times], values, color=colour, label=label + " train")
    if curves["eval"]:
      steps, times, values = zip(*curves["eval"])
      by_step.plot(steps, values, "o", color=colour, label=label + " eval")
      by_time.plot([(t - start) / 60 for t in times], values, "o", color=colour,
                   label=label + " eval")
  by_step.set_xlabel("step")
  by_time.set_xlabel("wall time (minutes)")
  for ax in (by_step, by_time):
    ax.set_yscale("log")  # the first steps' drop would flatten everything after it
    ax.set_ylabel(tag + " (log scale)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
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
  for label, curves in data.items():
    last = curves["train"][-1]
    print("%s: %d train points, last step %d %s %.4f; %d eval points" % (
        label, len(curves["train"]), last[0], args.tag, last[2], len(curves["eval"])))
  print("curves: wrote %s" % args.out)


if __name__ == "__main__":
  main()
