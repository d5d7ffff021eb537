"""recompute_layers: the same training step (gradients, loss, one k-means EMA update) with each
block's activations recomputed in the backward pass, also under XLA (jit_scope)."""
import contextlib
import re

import numpy as np
import pytest
import tensorflow as tf

from routing_transformer.t2t import model as model_lib
from test_model import TRAIN, VOCAB, build, random_targets, small_hparams

tf1 = tf.compat.v1
KMEANS = ("/means:0", "/ema_count:0", "/ema_means:0")
LENGTH = 32


def tiny_hparams(**overrides):
  """2 layers (the second with 2 routing heads of 4 clusters x 8), length 32, hidden 16."""
  h = small_hparams(max_length=LENGTH, max_target_length=LENGTH, hidden_size=16,
                    embedding_dims=16, filter_size=32, sparsity_cluster_attention_window=8,
                    query_shape=(8,), memory_flange=(8,), memory_query_shape=(8,),
                    max_relative_position=9)
  for key, value in overrides.items():
    setattr(h, key, value)
  return h


def _step(hparams, features, initial=None, xla=False):
  """One step in a fresh graph: (values of every variable before, loss, gradients by variable
  name, k-means variables after, the graph)."""
  graph = tf.Graph()
  with graph.as_default():
    with tf.xla.experimental.jit_scope() if xla else contextlib.nullcontext():
      _, losses = build(hparams, TRAIN, features, input_vocab=VOCAB)
      loss = losses["training"] + losses["extra_loss"]
      variables = tf1.trainable_variables()
      grads = [tf.convert_to_tensor(g) for g in tf1.gradients(loss, variables)]
    kmeans = {v.name: v for v in tf1.global_variables() if v.name.endswith(KMEANS)}
    every = {v.name: v for v in tf1.global_variables()}
    # Few session.run signatures (each one prunes and optimises the graph again): the initial
    # values go in as feeds of the initializers' inputs, the variables come out in one fetch.
    feeds = {} if initial is None else {
        v.initializer.inputs[1]: initial[name] for name, v in every.items()}
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer(), feeds)
      before = sess.run(every)
      metadata = tf1.RunMetadata()
      loss_value, grad_values = sess.run(  # also runs the centroid update
          [loss, grads], options=tf1.RunOptions(output_partition_graphs=True),
          run_metadata=metadata)
      after = sess.run(kmeans)
  compiled = [n for g in metadata.partition_graphs for n in g.node if n.op == "_XlaRun"]
  assert bool(compiled) == xla  # jit_scope really compiled clusters with XLA
  grads = {v.name: g for v, g in zip(variables, grad_values)}
  return before, loss_value, grads, after, graph


def _consumers_of(graph, suffix):
  """Ops using the handle of the variables named *suffix, except their initializers."""
  handles = [op.outputs[0] for op in graph.get_operations()
             if op.type == "VarHandleOp" and op.name.endswith(suffix)]
  return [c for h in handles for c in h.consumers() if c.name != h.op.name + "/Assign"]


# Each case builds and runs the step twice (a few seconds each); XLA compiles both.
CASES = [
    ("encoder_decoder", False, dict(num_encoder_layers=1)),
    ("separate_keys_no_ema_xla", True, dict(share_qk=False, ema=False)),
    # pre-norm (no postprocess tail) and a T2T norm (the whole block, postprocess included)
    ("pre_norm", False, dict(layer_preprocess_sequence="n", layer_postprocess_sequence="da")),
    ("t2t_l2_norm", False, dict(norm_type="l2")),
    # q, k, v kept (the routing heads' keys too), the attention outside the units
    ("keep_qkv_separate_keys", False, dict(share_qk=False, recompute_attention=True,
                                           recompute_keep_qkv=True)),
]


