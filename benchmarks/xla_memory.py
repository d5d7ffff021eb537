"""bench-8k's training step compiled by XLA (the TPU path): each memory switch's memory in XLA's
own buffer assignment, beside the TF executor's peak RSS of benchmarks/train_memory.py.

    python benchmarks/xla_memory.py [--configs NAME,...] [--length 8192] [--chunk 1024]
        [--vocab 256] [--steps 0] [--timeout 7200] [--threads N] [--full_compile]
        [--keep_dump] [--executor_results FILE] [--out DIR] [--table]

Every configuration (`common.SWITCHES`, as benchmarks/train_memory.py and peers.py: the plain
"routing" step, recompute_attention, recompute_layers, logits_chunk_size, the three together,
bfloat16 activations) runs in its own process, which builds bench-8k's whole training step as
benchmarks/train_step.py does (the T2T model's loss, T2T's `optimize` with Adafactor, the
global step's increment: one step of a TPU training loop) inside `tf.xla.experimental.compile`
(one XLA computation, as TPUEstimator's `tpu.rewrite`; it fails on any op XLA cannot compile),
runs it once in a session with XLA_FLAGS=--xla_dump_to=<temporary directory>
--xla_dump_hlo_as_text, and reads the buffer assignment XLA's CPU compiler dumps
(*buffer-assignment.txt): "Total bytes used" (every buffer the compiled step holds at once:
XLA's peak for the step) split into parameters (the variables and Adafactor's slots read, the
targets), outputs (the updated variables and slots, the loss: on a TPU they alias the
parameters), constants, thread-local and temporary buffers (activations, gradients, workspace:
what the memory switches act on; the temporaries share one buffer, sized by XLA's schedule to
what is live at once). One replica: the k-means statistics' cross-replica sum is the identity
(CrossReplicaSum has no CPU kernel).

XLA's CPU compiler stands in for the TPU's: the same HLO from the same TF graph, but its own
fusion, layouts and scheduling, and no rematerialisation pass, so the absolute bytes are the
CPU's; the ratios between configurations are what this measures (whether a switch's
recomputation survives XLA's passes). LLVM's optimisations are off (FAST_LLVM: the same buffer
assignment, a seventh of the compilation time, a slower step; --full_compile turns them on).
"compile" is the time from XLA's first dump file to its last (HLO passes, buffer assignment,
LLVM); the first run also lowers the graph to HLO and executes the step once; --steps N times
N more executions. A configuration whose training step fails to compile or run is measured
again as its loss and gradients without the optimizer's update (the record's "compiled" and the
table say so; no ratio against a whole step).

Prints one JSON line per configuration, a table with ratios against "routing" (plain), the TF
executor's peak RSS of the same configurations from --executor_results (benchmarks/results/
train_memory.json, written by benchmarks/train_memory.py, when present and --length is 8192) in
the same table, and writes benchmarks/results/xla_memory.json. --table prints the table again
from that file and the current train_memory.json without compiling anything.
"""
import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # pylint: disable=g-import-not-at-top,wrong-import-position
import train_memory  # pylint: disable=g-import-not-at-top,wrong-import-position

LENGTH = 8192
CONFIGS = train_memory.CONFIGS  # the TF executor's measurement's configurations
BASE = common.PLAIN
BUFFER_ASSIGNMENT = "*buffer-assignment.txt"
ALLOCATION = re.compile(r"^allocation \d+: size (\d+)(.*)$")
TOTAL = re.compile(r"^Total bytes used: (\d+)")
INSTRUCTION = re.compile(r"^\s+(?:ROOT )?%?[\w.\-]+ = \S+ ([\w\-]+)\(")  # name = shape op(...
HLO_STAGES = {"before": "before_optimizations.txt", "after": "after_optimizations.txt"}
KINDS = ("parameter", "output", "constant", "thread_local", "temp")
MIB = 2.0 ** 20
# LLVM without its optimisation passes: the buffer assignment comes before LLVM (the same bytes:
# test_xla_memory.py checks, and so did bench-8k's step at length 1024), and LLVM's passes took
# 134 of the 152 s of that step's compilation on 2 cores (its execution: 6.6 s, 28 s without).
FAST_LLVM = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


# --- XLA's buffer assignment --------------------------------------------------------------------

