"""Training survives SIGKILL, a damaged checkpoint and a full disk: t2t-trainer restarted with the
same flags resumes from the newest complete checkpoint, with centroids and EMA statistics restored
(not re-initialised); the failures are one line each."""
import glob
import os
import random
import shutil
import signal
import subprocess
import time
import types

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from conftest import BIN
from conftest import ROOT
from conftest import run_t2t
from conftest import t2t_argv
from conftest import t2t_env
import forked_binaries
from routing_transformer.t2t import checkpoint_files

pytestmark = pytest.mark.slow
DECAY = 0.999  # routing_transformer_tiny's EMA decay (hparams `decay`)
# The SIGKILL run: a checkpoint every 2 steps to 8; the kill lands 0-0.5 s after the one of step
# 2, 6 steps before the end (a step takes ~0.3 s once running, a save ~0.3 s).
STEPS, EVERY = 8, 2


def trainer_args(data_dir, out, steps):
  """The run's t2t-trainer flags (without --t2t_usr_dir: conftest.t2t_argv adds it)."""
  return ["--problem=synthetic_long_range", "--model=routing_transformer",
          "--hparams_set=routing_transformer_tiny", "--data_dir=" + data_dir,
          "--output_dir=" + out, "--train_steps=%d" % steps, "--local_eval_frequency=%d" % EVERY,
          "--iterations_per_loop=1",
          "--keep_checkpoint_max=50", "--schedule=train"]


def checkpoint_steps(out):
  return sorted(int(p.split("-")[-1].split(".")[0])
                for p in glob.glob(os.path.join(out, "model.ckpt-*.index")))


def ema_count_totals(prefix):
  """{variable name: per-head total of ema_count [h]} of one checkpoint."""
  reader = tf.train.load_checkpoint(prefix)
  return {name: reader.get_tensor(name).sum(axis=-1)
          for name in reader.get_variable_to_shape_map() if name.endswith("ema_count")}


def newest_step(out):
  """The step of the newest checkpoint the run's `checkpoint` file names (what a restart
  restores), or -1."""
  newest = tf.train.latest_checkpoint(out)
  return checkpoint_files.checkpoint_step(newest) if newest else -1


def run_until_killed(args, log_path, out, after, rng):
  """Starts t2t-trainer `args` (forked_binaries) and SIGKILLs it at a random moment (0-0.5 s)
  after its `checkpoint` file named a checkpoint newer than `after`; returns its log."""
  proc = forked_binaries.start("t2t-trainer", t2t_argv(*args), t2t_env(), ROOT, log_path)
  deadline = time.time() + 600
  while newest_step(out) <= after:
    assert proc.is_alive(), open(log_path).read()[-3000:]
    assert time.time() < deadline
    time.sleep(0.1)
  time.sleep(rng.uniform(0.0, 0.5))
  os.kill(proc.pid, signal.SIGKILL)
  proc.join()
  assert proc.exitcode == -signal.SIGKILL, proc.exitcode
  with open(log_path) as f:
    return f.read()


@pytest.fixture(scope="module")
def killed_run(synthetic_data_dir, tmp_path_factory):
  """A run SIGKILLed at a random moment after its first checkpoint past step 0, then restarted
  with the same flags until it finished STEPS steps. Read-only (copy it before changing it):
  dict(out, seed, restored: the checkpoint the restart restored, last: the restart's
  CompletedProcess)."""
  folder = tmp_path_factory.mktemp("sigkill")
  out = str(folder / "run")
  seed = int(time.time())
  args = trainer_args(synthetic_data_dir, out, STEPS)
  run_until_killed(args, str(folder / "killed.log"), out, 0, random.Random(seed))
  restored = tf.train.latest_checkpoint(out)  # what the restart restores
  last = run_t2t("t2t-trainer", *args, timeout=900)
  return dict(out=out, seed=seed, restored=restored, last=last)


