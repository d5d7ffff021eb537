"""Training tokens/s against a peer: the PyPI package `routing-transformer` (PyTorch) at bench-8k.

    make bench-peers        # = .venv/bin/python benchmarks/peers.py [--steps 3] [--length 8192]
                            #   [--processes N: N processes per side, medians]

Not part of CI. The peer runs in its own venv, benchmarks/.venv-peers (created on first use,
gitignored; never the main .venv): torch==2.13.0 (the CPU wheel; pip's configured find-links
serve it when present) and routing-transformer==1.6.1 with its dependencies, resolved with torch
pinned so nothing pulls another torch. Both sides run in one invocation, one after the other, with
the same intra-op thread count (--threads, default: all cores):

- peer: `routing_transformer.RoutingTransformerLM` (lucidrains) configured like bench-8k: vocab
  256, dim 512, depth 4, 8 heads of 64 of which 6 local (window 256, one block of look-back) and 2
  routing (window 512, so 16 clusters at length 8192), GEGLU feed-forward x4, causal, shared qk;
  one step = forward over `length` tokens, cross-entropy + its auxiliary (commitment) loss,
  backward (its k-means EMA update runs in the backward hook), torch.optim.Adafactor.
- ours: the "routing" (topk) model of benchmarks/train_step.py (the whole T2T training step with
  Adafactor) with each memory switch of `common.SWITCHES` (--ours picks some): the plain step,
  recompute_attention, recompute_layers, logits_chunk_size=1024, the three together, and
  activation_dtype=bfloat16 (slow without AVX512_BF16). The switch table gives each one's peak
  RSS over the plain step's and over the peer's.

Ours runs with TF's default CPU allocator, what a user's process gets (`--tf-allocator bfc`: the
BFC allocator the other benchmarks set for its peak-bytes statistics, which here is a few percent
faster and holds ~0.2 GB more RSS), and with TF's own choice of oneDNN (`--onednn on|off`
sets TF_ENABLE_ONEDNN_OPTS for our workers; TF leaves it off on an AVX2-only CPU, where it ran
the step 1.4-1.6x faster). Every configuration runs in its own process (ours in this
venv, the peer in its venv), and each reports the same memory measures: the peak resident set
size of its process (ru_maxrss / VmHWM) and its baseline, the RSS before the first step
(framework imported, model, optimizer and variables built).
The same invocation records the CPU model and the dense fp32 matmul rate (2048^3) of TensorFlow
and of PyTorch, each in its own process too, so ratios are read against the same machine: at its
start and again at its end, using the higher of the two (`common.steady_matmul_rate`; a warning
when they differ by more than 15%, a sign the machine was disturbed during the run).
Utilisation = useful FLOP/s (train_step.useful_flops_per_token of our bench-8k model x tokens/s;
the same count for the peer, whose model is bench-8k without Shaw relative positions) / the
dense matmul rate of the side's own framework.

Prints one JSON line per record, the ratios ours / peer, a markdown table, and writes
benchmarks/results/peers.json. `--profile` then traces one more step on each side (after the
timing and the peak are read): op time and memory allocated by op type, from TF's RunMetadata
and torch.profiler, with the share of time in dense matmuls (docs/performance.md).
`--interleave` also builds every --ours configuration in one more process and times them side by
side, one step of each per round in alternating order: the median of each round's time ratio to
the first configuration resolves differences of a percent or two, where separate processes of
the same configuration spread by a few percent (time only: that process's RSS holds them all).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PEER_VENV = os.path.join(HERE, ".venv-peers")
PEER_PACKAGES = ["torch==2.13.0", "routing-transformer==1.6.1"]
TORCH_VERSION = "2.13.0"
sys.path.insert(0, HERE)
import common  # pylint: disable=g-import-not-at-top,wrong-import-position  (stdlib only)


def peer_python(venv=PEER_VENV):
  """The peer venv's python, creating and filling the venv on first use."""
  python = os.path.join(venv, "bin", "python")
  check = [python, "-c", "import torch, routing_transformer; print(torch.__version__)"]
  # Run from inside the venv: from the repo root `routing_transformer` would be ours.
  if os.path.exists(python):
    done = subprocess.run(check, capture_output=True, text=True, cwd=venv)
    if done.returncode == 0 and done.stdout.strip().startswith(TORCH_VERSION):
      return python
  print("peers: setting up %s (%s)" % (venv, ", ".join(PEER_PACKAGES)), flush=True)
  if not os.path.exists(python):
    subprocess.check_call([sys.executable, "-m", "venv", venv])
  constraints = os.path.join(venv, "constraints.txt")
  with open(constraints, "w") as f:
    f.write("torch==%s\n" % TORCH_VERSION)
  subprocess.check_call([python, "-m", "pip", "install", "-q", "-c", constraints] + PEER_PACKAGES)
  done = subprocess.run(check, capture_output=True, text=True, cwd=venv)
  if done.returncode or not done.stdout.strip().startswith(TORCH_VERSION):
    sys.exit("peers: the peer venv %s does not import torch %s + routing_transformer; delete it "
             "and rerun (%s)" % (venv, TORCH_VERSION, (done.stderr or done.stdout).strip()
                                 .splitlines()[-1:]))
  return python


