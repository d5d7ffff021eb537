"""Short runs on the one-hop retrieval task: how fast does a tiny model learn the far look-up?

    python benchmarks/retrieval_study.py --hparams_set full_transformer_tiny1k \
        --problem long_range_retrieval_1k --steps 300 --eval_every 100 \
        [--hparams learning_rate_constant=0.2,...] [--sequences 4] [--seed 1]

A plain session loop (no t2t-trainer start-up, no checkpoints): the registered model, T2T's
optimizer and learning-rate schedule of the hparams set, batches of `--sequences` sequences drawn
from `retrieval.generate_samples` (train seed + step, so each step sees new data), and the far
accuracy and loss on 16 eval sequences every `--eval_every` steps. Prints one JSON line per
evaluation (step, seconds, far_accuracy, near_accuracy, train loss, eval loss).
"""
import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--hparams_set", default="full_transformer_tiny1k")
  parser.add_argument("--problem", default="long_range_retrieval_1k")
  parser.add_argument("--hparams", default="")
  parser.add_argument("--steps", type=int, default=300)
  parser.add_argument("--eval_every", type=int, default=100)
  parser.add_argument("--sequences", type=int, default=4)
  parser.add_argument("--seed", type=int, default=1)
  args = parser.parse_args(argv)

  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import t2t_usr_dir  # pylint: disable=g-import-not-at-top,unused-import
  from problems import retrieval  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import trainer_lib  # pylint: disable=g-import-not-at-top
  tf1 = tf.compat.v1
  tf.get_logger().setLevel("ERROR")

  problem = registry.problem(args.problem)
  layout = problem.layout
  hparams = trainer_lib.create_hparams(args.hparams_set, args.hparams, problem_name=args.problem)
  far = np.zeros(layout.length, bool)
  far[layout.far_positions()] = True
  eval_seqs = retrieval.generate_samples(retrieval.EVAL_SEED, 16, layout)
  tf1.set_random_seed(args.seed)
  np.random.seed(args.seed)
  with tf.Graph().as_default():
    tf1.set_random_seed(args.seed)
    tf1.train.get_or_create_global_step()
    ids = tf1.placeholder(tf.int32, [None, layout.length])
    features = {"targets": ids[:, :, None, None]}
    train_model = registry.model("routing_transformer")(hparams, tf.estimator.ModeKeys.TRAIN)
    logits, losses = train_model(features)
    loss = tf.add_n(list(losses.values()))  # as T2T's estimator: "extra_loss" carries the
    # commitment loss and, through a control dependency, the centroid update
    train_op = train_model.optimize(loss)
    # Evaluation reads the same graph's logits (no dropout in the tiny sets; no train_op run).
    predictions = tf.argmax(logits[:, :, 0, 0, :], axis=-1, output_type=tf.int32)
    started = time.time()
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      train_losses = []
      for step in range(1, args.steps + 1):
        batch = retrieval.generate_samples(1000 * args.seed + step, args.sequences, layout)
        _, value = sess.run([train_op, loss], {ids: batch})
        train_losses.append(float(value))
        if step % args.eval_every == 0 or step == args.steps:
          pred, eval_loss = sess.run([predictions, losses["training"]], {ids: eval_seqs})
          correct = pred == eval_seqs
          print(json.dumps(dict(
              hparams_set=args.hparams_set, hparams=args.hparams, problem=args.problem,
              sequences=args.sequences, seed=args.seed, step=step,
              seconds=round(time.time() - started, 1),
              far_accuracy=round(float(correct[:, far].mean()), 4),
              near_accuracy=round(float(correct[:, ~far].mean()), 4),
              train_loss=round(float(np.mean(train_losses[-args.eval_every:])), 4),
              eval_loss=round(float(eval_loss), 4))), flush=True)


if __name__ == "__main__":
  main()
