"""Stock t2t-trainer on its distributed paths: TPUEstimator on the CPU, two data-parallel shards
(--worker_gpu=2) and XLA, each continuing a copy of the shared trained run (conftest.trained_run)
for 2 steps."""
import glob
import os
import shutil

import pytest

from conftest import TRAINED_STEPS
from conftest import run_t2t

pytestmark = pytest.mark.slow
t2t = run_t2t
STEPS = 2


@pytest.mark.parametrize("flags", [
    ["--use_tpu_estimator", "--iterations_per_loop=%d" % STEPS, "--cloud_tpu_name=",
     "--schedule=train", "--hparams=tpu_enable_host_call=True"],
    ["--worker_gpu=2", "--schedule=train"],
    ["--xla_compile", "--schedule=train"],
], ids=["tpu_estimator", "worker_gpu2", "xla_compile"])
def test_distributed_paths_train(trained, data_dir, tmp_path, flags):
  """TPUEstimator on the CPU, two data-parallel shards, and XLA: each restores the shared run's
  checkpoint, trains STEPS steps and checkpoints."""
  out = str(tmp_path / "run")
  shutil.copytree(trained[0], out)
  before = set(glob.glob(os.path.join(out, "events.out.tfevents.*")))
  last = TRAINED_STEPS + STEPS
  run = t2t("t2t-trainer", "--problem=synthetic_long_range", "--model=routing_transformer",
            "--hparams_set=routing_transformer_tiny", "--data_dir=" + data_dir,
            "--output_dir=" + out, "--train_steps=%d" % last, *flags)
  assert run.returncode == 0, run.stderr[-4000:]
  assert "Restoring parameters from %s" % os.path.join(out, "model.ckpt-%d" % TRAINED_STEPS) \
      in run.stderr, run.stderr[-4000:]
  assert glob.glob(os.path.join(out, "model.ckpt-%d.index" % last)), os.listdir(out)
  if "--worker_gpu=2" in flags:  # two shards, placed on the CPU (no GPU here)
    assert "No GPU visible: the 2 data shard(s) ['gpu:0', 'gpu:1']" in run.stderr
  if "--use_tpu_estimator" in flags:  # summaries came through TPUEstimator's host_call
    tags = _summary_tags(set(glob.glob(os.path.join(out, "events.out.tfevents.*"))) - before)
    assert any("occupancy_entropy" in t for t in tags), sorted(tags)[:20]
    assert any("extra_loss" in t for t in tags), sorted(tags)[:20]


def _summary_tags(paths):
  """Tags of every summary in the event files `paths` (this run's, not the shared run's)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tags = set()
  for path in paths:
    for event in tf.compat.v1.train.summary_iterator(path):
      tags.update(v.tag for v in event.summary.value)
  return tags
