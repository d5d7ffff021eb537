"""The training step of every model family compiles with XLA (the TPU path) and gives the values
of TF's executor, and the T2T training step with default hparams holds no host-only op.

XLA: each family's loss, gradients, k-means update and non-finite status are built once for the
executor and once inside `tf.xla.experimental.compile` (graph mode; one XLA computation, which
fails on any op XLA cannot compile), over the same variables, and run from the same values.
"""
import os

import numpy as np
import pytest
import tensorflow as tf

from routing_transformer.core import health
from routing_transformer.t2t import model as model_lib
from routing_transformer.t2t import patches
from test_model import TRAIN, VOCAB, build, random_targets, small_hparams

tf1 = tf.compat.v1
LENGTH = 16
# XLA's CPU compiler without LLVM's optimisation passes: each step here runs once, and compiling
# the families' steps took 52 s with them, 11 s without (a 2-core CPU). XLA reads the flags at its
# first compilation in the process; a run's own XLA_FLAGS win.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0 "
                                   "--xla_llvm_disable_expensive_passes=true")

# Op types that run on the host only (or copy to it): string ops, Assert, Print, Python calls.
HOST_ONLY = {"Assert", "Print", "PrintV2", "PyFunc", "PyFuncStateless", "EagerPyFunc",
             "StringFormat", "StringJoin", "AsString", "StringToNumber", "Substr",
             "RegexReplace", "StaticRegexReplace", "StringSplit", "StringSplitV2"}


def tiny(**overrides):
  """One layer of 2 local and 2 routing heads (2 clusters x 8) over 16 positions, hidden 16."""
  return small_hparams(max_length=LENGTH, max_target_length=LENGTH, hidden_size=16,
                       embedding_dims=16, filter_size=32, num_decoder_layers=1,
                       num_hidden_layers=1, sparsity_skip_first=0, sparsity_cluster_size=2,
                       sparsity_cluster_attention_window=8, query_shape=(8,),
                       memory_flange=(8,), memory_query_shape=(8,), max_relative_position=9,
                       **overrides)


FAMILIES = {
    "routing_topk": {},
    "routing_causal_window": dict(routing_mode="causal_window"),
    "local": dict(local_num_heads=4, sparsity_cluster_num_heads=0),
    "full": dict(local_num_heads=4, sparsity_cluster_num_heads=0, full_attention=True),
    "encoder_decoder": dict(num_encoder_layers=1),
}


def fast_session():
  """A session without Grappler's rewrites (the steps here run once: optimising costs more)."""
  from tensorflow.core.protobuf import rewriter_config_pb2  # pylint: disable=g-import-not-at-top
  rewrites = rewriter_config_pb2.RewriterConfig(disable_meta_optimizer=True)
  return tf1.Session(config=tf1.ConfigProto(graph_options=tf1.GraphOptions(
      rewrite_options=rewrites)))


def same_step_under_xla(computation):
  """(executor's values, XLA's values) of computation() from the same variable values."""
  with tf1.variable_scope("", reuse=tf1.AUTO_REUSE):
    plain = computation()
  with tf1.variable_scope("", reuse=tf1.AUTO_REUSE):  # the same variables, no new ones
    compiled = tf1.xla.experimental.compile(computation)
  every = tf1.global_variables() + tf1.local_variables()
  with fast_session() as sess:
    sess.run([tf1.global_variables_initializer(), tf1.local_variables_initializer()])
    start = sess.run(every)
    executor = sess.run(plain)
    sess.run([v.initializer for v in every],
             {v.initializer.inputs[1]: value for v, value in zip(every, start)})
    xla = sess.run(compiled)
  return executor, xla


