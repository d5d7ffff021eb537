"""activation_dtype=bfloat16: bfloat16 activations, float32 variables, and float32 where it counts.

The same tiny models (the registered sets `routing_transformer_test`, `..._causal`,
`local_transformer_test`) are built in float32 and in bfloat16 from the same variable values:
- where rounding cannot change routing (clusters of every position, or one cluster), the
  training loss, the k-means loss, the logits and the gradients follow float32 within what
  bfloat16's 8 significant bits allow (tolerances justified at each check), and bfloat16 really
  ran (the numbers are not identical); with the registered clusters (members may flip where
  scores nearly tie) within looser bounds; the routing functions of bfloat16 inputs are bit for
  bit the float32 functions of the same values, rounded once;
- every variable (k-means means and EMA statistics included) stays float32, and the EMA update
  of the centroids is computed from float32 statistics;
- read off the graph: every softmax, LayerNorm rsqrt, centroid score, top-k / argmax input,
  routing cluster matmul, k-means segment sum and the output projection and cross-entropy are
  float32; every other dense matmul (embedding dense, q/k/v, head_dense, output_transform, the
  three GEGLU matrices) and the local heads' attention are bfloat16, so the activations between
  layers are bfloat16; the local attention weights are kept for the backward pass in bfloat16
  only;
- recompute_layers gives the same bfloat16 step, and so does T2TModel.__call__ (T2T's getter
  composed with the body's); cached decoding refuses bfloat16 in one line; every project hparams
  set keeps float32.
"""
import collections
import re

import numpy as np
import pytest
import tensorflow as tf

import hparams as project_hparams
from routing_transformer.core import decoding
from routing_transformer.core.attention import causal_window
from routing_transformer.core.attention import common
from routing_transformer.core.attention import routing
from routing_transformer.t2t import model as model_lib
from tensor2tensor.data_generators import problem_hparams
from tensor2tensor.utils import registry
from test_model import EVAL, TRAIN, build, random_targets

tf1 = tf.compat.v1
KMEANS = ("/means:0", "/ema_count:0", "/ema_means:0")
BF16 = "bfloat16"
# bfloat16 keeps 8 significant bits: its unit roundoff, the largest relative change of a value
# rounded to bfloat16, is 2^-8 (0.39%).
BF16_EPS = 2.0 ** -8
PRE_NORM = {"layer_preprocess_sequence": "n", "layer_postprocess_sequence": "da"}

Step = collections.namedtuple("Step", "before loss extra grads after logits graph")


def set_hparams(name="routing_transformer_test", **overrides):
  """A registered set (length 64, hidden 32, 2 layers: layer 1 has 2 local + 2 routing heads of
  4 clusters x 16) with overrides."""
  hp = registry.hparams(name)
  for key, value in overrides.items():
    setattr(hp, key, value)
  return hp


def features_of(rng, inputs=False):
  features = {"targets": random_targets(rng, batch=2, length=64, pad_from=50)}
  if inputs:
    features["inputs"] = random_targets(rng, batch=2, length=64, pad_from=40)
  return features


def step(hparams, features, initial=None, mode=TRAIN):
  """One step in a new graph, the variables from `initial` when given: (values of every variable
  before, training loss, extra_loss, gradients by variable name, k-means variables after the
  step's EMA update, logits, the graph)."""
  graph = tf.Graph()
  with graph.as_default():
    tf1.set_random_seed(1)
    logits, losses = build(hparams, mode, features)
    variables = tf1.trainable_variables()
    total = losses["training"] + losses["extra_loss"]
    grads = [tf.convert_to_tensor(g) for g in tf1.gradients(total, variables)]
    every = {v.name: v for v in tf1.global_variables()}
    kmeans = {name: v for name, v in every.items() if name.endswith(KMEANS)}
    feeds = {} if initial is None else {
        v.initializer.inputs[1]: initial[name] for name, v in every.items()}
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer(), feeds)
      before = sess.run(every)
      fetches = [losses["training"], losses["extra_loss"], grads, logits]
      loss, extra, grad_values, logits_value = sess.run(fetches)  # runs the EMA update too
      after = sess.run(kmeans)
  return Step(before, loss, extra, {v.name: g for v, g in zip(variables, grad_values)}, after,
              logits_value, graph)


