"""The training step's memory and waste rewrites equal the plain computations, gradients included:
GEGLU's custom gradient, the chunked output projection + cross-entropy (`logits_chunk_size`), the
per-kind q/k/v projections (no routing K with share_qk, no strided slices of the heads) and the
causal_window scoring (the self weight read off a diagonal, the look-back block by tf.slice) and
the recomputed attention of the local and the routing heads (`recompute_attention`); and each
keeps less alive for the backward pass (read off the graph: which forward tensors the gradient
ops read)."""
import contextlib
import functools

import numpy as np
import pytest
import tensorflow as tf

from conftest import HParamsStandIn, benchmark_module
import routing_transformer  # pylint: disable=unused-import
from routing_transformer.core import chunked_loss
from routing_transformer.core import heads
from routing_transformer.core import layers
from routing_transformer.core import norm
from routing_transformer.core import rebuild
from routing_transformer.core import recompute
from routing_transformer.core.attention import causal_window as cw
from routing_transformer.core.attention import common
from routing_transformer.core.attention import local
from routing_transformer.core.attention import routing
from routing_transformer.t2t import model as model_lib
from tensor2tensor.layers import common_layers
from tensorflow.python.grappler import tf_optimizer  # pylint: disable=g-direct-tensorflow-import
from test_model import EVAL, TRAIN, VOCAB, build, random_targets, small_hparams

tf1 = tf.compat.v1


def buffer_of(t):
  """The tensor whose buffer t is: through Identity / IdentityN (which forward their inputs)."""
  while t.op.type in ("Identity", "IdentityN"):
    t = t.op.inputs[t.value_index if t.op.type == "IdentityN" else 0]
  return t


def saved_for_backward(graph, size):
  """Names of the forward tensors (buffers) of `size` elements that gradient ops read: what the
  forward pass must keep alive for the backward pass."""
  saved = set()
  for op in graph.get_operations():
    if not op.name.startswith("gradients"):
      continue
    for t in op.inputs:
      if (not t.op.name.startswith("gradients") and t.dtype.is_floating and
          t.shape.is_fully_defined() and t.shape.num_elements() == size):
        saved.add(buffer_of(t).name)
  return saved


def waits(op):
  """Whether a Slice op waits on something: on the slice itself or on its begin (a constant
  made inside the same control_dependencies block, which the slice then needs)."""
  return bool(op.control_inputs or op.inputs[1].op.control_inputs)


def run_graph(fetches, feeds=None):
  with tf1.Session() as sess:
    sess.run(tf1.global_variables_initializer())
    return sess.run(fetches, feeds)


# --- GEGLU ------------------------------------------------------------------------------------

FFN = HParamsStandIn(ffn_layer="geglu", filter_size=24, hidden_size=8, relu_dropout=0.0)


def plain_geglu(x, w1, w2, w3):
  """The GEGLU block as plain ops (what layers.ffn computed before its custom gradient)."""
  dot = lambda a, w: tf.tensordot(a, w, [[2], [0]])
  return dot(common_layers.gelu(dot(x, w1)) * dot(x, w2), w3)


def ffn_and_plain(rng, dtype, plain=False):
  """(y, gradients of sum(y * cotangent) w.r.t. x and the three kernels, graph) of layers.ffn
  (or, plain=True, of plain_geglu on the same variables) in a new graph."""
  graph = tf.Graph()
  with graph.as_default():
    tf1.set_random_seed(3)  # the same initial values in both graphs (the same ops before them)
    x = tf.constant(rng.standard_normal((2, 5, 8)), dtype)
    with tf1.variable_scope("ffn", initializer=tf1.random_normal_initializer(0.0, 0.5)):
      y = layers.ffn(x, FFN, train=True)
    kernels = [v for v in tf1.global_variables() if v.name.startswith("ffn/weight")]
    assert [v.name for v in kernels] == ["ffn/weight%d/kernel:0" % i for i in (1, 2, 3)]
    assert all(v.dtype.base_dtype == dtype for v in kernels)
    if plain:
      y = plain_geglu(x, *[tf.convert_to_tensor(v) for v in kernels])
    cotangent = tf.constant(rng.standard_normal((2, 5, 8)), dtype)
    grads = tf1.gradients(tf.reduce_sum(y * cotangent), [x] + kernels)
    values = run_graph([y, grads])
  return values, graph


@pytest.mark.parametrize("dtype,rtol", [(tf.float64, 1e-12), (tf.float32, 1e-5)])
def test_geglu_custom_gradient_equals_the_plain_gradient(dtype, rtol):
  (y, grads), _ = ffn_and_plain(np.random.default_rng(0), dtype)
  (y_plain, grads_plain), _ = ffn_and_plain(np.random.default_rng(0), dtype, plain=True)
  np.testing.assert_allclose(y, y_plain, rtol=rtol)
  for got, want, name in zip(grads, grads_plain, ["x", "weight1", "weight2", "weight3"]):
    assert np.abs(want).max() > 0, name
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * np.abs(want).max(), err_msg=name)


def test_geglu_backward_keeps_only_the_two_matmul_outputs():
  """Of the [b, n, filter] tensors, the plain ops keep gelu's input, its intermediates, b and
  the product for the backward pass; the custom gradient keeps x W1 and x W2 only."""
  size = 2 * 5 * FFN.filter_size
  _, graph = ffn_and_plain(np.random.default_rng(0), tf.float32)
  _, plain = ffn_and_plain(np.random.default_rng(0), tf.float32, plain=True)
  assert len(saved_for_backward(plain, size)) >= 5
  kept = saved_for_backward(graph, size)
  assert len(kept) == 2, kept
  producers = {graph.get_tensor_by_name(name).op for name in kept}
  assert all("weight1" in op.name or "weight2" in op.name for op in producers), producers


def test_geglu_activation_gradient_equals_the_plain_gradient(rng):
  """The form used with relu_dropout in training: gelu(a) * b alone."""
  with tf.Graph().as_default():
    a, b, dh = [tf.constant(rng.standard_normal((3, 7)), tf.float64) for _ in range(3)]
    ours = tf1.gradients(layers.geglu_activation(a, b), [a, b], dh)
    plain = tf1.gradients(layers.geglu_hidden(a, b), [a, b], dh)
    ours, plain, y, y_plain = run_graph([ours, plain, layers.geglu_activation(a, b),
                                         layers.geglu_hidden(a, b)])
  np.testing.assert_allclose(y, y_plain, rtol=1e-14)
  for got, want in zip(ours, plain):
    np.testing.assert_allclose(got, want, rtol=1e-12)


def geglu_graph(rng, dtype, chunk_rows, plain=False, chunk_forward=False, keep_products=True,
                rebuild_linear=False):
  """(y, gradients of sum(y * cotangent) w.r.t. x and the three kernels, graph) of
  layers.geglu_ffn over chunks of `chunk_rows` positions (or, plain=True, of plain_geglu) on
  random x [2, 5, 8] and kernels (filter 24) in a new graph."""
  graph = tf.Graph()
  with graph.as_default():
    x = tf.constant(rng.standard_normal((2, 5, 8)), dtype)
    kernels = [tf.constant(rng.standard_normal(shape) * 0.5, dtype)
               for shape in ((8, 24), (8, 24), (24, 8))]
    cotangent = tf.constant(rng.standard_normal((2, 5, 8)), dtype)
    y = (plain_geglu(x, *kernels) if plain else
         layers.geglu_ffn(x, *kernels, chunk_rows=chunk_rows, chunk_forward=chunk_forward,
                          keep_products=keep_products, rebuild_linear=rebuild_linear))
    grads = tf1.gradients(tf.reduce_sum(y * cotangent), [x] + kernels)
    values = run_graph([y, grads])
  return values, graph


KEPT = {"products_kept": (True, False), "x_only": (False, False), "gate_only": (True, True)}
# what the backward pass reads of the forward's products: name -> the scopes that made them
KEPT_READ = {"products_kept": {"weight1", "weight2"}, "x_only": set(), "gate_only": {"weight1"}}


@pytest.mark.parametrize("kept", list(KEPT))
@pytest.mark.parametrize("dtype,rtol,chunk_rows", [
    (tf.float64, 1e-12, 3),   # 10 positions: chunks of 3, 3, 3 and 1
    (tf.float64, 1e-12, 5),
    (tf.float64, 1e-12, 64),  # one chunk
    (tf.float32, 1e-5, 4)])
def test_geglu_chunked_backward_equals_the_plain_gradient(dtype, rtol, chunk_rows, kept):
  """The GEGLU block's backward pass over chunks of positions: the output is the plain ops' bit
  for bit, the gradients w.r.t. x and every kernel equal the plain ones. It reads the forward's
  x W1 and x W2, with keep_products=False only x (each chunk computes its rows of them), with
  rebuild_linear x W1 but not x W2."""
  keep_products, rebuild_linear = KEPT[kept]
  (y, grads), graph = geglu_graph(np.random.default_rng(7), dtype, chunk_rows,
                                  keep_products=keep_products, rebuild_linear=rebuild_linear)
  (y_plain, grads_plain), _ = geglu_graph(np.random.default_rng(7), dtype, chunk_rows,
                                          plain=True)
  np.testing.assert_array_equal(y, y_plain)
  for got, want, name in zip(grads, grads_plain, ["x", "weight1", "weight2", "weight3"]):
    assert np.abs(want).max() > 0, name
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * np.abs(want).max(), err_msg=name)
  assert forward_product_scopes_read_backward(graph) == KEPT_READ[kept]


def forward_product_scopes_read_backward(graph):
  """Which forward [positions, filter 24] tensors gradient ops read, by the name scope that made
  them (weight1 for x W1, weight2 for x W2; any other tensor by its op's name)."""
  def scope(name):
    return next((part for part in name.split("/") if part in ("weight1", "weight2")), name)
  return {scope(t.op.name) for op in graph.get_operations() if op.name.startswith("gradients")
          for t in op.inputs
          if not t.op.name.startswith("gradients") and t.op.type != "Const" and t.shape.rank
          and t.shape[-1] == 24 and t.shape.as_list() != [8, 24]}


def wide_forward_ops(graph):
  """Forward ops (views apart) with an output of [positions, filter 24] over more than one chunk
  of 3 positions (the kernels [8, 24] apart)."""
  return [op.name for op in graph.get_operations()
          if not op.name.startswith("gradients") and op.type not in ("Reshape", "Identity")
          and any(t.shape.rank and t.shape[-1] == 24 and t.shape.num_elements() > 3 * 24
                  and t.shape.as_list() != [8, 24] for t in op.outputs)]


def wide_backward_tensors(graph, filters, most_rows):
  """Outputs of gradient ops (views apart) with `filters` columns and more than `most_rows`
  positions: the [positions, filter] temporaries of a backward pass (kernels [8, f] apart)."""
  return [t.name for op in graph.get_operations()
          if op.name.startswith("gradients") and op.type not in ("Reshape", "Identity")
          for t in op.outputs
          if t.dtype.is_floating and t.shape.rank and t.shape[-1] == filters and
          t.shape.as_list() != [8, filters] and t.shape.num_elements() > most_rows * filters]


def test_geglu_backward_temporaries_hold_one_chunk_of_positions():
  """Every [positions, filter] tensor the chunked backward pass computes holds at most one chunk
  of positions (the plain backward's hold all 10), and the chunks run one after the other: each
  chunk's slices of x, a, b and dy wait for the incoming gradient or the previous chunk."""
  _, graph = geglu_graph(np.random.default_rng(7), tf.float32, 3)
  _, plain = geglu_graph(np.random.default_rng(7), tf.float32, 3, plain=True)
  assert len(wide_backward_tensors(plain, 24, 3)) >= 4
  assert not wide_backward_tensors(graph, 24, 3)
  slices = [op for op in graph.get_operations()
            if op.name.startswith("gradients") and op.type == "Slice"]
  assert len(slices) == 4 * 4  # 4 chunks x (x, a, b, dy)
  assert all(waits(op) for op in slices)
  assert layers.row_chunks(10, 3) == [(0, 3), (3, 3), (6, 3), (9, 1)]


def test_geglu_takes_at_most_sixteen_chunks_where_it_keeps_the_products():
  """1,024 positions per chunk up to 16 chunks, then rows / 16 (rounded up): a 65,536-position
  block's backward pass runs 16 chunks of 4,096 (the graph does not grow with the length); a
  re-run block's FFN (keep_products False) keeps chunks of 1,024."""
  assert [layers.ffn_chunk_rows(r) for r in (10, 8192, 16384, 65536, 65537)] == [
      1024, 1024, 1024, 4096, 4097]
  assert layers.ffn_chunk_rows(65536, keep_products=False) == 1024
  graph = tf.Graph()
  with graph.as_default():
    x = tf.ones([2, 32768, 4])
    w1, w2, w3 = tf.ones([4, 8]), tf.ones([4, 8]), tf.ones([8, 4])
    tf.gradients(tf.reduce_sum(layers.geglu_ffn(x, w1, w2, w3)), [x])
  slices = [op for op in graph.get_operations()
            if op.name.startswith("gradients") and op.type == "Slice"]
  assert len(slices) == 16 * 4  # 16 chunks x (x, a, b, dy)
  assert {tuple(op.outputs[0].shape.as_list()) for op in slices} == {(4096, 4), (4096, 8)}


