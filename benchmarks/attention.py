"""Forward+backward time and peak memory of full, local and routing attention, side by side.

    python benchmarks/attention.py [--lengths 1024,2048,4096,8192,16384] [--xla] [--out DIR]

8 heads, d_head 64, batch 1. full: dense causal attention (`full_attention`); full_heads: the
model's full heads (hparam full_attention: `local_attention` with one block of the whole length
and Shaw relative tables of radius 128, computed in query blocks by `causal_full_attention`).
Local: block 256, flange 256 (the PG-19 sets). Routing:
w = 2^round(log2(sqrt(n))), k = n / w, plus the paper's k = 16, w = 512 at n = 8192.
Prints one JSON line per point, then a ratio table against full attention, the fitted time
exponent per kind, and achieved GFLOP/s against a dense matmul measured in the same run; writes
attention.json and attention.png (log-log) under --out.

Useful FLOPs (forward+backward, the matmuls the kind needs; backward counted as 2x forward):
  full    3 * 4 h n^2 d (full_heads: the same, relative terms not counted)
  local   3 * 4 h n (block + flange) d
  routing 3 * 4 h k w^2 d + 2 h n k d (centroid scores, forward only)
Peak memory: peak bytes of TF tensors in use during one step (BFC allocator statistics).
"""
import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # pylint: disable=g-import-not-at-top,wrong-import-position

HEADS, DEPTH, BATCH = 8, 64, 1
BLOCK, FLANGE = 256, 256
RADIUS = 128  # full_heads: relative distances clipped to [-128, 128]
FULL_MEMORY_LIMIT = 12e9  # bytes; full attention beyond this is reported as skipped


def routing_shape(n):
  window = 2 ** int(math.floor(math.log2(math.sqrt(n)) + 0.5))
  return n // window, window


def useful_flops(kind, n, clusters=None, window=None):
  if kind in ("full", "full_heads"):
    return 3 * 4 * HEADS * n * n * DEPTH
  if kind == "local":
    return 3 * 4 * HEADS * n * (min(BLOCK, n) + FLANGE) * DEPTH
  return 3 * 4 * HEADS * clusters * window ** 2 * DEPTH + 2 * HEADS * n * clusters * DEPTH


def full_memory_estimate(n):
  return 4.0 * BATCH * HEADS * n * n * 4  # logits, probabilities, two gradients, float32


def points(lengths):
  for n in lengths:
    yield dict(kind="full", n=n)
    yield dict(kind="full_heads", n=n)
    yield dict(kind="local", n=n, block=min(BLOCK, n), flange=FLANGE if n > BLOCK else 0)
    clusters, window = routing_shape(n)
    yield dict(kind="routing", n=n, clusters=clusters, window=window)
    if n == 8192:
      yield dict(kind="routing_paper", n=n, clusters=16, window=512)


def build_step(point, xla):
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from routing_transformer.core import attention  # pylint: disable=g-import-not-at-top
  n = point["n"]
  rng = np.random.default_rng(0)
  q, k, v, cot = [tf.constant(rng.standard_normal((BATCH, HEADS, n, DEPTH)), tf.float32)
                  for _ in range(4)]
  tables = [tf.constant(rng.standard_normal((2 * RADIUS + 1, DEPTH)), tf.float32)
            for _ in range(2)]
  if "clusters" in point:
    mu = attention.layer_norm_no_scale(
        tf.constant(rng.standard_normal((HEADS, point["clusters"], DEPTH)), tf.float32))

  def step(q, k, v):
    with tf.GradientTape() as tape:
      tape.watch([q, k, v])
      extra = 0.0
      if point["kind"] == "full":
        out = attention.full_attention(q, k, v)
      elif point["kind"] == "full_heads":
        out = attention.local_attention(q, k, v, n, 0, relative_keys=tables[0],
                                        relative_values=tables[1])
      elif point["kind"] == "local":
        out = attention.local_attention(q, k, v, point["block"], point["flange"])
      else:
        out, aux = attention.routing_attention(q, k, v, mu, point["window"])
        extra = aux["commitment_loss"]
      loss = tf.reduce_sum(out * cot) + extra
    grads = tape.gradient(loss, [q, k, v])
    return loss, [g for g in grads if g is not None]

  fn = tf.function(step, jit_compile=xla)

  def run():
    loss, grads = fn(q, k, v)
    loss.numpy()
    for g in grads:
      g.numpy()
  return run


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--lengths", default="1024,2048,4096,8192,16384")
  parser.add_argument("--xla", action="store_true", help="compile each step with XLA")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--out", default=os.path.join(common.ROOT, "benchmarks", "results"))
  args = parser.parse_args(argv)
  lengths = [int(x) for x in args.lengths.split(",")]
  os.makedirs(args.out, exist_ok=True)

  info = common.machine()
  info["matmul_gflops"] = roof = common.matmul_gflops()
  info.update(benchmark="attention", xla=args.xla, heads=HEADS, d_head=DEPTH, batch=BATCH)
  common.emit(dict(info, record="machine"))
  results = []
  for point in points(lengths):
    record = dict(point, record="point", xla=args.xla)
    if point["kind"].startswith("full") and full_memory_estimate(point["n"]) > FULL_MEMORY_LIMIT:
      record.update(skipped="needs about %.1f GB" % (full_memory_estimate(point["n"]) / 1e9))
      common.emit(record)
      results.append(record)
      continue
    seconds, peak = common.time_fn(build_step(point, args.xla), repeats=args.repeats)
    flops = useful_flops(point["kind"], point["n"], point.get("clusters"), point.get("window"))
    record.update(seconds=seconds, peak_mb=peak / 2 ** 20, useful_gflop=flops / 1e9,
                  gflops=flops / seconds / 1e9, matmul_fraction=flops / seconds / 1e9 / roof)
    common.emit(record)
    results.append(record)

  summary = summarize(results, lengths)
  common.emit(dict(summary, record="summary"))
  print_tables(results, summary, roof)
  write_outputs(args.out, info, results, summary)