def cosine(a, b):
  a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
  return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def forward_ops(graph, op_type):
  """Ops of `op_type` of the forward pass (not the gradient ops, nor the ops a custom gradient
  builds inside a gradients/ scope, e.g. `local.memory_product`'s rebuilt blocks)."""
  return [op for op in graph.get_operations()
          if op.type == op_type and not re.search(r"(^|/)gradients(_\d+)?/", op.name)]


def local_products(graph):
  """The local heads' forward products (`local.memory_product`: batch matmuls whose second
  operand is the memory blocks, the ConcatV2 of `local.memory_blocks`), logits and outputs."""
  return [op for op in forward_ops(graph, "BatchMatMulV2") if op.inputs[1].op.type == "ConcatV2"]


def variables_behind(tensor, depth=8):
  """Names of the variables a tensor is a view of: reached backwards through reads, casts,
  reshapes, transposes, splits, slices and gathers only (a matmul's kernel, the relative rows,
  the embedding lookup)."""
  passes = ("Identity", "Cast", "ReadVariableOp", "Reshape", "Transpose", "Split", "SplitV",
            "Slice", "StridedSlice", "GatherV2", "ResourceGather")
  found, frontier = set(), [tensor.op]
  for _ in range(depth):
    following = []
    for op in frontier:
      if op.type == "VarHandleOp":
        found.add(op.name)
      elif op.type in passes:
        following.extend(t.op for t in op.inputs)
    frontier = following
  return found


WHOLE = dict(sparsity_cluster_attention_window=64)  # every cluster holds all 64 positions
EXACT_ROUTES = {  # name -> (set, overrides, with inputs): routing that rounding cannot change
    "local_only": ("local_transformer_test", {}, False),
    "topk_whole_window": ("routing_transformer_test", WHOLE, False),
    "causal_window_one_cluster": ("routing_transformer_test_causal",
                                  dict(WHOLE, sparsity_cluster_size=1), False),
    "separate_keys_no_ema": ("routing_transformer_test", dict(WHOLE, share_qk=False, ema=False),
                             False),
    "encoder_decoder": ("routing_transformer_test", dict(WHOLE, num_encoder_layers=1), True),
}


def flat(grads):
  return np.concatenate([grads[k].ravel() for k in sorted(grads)])


@pytest.mark.parametrize("case", list(EXACT_ROUTES))
def test_bfloat16_step_follows_the_float32_step(rng, case):
  """Loss, k-means loss, logits and gradients of the bfloat16 step against the float32 step from
  the same variables, where routing cannot change with rounding (local heads only, or clusters
  that hold every position / one cluster: the members are the same whatever the scores).

  Tolerances, with u = 2^-8 the unit roundoff of bfloat16 (8 significant bits): the activations
  are rounded a few times per layer (projections, attention, FFN, the LayerNorm outputs), each
  by up to u relative, and the roundings of different positions are unrelated. The loss (an
  average over ~100 positions) moves by 2e-3 = 0.5u at most (measured 5e-5 to 6e-4); the
  k-means loss, computed in float32 from queries rounded once, by 5e-3 (measured <= 1e-3); the
  logits by 3% of their norm (measured 1.2% to 1.7%); each variable's
  gradient keeps its direction (cosine > 0.995, measured >= 0.9987; > 0.999 over all variables,
  measured >= 0.9993). A dropped path, a wrong mask or a float32 op fed wrong values moves
  these by 5% to 100%."""
  name, overrides, inputs = EXACT_ROUTES[case]
  features = features_of(rng, inputs)
  f32 = step(set_hparams(name, **overrides), features)
  bf16 = step(set_hparams(name, activation_dtype=BF16, **overrides), features, f32.before)
  assert set(bf16.before) == set(f32.before)  # the same variables, all float32
  assert all(v.dtype == np.float32 for v in bf16.before.values())
  assert bf16.loss != f32.loss  # bfloat16 really ran
  assert abs(bf16.loss - f32.loss) <= 2e-3 * f32.loss, (bf16.loss, f32.loss)
  if f32.extra:  # beta x the commitment loss
    assert abs(bf16.extra - f32.extra) <= 5e-3 * f32.extra, (bf16.extra, f32.extra)
  else:  # local heads only
    assert bf16.extra == 0
  assert bf16.logits.dtype == np.float32 and np.isfinite(bf16.logits).all()
  error = np.linalg.norm(bf16.logits - f32.logits) / np.linalg.norm(f32.logits)
  assert error <= 0.03, error
  assert set(bf16.grads) == set(f32.grads) and len(f32.grads) > 10
  assert cosine(flat(bf16.grads), flat(f32.grads)) > 0.999
  for key, want in f32.grads.items():
    got = bf16.grads[key]
    assert got.dtype == np.float32 and np.isfinite(got).all(), key
    if np.abs(want).max() > 1e-6:  # a gradient that is not (numerically) zero
      assert cosine(got, want) > 0.995, (key, cosine(got, want))


