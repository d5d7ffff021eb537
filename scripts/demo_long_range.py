"""`make demo-long-range`: full, routing and local attention on a one-hop long-range retrieval.

1. t2t-datagen: the retrieval problem (`long_range_retrieval_1k_mixed`, problems/retrieval.py:
   32 look-ups per 1,024-token sequence, each item [key, value] stored 2-64, 65-191 or 192-1000
   tokens before its query ?key; no download);
2. t2t-trainer: tiny full-attention (the ceiling), routing (`routing_only_transformer_tiny1k`:
   routing heads in both layers with the switches that let them learn here; `--models` adds the
   paper's layout) and local-only models (1,024 tokens, same size), same steps, evaluated a few
   times during training (a status line shows step, loss, speed, ETA);
3. predictions for a few eval sequences: the items each model retrieves for look-ups beyond the
   local heads' reach (191 tokens);
4. t2t-decoder (cached decoding, greedy): each model continues a few eval sequences cut at 3/4,
   and an empty prompt; generated `?k item` pairs are scored against the items stored in the
   prompt (free-generation recall);
5. a comparison table (loss, accuracy per distance band and near/far of the local reach,
   training speed, attention FLOPs and memory relative to full attention from the hparams) in
   demo_output/long_range/summary.{md,json};
6. what routing learns (`routing_transformer.tools.analysis` on the routing run: attention patterns,
   head focus, cluster occupancy, head JS divergence in <output>/analysis/), the training
   curves of all runs (`routing_transformer.tools.curves`, <output>/curves.png) and their eval
   accuracy per distance band over steps and wall time (<output>/accuracy.png).

    .venv/bin/python scripts/demo_long_range.py [--steps N] [--output demo_output/long_range]
"""
import argparse
import glob
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from t2t_runs import ROOT, eval_metrics, log, pictures, quiet_tensorflow, t2t, train, train_speed  # pylint: disable=g-import-not-at-top,wrong-import-position

quiet_tensorflow()  # this process predicts, reads event files and draws: no TF noise
PROBLEM = "long_range_retrieval_1k_mixed"
STEPS = 1500  # per model at the tiny sets' held rate (full ~0.8 far); docs/long_range_demo.md
# "routing": the routing model that learns far look-ups at this scale (routing heads in both
# layers, no local heads, two switches; research/notes/routing_learning.md); "routing_paper" (the
# paper's layout and logits, `--models full,routing,routing_paper,local`) learns none in 3,000
# steps.
MODELS = {"full": "full_transformer_tiny1k", "routing": "routing_only_transformer_tiny1k",
          "routing_paper": "routing_transformer_tiny1k", "local": "local_transformer_tiny1k"}
DEFAULT_MODELS = "full,routing,local"


def layout_and_encoder(problem_name=PROBLEM):
  from problems import retrieval  # pylint: disable=g-import-not-at-top
  layout = retrieval.LAYOUTS[problem_name]
  return layout, retrieval.RetrievalEncoder(layout)


def relative_cost(hparams_set):
  """(attention FLOPs, attention memory) of `hparams_set` relative to full attention."""
  import hparams  # pylint: disable=g-import-not-at-top,unused-import
  from routing_transformer.core import cost  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
  return cost.relative_to_full(registry.hparams(hparams_set))


def eval_sequences(num, layout):
  """`num` eval sequences and their answer distances [num, n] (-1 off answers)."""
  from problems import retrieval  # pylint: disable=g-import-not-at-top
  if isinstance(layout, retrieval.MixedLayout):
    return retrieval.generate_mixed_samples(retrieval.EVAL_SEED, num, layout, True)
  seqs = retrieval.generate_samples(retrieval.EVAL_SEED, num, layout)
  return seqs, retrieval.answer_distances(seqs, layout)


def local_reach(hparams_set="local_transformer_tiny1k"):
  import hparams  # pylint: disable=g-import-not-at-top,unused-import
  from routing_transformer.core import cost  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
  return cost.local_receptive_field(registry.hparams(hparams_set))


