"""GEGLU's element-wise chains as fused CPU kernels: what fusing them buys the bench-8k step.

    python research/fused_geglu.py [--rounds 10] [--length 8192] [--out DIR]

Compiles research/kernels/geglu.cc (g++ with TensorFlow's headers and flags from tf.sysconfig,
-O3 -march=native: built on and for this machine, into build/kernels/) and loads its two ops,
RoutingGeglu (h = gelu(a) * b in one pass) and RoutingGegluGrad ((da, db) in one pass), the
second registered as the first's gradient. Then, in one process:
(1) exactness: h, da, db against `layers.geglu_hidden` (T2T's tanh gelu) and its TF gradient on
    [1024, 2048] (a ~ N(0, 2^2), b, dh ~ N(0, 1)): the largest error over the largest magnitude
    of each, which must stay below 1e-5;
(2) the element-wise work of one bench-8k layer ([8192, 2048]: h, da and db), TF's ops against
    the fused kernels (median of 10 runs each);
(3) the whole training step of benchmarks/train_step.py at --length, built twice, the second
    with `layers.geglu_hidden` replaced by RoutingGeglu (GEGLU's forward chunks and, through the
    registered gradient, its backward chunks), timed side by side (`common.interleaved_times`,
    --rounds rounds after one untimed).
An experiment, not a switch of the model (docs/performance.md says what it measured). Prints
JSON lines and a summary; writes research/results/fused_geglu.json. Run it alone.
"""
import argparse
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "benchmarks"))  # the suite's helpers
import common  # pylint: disable=g-import-not-at-top,wrong-import-position

SOURCE = os.path.join(common.ROOT, "research", "kernels", "geglu.cc")
TOLERANCE = 1e-5
_LOADED = {}  # one library per process: TF refuses to register an op twice


def build_kernel(out_dir, compiler=None):
  """Compiles SOURCE into out_dir/geglu.so for this machine; returns its path. RuntimeError
  naming the fix when no C++ compiler is found or the compilation fails."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  compiler = compiler or os.environ.get("CXX", "g++")
  if shutil.which(compiler) is None:
    raise RuntimeError("fused_geglu: no C++ compiler %r on PATH; install g++ (Debian: apt-get "
                       "install g++) or set CXX to one." % compiler)
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, "geglu.so")
  command = ([compiler, "-std=c++17", "-shared", "-fPIC", "-O3", "-march=native", SOURCE,
              "-o", path] + tf.sysconfig.get_compile_flags() + tf.sysconfig.get_link_flags())
  done = subprocess.run(command, capture_output=True, text=True, check=False)
  if done.returncode:
    raise RuntimeError("fused_geglu: compiling %s failed (%s):\n%s"
                       % (SOURCE, " ".join(command), done.stderr[-4000:]))
  return path


def load_kernel(path):
  """The ops module of the library at `path` (loaded once per process), with RoutingGegluGrad
  registered as RoutingGeglu's gradient."""
  if "module" not in _LOADED:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    module = tf.load_op_library(path)

    @tf.RegisterGradient("RoutingGeglu")
    def _geglu_grad(op, dh):  # pylint: disable=unused-variable
      return list(module.routing_geglu_grad(op.inputs[0], op.inputs[1], dh))

    _LOADED["module"] = module
  return _LOADED["module"]