@pytest.mark.parametrize("case,xla,overrides", CASES, ids=[c[0] for c in CASES])
def test_recompute_equals_the_plain_step(rng, case, xla, overrides):
  del case
  features = {"targets": random_targets(rng, length=LENGTH, pad_from=28)}
  if overrides.get("num_encoder_layers"):
    features["inputs"] = random_targets(rng, length=LENGTH, pad_from=20)
  before, loss, grads, after, _ = _step(tiny_hparams(**overrides), features, xla=xla)
  before2, loss2, grads2, after2, graph = _step(
      tiny_hparams(recompute_layers=True, **overrides), features, before, xla=xla)
  assert set(before2) == set(before)  # recompute creates no variables
  np.testing.assert_allclose(loss2, loss, rtol=1e-6)
  assert set(grads2) == set(grads) and len(grads) > 10
  for name, g in grads.items():
    np.testing.assert_allclose(grads2[name], g, rtol=1e-5, atol=1e-6, err_msg=name)
  assert set(after2) == set(after) and after
  for name, value in after.items():  # one EMA step from the same statistics
    np.testing.assert_allclose(after2[name], value, rtol=1e-5, atol=1e-7, err_msg=name)
    if overrides.get("ema", True) or not name.endswith("/means:0"):
      assert np.abs(value - before[name]).max() > 0, name  # the update ran
  # The update is built once per layer, and the backward replay reads no centroid variable.
  for suffix in KMEANS[1:]:
    writes = [op for op in _consumers_of(graph, suffix.replace(":0", ""))
              if op.type == "AssignVariableOp"]
    assert len(writes) == 1, (suffix, writes)
  if overrides.get("ema", True):
    assert not [op.name for op in _consumers_of(graph, "/means") if "recompute" in op.name]
  else:  # trainable means: the codebook loss reads them (no EMA writes them)
    assert [op for op in _consumers_of(graph, "/means") if op.type == "AssignVariableOp"] == []


def test_recompute_refuses_random_numbers_inside_blocks(rng):
  with tf.Graph().as_default():
    with pytest.raises(model_lib.HParamsError, match="relu_dropout"):
      build(tiny_hparams(recompute_layers=True, relu_dropout=0.1), TRAIN,
            {"targets": random_targets(rng, length=LENGTH)})


def test_recompute_is_off_by_default_and_ignored_outside_training(rng):
  assert small_hparams().recompute_layers is False
  with tf.Graph().as_default():
    build(tiny_hparams(recompute_layers=True, relu_dropout=0.1),
          tf.estimator.ModeKeys.EVAL, {"targets": random_targets(rng, length=LENGTH)})


def test_residual_split():
  assert model_lib.residual_split("dan") == ("da", "n")  # post-norm: the norm starts the next unit
  assert model_lib.residual_split("da") == ("da", "")
  assert model_lib.residual_split("none") == ("", "")
  assert model_lib.residual_split("n") == ("n", "")  # no residual
  assert model_lib.residual_split("nda") == ("nda", "")  # normalises before the residual
  assert model_lib.residual_split("zdn") == ("z", "dn")


def _ran(hparams, rng):
  """(graph, names of the ops one training step's gradients ran)."""
  graph = tf.Graph()
  with graph.as_default():
    _, losses = build(hparams, TRAIN, {"targets": random_targets(rng, length=LENGTH)})
    grads = tf1.gradients(losses["training"] + losses["extra_loss"], tf1.trainable_variables())
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      metadata = tf1.RunMetadata()
      sess.run(grads, options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE),
               run_metadata=metadata)
  return graph, {node.node_name for dev in metadata.step_stats.dev_stats
                 for node in dev.node_stats}


