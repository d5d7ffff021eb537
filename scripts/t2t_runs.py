"""Running the stock T2T binaries from the demos and quality benchmarks, and reading their runs.

    t2t(binary, args, logfile)       stock binary with --t2t_usr_dir, output to a log file
    train(...)                       t2t-trainer for `steps`, evaluations every `eval_every`, with
                                     a live status line (step / total, loss, steps/s, ETA)
    eval_history(run_dir)            every evaluation's scalars, by step
    eval_metrics(run_dir)            the last evaluation's scalars
    train_speed(run_dir)             median global_step/sec
"""
import glob
import os
import subprocess
import sys
import time

import progress

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)  # the project's packages (imported where needed: TF loads slowly)
BIN = os.path.dirname(sys.executable)
USR_DIR = os.path.join(ROOT, "t2t_usr_dir")
# Optional command prefix for every run, e.g. T2T_RUNS_PREFIX="nice -n 10" on a shared machine.
PREFIX = os.environ.get("T2T_RUNS_PREFIX", "").split()
POLL_SECONDS = 0.5


def quiet_tensorflow():
  """No TensorFlow start-up, deprecation or Python warnings on this process' console (its
  children log to files): call before the first TensorFlow import."""
  import logging  # pylint: disable=g-import-not-at-top
  import warnings  # pylint: disable=g-import-not-at-top
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  warnings.filterwarnings("ignore")
  logging.getLogger("tensorflow").setLevel(logging.ERROR)  # the logger tf.get_logger() returns
  try:
    from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
    absl_logging.set_verbosity(absl_logging.ERROR)
  except ImportError:
    pass


def log(msg, name="demo"):
  print("[%s %s] %s" % (name, time.strftime("%H:%M:%S"), msg), flush=True)


def follow(proc, logfile, watch):
  """Feeds the growing `logfile` of the running `proc` to `watch` and ticks it every
  POLL_SECONDS until `proc` exits; returns its exit code."""
  with open(logfile, errors="replace") as reader:
    while True:
      code = proc.poll()
      watch.feed(reader.read())
      if code is not None:
        return code
      watch.tick()
      time.sleep(POLL_SECONDS)


