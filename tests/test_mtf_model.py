"""The Mesh-TF LM on CPU placement meshes of 1, 2 and 4 devices (devices=[""] * n).

With the same initial weights and batch, every mesh and layout computes the same loss, the same
gradient of every variable, the same k-means statistics and updated centroids, the same one-step
update (Adafactor plus the k-means EMA update) and the same loss after it; and its train step
reads every variable before it updates it.
"""
import re

import numpy as np
import pytest
import tensorflow as tf

from routing_transformer.t2t import patches

patches.install(["tf_aliases"])  # mesh_tensorflow imports what TF 2.14 dropped
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
  from routing_transformer.t2t.mtf import estimator  # pylint: disable=g-import-not-at-top
  from routing_transformer.t2t.mtf import model  # pylint: disable=g-import-not-at-top
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


ASSIGNS = ("AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp")


def unordered_reads(train_op):
  """Variables (slices) the step reads in an op that is neither before nor after its update.

  Such a read sees the old or the new value as the threads happen to go: a race. Each op of the
  step gets the bitmask of the reads and updates above it (ops in creation order, a topological
  order).
  """
  in_step, todo = set(), [train_op]
  while todo:
    op = todo.pop()
    if op not in in_step:
      in_step.add(op)
      todo.extend([t.op for t in op.inputs] + list(op.control_inputs))
  ops = [op for op in train_op.graph.get_operations() if op in in_step]
  bit = {op: 1 << i for i, op in enumerate(
      op for op in ops if op.type == "ReadVariableOp" or op.type in ASSIGNS)}
  above = {}
  for op in ops:
    above[op] = bit.get(op, 0)
    for parent in [t.op for t in op.inputs] + list(op.control_inputs):
      above[op] |= above[parent]
  return sorted({op.inputs[0].op.name for op in ops if op.type in ASSIGNS and any(
      read.type == "ReadVariableOp" and read in bit and not above[op] & bit[read] and
      not above[read] & bit[op] for read in op.inputs[0].consumers())})


def one_step(modules, mesh_shape, layout, initial=None):
  """Before and after one train step on a mesh: loss, gradients, weights (by name), races."""
  _, estimator, model = modules
  hp = tiny_hparams()
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
    before = dict(loss=lowering.export_to_tf_tensor(loss),
                  extra=lowering.export_to_tf_tensor(extra),
                  grads={v.name: lowering.export_to_tf_tensor(g) for v, g in zip(variables, grads)})
    train_op = estimator.train_step(lowering, ops, tf1.train.get_or_create_global_step())
    masters = {v.op.name: v for v in tf1.global_variables()}
    with tf1.Session() as sess:
      feed = {} if initial is None else {  # all initial values in one run
          v.initializer.inputs[1]: initial[name] for name, v in masters.items()}
      sess.run(tf1.global_variables_initializer(), feed)
      start = sess.run(masters)
      sess.run(lowering.copy_masters_to_slices())
      got = sess.run(before)
      sess.run(train_op)
      got["loss1"] = sess.run(before["loss"])
      sess.run(lowering.copy_slices_to_masters())
      end = sess.run(masters)
  return dict(got, start=start, end=end, slices=impl.size, races=unordered_reads(train_op))


@pytest.fixture(scope="module")
def reference(modules):
  return one_step(modules, *MESHES[0])


def test_train_step_reads_every_variable_before_updating_it(reference):
  # Mesh-TF hands each consumer the tf variable itself; a read in the backward pass (dx = dy W)
  # or of the centroids in the commitment loss was not ordered before the same step's update.
  assert reference["races"] == []


