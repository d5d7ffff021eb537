"""Training tokens/s against a peer: the PyPI package `routing-transformer` (PyTorch) at bench-8k.

    make bench-peers        # = .venv/bin/python benchmarks/peers.py [--steps 3] [--length 8192]

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
  Adafactor), built and timed in this process.

Prints one JSON line per side and the ratio ours / peer tokens/s, a markdown table, and writes
benchmarks/results/peers.json.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PEER_VENV = os.path.join(HERE, ".venv-peers")
PEER_PACKAGES = ["torch==2.13.0", "routing-transformer==1.6.1"]
TORCH_VERSION = "2.13.0"


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


def peer_worker(steps, length, threads, warmup):
  """Runs inside the peer venv (no TensorFlow): times the PyTorch training step."""
  import resource  # pylint: disable=g-import-not-at-top
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

  def step():
    logits, aux_loss = model(inputs)
    loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets) + aux_loss.sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

  for _ in range(warmup):
    step()
  times = []
  for _ in range(steps):
    t = time.perf_counter()
    step()
    times.append(time.perf_counter() - t)
  times.sort()
  seconds = times[len(times) // 2]
  return {"record": "point", "side": "peer", "package": "routing-transformer 1.6.1",
          "torch": torch.__version__, "threads": torch.get_num_threads(),
          "seconds_per_step": seconds, "tokens_per_sec": length / seconds,
          "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
          "parameters": sum(p.numel() for p in model.parameters()), "steps": steps}


def ours(steps, length, threads, warmup):
  """Times our routing (topk) T2T training step of benchmarks/train_step.py."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import common  # pylint: disable=g-import-not-at-top
  import train_step  # pylint: disable=g-import-not-at-top
  tf.config.threading.set_intra_op_parallelism_threads(threads)  # read by tf1.Session too
  run, params = train_step.build_train_step("routing", length)
  seconds, peak = common.time_fn(run, repeats=steps, warmup=warmup, max_seconds=900)
  return {"record": "point", "side": "ours", "model": "routing (topk), train_step.py",
          "tensorflow": tf.__version__, "threads": threads, "seconds_per_step": seconds,
          "tokens_per_sec": length / seconds, "peak_tensor_mb": peak / 2 ** 20,
          "parameters": params, "steps": steps}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--steps", type=int, default=3, help="timed steps per side (median)")
  parser.add_argument("--warmup", type=int, default=2)
  parser.add_argument("--length", type=int, default=8192)
  parser.add_argument("--threads", type=int, default=os.cpu_count())
  parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  parser.add_argument("--out", default=os.path.join(HERE, "results"))
  args = parser.parse_args(argv)
  if args.worker:  # inside the peer venv
    print(json.dumps(peer_worker(args.steps, args.length, args.threads, args.warmup)))
    return

  sys.path.insert(0, HERE)
  import common  # pylint: disable=g-import-not-at-top
  python = peer_python()
  info = common.start("peers", config="bench-8k", length=args.length, threads=args.threads)
  done = subprocess.run([python, os.path.abspath(__file__), "--worker", "--steps",
                         str(args.steps), "--warmup", str(args.warmup), "--length",
                         str(args.length), "--threads", str(args.threads)],
                        capture_output=True, text=True, cwd=os.path.dirname(python))
  if done.returncode:
    sys.exit("peers: the PyTorch side failed: %s" % done.stderr.strip().splitlines()[-1:])
  peer = json.loads(done.stdout.strip().splitlines()[-1])
  common.emit(peer)
  mine = ours(args.steps, args.length, args.threads, args.warmup)
  common.emit(mine)
  ratio = {"record": "ratio", "tokens_per_sec_ours_over_peer":
           mine["tokens_per_sec"] / peer["tokens_per_sec"]}
  common.emit(ratio)
  print("\n| implementation | threads | s/step | tokens/s | parameters |\n|---|---|---|---|---|")
  print("| ours: routing_transformer (TF %s, T2T step, Adafactor) | %d | %.3f | %.0f | %s |" % (
      mine["tensorflow"], mine["threads"], mine["seconds_per_step"], mine["tokens_per_sec"],
      "{:,}".format(mine["parameters"])))
  print("| peer: routing-transformer 1.6.1 (PyTorch %s, Adafactor) | %d | %.3f | %.0f | %s |" % (
      peer["torch"], peer["threads"], peer["seconds_per_step"], peer["tokens_per_sec"],
      "{:,}".format(peer["parameters"])))
  print("\nours / peer training tokens/s: %.2f" % ratio["tokens_per_sec_ours_over_peer"])
  common.save(args.out, "peers.json", {"machine": info, "ours": mine, "peer": peer,
                                       "ratio": ratio})


if __name__ == "__main__":
  if "--worker" in sys.argv:
    main()
  else:
    sys.path.insert(0, HERE)
    import common  # pylint: disable=g-import-not-at-top,wrong-import-position
    common.ensure_bench_env()
    main()