@pytest.mark.parametrize("rebuild_linear", [False, True], ids=["products_kept", "gate_only"])
@pytest.mark.parametrize("dtype,rtol,chunk_rows", [
    (tf.float64, 1e-12, 3), (tf.float64, 1e-12, 64), (tf.float32, 1e-5, 4)])
def test_geglu_chunked_forward_equals_the_plain_ops(dtype, rtol, chunk_rows, rebuild_linear):
  """chunk_forward (training): gelu(a) * b and its product with W3 over chunks of positions
  (with rebuild_linear b = x W2 too); the output and every gradient equal the plain ops'."""
  (y, grads), _ = geglu_graph(np.random.default_rng(7), dtype, chunk_rows, chunk_forward=True,
                              rebuild_linear=rebuild_linear)
  (y_plain, grads_plain), _ = geglu_graph(np.random.default_rng(7), dtype, chunk_rows,
                                          plain=True)
  np.testing.assert_allclose(y, y_plain, rtol=rtol, atol=rtol * np.abs(y_plain).max())
  for got, want, name in zip(grads, grads_plain, ["x", "weight1", "weight2", "weight3"]):
    assert np.abs(want).max() > 0, name
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * np.abs(want).max(), err_msg=name)


def test_geglu_chunked_forward_temporaries_hold_one_chunk_of_positions():
  """With chunk_forward the forward pass's only [positions, filter] tensors over more than one
  chunk are the two matmul outputs a and b (the plain forward also holds gelu's intermediates and
  the product over all 10 positions), and its chunks run one after the other."""
  _, graph = geglu_graph(np.random.default_rng(7), tf.float32, 3, chunk_forward=True)
  _, unchunked = geglu_graph(np.random.default_rng(7), tf.float32, 3)
  assert len(wide_forward_ops(unchunked)) >= 5
  wide = wide_forward_ops(graph)
  assert len(wide) == 2 and all("weight" in name for name in wide), wide
  slices = [op for op in graph.get_operations()
            if not op.name.startswith("gradients") and op.type == "Slice"]
  assert len(slices) == 4 * 2  # 4 chunks x (a, b)
  waiting = [op for op in slices if waits(op)]
  assert len(waiting) == 3 * 2  # every chunk after the first


def test_geglu_rebuild_linear_computes_x_w2_one_chunk_at_a_time_in_both_passes():
  """With rebuild_linear and chunk_forward no [positions, filter] tensor over more than one chunk
  exists but a = x W1 (the forward's only whole product, the one the backward pass reads), and
  the backward pass computes each chunk's x W2 with the forward's op: a MatMul of the chunk's
  rows of x and W2, once per chunk in each pass."""
  _, graph = geglu_graph(np.random.default_rng(7), tf.float32, 3, chunk_forward=True,
                         rebuild_linear=True)
  wide = wide_forward_ops(graph)
  assert len(wide) == 1 and "weight1" in wide[0], wide
  assert not wide_backward_tensors(graph, 24, 3)
  assert forward_product_scopes_read_backward(graph) == {"weight1"}
  w2 = graph.get_tensor_by_name("Const_2:0")  # geglu_graph's constants: x, W1, W2, W3, ...
  assert w2.shape.as_list() == [8, 24]
  w2_products = [op for op in graph.get_operations() if op.type == "MatMul"
                 and op.inputs[1] is w2 and op.inputs[0].shape.as_list()[0] <= 3]
  forward = [op for op in w2_products if not op.name.startswith("gradients")]
  backward = [op for op in w2_products if op.name.startswith("gradients")]
  assert len(forward) == len(backward) == 4, [op.name for op in w2_products]


def test_model_gradients_with_a_chunked_ffn_backward_equal_one_chunk(rng, monkeypatch):
  """The whole training step with the FFN backward in chunks of 48 of the 2 x 64 positions
  (48, 48, 32) and in one chunk: the same loss, every gradient equal."""
  features = {"targets": random_targets(rng, length=64, pad_from=50)}
  monkeypatch.setattr(layers, "FFN_BACKWARD_ROWS", 4096)
  before, loss, grads, _ = model_step(small_hparams(), features)
  monkeypatch.setattr(layers, "FFN_BACKWARD_ROWS", 48)
  _, loss2, grads2, _ = model_step(small_hparams(), features, before)
  np.testing.assert_allclose(loss2, loss, rtol=1e-7)
  assert set(grads2) == set(grads)
  ffn = [name for name in grads if "/ffn/weight" in name]
  assert len(ffn) == 6, ffn  # 2 layers x 3 kernels
  for name, g in grads.items():
    np.testing.assert_allclose(grads2[name], g, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("recompute_layers", [False, True], ids=["plain", "recompute_layers"])
def test_model_step_with_ffn_rebuild_linear_equals_the_kept_products(rng, monkeypatch,
                                                                    recompute_layers):
  """The hparam ffn_rebuild_linear (GEGLU's backward pass computes x W2 again in chunks): the
  same loss and every gradient equal to the step that keeps x W2, with and without
  recompute_layers (whose replay keeps neither product anyway), chunks of 48 positions."""
  features = {"targets": random_targets(rng, length=64, pad_from=50)}
  monkeypatch.setattr(layers, "FFN_BACKWARD_ROWS", 48)
  before, loss, grads, _ = model_step(small_hparams(recompute_layers=recompute_layers), features)
  _, loss2, grads2, _ = model_step(
      small_hparams(recompute_layers=recompute_layers, ffn_rebuild_linear=True), features, before)
  np.testing.assert_allclose(loss2, loss, rtol=1e-6)
  assert set(grads2) == set(grads) and len([n for n in grads if "/ffn/weight" in n]) == 6
  for name, g in grads.items():
    np.testing.assert_allclose(grads2[name], g, rtol=1e-5, atol=1e-6, err_msg=name)


def test_model_step_with_ffn_rebuild_linear_in_bfloat16(rng):
  """ffn_rebuild_linear with bfloat16 activations (x W2 a bfloat16 product of the rebuilt
  bfloat16 cast of the norm): the same loss, every gradient along the kept products' (cosine)."""
  features = {"targets": random_targets(rng, length=64, pad_from=50)}
  before, loss, grads, _ = model_step(small_hparams(activation_dtype="bfloat16"), features)
  _, loss2, grads2, _ = model_step(
      small_hparams(activation_dtype="bfloat16", ffn_rebuild_linear=True), features, before)
  np.testing.assert_allclose(loss2, loss, rtol=1e-3)
  assert set(grads2) == set(grads)
  for name, g in grads.items():
    cosine = np.sum(g * grads2[name]) / (np.linalg.norm(g) * np.linalg.norm(grads2[name]))
    assert cosine > 0.999, (name, cosine)


# --- chunked output projection + cross-entropy ------------------------------------------------

def sparse_xent(logits, labels):
  return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)


def loss_graph(rng, chunk):
  """(loss, gradients w.r.t. x, kernel, bias, graph) of the chunked loss (chunk > 0) or the
  plain one (chunk 0) on the same random inputs (float64; b 2, n 7, e 4, vocab 11)."""
  graph = tf.Graph()
  with graph.as_default():
    x = tf.constant(rng.standard_normal((2, 7, 4)))
    kernel = tf.constant(rng.standard_normal((4, 11)))
    bias = tf.constant(rng.standard_normal(11))
    labels = tf.constant(rng.integers(0, 11, (2, 7)), tf.int32)
    weights = tf.constant(rng.integers(0, 2, (2, 7)), tf.float64)
    if chunk:
      loss = chunked_loss.chunked_loss(x, kernel, bias, labels, weights, chunk, sparse_xent)
    else:
      loss = tf.reduce_sum(sparse_xent(chunked_loss.project(x, kernel, bias), labels) * weights)
    grads = tf1.gradients(3.0 * loss, [x, kernel, bias])
    values = run_graph([loss, grads])
  return values, graph


@pytest.mark.parametrize("chunk", [1, 3, 7, 10])
def test_chunked_loss_and_gradients_equal_the_plain_loss(chunk):
  (loss, grads), _ = loss_graph(np.random.default_rng(5), chunk)
  (loss_plain, grads_plain), _ = loss_graph(np.random.default_rng(5), 0)
  np.testing.assert_allclose(loss, loss_plain, rtol=1e-13)
  for got, want in zip(grads, grads_plain):
    assert np.abs(want).max() > 0
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)


def test_chunked_loss_keeps_no_logits_for_the_backward_pass():
  _, graph = loss_graph(np.random.default_rng(5), 3)
  _, plain = loss_graph(np.random.default_rng(5), 0)
  assert saved_for_backward(plain, 2 * 7 * 11)  # logits-sized: the softmax the gradient reads
  assert not saved_for_backward(graph, 2 * 7 * 11)
  assert chunked_loss.chunk_bounds(7, 3) == [(0, 3), (3, 3), (6, 1)]


def model_step(hparams, features, initial=None, mode=TRAIN):
  """(variables before, training loss, gradients by variable name) of the model in a new graph,
  the variables initialised from `initial` when given (as test_recompute does)."""
  graph = tf.Graph()
  with graph.as_default():
    tf1.set_random_seed(1)
    logits, losses = build(hparams, mode, features)
    loss = losses["training"]
    variables = tf1.trainable_variables()
    grads = [tf.convert_to_tensor(g) for g in tf1.gradients(loss, variables)]
    every = {v.name: v for v in tf1.global_variables()}
    feeds = {} if initial is None else {
        v.initializer.inputs[1]: initial[name] for name, v in every.items()}
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer(), feeds)
      before = sess.run(every)
      loss_value, grad_values, logits_value = sess.run([loss, grads, logits])
  return before, loss_value, {v.name: g for v, g in zip(variables, grad_values)}, logits_value


@pytest.mark.parametrize("overrides,length,pad_from", [
    ({}, 64, 50),
    (dict(label_smoothing=0.1, hidden_size=48, embedding_dims=32), 64, None),
    ({"recompute_layers": True}, 40, 30),  # shorter than the static length 64
])
def test_model_chunked_loss_equals_the_t2t_loss(rng, overrides, length, pad_from):
  """logits_chunk_size=16 (4 chunks of the 64 positions): the training loss and every gradient
  equal T2T's loss on the whole logits (label smoothing, final_dense_1, padding, recompute)."""
  features = {"targets": random_targets(rng, length=length, pad_from=pad_from)}
  before, loss, grads, logits = model_step(small_hparams(**overrides), features)
  before2, loss2, grads2, logits2 = model_step(small_hparams(logits_chunk_size=16, **overrides),
                                               features, before)
  assert set(before2) == set(before)  # the same variables
  np.testing.assert_allclose(loss2, loss, rtol=1e-6)
  assert set(grads2) == set(grads) and len(grads) > 10
  for name, g in grads.items():
    np.testing.assert_allclose(grads2[name], g, rtol=1e-5, atol=1e-6, err_msg=name)
  # The logits are still there for whoever fetches them (computed whole then).
  np.testing.assert_allclose(logits2, logits, rtol=1e-5, atol=1e-5)


def test_train_logits_are_not_sliced_and_give_the_eval_loss(rng):
  """TRAIN returns the logits of all max_length positions (T2T's loss pads the targets with
  weight-0 zeros to that length: no slice, no StridedSliceGrad of the largest tensor); its loss
  equals the EVAL loss on the sliced logits, with the same weights."""
  features = {"targets": random_targets(rng, length=40, pad_from=33)}
  before, loss, _, logits = model_step(small_hparams(), features)
  _, loss_eval, _, logits_eval = model_step(small_hparams(), features, before, mode=EVAL)
  assert logits.shape == (2, 64, 1, 1, VOCAB) and logits_eval.shape == (2, 40, 1, 1, VOCAB)
  np.testing.assert_allclose(loss, loss_eval, rtol=1e-6)
  np.testing.assert_allclose(logits[:, :40], logits_eval, rtol=1e-5, atol=1e-6)
  with tf.Graph().as_default():
    _, losses = build(small_hparams(), TRAIN, features)
    tf1.gradients(losses["training"], tf1.trainable_variables())
    # No gradient op lays the [b, n, vocab] logits' gradient out again (the gradient of a
    # strided slice, or of a slice: a Pad).
    relaid = [op.name for op in tf1.get_default_graph().get_operations()
              if op.name.startswith("gradients") and op.type in ("StridedSliceGrad", "Pad") and
              any(t.shape.rank and t.shape[-1] == VOCAB for t in op.inputs)]
    assert not relaid, relaid