def summarize(results, lengths):
  summary = {"exponent": {}, "exponent_4096_16384": {}, "vs_full": {}}
  kinds = sorted({r["kind"] for r in results})
  for kind in kinds:
    rows = [r for r in results if r["kind"] == kind and "seconds" in r]
    summary["exponent"][kind] = common.fit_exponent([r["n"] for r in rows],
                                                    [r["seconds"] for r in rows])
    tail = [r for r in rows if 4096 <= r["n"] <= 16384]
    summary["exponent_4096_16384"][kind] = common.fit_exponent([r["n"] for r in tail],
                                                               [r["seconds"] for r in tail])
  for n in lengths:
    full = [r for r in results if r["kind"] == "full" and r["n"] == n and "seconds" in r]
    if not full:
      continue
    for r in results:
      if r["n"] == n and "seconds" in r and r["kind"] != "full":
        summary["vs_full"]["%s@%d" % (r["kind"], n)] = {
            "time_ratio": r["seconds"] / full[0]["seconds"],
            "memory_ratio": r["peak_mb"] / max(full[0]["peak_mb"], 1e-9)}
  return summary


def print_tables(results, summary, roof):
  print("\n| kind | n | k x w | time s | peak MB | GFLOP/s | %% of matmul (%.0f GFLOP/s) | "
        "time / full | memory / full |" % roof)
  print("|---|---|---|---|---|---|---|---|---|")
  for r in results:
    if "seconds" not in r:
      print("| %s | %d | - | skipped: %s | | | | | |" % (r["kind"], r["n"], r["skipped"]))
      continue
    ratio = summary["vs_full"].get("%s@%d" % (r["kind"], r["n"]), {})
    shape = "%d x %d" % (r["clusters"], r["window"]) if "clusters" in r else "-"
    print("| %s | %d | %s | %.4f | %.0f | %.1f | %.0f%% | %s | %s |" % (
        r["kind"], r["n"], shape, r["seconds"], r["peak_mb"], r["gflops"],
        100 * r["matmul_fraction"],
        "%.3f" % ratio["time_ratio"] if ratio else "-",
        "%.3f" % ratio["memory_ratio"] if ratio else "-"))
  print("\nfitted time exponent (all n): %s" % _fmt(summary["exponent"]))
  print("fitted time exponent (4096..16384): %s" % _fmt(summary["exponent_4096_16384"]))


def _fmt(d):
  return ", ".join("%s %s" % (k, "-" if v is None else "%.2f" % v) for k, v in sorted(d.items()))


def write_outputs(out, info, results, summary):
  import json  # pylint: disable=g-import-not-at-top
  with open(os.path.join(out, "attention.json"), "w") as f:
    json.dump({"machine": info, "points": results, "summary": summary}, f, indent=1)
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  except ImportError:
    return
  fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
  for kind in sorted({r["kind"] for r in results}):
    rows = [r for r in results if r["kind"] == kind and "seconds" in r]
    ns = [r["n"] for r in rows]
    style = "o-" if len(rows) > 1 else "s"
    axes[0].loglog(ns, [r["seconds"] for r in rows], style, label=kind, base=2)
    axes[1].loglog(ns, [max(r["peak_mb"], 1e-3) for r in rows], style, label=kind, base=2)
  axes[0].set(xlabel="sequence length n", ylabel="forward+backward seconds",
              title="time (8 heads, d 64, batch 1)")
  axes[1].set(xlabel="sequence length n", ylabel="peak tensor memory (MB)", title="memory")
  for ax in axes:
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
  fig.tight_layout()
  fig.savefig(os.path.join(out, "attention.png"), dpi=110)


if __name__ == "__main__":
  common.ensure_bench_env()
  main()
