"""The TF 2.15 compatibility fixes: mesh_tensorflow imports, T2T's optimizer builds a train op."""
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import routing_transformer  # applies compat  # pylint: disable=unused-import
from routing_transformer.t2t import compat
from conftest import ROOT


def test_aliases_restored_and_idempotent():
  from tensorflow.python.framework import ops  # pylint: disable=g-import-not-at-top
  compat.apply()
  compat.apply()
  assert ops.Tensor is tf.Tensor
  assert ops.IndexedSlices is tf.IndexedSlices
  assert callable(ops.register_tensor_conversion_function)


def test_mesh_tensorflow_imports_only_with_compat():
  code = "import mesh_tensorflow"
  plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
  assert plain.returncode != 0 and "register_tensor_conversion_function" in plain.stderr
  fixed = subprocess.run([sys.executable, "-c", "import routing_transformer; " + code +
                          "; import mesh_tensorflow as mtf; print(mtf.Dimension('x', 2))"],
                         capture_output=True, text=True, cwd=ROOT)
  assert fixed.returncode == 0, fixed.stderr[-2000:]


@pytest.mark.parametrize("optimizer", ["adam", "adafactor"])
def test_t2t_optimize_builds_and_runs_a_train_op(optimizer):
  from tensor2tensor.layers import common_hparams  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import optimize  # pylint: disable=g-import-not-at-top
  compat.patch_tensor2tensor()
  hparams = common_hparams.basic_params1()
  hparams.optimizer = optimizer
  hparams.learning_rate_schedule = "constant*linear_warmup*rsqrt_normalized_decay"
  hparams.learning_rate_constant = 0.1
  hparams.learning_rate_warmup_steps = 10
  with tf.Graph().as_default():
    tf.compat.v1.train.get_or_create_global_step()
    w = tf.compat.v1.get_variable("w", initializer=tf.ones([4, 3]))
    loss = tf.reduce_sum(tf.square(tf.matmul(tf.ones([2, 4]), w) - 1.0))
    lr = tf.constant(0.1)
    train_op = optimize.optimize(loss, lr, hparams, use_tpu=False)
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      before = sess.run(loss)
      for _ in range(3):
        sess.run(train_op)
      after = sess.run(loss)
  assert np.isfinite(after) and after < before


def test_t2t_model_graph_builds_without_autograph(monkeypatch):
  """compat turns off TF2 Keras' autograph pass over T2TModel.call (it transpiled every model
  function on each graph build): building the routing model converts nothing, and it runs."""
  import t2t_usr_dir  # pylint: disable=g-import-not-at-top,unused-import
  from tensor2tensor.data_generators import problem_hparams  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import trainer_lib  # pylint: disable=g-import-not-at-top
  from tensorflow.python.autograph.impl import api  # pylint: disable=g-import-not-at-top
  compat.patch_tensor2tensor()
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