def test_train_logits_are_sliced_when_the_loss_needs_the_targets_length(rng):
  """With targets_mask (T2T multiplies the [b, 40] mask into the loss weights), TRAIN slices the
  logits to the targets' length as before; its loss is the EVAL loss (the same mask)."""
  mask = np.ones((2, 40), np.float32)
  mask[:, 30:] = 0.0
  features = {"targets": random_targets(rng, length=40), "targets_mask": mask}
  before, loss, _, logits = model_step(small_hparams(), features)
  _, loss_eval, _, _ = model_step(small_hparams(), features, before, mode=EVAL)
  _, loss_unmasked, _, _ = model_step(small_hparams(), {"targets": features["targets"]}, before)
  assert logits.shape == (2, 40, 1, 1, VOCAB)
  np.testing.assert_allclose(loss, loss_eval, rtol=1e-6)
  # the mask counts: at initialisation every token's loss is near ln(VOCAB), so dropping a
  # quarter of them moves the mean by ~1e-4, far above float32 rounding (~5e-7 here)
  assert abs(loss - loss_unmasked) > 1e-5


def test_chunked_loss_refuses_what_it_does_not_compute(rng):
  features = {"targets": random_targets(rng), "targets_mask": np.ones((2, 64), np.float32)}
  with tf.Graph().as_default():
    with pytest.raises(model_lib.HParamsError, match="targets_mask.*logits_chunk_size=0"):
      build(small_hparams(logits_chunk_size=16), TRAIN, features)
  assert small_hparams().logits_chunk_size == 0  # off by default (and in every paper set)
  with pytest.raises(model_lib.HParamsError, match="logits_chunk_size=-1 must be 0"):
    model_lib.check_hparams(small_hparams(logits_chunk_size=-1))
  long = small_hparams(max_length=1024, max_target_length=1024, sparsity_cluster_size=64,
                       logits_chunk_size=2)
  with pytest.raises(model_lib.HParamsError, match="at least 4: at most 256 chunks"):
    model_lib.check_hparams(long)
  long.logits_chunk_size = 4
  model_lib.check_hparams(long)


# --- q/k/v per head kind ----------------------------------------------------------------------

def layer_hparams(**overrides):
  """One layer of 2 routing + 2 local heads of d = 8 (hidden 32), length 64."""
  values = dict(hidden_size=32, local_num_heads=2, sparsity_cluster_num_heads=2,
                sparsity_skip_first=0, sparsity_cluster_size=4,
                sparsity_cluster_attention_window=16, query_shape=(16,), memory_flange=(16,),
                max_length=64, max_target_length=64, share_qk=True, routing_mode="topk",
                random_routing=False, legacy_causal_key_routing=False,
                max_relative_position=9, local_relative=True, sparsity_cluster_relative=True,
                head_dense=True, attention_dropout=0.0, decay=0.999, beta=1e-4, ema=True)
  values.update(overrides)
  return HParamsStandIn(**values)


def sliced_reference(x, hp, padding, causal):
  """The layer as computed before the per-kind projections: whole q/k/v projections sliced by
  strided slices into the kinds (reads the variables of a layers.self_attention already built
  in the current scope)."""
  num_routing, _, depth = layers.head_counts(hp, 0)
  total = hp.local_num_heads + hp.sparsity_cluster_num_heads

  def project(name):
    kernel = tf.convert_to_tensor(layers.dense_kernel(name, hp.hidden_size, hp.hidden_size))
    return heads.split_heads(layers.apply_kernel(x, kernel), total)

  q, k, v = project("q") * depth ** -0.5, project("k"), project("v")
  km, rel_k, rel_v = layers.routing_variables(hp, 0)
  config = layers.head_config(hp, x.shape[1])
  out_r, _ = heads.routing_heads_attention(
      q[:, :num_routing], k[:, :num_routing], v[:, :num_routing], km.means, config, causal,
      padding, (rel_k, rel_v), layers.routing_options(hp, 0))
  out_l = heads.local_heads_attention(q[:, num_routing:], k[:, num_routing:],
                                      v[:, num_routing:], config, causal, padding,
                                      layers.local_variables(hp, 0))
  return layers.attention_output(tf.concat([out_r, out_l], axis=1), hp)


@pytest.mark.parametrize("overrides,causal,use_padding", [
    ({}, True, False),
    ({"share_qk": False}, True, True),
    ({"routing_mode": "causal_window"}, True, True),
    ({"share_qk": False}, False, True),  # encoder self-attention
])
def test_per_kind_projections_equal_the_sliced_heads(rng, overrides, causal, use_padding):
  """layers.self_attention (per-kind projections, tf.split) against the whole projections
  sliced per kind: the same outputs and gradients (x, every kernel and table)."""
  hp = layer_hparams(**overrides)
  padding = None
  if use_padding:
    padding = np.zeros((2, 64), bool)
    padding[1, 50:] = True
  with tf.Graph().as_default():
    x = tf.constant(rng.standard_normal((2, 64, 32)), tf.float32)
    pad = None if padding is None else tf.constant(padding)
    with tf1.variable_scope("layer"):
      y, _, _ = layers.self_attention(x, hp, 0, pad, causal=causal)
    with tf1.variable_scope("layer", reuse=True):
      y_ref = sliced_reference(x, hp, pad, causal)
    variables = tf1.trainable_variables()
    cotangent = tf.constant(rng.standard_normal((2, 64, 32)), tf.float32)
    if padding is not None:  # outputs at padding positions are not defined
      cotangent *= tf.constant(~padding[:, :, None], tf.float32)
    grads = tf1.gradients(tf.reduce_sum(y * cotangent), [x] + variables)
    grads_ref = tf1.gradients(tf.reduce_sum(y_ref * cotangent), [x] + variables)
    names = ["x"] + [v.name for v in variables]
    assert [g is None for g in grads] == [g is None for g in grads_ref] == [False] * len(names)
    dense = lambda gs: [tf.convert_to_tensor(g) for g in gs]  # gathers give IndexedSlices
    y, y_ref, grads, grads_ref = run_graph([y, y_ref, dense(grads), dense(grads_ref)])
  real = np.ones((2, 64), bool) if padding is None else ~padding
  np.testing.assert_allclose(y[real], y_ref[real], rtol=1e-5, atol=1e-6)
  for got, want, name in zip(grads, grads_ref, names):
    assert np.abs(want).max() > 0, name
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=name)


def test_kernels_made_apart_start_as_dense_makes_them():
  """dense, dense_kernel and dense_variables give their kernels the initializer
  tf.compat.v1.layers.dense gives its own (without a scope initializer: Keras' glorot_uniform,
  not get_variable's), so the per-kind projections, GEGLU and the output layer start from the
  same kind of draw as before; with a scope initializer, that one."""
  def initializer_ops(graph, name):
    return sorted(op.type for op in graph.get_operations()
                  if op.name.startswith(name + "/kernel/Initializer/"))

  for scope_initializer in (None, tf1.random_normal_initializer(0.0, 0.5)):
    with tf.Graph().as_default() as graph:
      with tf1.variable_scope("s", initializer=scope_initializer):
        tf1.layers.dense(tf.zeros([2, 3, 4]), 5, name="reference")
        layers.dense(tf.zeros([2, 3, 4]), 5, "a")
        layers.dense_kernel("b", 4, 5)
        layers.dense_variables("c", 4, 5)
      want = initializer_ops(graph, "s/reference")
      assert want and all(initializer_ops(graph, "s/" + name) == want for name in "abc")


@pytest.mark.parametrize("use_bias", [False, True])
def test_dense_equals_the_compat_v1_dense_layer(rng, use_bias):
  """`layers.dense` creates the variables tf.compat.v1.layers.dense creates (names, shapes), its
  ops in the same name scope, and with the same variable values gives the same output and the
  same gradients of x, kernel and bias (float64)."""
  with tf.Graph().as_default() as graph:
    x = tf.constant(rng.standard_normal((2, 6, 4)))
    dy = tf.constant(rng.standard_normal((2, 6, 5)))
    want = tf1.layers.dense(x, 5, use_bias=use_bias, name="reference")
    got = layers.dense(x, 5, "ours", use_bias=use_bias)
    ours, reference = [[v for v in tf1.global_variables() if v.name.startswith(name + "/")]
                       for name in ("ours", "reference")]
    assert [v.name.replace("ours/", "reference/") for v in ours] == [v.name for v in reference]
    assert [v.shape for v in ours] == [v.shape for v in reference]
    assert graph.get_operation_by_name("ours/Tensordot/MatMul").type == "MatMul"
    copy = [a.assign(b) for a, b in zip(ours, reference)]
    grads = [tf.gradients(y, [x] + variables, dy) for y, variables in ((got, ours),
                                                                      (want, reference))]
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      sess.run(copy)
      (got, want), (grads, grads_ref) = sess.run([(got, want), grads])
  np.testing.assert_allclose(got, want, rtol=1e-12)
  for g, r in zip(grads, grads_ref):
    np.testing.assert_allclose(g, r, rtol=1e-12)


@pytest.mark.parametrize("shape,static", [((7, 6), True), ((2, 7, 6), True),
                                          ((2, 3, 7, 6), True), ((2, 7, 6), False)])
def test_apply_kernel_gradient_equals_the_matmul_gradient(rng, shape, static):
  """apply_kernel's gradients (x's as `matmul_nt`: a batch matmul with the kernel adjoint) are
  TF's gradients of the plain tensordot (float64), also for x of a shape unknown when built, and
  its gradient graph has no MatMul with transpose_b, the layout oneDNN runs slowest for a
  hidden-size input."""
  with tf.Graph().as_default() as graph:
    x = tf.constant(rng.standard_normal(shape))
    if not static:
      x = tf1.placeholder_with_default(x, [None] * (len(shape) - 1) + [shape[-1]])
    kernel = tf.constant(rng.standard_normal((6, 5)))
    dy = tf.constant(rng.standard_normal(shape[:-1] + (5,)))
    y = layers.apply_kernel(x, kernel)
    grads = tf.gradients(y, [x, kernel], dy)
    plain = tf.tensordot(x, kernel, [[len(shape) - 1], [0]])
    grads_ref = tf.gradients(plain, [x, kernel], dy)
    gradient_ops = [op for op in graph.get_operations() if op.name.startswith("gradients/")]
    assert not [op for op in gradient_ops
                if op.type == "MatMul" and op.get_attr("transpose_b")]
    assert [op.get_attr("adj_y") for op in gradient_ops if op.type == "BatchMatMulV2"] == [True]
    with tf1.Session() as sess:
      y, plain, grads, grads_ref = sess.run([y, plain, grads, grads_ref])
  assert y.shape == shape[:-1] + (5,)
  np.testing.assert_allclose(y, plain, rtol=1e-12)
  for g, r in zip(grads, grads_ref):
    assert g.shape == r.shape
    np.testing.assert_allclose(g, r, rtol=1e-12)


def test_matmul_nt_is_the_product_with_the_transpose(rng):
  """matmul_nt(a, b) = a b^T for a [m, k], b [n, k], also for rows unknown when built."""
  a_value, b_value = rng.standard_normal((4, 3)), rng.standard_normal((5, 3))
  with tf.Graph().as_default():
    a = tf1.placeholder(tf.float64, [None, 3])
    product = layers.matmul_nt(a, tf.constant(b_value))
    assert product.shape.as_list() == [None, 5]
    with tf1.Session() as sess:
      got = sess.run(product, {a: a_value})
  np.testing.assert_allclose(got, a_value @ b_value.T, rtol=1e-12)


@pytest.mark.parametrize("share_qk", [True, False])
def test_no_routing_key_projection_with_share_qk(rng, share_qk):
  """The projections multiply x by 3 x hidden kernel columns, less the routing heads' key
  columns with share_qk; the k kernel keeps its [hidden, hidden] shape (checkpoints) and its
  routing columns get a zero gradient."""
  hp = layer_hparams(share_qk=share_qk)
  with tf.Graph().as_default():
    x = tf.constant(rng.standard_normal((2, 64, 32)), tf.float32)
    routing, local = layers.projections(x, hp, 0)
    graph = tf1.get_default_graph()
    columns = sum(op.outputs[0].shape[-1] for op in graph.get_operations()
                  if op.type == "MatMul")
    assert columns == 3 * 32 - (16 if share_qk else 0)
    assert (routing[1] is None) == share_qk and local[1].shape.as_list() == [2, 2, 64, 8]
    kernel = [v for v in tf1.global_variables() if v.name == "k/kernel:0"][0]
    assert kernel.shape.as_list() == [32, 32]
    loss = tf.reduce_sum(local[1] ** 2) + tf.reduce_sum(routing[0] ** 2)
    if routing[1] is not None:
      loss += tf.reduce_sum(routing[1] ** 2)
    grad = run_graph(tf1.gradients(loss, [kernel])[0])
  assert np.abs(grad[:, 16:]).max() > 0
  assert (np.abs(grad[:, :16]).max() > 0) == (not share_qk)