def test_sigkill_then_restart_resumes_from_the_newest_checkpoint(killed_run):
  out, seed, restored, last = (killed_run[k] for k in ("out", "seed", "restored", "last"))
  assert restored and checkpoint_files.damage(restored) is None, seed  # never a torn newest one
  killed_at = checkpoint_files.checkpoint_step(restored)
  assert EVERY <= killed_at < STEPS, "the kill must land mid-training (seed %d)" % seed
  before = ema_count_totals(os.path.join(out, "model.ckpt-%d" % killed_at))
  assert before and all(np.all(v > 0) for v in before.values())

  assert last.returncode == 0, last.stderr[-3000:]
  assert "Restoring parameters from %s" % restored in last.stderr, seed
  assert checkpoint_steps(out)[-1] == STEPS
  final = os.path.join(out, "model.ckpt-%d" % STEPS)
  reader = tf.train.load_checkpoint(final)
  assert reader.get_tensor("global_step") == STEPS
  for name in reader.get_variable_to_shape_map():
    value = reader.get_tensor(name)
    if isinstance(value, np.ndarray) and value.dtype.kind == "f":
      assert np.all(np.isfinite(value)), name
  # Every step adds (1 - decay) * N to the per-head EMA count total (N = q + k tokens, constant
  # here), from 0 at initialisation: S_t = N (1 - decay^t). Restored statistics continue this
  # curve to t = STEPS; re-initialised ones would restart it at the kill.
  after = ema_count_totals(final)
  for name, total in before.items():
    n = total / (1.0 - DECAY ** killed_at)
    np.testing.assert_allclose(after[name], n * (1.0 - DECAY ** STEPS), rtol=2e-3)
    assert not np.allclose(after[name], n * (1.0 - DECAY ** (STEPS - killed_at)), rtol=0.05)


# ---------------------------------------------------------------------------------------------
# A damaged newest checkpoint and a full disk.

SIMULATED_FULL_DISK = """
import sys
import tensorflow as tf
from tensorflow.python.training import saver
from tensor2tensor.bin import t2t_trainer

def save(self, sess, save_path, global_step=None, *args, **kwargs):
  step = int(global_step if isinstance(global_step, int) else sess.run(global_step))
  if step > %d:
    raise tf.errors.ResourceExhaustedError(None, None, "%%s-%%d_temp/part-00000-of-00001.data-"
                                           "00000-of-00001.tempstate1; No space left on device"
                                           %% (save_path, step))
  return ORIGINAL(self, sess, save_path, global_step, *args, **kwargs)

ORIGINAL, saver.Saver.save = saver.Saver.save, save
sys.argv[0] = "t2t-trainer"
tf.compat.v1.app.run(lambda argv: t2t_trainer.main(argv))
"""


def mount_tmpfs(path, size):
  """Mounts a tmpfs of `size` bytes at `path`; False where the machine does not allow it."""
  os.makedirs(path)
  try:
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%d" % size, "tmpfs", path],
                          capture_output=True, timeout=30)
  except (OSError, subprocess.SubprocessError):
    return False
  return done.returncode == 0