@pytest.mark.parametrize("name", ["routing_transformer_test", "routing_transformer_test_causal"])
def test_bfloat16_step_of_the_registered_routing_sets(rng, name):
  """The registered sets as they are (4 clusters of 16 of the 64 positions): here a rounded query
  can change a cluster's members where two centroid scores nearly tie, a discrete change of what
  a few queries see (the float32 routing itself is exact: the next test). The loss still moves by
  less than 1% (measured <= 0.3%) and the gradients keep their direction over all variables
  (cosine > 0.98, measured >= 0.99)."""
  features = features_of(rng)
  f32 = step(set_hparams(name), features)
  bf16 = step(set_hparams(name, activation_dtype=BF16), features, f32.before)
  assert bf16.loss != f32.loss
  assert abs(bf16.loss - f32.loss) <= 1e-2 * f32.loss, (bf16.loss, f32.loss)
  assert abs(bf16.extra - f32.extra) <= 1e-2 * f32.extra, (bf16.extra, f32.extra)
  assert all(np.isfinite(g).all() for g in bf16.grads.values())
  assert cosine(flat(bf16.grads), flat(f32.grads)) > 0.98


@pytest.mark.parametrize("mode", ["topk", "causal_window"])
def test_routing_of_bfloat16_inputs_is_the_float32_routing_rounded_once(rng, mode):
  """routing_attention / causal_window_attention of bfloat16 q, k, v are bit for bit the float32
  functions of the same values (bfloat16 -> float32 is exact) with the output rounded to
  bfloat16 once: the same clusters, commitment loss and normalised vectors (float32), and the
  gradients with respect to q and k are the float32 ones rounded once."""
  b, h, n, d, c, w = 2, 2, 32, 8, 4, 8
  values = [rng.standard_normal((b, h, n, d)).astype(np.float32) for _ in range(3)]
  centroids = rng.standard_normal((h, c, d)).astype(np.float32)
  tables = [rng.standard_normal((2 * w + 1, d)).astype(np.float32) for _ in range(2)]
  padding = np.zeros((b, n), bool)
  padding[:, 28:] = True
  cotangent = rng.standard_normal((b, h, n, d))
  function = (routing.routing_attention if mode == "topk" else
              causal_window.causal_window_attention)
  with tf.Graph().as_default():
    feeds = [tf1.placeholder(tf.float32, [b, h, n, d]) for _ in range(3)]
    low = [tf.cast(x, tf.bfloat16) for x in feeds]
    wide = [tf.cast(x, tf.float32) for x in low]  # the same values in float32
    dout = tf.cast(tf.constant(cotangent, tf.float32), tf.bfloat16)
    results = {}
    for name, (q, k, v) in (("low", low), ("wide", wide)):
      out, aux = function(q, k, v, centroids, w, share_qk=False, padding=padding,
                          relative_keys=tables[0], relative_values=tables[1])
      out = tf.cast(out, tf.bfloat16)  # the float32 output rounded once (no-op for "low")
      grads = [tf.cast(g, tf.bfloat16) for g in tf.gradients(out, [q, k], dout)]  # likewise
      results[name] = [tf.cast(t, tf.float32) for t in [out] + grads] + [
          aux["q_hat"], aux["k_hat"], aux["commitment_loss"], aux["query_clusters"]]
      assert aux["q_hat"].dtype == tf.float32
    with tf1.Session() as sess:
      got = sess.run(results, dict(zip(feeds, values)))
  names = ["output", "dq", "dk", "q_hat", "k_hat", "commitment_loss", "query_clusters"]
  for what, low_value, wide_value in zip(names, got["low"], got["wide"]):
    np.testing.assert_array_equal(low_value, wide_value, err_msg=what)
  assert np.abs(got["low"][0]).max() > 0 and np.abs(got["low"][1]).max() > 0