def allocation_kind(flags):
  """The kind (one of KINDS) of a buffer-assignment allocation from the text after its size:
  an entry parameter (also when the output aliases it), a constant, an output of the computation
  (maybe-live-out), a thread-local buffer, or a temporary one (preallocated-temp and the rest)."""
  if re.search(r"\bparameter \d+", flags):
    return "parameter"
  if "constant" in flags:
    return "constant"
  if "maybe-live-out" in flags:
    return "output"
  if "thread-local" in flags:
    return "thread_local"
  return "temp"


def parse_buffer_assignment(text):
  """{"total_bytes": XLA's "Total bytes used", "<kind>_bytes" for each of KINDS (summed over the
  allocations; together they make the total), "allocations": their count} of the text of one
  buffer-assignment dump. Raises ValueError when the text holds no "Total bytes used" line or
  the allocations do not add up to it."""
  sums = dict.fromkeys(KINDS, 0)
  total, count = None, 0
  for line in text.splitlines():
    m = ALLOCATION.match(line)
    if m:
      sums[allocation_kind(m.group(2))] += int(m.group(1))
      count += 1
      continue
    m = TOTAL.match(line)
    if m:
      total = int(m.group(1))
      break  # the allocations come first; what follows lists values
  if total is None:
    raise ValueError("no 'Total bytes used' line in the buffer assignment")
  if sum(sums.values()) != total:
    raise ValueError("the allocations add up to %d bytes, not the %d of 'Total bytes used'"
                     % (sum(sums.values()), total))
  out = {"total_bytes": total, "allocations": count}
  out.update(("%s_bytes" % kind, value) for kind, value in sums.items())
  return out


def hlo_counts(text):
  """(instructions, dot instructions) of an HLO module's text (every computation, fusions'
  included): a recomputation XLA keeps shows as more dots after its passes."""
  ops = [m.group(1) for m in map(INSTRUCTION.match, text.splitlines()) if m]
  return len(ops), ops.count("dot")


def dump_memory(dump_dir):
  """The parsed buffer assignments of every module XLA dumped to `dump_dir`, largest total
  first: [dict(parse_buffer_assignment(...), module=its name, compile_seconds=time from the
  module's first dump file (the HLO before XLA's passes) to its last (the object code),
  buffer_assignment_seconds=from the first to the buffer assignment (XLA's HLO passes),
  hlo_instructions_<stage> and hlo_dots_<stage> (`hlo_counts`) before and after XLA's
  passes)]."""
  modules = []
  for path in glob.glob(os.path.join(dump_dir, BUFFER_ASSIGNMENT)):
    with open(path) as f:
      record = parse_buffer_assignment(f.read())
    prefix = os.path.basename(path).split(".")[0]  # module_0000
    times = [os.path.getmtime(p) for p in glob.glob(os.path.join(dump_dir, prefix + ".*"))]
    name = os.path.basename(path)[len(prefix) + 1:].split(".")[0]
    record.update(module=name[:80], compile_seconds=max(times) - min(times),
                  buffer_assignment_seconds=os.path.getmtime(path) - min(times))
    for stage, suffix in HLO_STAGES.items():
      for hlo in glob.glob(os.path.join(dump_dir, prefix + ".*" + suffix)):
        if "buffer-assignment" not in hlo:
          with open(hlo) as f:
            record["hlo_instructions_" + stage], record["hlo_dots_" + stage] = hlo_counts(
                f.read())
    modules.append(record)
  modules.sort(key=lambda r: -r["total_bytes"])
  return modules


# --- the worker (one configuration in its own process) ------------------------------------------

def xla_worker(model, overrides, length, vocab, steps, threads, keep_dump=False,
               full_compile=False, gradients_only=False):
  """Builds bench-8k's training step inside tf.xla.experimental.compile, runs it once (and
  `steps` more times, timed), and returns its record with XLA's buffer assignment;
  `full_compile`: LLVM's optimisations on (FAST_LLVM otherwise); `gradients_only`: the loss and
  its gradients without the optimizer's update (the record's "compiled" says which)."""
  dump = tempfile.mkdtemp(prefix="xla_memory_")
  os.environ["XLA_FLAGS"] = " ".join(x for x in (
      os.environ.get("XLA_FLAGS", ""), "" if full_compile else FAST_LLVM,
      "--xla_dump_to=%s --xla_dump_hlo_as_text" % dump) if x)
  try:
    record = measure_step(model, overrides, length, vocab, steps, threads, gradients_only, dump)
  finally:
    if not keep_dump:
      shutil.rmtree(dump, ignore_errors=True)
  if keep_dump:
    record["dump_dir"] = dump
  return record