def disk_usage(path, page=4096):
  """Bytes a copy of the tree at `path` takes on a tmpfs: every file (also in sub-folders, e.g.
  eval/) rounded up to whole pages, plus a page per folder."""
  total = 0
  for folder, _, files in os.walk(path):
    total += page + sum(-(-os.path.getsize(os.path.join(folder, f)) // page) * page
                        for f in files)
  return total


def error_lines(stderr):
  return [line for line in stderr.splitlines() if line.startswith(("error:", "warning:"))]


def test_damaged_newest_checkpoint_then_full_disk(killed_run, data_dir, tmp_path):
  """On a copy of the SIGKILL run, its newest checkpoint truncated: t2t-decoder's checkpoint guard
  stops with one line (in-process); t2t-trainer warns once, restores the newest complete one and
  trains; its next save finds the disk full (a tmpfs just too small where mounting is allowed,
  else a simulated ENOSPC after one step): one line, non-zero exit."""
  source = str(tmp_path / "copy")
  shutil.copytree(killed_run["out"], source)
  steps = checkpoint_steps(source)
  assert len(steps) >= 2, steps
  newest, good = ["model.ckpt-%d" % s for s in steps[-1:-3:-1]]
  data = max(glob.glob(os.path.join(source, newest + ".data-*")), key=os.path.getsize)
  full = os.path.getsize(data)
  with open(data, "r+b") as f:
    f.truncate(full // 2)  # a copy cut off half-way

  # t2t-decoder --output_dir=source: its first use of the checkpoint is decoding.decode_from_dataset
  # (nothing before it reads one), whose guard stops the program with this line.
  import t2t_usr_dir  # pylint: disable=g-import-not-at-top,unused-import  (installs the guard)
  from tensor2tensor.utils import decoding  # pylint: disable=g-import-not-at-top
  with pytest.raises(SystemExit) as decoder:
    decoding.decode_from_dataset(types.SimpleNamespace(model_dir=source), "synthetic_long_range",
                                 None, None)
  assert decoder.value.code == (
      "error: checkpoint %s is damaged: %s is %d bytes but its index expects %d (truncated: an "
      "interrupted write or copy). The newest complete checkpoint is %s: pass it instead, or copy "
      "the damaged files again." % (os.path.join(source, newest), os.path.basename(data),
                                    full // 2, full, os.path.join(source, good)))

  out = str(tmp_path / "disk")
  used = disk_usage(source)
  checkpoint = sum(os.path.getsize(p) for p in glob.glob(os.path.join(source, good + ".*")))
  real_disk = mount_tmpfs(out, used + 64 * 1024 + checkpoint // 2)  # the next save cannot fit
  try:
    shutil.copytree(source, out, dirs_exist_ok=True)
    last = steps[-2] + 1  # one step after the restored checkpoint, then a save
    args = ["--problem=synthetic_long_range", "--model=routing_transformer",
            "--hparams_set=routing_transformer_tiny", "--data_dir=" + data_dir,
            "--output_dir=" + out, "--train_steps=%d" % last, "--local_eval_frequency=1000",
            "--schedule=train"]
    if real_disk:
      trainer = run_t2t("t2t-trainer", *args, timeout=600)
    else:
      trainer = subprocess.run([os.path.join(BIN, "python"), "-c",
                                SIMULATED_FULL_DISK % steps[-2]] + t2t_argv(*args),
                               capture_output=True, text=True, cwd=ROOT, env=t2t_env(),
                               timeout=600)
    lines = error_lines(trainer.stderr)
    assert trainer.returncode != 0, trainer.stderr[-3000:]
    assert "Traceback (most recent call last)" not in trainer.stderr, trainer.stderr[-3000:]
    assert len(lines) == 2, lines
    assert lines[0].startswith("warning: checkpoint %s is damaged (%s is %d bytes"
                               % (newest, os.path.basename(data), full // 2)), lines
    assert lines[0].endswith("(kept in %s); resuming from %s, the newest complete checkpoint."
                             % (os.path.join(out, "damaged"), os.path.join(out, good))), lines
    assert "Restoring parameters from %s" % os.path.join(out, good) in trainer.stderr
    assert os.path.getsize(os.path.join(out, "damaged", os.path.basename(data))) == \
        full // 2  # kept, not deleted
    assert lines[1].startswith("error: no space left on the disk of %s (writing %s/" % (out, out))
    assert "a checkpoint needs ~" in lines[1] and "(the files of %s)" % good in lines[1]
    assert "the next run resumes from %s: free space" % os.path.join(out, good) in lines[1]
    log_path = lines[1].rsplit("Traceback: ", 1)[1]
    with open(log_path) as f:
      assert "No space left on device" in f.read()
    os.remove(log_path)
    assert tf.train.latest_checkpoint(out) == os.path.join(out, good)
  finally:
    if real_disk:
      subprocess.run(["umount", out], check=False)
