"""Every patch of routing_transformer.t2t.patches: registered with a one-line reason, applied only
by install(), still needed on this stack and working.

"Still needed": a fresh process that installs nothing (or only the fixes a check needs to get
that far) still shows the problem each patch is there for (`unpatched`); when T2T, TF or
mesh_tensorflow stop showing it, the patch's test fails and the patch can go. "Working": the
patched behaviour, as values, here or in the test named in COVERED_ELSEWHERE.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import t2t_usr_dir  # pylint: disable=unused-import  (install(): every patch)
from routing_transformer.t2t import patches
from conftest import ROOT

# What a process that installs nothing observes (one process: T2T takes ~15 s to import).
UNPATCHED = r"""
import inspect, json, os, sys, tempfile
from absl import flags
out = {}
from tensorflow.python.framework import ops
out["aliases_missing"] = sorted(n for n in ("Tensor", "IndexedSlices",
                                            "register_tensor_conversion_function")
                                if not hasattr(ops, n))
try:
  import mesh_tensorflow
  out["mesh_tensorflow"] = "imports"
except Exception as e:
  out["mesh_tensorflow"] = "%s: %s" % (type(e).__name__, e)

from routing_transformer.t2t import patches
patches.install(["tf_aliases"])  # tf_slim's optimize_loss needs them before Adafactor's turn
import tensorflow as tf
from tensor2tensor.layers import common_hparams
from tensor2tensor.utils import contrib, devices, optimize, t2t_model, trainer_lib
from tensor2tensor.utils import decoding
from tensorflow.python.autograph.impl import api
hp = common_hparams.basic_params1()
hp.optimizer = "adafactor"
with tf.Graph().as_default():
  tf.compat.v1.train.get_or_create_global_step()
  w = tf.compat.v1.get_variable("w", initializer=tf.ones([4, 3]))
  try:
    optimize.optimize(tf.reduce_sum(tf.square(w)), tf.constant(0.1), hp, use_tpu=False)
    out["adafactor"] = "builds"
  except Exception as e:
    out["adafactor"] = "%s: %s" % (type(e).__name__, e)
try:
  contrib.tpu()
  out["contrib_tpu"] = "works"
except Exception as e:
  out["contrib_tpu"] = type(e).__name__
out["call_autograph_artifact"] = api.is_autograph_artifact(t2t_model.T2TModel.__dict__["call"])
out["apply_gradients_source"] = inspect.getsource(optimize.ConditionalOptimizer.apply_gradients)
try:
  decoding.decode_hparams("sampling_temp=0.5")
  out["decode_hparams"] = "accepted"
except ValueError as e:
  out["decode_hparams"] = "ValueError"
out["decode_from_file_source"] = inspect.getsource(decoding.decode_from_file)
out["decode_from_dataset_source"] = inspect.getsource(decoding.decode_from_dataset)
out["devices"] = devices.data_parallelism(worker_gpu=1, schedule="train")._devices
config = trainer_lib.create_run_config("routing_transformer", model_dir=tempfile.mkdtemp(),
                                       save_checkpoints_steps=500, save_checkpoints_secs=600)
out["checkpoint_steps"] = config.save_checkpoints_steps
out["excepthook_is_python's"] = sys.excepthook is sys.__excepthook__

flags.DEFINE_string("model", None, "")
flags.FLAGS(["binary", "--model=routing_transformer_mtf"])
import hparams, problems  # register the sets and problems (they patch nothing)
try:
  trainer_lib.create_hparams("no_such_set")
  out["unknown_set"] = "accepted"
except Exception as e:
  out["unknown_set"] = type(e).__name__
hp = trainer_lib.create_hparams("routing_transformer_mtf_tiny",
                                "mesh_shape=model:4,layout=routing_heads:model")
out["bad_mtf_layout"] = "accepted"
from routing_transformer.t2t import model  # registers the model (installs MODEL_FIXES only)
hp = trainer_lib.create_hparams("routing_transformer_tiny", data_dir=tempfile.mkdtemp(),
                                problem_name="synthetic_long_range")