def test_t2t_training_step_compiles_with_xla_and_gives_the_executors_values(rng, monkeypatch):
  """Every family, each in its own variable scope, in one computation (one XLA compilation)."""
  # Under XLA the model takes its TPU path: k-means statistics summed over replicas, which on
  # one replica is the identity (CrossReplicaSum has no CPU kernel).
  monkeypatch.setattr(model_lib, "cross_replica_sum", lambda counts, sums: (counts, sums))
  features = {family: {"targets": random_targets(rng, length=LENGTH, pad_from=13)}
              for family in FAMILIES}
  features["encoder_decoder"]["inputs"] = random_targets(rng, length=LENGTH, pad_from=10)

  def family_step(family):
    with tf1.variable_scope(family):
      _, losses = build(tiny(**FAMILIES[family]), TRAIN, features[family], input_vocab=VOCAB)
    loss = losses["training"] + losses["extra_loss"]  # runs the k-means update too
    variables = tf1.trainable_variables(family + "/")
    grads = [tf.convert_to_tensor(g) for g in tf1.gradients(loss, variables)]
    centroids = [v for v in tf1.global_variables(family + "/") if v.op.name.endswith("/means")]
    assert bool(centroids) == (family not in ("local", "full")), family
    return [loss, health.status(loss, grads, centroids)] + grads

  sizes = {}

  def computation():
    outputs = []
    for family in FAMILIES:
      outputs += family_step(family)
      sizes[family] = len(outputs)
    return outputs

  with tf.Graph().as_default():
    executor, xla = same_step_under_xla(computation)
  start = 0
  for family, end in sizes.items():
    want, got = executor[start:end], xla[start:end]
    assert np.isfinite(want[0]) and want[1] == 0 and got[1] == 0, family
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, err_msg=family)
    assert len(got) > 10, family
    for g, w in zip(got[2:], want[2:]):
      np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6, err_msg=family)
    start = end


def test_mtf_lowered_loss_compiles_with_xla_and_gives_the_executors_values():
  patches.install(["tf_aliases"])
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
  import hparams as hparams_sets  # pylint: disable=g-import-not-at-top,unused-import
  from routing_transformer.t2t.mtf import estimator  # pylint: disable=g-import-not-at-top
  from routing_transformer.t2t.mtf import model  # pylint: disable=g-import-not-at-top
  hp = registry.hparams("routing_transformer_mtf_test")
  hp.max_relative_position = 5
  shape, rules = model.check_mtf_hparams(hp, VOCAB)
  targets = np.random.default_rng(7).integers(2, VOCAB, size=(2, hp.max_length)).astype(np.int32)
  targets[1, hp.max_length - 10:] = 0  # padding
  lowerings = []

  def computation():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    net = model.MtfRoutingTransformer(hp, mesh, VOCAB, train=True)
    dims = mtf.Shape([net.dims["batch"], net.dims["length"]])
    loss, _, _, _ = net.loss_and_logits(mtf.import_tf_tensor(mesh, tf.constant(targets), dims))
    variables = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    lowering = mtf.Lowering(graph, {mesh: estimator.make_mesh_impl(shape, rules)},
                            autostack=False)
    lowerings.append(lowering)
    return [lowering.export_to_tf_tensor(x) for x in [loss] + grads]

  with tf.Graph().as_default():
    with tf1.variable_scope("", reuse=tf1.AUTO_REUSE):
      plain = computation()
    with tf1.variable_scope("", reuse=tf1.AUTO_REUSE):
      compiled = tf1.xla.experimental.compile(computation)
    assert len(tf1.global_variables()) == len(set(tf1.global_variables()))
    with fast_session() as sess:
      sess.run(tf1.global_variables_initializer())
      sess.run(lowerings[0].copy_masters_to_slices())  # the slices both lowerings read
      executor, xla = sess.run([plain, compiled])
  assert np.isfinite(executor[0])
  np.testing.assert_allclose(xla[0], executor[0], rtol=1e-5)
  for got, want in zip(xla[1:], executor[1:]):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def step_op_types(train_op):
  """The op types the training step runs: the ops train_op depends on (inputs and control
  inputs) and every op of the graph's functions (tf.cond / while bodies)."""
  train_op = getattr(train_op, "op", train_op)  # T2T's train op is the loss after the update
  seen, todo = set(), [train_op]
  while todo:
    op = todo.pop()
    if op not in seen:
      seen.add(op)
      todo.extend([t.op for t in op.inputs] + list(op.control_inputs))
  types = {op.type for op in seen}
  for function in train_op.graph.as_graph_def().library.function:
    types.update(node.op for node in function.node_def)
  strings = {op.type for op in seen if any(t.dtype == tf.string for t in op.outputs)}
  return types, strings