def test_kmeans_variables_and_their_update_stay_float32(rng):
  """The means and EMA statistics are float32 variables; the EMA step moves them by float32
  statistics that match the float32 step's (the counts are sums of 0/1 assignments, exact in
  float32; a query whose argmax centroid differs between the two runs moves one count, so the
  updates are compared in direction); the statistics' segment sums read float32."""
  features = features_of(rng)
  f32 = step(set_hparams(), features)
  bf16 = step(set_hparams(activation_dtype=BF16), features, f32.before)
  kmeans_vars = [v for v in bf16.graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)
                 if v.name.endswith(KMEANS)]
  assert len(kmeans_vars) == 3  # one routing layer
  assert all(v.dtype.base_dtype == tf.float32 for v in kmeans_vars)
  for name, value in bf16.after.items():
    assert value.dtype == np.float32, name
    moved, moved_f32 = value - bf16.before[name], f32.after[name] - f32.before[name]
    assert np.abs(moved).max() > 0, name  # the update ran
    assert cosine(moved, moved_f32) > 0.99, (name, cosine(moved, moved_f32))
  sums = forward_ops(bf16.graph, "UnsortedSegmentSum")  # k-means statistics, routing scatter
  assert len(sums) >= 3
  assert {op.get_attr("T") for op in sums} == {tf.float32}


def training_graph(hparams, features):
  """The training loss and its gradients in a new graph (no session)."""
  graph = tf.Graph()
  with graph.as_default():
    _, losses = build(hparams, TRAIN, features)
    tf1.gradients(losses["training"] + losses["extra_loss"], tf1.trainable_variables())
  return graph


def test_routing_softmax_layer_norm_and_loss_are_float32(rng):
  """Read off the bfloat16 graph: the ops that must compute in float32 do."""
  graph = training_graph(set_hparams(activation_dtype=BF16), features_of(rng))
  dtype = lambda op: op.get_attr("T")
  softmaxes = forward_ops(graph, "Softmax")
  assert len(softmaxes) >= 3  # local heads of both layers, routing heads of layer 1
  assert {dtype(op) for op in softmaxes} == {tf.float32}
  rsqrts = forward_ops(graph, "Rsqrt")  # both T2T LayerNorms per layer, routing's q LayerNorm
  assert len(rsqrts) >= 5
  assert {dtype(op) for op in rsqrts} == {tf.float32}
  scores = [op for op in forward_ops(graph, "Einsum")
            if op.get_attr("equation") == b"hcd,bhnd->bhcn"]
  assert len(scores) == 1 and dtype(scores[0]) == tf.float32  # the centroid scores
  routing_inputs = [op for op in forward_ops(graph, "TopKV2") + forward_ops(graph, "ArgMax")
                    if op.inputs[0].dtype.is_floating]  # (tf.sort of the members: int32)
  assert len(routing_inputs) >= 2  # the members' top-k, the assignments' argmax
  assert {op.inputs[0].dtype for op in routing_inputs} == {tf.float32}
  local = local_products(graph)
  cluster_matmuls = [op for op in forward_ops(graph, "BatchMatMulV2")  # routing logits and
                     if op not in local]  # weights x values
  assert len(cluster_matmuls) >= 2 and len(local) == 4
  assert {dtype(op) for op in cluster_matmuls} == {tf.float32}
  xent = forward_ops(graph, "SoftmaxCrossEntropyWithLogits")
  assert xent and {dtype(op) for op in xent} == {tf.float32}


