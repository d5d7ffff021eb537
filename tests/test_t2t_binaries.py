"""End to end through the stock T2T binaries with --t2t_usr_dir=t2t_usr_dir: the shared trained
run (conftest.trained_run), one-line errors of t2t-trainer and t2t-datagen.

The distributed training paths are in test_t2t_distributed.py, t2t-decoder in test_t2t_decoder.py.
One case of each kind of one-line error runs through the binary here; the other messages of the
same kind, and the registry listing, are checked in-process (test_t2t_errors.py).
"""
import glob
import os

import pytest

from conftest import TRAINED_STEPS
from conftest import run_t2t

pytestmark = pytest.mark.slow
t2t = run_t2t


def test_trainer_trains_evaluates_and_checkpoints(trained):
  out, log = trained
  assert glob.glob(os.path.join(out, "model.ckpt-%d.index" % TRAINED_STEPS))
  assert "far_accuracy" in log and "near_accuracy" in log
  assert glob.glob(os.path.join(out, "eval*", "events.out.tfevents.*"))


def test_cpu_only_run_has_no_colocation_dump(trained):
  """Without a GPU the model is placed on the CPU: no soft-placement colocation warnings (T2T's
  default gpu:0 placement made TensorFlow print thousands of such lines per run)."""
  _, log = trained
  assert "Colocation Debug Info" not in log and "Failed to place the graph" not in log
  assert "Train." in log or "loss = " in log  # the log is the run's own (C++ warnings on)


def test_checkpoint_holds_centroids_that_moved(trained):
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  out, _ = trained
  reader = tf.train.load_checkpoint(os.path.join(out, "model.ckpt-%d" % TRAINED_STEPS))
  names = [n for n in reader.get_variable_to_shape_map() if n.endswith("cluster_attention/means")]
  assert names, "no centroid variables in the checkpoint"
  counts = reader.get_tensor(names[0].replace("/means", "/ema_count"))
  assert np.all(np.isfinite(counts)) and counts.sum() > 0  # EMA statistics were updated
  assert "sparse_transformer" not in names[0] and "routing_transformer/body" in names[0]


@pytest.mark.parametrize("args,message", [
    (["--hparams_set=no_such_set"], "unknown hparams set 'no_such_set'"),
    (["--hparams_set=routing_transformer_tiny", "--hparams=local_num_heads=3"],
     "hidden_size=128 is not divisible by local_num_heads + sparsity_cluster_num_heads = 5"),
])
def test_bad_hparams_fail_fast_with_the_fix(data_dir, tmp_path, args, message):
  """Through the binary: one line naming the fix, no traceback, no checkpoint. Every check's
  message on the same set: test_model.test_tiny_set_errors_name_the_fix."""
  run = t2t("t2t-trainer", "--problem=synthetic_long_range", "--model=routing_transformer",
            "--data_dir=" + data_dir, "--output_dir=" + str(tmp_path), "--train_steps=1", *args,
            timeout=120)
  assert run.returncode != 0
  last = run.stderr.strip().splitlines()[-1]
  assert message in last and "Traceback" not in run.stderr
  assert not glob.glob(os.path.join(str(tmp_path), "model.ckpt*"))


def test_unknown_problem_fails_with_one_line(data_dir, tmp_path):
  """T2T's registry KeyError as one line (an unknown model: test_t2t_errors)."""
  run = t2t("t2t-trainer", "--hparams_set=routing_transformer_tiny", "--data_dir=" + data_dir,
            "--output_dir=" + str(tmp_path), "--train_steps=1", "--problem=no_such_problem",
            "--model=routing_transformer", timeout=120)
  assert run.returncode != 0
  assert "unknown problem 'no_such_problem'. This project's: cifar10_pixels" in \
      run.stderr.strip().splitlines()[-1] and "Traceback" not in run.stderr


def test_datagen_unknown_problem_fails_with_one_line(tmp_path):
  """t2t-datagen names the bad problem in one line instead of listing every T2T problem (no
  --problem at all: test_t2t_errors)."""
  data = tmp_path / "data"
  run = t2t("t2t-datagen", "--problem=synthetic_long_rnage", "--data_dir=%s" % data,
            "--tmp_dir=%s" % (tmp_path / "tmp"), timeout=120)
  assert run.returncode != 0
  last = run.stderr.strip().splitlines()[-1]
  assert last.startswith("error: unknown problem 'synthetic_long_rnage'. This project's: "), last
  assert "synthetic_long_range" in last
  assert "Traceback" not in run.stderr and "TIMIT" not in run.stderr
  assert not data.exists()


def test_checkpoint_of_other_hparams_fails_listing_the_variables(trained, data_dir, tmp_path):
  import shutil  # pylint: disable=g-import-not-at-top
  out = str(tmp_path / "copy")
  shutil.copytree(trained[0], out)
  run = t2t("t2t-trainer", "--problem=synthetic_long_range", "--model=routing_transformer",
            "--hparams_set=routing_transformer_tiny", "--hparams=filter_size=128",
            "--data_dir=" + data_dir, "--output_dir=" + out,
            "--train_steps=%d" % (TRAINED_STEPS + 2),
            "--schedule=train", timeout=300)
  assert run.returncode != 0 and "Traceback" not in run.stderr
  last = run.stderr.strip().splitlines()[-1]
  assert "does not fit this model" in last and "ffn/weight1/kernel (checkpoint [128, 256], " \
      "model [128, 128])" in last and "--hparams_set" in last
  assert not glob.glob(os.path.join(out, "model.ckpt-%d.index" % (TRAINED_STEPS + 2)))
