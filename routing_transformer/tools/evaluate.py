"""Evaluate a checkpoint on every token of a generated split: total NLL and the problem's figures.

  python -m routing_transformer.tools.evaluate --problem=pg19_length8k --data_dir=D \
      --hparams_set=pg19_local_cluster8k --checkpoint=O [--split=test] [--t2t_usr_dir=DIR,...]

Every example of the split is scored once, without context from the examples before it (as the
model was trained), over all non-padding target tokens (EOS included). The problem turns the
total into its figures (`problems.lm.LanguageModelProblem.report`): subword and word-level
perplexity and bits per word for PG-19 (official word counts for the full validation/test
split), bits per byte for enwik8, perplexity for WikiText-103, bits per dimension for images.
Prints one JSON object; progress lines go to stderr.
"""
import json
import math
import os
import sys
import time

from absl import app
from absl import flags
import numpy as np
import tensorflow.compat.v1 as tf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SPLITS = ("train", "dev", "test")


class EvaluationError(ValueError):
  one_line = True


def _register(t2t_usr_dir=None):
  """This project's names, then those of every directory of --t2t_usr_dir (comma-separated)."""
  if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
  from routing_transformer.t2t import usr_dirs  # pylint: disable=g-import-not-at-top
  usr_dirs.import_usr_dirs(t2t_usr_dir)


def resolve_checkpoint(path):
  """A checkpoint prefix from a prefix or a directory holding checkpoints."""
  from routing_transformer.tools import checkpoints  # pylint: disable=g-import-not-at-top
  try:
    return checkpoints.find_checkpoint(path or "")
  except checkpoints.CheckpointError as e:
    raise EvaluationError("--checkpoint: %s" % e)


def token_nll(logits, targets):
  """Summed NLL [b] and non-padding token counts [b] of logits [b, n, v] for targets [b, n]."""
  xent = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=logits)
  weights = tf.cast(tf.not_equal(targets, 0), tf.float32)
  return tf.reduce_sum(xent * weights, axis=1), tf.reduce_sum(weights, axis=1)


def evaluate(problem_name, hparams_set, checkpoint, data_dir, split="dev",
             model_name="routing_transformer", hparams_overrides="", batch_size=1,
             max_examples=None, log_every=30.0, t2t_usr_dir=None):
  """Scores the split; returns the dict of figures (see module docstring)."""
  _register(t2t_usr_dir)
  from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import trainer_lib  # pylint: disable=g-import-not-at-top
  from problems import lm  # pylint: disable=g-import-not-at-top
  if split not in SPLITS:
    raise EvaluationError("--split must be one of %s, got %r" % (", ".join(SPLITS), split))
  checkpoint = resolve_checkpoint(checkpoint)
  graph = tf.Graph()
  with graph.as_default():
    hp = trainer_lib.create_hparams(hparams_set, hparams_overrides, data_dir=data_dir,
                                    problem_name=problem_name)
    problem = hp.problem
    length = hp.max_target_length or hp.max_length
    ds = problem.dataset(tf.estimator.ModeKeys.EVAL, data_dir, shuffle_files=False, hparams=hp,
                         dataset_split=lm.SPLITS[split])
    ds = ds.map(lambda ex: {"targets": tf.cast(ex["targets"], tf.int32)})
    if max_examples:
      ds = ds.take(max_examples)
    ds = ds.padded_batch(batch_size, {"targets": [length]})
    features = tf.data.make_one_shot_iterator(ds).get_next()
    model = registry.model(model_name)(hp, tf.estimator.ModeKeys.EVAL, hp.problem_hparams)
    logits, _ = model({"targets": features["targets"][:, :, tf.newaxis, tf.newaxis]})
    nll, count = token_nll(tf.squeeze(logits, [2, 3]), features["targets"])
    saver = tf.train.Saver()
    total_nll, tokens, examples = 0.0, 0, 0
    start = last = time.time()
    with tf.Session() as sess:
      saver.restore(sess, checkpoint)
      while True:
        try:
          batch_nll, batch_count = sess.run([nll, count])
        except tf.errors.OutOfRangeError:
          break
        total_nll += float(np.sum(batch_nll, dtype=np.float64))
        tokens += int(np.sum(batch_count))
        examples += len(batch_nll)
        if time.time() - last >= log_every:
          last = time.time()
          sys.stderr.write("[evaluate] %s %s: %d examples, %d tokens, %.0f tokens/s, "
                           "%.4f nats/token\n" % (problem_name, split, examples, tokens,
                                                   tokens / (last - start),
                                                   total_nll / max(tokens, 1)))
  stats = {}
  if hasattr(problem, "split_stats") and not max_examples:  # datagen's counts (words, books)
    stats = problem.split_stats(data_dir, split)           # describe the whole split only
    if stats.get("tokens") not in (None, tokens):
      raise EvaluationError("Scored %d tokens but datagen recorded %d for %s %s; are examples "
                            "longer than max_target_length=%d?" % (tokens, stats["tokens"],
                                                                   problem_name, split, length))
  stats["split"] = split
  report = (problem.report(total_nll, tokens, stats) if hasattr(problem, "report")
            else {"total_nll": total_nll, "tokens": tokens,
                  "token_perplexity": math.exp(total_nll / tokens)})
  report.update(problem=problem_name, split=split, examples=examples, checkpoint=checkpoint,
                hparams_set=hparams_set)
  return report