bad = decoding.decode_hparams()
bad.add_hparam("nucleus_sampling", 1.5)
trainer_lib.create_estimator("routing_transformer", hp, config, decode_hparams=bad)
out["bad_sampling_estimator"] = "accepted"
out["installed"] = patches.installed()
print("JSON" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def unpatched():
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
  run = subprocess.run([sys.executable, "-c", UNPATCHED], capture_output=True, text=True,
                       cwd=ROOT, env=env, timeout=600)
  assert run.returncode == 0, run.stderr[-3000:]
  line = [l for l in run.stdout.splitlines() if l.startswith("JSON")][-1]
  return json.loads(line[len("JSON"):])


# The patches whose working behaviour a test elsewhere checks, as values.
COVERED_ELSEWHERE = {
    "step_order": "tests/test_step_order.py::test_two_runs_from_one_seed_are_bit_identical",
    "nan_guard": "tests/test_health.py::test_nan_loss_and_gradient_stop_the_step_without_a_"
                 "poisoned_checkpoint",
    "create_hparams_checks": "tests/test_t2t_binaries.py::test_bad_hparams_fail_fast_with_the_fix",
    "mtf_create_hparams_checks": "tests/test_t2t_errors.py::test_mtf_bad_layout_fails_fast_with_"
                                 "the_fix",
    "sampling_decode_hparams": "tests/test_t2t_errors.py::test_decoder_stops_on_bad_sampling_"
                               "settings",
    "decode_from_file_prompts": "tests/test_t2t_errors.py::test_decoder_stops_on_an_empty_prompt_"
                                "file",
    "create_estimator_checks": "tests/test_t2t_errors.py::test_decoder_stops_on_bad_sampling_"
                               "settings",
    "trainer_checkpoints": "tests/test_damaged_checkpoints.py::test_save_checkpoints_secs_keeps_"
                           "the_step_checkpoints",
    "decoder_checkpoints": "tests/test_reliability.py::test_damaged_newest_checkpoint_then_full_"
                           "disk",
    "cpu_placement_without_gpu": "tests/test_placement.py::test_shards_and_variables_on_cpu_only_"
                                 "without_gpu",
    "one_line_errors": "tests/test_t2t_errors.py::test_unknown_model_is_one_line",
}


def test_every_patch_has_a_one_line_reason_and_a_test():
  names = [p.name for p in patches.PATCHES]
  assert len(set(names)) == len(names)
  assert set(patches.MODEL_FIXES) <= set(names)
  for entry in patches.PATCHES:
    assert entry.reason and "\n" not in entry.reason and len(entry.reason) < 200, entry.name
    assert callable(globals().get("test_" + entry.name)), "no test_%s" % entry.name
  for name, where in COVERED_ELSEWHERE.items():
    path, test = where.split("::")
    assert "def %s(" % test in open(os.path.join(ROOT, path)).read(), where


def test_install_is_explicit_idempotent_and_checks_names():
  assert patches.installed() == sorted(p.name for p in patches.PATCHES)  # t2t_usr_dir did it
  patches.install()  # again: nothing applied twice
  from tensor2tensor.utils import optimize  # pylint: disable=g-import-not-at-top
  apply_gradients = optimize.ConditionalOptimizer.apply_gradients
  patches.install(["nan_guard"])
  assert optimize.ConditionalOptimizer.apply_gradients is apply_gradients
  with pytest.raises(ValueError, match="unknown patches"):
    patches.install(["no_such_patch"])


def test_unpatched_process_installed_only_what_it_asked_for(unpatched):
  assert unpatched["installed"] == sorted(patches.MODEL_FIXES)


def test_tf_aliases(unpatched):
  assert unpatched["aliases_missing"] == ["IndexedSlices", "Tensor",
                                          "register_tensor_conversion_function"]
  assert "register_tensor_conversion_function" in unpatched["mesh_tensorflow"]
  from tensorflow.python.framework import ops  # pylint: disable=g-import-not-at-top
  assert ops.Tensor is tf.Tensor and ops.IndexedSlices is tf.IndexedSlices
  assert callable(ops.register_tensor_conversion_function)
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  assert mtf.Dimension("x", 2).size == 2


@pytest.mark.parametrize("optimizer", ["adam", "adafactor"])
def test_adafactor_get_gradients(unpatched, optimizer):
  """Unpatched, T2T's optimize cannot build Adafactor's train op; patched, both optimizers train."""
  assert unpatched["adafactor"].startswith("AttributeError") and (
      "get_gradients" in unpatched["adafactor"])
  from tensor2tensor.layers import common_hparams  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import optimize  # pylint: disable=g-import-not-at-top
  hparams = common_hparams.basic_params1()
  hparams.optimizer = optimizer
  with tf.Graph().as_default():
    tf.compat.v1.train.get_or_create_global_step()
    w = tf.compat.v1.get_variable("w", initializer=tf.ones([4, 3]))
    loss = tf.reduce_sum(tf.square(tf.matmul(tf.ones([2, 4]), w) - 1.0))
    train_op = optimize.optimize(loss, tf.constant(0.1), hparams, use_tpu=False)
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      before = sess.run(loss)
      for _ in range(3):
        sess.run(train_op)
      after = sess.run(loss)
  assert np.isfinite(after) and after < before


def test_tpu_estimator_without_contrib(unpatched):
  assert unpatched["contrib_tpu"] in ("ImportError", "ModuleNotFoundError", "AttributeError")
  from tensor2tensor.utils import contrib  # pylint: disable=g-import-not-at-top
  assert contrib.tpu().TPUEstimator is tf.compat.v1.estimator.tpu.TPUEstimator
  from tensorflow.contrib.tpu.python.tpu import tpu_estimator  # pylint: disable=g-import-not-at-top
  assert hasattr(tpu_estimator, "TPUEstimator")


def test_t2t_model_call_without_autograph(unpatched, monkeypatch):
  """Unpatched, T2TModel.call is not marked for autograph to skip; patched, building the routing
  model converts nothing (it transpiled every model function on each graph build), and it runs."""
  assert unpatched["call_autograph_artifact"] is False
  from tensor2tensor.data_generators import problem_hparams  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import trainer_lib  # pylint: disable=g-import-not-at-top
  from tensorflow.python.autograph.impl import api  # pylint: disable=g-import-not-at-top
  converted = []
  convert = api._convert_actual  # pylint: disable=protected-access
  monkeypatch.setattr(api, "_convert_actual",
                      lambda entity, ctx: converted.append(entity) or convert(entity, ctx))
  hparams = trainer_lib.create_hparams("routing_transformer_test")
  hparams.problem_hparams = problem_hparams.test_problem_hparams(40, 40, hparams)
  with tf.Graph().as_default():
    model = registry.model("routing_transformer")(hparams, tf.estimator.ModeKeys.TRAIN,
                                                  hparams.problem_hparams)
    ids = tf.constant(np.random.RandomState(0).randint(2, 40, size=(2, 64, 1, 1)), tf.int32)
    _, losses = model({"targets": ids, "inputs": ids})
    loss = tf.add_n(list(losses.values()))
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      assert np.isfinite(sess.run(loss))
  assert not converted, converted[:5]


def test_step_order(unpatched):
  """T2T's TF2 branch still increments the global step in a control dependency of the update
  (unordered with the step's reads: the patch is needed); patched, the step and its reads are
  TF1's (values: tests/test_step_order.py)."""
  source = unpatched["apply_gradients_source"]
  assert "is_tf2" in source and "assign_add" in source and "control_dependencies" in source
  import inspect  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import optimize  # pylint: disable=g-import-not-at-top
  patched = inspect.getsource(patches.step_order)
  assert "global_step=global_step" in patched
  assert optimize.ConditionalOptimizer.apply_gradients.__module__ == patches.__name__


def test_nan_guard(unpatched):
  """T2T's apply_gradients applies whatever it is given (no finiteness check to reuse); the
  guard wraps it (its values: test_health)."""
  assert "is_finite" not in unpatched["apply_gradients_source"]
  from tensor2tensor.utils import optimize  # pylint: disable=g-import-not-at-top
  assert optimize.ConditionalOptimizer.apply_gradients.__module__ == patches.__name__


def test_create_hparams_checks(unpatched):
  assert unpatched["unknown_set"] == "KeyError"  # T2T: a traceback, no list of our sets


def test_mtf_create_hparams_checks(unpatched):
  assert unpatched["bad_mtf_layout"] == "accepted"  # T2T: fails later, inside the Estimator


def test_sampling_decode_hparams(unpatched):
  assert unpatched["decode_hparams"] == "ValueError"
  from tensor2tensor.utils import decoding  # pylint: disable=g-import-not-at-top
  assert decoding.decode_hparams("sampling_temp=0.5").sampling_temp == 0.5


def test_decode_from_file_prompts(unpatched):
  """T2T neither checks the prompts' length nor writes them beside their continuations."""
  assert "max_target_length" not in unpatched["decode_from_file_source"]


def test_create_estimator_checks(unpatched):
  assert unpatched["bad_sampling_estimator"] == "accepted"  # nucleus_sampling=1.5 unchecked


def test_trainer_checkpoints(unpatched):
  assert unpatched["checkpoint_steps"] is None  # T2T: the seconds replace the step saves
  from tensor2tensor.utils import trainer_lib  # pylint: disable=g-import-not-at-top
  config = trainer_lib.create_run_config("routing_transformer", model_dir="/tmp/x",
                                         save_checkpoints_steps=500, save_checkpoints_secs=600)
  assert config.save_checkpoints_steps == 500


def test_decoder_checkpoints(unpatched):
  """T2T restores whatever checkpoint path it is given, unchecked."""
  assert "checkpoint_files" not in unpatched["decode_from_dataset_source"]
  assert "latest_checkpoint" not in unpatched["decode_from_dataset_source"]


def test_cpu_placement_without_gpu(unpatched):
  assert unpatched["devices"] == ["gpu:0"]  # CUDA_VISIBLE_DEVICES="": no GPU, still gpu:0


def test_one_line_errors(unpatched):
  assert unpatched["excepthook_is_python's"]
  assert getattr(sys.excepthook, "_routing_guard", False)
