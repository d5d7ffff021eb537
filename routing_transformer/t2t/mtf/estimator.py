"""TF2-compatible Estimator glue: `routing_transformer_mtf` as a registered T2T model.

T2T's own `tensor2tensor.utils.mtf_model` imports `tf.contrib` and cannot load on TF2. This
module does what it did, for our model: `estimator_model_fn` builds a `mtf.Graph` on a
`mtf.Mesh`, lays it out with hparams `mesh_shape` / `layout` (a placement mesh over CPU/GPU
devices, the SIMD mesh on TPU with `--use_tpu`), lowers it to TF (`mtf.Lowering`), and returns an
EstimatorSpec whose hooks copy the master variables to the per-device slices after a restore
(`MtfRestoreHook`) and back before every checkpoint (`MtfCheckpointSaverListener`).

Inputs: T2T hands the model targets [b, n, 1, 1] with b <= the fixed batch and n <= the model
length; they are padded with 0 (= padding, excluded from the loss) to the static
[batch, length] the mesh needs. Use `use_fixed_batch_size=True` (the project's mtf sets do) so
T2T batches exactly `batch_size` sequences.
"""
import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from routing_transformer.t2t import glue
from routing_transformer.t2t import patches

patches.install(patches.MODEL_FIXES)  # T2T's estimator and optimizers on TF 2.15

# pylint: disable=g-import-not-at-top,wrong-import-position
from tensor2tensor.utils import hparams_lib
from tensor2tensor.utils import learning_rate
from tensor2tensor.utils import metrics
from tensor2tensor.utils import registry
from tensor2tensor.utils import t2t_model

from routing_transformer.t2t.mtf import model as mtf_model
# pylint: enable=g-import-not-at-top,wrong-import-position

MODEL_NAME = glue.MTF_MODEL


def make_mesh_impl(mesh_shape, layout_rules, use_tpu=False, params=None, devices=None):
  """The placement mesh (CPU/GPU device list, default all "") or the SIMD mesh on TPU."""
  if use_tpu:
    ctx = params["context"]
    return mtf.simd_mesh_impl.SimdMeshImpl(mesh_shape, layout_rules, [""] * mesh_shape.size,
                                           ctx.device_assignment)
  if not devices or len(devices) != mesh_shape.size:
    devices = [""] * mesh_shape.size
  return mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout_rules, devices)


def pad_targets(targets, batch, length):
  """int targets [b, n(, 1, 1)] -> [batch, length] padded with 0; b > batch or n > length fails
  (at graph build when static, else in the step: an EnsureShape named after the fix, no host op)."""
  targets = tf.cast(targets, tf.int32)
  shape = tf.shape(targets)
  targets = tf.reshape(targets, shape[:2])
  static = targets.shape.as_list()
  if static[0] is not None and static[0] > batch:
    raise ValueError("routing_transformer_mtf: batch %d larger than the mesh batch %d; set "
                     "use_fixed_batch_size=True and batch_size=%d (sequences)" % (
                         static[0], batch, batch))
  if static[1] is not None and static[1] > length:
    raise ValueError("routing_transformer_mtf: targets longer than max_target_length=%d" % length)
  padded = tf.pad(targets, [[0, tf.maximum(batch - shape[0], 0)],
                            [0, tf.maximum(length - shape[1], 0)]])
  return tf.ensure_shape(padded, [batch, length], name=(
      "batch_at_most_%d_use_fixed_batch_size_and_targets_at_most_max_target_length_%d" % (
          batch, length)))


def make_optimizer(hparams, lr):
  """Mesh-TF Adafactor (T2T's optimizer_adafactor_* hparams) or SGD."""
  if hparams.optimizer.lower() == "adafactor":
    return mtf.optimize.adafactor_optimizer_from_hparams(hparams, lr)
  return mtf.optimize.SgdOptimizer(lr)


def train_step(lowering, update_ops, global_step):
  """The lowered update ops, then global_step += 1.

  The learning rate schedule and Adafactor's decay rate read global_step; incrementing it in
  parallel with the updates would let them read this step's or the next step's value as the
  threads happened to run.
  """
  updates = tf.group([lowering.lowered_operation(op) for op in update_ops])
  with tf.control_dependencies([updates]):
    return tf.group(tf.assign_add(global_step, 1))


def saver_hooks(lowering, hparams, config):
  """Restore hook (masters -> slices) and a checkpoint hook that first copies slices -> masters."""
  with mtf.utils.outside_all_rewrites():
    restore_hook = mtf.MtfRestoreHook(lowering)
    saver = tf.train.Saver(tf.global_variables(), sharded=True, max_to_keep=10,
                           keep_checkpoint_every_n_hours=2, defer_build=False,
                           save_relative_paths=True)
    tf.add_to_collection(tf.GraphKeys.SAVERS, saver)
    steps = (config and config.save_checkpoints_steps) or None
    secs = None if steps else ((config and config.save_checkpoints_secs) or 600)
    saver_hook = tf.train.CheckpointSaverHook(
        (config and config.model_dir) or hparams.model_dir, save_steps=steps, save_secs=secs,
        saver=saver, listeners=[mtf.MtfCheckpointSaverListener(lowering)])
  return restore_hook, saver_hook