def run_logged(cmd, logfile, what, watch=None):
  """Runs `cmd` from the repository root into `logfile` while `watch` (default: a plain
  "running" line) shows its progress; exits with the log's last lines when it fails."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  watch = watch or progress.Watch(os.path.basename(what))
  with open(logfile, "w") as f:
    proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
  try:
    code = follow(proc, logfile, watch)
  finally:
    if proc.poll() is None:  # interrupted: do not leave the binary running
      proc.kill()
      proc.wait()
  watch.finish()
  if code:
    with open(logfile) as f:
      tail = f.read()[-3000:]
    sys.exit("%s failed (exit %d); last lines of %s:\n%s" % (what, code, logfile, tail))


def t2t(binary, args, logfile, watch=None):
  """Runs `binary` (t2t-trainer, t2t-datagen, t2t-decoder) with our usr dir into a log file."""
  run_logged(PREFIX + [os.path.join(BIN, binary), "--t2t_usr_dir=" + USR_DIR] + list(args),
             logfile, binary, watch)


def python_module(module, args, logfile):
  """Runs `python -m module args` (e.g. routing_transformer.tools.evaluate) into a log file."""
  run_logged(PREFIX + [sys.executable, "-m", module] + list(args), logfile, module)


def pictures(output, problem, data_dir, model_names, title, num_sequences=None):
  """Analysis of `output`/routing (attention patterns, head focus, occupancy, JS divergence)
  and training curves of `output`/<name> for every name (PNGs under `output`); appends the
  analysis tables to `output`/summary.md under `title` and prints them."""
  from routing_transformer.tools import analysis  # pylint: disable=g-import-not-at-top
  from routing_transformer.tools import curves  # pylint: disable=g-import-not-at-top
  log("analysis of the routing run (attention patterns, head focus, occupancy, JS divergence)")
  kwargs = {} if num_sequences is None else {"num_sequences": num_sequences}
  _, markdown, out_dir = analysis.analyse(os.path.join(output, "routing"),
                                          os.path.join(output, "analysis"), problem=problem,
                                          data_dir=data_dir, **kwargs)
  logged = {name: train_log_losses(os.path.join(output, name + ".log")) for name in model_names}
  data = curves.plot_runs([(name, os.path.join(output, name)) for name in model_names],
                          os.path.join(output, "curves.png"), train_points=logged)
  caption = ("![training curves](curves.png)\n\nTraining curves (curves.png): the training loss "
             "t2t-trainer logs every 10 steps (single batches, faint) and its moving average, and "
             "the evaluations during training (markers); final numbers:\n\n%s\n" % (
                 curves.final_markdown(curves.final_numbers(data))))
  with open(os.path.join(output, "summary.md"), "a") as f:
    f.write("\n%s:\n%s\n%s" % (title, markdown, caption))
  print("%s:\n%s\n%s" % (title, markdown, caption))
  log("pictures: %s/{attention_patterns,cluster_occupancy,head_js}.png, %s" % (
      out_dir, os.path.join(output, "curves.png")))


def train_log_losses(logfile):
  """[(step, loss)] t2t-trainer logged into `logfile` (nothing when there is no log)."""
  if not os.path.exists(logfile):
    return []
  with open(logfile, errors="replace") as f:
    return progress.train_losses(f.read())


def train(run_dir, problem, hparams_set, data_dir, steps, eval_steps, hparams="", eval_every=None,
          seed=None, name=None, log_every=10):
  """Stock t2t-trainer: `steps` steps with an evaluation of `eval_steps` batches every
  `eval_every` steps (default: once, at the end; T2T saves a checkpoint, so evaluates, at most
  every 100 steps); returns the wall seconds. The log is `<run_dir>.log`; the console shows a
  status line named `name` (default: the run directory's name) from the loss and speed
  t2t-trainer logs every `log_every` steps."""
  started = time.time()
  args = ["--problem=" + problem, "--model=routing_transformer", "--hparams_set=" + hparams_set,
          "--data_dir=" + data_dir, "--output_dir=" + run_dir, "--train_steps=%d" % steps,
          "--eval_steps=%d" % eval_steps, "--local_eval_frequency=%d" % (eval_every or steps),
          "--eval_throttle_seconds=1",  # T2T's default (600 s) skips evaluations
          "--log_step_count_steps=%d" % log_every,
          "--schedule=continuous_train_and_eval"]
  if hparams:
    args.append("--hparams=" + hparams)
  if seed is not None:
    args.append("--random_seed=%d" % seed)
  t2t("t2t-trainer", args, run_dir + ".log",
      progress.Watch(name or os.path.basename(os.path.normpath(run_dir)), steps))
  return time.time() - started


def eval_history(run_dir):
  """{step: {short tag: value}} of every evaluation of a run (tags without their
  "metrics-<problem>/targets/" prefix)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  history = {}
  for path in glob.glob(os.path.join(run_dir, "eval*", "events.out.tfevents.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      for v in event.summary.value:
        history.setdefault(int(event.step), {})[v.tag.split("/")[-1]] = v.simple_value
  return dict(sorted(history.items()))


def eval_metrics(run_dir):
  """The last evaluation's scalars (short tag names, plus "step")."""
  history = eval_history(run_dir)
  if not history:
    return {"step": -1}
  step = max(history)
  return dict(history[step], step=step)


def train_speed(run_dir):
  """Median global_step/sec over training, from the run's train event file."""
  from routing_transformer.tools import curves  # pylint: disable=g-import-not-at-top
  paths = glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))
  speeds = sorted(value for _, _, value in curves.read_scalars(paths, "global_step/sec"))
  return speeds[len(speeds) // 2] if speeds else float("nan")