@pytest.mark.parametrize("mode", ["topk", "causal_window"])
def test_attention_layer_gradient_has_no_strided_slice_gradient(rng, mode):
  """No StridedSliceGrad (several times slower on CPU than a Pad / concat) in the backward pass
  of a mixed layer: the heads are projected per kind, not sliced."""
  with tf.Graph().as_default():
    x = tf.constant(rng.standard_normal((2, 64, 32)), tf.float32)
    y, loss, _ = layers.self_attention(x, layer_hparams(routing_mode=mode), 0, None)
    tf1.gradients(tf.reduce_sum(y) + loss, [x] + tf1.trainable_variables())
    found = [op.name for op in tf1.get_default_graph().get_operations()
             if op.type == "StridedSliceGrad"]
  assert not found, found


# --- causal_window scoring --------------------------------------------------------------------

def dense_causal_window(q, k, v, centroids, window, share_qk, padding, rel_k, rel_v):
  """Strictly causal routing as one dense [n, n] softmax per head, in TensorFlow (so it has
  gradients): allowed = same cluster, j <= i, rank distance > -window, key not padding;
  relative positions by rank distance. Returns (output [b, h, n, d], probabilities [b, h, n, n])."""
  q_hat = common.layer_norm_no_scale(q)
  k_hat = q_hat if share_qk else common.layer_norm_no_scale(k)
  n = q.shape[2]
  scores = tf.einsum("hcd,bhnd->bhnc", tf.stop_gradient(centroids), q_hat)
  clusters = tf.argmax(scores, axis=-1, output_type=tf.int32)  # [b, h, n]
  one_hot = tf.one_hot(clusters, centroids.shape[1], dtype=tf.int32)
  rank = tf.reduce_sum(tf.cumsum(one_hot, axis=2, exclusive=True) * one_hot, axis=-1)
  distance = rank[..., tf.newaxis, :] - rank[..., :, tf.newaxis]  # key rank - query rank
  same = tf.equal(clusters[..., :, tf.newaxis], clusters[..., tf.newaxis, :])
  causal = tf.range(n)[tf.newaxis, :] <= tf.range(n)[:, tf.newaxis]
  allowed = same & causal & (distance > -window)
  if padding is not None:
    allowed &= ~tf.constant(padding)[:, tf.newaxis, tf.newaxis, :]
  radius = (rel_k.shape[0] - 1) // 2
  index = tf.clip_by_value(distance, -radius, radius) + radius  # [b, h, n, n]
  logits = tf.einsum("bhid,bhjd->bhij", q_hat, k_hat)
  logits += tf.einsum("bhid,bhijd->bhij", q_hat, tf.gather(rel_k, index))
  logits = tf.where(allowed, logits, tf.constant(-1e30, logits.dtype))
  probs = tf.nn.softmax(logits) * tf.cast(allowed, logits.dtype)
  out = tf.einsum("bhij,bhjd->bhid", probs, v)
  out += tf.einsum("bhij,bhijd->bhid", probs, tf.gather(rel_v, index))
  return out, probs


@pytest.mark.parametrize("n,window,clusters,share_qk,pad_last", [
    (32, 8, 4, True, 0),   # blocks of 8, one look-back block
    (30, 8, 3, False, 3),  # n not a multiple of the block; padding
    (35, 5, 3, True, 0),   # odd window
    (24, 24, 1, True, 4),  # one cluster, window = n: dense causal attention
])
def test_causal_window_gradients_equal_a_dense_reference(rng, n, window, clusters, share_qk,
                                                         pad_last):
  q, k, v = [tf.constant(rng.standard_normal((2, 2, n, 8))) for _ in range(3)]
  mu = tf.constant(rng.standard_normal((2, clusters, 8)))
  rel_k, rel_v = [tf.constant(rng.standard_normal((9, 8))) for _ in range(2)]
  padding = None
  if pad_last:
    padding = np.zeros((2, n), bool)
    padding[1, -pad_last:] = True
  real = np.ones((2, n), bool) if padding is None else ~padding
  cotangent = tf.constant(rng.standard_normal((2, 2, n, 8)) * real[:, None, :, None])
  inputs = [q, v, rel_k, rel_v] + ([] if share_qk else [k])
  with tf.GradientTape(persistent=True) as tape:
    tape.watch(inputs)
    out, aux = cw.causal_window_attention(q, k, v, mu, window, share_qk=share_qk,
                                          padding=padding, relative_keys=rel_k,
                                          relative_values=rel_v)
    want, probs = dense_causal_window(q, k, v, mu, window, share_qk, padding, rel_k, rel_v)
    loss, loss_want = tf.reduce_sum(out * cotangent), tf.reduce_sum(want * cotangent)
  mask = real[:, None, :, None]
  np.testing.assert_allclose(np.where(mask, out, 0), np.where(mask, want, 0), atol=1e-12)
  self_weight = np.einsum("bhii->bhi", probs.numpy())  # the weight on itself
  np.testing.assert_allclose(np.where(real[:, None], aux["self_weight"], 0),
                             np.where(real[:, None], self_weight, 0), atol=1e-12)
  for got, expected in zip(tape.gradient(loss, inputs), tape.gradient(loss_want, inputs)):
    got, expected = tf.convert_to_tensor(got), tf.convert_to_tensor(expected)  # gathers: slices
    assert np.abs(expected).max() > 0
    np.testing.assert_allclose(got, expected, atol=1e-11)


@pytest.mark.parametrize("window", [8, 16, 5, 1])
def test_causal_window_self_weight_is_a_diagonal_and_look_back_is_not_strided(rng, window):
  """Each query block of w scores 2w keys (its block and the one before); the self-weight
  diagnostic is a diagonal of the weights, not a product with a [.., w, 2w] mask, and the
  look-back block is a tf.slice (the backward pass has no StridedSliceGrad)."""
  q = rng.standard_normal((1, 1, 32, 4)).astype(np.float32)
  mu = rng.standard_normal((1, 2, 4)).astype(np.float32)
  graph = tf.Graph()
  with graph.as_default():
    qt = tf.constant(q)
    out, _ = cw.causal_window_attention(qt, qt, qt, mu, window)
    tf1.gradients(tf.reduce_sum(out), [qt])
    ops = graph.get_operations()
    widths = {op.outputs[0].shape[-1] for op in ops if op.type == "Cumsum" and
              not op.name.startswith("gradients")}  # the softmax's ordered denominator
    masked_products = [op.name for op in ops if op.type == "Mul" and
                       op.outputs[0].shape.rank == 5 and op.outputs[0].dtype.is_floating and
                       not op.name.startswith("gradients")]
    diagonals = [op for op in ops if op.type.startswith("MatrixDiagPart")]
    strided = [op.name for op in ops if op.type == "StridedSliceGrad"]
  assert widths == {2 * window}
  assert not masked_products and len(diagonals) == 1
  assert not strided, strided


def kept_and_values(graph, got, want, wrt, loss, gate_gradients=False, dtype=None):
  """Gradients of loss(got) and of loss(want) with respect to `wrt` in `graph`: (the forward
  tensors each backward pass reads, benchmarks/common.py kept_for_backward, for got and for
  want; the values [got, want, *dgot, *dwant], cast to `dtype` when given)."""
  common_bench = benchmark_module("common")
  with graph.as_default():
    dgot = tf1.gradients(loss(got), wrt, gate_gradients=gate_gradients)
    dwant = tf1.gradients(loss(want), wrt, gate_gradients=gate_gradients)
    kept = [common_bench.kept_for_backward(graph, d)[0] for d in (dgot, dwant)]
    fetches = [got, want] + dgot + dwant
    with tf1.Session(graph=graph) as sess:
      values = sess.run([tf.cast(t, dtype) for t in fetches] if dtype else fetches)
  return kept[0], kept[1], values


@pytest.mark.parametrize("dtype", [tf.float64, tf.float32, tf.bfloat16])
def test_zero_empty_softmax_is_the_zeroed_softmax_and_keeps_only_its_output(rng, dtype):
  """masked_softmax(..., zero_empty=True) against the softmax of the masked logits followed by
  zero_empty_rows: the same values (bit for bit in float32 and float64), the same gradient
  (empty rows get 0), and its backward pass reads one [..., m] tensor, its output, where the
  softmax-then-product keeps two (the softmax's output for its gradient, the zeroed product for
  the product with the values)."""
  logits_np = rng.standard_normal((2, 5, 24)) * 3.0
  allowed_np = rng.random((2, 5, 24)) < 0.5
  allowed_np[:, 1] = False  # empty rows
  cotangent_np = rng.standard_normal((2, 5, 3))
  graph = tf.Graph()
  with graph.as_default():
    logits = tf.exp(tf.constant(logits_np, dtype)) - 1.0  # an op: its kept outputs are counted
    allowed, cotangent = tf.constant(allowed_np), tf.constant(cotangent_np, dtype)
    v = tf.exp(tf.constant(rng.standard_normal((2, 24, 3)), dtype))
    got = common.masked_softmax(logits, allowed, zero_empty=True)
    wide = tf.float32 if dtype == tf.bfloat16 else dtype
    want = tf.cast(common.zero_empty_rows(common.masked_softmax(tf.cast(logits, wide), allowed),
                                          allowed), dtype)
  kept_got, kept_want, values = kept_and_values(
      graph, got, want, [logits, v],
      lambda p: tf.reduce_sum(tf.cast(tf.matmul(p, v) * cotangent, wide)), dtype=tf.float64)
  got_v, want_v, dgot_v, dwant_v = values[0], values[1], values[2], values[4]
  assert got.dtype == dtype
  assert not got_v[:, 1].any() and not dgot_v[:, 1].any()
  if dtype == tf.bfloat16:  # float32 inside, rounded once
    np.testing.assert_array_equal(got_v, want_v)
    np.testing.assert_allclose(dgot_v, dwant_v, rtol=0.02, atol=0.02)
  else:
    np.testing.assert_array_equal(got_v, want_v)
    np.testing.assert_allclose(dgot_v, dwant_v, rtol=1e-5 if dtype == tf.float32 else 1e-12,
                               atol=1e-7 if dtype == tf.float32 else 1e-15)
  row_sized = lambda kept: sorted(v[2] for v in kept.values() if v[3][-1] == 24)
  assert len(row_sized(kept_got)) == 1, kept_got
  assert len(row_sized(kept_want)) == 2, kept_want


@pytest.mark.parametrize("dtype", [tf.float64, tf.float32])
def test_masked_softmax_builds_one_select_in_its_backward_pass(rng, dtype):
  """masked_softmax against the softmax of the where-masked logits: the same values and
  gradients bit for bit (a row with nothing allowed: uniform, its masked entries' gradients 0);
  under T2T's gated gradients the plain ops' backward pass builds two [..., m] selects (the
  logits' and the mask value's gradient), masked_softmax's one."""
  allowed_np = rng.random((2, 5, 24)) < 0.5
  allowed_np[:, 1] = False  # rows with nothing allowed
  graph = tf.Graph()
  with graph.as_default():
    logits = tf.exp(tf.constant(rng.standard_normal((2, 5, 24)), dtype)) - 1.0
    allowed = tf.constant(allowed_np)
    v = tf.exp(tf.constant(rng.standard_normal((2, 24, 3)), dtype))
    got = common.masked_softmax(logits, allowed)
    want = tf.nn.softmax(tf.where(allowed, logits, common.mask_value(dtype)))
  _, _, values = kept_and_values(graph, got, want, [logits, v],
                                 lambda p: tf.reduce_sum(tf.matmul(p, v) ** 2),
                                 gate_gradients=True)
  for a, b in ((0, 1), (2, 4), (3, 5)):
    np.testing.assert_array_equal(values[a], values[b])
  np.testing.assert_allclose(values[0][:, 1], 1.0 / 24)
  assert values[2][:, 1][~allowed_np[:, 1]].max() == 0.0
  selects = lambda prefix: [op for op in graph.get_operations()
                            if op.name.startswith(prefix) and op.type == "SelectV2" and
                            op.outputs[0].shape.as_list() == [2, 5, 24]]
  assert len(selects("gradients/")) == 1, selects("gradients/")
  assert len(selects("gradients_1/")) == 2, selects("gradients_1/")


