"""`make demo-long-range`: routing vs local attention on the synthetic long-range recall task.

1. t2t-datagen: the synthetic long-range recall problem (`synthetic_long_range`, no download);
2. t2t-trainer: a tiny routing model and a tiny local-only model, same steps, evaluated a few times
   during training (a status line shows step, loss, speed, ETA);
3. predictions for a few eval sequences: the values each model recalls at the far positions;
4. t2t-decoder (cached decoding, greedy): each model continues the first 480 tokens of a few eval
   sequences (pairs + filler) and an empty prompt; generated `k v` pairs are scored against the
   pairs in the prompt (free-generation recall);
5. a comparison table (loss, far/near accuracy, training speed) in demo_output/long_range/summary.{md,json};
6. what routing learns (`routing_transformer.analysis` on the routing run: attention patterns,
   head focus, cluster occupancy, head JS divergence in <output>/analysis/) and the training
   curves of both runs (`routing_transformer.curves`, <output>/curves.png).

    .venv/bin/python scripts/demo_long_range.py [--steps 2500] [--output demo_output/long_range]
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
PROBLEM = "synthetic_long_range"
MODELS = [("routing", "routing_transformer_tiny"), ("local", "local_transformer_tiny")]


def far_predictions(run_dir, hparams_set, data_dir, num=3):
  """Greedy next-token predictions at the far positions of `num` eval sequences."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import t2t_usr_dir  # pylint: disable=g-import-not-at-top,unused-import
  from problems import synthetic  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import trainer_lib  # pylint: disable=g-import-not-at-top
  tf1 = tf.compat.v1
  tf.get_logger().setLevel("ERROR")
  hparams = trainer_lib.create_hparams(hparams_set, data_dir=data_dir, problem_name=PROBLEM)
  eval_seqs = synthetic.generate_samples(synthetic.EVAL_SEED, num)
  with tf.Graph().as_default():
    targets = tf1.placeholder(tf.int32, [num, synthetic.LENGTH, 1, 1])
    model = registry.model("routing_transformer")(hparams, tf.estimator.ModeKeys.EVAL)
    logits, _ = model({"targets": targets})
    with tf1.Session() as sess:
      tf1.train.Saver().restore(sess, tf.train.latest_checkpoint(run_dir))
      out = sess.run(logits, {targets: np.asarray(eval_seqs)[:, :, None, None]})
  predicted = out[:, :, 0, 0, :].argmax(-1)
  rows = []
  for seq, pred in zip(eval_seqs, predicted):
    pairs = ["%s->%s%s" % (synthetic.token_name(seq[p - 1]), synthetic.token_name(pred[p]),
                           "" if pred[p] == seq[p] else "(want %s)" % synthetic.token_name(seq[p]))
             for p in synthetic.far_positions()]
    rows.append(" ".join(pairs))
  return rows


