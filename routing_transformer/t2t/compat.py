"""TF 2.15 compatibility fixes for tf_slim, mesh_tensorflow and Tensor2Tensor.

TF 2.14+ dropped three aliases from `tensorflow.python.framework.ops` that tf_slim (T2T's
`optimize_loss`) and mesh_tensorflow still use. `apply()` restores them; it is idempotent and
cheap, and is called on `import routing_transformer` and by `t2t_usr_dir`.

`patch_tensor2tensor()` additionally fixes T2T itself (Adafactor's missing `get_gradients`, the
order of a training step's global-step reads and increment, the TPUEstimator path that imports
`tf.contrib`, autograph in every model's graph build). It imports
tensor2tensor (about 10 s), so it is only called where T2T is used anyway: `t2t_usr_dir` and the
model code.
"""
import sys
import types

_ALIASES_DONE = False
_T2T_DONE = False


def restore_tf_aliases():
  """Restores ops.Tensor, ops.IndexedSlices, ops.register_tensor_conversion_function."""
  global _ALIASES_DONE
  if _ALIASES_DONE:
    return
  from tensorflow.python.framework import ops  # pylint: disable=g-import-not-at-top
  from tensorflow.python.framework import indexed_slices  # pylint: disable=g-import-not-at-top
  from tensorflow.python.framework import tensor as tensor_lib  # pylint: disable=g-import-not-at-top
  from tensorflow.python.framework import tensor_conversion_registry  # pylint: disable=g-import-not-at-top
  if not hasattr(ops, "Tensor"):
    ops.Tensor = tensor_lib.Tensor
  if not hasattr(ops, "IndexedSlices"):
    ops.IndexedSlices = indexed_slices.IndexedSlices
  if not hasattr(ops, "register_tensor_conversion_function"):
    ops.register_tensor_conversion_function = (
        tensor_conversion_registry.register_tensor_conversion_function)
  _ALIASES_DONE = True


def _patch_adafactor():
  """T2T's ConditionalOptimizer calls `get_gradients`, which AdafactorOptimizer lacks on TF2."""
  from tensor2tensor.utils import adafactor  # pylint: disable=g-import-not-at-top
  cls = adafactor.AdafactorOptimizer
  if getattr(cls, "_routing_transformer_patched", False):
    return

  def get_gradients(self, loss, var_list):
    return [g for g, _ in self.compute_gradients(loss, var_list)]

  cls.get_gradients = get_gradients
  cls._routing_transformer_patched = True  # pylint: disable=protected-access


def _patch_step_order():
  """Increments the global step after the update, as TF1's `apply_gradients(global_step=...)`.

  On TF2, T2T 1.15.7's `ConditionalOptimizer.apply_gradients` runs the update under a control
  dependency on `assign_add(global_step, 1)`, while the learning-rate schedule and Adafactor's
  decay rate (`1 - (step + 1)^-0.8`) read the global step with no order against that increment:
  each step saw the old or the new step number as the threads happened to run, so two runs from
  one seed differed (the first step's decay rate was 0.0 or 0.42565). Here every read that feeds
  the update precedes the increment, always, as in the original release's TF1 graph.
  """
  import tensorflow.compat.v1 as tf1  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import optimize  # pylint: disable=g-import-not-at-top
  cls = optimize.ConditionalOptimizer
  if getattr(cls, "_step_order_patched", False):
    return

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    if global_step is None:  # T2T's TF2 branch always increments the global step
      global_step = tf1.train.get_or_create_global_step()
    if isinstance(self._opt, tf1.train.Optimizer):  # Adafactor, SGD, ...: TF1's own order
      return self._opt.apply_gradients(grads_and_vars, global_step=global_step, name=name)
    update = self._opt.apply_gradients(grads_and_vars, name=name)  # Keras optimizers
    with tf1.control_dependencies([update]), tf1.colocate_with(global_step):
      return tf1.assign_add(global_step, 1).op

  cls.apply_gradients = apply_gradients
  cls._step_order_patched = True  # pylint: disable=protected-access


def _patch_tpu():
  """Makes T2T's TPUEstimator path (`--use_tpu`, `--use_tpu_estimator`) work on TF2."""
  import tensorflow.compat.v1 as tf1  # pylint: disable=g-import-not-at-top
  from tensor2tensor.data_generators import problem  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import contrib  # pylint: disable=g-import-not-at-top
  from tensorflow_estimator.python.estimator.tpu import tpu_config  # pylint: disable=g-import-not-at-top
  from tensorflow_estimator.python.estimator.tpu import tpu_estimator  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  def tpu():
    return types.SimpleNamespace(
        RunConfig=tf1.estimator.tpu.RunConfig,
        TPUConfig=tf1.estimator.tpu.TPUConfig,
        TPUEstimator=tf1.estimator.tpu.TPUEstimator,
        TPUEstimatorSpec=tf1.estimator.tpu.TPUEstimatorSpec,
        InputPipelineConfig=tf1.estimator.tpu.InputPipelineConfig,
        CrossShardOptimizer=tf1.tpu.CrossShardOptimizer,
        bfloat16_scope=tf1.tpu.bfloat16_scope,
    )

  def cluster_resolver():
    return tf.distribute.cluster_resolver

  contrib.tpu = tpu
  contrib.cluster_resolver = cluster_resolver
  if getattr(problem, "tpu_config", None) is None:
    problem.tpu_config = tpu_config
  # trainer_lib.create_estimator does `from tensorflow.contrib.tpu.python.tpu import
  # tpu_estimator`; serve exactly that import path (and nothing else of contrib).
  name = "tensorflow.contrib.tpu.python.tpu"
  if name not in sys.modules:
    parts = name.split(".")
    for i in range(2, len(parts) + 1):
      mod_name = ".".join(parts[:i])
      if mod_name not in sys.modules:
        sys.modules[mod_name] = types.ModuleType(mod_name)
    sys.modules[name].tpu_estimator = tpu_estimator


def _patch_autograph():
  """Builds T2T models as the graph code they are, without autograph.

  TF2's Keras runs a subclassed layer's `call` through autograph also in graph mode, so every
  `model(features)` transpiled `T2TModel.call` and, recursively, T2T's and this project's model
  code (about 400 functions): 15-20 s of each graph build on 2 cores. That code is TF1 graph code
  (tf.cond / tf.while_loop, no Python control flow on tensors), so the graph is the same without
  it; code that did need autograph would fail at graph build ("using a tf.Tensor as a Python
  bool"), not silently differ.
  """
  from tensor2tensor.utils import t2t_model  # pylint: disable=g-import-not-at-top
  from tensorflow.python.autograph.impl import api  # pylint: disable=g-import-not-at-top
  call = t2t_model.T2TModel.__dict__["call"]
  if not api.is_autograph_artifact(call):
    t2t_model.T2TModel.call = api.do_not_convert(call)


def patch_tensor2tensor():
  """Applies every fix T2T needs on TF 2.15 (idempotent)."""
  global _T2T_DONE
  restore_tf_aliases()
  if _T2T_DONE:
    return
  _patch_adafactor()
  _patch_step_order()
  _patch_tpu()
  _patch_autograph()
  _T2T_DONE = True


def apply():
  """Restores the TF aliases (idempotent); T2T fixes too if tensor2tensor is already imported."""
  restore_tf_aliases()
  if "tensor2tensor" in sys.modules:
    patch_tensor2tensor()