def test_replay_stops_before_the_w3_product_and_the_post_norm(rng):
  """The recomputed block is cut at its FFN's residual sum, whose gradient reads no values: the
  backward pass re-runs neither the W3 product (nor the post-norm after it) nor the whole x W1
  and x W2, which the FFN's backward chunks compute from their rows of x instead."""
  hparams = tiny_hparams(recompute_layers=True)
  graph, ran = _ran(hparams, rng)
  # the replay's own forward ops: .../IdentityN_grad/self_attention/recompute/<op>, once nested
  replay = re.compile(r"^gradients/[^/]+/body/decoder_layer_\d/self_attention/IdentityN_grad/"
                      r"self_attention/recompute/(.*)$")
  ops = {op.name: replay.match(op.name).group(1) for op in graph.get_operations()
         if replay.match(op.name) and "IdentityN_grad" not in replay.match(op.name).group(1)}
  w1 = [name for name, rest in ops.items() if re.match(r"ffn/weight1(_\d+)?/Tensordot/MatMul$",
                                                        rest)]
  w3 = [name for name, rest in ops.items() if re.match(r"ffn/MatMul(_\d+)?$", rest)]
  assert len(w1) == 2 and not set(w1) & ran  # in the graph, not run
  assert len(w3) == 2 and not set(w3) & ran
  # the FFN's backward chunks: x_c W1 and x_c W2, [rows, hidden] x [hidden, filter] products
  chunks = [op for op in graph.get_operations() if op.type == "MatMul"
            and re.search(r"/recompute/ffn/IdentityN_grad/MatMul(_\d+)?$", op.name)
            and not op.get_attr("transpose_a") and not op.get_attr("transpose_b")
            and op.inputs[1].shape.as_list() == [hparams.hidden_size, hparams.filter_size]]
  assert len(chunks) == 2 * 2 and {op.name for op in chunks} <= ran
  # Nor does the post-norm after it: block 0's replay does not read its variables, block 1's
  # does (its unit starts with that norm of block 0's residual sum).
  scale = "decoder_layer_0/self_attention/layer_postprocess_1/layer_norm/layer_norm_scale"
  reads = [op.name for op in _consumers_of(graph, scale) if op.type == "ReadVariableOp"]
  assert not [name for name in reads if "decoder_layer_0/self_attention/IdentityN_grad/" in name]
  assert [name for name in reads if "decoder_layer_1/self_attention/IdentityN_grad/" in name]


@pytest.mark.parametrize("attention,keep", [(False, None), (True, None), (True, "heads"),
                                            (True, "qkv")],
                         ids=["kept", "recomputed", "recomputed_keep_heads",
                              "recomputed_keep_qkv"])
def test_replay_runs_the_attention_only_where_needed(rng, attention, keep):
  """recompute_layers: a block's replay runs the attention's forward pass (local einsums,
  routing cluster matmuls), for what the attention's backward pass reads (without
  recompute_attention) or for the heads' output (head_dense and output_transform read it for
  their kernels' gradients). With recompute_attention and recompute_keep_heads the heads are a
  unit of their own whose output the block keeps: no replay runs the attention, which runs once
  more only inside its own recomputation. With recompute_keep_qkv neither does any replay run
  the q, k, v projections (the unit before the attention ends with them: their values are not
  needed), while the forward pass does."""
  graph, ran = _ran(tiny_hparams(recompute_layers=True, recompute_attention=attention,
                                 recompute_keep_heads=keep == "heads",
                                 recompute_keep_qkv=keep == "qkv"), rng)
  # x [positions, hidden] times a kernel's columns [hidden, some heads]
  projections = [op.name for op in graph.get_operations() if op.type == "MatMul" and re.search(
      r"/self_attention/(recompute/)?self_attention/Tensordot(_\d+)?/MatMul$", op.name)
                 and op.inputs[1].shape[0] == 16 and op.inputs[0].shape[-1] == 16]
  replayed_projections = [name for name in projections if "/recompute/" in name]
  assert len(projections) > len(replayed_projections) > 0
  assert bool(set(replayed_projections) & ran) == (keep != "qkv")
  assert set(projections) - set(replayed_projections) <= ran  # the forward's
  # [b, h, blocks or clusters, queries, keys or depth] products (not the k-means scores)
  attention_ops = [op.name for op in graph.get_operations()
                   if op.type in ("Einsum", "BatchMatMulV2") and op.inputs[0].shape.rank == 5]
  # ops of a replay's own forward pass: .../recompute/self_attention/<op>, not inside the
  # recomputation of a recompute_attention function (.../IdentityN_<k>_grad/recompute/...)
  replayed = [name for name in attention_ops if re.search(
      r"_grad/self_attention/recompute/self_attention/(?!IdentityN)", name) and
              "/gradients/" not in name.split("/recompute/self_attention/")[-1]]
  recomputed = [name for name in attention_ops
                if re.search(r"IdentityN_\d+_grad/recompute/", name)]
  assert bool(set(replayed) & ran) == (keep is None)
  assert bool(set(recomputed) & ran) == attention
