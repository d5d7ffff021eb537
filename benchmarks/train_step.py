"""Training-step tokens/s and peak memory: routing vs local-only at the "bench-8k" config.

    python benchmarks/train_step.py [--steps 5] [--length 8192]

bench-8k: length 8192, batch 1, hidden 512, filter 2048, 4 layers, vocab 256, block 256, flange
256; routing = 6 local + 2 routing heads in every layer with 16 clusters x window 512; local = 8
local heads; routing_causal_window = the routing model with routing_mode="causal_window". The
full T2T training step (model, loss, Adafactor through T2T's optimizer code) is built in one
process for all three models and timed side by side; prints one JSON line per model and the
ratios (routing / local, causal_window / routing), and writes benchmarks/results/train_step.json.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # pylint: disable=g-import-not-at-top,wrong-import-position

VOCAB = 256


MODELS = ("local", "routing", "routing_causal_window")


def bench_hparams(routing, length, routing_mode="topk"):
  from hparams import base  # pylint: disable=g-import-not-at-top
  h = base.sparse_transformer_local()
  h.max_length = h.max_target_length = h.batch_size = length
  h.hidden_size = h.embedding_dims = 512
  h.filter_size = 2048
  h.num_decoder_layers = h.num_hidden_layers = 4
  h.query_shape = h.memory_flange = h.memory_query_shape = (256,)
  h.max_relative_position = 513
  if routing:
    h.local_num_heads, h.sparsity_cluster_num_heads, h.sparsity_skip_first = 6, 2, 0
    h.sparsity_cluster_size, h.sparsity_cluster_attention_window = 16, 512
    h.routing_mode = routing_mode
  else:
    h.local_num_heads, h.sparsity_cluster_num_heads = 8, 0
  return h


def build_train_step(name, length, overrides=None):
  """(run_step fn, parameter count) for one model (see MODELS) in its own graph and session;
  `overrides`: optional {hparam: value} set on top (e.g. recompute_layers=True)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from routing_transformer.t2t import model as model_lib  # pylint: disable=g-import-not-at-top
  from tensor2tensor.data_generators import problem_hparams  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import optimize  # pylint: disable=g-import-not-at-top
  tf1 = tf.compat.v1
  hparams = bench_hparams(name != "local", length,
                          "causal_window" if name.endswith("causal_window") else "topk")
  for key, value in (overrides or {}).items():
    setattr(hparams, key, value)
  graph = tf.Graph()
  with graph.as_default():
    tf1.train.get_or_create_global_step()
    p_hparams = problem_hparams.test_problem_hparams(VOCAB, VOCAB, hparams)
    model = model_lib.RoutingTransformer(hparams, tf.estimator.ModeKeys.TRAIN, p_hparams)
    targets = tf1.placeholder(tf.int32, [1, length, 1, 1])
    _, losses = model.model_fn_sharded({"targets": [targets]})
    loss = losses["training"] + losses["extra_loss"]
    train_op = optimize.optimize(loss, tf.constant(0.01), hparams, use_tpu=False)
    params = sum(int(np.prod(v.shape)) for v in tf1.trainable_variables())
    sess = tf1.Session(graph=graph)
    sess.run(tf1.global_variables_initializer())
  feed = {targets: np.random.default_rng(0).integers(1, VOCAB, (1, length, 1, 1))}

  def run():
    sess.run([train_op, loss], feed)
  return run, params


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--length", type=int, default=8192)
  parser.add_argument("--out", default=os.path.join(common.ROOT, "benchmarks", "results"))
  args = parser.parse_args(argv)
  info = common.start("train_step", config="bench-8k", length=args.length)
  results = {}
  steps = {name: build_train_step(name, args.length) for name in MODELS}
  for name, (run, params) in steps.items():  # timed one after the other, same process
    seconds, peak = common.time_fn(run, repeats=args.steps, warmup=2, max_seconds=600)
    results[name] = {"record": "point", "model": name, "seconds_per_step": seconds,
                     "tokens_per_sec": args.length / seconds, "peak_mb": peak / 2 ** 20,
                     "parameters": params}
    common.emit(results[name])
  ratio = {"record": "ratio",
           "time_routing_over_local": results["routing"]["seconds_per_step"] /
                                      results["local"]["seconds_per_step"],
           "memory_routing_over_local": results["routing"]["peak_mb"] /
                                        max(results["local"]["peak_mb"], 1e-9),
           "time_causal_window_over_routing":
               results["routing_causal_window"]["seconds_per_step"] /
               results["routing"]["seconds_per_step"]}
  common.emit(ratio)
  print("\n| model | s/step | tokens/s | peak MB | params |\n|---|---|---|---|---|")
  for name, r in results.items():
    print("| %s | %.3f | %.0f | %.0f | %d |" % (name, r["seconds_per_step"], r["tokens_per_sec"],
                                             r["peak_mb"], r["parameters"]))
  print("\nrouting / local step time: %.3f, peak memory: %.3f; causal_window / routing step "
        "time: %.3f" % (ratio["time_routing_over_local"], ratio["memory_routing_over_local"],
                        ratio["time_causal_window_over_routing"]))
  common.save(args.out, "train_step.json",
              {"machine": info, "results": results, "ratio": ratio})


if __name__ == "__main__":
  common.ensure_bench_env()
  main()
