"""Decoding tokens/s: cached decoding (topk and causal_window routing) vs full recompute.

    python benchmarks/decode.py [--prefixes 1024,4096,8192] [--generate 32]

Small model ("decode-small"): hidden 256, filter 1024, 2 layers, vocab 256, 2 local + 2 routing
heads per layer, block = flange = 256, window 512 with prefix / 512 clusters, batch 1.

- cached (routing_mode "topk" and "causal_window"): `decoding.sample_loop` with caches for
  prefix + generate positions; the prompt
  (prefix - 1 tokens) and `generate` new tokens all go through the cached step (static caches
  make every step cost the same), so tokens/s = steps / loop time. topk keeps O(N) caches per
  routing head (scores, keys, values); causal_window keeps the last `window` keys per cluster.
- recompute: what a decoder without a cache pays per new token: one full forward pass over the
  prefix (a model built at exactly that length), tokens/s = 1 / forward time.

Prints one JSON line per point and the speed-ups per prefix; writes
benchmarks/results/decode.json.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # pylint: disable=g-import-not-at-top,wrong-import-position

VOCAB = 256


def small_hparams(length, routing_mode="topk"):
  from hparams import base  # pylint: disable=g-import-not-at-top
  h = base.sparse_transformer_local()
  h.max_length = h.max_target_length = h.batch_size = length
  h.hidden_size = h.embedding_dims = 256
  h.filter_size = 1024
  h.num_decoder_layers = h.num_hidden_layers = 2
  h.query_shape = h.memory_flange = h.memory_query_shape = (256,)
  h.max_relative_position = 257
  h.local_num_heads, h.sparsity_cluster_num_heads, h.sparsity_skip_first = 2, 2, 0
  h.sparsity_cluster_attention_window = min(512, length)
  h.sparsity_cluster_size = max(1, -(-length // 512))
  h.routing_mode = routing_mode
  return h


def build(length, mode, prompt_length=0, generate=0, routing_mode="topk"):
  """A session runner: mode "cached" (the decode loop) or "recompute" (one forward pass)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from routing_transformer.core import decoding  # pylint: disable=g-import-not-at-top
  from routing_transformer.t2t import model as model_lib  # pylint: disable=g-import-not-at-top
  from tensor2tensor.data_generators import problem_hparams  # pylint: disable=g-import-not-at-top
  tf1 = tf.compat.v1
  hparams = small_hparams(length, routing_mode)
  graph = tf.Graph()
  rng = np.random.default_rng(0)
  with graph.as_default():
    p_hparams = problem_hparams.test_problem_hparams(VOCAB, VOCAB, hparams)
    model = model_lib.RoutingTransformer(hparams, tf.estimator.ModeKeys.PREDICT, p_hparams)
    if mode == "cached":
      prompt = tf.constant(rng.integers(2, VOCAB, (1, prompt_length)), tf.int32)
      fetch = decoding.sample_loop(model, {"inputs": prompt}, generate)["outputs"]
    else:
      targets = tf.constant(rng.integers(2, VOCAB, (1, length, 1, 1)), tf.int32)
      with tf1.variable_scope(tf1.get_variable_scope(), reuse=tf1.AUTO_REUSE):
        logits, _ = model({"targets": targets})
      fetch = logits[:, -1]  # the next-token distribution
    sess = tf1.Session(graph=graph)
    sess.run(tf1.global_variables_initializer())
  return lambda: sess.run(fetch)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--prefixes", default="1024,4096,8192")
  parser.add_argument("--generate", type=int, default=32)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--out", default=os.path.join(common.ROOT, "benchmarks", "results"))
  args = parser.parse_args(argv)
  info = common.start("decode", config="decode-small", generate=args.generate)
  points, ratios = [], []
  for prefix in [int(p) for p in args.prefixes.split(",")]:
    block = 256
    length = -(-(prefix + args.generate) // block) * block  # cache: prefix + new tokens
    steps = prefix - 1 + args.generate
    point = {}
    for routing_mode in ("topk", "causal_window"):
      run = build(length, "cached", prompt_length=prefix - 1, generate=args.generate,
                  routing_mode=routing_mode)
      seconds, peak = common.time_fn(run, repeats=args.repeats, warmup=1, max_seconds=300)
      point[routing_mode] = {
          "record": "point", "mode": "cached", "routing_mode": routing_mode, "prefix": prefix,
          "cache_length": length, "steps": steps, "seconds": seconds,
          "ms_per_token": 1e3 * seconds / steps, "tokens_per_sec": steps / seconds,
          "peak_mb": peak / 2 ** 20}
      common.emit(point[routing_mode])
    run = build(prefix, "recompute")
    seconds, peak = common.time_fn(run, repeats=args.repeats, warmup=1, max_seconds=300)
    point["recompute"] = {"record": "point", "mode": "recompute", "routing_mode": "topk",
                          "prefix": prefix, "seconds": seconds, "ms_per_token": 1e3 * seconds,
                          "tokens_per_sec": 1.0 / seconds, "peak_mb": peak / 2 ** 20}
    common.emit(point["recompute"])
    speed = {name: p["tokens_per_sec"] for name, p in point.items()}
    ratio = {"record": "ratio", "prefix": prefix,
             "topk_cached_over_recompute": speed["topk"] / speed["recompute"],
             "causal_window_cached_over_recompute": speed["causal_window"] / speed["recompute"],
             "causal_window_over_topk_cached": speed["causal_window"] / speed["topk"]}
    common.emit(ratio)
    points += list(point.values())
    ratios.append(ratio)
  print("\n| prefix | topk cached tok/s | causal_window cached tok/s | recompute tok/s | "
        "topk / recompute | causal_window / recompute | causal_window / topk |\n"
        "|---|---|---|---|---|---|---|")
  for ratio in ratios:
    speed = {(p["mode"], p["routing_mode"]): p["tokens_per_sec"] for p in points
             if p["prefix"] == ratio["prefix"]}
    print("| %d | %.1f | %.1f | %.2f | %.1fx | %.1fx | %.1fx |" % (
        ratio["prefix"], speed[("cached", "topk")], speed[("cached", "causal_window")],
        speed[("recompute", "topk")], ratio["topk_cached_over_recompute"],
        ratio["causal_window_cached_over_recompute"], ratio["causal_window_over_topk_cached"]))
  common.save(args.out, "decode.json", {"machine": info, "points": points, "ratios": ratios})


if __name__ == "__main__":
  common.ensure_bench_env()
  main()