def test_race_check_sees_raw_mtf_variables(modules):
  """Raw, w2 is read again for the backward dh = dz w2, which its update does not wait for."""
  from routing_transformer.t2t.mtf import attention  # pylint: disable=g-import-not-at-top
  found = {}
  for name, get_variable in (("raw", mtf.get_variable), ("read_once", attention.get_variable)):
    with tf.Graph().as_default():
      graph = mtf.Graph()
      mesh = mtf.Mesh(graph, "mesh")
      a, b = mtf.Dimension("a", 3), mtf.Dimension("b", 3)
      x = mtf.import_tf_tensor(mesh, tf.ones([3]), mtf.Shape([a]))
      h = mtf.einsum([x, get_variable(mesh, "w1", mtf.Shape([a, b]))], output_shape=[b])
      y = mtf.reduce_sum(mtf.square(mtf.einsum([h, get_variable(mesh, "w2", mtf.Shape([b, a]))],
                                               output_shape=[a])))
      variables = graph.trainable_variables
      grads = mtf.gradients([y], [v.outputs[0] for v in variables])
      ops = mtf.optimize.SgdOptimizer(0.1).apply_grads(grads, variables)
      impl = mtf.placement_mesh_impl.PlacementMeshImpl(
          mtf.convert_to_shape("m:1"), mtf.convert_to_layout_rules(""), [""])
      lowering = mtf.Lowering(graph, {mesh: impl}, autostack=False)
      found[name] = unordered_reads(tf.group([lowering.lowered_operation(op) for op in ops]))
  assert found == {"raw": ["w2"], "read_once": []}


def test_one_step_moves_weights_and_centroids(reference):
  assert np.isfinite(reference["loss"]) and reference["loss"] > 1.0
  assert reference["extra"] > 0  # the routing layer's commitment loss is in the loss
  assert abs(reference["loss1"] - reference["loss"]) > 1e-3
  for name in reference["grads"]:  # (zero biases move by lr * 1e-3, Adafactor's epsilon2)
    assert (reference["end"][name] != reference["start"][name]).any(), name
  counts = [n for n in reference["end"] if n.endswith("/ema_count")]
  assert counts
  real = int((batch_targets() != 0).sum())
  for name in counts:  # one step of EMA (decay 0.999) over every real position of every head
    heads = reference["end"][name].shape[0]
    assert reference["end"][name].sum() == pytest.approx(0.001 * heads * real, rel=1e-5)
    means = name.replace("ema_count", "means")
    assert not np.allclose(reference["end"][means], reference["start"][means])


def relative_error(got, want):
  return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


@pytest.mark.parametrize("mesh_shape,layout", MESHES[1:], ids=["model2", "batch2_model2"])
def test_same_step_on_1_2_and_4_devices(modules, reference, mesh_shape, layout):
  """Tolerances are relative to the largest entry of each tensor. Measured (AVX-512; oneDNN
  limited to AVX2, 1 to 32 threads; oneDNN off): gradients differ by <= 1.3e-6, the k-means
  statistics and centroids by <= 7.1e-8, the Adafactor steps by the rounding of the weights, the
  losses by 1 float32 ulp; the routing decisions before and after the step have margins >= 1200x
  the score differences. A real difference (a batch shard's statistics or gradient left out,
  doubled, or padded differently) is 1e-2 or more."""
  got = one_step(modules, mesh_shape, layout, initial=reference["start"])
  assert got["slices"] == int(np.prod([int(d.split(":")[1]) for d in mesh_shape.split(";")]))
  assert got["races"] == []
  assert got["loss"] == pytest.approx(reference["loss"], rel=1e-5)
  assert got["extra"] == pytest.approx(reference["extra"], rel=1e-4)
  assert set(got["grads"]) == set(reference["grads"])
  for name, want in reference["grads"].items():
    assert relative_error(got["grads"][name], want) < 1e-5, name
  kmeans = [n for n in reference["end"] if n.endswith(("/means", "/ema_count", "/ema_means"))]
  assert len(kmeans) == 3
  for name in kmeans:  # statistics of the whole batch (counts, sums) and the new centroids
    assert relative_error(got["end"][name], reference["end"][name]) < 1e-5, name
  for name, grad in reference["grads"].items():
    # Adafactor's first step is lr * RMS(w) * g / |g| per entry: compared where the gradient
    # check above fixes the sign of g (entries below 1e-5 of the largest could flip), up to
    # 1e-5 of the largest step plus the roundings of w + step to float32 on both meshes.
    sure = np.abs(grad) > 1e-5 * np.abs(grad).max()
    step, want = (run["end"][name] - run["start"][name] for run in (got, reference))
    rounding = 2 * np.spacing(np.abs(reference["end"][name]).max())
    assert np.abs(step - want)[sure].max() <= 1e-5 * np.abs(want).max() + rounding, name
  assert got["loss1"] == pytest.approx(reference["loss1"], abs=1e-4)


