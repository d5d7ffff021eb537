"""Each model family learns: a tiny configuration memorises one fixed batch.

Two sequences of 64 random tokens (vocabulary 40, seed 0), the same batch at every step, trained
through the model's own training path (T2T's optimize: Adafactor at a constant rate 0.01, as the
paper's flat phase) from graph seed 1: the cross-entropy must fall from about log(39) = 3.66 to
below LOSS_BOUND within STEPS steps, for routing (topk), routing_mode="causal_window", local,
full attention, and the Mesh-TF model.
"""
import numpy as np
import pytest
import tensorflow as tf

import routing_transformer  # pylint: disable=unused-import
from routing_transformer.t2t import model as model_lib
from hparams import sets
from tensor2tensor.data_generators import problem_hparams

tf1 = tf.compat.v1
TRAIN = tf.estimator.ModeKeys.TRAIN
VOCAB = 40
STEPS = 150
LOSS_BOUND = 0.5


def fixed_batch():
  return np.random.default_rng(0).integers(1, VOCAB, (2, 64, 1, 1)).astype(np.int32)


def family_hparams(family):
  hparams = {"routing": sets.routing_transformer_test,
             "causal_window": sets.routing_transformer_test_causal,
             "local": sets.local_transformer_test,
             "full": lambda: sets._full(sets.local_transformer_test())}[family]()  # pylint: disable=protected-access
  hparams.learning_rate_schedule = "constant"
  hparams.learning_rate_constant = 0.01
  return hparams


def train_tf(hparams, steps=STEPS):
  """Cross-entropy ("training" loss) at every step of training on the fixed batch."""
  batch = fixed_batch()
  with tf.Graph().as_default():
    tf1.set_random_seed(1)
    model = model_lib.RoutingTransformer(
        hparams, TRAIN, problem_hparams.test_problem_hparams(VOCAB, VOCAB, hparams))
    _, losses = model({"targets": tf.constant(batch)})
    train_op = model.optimize(sum(losses[key] for key in sorted(losses)))
    with tf1.Session() as sess:
      sess.run([tf1.global_variables_initializer(), tf1.local_variables_initializer()])
      return [sess.run([losses["training"], train_op])[0] for _ in range(steps)]


@pytest.mark.parametrize("family", ["routing", "causal_window", "local", "full"])
def test_memorises_a_fixed_batch(family):
  losses = train_tf(family_hparams(family))
  assert losses[0] > 3.0, losses[0]  # starts near uniform
  assert min(losses[-5:]) < LOSS_BOUND, (family, losses[::10])


def test_mesh_tf_memorises_a_fixed_batch():
  """The Mesh-TF model (`routing_transformer_mtf_test` on a 2-device placement mesh, heads and
  d_ff split) through its estimator's optimizer and train step."""
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
  from routing_transformer.t2t.mtf import estimator  # pylint: disable=g-import-not-at-top
  from routing_transformer.t2t.mtf import model  # pylint: disable=g-import-not-at-top
  hp = registry.hparams("routing_transformer_mtf_test")
  hp.mesh_shape, hp.layout = "model:2", "heads:model;local_heads:model;d_ff:model"
  hp.learning_rate_schedule, hp.learning_rate_constant = "constant", 0.01
  shape, rules = model.check_mtf_hparams(hp, VOCAB)
  with tf.Graph().as_default():
    tf1.set_random_seed(1)
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    net = model.MtfRoutingTransformer(hp, mesh, VOCAB, train=True)
    targets = mtf.import_tf_tensor(mesh, tf.constant(fixed_batch()[:, :, 0, 0]),
                                   mtf.Shape([net.dims["batch"], net.dims["length"]]))
    loss, xent, _, _ = net.loss_and_logits(targets)
    variables = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    lr = mtf.import_tf_tensor(mesh, tf.constant(0.01), mtf.Shape([]))
    ops = estimator.make_optimizer(hp, lr).apply_grads(grads, variables) + net.update_ops
    lowering = mtf.Lowering(graph, {mesh: estimator.make_mesh_impl(shape, rules,
                                                                    devices=["", ""])},
                            autostack=False)
    xent = lowering.export_to_tf_tensor(xent)
    train_op = estimator.train_step(lowering, ops, tf1.train.get_or_create_global_step())
    with tf1.Session() as sess:
      sess.run([tf1.global_variables_initializer(), tf1.local_variables_initializer()])
      sess.run(lowering.copy_masters_to_slices())
      losses = [sess.run([xent, train_op])[0] for _ in range(STEPS)]
  assert losses[0] > 3.0, losses[0]
  assert min(losses[-5:]) < LOSS_BOUND, losses[::10]
