"""Training-step memory and utilisation (bench-8k variants) and the longest trainable length.

    python benchmarks/train_memory.py [--part all] [--steps 3] [--warmup 2] [--chunk 1024]
        [--configs NAME,...] [--models routing,local,full] [--lengths 16384,32768,65536]
        [--memory_gb 24] [--timeout 3600] [--vocab 256] [--threads N] [--out DIR]

Every configuration runs in its own process (a worker of this script), one after the other, and
reports the peak resident set size of its process (ru_maxrss / VmHWM, as benchmarks/peers.py),
its graph build time, its first step and its median step time. The invocation measures
TensorFlow's dense fp32 matmul rate (2048^3) in a process of its own at its start and at its end
and takes the higher (`common.steady_matmul_rate`, with a warning when they differ by more than
15%), so utilisation = useful FLOP/s (`useful_flops_per_token` of benchmarks/train_step.py x
tokens/s) / that rate is read against the same machine in the same run.

Part "8k" (bench-8k: length 8192, batch 1, vocab --vocab, the models of
benchmarks/train_step.py, the whole T2T training step with Adafactor): the configurations of
CONFIGS (`common.SWITCHES`, --configs picks some; benchmarks/peers.py and xla_memory.py measure
the same ones), each --warmup warm-up steps (the first included) and --steps timed steps
(median): the plain step, recompute_attention, recompute_layers, logits_chunk_size=--chunk, the
three together and activation_dtype=bfloat16 (the machine record says whether the CPU has
AVX512_BF16, without which bfloat16 matmuls are slow). The switch table gives each one's peak
RSS over the plain step's and over the PyTorch port's, read from --peer_results (the last
`make bench-peers`).

Part "lengths": for each model of --models (routing: 6 local + 2 routing heads, clusters of 512,
length / 512 of them; local: 8 local heads; full: 8 heads of dense causal attention), without
and with recompute_layers, the lengths of --lengths in increasing order at batch 1 (with
logits_chunk_size=--chunk): a length is trainable when one training step after the first
completes with the process's peak RSS within the memory limit. The worker's TF allocator is
capped at that limit (TF_CPU_BFC_MEM_LIMIT_IN_MB: a tensor beyond it raises an out-of-memory
error), and this process kills a worker whose RSS passes the limit or that runs past
--timeout seconds; the first length that fails ends that model's search. The limit is
--memory_gb (default 24 GB), lowered to the machine's available memory less 1 GiB when that is
smaller (the machine record says which limit applied). Part "8k" runs under the same limit.

Prints one JSON line per record, the tables and the ratios (against "routing": step time, peak
RSS), and writes benchmarks/results/train_memory.json.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # pylint: disable=g-import-not-at-top,wrong-import-position

LENGTH_8K = 8192
CHUNK = common.LOGITS_CHUNK
CONFIGS = {name: ("routing", overrides) for name, overrides in common.SWITCHES.items()}
LENGTH_MODELS = ("routing", "local", "full")
GIB = 2.0 ** 30


def overrides_of(config, chunk, length=LENGTH_8K):
  """The hparams overrides of a CONFIGS entry with "chunk" replaced by --chunk and "ffn_chunk"
  by a quarter of the length."""
  return common.switch_overrides(config, chunk, max(length // 4, 1))


def available_bytes():
  """MemAvailable of /proc/meminfo in bytes (None where unreadable)."""
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return None


def memory_limit(memory_gb):
  """(limit in bytes, how it was chosen): --memory_gb GB, or the available memory less 1 GiB."""
  wanted = int(memory_gb * 1e9)
  available = available_bytes()
  if available is not None and available - GIB < wanted:
    return int(available - GIB), "available memory %.1f GiB less 1 GiB" % (available / GIB)
  return wanted, "--memory_gb %g" % memory_gb


def rss_bytes(pid):
  """Current resident set size of process `pid` (0 once it is gone)."""
  try:
    with open("/proc/%d/status" % pid) as f:
      for line in f:
        if line.startswith("VmRSS:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return 0


# --- workers (each in its own process) ---------------------------------------------------------

def matmul_worker(threads):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.config.threading.set_intra_op_parallelism_threads(threads)
  return {"record": "matmul", "framework": "tensorflow", "version": tf.__version__,
          "threads": threads, "size": 2048, "gflops": common.matmul_gflops(2048)}


def step_worker(model, overrides, length, steps, warmup, threads, vocab):
  """Builds and times one training step configuration in this process."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import train_step  # pylint: disable=g-import-not-at-top
  common.start("train_memory_worker", length=length)
  tf.config.threading.set_intra_op_parallelism_threads(threads)  # read by tf1.Session too
  hparams = train_step.model_hparams(model, length, overrides)
  record = {"record": "point", "model": model, "overrides": overrides, "length": length,
            "vocab": vocab, "threads": threads, "tensorflow": tf.__version__,
            "useful_flops_per_token": train_step.useful_flops_per_token(hparams, vocab),
            "tf_cpu_bfc_mem_limit_mb": os.environ.get("TF_CPU_BFC_MEM_LIMIT_IN_MB", "")}
  try:
    started = time.perf_counter()
    run, params = train_step.build_train_step(model, length, overrides, vocab)
    record.update(graph_build_seconds=time.perf_counter() - started, parameters=params)
    started = time.perf_counter()
    run()  # the first step (graph optimisation, allocations)
    record["first_step_seconds"] = time.perf_counter() - started
    for _ in range(max(warmup - 1, 0)):
      run()
    seconds = common.median_time(run, steps)
  except tf.errors.ResourceExhaustedError as e:
    record.update(status="out_of_memory", error=str(e).strip().splitlines()[0][:300],
                  peak_rss_mb=common.peak_rss_mb())
    return record
  record.update(status="ok", seconds_per_step=seconds, tokens_per_sec=length / seconds,
                peak_rss_mb=common.peak_rss_mb(), steps=steps)
  return record