def measure_step(model, overrides, length, vocab, steps, threads, gradients_only, dump):
  """xla_worker's measurement, XLA dumping to `dump`."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  common.start("xla_memory_worker", length=length)
  import train_step  # pylint: disable=g-import-not-at-top
  from routing_transformer.t2t import model as model_lib  # pylint: disable=g-import-not-at-top
  from tensor2tensor.data_generators import problem_hparams  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import optimize  # pylint: disable=g-import-not-at-top
  tf1 = tf.compat.v1
  tf.config.threading.set_intra_op_parallelism_threads(threads)
  # One replica: the k-means statistics' sum over replicas is the identity.
  model_lib.cross_replica_sum = lambda counts, sums: (counts, sums)
  hparams = train_step.model_hparams(model, length, overrides)
  record = {"record": "point", "model": model, "overrides": overrides, "length": length,
            "vocab": vocab, "threads": threads, "tensorflow": tf.__version__,
            "xla_flags": os.environ["XLA_FLAGS"].replace(dump, "<dump>"),
            "compiled": "loss and gradients" if gradients_only else "training step"}
  graph = tf.Graph()
  with graph.as_default():
    tf1.train.get_or_create_global_step()
    p_hparams = problem_hparams.test_problem_hparams(vocab, vocab, hparams)
    targets = tf1.placeholder(tf.int32, [1, length, 1, 1])

    def model_loss(targets):
      net = model_lib.RoutingTransformer(hparams, tf.estimator.ModeKeys.TRAIN, p_hparams)
      _, losses = net.model_fn_sharded({"targets": [targets]})
      return losses["training"] + losses["extra_loss"]

    def training_step(targets):
      with tf1.variable_scope("", reuse=tf1.AUTO_REUSE):
        loss = model_loss(targets)
      if gradients_only:
        return [loss] + [tf.convert_to_tensor(g) for g in
                         tf1.gradients(loss, tf1.trainable_variables()) if g is not None]
      return optimize.optimize(loss, tf.constant(0.01), hparams, use_tpu=False)

    started = time.perf_counter()
    # The model's variables first, outside XLA's context (the k-means centroids' initial value
    # is a tensor, which a variable made inside it cannot take); the step reuses them.
    with tf1.variable_scope("", reuse=tf1.AUTO_REUSE):
      model_loss(targets)
    compiled = tf1.xla.experimental.compile(training_step, [targets])
    record["graph_build_seconds"] = time.perf_counter() - started
    record["parameters"] = sum(int(np.prod(v.shape)) for v in tf1.trainable_variables())
    sess = tf1.Session(graph=graph)
    sess.run(tf1.global_variables_initializer())
  feed = {targets: np.random.default_rng(0).integers(1, vocab, (1, length, 1, 1))}
  try:
    started = time.perf_counter()
    loss = sess.run(compiled, feed)
    record["first_run_seconds"] = time.perf_counter() - started  # compilation + one step
    record["loss"] = float(np.asarray(loss[0] if gradients_only else loss).reshape(-1)[0])
    if steps:
      record["seconds_per_step"] = common.median_time(lambda: sess.run(compiled, feed), steps)
    modules = dump_memory(dump)
    if not modules:
      raise ValueError("XLA dumped no buffer assignment to %s" % dump)
  except (tf.errors.OpError, ValueError) as e:
    record.update(status="failed", error=str(e).strip().splitlines()[0][:600])
    return record
  record.update(modules[0], status="ok", modules=len(modules),
                peak_rss_mb=common.peak_rss_mb())
  return record


# --- the parent ---------------------------------------------------------------------------------

def run_worker(args, name, gradients_only=False):
  """One configuration in a new process (killed after --timeout seconds); its record."""
  overrides = train_memory.overrides_of(name, args.chunk, args.length)
  command = [sys.executable, os.path.abspath(__file__), "--worker", "--model", CONFIGS[name][0],
             "--overrides", json.dumps(overrides, sort_keys=True),
             "--length", str(args.length), "--vocab", str(args.vocab), "--steps",
             str(args.steps), "--threads", str(args.threads)] + (
                 ["--keep_dump"] if args.keep_dump else []) + (
                     ["--full_compile"] if args.full_compile else []) + (
                         ["--gradients_only"] if gradients_only else [])
  started = time.time()
  try:
    proc = subprocess.run(command, capture_output=True, text=True, cwd=HERE,
                          timeout=args.timeout, check=False)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
    record = json.loads(lines[-1]) if lines else {}
    if record.get("record") != "point":
      record = {"record": "point", "status": "failed", "returncode": proc.returncode,
                "error": " | ".join(proc.stderr.strip().splitlines()[-3:])[:600]}
  except subprocess.TimeoutExpired:
    record = {"record": "point", "status": "timeout"}
  record.update(config=name, wall_seconds=time.time() - started)
  return record


def executor_peaks(path, vocab, chunk):
  """({config: peak RSS MiB} of the ok bench-8k records of train_memory.py's results file,
  its machine record, None) when the file exists and measured the same vocab and chunk, else
  ({}, None, why not)."""
  if not path or not os.path.exists(path):
    return {}, None, "no %s: `make bench-memory BENCH_ARGS=\"--part 8k\"` writes it" % path
  with open(path) as f:
    payload = json.load(f)
  machine = payload.get("machine", {})
  if (machine.get("vocab"), machine.get("chunk")) != (vocab, chunk):
    return {}, None, "%s measured vocab %s, chunk %s, not %s, %s" % (
        path, machine.get("vocab"), machine.get("chunk"), vocab, chunk)
  peaks = {name: r["peak_rss_mb"] for name, r in payload.get("bench_8k", {}).items()
           if r.get("status") == "ok"}
  return peaks, machine, None


def compiled(record):
  """What a record's XLA computation holds: "training step" or "loss and gradients"."""
  return record.get("compiled", "training step")