def exactness(kernels, shape=(1024, 2048), seed=0):
  """{"h" | "da" | "db": max |fused - TF| / max |TF|} on random inputs of `shape`."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from routing_transformer.core import layers  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  a, b, dh = (tf.constant(rng.normal(0, s, shape).astype(np.float32)) for s in (2.0, 1.0, 1.0))
  with tf.GradientTape(persistent=True) as tape:
    tape.watch([a, b])
    reference, fused = layers.geglu_hidden(a, b), kernels.routing_geglu(a, b)
  pairs = {"h": (reference, fused)}
  for name, wrt in (("da", a), ("db", b)):
    pairs[name] = (tape.gradient(reference, wrt, dh), tape.gradient(fused, wrt, dh))
  return {name: float(np.abs(f.numpy() - r.numpy()).max() / np.abs(r.numpy()).max())
          for name, (r, f) in pairs.items()}


def elementwise_times(kernels, rows=8192, width=2048, repeats=10):
  """{"tf" | "fused": median seconds} of h, da and db of one [rows, width] GEGLU layer."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from routing_transformer.core import layers  # pylint: disable=g-import-not-at-top
  tf1 = tf.compat.v1
  rng = np.random.default_rng(0)
  with tf.Graph().as_default():
    a, b, dh = (tf1.Variable(rng.normal(0, s, (rows, width)).astype(np.float32))
                for s in (2.0, 1.0, 1.0))
    h = layers.geglu_hidden(a, b)
    paths = {"tf": [h] + tf.gradients(h, [a, b], dh),
             "fused": [kernels.routing_geglu(a, b)] + list(kernels.routing_geglu_grad(a, b, dh))}
    fetches = {name: [tf.reduce_sum(t[:1]) for t in ts] for name, ts in paths.items()}
    with tf1.Session() as session:
      session.run(tf1.global_variables_initializer())
      return {name: common.median_time(lambda f=f: session.run(f), repeats, warmup=3)
              for name, f in fetches.items()}


def step_times(kernels, length, rounds):
  """(`common.interleaved_summary` of the bench-8k routing step with TF's GEGLU ops ("tf") and
  with the fused kernels ("fused"), timed side by side; the fused graph's number of kernel ops)."""
  import train_step  # pylint: disable=g-import-not-at-top
  from routing_transformer.core import layers  # pylint: disable=g-import-not-at-top
  runs = {"tf": train_step.build_train_step("routing", length)[0]}
  original = layers.geglu_hidden
  layers.geglu_hidden = kernels.routing_geglu
  try:
    runs["fused"] = train_step.build_train_step("routing", length)[0]
  finally:
    layers.geglu_hidden = original
  fused_ops = sum(op.type.startswith("RoutingGeglu")
                  for op in runs["fused"].graph.get_operations())
  times = common.interleaved_times(runs, rounds, warmup=1)
  return common.interleaved_summary(times, "tf"), fused_ops


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--rounds", type=int, default=10)
  parser.add_argument("--length", type=int, default=8192)
  parser.add_argument("--out", default=os.path.join(common.ROOT, "research", "results"))
  args = parser.parse_args(argv)
  common.ensure_bench_env()
  info = common.start("fused_geglu", config="bench-8k", length=args.length, rounds=args.rounds)
  kernels = load_kernel(build_kernel(os.path.join(common.ROOT, "build", "kernels")))
  errors = exactness(kernels)
  common.emit({"record": "exactness", "relative_error": errors})
  if max(errors.values()) > TOLERANCE:
    sys.exit("fused_geglu: the kernels differ from TF's ops by %s (> %g): not timed."
             % (errors, TOLERANCE))
  layer = elementwise_times(kernels)
  common.emit({"record": "elementwise", "seconds": layer})
  summary, fused_ops = step_times(kernels, args.length, args.rounds)
  step = {"record": "step", "fused_ops": fused_ops, "configurations": summary}
  common.emit(step)
  print("\nexactness (max error / max magnitude): %s" % ", ".join(
      "%s %.1e" % kv for kv in sorted(errors.items())))
  print("one layer's GEGLU element-wise work [8192, 2048]: TF's ops %.1f ms, fused %.1f ms"
        % (1e3 * layer["tf"], 1e3 * layer["fused"]))
  print("training step side by side (%d rounds): TF's ops %.2f s, fused %.2f s, fused / TF "
        "per round %.3f" % (args.rounds, summary["tf"]["seconds_per_step"],
                            summary["fused"]["seconds_per_step"],
                            summary["fused"]["over_reference"]))
  common.save(args.out, "fused_geglu.json", {"machine": info, "exactness": errors,
                                              "elementwise_seconds": layer, "step": step})


if __name__ == "__main__":
  main()