# --- the parent ---------------------------------------------------------------------------------

def run_worker(args, worker_args, limit):
  """Runs this script with --worker ... in a new process under the memory limit and --timeout;
  returns its record (the last JSON line), or a failure record if it was killed or crashed.
  Adds watched_peak_rss_mb (the largest RSS this process saw, polled every 0.1 s)."""
  command = [sys.executable, os.path.abspath(__file__), "--worker"] + [str(a) for a in
                                                                      worker_args]
  env = dict(os.environ, TF_CPU_BFC_MEM_LIMIT_IN_MB=str(limit // 2 ** 20))
  with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
    started = time.time()
    proc = subprocess.Popen(command, stdout=out, stderr=err, cwd=HERE, env=env, text=True)
    peak, killed = 0, None
    while proc.poll() is None:
      rss = rss_bytes(proc.pid)
      peak = max(peak, rss)
      if rss > limit:
        killed = "over_memory_limit"
      elif time.time() - started > args.timeout:
        killed = "timeout"
      if killed:
        proc.kill()
        proc.wait()
        break
      time.sleep(0.1)
    out.seek(0)
    err.seek(0)
    lines = [l for l in out.read().splitlines() if l.startswith("{")]
    stderr = err.read().strip().splitlines()
  record = json.loads(lines[-1]) if lines and not killed and proc.returncode == 0 else None
  if record is None or record.get("record") == "machine":
    record = {"record": "point", "status": killed or "failed", "returncode": proc.returncode,
              "error": " | ".join(stderr[-3:])[:600] if not killed else ""}
  record["watched_peak_rss_mb"] = peak / 2.0 ** 20
  record["wall_seconds"] = time.time() - started
  return record


def step_args(args, model, overrides, length, steps, warmup):
  return ["step", "--model", model, "--overrides", json.dumps(overrides, sort_keys=True),
          "--length", length, "--steps", steps, "--warmup", warmup, "--threads", args.threads,
          "--vocab", args.vocab]


def part_8k(args, limit):
  """bench-8k: every configuration of --configs; returns {config: record}."""
  names = [n.strip() for n in args.configs.split(",") if n.strip()]
  results = {}
  for name in names:
    model = CONFIGS[name][0]
    record = run_worker(args, step_args(args, model, overrides_of(name, args.chunk), LENGTH_8K,
                                        args.steps, args.warmup), limit)
    record.update(part="8k", config=name)
    common.emit(record)
    results[name] = record
  return results


def part_lengths(args, limit):
  """The longest trainable length per model, without and with recompute_layers; returns
  (records, {"<model>[_recompute]": longest trainable length or 0})."""
  lengths = sorted(int(n) for n in args.lengths.split(",") if n.strip())
  records, longest = [], {}
  for model in [m.strip() for m in args.models.split(",") if m.strip()]:
    for recompute in (False, True):
      key = model + ("_recompute" if recompute else "")
      longest[key] = 0
      for length in lengths:
        overrides = {"logits_chunk_size": args.chunk} if args.chunk else {}
        if recompute:
          overrides["recompute_layers"] = True
        record = run_worker(args, step_args(args, model, overrides, length, 1, 1), limit)
        record.update(part="lengths", config=key, length=length)
        fits = record["status"] == "ok" and record["peak_rss_mb"] * 2 ** 20 <= limit
        record["trainable"] = fits
        common.emit(record)
        records.append(record)
        if not fits:
          break
        longest[key] = length
  return records, longest


def add_utilisation(records, roof):
  """Sets "utilisation" (useful FLOP/s over `roof` GFLOP/s) on every ok record."""
  for record in records:
    if record["status"] == "ok":
      record["utilisation"] = (record["tokens_per_sec"] * record["useful_flops_per_token"] /
                               (roof * 1e9))


def ratios_8k(results):
  """Step time and peak RSS of every ok configuration over the plain step's."""
  ok = {name: r for name, r in results.items() if r["status"] == "ok"}
  out = {}
  if common.PLAIN in ok:
    base = ok[common.PLAIN]
    for name in ok:
      if name != common.PLAIN:
        out["time_%s_over_%s" % (name, common.PLAIN)] = (ok[name]["seconds_per_step"] /
                                                         base["seconds_per_step"])
        out["peak_rss_%s_over_%s" % (name, common.PLAIN)] = (ok[name]["peak_rss_mb"] /
                                                             base["peak_rss_mb"])
  return out


def port_peak(path, vocab):
  """(the PyTorch port's bench-8k peak RSS in MiB from peers.py's results `path`, where from),
  or (None, why not) when the file is missing or measured another length."""
  if not path or not os.path.exists(path):
    return None, "no %s (`make bench-peers` writes it)" % path
  with open(path) as f:
    payload = json.load(f)
  machine = payload.get("machine", {})
  if machine.get("length") != LENGTH_8K:
    return None, "%s measured length %s" % (path, machine.get("length"))
  return payload["peer"]["peak_rss_mb"], "%s, %s, vocab 256 (ours: %d)" % (
      path, machine.get("date"), vocab)


def print_tables(info, matmul, results, records, longest, port=(None, "")):
  print("\n%s (AVX512_BF16: %s), %d threads, %s; TensorFlow dense fp32 matmul 2048^3: %.0f "
        "GFLOP/s (the higher of %.0f at the start and %.0f at the end); memory limit %.1f GiB "
        "(%s)" % (
            info["cpu_model"], {True: "yes", False: "no"}.get(info["avx512_bf16"], "unknown"),
            info["threads_used"], info["date"], matmul["gflops"], matmul["gflops_start"],
            matmul["gflops_end"], info["memory_limit_gib"], info["memory_limit_from"]))
  warning = common.unsteady_warning({"tensorflow": matmul})
  if warning:
    print(warning)
  if results:
    print("\n| bench-8k configuration | s/step | tokens/s | peak process RSS | utilisation | "
          "graph build | first step |\n|---|---|---|---|---|---|---|")
    for name, r in results.items():
      if r["status"] != "ok":
        print("| %s | %s | | | | | |" % (name, r["status"]))
        continue
      print("| %s | %.2f | %.0f | %.2f GiB | %.2f | %.0f s | %.0f s |" % (
          name, r["seconds_per_step"], r["tokens_per_sec"], r["peak_rss_mb"] / 1024.0,
          r["utilisation"], r["graph_build_seconds"], r["first_step_seconds"]))
    peaks = {name: r["peak_rss_mb"] for name, r in results.items() if r["status"] == "ok"}
    print("\nEach switch's bench-8k peak RSS under TF's executor (PyTorch port: %s)" % port[1])
    print("\n".join(common.switch_table(peaks, port[0], info["chunk"])))
  if records:
    print("\n| model | length | status | s/step | peak process RSS | graph build |"
          "\n|---|---|---|---|---|---|")
    for r in records:
      ok = r["status"] == "ok"
      print("| %s | %d | %s | %s | %.2f GiB | %s |" % (
          r["config"], r["length"], "trainable" if r["trainable"] else r["status"],
          "%.1f" % r["seconds_per_step"] if ok else "-",
          max(r.get("peak_rss_mb", 0), r["watched_peak_rss_mb"]) / 1024.0,
          "%.0f s" % r["graph_build_seconds"] if "graph_build_seconds" in r else "-"))
    print("\nlongest trainable length at batch 1: " + ", ".join(
        "%s %s" % (k, v or "none of the lengths") for k, v in longest.items()))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--part", choices=["all", "8k", "lengths"], default="all")
  parser.add_argument("--steps", type=int, default=3, help="timed steps per bench-8k config")
  parser.add_argument("--warmup", type=int, default=2)
  parser.add_argument("--chunk", type=int, default=CHUNK, help="logits_chunk_size of the "
                      "*_chunked configurations and of the lengths part (0: off there)")
  parser.add_argument("--configs", default=",".join(CONFIGS),
                      help="comma-separated bench-8k configurations: " + ", ".join(CONFIGS))
  parser.add_argument("--models", default=",".join(LENGTH_MODELS))
  parser.add_argument("--lengths", default="16384,32768,65536")
  parser.add_argument("--memory_gb", type=float, default=24.0)
  parser.add_argument("--timeout", type=float, default=3600.0,
                      help="seconds per worker process before it is killed")
  parser.add_argument("--vocab", type=int, default=256)
  parser.add_argument("--threads", type=int, default=os.cpu_count())
  parser.add_argument("--out", default=os.path.join(HERE, "results"))
  parser.add_argument("--peer_results", default=os.path.join(HERE, "results", "peers.json"),
                      help="peers.py's results, for the PyTorch port's peak RSS")
  parser.add_argument("--worker", choices=["matmul", "step"], help=argparse.SUPPRESS)
  parser.add_argument("--model", help=argparse.SUPPRESS)
  parser.add_argument("--overrides", default="{}", help=argparse.SUPPRESS)
  parser.add_argument("--length", type=int, default=LENGTH_8K, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.worker == "matmul":
    print(json.dumps(matmul_worker(args.threads)))
    return
  if args.worker == "step":
    print(json.dumps(step_worker(args.model, json.loads(args.overrides), args.length,
                                 args.steps, args.warmup, args.threads, args.vocab)))
    return
  unknown = [n for n in args.configs.split(",") if n.strip() and n.strip() not in CONFIGS]
  unknown += [m for m in args.models.split(",") if m.strip() and m.strip() not in LENGTH_MODELS]
  if unknown:
    sys.exit("train_memory: unknown --configs/--models %s; choose from %s and %s"
             % (unknown, ", ".join(CONFIGS), ", ".join(LENGTH_MODELS)))
  limit, chosen = memory_limit(args.memory_gb)
  info = common.start("train_memory", part=args.part, vocab=args.vocab, chunk=args.chunk,
                      threads_used=args.threads, memory_limit_gib=limit / GIB,
                      memory_limit_from=chosen, avx512_bf16=common.cpu_flag("avx512_bf16"))

  def measure_rate(when):
    rate = dict(run_worker(args, ["matmul", "--threads", args.threads], limit), when=when)
    common.emit(rate)
    if rate.get("status") not in (None, "ok"):
      sys.exit("train_memory: the matmul worker failed: %s" % rate)
    return rate

  started = measure_rate("start")
  results, records, longest = {}, [], {}
  if args.part in ("all", "8k"):
    results = part_8k(args, limit)
  if args.part in ("all", "lengths"):
    records, longest = part_lengths(args, limit)
  matmul = dict(common.steady_matmul_rate(started, measure_rate("end")),
                when="higher of start and end")
  add_utilisation(list(results.values()) + records, matmul["gflops"])
  ratios = dict(ratios_8k(results), record="ratio")
  ratios.update(("longest_%s" % k, v) for k, v in longest.items())
  port = port_peak(args.peer_results, args.vocab)
  if port[0]:
    ratios.update(("peak_rss_%s_over_port" % name, r["peak_rss_mb"] / port[0])
                  for name, r in results.items() if r["status"] == "ok")
  common.emit(ratios)
  print_tables(info, matmul, results, records, longest, port)
  common.save(args.out, "train_memory.json", {"machine": info, "matmul": matmul,
                                              "bench_8k": results, "lengths": records,
                                              "longest": longest, "ratio": ratios})


if __name__ == "__main__":
  common.ensure_bench_env()
  main()