def far_predictions(run_dir, hparams_set, data_dir, num=3, per_sequence=8):
  """Greedy next-token predictions at the answers of look-ups beyond the local reach."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import t2t_usr_dir  # pylint: disable=g-import-not-at-top,unused-import
  from problems import retrieval  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import trainer_lib  # pylint: disable=g-import-not-at-top
  tf1 = tf.compat.v1
  tf.get_logger().setLevel("ERROR")
  del retrieval
  layout, encoder = layout_and_encoder()
  hparams = trainer_lib.create_hparams(hparams_set, data_dir=data_dir, problem_name=PROBLEM)
  eval_seqs, dists = eval_sequences(num, layout)
  reach = local_reach()
  with tf.Graph().as_default():
    targets = tf1.placeholder(tf.int32, [num, layout.length, 1, 1])
    model = registry.model("routing_transformer")(hparams, tf.estimator.ModeKeys.EVAL)
    logits, _ = model({"targets": targets})
    with tf1.Session() as sess:
      tf1.train.Saver().restore(sess, tf.train.latest_checkpoint(run_dir))
      out = sess.run(logits, {targets: np.asarray(eval_seqs)[:, :, None, None]})
  predicted = out[:, :, 0, 0, :].argmax(-1)
  rows = []
  for seq, pred, dist in zip(eval_seqs, predicted, dists):
    far = [p for p in range(len(seq)) if dist[p] > reach][:per_sequence]
    pairs = ["%s->%s%s" % (encoder.token_name(seq[p - 1]), encoder.token_name(pred[p]),
                           "" if pred[p] == seq[p] else "(want %s)" % encoder.token_name(seq[p]))
             for p in far]
    rows.append(" ".join(pairs))
  return rows


def decode_samples(run_dir, hparams_set, data_dir, output, num=3, extra_length=32):
  """t2t-decoder on prompts cut before the query section (mixed layouts: at 3/4); returns
  (rows, recalled, pairs)."""
  layout, encoder = layout_and_encoder()
  sequences, _ = eval_sequences(num, layout)
  cut = getattr(layout, "query_start", 3 * layout.length // 4)
  prompts = [encoder.decode(seq[:cut]) for seq in sequences] + [""]
  prompts_file = os.path.join(output, "prompts.txt")
  with open(prompts_file, "w") as f:
    f.write("\n".join(prompts) + "\n")
  decodes = run_dir + ".decodes.tsv"
  t2t("t2t-decoder", ["--problem=" + PROBLEM, "--model=routing_transformer",
                      "--hparams_set=" + hparams_set, "--data_dir=" + data_dir,
                      "--output_dir=" + run_dir, "--decode_from_file=" + prompts_file,
                      "--decode_to_file=" + decodes,
                      "--decode_hparams=beam_size=1,batch_size=%d,extra_length=%d" % (
                          num + 1, extra_length)], run_dir + ".decode.log")
  rows, recalled, pairs = [], 0, 0
  with open(decodes) as f:
    lines = f.read().splitlines()
  for seq, line in zip(list(sequences) + [None], lines):
    words = line.split("\t")[1].split()
    rows.append(" ".join(words))
    if seq is None:
      continue
    stored = {encoder.token_name(i).split("v")[0][1:]: encoder.token_name(i)
              for i in seq[:cut] if layout.item_start <= i < layout.filler_start}  # key -> item
    for a, b in zip(words, words[1:]):
      if a.startswith("?") and a[1:] in stored and b.startswith("k") and "v" in b:
        pairs += 1
        recalled += int(stored[a[1:]] == b)
  return rows, recalled, pairs


def accuracy_history(run_dir, bands):
  """{band: [(step, wall seconds since the run's first training event, value)]} of the eval
  metrics `bands` (e.g. "accuracy_d192_1000") of a run, one point per step
  (`curves.last_per_step`)."""
  from routing_transformer.tools import curves  # pylint: disable=g-import-not-at-top
  train = curves.read_scalars(glob.glob(os.path.join(run_dir, "events.out.tfevents.*")), None)
  evals = glob.glob(os.path.join(run_dir, "eval*", "events.out.tfevents.*"))
  history = {band: curves.last_per_step(curves.read_scalars(
      evals, "metrics-%s/targets/%s" % (PROBLEM, band))) for band in bands}
  start = min((w for _, w, _ in train), default=0.0)
  return {band: [(s, w - start, v) for s, w, v in points] for band, points in history.items()}


def accuracy_plot(output, names, bands, chance):
  """<output>/accuracy.png: each run's eval accuracy per distance band against step and wall
  time (far band solid, nearer bands dashed/dotted); returns its path."""
  from routing_transformer.tools import curves  # pylint: disable=g-import-not-at-top
  plt = curves.pyplot()
  fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
  styles = ["-", "--", ":"]
  for i, name in enumerate(names):
    color = "C%d" % i
    history = accuracy_history(os.path.join(output, name), bands)
    for band, style in zip(reversed(bands), styles):
      points = history[band]
      if not points:
        continue
      label = "%s, %s back" % (name, band[len("accuracy_d"):].replace("_", "-"))
      axes[0].plot([p[0] for p in points], [p[2] for p in points], style, color=color,
                   marker="o")
      axes[1].plot([p[1] / 60 for p in points], [p[2] for p in points], style, color=color,
                   marker="o", label=label)
  for ax, xlabel in zip(axes, ("step", "wall time (minutes)")):
    ax.axhline(chance, color="grey", lw=0.8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("look-up accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
  axes[1].legend(fontsize=7, loc="upper right")  # the slow run leaves that corner empty
  axes[0].set_title("eval accuracy by distance band (grey: chance)")
  axes[1].set_title("the same against wall time")
  path = os.path.join(output, "accuracy.png")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--steps", type=int, default=STEPS, help="training steps per model")
  parser.add_argument("--eval_steps", type=int, default=25)
  parser.add_argument("--evaluations", type=int, default=5,
                      help="evaluations per run, evenly spaced (T2T: at most one per 100 steps)")
  parser.add_argument("--output", default=os.path.join(ROOT, "demo_output", "long_range"))
  parser.add_argument("--models", default=DEFAULT_MODELS,
                      help="comma-separated, of: %s" % ", ".join(MODELS))
  args = parser.parse_args()
  names = args.models.split(",")
  unknown = [n for n in names if n not in MODELS]
  if unknown or "routing" not in names:
    parser.error("--models: %s; choose from %s, with routing among them (it is analysed)" % (
        "unknown %s" % ", ".join(unknown) if unknown else "routing missing", ", ".join(MODELS)))
  data_dir = os.path.join(args.output, "data")
  os.makedirs(data_dir, exist_ok=True)
  started = time.time()

  if glob.glob(os.path.join(data_dir, PROBLEM + "-dev-*")):
    log("data already in %s" % data_dir)
  else:
    log("t2t-datagen --problem=%s (20,000 train + 500 eval sequences of %d tokens)"
        % (PROBLEM, layout_and_encoder()[0].length))
    t2t("t2t-datagen", ["--problem=" + PROBLEM, "--data_dir=" + data_dir,
                        "--tmp_dir=" + os.path.join(args.output, "tmp")],
        os.path.join(args.output, "datagen.log"))

  results = {}
  for name in names:
    hparams_set = MODELS[name]
    run_dir = os.path.join(args.output, name)
    # T2T saves a checkpoint, so evaluates, at most every 100 steps (and at the end)
    eval_every = max(args.steps // max(args.evaluations, 1), 100)
    log("t2t-trainer --model=routing_transformer --hparams_set=%s: %d steps, eval every %d "
        "steps and at the end (log: %s.log)" % (hparams_set, args.steps, eval_every, run_dir))
    seconds = train(run_dir, PROBLEM, hparams_set, data_dir, args.steps, args.eval_steps,
                    eval_every=eval_every)
    metrics = eval_metrics(run_dir)
    flops, memory = relative_cost(hparams_set)
    metrics.update(train_seconds=seconds, steps_per_sec=train_speed(run_dir),
                   hparams_set=hparams_set, attention_flops=flops, attention_memory=memory)
    metrics["samples"] = far_predictions(run_dir, hparams_set, data_dir)
    log("t2t-decoder --hparams_set=%s: continuing %d eval prompts and 1 empty prompt" % (
        hparams_set, 3))
    rows, recalled, pairs = decode_samples(run_dir, hparams_set, data_dir, args.output)
    metrics.update(generated=rows, generated_recalled=recalled, generated_pairs=pairs)
    results[name] = metrics
    log("%s: eval loss %.4f, far accuracy %.3f, near accuracy %.3f" % (
        name, metrics.get("loss", float("nan")), metrics.get("far_accuracy", float("nan")),
        metrics.get("near_accuracy", float("nan"))))

  layout, _ = layout_and_encoder()
  bands = ["accuracy_d%d_%d" % tuple(b) for b in getattr(layout, "bands", ())]
  table = ["| model | hparams set | steps | eval loss | far accuracy | near accuracy | %s"
           "generated ?k item pairs recalled | steps/s | wall s | attention FLOPs / full | "
           "attention memory / full |" % "".join("%s | " % b[len("accuracy_"):] for b in bands),
           "|---|---|---|---|---|---|---|---|---|---|---|" + "---|" * len(bands)]
  nan = float("nan")
  for name, m in results.items():
    table.append("| %s | %s | %d | %.4f | %.3f | %.3f | %s%d / %d | %.1f | %.0f | %.3f | %.3f |" % (
        name, m["hparams_set"], m["step"], m.get("loss", nan), m.get("far_accuracy", nan),
        m.get("near_accuracy", nan), "".join("%.3f | " % m.get(b, nan) for b in bands),
        m["generated_recalled"], m["generated_pairs"], m["steps_per_sec"],
        m["train_seconds"], m["attention_flops"], m["attention_memory"]))
  summary = "\n".join(table) + (
      "\n\nFar: look-ups more than the local heads' reach (%d tokens) back; near: the rest; "
      "d<lo>_<hi>: look-ups lo..hi tokens back. Chance is %.3f (1 / values per key). Attention "
      "cost from the hparams (routing_transformer.core.cost).\n" % (
          local_reach(), 1.0 / layout.num_values))
  samples = "\n".join("%s sample %d: %s" % (name, i, row) for name, m in results.items()
                      for i, row in enumerate(m["samples"]))
  generated = "\n".join("%s %s: %s" % (name, "prompt %d" % i if i < len(m["generated"]) - 1
                                        else "no prompt", row)
                        for name, m in results.items() for i, row in enumerate(m["generated"]))
  with open(os.path.join(args.output, "summary.md"), "w") as f:
    f.write(summary + "\nRetrieved items (query->predicted):\n" + samples + "\n" +
            "\nGenerated by t2t-decoder after the items + filler (greedy, 32 tokens):\n" +
            generated + "\n")
  with open(os.path.join(args.output, "summary.json"), "w") as f:
    json.dump(results, f, indent=1)
  print("\n" + summary)
  print("Retrieved items at the far positions (query->predicted item):\n" + samples)
  print("\nGenerated by t2t-decoder after the items + filler (greedy, 32 tokens; "
        "%s):\n" % os.path.join(args.output, "<model>.decodes.tsv") + generated)
  pictures(args.output, PROBLEM, data_dir, names,
           "Head focus and JS divergence of the routing model")
  log("accuracy curves: %s" % accuracy_plot(args.output, names, bands, 1.0 / layout.num_values))
  log("done in %.0f s; outputs under %s" % (time.time() - started, args.output))


if __name__ == "__main__":
  main()
