"""Shared benchmark helpers: peak tensor memory, timing, same-run matmul roofline, JSON output."""
import collections
import json
import os
import platform
import re
import statistics
import sys
import time

# TF's BFC allocator on the CPU keeps peak-bytes-in-use statistics (the default CPU allocator keeps
# none); the variable is read at start-up, so benchmarks re-exec themselves once with it set.
# BENCH_TF_ALLOCATOR=default selects TF's default CPU allocator instead (what a user's process
# gets; peers.py --tf-allocator), for comparisons of process RSS, which BFC raises.
BENCH_ENV = {"TF_CPU_ALLOCATOR_USE_BFC": "true", "TF_CPP_MIN_LOG_LEVEL": "2"}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# bench-8k's memory switches, measured alike by peers.py and train_memory.py (peak RSS under TF's
# executor, each in its own process) and xla_memory.py (XLA's buffer assignment): name -> hparams
# overrides of benchmarks/train_step.py's "routing" model ("chunk": the logits chunk size,
# "ffn_chunk": the feed-forward chunk size).
LOGITS_CHUNK = 1024
FFN_CHUNK = 2048  # ffn_chunk_size: 4 chunks of bench-8k's 8,192 positions
PLAIN = "routing"
SWITCHES = {
    PLAIN: {},  # the plain step
    "routing_attention_recompute": {"recompute_attention": True},
    "routing_recompute": {"recompute_layers": True},
    "routing_chunked": {"logits_chunk_size": "chunk"},
    "routing_ffn_chunked": {"ffn_chunk_size": "ffn_chunk"},
    "routing_recompute_ffn_chunked": {"recompute_layers": True, "ffn_chunk_size": "ffn_chunk"},
    "routing_recompute_attention_ffn_chunked": {
        "recompute_layers": True, "recompute_attention": True, "ffn_chunk_size": "ffn_chunk"},
    "routing_recompute_chunked_attention": {  # every switch
        "recompute_layers": True, "recompute_attention": True, "logits_chunk_size": "chunk",
        "ffn_chunk_size": "ffn_chunk"},
    "routing_bf16": {"activation_dtype": "bfloat16"},
}


def switch_overrides(name, chunk=LOGITS_CHUNK, ffn_chunk=FFN_CHUNK):
  """The hparams overrides of SWITCHES[name] with "chunk" and "ffn_chunk" replaced."""
  sizes = {"chunk": chunk, "ffn_chunk": ffn_chunk}
  return {k: sizes.get(v, v) if isinstance(v, str) else v for k, v in SWITCHES[name].items()}


def switch_table(peaks_mb, port_mb=None, chunk=LOGITS_CHUNK):
  """Markdown lines: per switch of `peaks_mb` ({name: bench-8k peak RSS in MiB}) its hparams,
  peak, and ratios to the plain step's peak and to the PyTorch port's `port_mb` ("-" without)."""
  plain = peaks_mb.get(PLAIN)
  lines = ["\n| switch | hparams | peak RSS | / plain step | / PyTorch port |",
           "|---|---|---|---|---|"]
  for name, mb in peaks_mb.items():
    hparams = ", ".join("%s=%s" % kv for kv in sorted(switch_overrides(name, chunk).items()))
    lines.append("| %s | %s | %.2f GiB | %s | %s |" % (
        name, hparams or "(plain)", mb / 1024.0, "%.2f" % (mb / plain) if plain else "-",
        "%.2f" % (mb / port_mb) if port_mb else "-"))
  return lines


def bench_env():
  """BENCH_ENV, with TF_CPU_ALLOCATOR_USE_BFC=false when BENCH_TF_ALLOCATOR=default."""
  env = dict(BENCH_ENV)
  if os.environ.get("BENCH_TF_ALLOCATOR") == "default":
    env["TF_CPU_ALLOCATOR_USE_BFC"] = "false"
  return env


def ensure_bench_env():
  """Re-executes the current script with `bench_env()` set (once); puts the repo on sys.path."""
  wanted = bench_env()
  if all(os.environ.get(k) == v for k, v in wanted.items()):
    if ROOT not in sys.path:
      sys.path.insert(0, ROOT)
    return
  env = dict(os.environ, **wanted)
  os.execve(sys.executable, [sys.executable] + sys.argv, env)