def test_activations_between_layers_are_bfloat16(rng):
  """Every dense matmul of the bfloat16 graph but the output projection multiplies bfloat16
  activations (a MatMul's operands share one dtype, so its input, the previous layer's
  output, is bfloat16), and the local heads' attention products are bfloat16."""
  graph = training_graph(set_hparams(activation_dtype=BF16), features_of(rng))
  by_variable = collections.defaultdict(set)
  for op in forward_ops(graph, "MatMul"):
    for name in variables_behind(op.inputs[1]) | variables_behind(op.inputs[0]):
      by_variable[name.split("body/", 1)[-1]].add(op.get_attr("T"))
  # float32: the output projection, and the routing heads' relative tables (routing attention
  # runs in float32); bfloat16: everything else.
  wide = [name for name in by_variable if name.startswith("final_dense_2") or "/routing/" in name]
  assert "final_dense_2/kernel" in wide and len(wide) == 3, wide  # + routing's 2 tables
  assert all(by_variable[name] == {tf.float32} for name in wide), by_variable
  narrow = {name: dtypes for name, dtypes in by_variable.items() if name not in wide}
  dense = ["embeddings/embedding", "emb_dense/kernel"] + [
      "decoder_layer_%d/self_attention/%s/kernel" % (i, part) for i in range(2) for part in (
          "self_attention/q", "self_attention/k", "self_attention/v",
          "self_attention/head_dense", "self_attention/output_transform", "ffn/weight1",
          "ffn/weight2", "ffn/weight3")]
  tables = ["decoder_layer_%d/self_attention/self_attention/local/relative_positions_%s/"
            "embeddings" % (i, kind) for i in range(2) for kind in ("keys", "values")]
  assert sorted(narrow) == sorted(dense + tables), sorted(narrow)
  assert all(dtypes == {tf.bfloat16} for dtypes in narrow.values()), narrow
  local = local_products(graph)
  assert len(local) == 4  # logits and weighted values of the local heads, 2 layers
  assert {op.get_attr("T") for op in local} == {tf.bfloat16}


def test_float32_softmax_of_bfloat16_logits(rng):
  """common.masked_softmax of bfloat16 logits: the float64 softmax of the same (exactly
  representable) logits within one bfloat16 rounding (u = 2^-8 relative); masked entries get
  exactly 0 and no gradient; the gradient is the float64 softmax gradient of the rounded
  cotangent within a few roundings (p rounded once, the result once)."""
  logits = rng.standard_normal((3, 5, 7)) * 3.0
  allowed = rng.random((3, 5, 7)) < 0.7
  allowed[..., 0] = True
  cotangent = rng.standard_normal((3, 5, 7))
  with tf.Graph().as_default():
    x = tf.cast(tf.constant(logits, tf.float32), tf.bfloat16)
    probs = common.masked_softmax(x, tf.constant(allowed))
    dx = tf.gradients(probs, x, tf.cast(tf.constant(cotangent, tf.float32), tf.bfloat16))[0]
    with tf1.Session() as sess:
      x_value, p, g, dp = sess.run([tf.cast(x, tf.float64), tf.cast(probs, tf.float64),
                                    tf.cast(dx, tf.float64),
                                    tf.cast(tf.cast(cotangent, tf.bfloat16), tf.float64)])
  assert probs.dtype == tf.bfloat16 and dx.dtype == tf.bfloat16
  e = np.where(allowed, np.exp(x_value - x_value.max(-1, keepdims=True)), 0.0)
  want = e / e.sum(-1, keepdims=True)
  np.testing.assert_allclose(p, want, rtol=1.01 * BF16_EPS, atol=1e-30)
  assert (p[~allowed] == 0).all() and (g[~allowed] == 0).all()
  want_grad = want * (dp - (dp * want).sum(-1, keepdims=True))
  np.testing.assert_allclose(g, want_grad, atol=4 * BF16_EPS * np.abs(want_grad).max())