@pytest.mark.parametrize("adjoint_b", [True, False], ids=["logits", "outputs"])
@pytest.mark.parametrize("before,after", [(1, 0), (2, 0), (1, 1)])
def test_memory_product_rebuilds_the_blocks_for_its_gradient(rng, before, after, adjoint_b):
  """local.memory_product against the plain matmul of local.memory_blocks: the same values and
  the same gradients of both operands bit for bit (the same ops run), the values also equal to
  the einsum it replaced, and its backward pass reads x [b, h, n, d], not the blocks
  [b, h, nb, W, d]."""
  block, width = 4, (before + 1 + after) * 4
  a_width, out_width = (6, width) if adjoint_b else (width, 6)
  equation = "bhnqd,bhnkd->bhnqk" if adjoint_b else "bhnqk,bhnkd->bhnqd"
  graph = tf.Graph()
  with graph.as_default():
    a = tf.exp(tf.constant(rng.standard_normal((2, 3, 5, block, a_width)), tf.float32))
    x = tf.exp(tf.constant(rng.standard_normal((2, 3, 5 * block, 6)), tf.float32))
    cotangent = tf.constant(rng.standard_normal((2, 3, 5, block, out_width)), tf.float32)
    got = local.memory_product(a, x, block, before, after, adjoint_b=adjoint_b)
    blocks = local.memory_blocks(x, block, before, after)
    want = tf.matmul(a, blocks, adjoint_b=adjoint_b)
    einsum = tf.einsum(equation, a, blocks)
  kept_got, kept_want, values = kept_and_values(
      graph, got, want, [a, x], lambda y: tf.reduce_sum(y * cotangent))
  np.testing.assert_array_equal(values[0], values[1])
  np.testing.assert_array_equal(values[2], values[4])
  np.testing.assert_array_equal(values[3], values[5])
  with tf1.Session(graph=graph) as session:
    np.testing.assert_allclose(session.run(einsum), values[0], rtol=1e-6)
  shapes = lambda kept: sorted(v[3] for v in kept.values() if v[0] > 200)
  assert shapes(kept_got) == sorted([[2, 3, 5, block, a_width], [2, 3, 5 * block, 6]]), kept_got
  assert shapes(kept_want) == sorted([[2, 3, 5, block, a_width], [2, 3, 5, width, 6]]), kept_want


def test_times_constant_keeps_nothing_for_its_gradient(rng):
  """common.times_constant(x, c): x * c bit for bit, the same gradient, and with gate_gradients
  (T2T's optimizer gates each op's input gradients together) its backward pass reads nothing,
  where the plain Mul's gradient for the constant, sum(x dy), runs and keeps x."""
  graph = tf.Graph()
  with graph.as_default():
    a, b = (tf.constant(rng.standard_normal((4, 64)), tf.float32) for _ in range(2))
    x = a + b
    plain, ours = x * 0.125, common.times_constant(x, 0.125)
    assert common.times_constant(x, 1.0) is x
  kept_ours, kept_plain, values = kept_and_values(
      graph, ours, plain, [a], lambda y: tf.reduce_sum(y * y), gate_gradients=True)
  np.testing.assert_array_equal(values[0], values[1])
  np.testing.assert_array_equal(values[2], values[3])
  assert x.name in kept_plain and x.name not in kept_ours, (kept_plain, kept_ours)


def test_ordered_softmax_equals_the_softmax_and_its_gradient(rng):
  """common.ordered_softmax (causal_window's: a sequential denominator) against tf.nn.softmax of
  the masked logits, float64: values and gradients; a row with nothing allowed is uniform as
  with masked_softmax; and a row's values do not move when its entries shift within the row."""
  logits = tf.constant(rng.standard_normal((3, 4, 40)) * 3.0)
  allowed = tf.constant(rng.random((3, 4, 40)) < 0.6)
  allowed = tf.concat([allowed[:, :3], tf.zeros([3, 1, 40], tf.bool)], axis=1)  # empty rows
  cotangent = tf.constant(rng.standard_normal((3, 4, 40)))
  with tf.GradientTape(persistent=True) as tape:
    tape.watch(logits)
    got = common.ordered_softmax(logits, allowed)
    want = common.masked_softmax(logits, allowed)
    loss, loss_want = tf.reduce_sum(got * cotangent), tf.reduce_sum(want * cotangent)
  np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-15)
  np.testing.assert_allclose(got[:, 3], np.full((3, 40), 1 / 40), rtol=1e-14)
  np.testing.assert_allclose(tape.gradient(loss, logits), tape.gradient(loss_want, logits),
                             rtol=1e-12, atol=1e-14)
  window = rng.standard_normal(37).astype(np.float32)  # 37 entries shifted through 64 slots
  rows = np.full((27, 64), -1e30, np.float32)
  for shift in range(27):
    rows[shift, shift:shift + 37] = window
  probs = common.ordered_softmax(tf.constant(rows), tf.constant(rows > -1e29)).numpy()
  for shift in range(27):
    np.testing.assert_array_equal(probs[shift, shift:shift + 37], probs[0, :37])


def sorted_offsets(clusters, block):
  """Each position's slot within its query block of the cluster-sorted order: [b, h, n]."""
  order = np.argsort(clusters * clusters.shape[-1] + np.arange(clusters.shape[-1]), axis=-1,
                     kind="stable")
  return np.argsort(order, axis=-1) % block


@pytest.mark.parametrize("window,relative,share_qk", [
    (8, False, True), (16, False, True), (16, True, True), (32, True, False), (64, False, True)])
