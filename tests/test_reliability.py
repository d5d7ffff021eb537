"""Training survives SIGKILL: t2t-trainer restarted with the same flags resumes from the last
checkpoint, with centroids and EMA statistics restored (not re-initialised)."""
import glob
import os
import signal
import subprocess
import time

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from conftest import BIN
from conftest import ROOT

pytestmark = pytest.mark.slow
DECAY = 0.999  # routing_transformer_tiny's EMA decay (hparams `decay`)


def trainer_cmd(data_dir, out, steps):
  return [os.path.join(BIN, "t2t-trainer"),
          "--t2t_usr_dir=" + os.path.join(ROOT, "t2t_usr_dir"),
          "--problem=synthetic_long_range", "--model=routing_transformer",
          "--hparams_set=routing_transformer_tiny", "--data_dir=" + data_dir,
          "--output_dir=" + out, "--train_steps=%d" % steps, "--local_eval_frequency=3",
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


def test_sigkill_then_restart_resumes_from_the_last_checkpoint(data_dir, tmp_path):
  out = str(tmp_path / "run")
  steps = 9  # checkpoints every 3 steps: the kill lands at 3 or 6
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  with open(str(tmp_path / "first.log"), "w") as log:
    proc = subprocess.Popen(trainer_cmd(data_dir, out, steps), stdout=log, stderr=log, cwd=ROOT,
                            env=env)
    deadline = time.time() + 600
    while not checkpoint_steps(out) or checkpoint_steps(out)[-1] < 3:
      assert proc.poll() is None, open(str(tmp_path / "first.log")).read()[-3000:]
      assert time.time() < deadline
      time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
  killed_at = int(tf.train.latest_checkpoint(out).split("-")[-1])  # what a restart restores
  assert 3 <= killed_at < steps, "the kill must land mid-training"
  before = ema_count_totals(os.path.join(out, "model.ckpt-%d" % killed_at))
  assert before and all(np.all(v > 0) for v in before.values())

  second = subprocess.run(trainer_cmd(data_dir, out, steps), capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=900)
  assert second.returncode == 0, second.stderr[-3000:]
  assert "model.ckpt-%d" % killed_at in second.stderr  # "Restoring parameters from ..."
  assert checkpoint_steps(out)[-1] == steps
  final = os.path.join(out, "model.ckpt-%d" % steps)
  reader = tf.train.load_checkpoint(final)
  assert reader.get_tensor("global_step") == steps
  for name in reader.get_variable_to_shape_map():
    value = reader.get_tensor(name)
    if isinstance(value, np.ndarray) and value.dtype.kind == "f":
      assert np.all(np.isfinite(value)), name
  # Every step adds (1 - decay) * N to the per-head EMA count total (N = q + k tokens, constant
  # here), from 0 at initialisation: S_t = N (1 - decay^t). Restored statistics continue this
  # curve to t = steps; re-initialised ones would restart it at the kill.
  after = ema_count_totals(final)
  for name, total in before.items():
    n = total / (1.0 - DECAY ** killed_at)
    np.testing.assert_allclose(after[name], n * (1.0 - DECAY ** steps), rtol=2e-3)
    assert not np.allclose(after[name], n * (1.0 - DECAY ** (steps - killed_at)), rtol=0.05)
