"""Soak test: train a tiny model through stock t2t-trainer for a fixed wall time, with periodic
evaluation and checkpoint rotation, and report drift (not part of CI).

  make soak                    # 30 minutes, writes soak_output/report.json
  .venv/bin/python scripts/soak.py --minutes 5 --output_dir /tmp/soak

Reports steps/s and resident memory (VmRSS of the trainer, sampled every 5 s) in the first and
last fifth of the run, their ratios (drift), peak RSS, the number of checkpoints kept on disk
(must stay <= --keep_checkpoint_max) and the number of evaluations.
"""
import argparse
import glob
import json
import os
import re
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, ".venv", "bin")


def rss_mb(pid):
  """(VmRSS, VmHWM) of a process in MB, or None once it is gone."""
  try:
    with open("/proc/%d/status" % pid) as f:
      text = f.read()
  except OSError:
    return None
  get = lambda key: int(re.search(key + r":\s+(\d+) kB", text).group(1)) / 1024.0
  return get("VmRSS"), get("VmHWM")


def generate_data(data_dir):
  sys.path.insert(0, ROOT)
  import t2t_usr_dir  # pylint: disable=g-import-not-at-top,unused-import
  from problems import synthetic  # pylint: disable=g-import-not-at-top
  problem = synthetic.SyntheticLongRange()
  problem.num_train, problem.num_eval = 2000, 40
  problem.generate_data(data_dir, data_dir)


def fifth_means(samples, first):
  """Mean of the values whose time falls in the first (or last) fifth of the run."""
  if not samples:
    return None
  t0, t1 = samples[0][0], samples[-1][0]
  cut = t0 + (t1 - t0) / 5.0 if first else t1 - (t1 - t0) / 5.0
  chosen = [v for t, v in samples if (t <= cut if first else t >= cut)]
  return sum(chosen) / len(chosen)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--minutes", type=float, default=30.0)
  parser.add_argument("--output_dir", default=os.path.join(ROOT, "soak_output"))
  parser.add_argument("--hparams_set", default="routing_transformer_tiny")
  parser.add_argument("--eval_every_steps", type=int, default=500)
  parser.add_argument("--keep_checkpoint_max", type=int, default=3)
  args = parser.parse_args()
  data_dir = os.path.join(args.output_dir, "data")
  run_dir = os.path.join(args.output_dir, "run")
  if not glob.glob(os.path.join(data_dir, "synthetic_long_range-train*")):
    generate_data(data_dir)
  cmd = [os.path.join(BIN, "t2t-trainer"), "--t2t_usr_dir=" + os.path.join(ROOT, "t2t_usr_dir"),
         "--problem=synthetic_long_range", "--model=routing_transformer",
         "--hparams_set=" + args.hparams_set, "--data_dir=" + data_dir, "--output_dir=" + run_dir,
         "--train_steps=100000000", "--eval_steps=2",
         "--local_eval_frequency=%d" % args.eval_every_steps,
         "--keep_checkpoint_max=%d" % args.keep_checkpoint_max,
         "--schedule=continuous_train_and_eval"]
  log_path = os.path.join(args.output_dir, "trainer.log")
  os.makedirs(args.output_dir, exist_ok=True)
  start = time.time()
  rates, memory, max_checkpoints, peak, evaluations = [], [], 0, 0.0, 0
  with open(log_path, "w") as log, open(log_path) as reader:  # reader: only the new lines

    def read_new_lines():
      lines = reader.readlines()
      return lines, sum(line.count("Saving dict for global step") for line in lines)

    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    while time.time() - start < args.minutes * 60 and proc.poll() is None:
      time.sleep(5)
      now = time.time() - start
      mem = rss_mb(proc.pid)
      if mem:
        memory.append((now, mem[0]))
        peak = max(peak, mem[1])
      lines, saved = read_new_lines()
      evaluations += saved
      for line in lines:
        m = re.search(r"global_step/sec: ([0-9.]+)", line)
        if m and "INFO:tensorflow" in line:
          rates.append((now, float(m.group(1))))
      max_checkpoints = max(max_checkpoints,
                            len(glob.glob(os.path.join(run_dir, "model.ckpt-*.index"))))
    crashed = proc.poll() is not None
    if not crashed:
      proc.send_signal(signal.SIGINT)
      try:
        proc.wait(timeout=120)
      except subprocess.TimeoutExpired:
        proc.kill()
    evaluations += read_new_lines()[1]
  steps = [int(s) for s in re.findall(r"model\.ckpt-(\d+)\.index", " ".join(
      glob.glob(os.path.join(run_dir, "model.ckpt-*.index"))))]
  report = {
      "minutes": round((time.time() - start) / 60.0, 1),
      "crashed": crashed,
      "last_checkpoint_step": max(steps) if steps else 0,
      "steps_per_s_first_fifth": fifth_means(rates, True),
      "steps_per_s_last_fifth": fifth_means(rates, False),
      "rss_mb_first_fifth": fifth_means(memory, True),
      "rss_mb_last_fifth": fifth_means(memory, False),
      "peak_rss_mb": round(peak, 1),
      "checkpoints_on_disk_max": max_checkpoints,
      "keep_checkpoint_max": args.keep_checkpoint_max,
      "evaluations": evaluations // 2,
  }
  if report["steps_per_s_first_fifth"] and report["steps_per_s_last_fifth"]:
    report["steps_per_s_drift"] = report["steps_per_s_last_fifth"] / report[
        "steps_per_s_first_fifth"]
  if report["rss_mb_first_fifth"]:
    report["rss_drift"] = report["rss_mb_last_fifth"] / report["rss_mb_first_fifth"]
  text = json.dumps(report, indent=1)
  print(text)
  with open(os.path.join(args.output_dir, "report.json"), "w") as f:
    f.write(text + "\n")
  ok = not crashed and max_checkpoints <= args.keep_checkpoint_max + 1
  sys.exit(0 if ok else 1)


if __name__ == "__main__":
  main()