def ratios(results, executor):
  """XLA total and temporary bytes, and the executor's peak RSS, of every configuration over
  the plain step's ("routing")."""
  ok = {name: r for name, r in results.items() if r["status"] == "ok"}
  out = {}
  base = BASE
  for name in results:
    if name == base:
      continue
    if name in ok and base in ok and compiled(ok[name]) == compiled(ok[base]):
      for field in ("total_bytes", "temp_bytes"):
        out["xla_%s_%s_over_%s" % (field[:-6], name, base)] = (
            ok[name][field] / max(ok[base][field], 1))
    if name in executor and base in executor:
      out["executor_peak_rss_%s_over_%s" % (name, base)] = executor[name] / executor[base]
  return out


def relative(r, base, field):
  """r[field] / base[field] as text, "1 (=)" when r's buffer assignment has base's bytes and
  allocations exactly (XLA compiled the switch away), "-" without an ok base."""
  if base.get("status") != "ok" or compiled(r) != compiled(base):
    return "-"
  keys = ["allocations"] + [k + "_bytes" for k in KINDS]
  if r is base:
    return "1"
  if all(r[k] == base[k] for k in keys):
    return "1 (=)"
  return "%.2f" % (r[field] / base[field])


def print_table(results, executor, executor_source, length):
  """The table: per configuration XLA's total and temporary bytes (and their ratios to
  "routing"'s), parameters, outputs, compile time, and the executor's peak RSS and its ratio."""
  base, rss_base = results.get(BASE, {}), executor.get(BASE)
  print("\nbench-8k training step at length %d: XLA's buffer assignment (CPU compiler, whole "
        "step) and the TF executor's peak process RSS (%s)" % (length, executor_source))
  print("\n| configuration | XLA total | vs routing | XLA temp | vs routing | parameters | "
        "outputs | dots before / after XLA's passes | compile | executor peak RSS | vs routing |"
        "\n|---|---|---|---|---|---|---|---|---|---|---|")
  for name, r in results.items():
    rss = executor.get(name)
    rss_cells = ("%.2f GiB" % (rss / 1024.0), "%.2f" % (rss / rss_base) if rss_base else "-") \
        if rss else ("-", "-")
    if r["status"] != "ok":
      print("| %s | %s | | | | | | | | %s | %s |" % ((name, r["status"]) + rss_cells))
      continue
    rel = {f: relative(r, base, f) for f in ("total_bytes", "temp_bytes")}
    what = compiled(r)
    dots = "%s / %s" % (r.get("hlo_dots_before", "?"), r.get("hlo_dots_after", "?"))
    print("| %s | %.0f MiB | %s | %.0f MiB | %s | %.0f MiB | %.0f MiB | %s | %.0f s | %s | %s |"
          % (name + ("" if what == "training step" else " (%s)" % what), r["total_bytes"] / MIB,
             rel["total_bytes"], r["temp_bytes"] / MIB, rel["temp_bytes"],
             r["parameter_bytes"] / MIB, r["output_bytes"] / MIB, dots, r["compile_seconds"],
             rss_cells[0], rss_cells[1]))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--configs", default=",".join(CONFIGS),
                      help="comma-separated configurations: " + ", ".join(CONFIGS))
  parser.add_argument("--length", type=int, default=LENGTH, help="sequence length (bench-8k: "
                      "8192; e.g. 1024 for a quick check)")
  parser.add_argument("--chunk", type=int, default=train_memory.CHUNK,
                      help="logits_chunk_size of the *_chunked configurations")
  parser.add_argument("--vocab", type=int, default=256)
  parser.add_argument("--steps", type=int, default=0, help="timed runs of the compiled step "
                      "after the first (0: none)")
  parser.add_argument("--timeout", type=float, default=7200.0,
                      help="seconds per configuration before its process is killed")
  parser.add_argument("--threads", type=int, default=os.cpu_count())
  parser.add_argument("--executor_results",
                      default=os.path.join(HERE, "results", "train_memory.json"),
                      help="train_memory.py's results, for the executor's peak RSS column")
  parser.add_argument("--keep_dump", action="store_true",
                      help="keep each configuration's XLA dump directory (printed)")
  parser.add_argument("--full_compile", action="store_true", help="LLVM's optimisation "
                      "passes on (slower compilation, faster --steps; the same buffer bytes)")
  parser.add_argument("--out", default=os.path.join(HERE, "results"))
  parser.add_argument("--table", action="store_true", help="compile nothing: the table again "
                      "from --out's xla_memory.json and --executor_results (e.g. after "
                      "`make bench-memory`)")
  parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  parser.add_argument("--gradients_only", action="store_true", help=argparse.SUPPRESS)
  parser.add_argument("--model", help=argparse.SUPPRESS)
  parser.add_argument("--overrides", default="{}", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.worker:
    print(json.dumps(xla_worker(args.model, json.loads(args.overrides), args.length, args.vocab,
                                args.steps, args.threads, args.keep_dump, args.full_compile,
                                args.gradients_only)))
    return
  names = [n.strip() for n in args.configs.split(",") if n.strip()]
  unknown = [n for n in names if n not in CONFIGS]
  if unknown:
    sys.exit("xla_memory: unknown --configs %s; choose from %s" % (unknown, ", ".join(CONFIGS)))
  if args.table:
    with open(os.path.join(args.out, "xla_memory.json")) as f:
      payload = json.load(f)
    info, results = payload["machine"], payload["results"]
    args.length, args.vocab, args.chunk = info["length"], info["vocab"], info["chunk"]
  else:
    info = common.start("xla_memory", length=args.length, vocab=args.vocab, chunk=args.chunk,
                        threads_used=args.threads)
    results = {}
    for name in names:
      results[name] = run_worker(args, name)
      if results[name]["status"] == "failed":  # e.g. an op XLA cannot compile in the update
        common.emit(dict(results[name], retry="loss and gradients"))
        results[name] = run_worker(args, name, gradients_only=True)
      common.emit(results[name])
  if args.length == train_memory.LENGTH_8K:
    executor, executor_machine, why_not = executor_peaks(args.executor_results, args.vocab,
                                                         args.chunk)
  else:
    executor, executor_machine, why_not = {}, None, "train_memory.py measures length 8192"
  executor = {k: v for k, v in executor.items() if k in results}
  source = ("none: " + why_not if why_not else "%s, %s, length 8192" % (
      args.executor_results, executor_machine.get("date")))
  ratio = dict(ratios(results, executor), record="ratio")
  common.emit(ratio)
  print_table(results, executor, source, args.length)
  common.save(args.out, "xla_memory.json", {"machine": info, "results": results,
                                            "executor_peak_rss_mb": executor,
                                            "executor_machine": executor_machine,
                                            "ratio": ratio})


if __name__ == "__main__":
  common.ensure_bench_env()
  main()