@pytest.mark.parametrize("norms", [{}, PRE_NORM], ids=["post_norm", "pre_norm"])
def test_recompute_layers_gives_the_same_bfloat16_step(rng, norms):
  """recompute_layers re-runs each block's bfloat16 ops on the same inputs (post-norm: the whole
  block; pre-norm: cut at the bfloat16 residual sums): the same loss and k-means loss bit for
  bit. The re-run's backward pass adds the same gradient terms in another order, and in
  bfloat16 each partial sum is rounded by up to u = 2^-8 (TF's threaded bfloat16 reductions do
  not even fix the order from run to run; the same check in float32 differs by 4e-7 of the
  largest entry): every gradient within 8u of its norm (measured up to 4.6u, the
  embedding dense bias, a sum over all positions) and in the same direction (cosine > 0.999,
  measured >= 0.99984)."""
  features = features_of(rng)
  plain = step(set_hparams(activation_dtype=BF16, **norms), features)
  again = step(set_hparams(activation_dtype=BF16, recompute_layers=True, **norms), features,
               plain.before)
  assert again.loss == plain.loss and again.extra == plain.extra
  assert set(again.grads) == set(plain.grads)
  for key, want in plain.grads.items():
    got = again.grads[key]
    assert np.linalg.norm(got - want) <= 8 * BF16_EPS * np.linalg.norm(want), key
    assert cosine(got, want) > 0.999, (key, cosine(got, want))


def test_eval_logits_are_float32_and_follow_float32(rng):
  features = features_of(rng)
  f32 = step(set_hparams(), features, mode=EVAL)
  bf16 = step(set_hparams(activation_dtype=BF16), features, f32.before, mode=EVAL)
  assert bf16.logits.dtype == np.float32 and bf16.logits.shape == f32.logits.shape
  assert abs(bf16.loss - f32.loss) <= 1e-2 * f32.loss
  assert not np.array_equal(bf16.logits, f32.logits)


def test_the_estimators_call_path_composes_t2ts_getter(rng):
  """T2TModel.__call__ (what the Estimator's model_fn runs) installs T2T's own bfloat16 getter
  as well; with the body's, the variables are still float32 (made once, cast twice is a no-op)
  and the step gives the same loss as the model_fn_sharded path from the same variables."""
  features = features_of(rng)
  hp = set_hparams(activation_dtype=BF16)
  direct = step(hp, features)
  with tf.Graph().as_default():
    model = model_lib.RoutingTransformer(set_hparams(activation_dtype=BF16), TRAIN,
                                         problem_hparams.test_problem_hparams(40, 40, hp))
    _, losses = model({k: tf.convert_to_tensor(v) for k, v in features.items()})
    every = {v.name.split("body/", 1)[-1]: v for v in tf1.global_variables()}
    assert all(v.dtype.base_dtype == tf.float32 for v in every.values())
    names = {name.split("body/", 1)[-1]: value for name, value in direct.before.items()}
    assert set(every) == set(names)
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer(),
               {v.initializer.inputs[1]: names[name] for name, v in every.items()})
      loss = sess.run(losses["training"])
  assert loss == direct.loss


def test_cached_decoding_refuses_bfloat16_in_one_line(rng):
  hp = set_hparams(activation_dtype=BF16)
  with pytest.raises(decoding.DecodeError) as error:
    decoding.check_cached_decoding(hp)
  assert "\n" not in str(error.value) and "activation_dtype=float32" in str(error.value)
  decoding.check_cached_decoding(set_hparams())  # float32: decodes
  with tf.Graph().as_default():
    model = model_lib.RoutingTransformer(hp, tf.estimator.ModeKeys.PREDICT,
                                         problem_hparams.test_problem_hparams(40, 40, hp))
    with pytest.raises(decoding.DecodeError, match="activation_dtype"):
      model.infer({"inputs": tf.constant(random_targets(rng, 1, 4))}, decode_length=2)


@pytest.mark.parametrize("overrides,match", [
    (dict(activation_dtype="float16"), "activation_dtype='float16' is not supported"),
    (dict(weight_dtype="bfloat16"), "weight_dtype='bfloat16' is not supported"),
])
def test_unsupported_dtypes_are_refused(overrides, match):
  with pytest.raises(model_lib.HParamsError, match=match):
    model_lib.check_hparams(set_hparams(**overrides))
  model_lib.check_hparams(set_hparams(activation_dtype=BF16))  # accepted


def test_every_project_set_keeps_float32():
  for name in project_hparams.PROJECT_SETS:
    hp = registry.hparams(name)
    assert hp.get("activation_dtype", "float32") == "float32", name
    assert hp.get("weight_dtype", "float32") == "float32", name