FLAGS = flags.FLAGS


def define_flags(flag_values=FLAGS):
  """Defines the command's flags in `flag_values` (absl's global FLAGS; tests pass their own)."""
  fv = dict(flag_values=flag_values)
  flags.DEFINE_string("problem", None, "Registered problem, e.g. pg19_length8k.", **fv)
  flags.DEFINE_string("data_dir", None, "Folder of the records written by t2t-datagen.", **fv)
  flags.DEFINE_string("checkpoint", None, "t2t-trainer output_dir or a model.ckpt-N prefix.",
                      **fv)
  flags.DEFINE_string("hparams_set", None, "Hparams set the checkpoint was trained with.", **fv)
  flags.DEFINE_string("hparams", "", "Hparams overrides, as for t2t-trainer.", **fv)
  flags.DEFINE_string("model", "routing_transformer", "Registered model name.", **fv)
  flags.DEFINE_enum("split", "dev", list(SPLITS), "Split to score.", **fv)
  flags.DEFINE_integer("batch_size", 1, "Examples per batch.", **fv)
  flags.DEFINE_integer("max_examples", 0, "Score only the first N examples (0: all); word "
                       "counts are then unknown.", **fv)
  flags.DEFINE_string("output_json", None, "Also write the JSON here.", **fv)
  flags.DEFINE_string("t2t_usr_dir", None, "Comma-separated user directories to import (their "
                      "problems and hparams sets), as the T2T binaries' --t2t_usr_dir.", **fv)


def main(argv):
  del argv
  for name in ("problem", "data_dir", "checkpoint", "hparams_set"):
    if not getattr(FLAGS, name):
      sys.exit("error: --%s is required." % name)
  _register()  # the project root on sys.path
  from routing_transformer.t2t import glue as t2t_glue  # pylint: disable=g-import-not-at-top
  t2t_glue.install_error_hook()  # one-line errors, e.g. a bad --t2t_usr_dir entry
  _register(FLAGS.t2t_usr_dir)
  report = evaluate(FLAGS.problem, FLAGS.hparams_set, FLAGS.checkpoint, FLAGS.data_dir,
                    FLAGS.split, FLAGS.model, FLAGS.hparams, FLAGS.batch_size,
                    FLAGS.max_examples or None, t2t_usr_dir=FLAGS.t2t_usr_dir)
  text = json.dumps(report, indent=1, sort_keys=True)
  print(text)
  if FLAGS.output_json:
    with tf.io.gfile.GFile(FLAGS.output_json, "w") as f:
      f.write(text + "\n")


def run():
  """The `rt-evaluate` command: `python -m routing_transformer.tools.evaluate`."""
  define_flags()
  app.run(main)


if __name__ == "__main__":
  run()