@registry.register_model(MODEL_NAME)
class RoutingTransformerMtf(t2t_model.T2TModel):
  """Routing Transformer LM in Mesh-TensorFlow (model-parallel over hparams mesh_shape/layout)."""

  @staticmethod
  def hparams_error(hparams):
    """What the Mesh-TF and the model checks find wrong with `hparams` (one line), or None (the
    binaries stop with it where they make the hparams: `t2t.patches`)."""
    from routing_transformer.t2t import model as tf_model  # pylint: disable=g-import-not-at-top
    try:
      vocab = None
      if hasattr(hparams, "problem_hparams"):
        vocab = hparams.problem_hparams.vocab_size.get("targets")
      mtf_model.check_mtf_hparams(hparams, vocab)
      tf_model.check_hparams(hparams)
    except (mtf_model.MtfHParamsError, tf_model.HParamsError) as e:
      return str(e)
    return None

  @classmethod
  def estimator_model_fn(cls, hparams, features, labels, mode, config=None, params=None,
                         decode_hparams=None, use_tpu=False):
    del labels
    hparams = hparams_lib.copy_hparams(hparams)
    hparams.use_tpu = use_tpu
    if mode == tf.estimator.ModeKeys.PREDICT:
      raise NotImplementedError(
          "routing_transformer_mtf does not decode; decode with --model=routing_transformer.")
    model = cls(hparams, mode, data_parallelism=None, decode_hparams=decode_hparams)
    vocab_size = model._problem_hparams.vocab_size["targets"]  # pylint: disable=protected-access
    mesh_shape, layout_rules = mtf_model.check_mtf_hparams(hparams, vocab_size)
    devices, shards = None, 1
    if not use_tpu and config is not None and config.data_parallelism is not None:
      devices, shards = config.data_parallelism.ps_devices, config.data_parallelism.n
    mesh_impl = make_mesh_impl(mesh_shape, layout_rules, use_tpu, params, devices)
    train = mode == tf.estimator.ModeKeys.TRAIN

    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    net = mtf_model.MtfRoutingTransformer(hparams, mesh, vocab_size, train=train,
                                         batch=mtf_model.batch_size(hparams) * shards)
    batch, length = net.dims["batch"], net.dims["length"]
    targets = pad_targets(features["targets"], batch.size, length.size)
    with tf.variable_scope(MODEL_NAME):
      loss, xent, extra, logits = net.loss_and_logits(
          mtf.import_tf_tensor(mesh, targets, mtf.Shape([batch, length])))
      global_step = tf.train.get_or_create_global_step()
      update_ops = []
      if train:
        variables = [v for v in graph.trainable_variables]
        grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
        pairs = [(g, v) for g, v in zip(grads, variables) if g is not None]
        lr = tf.cast(learning_rate.learning_rate_schedule(hparams), tf.float32)
        mtf_lr = mtf.import_tf_tensor(mesh, lr, mtf.Shape([]))
        update_ops = make_optimizer(hparams, mtf_lr).apply_grads(
            [g for g, _ in pairs], [v for _, v in pairs])
        update_ops += net.update_ops  # k-means EMA steps
      else:
        logits = mtf.anonymize(logits) if use_tpu else logits
    lowering = mtf.Lowering(graph, {mesh: mesh_impl}, autostack=False)
    tf_loss = tf.cast(lowering.export_to_tf_tensor(loss), tf.float32)
    restore_hook, saver_hook = saver_hooks(lowering, hparams, config)

    if train:
      train_op = train_step(lowering, update_ops, global_step)
      if not use_tpu:
        tf.summary.scalar("learning_rate", lr)
        tf.summary.scalar("losses/training", lowering.export_to_tf_tensor(xent))
        tf.summary.scalar("losses/extra_loss", lowering.export_to_tf_tensor(extra))
        return tf.estimator.EstimatorSpec(mode, loss=tf_loss, train_op=train_op,
                                          training_chief_hooks=[restore_hook, saver_hook])
      t2t_model.remove_summaries()
      return tf.estimator.tpu.TPUEstimatorSpec(mode, loss=tf_loss, train_op=train_op,
                                               training_hooks=[restore_hook, saver_hook])

    # EVAL: T2T's metrics of the problem on logits [b, n, 1, 1, vocab] cut to the real inputs.
    tf_logits = lowering.export_to_tf_tensor(logits)
    real = tf.shape(features["targets"])
    tf_logits = tf_logits[:real[0], :real[1], :vocab_size][:, :, tf.newaxis, tf.newaxis, :]
    fns = metrics.create_evaluation_metrics([hparams.problem], hparams)
    if use_tpu:
      def metric_fn(logits_, targets_):
        return {name: fn(logits_, None, targets_) for name, fn in fns.items()
                if name.split("/")[-1] not in t2t_model.TPU_METRIC_BLACKLIST}
      return tf.estimator.tpu.TPUEstimatorSpec(
          mode, loss=tf_loss, evaluation_hooks=[restore_hook],
          eval_metrics=(metric_fn, [tf_logits, features["targets"]]))
    eval_metrics = {name: fn(tf_logits, features, features["targets"])
                    for name, fn in fns.items()}
    return tf.estimator.EstimatorSpec(mode, loss=tf_loss, eval_metric_ops=eval_metrics,
                                      evaluation_hooks=[restore_hook],
                                      predictions={"predictions": tf_logits})