def test_t2t_training_step_holds_no_host_only_op():
  """The T2T model_fn's train op with default hparams (routing_transformer_tiny: nan_guard on):
  no string op, Assert, Print or Python call anywhere in the step."""
  import t2t_usr_dir  # pylint: disable=g-import-not-at-top,unused-import
  from tensor2tensor.data_generators import problem_hparams  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import trainer_lib  # pylint: disable=g-import-not-at-top
  hp = trainer_lib.create_hparams("routing_transformer_tiny")
  assert hp.nan_guard
  hp.add_hparam("warm_start_from", None)  # t2t-trainer's flag, which estimator_model_fn reads
  hp.problem_hparams = problem_hparams.test_problem_hparams(VOCAB, VOCAB, hp)
  targets = np.random.default_rng(0).integers(2, VOCAB, (2, hp.max_length, 1, 1))
  with tf.Graph().as_default():
    spec = registry.model("routing_transformer").estimator_model_fn(
        hp, {"targets": tf.constant(targets, tf.int32)}, None, TRAIN)
    types, strings = step_op_types(spec.train_op)
    assert tf1.get_collection(health.COLLECTION)  # the guard is in the step
  assert "If" in types or "StatelessIf" in types or "Switch" in types  # its tf.cond
  assert "IsFinite" in types
  assert not types & HOST_ONLY, sorted(types & HOST_ONLY)
  assert not strings, sorted(strings)


def test_too_long_targets_are_cut_on_the_device_as_the_original_cuts_them():
  """Targets longer than max_target_length are cut to it in the step (the original's body does
  `targets[:, :max_target_length]`; its enwik8 sets train on 4,096 of 8,192 bytes so): the loss
  is the loss of the first max_target_length tokens."""
  hparams = tiny()
  with tf.Graph().as_default():
    targets = tf1.placeholder(tf.int32, [2, None, 1, 1])
    _, losses = build(hparams, TRAIN, {"targets": targets}, input_vocab=VOCAB)
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      ids = np.random.default_rng(3).integers(1, VOCAB, [2, LENGTH + 5, 1, 1]).astype(np.int32)
      whole = sess.run(losses["training"], {targets: ids[:, :LENGTH]})
      assert np.isfinite(whole)
      assert sess.run(losses["training"], {targets: ids}) == whole


def test_mtf_targets_are_padded_on_the_device():
  """routing_transformer_mtf pads T2T's targets to the mesh's [batch, length] without a host op;
  too many or too long fail naming the fix."""
  from routing_transformer.t2t.mtf import estimator  # pylint: disable=g-import-not-at-top
  with tf.Graph().as_default():
    targets = tf1.placeholder(tf.int32, [None, None, 1, 1])
    padded = estimator.pad_targets(targets, 3, 5)
    assert padded.shape.as_list() == [3, 5]
    assert not {op.type for op in tf1.get_default_graph().get_operations()} & HOST_ONLY
    with tf1.Session() as sess:
      got = sess.run(padded, {targets: np.arange(1, 9).reshape([2, 4, 1, 1])})
      np.testing.assert_array_equal(got, [[1, 2, 3, 4, 0], [5, 6, 7, 8, 0], [0] * 5])
      for shape in ([4, 5, 1, 1], [3, 6, 1, 1]):
        with pytest.raises(tf.errors.InvalidArgumentError, match="use_fixed_batch_size"):
          sess.run(padded, {targets: np.ones(shape, np.int32)})
    with pytest.raises(ValueError, match="longer than max_target_length=5"):
      estimator.pad_targets(tf.ones([2, 6, 1, 1], tf.int32), 3, 5)


def test_the_non_finite_guard_compiles_with_xla_and_skips_the_step_on_the_device():
  """health.guarded_update inside one XLA computation: a finite step updates the variable and
  the global step, a non-finite one neither; the status read after it names the step."""
  with tf.Graph().as_default():
    w = tf1.get_variable("w", initializer=tf.ones([3]), use_resource=True)
    poison = tf1.placeholder_with_default(1.0, [])
    step = tf1.train.get_or_create_global_step()

    def computation(scale):
      loss = tf.reduce_sum(w * w) * scale
      grad = tf.gradients(loss, [w])[0]
      update = health.guarded_update(
          lambda: tf.group(w.assign_sub(0.1 * grad), step.assign_add(1)), loss, [(grad, w)],
          [], step)
      with tf.control_dependencies([update]):
        return tf.identity(loss)

    loss = tf1.xla.experimental.compile(computation, [poison])
    with fast_session() as sess:
      sess.run([tf1.global_variables_initializer(), tf1.local_variables_initializer()])
      assert sess.run(loss) == [3.0] and health.failure(sess) is None
      np.testing.assert_allclose(sess.run(w), [0.8] * 3)
      assert np.isnan(sess.run(loss, {poison: np.nan})[0])
      np.testing.assert_allclose(sess.run(w), [0.8] * 3)  # not applied
      assert sess.run(step) == 1
      assert health.failure(sess) == health.MARKER + ": step 1: non-finite loss"