OURS = {name: ("routing", common.switch_overrides(name)) for name in common.SWITCHES}
MATMUL = 2048


TF_MATMUL_OPS = ("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "_FusedMatMul",
                 "Einsum", "Conv2D")
TORCH_MATMUL_OPS = ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::linear",
                    "aten::matmul", "aten::einsum")


def matmul_share(by_op, matmul_ops):
  """Share of the summed op time spent in dense matmul ops: [(op, ms)] -> float. TF builds with
  oneDNN rename the ops they take over (_MklMatMul, _MklEinsum, _MklFusedMatMul): those count
  as the op they stand for."""
  def is_matmul(op):
    if op.startswith("_Mkl"):  # _MklMatMul stands for MatMul, _MklFusedMatMul for _FusedMatMul
      op = op[len("_Mkl"):]
      return op in matmul_ops or "_" + op in matmul_ops
    return op in matmul_ops

  total = sum(ms for _, ms in by_op)
  return sum(ms for op, ms in by_op if is_matmul(op)) / total if total else 0.0


def torch_op_profile(step, top=15):
  """One step under torch.profiler (CPU): self time and net memory allocated per op type."""
  from torch import profiler  # pylint: disable=g-import-not-at-top
  with profiler.profile(activities=[profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
    step()
  events = list(prof.key_averages())
  by_time = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)
  by_mb = sorted(events, key=lambda e: e.self_cpu_memory_usage, reverse=True)
  every = [(e.key, e.self_cpu_time_total / 1000.0) for e in events]
  return {"by_op": [(e.key, round(e.self_cpu_time_total / 1000.0, 2)) for e in by_time[:top]],
          "mb_by_op": [(e.key, round(e.self_cpu_memory_usage / 2.0 ** 20, 1))
                       for e in by_mb[:top]],
          "total_ms": round(sum(ms for _, ms in every), 2),
          "total_mb": round(sum(max(e.self_cpu_memory_usage, 0) for e in events) / 2.0 ** 20, 1),
          "matmul_share": round(matmul_share(every, TORCH_MATMUL_OPS), 3)}


def tf_op_profile(run, top=15):
  """One traced step of ours (tf1 RunMetadata): op time and output MB per op type."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf1 = tf.compat.v1
  metadata = tf1.RunMetadata()
  run(options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE), run_metadata=metadata)
  out = common.op_times(metadata.step_stats, top=None)  # every op type
  out["matmul_share"] = round(matmul_share(out["by_op"], TF_MATMUL_OPS), 3)
  out["by_op"], out["mb_by_op"] = out["by_op"][:top], out["mb_by_op"][:top]
  return out


def peer_worker(steps, length, threads, warmup, profile=False):
  """Runs inside the peer venv (no TensorFlow): times the PyTorch training step."""
  import warnings  # pylint: disable=g-import-not-at-top
  warnings.filterwarnings("ignore")
  import torch  # pylint: disable=g-import-not-at-top
  from routing_transformer import RoutingTransformerLM  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(threads)
  torch.manual_seed(0)
  model = RoutingTransformerLM(
      num_tokens=256, dim=512, depth=4, max_seq_len=length, heads=8, dim_head=64,
      window_size=512, local_attn_window_size=256, local_attn_radius_blocks=1,
      n_local_attn_heads=6, causal=True, ff_mult=4, ff_glu=True, shared_qk=True)
  model.train()
  # (skipping the package's empty placeholder tensors, e.g. memory key/values with num_mem_kv=0)
  optimizer = torch.optim.Adafactor([p for p in model.parameters() if p.numel()], lr=0.01)
  tokens = torch.randint(1, 256, (1, length + 1))
  inputs, targets = tokens[:, :-1], tokens[:, 1:]
  baseline = common.rss_mb()  # torch imported, model and optimizer built, before any step

  def step():
    logits, aux_loss = model(inputs)
    loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets) + aux_loss.sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

  seconds = common.median_time(step, steps, warmup)
  record = {"record": "point", "side": "peer", "name": "peer",
            "package": "routing-transformer 1.6.1", "torch": torch.__version__,
            "threads": torch.get_num_threads(), "seconds_per_step": seconds,
            "tokens_per_sec": length / seconds, "peak_rss_mb": common.peak_rss_mb(),
            "baseline_rss_mb": baseline,
            "parameters": sum(p.numel() for p in model.parameters()), "steps": steps}
  if profile:  # after the peak is read: the profiler's own memory is not counted
    record["profile"] = torch_op_profile(step)
  return record


def torch_matmul_worker(threads):
  """Dense fp32 matmul GFLOP/s of PyTorch (inside the peer venv)."""
  import torch  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(threads)
  a, b = torch.randn(MATMUL, MATMUL), torch.randn(MATMUL, MATMUL)
  seconds = common.median_time(lambda: torch.matmul(a, b).sum().item(), 5, 1)
  return {"record": "matmul", "framework": "pytorch", "version": torch.__version__,
          "threads": torch.get_num_threads(), "size": MATMUL,
          "gflops": 2.0 * MATMUL ** 3 / seconds / 1e9}


def tf_matmul_worker(threads):
  """Dense fp32 (and bfloat16) matmul GFLOP/s of TensorFlow (this venv), as benchmarks/common.py
  measures it."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from routing_transformer.t2t import glue  # pylint: disable=g-import-not-at-top
  tf.config.threading.set_intra_op_parallelism_threads(threads)
  return {"record": "matmul", "framework": "tensorflow", "version": tf.__version__,
          "threads": threads, "size": MATMUL, "onednn": glue.onednn_enabled(),
          "gflops": common.matmul_gflops(MATMUL),
          "gflops_bfloat16": common.matmul_gflops(MATMUL, dtype="bfloat16")}


def _start_ours(record, length, threads):
  """(common, tensorflow, train_step) for a worker timing our step: the start recorded, TF's
  intra-op threads set (read by tf1.Session too)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import train_step  # pylint: disable=g-import-not-at-top
  common.start(record, config="bench-8k", length=length)
  tf.config.threading.set_intra_op_parallelism_threads(threads)
  return common, tf, train_step


def ours_worker(name, steps, length, threads, warmup, profile=False):
  """Times one of our configurations (OURS) in this process: the T2T step of train_step.py."""
  common, tf, train_step = _start_ours("peers_ours", length, threads)
  from routing_transformer.t2t import glue  # pylint: disable=g-import-not-at-top
  model, overrides = OURS[name]
  started = time.perf_counter()
  run, params = train_step.build_train_step(model, length, overrides)
  build = time.perf_counter() - started
  baseline = common.rss_mb()  # TF and T2T imported, step built, variables initialised
  started = time.perf_counter()
  run()  # the first step (graph optimisation, allocations)
  first = time.perf_counter() - started
  seconds = common.median_time(run, steps, max(warmup - 1, 0))
  record = {"record": "point", "side": "ours", "name": name,
            "model": "%s, train_step.py%s" % (model, "".join(
                ", %s=%s" % kv for kv in sorted(overrides.items()))),
            "tensorflow": tf.__version__, "threads": threads, "seconds_per_step": seconds,
            "tokens_per_sec": length / seconds, "peak_rss_mb": common.peak_rss_mb(),
            "baseline_rss_mb": baseline,
            "graph_build_seconds": build, "first_step_seconds": first,
            "tf_cpu_allocator_bfc": os.environ.get("TF_CPU_ALLOCATOR_USE_BFC", ""),
            "onednn": glue.onednn_enabled(),
            "useful_flops_per_token": train_step.useful_flops_per_token(
                train_step.model_hparams(model, length, overrides), train_step.VOCAB),
            "parameters": params, "steps": steps}
  if profile:  # after the peak is read: the trace's own memory is not counted
    record["profile"] = tf_op_profile(run)
  return record


def interleaved_worker(names, steps, length, threads, warmup):
  """Times our configurations `names` side by side in this one process: each built in its own
  graph and session, its first step run, then `steps` rounds of one step of each in alternating
  order (`common.interleaved_times`). Time only: every graph lives in this process, so its RSS
  says nothing about one configuration's memory."""
  common, tf, train_step = _start_ours("peers_interleaved", length, threads)
  runs = {}
  for name in names:
    model, overrides = OURS[name]
    runs[name], _ = train_step.build_train_step(model, length, overrides)
    runs[name]()  # the first step (graph optimisation, allocations), untimed
  times = common.interleaved_times(runs, steps, warmup=max(warmup - 1, 0))
  return {"record": "interleaved", "names": names, "reference": names[0], "steps": steps,
          "threads": threads, "tensorflow": tf.__version__,
          "configurations": common.interleaved_summary(times, names[0]), "seconds": times}


def profile_table(records, top=12):
  """Markdown: the top op types by time and by memory of each side's traced step."""
  lines = []
  for name, r in records.items():
    p = r.get("profile")
    if not p:
      continue
    lines.append("\n%s: summed op time %.0f ms (wall %.0f ms), matmul share %.2f; outputs "
                 "allocated %.0f MB\n\n| op (time) | ms | share | op (memory) | MB |\n"
                 "|---|---|---|---|---|" % (name, p["total_ms"], 1000 * r["seconds_per_step"],
                                             p["matmul_share"], p["total_mb"]))
    for i in range(min(top, max(len(p["by_op"]), len(p["mb_by_op"])))):
      t = p["by_op"][i] if i < len(p["by_op"]) else ("", 0.0)
      m = p["mb_by_op"][i] if i < len(p["mb_by_op"]) else ("", 0.0)
      lines.append("| %s | %.0f | %.2f | %s | %.0f |" % (t[0], t[1], t[1] / p["total_ms"],
                                                          m[0], m[1]))
  return "\n".join(lines)


def interleaved_table(record):
  """Markdown table of an interleaved record: each configuration's median step time in the one
  process and the median of its per-round ratios to the reference (the first --ours)."""
  lines = ["\nside by side in one process (%d interleaved rounds; time only):" % record["steps"],
           "\n| ours | s/step | / %s, per round |\n|---|---|---|" % record["reference"]]
  for name in record["names"]:
    c = record["configurations"][name]
    lines.append("| %s | %.2f | %.3f |" % (name, c["seconds_per_step"], c["over_reference"]))
  return "\n".join(lines)


MEDIAN_FIELDS = ("seconds_per_step", "tokens_per_sec", "peak_rss_mb", "baseline_rss_mb")


def median_record(records):
  """One side's record from its processes (--processes): the first record with MEDIAN_FIELDS
  replaced by their medians and, for more than one, "runs" holding each process's values (a
  process's peak RSS spreads by a few hundred MB from allocator slack alone)."""
  record = dict(records[0])
  if len(records) > 1:
    for key in MEDIAN_FIELDS:
      record[key] = statistics.median(r[key] for r in records)
    record["runs"] = [{key: r[key] for key in MEDIAN_FIELDS} for r in records]
  return record


def spread_lines(records):
  """'name: peak min-max GiB, s/step min-max' for each record with several runs."""
  lines = []
  for name, r in records.items():
    runs = r.get("runs")
    if runs:
      peaks = [run["peak_rss_mb"] / 1024.0 for run in runs]
      times = [run["seconds_per_step"] for run in runs]
      lines.append("%s: %d processes, peak RSS %.2f-%.2f GiB (median %.2f), s/step %.2f-%.2f "
                   "(median %.2f)" % (name, len(runs), min(peaks), max(peaks),
                                      r["peak_rss_mb"] / 1024.0, min(times), max(times),
                                      r["seconds_per_step"]))
  return lines


def run_worker(python, kind, args, name=None):
  """Runs `kind` in a fresh process of `python`; returns its last JSON line."""
  command = [python, os.path.abspath(__file__), "--worker", kind, "--steps", str(args.steps),
             "--warmup", str(args.warmup), "--length", str(args.length), "--threads",
             str(args.threads)] + (["--name", name] if name else []) + (
                 ["--profile"] if args.profile else [])
  # The peer venv runs from inside itself: from the repo root `routing_transformer` is ours.
  cwd = os.path.dirname(python) if python != sys.executable else HERE
  done = subprocess.run(command, capture_output=True, text=True, cwd=cwd)
  if done.returncode:
    sys.exit("peers: worker %s %s failed: %s" % (kind, name or "",
                                                 done.stderr.strip().splitlines()[-3:]))
  return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--steps", type=int, default=3, help="timed steps per side (median)")
  parser.add_argument("--warmup", type=int, default=2)
  parser.add_argument("--length", type=int, default=8192)
  parser.add_argument("--processes", type=int, default=1,
                      help="processes per side, in rounds; medians of s/step, tokens/s and peak")
  parser.add_argument("--threads", type=int, default=os.cpu_count())
  parser.add_argument("--ours", default=",".join(OURS),
                      help="comma-separated configurations of ours: " + ", ".join(OURS))
  parser.add_argument("--worker", choices=["peer", "ours", "ours_interleaved", "tf_matmul",
                                           "torch_matmul"],
                      help=argparse.SUPPRESS)
  parser.add_argument("--name", help=argparse.SUPPRESS)
  parser.add_argument("--profile", action="store_true",
                      help="also trace one step per side after timing: op time and memory by "
                      "op type (TF RunMetadata, torch.profiler)")
  parser.add_argument("--interleave", action="store_true",
                      help="also time the --ours configurations side by side in one more "
                      "process (steps interleaved, alternating order): their time ratios to "
                      "the first one, free of the spread between processes (time only)")
  parser.add_argument("--tf-allocator", choices=["default", "bfc"], default="default",
                      help="TF's CPU allocator in our workers: its default (what a user's "
                      "process gets) or BFC (TF_CPU_ALLOCATOR_USE_BFC=true, the other "
                      "benchmarks' choice for its statistics; faster here, more RSS)")
  parser.add_argument("--onednn", choices=["default", "on", "off"], default="default",
                      help="TF's oneDNN ops in our workers (TF_ENABLE_ONEDNN_OPTS): TF's own "
                      "choice (on with AVX512_VNNI, AVX512_BF16 or AMX, off on an AVX2-only "
                      "CPU) or forced on / off")
  parser.add_argument("--out", default=os.path.join(HERE, "results"))
  args = parser.parse_args(argv)
  if args.worker:
    if args.worker == "peer":  # inside the peer venv
      record = peer_worker(args.steps, args.length, args.threads, args.warmup, args.profile)
    elif args.worker == "torch_matmul":
      record = torch_matmul_worker(args.threads)
    elif args.worker == "tf_matmul":
      record = tf_matmul_worker(args.threads)
    elif args.worker == "ours_interleaved":
      record = interleaved_worker(args.name.split(","), args.steps, args.length, args.threads,
                                  args.warmup)
    else:
      record = ours_worker(args.name, args.steps, args.length, args.threads, args.warmup,
                           args.profile)
    print(json.dumps(record))
    return

  names = [n.strip() for n in args.ours.split(",") if n.strip()]
  unknown = [n for n in names if n not in OURS]
  if unknown:
    sys.exit("peers: unknown --ours %s; choose from %s" % (unknown, ", ".join(OURS)))
  python = peer_python()
  os.environ["BENCH_TF_ALLOCATOR"] = args.tf_allocator  # our workers re-exec with it
  if args.onednn != "default":  # read by TensorFlow once, when a worker imports it
    os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1" if args.onednn == "on" else "0"
  info = common.start("peers", config="bench-8k", length=args.length, threads=args.threads,
                      tf_allocator=args.tf_allocator, onednn=args.onednn)
  rates = (("tensorflow", sys.executable, "tf_matmul"), ("pytorch", python, "torch_matmul"))

  def measure_rates(when):
    measured = {}
    for framework, interpreter, kind in rates:
      measured[framework] = dict(run_worker(interpreter, kind, args), when=when)
      common.emit(measured[framework])
    return measured

  started = measure_rates("start")
  runs = {name: [] for name in ["peer"] + names}
  for _ in range(args.processes):  # rounds: the peer, then each of ours, one process each
    runs["peer"].append(run_worker(python, "peer", args))
    common.emit(runs["peer"][-1])
    for name in names:
      runs[name].append(run_worker(sys.executable, "ours", args, name))
      common.emit(runs[name][-1])
  peer = median_record(runs["peer"])
  mine = {name: median_record(runs[name]) for name in names}
  interleaved = None
  if args.interleave and len(names) > 1:
    interleaved = run_worker(sys.executable, "ours_interleaved", args, ",".join(names))
    common.emit(interleaved)
  ended = measure_rates("end")
  matmul = {framework: dict(common.steady_matmul_rate(started[framework], ended[framework]),
                            when="higher of start and end")
            for framework, _, _ in rates}
  ratios = {"record": "ratio"}
  import train_step  # pylint: disable=g-import-not-at-top
  flops = train_step.useful_flops_per_token(train_step.model_hparams("routing", args.length),
                                            train_step.VOCAB)  # the bench-8k routing model's
  for name, r in mine.items():
    ratios["tokens_per_sec_%s_over_peer" % name] = r["tokens_per_sec"] / peer["tokens_per_sec"]
    ratios["peak_rss_%s_over_peer" % name] = r["peak_rss_mb"] / peer["peak_rss_mb"]
    useful = r["tokens_per_sec"] * r["useful_flops_per_token"] / 1e9  # GFLOP/s
    r["utilisation"] = useful / matmul["tensorflow"]["gflops"]
    if OURS[name][1].get("activation_dtype") == "bfloat16":  # also over the bfloat16 rate
      r["utilisation_bfloat16"] = useful / matmul["tensorflow"]["gflops_bfloat16"]
  peer["utilisation"] = peer["tokens_per_sec"] * flops / (matmul["pytorch"]["gflops"] * 1e9)
  ratios["utilisation_peer"] = peer["utilisation"]
  for name, r in mine.items():
    ratios["utilisation_%s" % name] = r["utilisation"]
    if "utilisation_bfloat16" in r:
      ratios["utilisation_bfloat16_%s" % name] = r["utilisation_bfloat16"]
  ratios["matmul_tensorflow_over_pytorch"] = (matmul["tensorflow"]["gflops"] /
                                              matmul["pytorch"]["gflops"])
  common.emit(ratios)
  print("\n%s (%s), %d threads, %s; dense fp32 matmul %d^3: TensorFlow %.0f GFLOP/s, PyTorch %.0f "
        "GFLOP/s (TensorFlow bfloat16 %.0f); ours with TF's %s CPU allocator, oneDNN %s" % (
            info["cpu_model"], info["simd"], args.threads, info["date"], MATMUL,
            matmul["tensorflow"]["gflops"], matmul["pytorch"]["gflops"],
            matmul["tensorflow"]["gflops_bfloat16"],
            "BFC" if args.tf_allocator == "bfc" else "default",
            {True: "on", False: "off"}.get(matmul["tensorflow"].get("onednn"), "unknown")))
  print("(the higher of each rate measured at the start and at the end: TensorFlow %.0f / %.0f, "
        "PyTorch %.0f / %.0f GFLOP/s)" % (
            matmul["tensorflow"]["gflops_start"], matmul["tensorflow"]["gflops_end"],
            matmul["pytorch"]["gflops_start"], matmul["pytorch"]["gflops_end"]))
  warning = common.unsteady_warning(matmul)
  if warning:
    print(warning)
  print("\n| implementation | s/step | tokens/s | peak process RSS | utilisation | graph build | "
        "parameters |\n|---|---|---|---|---|---|---|")
  for name, r in mine.items():
    print("| ours: %s (TF %s, T2T step, Adafactor) | %.2f | %.0f | %.2f GiB | %.2f | %.0f s | %s |"
          % (r["model"], r["tensorflow"], r["seconds_per_step"], r["tokens_per_sec"],
             r["peak_rss_mb"] / 1024.0, r["utilisation"], r["graph_build_seconds"],
             "{:,}".format(r["parameters"])))
  print("| peer: routing-transformer 1.6.1 (PyTorch %s, Adafactor) | %.2f | %.0f | %.2f GiB | %s "
        "| - | %s |" % (peer["torch"], peer["seconds_per_step"], peer["tokens_per_sec"],
                        peer["peak_rss_mb"] / 1024.0, "%.2f" % peer["utilisation"],
                        "{:,}".format(peer["parameters"])))
  for name, r in mine.items():
    print("\nours (%s) / peer: tokens/s %.2f, peak RSS %.2f%s" % (
        name, ratios["tokens_per_sec_%s_over_peer" % name],
        ratios["peak_rss_%s_over_peer" % name],
        "; utilisation of the bfloat16 matmul rate %.2f" % r["utilisation_bfloat16"]
        if "utilisation_bfloat16" in r else ""))
  print("\nEach switch's bench-8k peak RSS under TF's executor (own process each):")
  print("\n".join(common.switch_table({n: r["peak_rss_mb"] for n, r in mine.items()},
                                      peer["peak_rss_mb"])))
  if args.processes > 1:
    print("\nMedians of %d processes per side; their spread:\n%s" % (
        args.processes, "\n".join(spread_lines(dict(mine, peer=peer)))))
  if interleaved:
    print(interleaved_table(interleaved))
  if args.profile:
    print(profile_table(dict(mine, peer=peer)))
  common.save(args.out, "peers.json", {"machine": info, "matmul": matmul, "ours": mine,
                                       "peer": peer, "ratio": ratios,
                                       "interleaved": interleaved})


if __name__ == "__main__":
  if "--worker" in sys.argv and not {"ours", "ours_interleaved", "tf_matmul"} & set(sys.argv):
    main()  # the peer venv: no TensorFlow, no re-exec
  else:
    common.ensure_bench_env()
    main()