def test_causal_window_earlier_outputs_are_bit_exact_when_later_positions_change(
    rng, window, relative, share_qk):
  """Strict causality holds exactly, not within a tolerance: new q, k, v after position t move
  the earlier queries to other slots of the cluster-sorted blocks (the clusters of the later
  positions change), and every output up to t stays bit for bit the same (eager and graph; at
  w >= 32 only with the ordered softmax denominator)."""
  n, heads, depth = 128, 2, 8
  q, k, v = [rng.standard_normal((1, heads, n, depth)).astype(np.float32) for _ in range(3)]
  mu = rng.standard_normal((heads, max(2, n // window), depth)).astype(np.float32)
  rel_k, rel_v = [rng.standard_normal((9, depth)).astype(np.float32) if relative else None
                  for _ in range(2)]

  def attend(q, k, v):
    return cw.causal_window_attention(q, k, v, mu, window, share_qk=share_qk,
                                      relative_keys=rel_k, relative_values=rel_v)

  graph_attend = tf.function(attend)
  out, aux = attend(q, k, v)
  graph_out = graph_attend(q, k, v)[0].numpy()
  block = window  # query blocks of w
  offsets = sorted_offsets(aux["query_clusters"].numpy(), block)
  moved = 0
  for t in (30, 63, 90):
    changed = [x.copy() for x in (q, k, v)]
    for x in changed:
      x[:, :, t + 1:] = rng.standard_normal(x[:, :, t + 1:].shape)
    new_out, new_aux = attend(*changed)
    new_offsets = sorted_offsets(new_aux["query_clusters"].numpy(), block)
    moved += np.sum(new_offsets[..., :t + 1] != offsets[..., :t + 1])
    np.testing.assert_array_equal(new_out.numpy()[:, :, :t + 1], out.numpy()[:, :, :t + 1])
    np.testing.assert_array_equal(graph_attend(*changed)[0].numpy()[:, :, :t + 1],
                                  graph_out[:, :, :t + 1])
  assert moved > 0  # the earlier queries did change slots


# --- top-k routing's self mask ----------------------------------------------------------------

def topk_cluster_attention(q, v, mu, window, causal, exclude_self, compare):
  """cluster_attention of share_qk top-k routing: (output, self_weight); compare=True hands it
  the key members as another tensor, so it takes the member-index comparison path (the
  computation before the static identity)."""
  q_hat = common.layer_norm_no_scale(q)
  aux = routing.route(q_hat, q_hat, tf.stop_gradient(mu), window, True, not causal)
  if compare:
    aux["key_indices"] = tf.identity(aux["query_indices"])
  out, aux = routing.cluster_attention(aux, v, window, causal, exclude_self=exclude_self)
  return out, aux["self_weight"]


@pytest.mark.parametrize("causal,exclude_self", [(True, False), (True, True), (False, True)])
def test_topk_self_mask_from_a_static_identity_is_exact(rng, causal, exclude_self):
  """With the key members the query members, "is self" is the identity [w, w] and the self
  weight the diagonal: outputs and self weights bit for bit those of the [b, h, c, w, w]
  member-index comparisons, gradients equal (float64), and no rank-5 comparison is built."""
  q, v = [tf.constant(rng.standard_normal((2, 2, 32, 8))) for _ in range(2)]
  mu = tf.constant(rng.standard_normal((2, 4, 8)))
  results = []
  for compare in (False, True):
    with tf.GradientTape() as tape:
      tape.watch([q, v])
      out, self_weight = topk_cluster_attention(q, v, mu, 8, causal, exclude_self, compare)
      loss = tf.reduce_sum(out * tf.sin(tf.range(8, dtype=out.dtype)))
    results.append([out, self_weight] + tape.gradient(loss, [q, v]))
  (out, self_weight, dq, dv), (out_ref, self_weight_ref, dq_ref, dv_ref) = results
  np.testing.assert_array_equal(out.numpy(), out_ref.numpy())
  np.testing.assert_array_equal(self_weight.numpy(), self_weight_ref.numpy())
  if not exclude_self:  # then a routed query's weight on itself is positive
    assert self_weight.numpy().max() > 0
  # The reference gathers the keys apart from the queries, so q's gradient adds the two gathers'
  # gradients in another order: equal up to float64 rounding.
  for got, want in ((dq, dq_ref), (dv, dv_ref)):
    assert np.abs(want.numpy()).max() > 0
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12, atol=1e-15)
  graph = tf.Graph()
  with graph.as_default():
    topk_cluster_attention(q.numpy(), v.numpy(), mu.numpy(), 8, causal, exclude_self, False)
    rank5 = [op.name for op in graph.get_operations() if op.type in ("Equal", "Mul") and
             op.outputs[0].shape.rank == 5 and op.outputs[0].shape[-2:] == [8, 8]]
  assert not rank5, rank5


# --- the benchmark's useful FLOPs ---------------------------------------------------------------

def test_useful_flops_per_token_hand_numbers():
  """benchmarks/train_step.py's count: bench-8k routing is 121 MFLOP/token (the figure of the
  performance issue); causal block pairs by hand."""
  train_step = benchmark_module("train_step")
  assert train_step.causal_pairs(8, 4, 4) == (0 + 10) + (16 + 10)
  assert train_step.causal_pairs(8, 4, 8) == 36  # the flange is cut at the start
  n = 8192
  local_pairs = train_step.causal_pairs(n, 256, 256)
  assert local_pairs == 256 * 256 * 31 + 32 * 256 * 257 // 2
  layer = (4 * 2 * 512 ** 2 + 2 * 8 * 64 ** 2 + 3 * 2 * 512 * 2048 +
           6 * local_pairs * 8 * 64 / n + 2 * (16 * 512 * 513 // 2 * 8 * 64 + 2 * 64 * 16 * n) / n)
  per_token = 3 * (2 * 512 * 512 + 4 * layer + 2 * 512 * 256)
  routing = train_step.model_hparams("routing", n)
  assert train_step.useful_flops_per_token(routing, 256) == pytest.approx(per_token, rel=1e-12)
  assert round(per_token / 1e6) == 121
  full = train_step.model_hparams("full", 1024)
  assert full.full_attention and full.sparsity_cluster_num_heads == 0
  assert train_step.model_hparams("routing", 32768).sparsity_cluster_size == 64


def test_matmul_share_counts_onednn_ops_as_the_ops_they_stand_for():
  """bench-peers' profile on a oneDNN build (AVX-512 machines) names the matmuls _MklMatMul,
  _MklEinsum, _MklFusedMatMul: they are matmuls; _MklSoftmax and plain Mul are not."""
  peers = benchmark_module("peers")
  by_op = [("_MklMatMul", 50.0), ("_MklEinsum", 10.0), ("_MklFusedMatMul", 5.0),
           ("BatchMatMulV2", 5.0), ("_MklSoftmax", 10.0), ("Mul", 20.0)]
  assert peers.matmul_share(by_op, peers.TF_MATMUL_OPS) == pytest.approx(0.7)
  assert peers.matmul_share([("aten::mm", 3.0), ("aten::mul", 1.0)],
                            peers.TORCH_MATMUL_OPS) == pytest.approx(0.75)
  assert peers.matmul_share([], peers.TF_MATMUL_OPS) == 0.0


def test_steady_matmul_rate_takes_the_higher_of_start_and_end():
  """bench-peers and bench-memory measure the matmul rate at their start and end: each rate is
  the higher, both are kept, and a spread beyond STEADY_SPREAD marks the run as disturbed."""
  common = benchmark_module("common")
  start = {"record": "matmul", "framework": "tensorflow", "gflops": 107.0,
           "gflops_bfloat16": 393.0}
  end = {"record": "matmul", "framework": "tensorflow", "gflops": 208.0, "gflops_bfloat16": 350.0}
  rate = common.steady_matmul_rate(start, end)
  assert (rate["gflops"], rate["gflops_bfloat16"]) == (208.0, 393.0)
  assert (rate["gflops_start"], rate["gflops_end"]) == (107.0, 208.0)
  assert rate["spread"] == pytest.approx(107.0 / 208.0) and not rate["steady"]
  assert rate["framework"] == "tensorflow" and start["gflops"] == 107.0  # a copy
  steady = common.steady_matmul_rate({"gflops": 200.0}, {"gflops": 190.0})
  assert steady["gflops"] == 200.0 and steady["steady"] and "gflops_bfloat16" not in steady
  assert common.unsteady_warning({"tensorflow": steady}) is None
  warning = common.unsteady_warning({"tensorflow": steady, "pytorch": rate})
  assert warning.startswith("WARNING: the pytorch matmul rate moved") and "0.51" in warning
  train_memory = benchmark_module("train_memory")
  records = [{"status": "ok", "tokens_per_sec": 1000.0, "useful_flops_per_token": 1.5e8},
             {"status": "timeout"}]
  train_memory.add_utilisation(records, rate["gflops"])
  assert records[0]["utilisation"] == pytest.approx(1.5e11 / 208e9)
  assert "utilisation" not in records[1]


def test_interleaved_times_alternate_the_order_and_ratio_within_rounds():
  """bench-peers --interleave: every round calls each configuration once, in order in even
  rounds and reversed in odd ones, warm-up rounds untimed; a configuration's ratio is the median
  of its per-round ratios to the reference, so a round where the machine ran slow for all of them
  (round 2 below) leaves the ratio alone."""
  common = benchmark_module("common")
  calls, now = [], [0.0]
  durations = {"a": [9.0, 1.0, 1.0, 3.0, 1.0], "b": [9.0, 1.2, 1.1, 3.3, 1.1],
               "c": [9.0, 2.0, 2.0, 6.0, 2.0]}  # one row per round, the first a warm-up

  def fn(name):
    def call():
      now[0] += durations[name][sum(1 for c in calls if c == name)]
      calls.append(name)
    return call

  times = common.interleaved_times({n: fn(n) for n in "abc"}, rounds=4, warmup=1,
                                   clock=lambda: now[0])
  assert "".join(calls) == "abc" + "cba" + "abc" + "cba" + "abc"
  expected = {"a": [1.0, 1.0, 3.0, 1.0], "b": [1.2, 1.1, 3.3, 1.1], "c": [2.0, 2.0, 6.0, 2.0]}
  assert set(times) == set(expected)
  for name, seconds in expected.items():
    assert times[name] == pytest.approx(seconds)
  summary = common.interleaved_summary(times, "a")
  assert summary["a"]["over_reference"] == 1.0
  assert summary["a"]["seconds_per_step"] == pytest.approx(1.0)
  assert summary["b"]["seconds_per_step"] == pytest.approx(1.15)
  assert summary["b"]["over_reference"] == pytest.approx(1.1)  # rounds' ratios 1.2, 1.1, 1.1, 1.1
  assert summary["c"]["over_reference"] == pytest.approx(2.0)
  table = benchmark_module("peers").interleaved_table(
      {"steps": 4, "reference": "a", "names": ["a", "b", "c"], "configurations": summary})
  assert "| b | 1.15 | 1.100 |" in table and "| c | 2.00 | 2.000 |" in table


def test_peak_bytes_without_allocator_statistics_runs_fn_and_reports_none(monkeypatch):
  """TF's default CPU allocator without oneDNN (an AVX2-only CPU) keeps no statistics and
  reset_memory_stats raises: peak_bytes still runs fn once and reports None, so bench-peers'
  matmul rate (common.matmul_gflops) is measured there too (it failed on 2026-11-27)."""
  common = benchmark_module("common")
  calls = []

  def no_statistics(device):
    raise ValueError("Cannot reset memory stats for device " + device)

  monkeypatch.setattr(tf.config.experimental, "reset_memory_stats", no_statistics)
  assert common.peak_bytes(lambda: calls.append(1)) is None and calls == [1]
  seconds, peak = common.time_fn(lambda: calls.append(1), repeats=3, warmup=1)
  assert peak is None and seconds >= 0 and len(calls) == 1 + 1 + 1 + 3
  assert common.matmul_gflops(size=64, repeats=1) > 0


def test_kept_for_backward_counts_what_the_needed_gradient_ops_read():
  """benchmarks/common.py's kept tensors (what the tests here read off the graph): what the
  gradient ops the fetches need read from the forward pass, in bytes (y = tanh(x w): dw reads x
  and tanh's output y; the gradient of x, which would read w, is not fetched, so w is not kept)."""
  common = benchmark_module("common")
  graph = tf.Graph()
  with graph.as_default():
    x = tf.exp(tf.constant(np.ones((4, 3), np.float32)))
    w = tf.exp(tf.constant(np.ones((3, 5), np.float32)))
    y = tf.tanh(tf.reshape(tf.matmul(x, w), [20]))
    dw, = tf1.gradients(tf.reduce_sum(tf.reshape(y, [4, 5])), [w])
    kept, _, _ = common.kept_for_backward(graph, [dw])
  floats = {name: value[0] for name, value in kept.items() if value[0] >= 48}
  assert floats == {x.name: 4 * 3 * 4, y.name: 20 * 4}, kept


# --- relative positions: the per-distance weights' recomputation -------------------------------

def ancestors(op):
  """Names of the ops `op` waits for (data and control inputs, transitively)."""
  seen, stack = set(), [op]
  while stack:
    current = stack.pop()
    for before in [t.op for t in current.inputs] + list(current.control_inputs):
      if before.name not in seen:
        seen.add(before.name)
        stack.append(before)
  return seen


def gradient_ops_before_the_backward_pass(graph, grads, size):
  """Gradient ops that `grads` need, with an output of at least `size` elements, that do not wait
  for the tensor named "seed" (the incoming gradient): the executor may run them during the
  forward pass."""
  needed = set().union(*[ancestors(g.op) | {g.op.name} for g in grads])
  found = []
  for op in graph.get_operations():
    if op.name.startswith("gradients") and op.name in needed and any(
        t.shape.is_fully_defined() and t.shape.num_elements() >= size for t in op.outputs):
      if "seed" not in ancestors(op):
        found.append(op.name)
  return found


@pytest.mark.parametrize("causal", [False, True])
def test_relative_outputs_recomputation_waits_for_the_incoming_gradient(rng, causal):
  """The backward pass of common.relative_outputs recomputes the per-distance weights (a pad of
  the probabilities) only once the incoming gradient exists; without that wait the executor ran
  the recomputation of every layer early and kept it until the backward pass (0.5 GiB of
  bench-8k's peak). Values and gradients: tests/test_relative_positions.py."""
  graph = tf.Graph()
  with graph.as_default():
    probs = tf.nn.softmax(tf.constant(rng.standard_normal((2, 3, 8, 9))))
    table = tf.constant(rng.standard_normal((17, 4)))
    out = common.relative_outputs(probs, table, 0, -1, causal=causal)
    seed = tf.identity(tf.constant(rng.standard_normal(out.shape.as_list())), name="seed")
    dprobs, dtable = tf1.gradients(out, [probs, table], grad_ys=seed)
    pads = [op for op in graph.get_operations()
            if op.name.startswith("gradients") and op.type == "Pad"]
  assert pads  # the recomputed unskew
  assert not gradient_ops_before_the_backward_pass(graph, [dprobs, dtable], 2 * 3 * 8 * 9)
  assert dprobs is not None and dtable is not None


@pytest.mark.parametrize("adjoint_b", [True, False], ids=["logits", "outputs"])
def test_memory_product_rebuilds_the_blocks_after_the_incoming_gradient(rng, adjoint_b):
  """local.memory_product's backward pass rebuilds the memory blocks [b, h, nb, W, d] only once
  the incoming gradient exists; without that wait the executor rebuilt every layer's blocks
  during the forward pass (in bench-8k's trace at 31-818 ms, the backward pass starting at 1,044)
  and kept them into the backward pass: 8 blocks of 24 MiB alive at the step's peak."""
  block, before = 4, 1
  width = (before + 1) * block
  graph = tf.Graph()
  with graph.as_default():
    a = tf.constant(rng.standard_normal((2, 3, 5, block, 6 if adjoint_b else width)))
    x = tf.constant(rng.standard_normal((2, 3, 5 * block, 6)))
    out = local.memory_product(a, x, block, before, 0, adjoint_b=adjoint_b)
    seed = tf.identity(tf.constant(rng.standard_normal(out.shape.as_list())), name="seed")
    da, dx = tf1.gradients(out, [a, x], grad_ys=seed)
    rebuilt = [op for op in graph.get_operations()
               if op.name.startswith("gradients") and op.type == "ConcatV2"
               and op.outputs[0].shape.as_list() == [2, 3, 5, width, 6]]
  assert rebuilt  # the blocks, rebuilt in the backward pass
  assert not gradient_ops_before_the_backward_pass(graph, [da, dx], 2 * 3 * 5 * width * 6)
  assert da is not None and dx is not None


def test_ordered_softmax_backward_keeps_its_output_and_waits_for_the_gradient(rng):
  """common.ordered_softmax's backward pass reads only its output (kept anyway for the product
  with the values) and computes nothing before the incoming gradient: the division's own
  gradient read e and the row sums and computed -e / sum^2 without the gradient, which the
  executor then ran in the forward pass and kept (3 [..., w, 2w] tensors per causal_window
  layer)."""
  common_bench = benchmark_module("common")
  graph = tf.Graph()
  with graph.as_default():
    logits = tf.exp(tf.constant(rng.standard_normal((2, 3, 8, 16))))  # an op: kept is counted
    allowed = tf.constant(rng.random((2, 3, 8, 16)) < 0.6)
    probs = common.ordered_softmax(logits, allowed)
    seed = tf.identity(tf.constant(rng.standard_normal((2, 3, 8, 16))), name="seed")
    dlogits, = tf1.gradients(probs, [logits], grad_ys=seed)
    kept = common_bench.kept_for_backward(graph, [dlogits])[0]
  assert not gradient_ops_before_the_backward_pass(graph, [dlogits], 2 * 3 * 8 * 16)
  assert [(v[2], v[3]) for v in kept.values()] == [("RealDiv", [2, 3, 8, 16])], kept  # e / sum


# Ops that allocate no buffer of their own (views of a forward tensor): they may run early.
VIEWS = ("Reshape", "Identity", "ExpandDims", "Squeeze")


@pytest.mark.parametrize("overrides", [
    {}, {"recompute_attention": True}, {"recompute_layers": True}, {"ffn_rebuild_linear": True},
    {"routing_mode": "causal_window"}, {"logits_chunk_size": 16},
    {"activation_dtype": "bfloat16"}],
    ids=["plain", "recompute_attention", "recompute_layers", "ffn_rebuild_linear",
         "causal_window", "chunked_logits", "bfloat16"])
def test_model_backward_computes_nothing_before_the_loss_gradient(rng, overrides):
  """In the model's training step every gradient op with an output of at least one [b, n,
  hidden] activation, views apart, waits for the loss gradient: an op that does not can run in
  the forward pass and hold its output until the backward pass (local.memory_product's rebuilt
  blocks did, 8 x 24 MiB of bench-8k's peak; causal_window's softmax division gradient did; with
  bfloat16 activations the masked softmax's float32 copy of its bfloat16 output did)."""
  with tf.Graph().as_default() as graph:
    _, losses = build(small_hparams(**overrides), TRAIN, {"targets": random_targets(rng)})
    seed = tf.identity(tf.constant(1.0), name="seed")
    grads = [g for g in tf1.gradients(losses["training"] + losses["extra_loss"],
                                      tf1.trainable_variables(), grad_ys=seed) if g is not None]
    early = [name for name in gradient_ops_before_the_backward_pass(graph, grads, 2 * 64 * 32)
             if graph.get_operation_by_name(name).type not in VIEWS]
  assert not early, early


# --- layer norm: keeps only its input ---------------------------------------------------------

def layer_norm_graph(rng, ours, shape=(2, 5, 8)):
  """(graph, [y, dx, dscale, dbias]) of a layer norm of random x under an incoming gradient
  "seed": ours (`norm.layer_norm`) or T2T's `layer_norm_compute`."""
  graph = tf.Graph()
  with graph.as_default():
    x = tf.constant(rng.standard_normal(shape).astype(np.float32) * 3 + 1)
    scale = tf.constant(rng.standard_normal(shape[-1:]).astype(np.float32))
    bias = tf.constant(rng.standard_normal(shape[-1:]).astype(np.float32))
    y = (norm.layer_norm(x, scale, bias, 1e-6) if ours else
         common_layers.layer_norm_compute(x, 1e-6, scale, bias))
    seed = tf.identity(tf.constant(rng.standard_normal(shape).astype(np.float32)), name="seed")
    grads = tf1.gradients(y, [x, scale, bias], grad_ys=seed)
  return graph, [y] + grads


def test_layer_norm_equals_t2t_layer_norm_and_its_gradients_bit_for_bit():
  fetched = []
  for ours in (False, True):
    graph, fetches = layer_norm_graph(np.random.default_rng(3), ours)
    with tf1.Session(graph=graph) as sess:
      fetched.append(sess.run(fetches))
  for plain, mine in zip(*fetched):
    np.testing.assert_array_equal(mine, plain)


def test_layer_norm_backward_keeps_only_its_input_and_waits_for_the_gradient():
  """T2T's ops keep x - mean and the normalised x ([..., d] each) besides x; ours keeps x and
  recomputes the rest once the incoming gradient exists."""
  size = 2 * 5 * 8
  plain, _ = layer_norm_graph(np.random.default_rng(0), False)
  assert len(saved_for_backward(plain, size)) >= 3
  graph, fetches = layer_norm_graph(np.random.default_rng(0), True)
  seed = buffer_of(graph.get_tensor_by_name("seed:0")).name
  kept = saved_for_backward(graph, size) - {seed}
  assert len(kept) == 1 and graph.get_tensor_by_name(kept.pop()).op.type == "Const", kept
  assert not gradient_ops_before_the_backward_pass(graph, fetches[1:], size)


def rebuilt_norm_graph(rng, rebuilt, dtype):
  """x -> two layer norms; the first read by three dense products (as q, k, v), the second by the
  GEGLU block; built with `rebuild` marking the norms' outputs or not (`rebuild.off`).
  Returns (graph, [y, z] the norms' outputs, [out, *gradients])."""
  graph = tf.Graph()
  with graph.as_default():
    x = tf.exp(tf.constant(rng.standard_normal((2, 6, 8)), dtype), name="x")
    scale, bias = [tf.constant(rng.standard_normal(8) * 0.1 + m, dtype) for m in (1.0, 0.0)]
    kernels = [tf.constant(rng.standard_normal(shape) * 0.3, dtype)
               for shape in [(8, 8)] * 3 + [(8, 16), (8, 16), (16, 8)]]
    with contextlib.nullcontext() if rebuilt else rebuild.off():
      y = norm.layer_norm(x, scale, bias)
      z = norm.layer_norm(x * x, scale, bias)
    out = tf.add_n([layers.apply_kernel(y, k) for k in kernels[:3]] +
                   [layers.geglu_ffn(z, *kernels[3:], chunk_rows=5)])
    seed = tf.identity(tf.constant(rng.standard_normal(out.shape), dtype), name="seed")
    grads = tf1.gradients(out, [x, scale, bias] + kernels, grad_ys=seed)
  return graph, [y, z], [out] + grads


@pytest.mark.parametrize("dtype", [tf.float64, tf.float32])
def test_dense_and_geglu_gradients_rebuild_the_norm_output_bit_for_bit(dtype):
  """The kernel gradients of dense products and of the GEGLU block read a layer norm's output
  rebuilt from the norm's input after the incoming gradient (`rebuild.for_gradient`, one re-run
  per norm shared by the three products): the same values and gradients bit for bit as with the
  output kept (`rebuild.off`), and neither norm output is kept, only x."""
  common_bench = benchmark_module("common")
  fetched, kept = [], []
  for rebuilt in (False, True):
    graph, outputs, fetches = rebuilt_norm_graph(np.random.default_rng(5), rebuilt, dtype)
    saved = common_bench.kept_for_backward(graph, fetches[1:])[0]
    kept.append([buffer_of(t).name in saved for t in outputs])
    with tf1.Session(graph=graph) as sess:
      fetched.append(sess.run(fetches))
    if rebuilt:
      assert "x:0" in saved
      rebuilt_ops = [op for op in graph.get_operations() if "/rebuild/" in op.name]
      assert len([op for op in rebuilt_ops if op.type == "Rsqrt"]) == 2, rebuilt_ops
      early = [op.name for op in rebuilt_ops if "seed" not in ancestors(op) and any(
          t.shape.num_elements() >= 2 * 6 * 8 for t in op.outputs)]
      assert not early, early
  assert kept == [[True, True], [False, False]]
  for plain, mine in zip(*fetched):
    np.testing.assert_array_equal(mine, plain)


def test_attention_output_rebuilds_head_dense_output_bit_for_bit():
  """layers.attention_output with head_dense: output_transform's kernel gradient reads
  head_dense's output rebuilt from the heads (which head_dense's kernel gradient keeps); values,
  variable names and gradients are those with the output kept (`rebuild.off`), bit for bit."""
  rng = np.random.default_rng(6)
  hp = HParamsStandIn(head_dense=True, hidden_size=12)
  heads_np, seed_np = rng.standard_normal((2, 3, 5, 4)), rng.standard_normal((2, 5, 12))
  fetched, kept, names = [], [], []
  for rebuilt in (False, True):
    graph = tf.Graph()
    with graph.as_default():
      out = tf.exp(tf.constant(heads_np, tf.float32), name="heads")
      with contextlib.nullcontext() if rebuilt else rebuild.off():
        y = layers.attention_output(out, hp)
      variables = tf1.trainable_variables()
      seed = tf.identity(tf.constant(seed_np, tf.float32), name="seed")
      grads = tf1.gradients(y, [out] + variables, grad_ys=seed)
      saved = benchmark_module("common").kept_for_backward(graph, grads)[0]
      names.append([v.name for v in variables])
      kept.append(sorted(saved))
      with tf1.Session(graph=graph) as sess:
        for v in variables:
          v.load(rng.standard_normal(v.shape) * 0.3, sess)
        fetched.append(sess.run([y] + grads))
    rng = np.random.default_rng(6)  # the same kernels in both graphs
    heads_np, seed_np = rng.standard_normal((2, 3, 5, 4)), rng.standard_normal((2, 5, 12))
  assert names[0] == names[1] == ["head_dense/kernel:0", "output_transform/kernel:0"]
  assert kept == [["heads:0", "transpose:0"], ["heads:0"]]  # transpose: combine_heads'
  for plain, mine in zip(*fetched):
    np.testing.assert_array_equal(mine, plain)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_model_step_keeps_no_norm_output(rng, dtype):
  """In the model's training step no layer norm's output (post-norm, the final norm before the
  logits) nor, with bfloat16 activations, its bfloat16 cast is kept for the backward pass: the
  dense products, GEGLU and the output projection rebuild them from the norms' inputs, which the
  norms keep (with `rebuild.off` at build time they are kept)."""
  common_bench = benchmark_module("common")
  targets = random_targets(rng)
  found = []
  for rebuilt in (False, True):
    with tf.Graph().as_default() as graph:
      with contextlib.nullcontext() if rebuilt else rebuild.off():
        _, losses = build(small_hparams(activation_dtype=dtype), TRAIN, {"targets": targets})
      grads = tf1.gradients(losses["training"] + losses["extra_loss"],
                            tf1.trainable_variables())
      kept = common_bench.kept_for_backward(graph, [g for g in grads if g is not None])[0]
      ops = {name: graph.get_tensor_by_name(name).op for name in kept}
      found.append(sorted(name for name, op in ops.items() if "layer_norm/" in name or (
          op.type == "Cast" and "layer_norm/" in op.inputs[0].name)))
  assert len(found[0]) >= 3, found[0]
  assert not found[1], found[1]


def test_rebuild_marks_nothing_eagerly_and_works_under_tf_function():
  """Eagerly nothing is marked (a custom gradient holds its inputs anyway); under tf.function
  with a GradientTape the rebuilt norm output gives the gradients of the kept one."""
  rng = np.random.default_rng(7)
  x = tf.constant(rng.standard_normal((3, 8)), tf.float32)
  scale, bias = tf.constant(1.0 + 0.1 * rng.standard_normal(8), tf.float32), tf.zeros([8])
  kernel = tf.constant(rng.standard_normal((8, 4)), tf.float32)
  assert not rebuild.is_rebuildable(norm.layer_norm(x, scale, bias))
  marked = []

  def gradients(x, kernel, rebuilt):
    with tf.GradientTape() as tape:
      tape.watch([x, kernel])
      with contextlib.nullcontext() if rebuilt else rebuild.off():
        y = norm.layer_norm(x, scale, bias)
      marked.append(rebuild.is_rebuildable(y))
      loss = tf.reduce_sum(tf.sin(layers.apply_kernel(y, kernel)))
    return tape.gradient(loss, [x, kernel])

  kept = tf.function(functools.partial(gradients, rebuilt=False))(x, kernel)
  rebuilt = tf.function(functools.partial(gradients, rebuilt=True))(x, kernel)
  assert marked == [False, True]
  for want, got in zip(kept, rebuilt):
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("sequence,previous", [("dan", True), ("n", False), ("none", False)])
def test_prepostprocess_is_t2t_layer_prepostprocess(rng, sequence, previous):
  """model_lib.prepostprocess: the variables (names, shapes) and outputs of T2T's
  layer_preprocess / layer_postprocess, twice in a row (scope names made unique alike), and its
  gradients up to rounding (alone, the layer norm's are bit for bit: the test above)."""
  hp = HParamsStandIn(norm_type="layer", norm_epsilon=1e-6, layer_prepostprocess_dropout=0.0,
                      layer_preprocess_sequence=sequence, layer_postprocess_sequence=sequence)
  x_value = rng.standard_normal((2, 4, 6)).astype(np.float32)
  y_value = rng.standard_normal((2, 4, 6)).astype(np.float32)
  results = []
  for ours in (False, True):
    graph = tf.Graph()
    with graph.as_default():
      tf1.set_random_seed(1)
      x, y = tf.constant(x_value), tf.constant(y_value)
      out = y
      for _ in range(2):
        if ours:
          out = model_lib.prepostprocess(x if previous else None, out, sequence, hp,
                                         "layer_postprocess" if previous else
                                         "layer_prepostprocess")
        elif previous:
          out = common_layers.layer_postprocess(x, out, hp)
        else:
          out = common_layers.layer_preprocess(out, hp)
      names = [(v.name, v.shape.as_list()) for v in tf1.global_variables()]
      grads = tf1.gradients(tf.reduce_sum(out * out), [x, y] + tf1.trainable_variables())
      grads = [g for g in grads if g is not None]
      with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        results.append((names, sess.run([out] + grads)))
  (plain_names, plain), (names, mine) = results
  assert names == plain_names
  assert len(names) == (4 if sequence != "none" else 0)
  np.testing.assert_array_equal(mine[0], plain[0])  # the outputs, bit for bit
  for i, (a, b) in enumerate(zip(mine[1:], plain[1:])):  # TF's graph rewrites may round apart
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6, err_msg="gradient %d" % i)


# --- recompute_attention: local heads keep q, k, v; routing heads their inputs ----------------

LOCAL = heads.HeadConfig(window=8, block_length=8, flange=8, share_qk=False, routing_mode="topk",
                         random_routing=False, legacy_causal_key_routing=False)


def local_heads_graph(rng, recompute, causal=True, use_padding=False, num_heads=3):
  """(output, gradients w.r.t. q, k, v and both relative tables) of 3 local heads (or
  `num_heads`), n = 32, blocks of 8 with one block of memory, float64."""
  q, k, v = (tf.constant(rng.normal(size=(2, num_heads, 32, 4))) for _ in range(3))
  tables = tuple(tf.constant(rng.normal(size=(2 * 9 + 1, 4))) for _ in range(2))
  padding = tf.constant(rng.random((2, 32)) < 0.2) if use_padding else None
  config = LOCAL._replace(recompute_attention=recompute)
  out = heads.local_heads_attention(q, k, v, config, causal, padding, tables)
  dy = tf.constant(rng.normal(size=(2, num_heads, 32, 4)))
  return out, [tf.convert_to_tensor(g) for g in tf1.gradients(out, [q, k, v, *tables], dy)]


def with_and_without_recompute(build):
  """The values of build(False) and of build(True), each built in its own graph."""
  values = []
  for recompute in (False, True):
    with tf.Graph().as_default():
      values.append(run_graph(build(recompute)))
  return values


def assert_kept_only_without_recompute(build, size):
  """build(recompute) makes a graph: forward tensors of `size` elements are read by its gradient
  ops without recompute and by none with it."""
  saved = []
  for recompute in (False, True):
    graph = tf.Graph()
    with graph.as_default():
      build(recompute)
    saved.append(saved_for_backward(graph, size))
  assert saved[0] and not saved[1], saved


@pytest.mark.parametrize("causal,use_padding,num_heads", [
    (True, False, 3), (False, True, 3), (True, False, 4), (False, True, 6)])
def test_recompute_attention_equals_the_kept_attention(causal, use_padding, num_heads):
  """recompute_attention: the same outputs and gradients (q, k, v, relative keys and values) as
  the attention that keeps its weights, causal and with padding keys (encoder); 3 heads run one
  at a time, 4 and 6 in groups of two (`heads.head_groups`)."""
  (out, grads), (out2, grads2) = with_and_without_recompute(
      lambda r: local_heads_graph(np.random.default_rng(5), r, causal, use_padding, num_heads))
  np.testing.assert_allclose(out2, out, rtol=1e-12, atol=1e-12)
  assert len(grads2) == len(grads) == 5
  for g, g2 in zip(grads, grads2):
    assert np.abs(g).max() > 0
    np.testing.assert_allclose(g2, g, rtol=1e-12, atol=1e-12)


def test_recompute_attention_keeps_no_weights_or_memory_blocks():
  """The weights [b, h, blocks, 8, 16] and the key/value memory blocks [b, h, blocks, 16, d]
  (both 2 * 3 * 4 * 16 * 8 = 3,072 elements here) are read by the gradient ops of the plain
  attention and by none with recompute_attention (which reads q, k, v)."""
  assert_kept_only_without_recompute(lambda r: local_heads_graph(np.random.default_rng(5), r),
                                     3072)


def test_recompute_attention_refuses_dropout():
  with tf.Graph().as_default(), pytest.raises(ValueError, match="recompute_attention"):
    rng = np.random.default_rng(5)
    q = tf.constant(rng.normal(size=(1, 1, 16, 4)))
    heads.local_heads_attention(q, q, q, LOCAL._replace(recompute_attention=True),
                                dropout_rate=0.1)


def test_recompute_attention_runs_head_groups_one_after_another():
  """4 local heads in 2 groups: the second group's slices of q, k, v wait for the first group's
  output in the forward pass, and its slices of q, k, v and of the output's gradient wait for
  the first group's gradients in the backward pass (whose first group waits for the incoming
  gradient), so one group's weights and their gradients are alive at a time."""
  assert [heads.head_groups(h) for h in (1, 2, 3, 4, 6)] == [1, 1, 3, 2, 3]
  graph = tf.Graph()
  with graph.as_default():
    local_heads_graph(np.random.default_rng(5), True, num_heads=4)
  slices = [op for op in graph.get_operations() if op.type == "Slice"
            and op.inputs[0].shape.as_list() == [2, 4, 32, 4]]
  forward = [op for op in slices if not op.name.startswith("gradients")]
  backward = [op for op in slices if op.name.startswith("gradients")]
  assert len(forward) == 2 * 3 and len(backward) == 2 * 4  # 2 groups x (q, k, v (, dy))
  assert [waits(op) for op in forward] == [False] * 3 + [True] * 3
  assert [waits(op) for op in backward] == [False] * 4 + [True] * 4
  assert all(op.inputs[0].op.type == "Identity" and op.inputs[0].op.control_inputs
             for op in backward[1:4])  # the re-run's inputs wait for the incoming gradient


def test_recompute_in_groups_after_orders_another_recomputation():
  """`after`: the groups wait for a recompute_function's output in the forward pass, and that
  function's re-run waits for the groups' gradients in the backward pass (the heads of both
  kinds of a layer are re-run one kind after the other); the values and gradients are those
  of the plain functions."""
  arrays = np.random.default_rng(9).normal(size=(4, 1, 4, 6, 3))

  def first(t):
    return tf.tanh(t) * 3.0

  def second(t):
    return tf.sin(t) * t

  def step(recomputed):
    x, a, dz, dy = (tf.constant(t) for t in arrays)
    if not recomputed:
      z, y = first(x), second(a)
    else:
      with tf.name_scope("first"):
        z = recompute.recompute_function(first, x)
      y = recompute.recompute_in_groups(second, [a], [], groups=2, after=[z])
    return [z, y] + tf1.gradients([z, y], [x, a], [dz, dy])

  graph = tf.Graph()
  with graph.as_default():
    outputs = step(True)
    ops = graph.get_operations()
    first_forward = [op for op in ops if op.name.startswith("first/") and op.type == "Tanh"]
    first_replay = [op for op in ops if "recompute" in op.name and op.type == "Tanh"]
    second_forward = [op for op in ops if op.type == "Sin" and "gradients" not in op.name]
    second_grads = [op for op in ops if op.type == "Cos"]  # sin's gradient, one per group
    assert len(first_replay) == 1 and len(second_forward) == len(second_grads) == 2
    assert {op.name for op in first_forward} <= ancestors(second_forward[0])
    assert {op.name for op in second_grads} <= ancestors(first_replay[0])
    values = tf1.Session().run(outputs)
  with tf.Graph().as_default():
    expected = tf1.Session().run(step(False))
  for got, want in zip(values, expected):
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_recompute_in_groups_refuses_uneven_groups():
  with tf.Graph().as_default(), pytest.raises(ValueError, match="equal groups"):
    x = tf.zeros([1, 3, 4, 2])
    recompute.recompute_in_groups(lambda a: a, [x], [], groups=2)


def test_model_step_with_grouped_recompute_sorts_for_grappler():
  """The training step with recompute_attention inside recompute_layers (layer 0 has 4 local
  heads: 2 groups) passes Grappler's arithmetic optimizer, which refuses a graph it cannot sort
  topologically (and TF then runs the step without its rewrites)."""
  features = {"targets": random_targets(np.random.default_rng(3), length=64, pad_from=50)}
  graph = tf.Graph()
  with graph.as_default():
    _, losses = build(small_hparams(recompute_attention=True, recompute_layers=True), TRAIN,
                      features)
    graph.add_to_collection("train_op",
                            tf1.train.GradientDescentOptimizer(0.1).minimize(losses["training"]))
    meta = tf1.train.export_meta_graph(graph=graph)
  config = tf1.ConfigProto()
  config.graph_options.rewrite_options.optimizers.append("arithmetic")
  config.graph_options.rewrite_options.min_graph_nodes = -1
  optimized = tf_optimizer.OptimizeGraph(config, meta)
  assert len(optimized.node) > 100


def routing_graph(rng, recompute, causal=True, share_qk=True, use_padding=False, n=48,
                  window=12):
  """(output, (commitment loss, diagnostics), gradients of out . dy + 0.7 commitment loss
  w.r.t. q, k (without share_qk), v, both relative tables and a per-head logit scale) of 2
  routing heads with 4 centroids, routing_attention with exclude_self, float64."""
  q, k, v = (tf.constant(rng.normal(size=(1, 2, n, 4)), name=name) for name in "qkv")
  tables = tuple(tf.constant(rng.normal(size=(2 * window - 1, 4))) for _ in range(2))
  centroids = tf.constant(rng.normal(size=(2, 4, 4)))
  log_scale = tf.constant(rng.normal(size=(2,)) * 0.3)
  padding = tf.constant(rng.random((1, n)) < 0.2) if use_padding else None
  out, aux = routing.routing_attention(
      q, k, v, centroids, window, causal=causal, share_qk=share_qk, padding=padding,
      relative_keys=tables[0], relative_values=tables[1], exclude_self=True,
      logit_scale=tf.exp(log_scale), recompute=recompute)
  inputs = [q, v, *tables, log_scale] + ([] if share_qk else [k])
  dy = tf.constant(rng.normal(size=(1, 2, n, 4)), name="dy")
  loss = aux["commitment_loss"]
  grads = tf1.gradients([out, loss], inputs, [dy, tf.constant(0.7, loss.dtype)])
  return (out, (loss, aux["member_count"], aux["self_weight"]),
          [tf.convert_to_tensor(g) for g in grads])


@pytest.mark.parametrize("causal,share_qk,use_padding", [
    (True, True, False), (False, False, True), (False, True, True)])
def test_recompute_attention_routing_equals_the_kept_cluster_attention(causal, share_qk,
                                                                       use_padding):
  """routing_attention(recompute=True): the same outputs, diagnostics and gradients (q, k, v,
  relative keys and values, a learned per-head scale) as the cluster attention that keeps its
  weights; causal, and encoder with separately routed keys and padding."""
  (out, diag, grads), (out2, diag2, grads2) = with_and_without_recompute(
      lambda r: routing_graph(np.random.default_rng(7), r, causal, share_qk, use_padding))
  np.testing.assert_allclose(out2, out, rtol=1e-12, atol=1e-12)
  for d, d2 in zip(diag, diag2):
    np.testing.assert_allclose(d2, d, rtol=1e-12, atol=1e-12)
  assert len(grads2) == len(grads) == (5 if share_qk else 6)
  for g, g2 in zip(grads, grads2):
    assert np.abs(g).max() > 0
    np.testing.assert_allclose(g2, g, rtol=1e-12, atol=1e-12)


def test_recompute_attention_routing_keeps_only_q_k_v_of_their_size():
  """Of the [b, h, n, d] tensors (1 * 2 * 48 * 4 = 384 elements), the plain routing attention's
  gradient ops read q_hat, k_hat, the normalisation's x - mean and the differences to the
  centroids; with recompute=True they read only q, k, v themselves (the commitment loss and the
  normalisation are re-run from them) and the incoming gradient."""
  for share_qk in (True, False):
    saved = []
    for recompute in (False, True):
      graph = tf.Graph()
      with graph.as_default():
        routing_graph(np.random.default_rng(7), recompute, causal=share_qk, share_qk=share_qk)
      saved.append(saved_for_backward(graph, 384))
    inputs = {"q:0", "v:0", "dy:0"} | (set() if share_qk else {"k:0"})
    assert saved[1] == inputs and len(saved[0] - inputs) >= 2, saved


def test_recompute_function_waits_for_every_gradient_even_where_it_reads_outside_tensors():
  """The re-run of a function whose ops read a tensor from outside (here m, with no input of
  the function in between) and with two differentiable outputs and a side output: every
  re-run op waits for both outputs' gradients; the values and gradients are the plain ones."""
  arrays = np.random.default_rng(3).normal(size=(3, 2, 5))
  scale = np.random.default_rng(4).normal()

  def fn(x, m):
    weights = tf.nn.softmax(m * 2.0)  # reads only m
    return x * weights, tf.reduce_sum(tf.square(x - m)), tf.reduce_max(weights)

  def step(recomputed):
    x, m, dy = (tf.constant(t, name=name) for t, name in zip(arrays, ("x", "m", "dy")))
    seed = tf.constant(scale, tf.float64, name="seed")
    if recomputed:
      y, loss, side = recompute.recompute_function(lambda x: fn(x, m), x, differentiable=2)
    else:
      y, loss, side = fn(x, m)
    return [y, loss, side] + tf1.gradients([y, loss], [x], [dy, seed])

  graph = tf.Graph()
  with graph.as_default():
    outputs = step(True)
    replay = [op for op in graph.get_operations()
              if "recompute/" in op.name and op.type in ("Softmax", "Mul", "Square")]
    assert {op.type for op in replay} == {"Softmax", "Mul", "Square"}
    for op in replay:
      assert {"seed", "dy"} <= ancestors(op), op.name
    values = tf1.Session().run(outputs)
  with tf.Graph().as_default():
    expected = tf1.Session().run(step(False))
  for got, want in zip(values, expected):
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_recompute_attention_routing_keeps_no_cluster_weights():
  """The cluster weights [b, h, c, w, w] (1 * 2 * 4 * 12 * 12 = 1,152 elements) are read by the
  gradient ops of the plain routing attention and by none with recompute=True."""
  assert_kept_only_without_recompute(lambda r: routing_graph(np.random.default_rng(7), r), 1152)


def test_recompute_attention_routing_refuses_dropout():
  with tf.Graph().as_default(), pytest.raises(ValueError, match="recompute_attention"):
    q = tf.constant(np.random.default_rng(5).normal(size=(1, 1, 16, 4)))
    routing.routing_attention(q, q, q, tf.ones([1, 2, 4], tf.float64), 8, dropout_rate=0.1,
                              recompute=True)


@pytest.mark.parametrize("overrides", [
    {}, {"recompute_layers": True},
    {"recompute_layers": True, "recompute_keep_heads": True},  # the heads a unit of their own
    {"recompute_layers": True, "recompute_keep_qkv": True}])  # the attention outside the units
def test_model_gradients_with_recompute_attention_equal_the_plain_step(rng, overrides):
  """The whole training step (2 layers of local and routing heads, padding) with
  recompute_attention, alone and inside recompute_layers: the same loss and gradients."""
  features = {"targets": random_targets(rng, length=64, pad_from=50)}
  before, loss, grads, _ = model_step(small_hparams(**overrides), features)
  _, loss2, grads2, _ = model_step(small_hparams(recompute_attention=True, **overrides),
                                   features, before)
  np.testing.assert_allclose(loss2, loss, rtol=1e-7)
  assert set(grads2) == set(grads) and len(grads) > 10
  for name, g in grads.items():
    np.testing.assert_allclose(grads2[name], g, rtol=1e-5, atol=1e-7, err_msg=name)