def decode_samples(run_dir, hparams_set, data_dir, output, num=3, extra_length=32):
  """t2t-decoder on prompts cut before the query section; returns (rows, recalled, pairs)."""
  from problems import synthetic  # pylint: disable=g-import-not-at-top
  sequences = synthetic.generate_samples(synthetic.EVAL_SEED, num)
  prompts = [" ".join(synthetic.token_name(i) for i in seq[:synthetic.QUERY_START])
             for seq in sequences] + [""]
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
    truth = {seq[i + 1]: seq[i] for i in range(0, 2 * synthetic.NUM_PAIRS, 2)}  # key -> value
    for a, b in zip(words, words[1:]):
      if a.startswith("k") and b.startswith("v") and synthetic.token_id(a) in truth:
        pairs += 1
        recalled += int(truth[synthetic.token_id(a)] == synthetic.token_id(b))
  return rows, recalled, pairs


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--steps", type=int, default=2500, help="training steps per model")
  parser.add_argument("--eval_steps", type=int, default=25)
  parser.add_argument("--evaluations", type=int, default=5,
                      help="evaluations per run, evenly spaced (T2T: at most one per 100 steps)")
  parser.add_argument("--output", default=os.path.join(ROOT, "demo_output", "long_range"))
  args = parser.parse_args()
  data_dir = os.path.join(args.output, "data")
  os.makedirs(data_dir, exist_ok=True)
  started = time.time()

  if glob.glob(os.path.join(data_dir, PROBLEM + "-dev-*")):
    log("data already in %s" % data_dir)
  else:
    log("t2t-datagen --problem=%s (20,000 train + 1,000 eval sequences of 512 tokens)" % PROBLEM)
    t2t("t2t-datagen", ["--problem=" + PROBLEM, "--data_dir=" + data_dir,
                        "--tmp_dir=" + os.path.join(args.output, "tmp")],
        os.path.join(args.output, "datagen.log"))

  results = {}
  for name, hparams_set in MODELS:
    run_dir = os.path.join(args.output, name)
    # T2T saves a checkpoint, so evaluates, at most every 100 steps (and at the end)
    eval_every = max(args.steps // max(args.evaluations, 1), 100)
    log("t2t-trainer --model=routing_transformer --hparams_set=%s: %d steps, eval every %d "
        "steps and at the end (log: %s.log)" % (hparams_set, args.steps, eval_every, run_dir))
    seconds = train(run_dir, PROBLEM, hparams_set, data_dir, args.steps, args.eval_steps,
                    eval_every=eval_every)
    metrics = eval_metrics(run_dir)
    metrics.update(train_seconds=seconds, steps_per_sec=train_speed(run_dir),
                   hparams_set=hparams_set)
    metrics["samples"] = far_predictions(run_dir, hparams_set, data_dir)
    log("t2t-decoder --hparams_set=%s: continuing %d eval prompts and 1 empty prompt" % (
        hparams_set, 3))
    rows, recalled, pairs = decode_samples(run_dir, hparams_set, data_dir, args.output)
    metrics.update(generated=rows, generated_recalled=recalled, generated_pairs=pairs)
    results[name] = metrics
    log("%s: eval loss %.4f, far accuracy %.3f, near accuracy %.3f" % (
        name, metrics.get("loss", float("nan")), metrics.get("far_accuracy", float("nan")),
        metrics.get("near_accuracy", float("nan"))))

  table = ["| model | hparams set | steps | eval loss | far accuracy | near accuracy | "
           "generated k v pairs recalled | steps/s | wall s |",
           "|---|---|---|---|---|---|---|---|---|"]
  for name, m in results.items():
    table.append("| %s | %s | %d | %.4f | %.3f | %.3f | %d / %d | %.1f | %.0f |" % (
        name, m["hparams_set"], m["step"], m.get("loss", float("nan")),
        m.get("far_accuracy", float("nan")), m.get("near_accuracy", float("nan")),
        m["generated_recalled"], m["generated_pairs"], m["steps_per_sec"],
        m["train_seconds"]))
  chance = 1.0 / 32
  summary = "\n".join(table) + (
      "\n\nFar positions: the 16 values of the final section, whose key-value pair is 448+ "
      "positions back (beyond local reach of 128); chance is %.3f.\n" % chance)
  samples = "\n".join("%s sample %d: %s" % (name, i, row) for name, m in results.items()
                      for i, row in enumerate(m["samples"]))
  generated = "\n".join("%s %s: %s" % (name, "prompt %d" % i if i < len(m["generated"]) - 1
                                        else "no prompt", row)
                        for name, m in results.items() for i, row in enumerate(m["generated"]))
  with open(os.path.join(args.output, "summary.md"), "w") as f:
    f.write(summary + "\nRecalled values (key->predicted):\n" + samples + "\n" +
            "\nGenerated by t2t-decoder after the pairs + filler (greedy, 32 tokens):\n" +
            generated + "\n")
  with open(os.path.join(args.output, "summary.json"), "w") as f:
    json.dump(results, f, indent=1)
  print("\n" + summary)
  print("Recalled values at the far positions (key->predicted value):\n" + samples)
  print("\nGenerated by t2t-decoder after the pairs + filler (greedy, 32 tokens; %s):\n"
        % os.path.join(args.output, "<model>.decodes.tsv") + generated)
  pictures(args.output, PROBLEM, data_dir, [name for name, _ in MODELS],
           "Head focus and JS divergence of the routing model")
  log("done in %.0f s; outputs under %s" % (time.time() - started, args.output))


if __name__ == "__main__":
  main()
