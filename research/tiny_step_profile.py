"""Per-op profile of the demo's training step: `pg19_local_cluster_tiny2k` vs `pg19_local_tiny2k`.

    python research/tiny_step_profile.py [--steps 20] [--sets SET,SET] [--xla]

Builds each set's whole T2T training step (model, loss, Adafactor through T2T's optimizer code;
one 2,048-subword sequence, vocabulary 4,066 as the demo's) in its own graph, times `--steps`
steps after 5 warm-up steps (median), then traces one step (TF timeline) and sums the op time by
op type and by scope (forward / backward / optimizer). Prints one JSON line per set and the
routing / local ratio; writes research/results/tiny_step_profile.json. `--xla` turns on XLA
auto-clustering of the session (global_jit_level ON_1, with TF_XLA_FLAGS=--tf_xla_cpu_global_jit,
without which the CPU clusters nothing) for both sets.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "benchmarks"))  # the suite's helpers
import common  # pylint: disable=g-import-not-at-top,wrong-import-position

VOCAB, LENGTH = 4066, 2048


def build(hparams_set, xla):
  """(run_step fn, traced_step fn) of one set's training step in its own graph and session."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import t2t_usr_dir  # pylint: disable=g-import-not-at-top,unused-import
  from routing_transformer.t2t import model as model_lib  # pylint: disable=g-import-not-at-top
  from tensor2tensor.data_generators import problem_hparams  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import optimize, registry  # pylint: disable=g-import-not-at-top
  tf1 = tf.compat.v1
  hparams = registry.hparams(hparams_set)
  graph = tf.Graph()
  with graph.as_default():
    tf1.train.get_or_create_global_step()
    p_hparams = problem_hparams.test_problem_hparams(VOCAB, VOCAB, hparams)
    model = model_lib.RoutingTransformer(hparams, tf.estimator.ModeKeys.TRAIN, p_hparams)
    targets = tf1.placeholder(tf.int32, [1, LENGTH, 1, 1])
    _, losses = model.model_fn_sharded({"targets": [targets]})
    loss = losses["training"] + losses.get("extra_loss", 0.0)
    train_op = optimize.optimize(loss, tf.constant(0.05), hparams, use_tpu=False)
    config = tf1.ConfigProto()
    if xla:
      config.graph_options.optimizer_options.global_jit_level = tf1.OptimizerOptions.ON_1
    sess = tf1.Session(graph=graph, config=config)
    sess.run(tf1.global_variables_initializer())
  feed = {targets: np.random.default_rng(0).integers(1, VOCAB, (1, LENGTH, 1, 1))}

  def run():
    sess.run([train_op, loss], feed)

  def traced():
    options = tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE)
    metadata = tf1.RunMetadata()
    sess.run([train_op, loss], feed, options=options, run_metadata=metadata)
    return metadata.step_stats
  return run, traced


op_times = common.op_times  # benchmarks/common.py (bench-peers traces with it too)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--sets", default="pg19_local_cluster_tiny2k,pg19_local_tiny2k")
  parser.add_argument("--xla", action="store_true")
  parser.add_argument("--out", default=os.path.join(common.ROOT, "research", "results"))
  args = parser.parse_args(argv)
  if args.xla:
    common.enable_cpu_xla_autoclustering()
  info = common.start("tiny_step_profile", length=LENGTH, xla=args.xla)
  results = {}
  for hparams_set in args.sets.split(","):
    run, traced = build(hparams_set, args.xla)
    seconds, _ = common.time_fn(run, repeats=args.steps, warmup=5, max_seconds=300)
    results[hparams_set] = dict(record="point", hparams_set=hparams_set, xla=args.xla,
                                seconds_per_step=seconds, steps_per_sec=1.0 / seconds,
                                **op_times(traced()))
    common.emit(results[hparams_set])
  names = list(results)
  if len(names) == 2:
    common.emit({"record": "ratio", "time_%s_over_%s" % tuple(names):
                 results[names[0]]["seconds_per_step"] / results[names[1]]["seconds_per_step"]})
  common.save(args.out, "tiny_step_profile.json", {"machine": info, "results": results})
  print(json.dumps({k: v["by_op"][:6] for k, v in results.items()}, indent=1))


if __name__ == "__main__":
  common.ensure_bench_env()
  main()
