"""Probe scoring throughput vs the Scorer on full windows, on one randomly initialised model.

    python research/probe_throughput.py [--hparams_set pg19_local_cluster_tiny2k] [--vocab 4096]
        [--inputs 16] [--batch_size 4] [--positions 64]

Both paths restore the same checkpoint and run the model's full static length L per row:
`Scorer.score_ids` scores every token of full L-token windows (log_softmax over [B, L, V]);
the probes' `score_fn` scores `--positions` positions per input (log_softmax over [B, K, V]).
Prints input tokens/s of both and their ratio (one JSON line), measured in the same process.
"""
import argparse
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def random_checkpoint(directory, hparams, vocab_size):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from routing_transformer.t2t import model as model_lib  # pylint: disable=g-import-not-at-top
  from tensor2tensor.data_generators import problem_hparams  # pylint: disable=g-import-not-at-top
  tf1 = tf.compat.v1
  length = hparams.max_target_length
  with tf.Graph().as_default():
    p_hparams = problem_hparams.test_problem_hparams(vocab_size, vocab_size, hparams)
    model_lib.RoutingTransformer(hparams, tf.estimator.ModeKeys.EVAL, p_hparams)(
        {"targets": tf.zeros([1, length, 1, 1], tf.int32)})
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      tf1.train.Saver().save(sess, os.path.join(directory, "model.ckpt"), global_step=1)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--hparams_set", default="pg19_local_cluster_tiny2k")
  parser.add_argument("--vocab", type=int, default=4096)
  parser.add_argument("--inputs", type=int, default=16)
  parser.add_argument("--batch_size", type=int, default=4)
  parser.add_argument("--positions", type=int, default=64)
  args = parser.parse_args()
  import numpy as np  # pylint: disable=g-import-not-at-top
  from routing_transformer.tools import checkpoints  # pylint: disable=g-import-not-at-top
  from routing_transformer.tools import score  # pylint: disable=g-import-not-at-top
  from routing_transformer.tools.probes import scoring  # pylint: disable=g-import-not-at-top
  from tensor2tensor.data_generators import text_encoder  # pylint: disable=g-import-not-at-top
  hparams = checkpoints.hparams_from_flags(args.hparams_set)
  length = hparams.max_target_length
  with tempfile.TemporaryDirectory() as tmp:
    random_checkpoint(tmp, hparams, args.vocab)
    encoder = text_encoder.SubwordTextEncoder()
    encoder._init_subtokens_from_list(["<pad>", "<EOS>"] + ["t%d_" % i  # pylint: disable=protected-access
                                                             for i in range(args.vocab - 2)])
    scorer = score.Scorer(tmp, args.hparams_set, encoder, batch_size=args.batch_size,
                          hparams_json="ignore")
    score_fn = scoring.make_score_fn(scorer)
    rng = np.random.default_rng(0)
    ids = rng.integers(2, args.vocab, [args.inputs, length]).astype(np.int32)
    positions = np.tile(np.arange(length - args.positions, length), (args.inputs, 1))
    score_fn(ids[:args.batch_size], positions[:args.batch_size])  # warm up both paths
    scorer.score_ids([(ids[0].tolist(), 0)])
    start = time.time()
    scorer.score_ids([(row.tolist(), 0) for row in ids])
    full = args.inputs * length / (time.time() - start)
    start = time.time()
    score_fn(ids, positions)
    probe = args.inputs * length / (time.time() - start)
    scorer.close()
  print(json.dumps({"hparams_set": args.hparams_set, "L": length, "vocab": args.vocab,
                    "batch_size": args.batch_size, "positions": args.positions,
                    "scorer_full_windows_tokens_per_s": round(full),
                    "probe_input_tokens_per_s": round(probe), "ratio": round(probe / full, 3)}))


if __name__ == "__main__":
  main()
