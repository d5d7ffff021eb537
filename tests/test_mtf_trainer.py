"""routing_transformer_mtf through stock t2t-trainer: 2-way model parallel (mesh_shape=model:2).
A layout the mesh cannot split stops in trainer_lib.create_hparams: test_t2t_errors."""
import glob
import os

import numpy as np
import pytest

from conftest import run_t2t

pytestmark = pytest.mark.slow
STEPS = 2  # enough for a checkpoint and an evaluation after EMA updates


def t2t_trainer(*args, timeout=600):
  return run_t2t("t2t-trainer", "--problem=synthetic_long_range",
                 "--model=routing_transformer_mtf", *args, timeout=timeout)


@pytest.fixture(scope="module")
def data_dir(synthetic_data_dir):
  return synthetic_data_dir


@pytest.fixture(scope="module")
def trained(data_dir, tmp_path_factory):
  out = str(tmp_path_factory.mktemp("mtf_train"))
  run = t2t_trainer("--hparams_set=routing_transformer_mtf_tiny", "--data_dir=" + data_dir,
                    "--output_dir=" + out, "--train_steps=%d" % STEPS, "--eval_steps=1",
                    "--local_eval_frequency=%d" % STEPS,
                    "--schedule=continuous_train_and_eval")
  assert run.returncode == 0, run.stderr[-4000:]
  return out, run.stderr


def test_trains_evaluates_and_checkpoints_on_a_2_device_mesh(trained):
  out, log = trained
  assert glob.glob(os.path.join(out, "model.ckpt-%d.index" % STEPS))
  assert glob.glob(os.path.join(out, "eval*", "events.out.tfevents.*"))
  evals = [line for line in log.splitlines() if "Saving dict for global step %d" % STEPS in line]
  assert evals and "far_accuracy" in evals[-1] and "loss = " in evals[-1]
  loss = float(evals[-1].split("loss = ")[1].split(",")[0])
  assert np.isfinite(loss) and 0.0 < loss < 10.0


def test_checkpoint_holds_full_weights_and_updated_centroids(trained):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  out, _ = trained
  reader = tf.train.load_checkpoint(os.path.join(out, "model.ckpt-%d" % STEPS))
  shapes = reader.get_variable_to_shape_map()
  # Master variables are saved whole (vocab 74 padded to 80), not per-device slices.
  assert shapes["routing_transformer_mtf/final_dense_2/kernel"] == [128, 80]
  counts = [n for n in shapes if n.endswith("cluster_attention/ema_count")]
  assert counts
  # STEPS steps of EMA (decay 0.999) over 2 heads x 4 sequences x 512 positions, both shards.
  total = reader.get_tensor(counts[0]).sum()
  expected = sum(0.001 * 0.999 ** i for i in range(STEPS)) * 2 * 4 * 512
  assert total == pytest.approx(expected, rel=0.02)