def enable_cpu_xla_autoclustering():
  """Sets TF_XLA_FLAGS=--tf_xla_cpu_global_jit, without which a session's global_jit_level
  clusters nothing on the CPU; read when TensorFlow starts, so call it before importing TF."""
  os.environ["TF_XLA_FLAGS"] = " ".join(
      x for x in (os.environ.get("TF_XLA_FLAGS", ""), "--tf_xla_cpu_global_jit") if x)


def median_time(fn, steps, warmup=0):
  """Median wall seconds of `steps` calls of fn() after `warmup` untimed calls."""
  for _ in range(warmup):
    fn()
  times = []
  for _ in range(steps):
    t = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t)
  times.sort()
  return times[len(times) // 2]


def interleaved_times(fns, rounds, warmup=0, clock=time.perf_counter):
  """{name: [wall seconds per round]} of the callables {name: fn} timed side by side in one
  process: each of `rounds` rounds calls every fn once, in the dict's order in even rounds and
  in reverse in odd ones, so a drift of the machine's speed reaches every fn alike; `warmup`
  untimed rounds first. Ratios of these times resolve differences that the run-to-run spread
  between processes (a few percent on the 2-core machines here) hides."""
  names = list(fns)
  times = {name: [] for name in names}
  for r in range(warmup + rounds):
    for name in (names if r % 2 == 0 else names[::-1]):
      started = clock()
      fns[name]()
      if r >= warmup:
        times[name].append(clock() - started)
  return times


def interleaved_summary(times, reference):
  """From `interleaved_times`' {name: [seconds]}: {name: {"seconds_per_step": median,
  "over_reference": median over rounds of the round's time / `reference`'s in the same round}}."""
  summary = {}
  for name, seconds in times.items():
    ratios = [s / r for s, r in zip(seconds, times[reference])]
    summary[name] = {"seconds_per_step": statistics.median(seconds),
                     "over_reference": statistics.median(ratios)}
  return summary


def peak_bytes(fn):
  """Peak TF tensor bytes in use while fn() runs, above what was in use before; None (fn still
  run) where the CPU allocator keeps no statistics: TF's default allocator without oneDNN, as on
  an AVX2-only CPU (BFC, TF_CPU_ALLOCATOR_USE_BFC=true, always keeps them)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  try:
    tf.config.experimental.reset_memory_stats("CPU:0")
  except ValueError:  # "Cannot reset memory stats for device"
    fn()
    return None
  before = tf.config.experimental.get_memory_info("CPU:0")["current"]
  fn()
  return tf.config.experimental.get_memory_info("CPU:0")["peak"] - before


def time_fn(fn, repeats=3, warmup=1, max_seconds=60.0):
  """Median wall time of fn() (which must block until done) and its peak TF memory in bytes
  (None without allocator statistics, `peak_bytes`)."""
  for _ in range(warmup):
    fn()
  peak = peak_bytes(fn)
  times = []
  started = time.perf_counter()
  for _ in range(repeats):
    t = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t)
    if time.perf_counter() - started > max_seconds:
      break
  times.sort()
  return times[len(times) // 2], peak


def matmul_gflops(size=2048, repeats=5, dtype="float32"):
  """Dense matmul GFLOP/s (fp32 unless `dtype`) on this machine, measured now (the same-run
  roofline)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  a = tf.cast(tf.random.normal([size, size]), dtype)
  b = tf.cast(tf.random.normal([size, size]), dtype)
  fn = tf.function(lambda: tf.reduce_sum(tf.matmul(a, b)))
  seconds, _ = time_fn(lambda: fn().numpy(), repeats=repeats)
  return 2.0 * size ** 3 / seconds / 1e9


RATE_FIELDS = ("gflops", "gflops_bfloat16")  # the rates of a matmul record
STEADY_SPREAD = 0.85  # start/end matmul rates further apart than this: the machine was disturbed


def steady_matmul_rate(start, end):
  """One framework's dense matmul rate for an invocation measured at its start and at its end:
  each rate of RATE_FIELDS the higher of the two (a transient slowdown of a shared machine halved
  one short measurement on 2026-11-27 and would have inflated every utilisation of that run),
  both kept as "<rate>_start" / "<rate>_end", and "spread" = lower / higher of the fp32 rates (1:
  steady; below STEADY_SPREAD: "steady" False, the run's times may be disturbed too).

  Args:
    start, end: matmul records (dicts with at least "gflops").
  Returns:
    a copy of `start` with those fields.
  """
  out = dict(start)
  for field in RATE_FIELDS:
    if field in start and field in end:
      out[field] = max(start[field], end[field])
      out[field + "_start"], out[field + "_end"] = start[field], end[field]
  out["spread"] = min(start["gflops"], end["gflops"]) / max(start["gflops"], end["gflops"])
  out["steady"] = out["spread"] >= STEADY_SPREAD
  return out


def unsteady_warning(rates):
  """The warning line for the rates of {framework: `steady_matmul_rate` record} that are not
  steady, or None when all are."""
  unsteady = [name for name, rate in rates.items() if not rate["steady"]]
  if not unsteady:
    return None
  return ("WARNING: the %s matmul rate moved between the start and the end of this run (lower / "
          "higher %s, below %.2f): the machine was disturbed; its step times may be too" % (
              " and ".join(unsteady), " and ".join("%.2f" % rates[n]["spread"] for n in unsteady),
              STEADY_SPREAD))


def cpu_model():
  """The CPU model name (/proc/cpuinfo "model name", else lscpu "Model name", else platform)."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.lower().startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  try:
    import subprocess  # pylint: disable=g-import-not-at-top
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    for line in out.splitlines():
      if line.strip().lower().startswith("model name"):
        return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def cpu_flag(flag):
  """Whether /proc/cpuinfo lists `flag` (e.g. avx512_bf16); None where unreadable."""
  try:
    with open("/proc/cpuinfo") as f:
      return any(line.startswith("flags") and flag in line.split() for line in f)
  except OSError:
    return None


def proc_status_kib(field):
  """A field of /proc/self/status (VmRSS, VmHWM) in KiB; 0 where unreadable."""
  try:
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith(field + ":"):
          return int(line.split()[1])
  except OSError:
    pass
  return 0


def peak_rss_mb():
  """Peak resident set size of this process in MiB: ru_maxrss (and VmHWM where /proc has it;
  the larger of the two, which agree on Linux)."""
  import resource  # pylint: disable=g-import-not-at-top
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux
  return max(peak, proc_status_kib("VmHWM") / 1024.0)


def rss_mb():
  """Current resident set size of this process in MiB (VmRSS; 0 where /proc is unreadable)."""
  return proc_status_kib("VmRSS") / 1024.0


SIMD_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16")  # what sets matmul rates


def simd_flags():
  """Which of SIMD_FLAGS /proc/cpuinfo lists, e.g. "avx2 fma avx512f" ("unknown": unreadable)."""
  if cpu_flag(SIMD_FLAGS[0]) is None:
    return "unknown"
  return " ".join(flag for flag in SIMD_FLAGS if cpu_flag(flag)) or "none"


def machine():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "cpu_model": cpu_model(),
          "simd": simd_flags(),
          "processor": platform.processor() or platform.machine(), "tensorflow": tf.__version__,
          "threads": tf.config.threading.get_intra_op_parallelism_threads()}


def start(benchmark, **config):
  """Puts the repo on sys.path, imports routing_transformer (TF2 fixes), emits and returns the
  machine record of a benchmark run."""
  if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
  import routing_transformer  # pylint: disable=g-import-not-at-top,unused-import
  info = machine()
  info.update(benchmark=benchmark, **config)
  emit(dict(info, record="machine"))
  return info


def save(out_dir, filename, payload):
  """Writes payload as indented JSON to out_dir/filename (creating out_dir)."""
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, filename), "w") as f:
    json.dump(payload, f, indent=1)


def emit(record, stream=sys.stdout):
  stream.write(json.dumps(record, sort_keys=True) + "\n")
  stream.flush()


def fit_exponent(ns, times):
  """Least-squares slope of log(time) against log(n)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  if len(ns) < 2:
    return None
  return float(np.polyfit(np.log(ns), np.log(times), 1)[0])


# --- a traced step's op time; what the backward pass reads (kept_for_backward) -------------------

def op_times(step_stats, top=12):
  """{"by_op": [(op type, ms)], "by_part": {forward/backward/optimizer: ms}, "mb_by_op": [(op
  type, MB of outputs allocated)], "total_ms", "total_mb"} summed over the compute threads of
  one traced step (time sums exceed wall time when ops run in parallel); `top=None`: every op
  type."""
  by_op, by_part, mb_by_op = collections.Counter(), collections.Counter(), collections.Counter()
  for device in step_stats.dev_stats:
    for node in device.node_stats:
      ms = (node.all_end_rel_micros or node.op_end_rel_micros) / 1000.0
      name = node.node_name
      op = node.timeline_label.split("(")[0].split("= ")[-1].strip() if node.timeline_label \
          else name
      by_op[op] += ms
      part = ("backward" if "gradients" in name else
              "optimizer" if name.startswith("training/") else "forward")
      by_part[part] += ms
      mb_by_op[op] += sum(o.tensor_description.allocation_description.requested_bytes
                          for o in node.output) / 2.0 ** 20
  return {"by_op": [(k, round(v, 2)) for k, v in by_op.most_common(top)],
          "by_part": {k: round(v, 2) for k, v in by_part.items()},
          "mb_by_op": [(k, round(v, 1)) for k, v in mb_by_op.most_common(top)],
          "total_ms": round(sum(by_op.values()), 2), "total_mb": round(sum(mb_by_op.values()), 1)}


GRADIENT = re.compile(r"(^|/)gradients(_\d+)?/")
# Ops whose output is (a view of) their first input, or of input value_index for IdentityN.
VIEWS = ("Identity", "IdentityN", "Reshape", "Squeeze", "ExpandDims", "StopGradient",
         "Snapshot", "PreventGradient")
# Ops whose outputs live beyond a step (variables, constants, feeds): not part of its peak.
PERSISTENT = ("VarHandleOp", "ReadVariableOp", "VariableV2", "Variable", "Const", "HostConst",
              "Placeholder", "PlaceholderWithDefault", "_Arg", "_Recv", "_HostRecv")


def needed_ops(fetches):
  """Names of the ops the fetches depend on (data and control inputs): what a step runs."""
  seen, stack = set(), [f.op if hasattr(f, "op") else f for f in fetches]
  while stack:
    op = stack.pop()
    if op.name in seen:
      continue
    seen.add(op.name)
    stack.extend(t.op for t in op.inputs)
    stack.extend(op.control_inputs)
  return seen


def buffer_of(t):
  """The tensor whose buffer t is (through VIEWS)."""
  while t.op.type in VIEWS:
    t = t.op.inputs[t.value_index if t.op.type == "IdentityN" else 0]
  return t


def tensor_bytes(t):
  """Bytes of t from its static shape, None when the shape is not fully defined."""
  if not t.shape.is_fully_defined() or t.dtype.base_dtype.size == 0:
    return None
  return t.shape.num_elements() * t.dtype.base_dtype.size


def kept_for_backward(graph, fetches):
  """({buffer tensor name: (bytes, op name, op type, shape)} of the forward tensors the step's
  gradient ops read, bytes of the variables / constants they read, count of tensors read
  without static shapes)."""
  needed = needed_ops(fetches)
  kept, persistent, unknown = {}, {}, set()
  for op in graph.get_operations():
    if op.name not in needed or not GRADIENT.search(op.name):
      continue
    for t in op.inputs:
      if GRADIENT.search(t.op.name):
        continue
      base = buffer_of(t)
      if GRADIENT.search(base.op.name):
        continue
      nbytes = tensor_bytes(base)
      if nbytes is None:
        unknown.add(base.name)
      elif base.op.type in PERSISTENT:
        persistent[base.name] = nbytes
      else:
        kept[base.name] = (nbytes, base.op.name, base.op.type, base.shape.as_list())
  return kept, sum(persistent.values()), len(unknown)
