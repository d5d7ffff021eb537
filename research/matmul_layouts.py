"""The dense layers' matmuls in each operand layout: which one TF runs at its plain rate.

    python research/matmul_layouts.py [--repeats 15] [--shapes 8192x512x512,...]
        [--dtype bfloat16]

For every shape m x k x n (a [m, k] times a [k, n] operand; the defaults are the bench-8k and
pg19_local_cluster8k dense layers at 8,192 positions: projections, GEGLU, head_dense, a 1,024-row
chunk of the GEGLU backward pass) it times, in one TF 1 session on variables (no constant
folding; `--dtype bfloat16`: the variables cast to bfloat16, casts included in every layout's
time): the plain MatMul; MatMul(transpose_b=True), what TF's MatMul gradient computes for the
input of y = x W (dx = dy W^T, whose shapes are these with k the layer's units and n its
inputs); `layers.matmul_nt`, the same product as a batch matmul of one with b adjoint, what
`layers.apply_kernel`'s gradient runs; and MatMul(transpose_a=True), the kernel's gradient
(x^T dy). Prints one JSON line per shape and a table of GFLOP/s and ratios to the plain rate;
writes research/results/matmul_layouts.json (`matmul_layouts_bfloat16.json`).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "benchmarks"))  # the suite's helpers
import common  # pylint: disable=g-import-not-at-top,wrong-import-position

# m x k x n: bench-8k (hidden 512, filter 2048), pg19_local_cluster8k (hidden 1024, filter 4096).
SHAPES = ("8192x512x512", "8192x2048x512", "1024x2048x512", "8192x512x2048", "65536x64x64",
          "8192x1024x1024", "8192x4096x1024", "1024x4096x1024")
LAYOUTS = ("plain", "transpose_b", "matmul_nt", "transpose_a")


def layout_ops(m, k, n, dtype="float32", seed=0):
  """{layout: reduced product tensor} of an [m, k] x [k, n] product over fresh variables
  (cast to `dtype`)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  rng = np.random.RandomState(seed)

  def variable(*shape):
    return tf.cast(tf.Variable(rng.standard_normal(shape).astype(np.float32)), dtype)

  a, b, b_t, a_t = variable(m, k), variable(k, n), variable(n, k), variable(k, m)
  products = {"plain": tf.matmul(a, b), "transpose_b": tf.matmul(a, b_t, transpose_b=True),
              "matmul_nt": matmul_nt(a, b_t),
              "transpose_a": tf.matmul(a_t, b, transpose_a=True)}
  return {name: tf.reduce_sum(product) for name, product in products.items()}


def matmul_nt(a, b):
  """a [m, k] times b [n, k] transposed -> [m, n] as a batch matmul of one with b adjoint (the
  core's dense-layer gradient before 0.2.0)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  n, k = b.shape
  product = tf.linalg.matmul(tf.reshape(a, [1, -1, k]), tf.reshape(b, [1, n, k]), adjoint_b=True)
  return tf.reshape(product, [-1, n])


def time_layouts(shape, repeats, dtype="float32"):
  """{layout: median seconds} of one shape "mxkxn", each layout timed in turn in one session."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf1 = tf.compat.v1
  m, k, n = [int(d) for d in shape.split("x")]
  with tf.Graph().as_default():
    fetches = layout_ops(m, k, n, dtype)
    with tf1.Session() as session:
      session.run(tf1.global_variables_initializer())
      seconds = {}
      for name in LAYOUTS:
        seconds[name] = common.median_time(lambda f=fetches[name]: session.run(f), repeats,
                                           warmup=3)
  return m, k, n, seconds


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--shapes", default=",".join(SHAPES))
  parser.add_argument("--repeats", type=int, default=15)
  parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  parser.add_argument("--out", default=os.path.join(common.ROOT, "research", "results"))
  args = parser.parse_args(argv)
  common.ensure_bench_env()
  info = common.start("matmul_layouts", repeats=args.repeats, dtype=args.dtype)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.compat.v1.disable_eager_execution()
  points = []
  for shape in args.shapes.split(","):
    m, k, n, seconds = time_layouts(shape, args.repeats, args.dtype)
    flops = 2.0 * m * k * n
    point = {"record": "point", "dtype": args.dtype, "m": m, "k": k, "n": n, "seconds": seconds,
             "gflops": {name: flops / s / 1e9 for name, s in seconds.items()},
             "over_plain": {name: seconds["plain"] / s for name, s in seconds.items()}}
    common.emit(point)
    points.append(point)
  print("\n| m x k x n | plain GFLOP/s | transpose_b / plain | matmul_nt / plain | "
        "transpose_a / plain |\n|---|---|---|---|---|")
  for p in points:
    print("| %d x %d x %d | %.0f | %.2f | %.2f | %.2f |" % (
        p["m"], p["k"], p["n"], p["gflops"]["plain"], p["over_plain"]["transpose_b"],
        p["over_plain"]["matmul_nt"], p["over_plain"]["transpose_a"]))
  suffix = "" if args.dtype == "float32" else "_" + args.dtype
  common.save(args.out, "matmul_layouts%s.json" % suffix, {"machine": info, "points": points})


if __name__ == "__main__":
  main()
