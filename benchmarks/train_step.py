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
WINDOW = 512  # routing window; clusters = max(16, length / 512), so 16 x 512 at 8192


MODELS = ("local", "routing", "routing_causal_window")
KINDS = MODELS + ("full",)  # full: 8 heads of dense causal attention (full_attention=True)


def bench_hparams(routing, length, routing_mode="topk", full=False):
  """The bench-8k hparams at `length` (routing: 6 local + 2 routing heads, else 8 local heads,
  or with `full` 8 full-attention heads); routing clusters of 512, max(16, length / 512) of
  them."""
  from hparams import base  # pylint: disable=g-import-not-at-top
  h = base.sparse_transformer_local()
  h.max_length = h.max_target_length = h.batch_size = length
  h.hidden_size = h.embedding_dims = 512
  h.filter_size = 2048
  h.num_decoder_layers = h.num_hidden_layers = 4
  h.query_shape = h.memory_flange = h.memory_query_shape = (256,)
  h.max_relative_position = 513
  h.layer_prepostprocess_dropout = 0.0  # no dropout, as the PyTorch port's configuration
  if routing:
    h.local_num_heads, h.sparsity_cluster_num_heads, h.sparsity_skip_first = 6, 2, 0
    h.sparsity_cluster_size = max(16, length // WINDOW)
    h.sparsity_cluster_attention_window = WINDOW
    h.routing_mode = routing_mode
  else:
    h.local_num_heads, h.sparsity_cluster_num_heads = 8, 0
    h.full_attention = full
  return h


def model_hparams(name, length, overrides=None):
  """bench_hparams of a model in KINDS, with {hparam: value} `overrides` set on top."""
  if name not in KINDS:
    raise ValueError("unknown model %r; choose from %s" % (name, ", ".join(KINDS)))
  hparams = bench_hparams(name.startswith("routing"), length,
                          "causal_window" if name.endswith("causal_window") else "topk",
                          full=name == "full")
  for key, value in (overrides or {}).items():
    setattr(hparams, key, value)
  return hparams


def causal_pairs(length, block, flange):
  """(query, key) pairs blocked causal attention allows: each block of `block` queries sees the
  `flange` positions before it (fewer at the start) and its causal triangle."""
  blocks = length // block
  return sum(block * min(flange, j * block) + block * (block + 1) // 2 for j in range(blocks))


def useful_flops_per_token(hparams, vocab):
  """Useful FLOPs of one training step per token: 3 x the forward matmul FLOPs (backward = 2 x
  forward), a multiply-add counted as 2 FLOPs. Forward: emb_dense; per layer the q, k, v and
  output_transform projections (4 x 2 n h^2), head_dense, the FFN (GEGLU 3 x 2 n h f), and per
  head 4 d per (query, key) pair the head may attend to (q.k and the weighted sum of v; 8 d with
  Shaw relative keys and values), plus 2 d per routing centroid score; final dense(s). Pairs:
  local heads the causal block + flange (`causal_pairs`), full heads n (n + 1) / 2, routing
  heads k w (w + 1) / 2 (topk; causal_window: every cluster holding n / k positions, each query
  seeing at most w of them). Layer norms, softmax, k-means and the optimizer are not counted.
  bench-8k routing: 121 MFLOP/token."""
  n, h, f = hparams.max_target_length or hparams.max_length, hparams.hidden_size, \
      hparams.filter_size
  e = hparams.embedding_dims
  heads = hparams.local_num_heads + hparams.sparsity_cluster_num_heads
  d = h // heads
  flops = 2 * n * e * h
  rel = bool(hparams.max_relative_position)
  for layer in range(hparams.num_decoder_layers):
    routing = hparams.sparsity_cluster_num_heads if layer >= hparams.sparsity_skip_first else 0
    other = heads - routing
    flops += 4 * 2 * n * h * h
    if hparams.head_dense:
      flops += 2 * n * heads * d * d
    flops += (3 if hparams.ffn_layer == "geglu" else 2) * 2 * n * h * f
    if hparams.get("full_attention", False):
      pairs = n * (n + 1) // 2
    else:
      pairs = causal_pairs(n, hparams.query_shape[0], hparams.memory_flange[0])
    flops += other * pairs * (8 if rel and hparams.local_relative else 4) * d
    if routing:
      k, w = hparams.sparsity_cluster_size, hparams.sparsity_cluster_attention_window
      if hparams.routing_mode == "causal_window":
        size = n // k
        pairs = k * sum(min(w, r + 1) for r in range(size))
      else:
        pairs = k * w * (w + 1) // 2
      per_pair = (8 if rel and hparams.sparsity_cluster_relative else 4) * d
      flops += routing * (pairs * per_pair + 2 * d * k * n)
  if h != e:
    flops += 2 * n * h * e
  flops += 2 * n * e * vocab
  return 3.0 * flops / n


def build_train_step(name, length, overrides=None, vocab=VOCAB, xla=False):
  """(run_step fn, parameter count) for one model (see KINDS) in its own graph and session (the
  fn's attributes `graph` and `fetches` give the graph and the step's fetches);
  `overrides`: optional {hparam: value} set on top (e.g. recompute_layers=True); `xla`: XLA
  auto-clustering of the session (global_jit_level ON_1, the CPU proxy of --xla_compile), which
  on the CPU clusters only after common.enable_cpu_xla_autoclustering() ran before TF started."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from routing_transformer.t2t import model as model_lib  # pylint: disable=g-import-not-at-top
  from tensor2tensor.data_generators import problem_hparams  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import optimize  # pylint: disable=g-import-not-at-top
  tf1 = tf.compat.v1
  hparams = model_hparams(name, length, overrides)
  graph = tf.Graph()
  with graph.as_default():
    tf1.train.get_or_create_global_step()
    p_hparams = problem_hparams.test_problem_hparams(vocab, vocab, hparams)
    model = model_lib.RoutingTransformer(hparams, tf.estimator.ModeKeys.TRAIN, p_hparams)
    targets = tf1.placeholder(tf.int32, [1, length, 1, 1])
    _, losses = model.model_fn_sharded({"targets": [targets]})
    loss = losses["training"] + losses["extra_loss"]
    train_op = optimize.optimize(loss, tf.constant(0.01), hparams, use_tpu=False)
    params = sum(int(np.prod(v.shape)) for v in tf1.trainable_variables())
    config = tf1.ConfigProto()
    if xla:
      config.graph_options.optimizer_options.global_jit_level = tf1.OptimizerOptions.ON_1
    sess = tf1.Session(graph=graph, config=config)
    sess.run(tf1.global_variables_initializer())
  feed = {targets: np.random.default_rng(0).integers(1, vocab, (1, length, 1, 1))}

  def run(**run_kwargs):  # run_kwargs: tf1.Session.run's options / run_metadata (profiles)
    sess.run([train_op, loss], feed, **run_kwargs)
  run.graph, run.fetches = graph, [train_op, loss]  # for reading the graph (memory breakdown)
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