def test_initial_loss_is_near_uniform(reference):
  # Untrained logits are small: the cross-entropy starts near log(vocab) (padded ids masked).
  assert abs(reference["loss"] - np.log(VOCAB)) < 1.0


@pytest.mark.parametrize("overrides,message", [
    (dict(mesh_shape="model:4", layout="local_heads:model"),
     "local_heads (size 2) is not divisible by mesh dimension model:4"),
    (dict(mesh_shape="model:2", layout="d_model:model"), "layout splits 'd_model'"),
    (dict(mesh_shape="model:3", layout="vocab:model"), "set vocab_divisor=3"),
    (dict(routing_mode="causal_window"), "routing_mode='causal_window': not implemented"),
    (dict(num_encoder_layers=2), "num_encoder_layers=2: not implemented"),
    (dict(mesh_shape="model=2"), "cannot parse mesh_shape"),
    (dict(legacy_kmeans_counts=True), "legacy_kmeans_counts=True: not implemented"),
    (dict(recompute_layers=True, recompute_attention=True),
     "recompute_attention=True, recompute_layers=True: not implemented by "
     "routing_transformer_mtf; unset them or use --model=routing_transformer"),
    # the switches the Mesh-TF model once accepted without reading them
    (dict(routing_exclude_self=True, routing_logit_scale="rsqrt_depth",
          reseed_dead_clusters=True, activation_dtype="bfloat16"),
     "reseed_dead_clusters=True, routing_exclude_self=True, routing_logit_scale='rsqrt_depth', "
     "activation_dtype='bfloat16': not implemented by routing_transformer_mtf"),
])
def test_unsupported_hparams_fail_with_the_fix(modules, overrides, message):
  _, _, model = modules
  hp = tiny_hparams(overrides)
  with pytest.raises(model.MtfHParamsError, match=re.escape(message)) as error:
    model.check_mtf_hparams(hp, VOCAB)
  assert "\n" not in str(error.value)  # one line


def test_every_switch_of_the_tf_model_is_implemented_or_refused(modules):
  """Each hparam of the TF model is in the Mesh-TF allow-list or refused when set: flipping any
  one of them away from its default either passes the check because it is implemented, or fails
  naming it."""
  from hparams import base  # pylint: disable=g-import-not-at-top
  from tensor2tensor.layers import common_hparams  # pylint: disable=g-import-not-at-top
  _, _, model = modules
  defaults = base.sparse_transformer_local().values()
  names = sorted(set(defaults) - set(common_hparams.basic_params1().values()))
  flipped = {bool: lambda v: not v, int: lambda v: v + 1, float: lambda v: v + 0.5,
             str: lambda v: v + "_other", tuple: lambda v: v}
  refused = []
  for name in names:
    value = defaults[name]
    other = flipped[type(value)](value)
    if other == value:
      continue
    hp = tiny_hparams()
    hp.set_hparam(name, other)
    if name in model.MTF_IMPLEMENTS:
      assert name not in model.unimplemented_switches(hp), name
    else:
      assert model.unimplemented_switches(hp) == [name], name
      refused.append(name)
  assert {"routing_exclude_self", "routing_logit_scale", "reseed_dead_clusters",
          "recompute_layers", "routing_mode"} <= set(refused)
