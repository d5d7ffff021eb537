"""Stock t2t-trainer on its distributed paths: TPUEstimator on the CPU and two data-parallel shards
(--worker_gpu=2), each continuing a copy of the shared trained run (conftest.trained_run) for 2
steps. T2T 1.15.7 ignores --xla_compile (test_xla_compile_is_ignored_by_this_t2t): the
two-shard run passes it and gets our one warning line; XLA is checked in-process
(test_recompute, test_causal_window, test_decoding)."""
import ast
import glob
import os
import shutil

import pytest

from conftest import TRAINED_STEPS
from conftest import run_t2t
from routing_transformer.t2t import glue as t2t_glue

pytestmark = pytest.mark.slow
t2t = run_t2t
STEPS = 2


@pytest.mark.parametrize("flags", [
    ["--use_tpu_estimator", "--iterations_per_loop=%d" % STEPS, "--cloud_tpu_name=",
     "--schedule=train", "--hparams=tpu_enable_host_call=True"],
    ["--worker_gpu=2", "--schedule=train", "--xla_compile"],
], ids=["tpu_estimator", "worker_gpu2"])
def test_distributed_paths_train(trained, data_dir, tmp_path, flags):
  """TPUEstimator on the CPU and two data-parallel shards: each restores the shared run's
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
  if "--xla_compile" in flags:  # ignored by T2T: one warning line says so
    assert run.stderr.count(t2t_glue.XLA_COMPILE_IGNORED) == 1, run.stderr[-4000:]
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


def test_xla_compile_is_ignored_by_this_t2t():
  """t2t-trainer hands --xla_compile on as `use_xla` to trainer_lib.create_experiment, which hands
  it to create_estimator, which deletes it unread (T2T 1.15.7): a run with the flag is the run
  without it, so none is made. Fails if a T2T version reads it: then add an `--xla_compile` case."""
  import importlib.util  # pylint: disable=g-import-not-at-top

  def tree(module):  # parsed, not imported (t2t_trainer defines flags)
    with open(importlib.util.find_spec(module).origin) as f:
      return ast.parse(f.read())

  def passed_as_use_xla(module, value):
    """(called function, keyword) of every call keyword whose value is `value`'s node."""
    return [(getattr(call.func, "id", getattr(call.func, "attr", None)), k.arg)
            for call in ast.walk(module) if isinstance(call, ast.Call)
            for k in call.keywords if value(k.value)]

  trainer = tree("tensor2tensor.bin.t2t_trainer")
  reads = [n for n in ast.walk(trainer) if isinstance(n, ast.Attribute) and n.attr == "xla_compile"]
  assert len(reads) == 1
  assert passed_as_use_xla(trainer, lambda v: v is reads[0]) == [("create_experiment_fn",
                                                                  "use_xla")]

  lib = tree("tensor2tensor.utils.trainer_lib")
  names = [n for n in ast.walk(lib) if isinstance(n, ast.Name) and n.id == "use_xla"]
  loads = [n for n in names if isinstance(n.ctx, ast.Load)]
  assert passed_as_use_xla(lib, lambda v: any(v is n for n in loads)) == [("create_estimator",
                                                                           "use_xla")]
  assert len(loads) == 1, "trainer_lib reads use_xla: add an --xla_compile case"
  create = [f for f in lib.body if isinstance(f, ast.FunctionDef) and f.name == "create_estimator"]
  deleted = [n for n in ast.walk(create[0]) if isinstance(n, ast.Name) and n.id == "use_xla"]
  assert [type(n.ctx).__name__ for n in deleted] == ["Del"]
