"""The Mesh-TF LM on CPU placement meshes of 1, 2 and 4 devices (devices=[""] * n).

With the same initial weights and batch, the loss, the loss after one training step (Adafactor
plus the k-means EMA update) and the updated centroids agree across meshes and layouts.
"""
import re

import numpy as np
import pytest
import tensorflow as tf

import routing_transformer  # pylint: disable=unused-import
import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top,wrong-import-order

tf1 = tf.compat.v1
VOCAB = 74  # padded to 80 by vocab_divisor=8

MESHES = [
    ("model:1", "heads:model"),
    ("model:2", "batch:batch;heads:model;local_heads:model;routing_heads:model;d_ff:model;"
                "vocab:model"),
    ("batch:2;model:2", "batch:batch;heads:model;local_heads:model;routing_heads:model;"
                        "d_ff:model;vocab:model"),
]


@pytest.fixture(scope="module")
def modules():
  import hparams  # pylint: disable=g-import-not-at-top,unused-import
  from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
  from routing_transformer.mtf import estimator  # pylint: disable=g-import-not-at-top
  from routing_transformer.mtf import model  # pylint: disable=g-import-not-at-top
  return registry, estimator, model


def tiny_hparams(hp_overrides=None):
  """Tiny routing set: layer 0 has 4 local heads, layer 1 two local and two routing heads."""
  from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
  hp = registry.hparams("routing_transformer_mtf_test")
  hp.max_relative_position = 5
  hp.learning_rate_schedule = "constant"
  for key, value in (hp_overrides or {}).items():
    hp.set_hparam(key, value)
  return hp


def batch_targets():
  rng = np.random.default_rng(7)
  targets = rng.integers(2, VOCAB, size=(2, 64)).astype(np.int32)
  targets[1, 50:] = 0  # padding
  return targets


def one_step(modules, mesh_shape, layout, initial=None, hp_overrides=None):
  """Loss, loss after one train step, updated centroids, and the initial weights (by name)."""
  _, estimator, model = modules
  hp = tiny_hparams(hp_overrides)
  hp.mesh_shape, hp.layout = mesh_shape, layout
  shape, rules = model.check_mtf_hparams(hp, VOCAB)
  with tf.Graph().as_default():
    tf1.set_random_seed(7)  # the same initial weights whatever ran before in this process
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    net = model.MtfRoutingTransformer(hp, mesh, VOCAB, train=True)
    dims = [net.dims["batch"], net.dims["length"]]
    loss, _, extra, _ = net.loss_and_logits(
        mtf.import_tf_tensor(mesh, tf.constant(batch_targets()), mtf.Shape(dims)))
    variables = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    lr = mtf.import_tf_tensor(mesh, tf.constant(0.05), mtf.Shape([]))
    assert all(g is not None for g in grads)  # every trainable variable is used
    ops = estimator.make_optimizer(hp, lr).apply_grads(grads, variables) + net.update_ops
    impl = estimator.make_mesh_impl(shape, rules)
    lowering = mtf.Lowering(graph, {mesh: impl}, autostack=False)
    tf_loss, tf_extra = lowering.export_to_tf_tensor(loss), lowering.export_to_tf_tensor(extra)
    train_op = tf.group([lowering.lowered_operation(op) for op in ops])
    masters = {v.op.name: v for v in tf1.global_variables()}
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      if initial is not None:
        for name, value in initial.items():
          masters[name].load(value, sess)
      start = {name: sess.run(v) for name, v in masters.items()}
      sess.run(lowering.copy_masters_to_slices())
      loss0, extra0 = sess.run([tf_loss, tf_extra])
      sess.run(train_op)
      loss1 = sess.run(tf_loss)
      sess.run(lowering.copy_slices_to_masters())
      means = {n: sess.run(v) for n, v in masters.items() if n.endswith("/means")}
  return dict(loss0=loss0, extra0=extra0, loss1=loss1, means=means, start=start,
              slices=impl.size)


@pytest.fixture(scope="module")
def reference(modules):
  return one_step(modules, *MESHES[0])


@pytest.mark.parametrize("mesh_shape,layout", MESHES[1:], ids=["model2", "batch2_model2"])
def test_same_loss_on_1_2_and_4_devices(modules, reference, mesh_shape, layout):
  got = one_step(modules, mesh_shape, layout, initial=reference["start"])
  assert got["slices"] == int(np.prod([int(d.split(":")[1]) for d in mesh_shape.split(";")]))
  assert np.isfinite(reference["loss0"]) and reference["loss0"] > 1.0
  assert reference["extra0"] > 0  # the routing layer's commitment loss is in the loss
  assert got["loss0"] == pytest.approx(reference["loss0"], abs=1e-4)
  assert got["extra0"] == pytest.approx(reference["extra0"], rel=1e-4)
  assert abs(reference["loss1"] - reference["loss0"]) > 1e-3  # the step changed the weights
  assert got["loss1"] == pytest.approx(reference["loss1"], abs=1e-4)
  assert got["means"] and set(got["means"]) == set(reference["means"])
  for name, value in got["means"].items():  # EMA-updated centroids agree too
    assert not np.allclose(value, reference["start"][name])
    np.testing.assert_allclose(value, reference["means"][name], atol=1e-5)


def test_initial_loss_is_near_uniform(reference):
  # Untrained logits are small: the cross-entropy starts near log(vocab) (padded ids masked).
  assert abs(reference["loss0"] - np.log(VOCAB)) < 1.0


@pytest.mark.parametrize("overrides,message", [
    (dict(mesh_shape="model:4", layout="local_heads:model"),
     "local_heads (size 2) is not divisible by mesh dimension model:4"),
    (dict(mesh_shape="model:2", layout="d_model:model"), "layout splits 'd_model'"),
    (dict(mesh_shape="model:3", layout="vocab:model"), "set vocab_divisor=3"),
    (dict(routing_mode="causal_window"), "routing_mode='causal_window' is not supported"),
    (dict(num_encoder_layers=2), "routing_transformer_mtf is decoder-only"),
    (dict(mesh_shape="model=2"), "cannot parse mesh_shape"),
])
def test_unsupported_hparams_fail_with_the_fix(modules, overrides, message):
  _, _, model = modules
  hp = tiny_hparams(overrides)
  with pytest.raises(model.MtfHParamsError, match=re.escape(message)):
    model.check_mtf_hparams(hp, VOCAB)
