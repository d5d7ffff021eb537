"""Layers of the Routing Transformer (tf.compat.v1 graph mode, T2T variable scoping).

Shapes: x [b, n, hidden]; heads are [b, h, n, d_head] with d_head = hidden / heads.
"""
import math

import tensorflow as tf

from routing_transformer.core import attention
from routing_transformer.core import heads
from routing_transformer.core.attention import incremental
from routing_transformer.core.attention import routing
from routing_transformer.core import kmeans
from tensor2tensor.layers import common_layers

tf1 = tf.compat.v1


def dense(x, units, name, use_bias=False):
  """Dense over the last axis (tf.compat.v1 variables `name/kernel`, `name/bias`)."""
  return tf1.layers.dense(x, units, use_bias=use_bias, name=name)


def relative_tables(hparams, depth, enabled):
  """Shaw relative key/value tables [2R + 1, d] in the current scope, or (None, None)."""
  if not enabled or not hparams.max_relative_position:
    return None, None
  rows = 2 * hparams.max_relative_position + 1
  init = tf1.random_normal_initializer(stddev=depth ** -0.5)
  with tf1.variable_scope("relative_positions_keys"):
    keys = tf1.get_variable("embeddings", [rows, depth], initializer=init)
  with tf1.variable_scope("relative_positions_values"):
    values = tf1.get_variable("embeddings", [rows, depth], initializer=init)
  return keys, values


def routing_heads(hparams, layer_index):
  """Number of routing heads of a layer (layers < sparsity_skip_first have none)."""
  if layer_index < hparams.sparsity_skip_first:
    return 0
  return hparams.sparsity_cluster_num_heads


def head_counts(hparams, layer_index):
  """(routing heads, local heads, depth per head) of a layer."""
  num_heads = hparams.local_num_heads + hparams.sparsity_cluster_num_heads
  num_routing = routing_heads(hparams, layer_index)
  return num_routing, num_heads - num_routing, hparams.hidden_size // num_heads


def projections(x, hparams, layer_index):
  """q (scaled by d^-0.5), k, v: [b, n, hidden] -> 3 x [b, heads, n, d]."""
  num_routing, num_local, depth = head_counts(hparams, layer_index)
  num_heads = num_routing + num_local
  q = heads.split_heads(dense(x, hparams.hidden_size, "q"), num_heads) * depth ** -0.5
  k = heads.split_heads(dense(x, hparams.hidden_size, "k"), num_heads)
  v = heads.split_heads(dense(x, hparams.hidden_size, "v"), num_heads)
  return q, k, v


def routing_variables(hparams, layer_index):
  """The routing heads' k-means (centroids) and relative tables, in scope `routing`."""
  num_routing, _, depth = head_counts(hparams, layer_index)
  with tf1.variable_scope("routing"):
    km = kmeans.OnlineKMeans(num_routing, hparams.sparsity_cluster_size, depth,
                             decay=hparams.decay, beta=hparams.beta, ema=hparams.ema,
                             legacy_counts=hparams.get("legacy_kmeans_counts", False),
                             name="cluster_attention")
    rel_k, rel_v = relative_tables(hparams, depth, hparams.sparsity_cluster_relative)
  return km, rel_k, rel_v


def routing_options(hparams, layer_index):
  """Keyword arguments of the routing attention functions for the extensions beyond the paper
  (all off in the paper's sets): `routing_exclude_self` and `routing_logit_scale` ("none": the
  paper's unscaled logits; "rsqrt_depth": d^-0.5; "learned": a per-head scale, initialised at
  d^-0.5, variable `routing/logit_scale` [routing heads] holding its log)."""
  num_routing, _, depth = head_counts(hparams, layer_index)
  mode = hparams.get("routing_logit_scale", "none")
  scale = None
  if mode == "rsqrt_depth":
    scale = depth ** -0.5
  elif mode == "learned":
    with tf1.variable_scope("routing"):
      log_scale = tf1.get_variable(
          "logit_scale", [num_routing],
          initializer=tf1.constant_initializer(-0.5 * math.log(depth)))
    scale = tf.exp(log_scale)
  return {"exclude_self": bool(hparams.get("routing_exclude_self", False)),
          "logit_scale": scale}


def local_variables(hparams, layer_index):
  """The local heads' relative tables, in scope `local`."""
  with tf1.variable_scope("local"):
    return relative_tables(hparams, head_counts(hparams, layer_index)[2],
                           hparams.local_relative)


def attention_output(out, hparams):
  """Heads [b, h, n, d] -> [b, n, hidden]: shared head_dense, output_transform (no dropout
  here: `attention_dropout` drops the attention weights inside the heads, as the original)."""
  if hparams.head_dense:  # one [d, d] map shared by all heads, as in the released model
    out = dense(out, out.shape[-1], "head_dense")
  return dense(heads.combine_heads(out), hparams.hidden_size, "output_transform")


def local_span(hparams, length):
  """(block, flange) of the non-routing heads over `length` positions: the hparams'
  query_shape / memory_flange, or with `full_attention` one block of the whole length and no
  flange (dense causal attention: every earlier token, with the same relative positions)."""
  if hparams.get("full_attention", False):
    return length, 0
  return hparams.query_shape[0], hparams.memory_flange[0]


def head_config(hparams, length=None):
  """The heads.HeadConfig of a model's hparams (`length`: the static sequence length, needed
  with full_attention; default max_target_length or max_length)."""
  block, flange = local_span(hparams, length or hparams.max_target_length or hparams.max_length)
  return heads.HeadConfig(
      window=hparams.sparsity_cluster_attention_window, block_length=block,
      flange=flange, share_qk=hparams.share_qk,
      routing_mode=hparams.routing_mode, random_routing=hparams.random_routing,
      legacy_causal_key_routing=hparams.legacy_causal_key_routing,
      routing_padding_as_original=bool(hparams.get("routing_padding_as_original", False)))


def attention_dropout_rate(hparams, train):
  """The attention dropout on the weights: hparam `attention_dropout` in TRAIN mode, else 0."""
  return float(hparams.get("attention_dropout", 0.0) or 0.0) if train else 0.0


def self_attention(x, hparams, layer_index, padding, causal=True, train=False,
                   read_centroids=None):
  """Multi-head self-attention mixing local and routing heads.

  Args:
    x: [b, n, hidden].
    hparams: model hparams.
    layer_index: index of the layer (sparsity_skip_first turns routing heads local).
    padding: bool [b, n], True at padding positions, or None.
    causal: decoder (True) or encoder (False) self-attention.
    train: TRAIN mode (random routing draws fresh members; centroids are updated; attention
      dropout on the weights).
    read_centroids: optional km -> [h, c, d] centroid values to route with (default: read
      km.means); recompute_layers replays the forward's read in the backward pass.
  Returns:
    (y [b, n, hidden], k-means loss (scalar, 0 without routing heads), kmeans.KMeansStep or
    None).
  """
  num_routing, num_local, _ = head_counts(hparams, layer_index)
  q, k, v = projections(x, hparams, layer_index)
  loss, step = 0.0, None
  means, routing_tables, local_tables, options = None, (None, None), (None, None), {}
  if num_routing:
    km, rel_k, rel_v = routing_variables(hparams, layer_index)
    means = km.means if read_centroids is None else read_centroids(km)
    routing_tables = (rel_k, rel_v)
    options = routing_options(hparams, layer_index)
  if num_local:
    local_tables = local_variables(hparams, layer_index)
  out, aux = heads.mixed_heads(q, k, v, num_routing, head_config(hparams, x.shape[1]), causal,
                               padding, means, routing_tables, local_tables, options,
                               attention_dropout_rate(hparams, train))
  if num_routing:
    x_hats, clusters = kmeans.routed_vectors(aux, hparams.share_qk)
    loss = km.loss(aux["commitment_loss"], x_hats, clusters, aux["weights"])
    if train:
      statistics = routing.routing_statistics(aux["member_count"], aux["self_weight"],
                                              aux["weights"])
      step = kmeans.KMeansStep(km, x_hats, clusters, aux["weights"], statistics)
  return attention_output(out, hparams), loss, step


def local_ring_size(hparams, length):
  """Slots of the local heads' ring cache: the block and its flange (at most the length)."""
  block, flange = local_span(hparams, length)
  return min(length, flange + block)


def self_attention_cache(hparams, layer_index, batch, length, dtype=tf.float32):
  """Zero caches of one decoder layer for `self_attention_step` (static shapes).

  Returns:
    dict: local heads: "local_k", "local_v" [b, local heads, R, d] ring buffers of the last
    R = flange + block positions and "local_pos" int32 [b, R] (-1 = empty; rows equal); routing heads, "topk":
    "routing_k" (normalised keys), "routing_v" [b, routing heads, N, d] and "routing_scores"
    [b, routing heads, c, N]; "causal_window": "routing_window", the per-cluster caches of
    `attention.incremental.causal_window_cache`.
  """
  num_routing, num_local, depth = head_counts(hparams, layer_index)
  cache = {}
  if num_local:
    ring = local_ring_size(hparams, length)
    cache["local_k"] = tf.zeros([batch, num_local, ring, depth], dtype)
    cache["local_v"] = tf.zeros([batch, num_local, ring, depth], dtype)
    cache["local_pos"] = -tf.ones([batch, ring], tf.int32)  # rows equal; batch-major for beams
  if num_routing and hparams.routing_mode == "causal_window":
    cache["routing_window"] = incremental.causal_window_cache(
        batch, num_routing, hparams.sparsity_cluster_size,
        hparams.sparsity_cluster_attention_window, depth, dtype)
  elif num_routing:
    cache["routing_k"] = tf.zeros([batch, num_routing, length, depth], dtype)
    cache["routing_v"] = tf.zeros([batch, num_routing, length, depth], dtype)
    cache["routing_scores"] = tf.zeros(
        [batch, num_routing, hparams.sparsity_cluster_size, length], dtype)
  return cache


def self_attention_step(x, hparams, layer_index, cache, position):
  """Causal self-attention of the new position only, reading and updating the layer's caches.

  Local heads attend to their ring of recent keys; routing heads route over the cached prefix
  with the decode-time rule ("topk") or over their cluster's last `window` members
  ("causal_window", exact and independent of the prefix length).

  Args:
    x: [b, 1, hidden] input of the new position.
    cache: dict from `self_attention_cache` (or a previous step).
    position: int32 scalar t.
  Returns:
    (y [b, 1, hidden], updated cache).
  """
  if hparams.random_routing:
    raise ValueError("Cached decoding of random_routing models is not supported (members are "
                     "random draws); decode with fast_decode=False.")
  num_routing, num_local, _ = head_counts(hparams, layer_index)
  q, k, v = projections(x, hparams, layer_index)
  cache, outputs = dict(cache), []
  if num_routing:
    km, rel_k, rel_v = routing_variables(hparams, layer_index)
    options = routing_options(hparams, layer_index)
    q_hat = attention.layer_norm_no_scale(q[:, :num_routing])
    k_hat = q_hat if hparams.share_qk else attention.layer_norm_no_scale(k[:, :num_routing])
    mu = tf.cast(km.means, q_hat.dtype)
    if hparams.routing_mode == "causal_window":
      out, cache["routing_window"] = incremental.causal_window_step(
          q_hat, k_hat, v[:, :num_routing], mu, cache["routing_window"], rel_k, rel_v,
          **options)
      outputs.append(out)
    else:
      scores = routing.centroid_scores(q_hat, mu)  # [b, h, c, 1]
      cache["routing_k"] = incremental.write_cache(cache["routing_k"], k_hat, position)
      cache["routing_v"] = incremental.write_cache(cache["routing_v"], v[:, :num_routing],
                                                   position)
      cache["routing_scores"] = incremental.write_cache(cache["routing_scores"], scores,
                                                        position, axis=3)
      outputs.append(incremental.routing_attention_step(
          q_hat, cache["routing_k"], cache["routing_v"], cache["routing_scores"], position,
          hparams.sparsity_cluster_attention_window, relative_keys=rel_k,
          relative_values=rel_v, **options))
  if num_local:
    rel_k, rel_v = local_variables(hparams, layer_index)
    ring = cache["local_pos"].shape[1]
    block, flange = local_span(hparams, ring)  # full_attention: the ring is the whole length
    slot = position % ring
    cache["local_k"] = incremental.write_cache(cache["local_k"], k[:, num_routing:], slot)
    cache["local_v"] = incremental.write_cache(cache["local_v"], v[:, num_routing:], slot)
    cache["local_pos"] = incremental.write_cache(
        cache["local_pos"], tf.fill([tf.shape(x)[0], 1], position), slot, axis=1)
    outputs.append(incremental.local_ring_step(
        q[:, num_routing:], cache["local_k"], cache["local_v"], cache["local_pos"][0], position,
        block, flange, relative_keys=rel_k, relative_values=rel_v, scale=1.0))
  out = tf.concat(outputs, axis=1) if len(outputs) > 1 else outputs[0]
  return attention_output(out, hparams), cache


def encdec_memory(memory, hparams):
  """Keys and values of the encoder output for encdec_attention: 2 x [b, heads, m, d]."""
  num_heads = hparams.local_num_heads + hparams.sparsity_cluster_num_heads
  k = heads.split_heads(dense(memory, hparams.hidden_size, "k"), num_heads)
  v = heads.split_heads(dense(memory, hparams.hidden_size, "v"), num_heads)
  return k, v


def encdec_attention(x, memory, hparams, memory_padding, position=None, train=False):
  """Decoder-to-encoder attention (all heads local over the memory when lengths match).

  Args:
    x: [b, n, hidden] decoder activations ([b, 1, hidden] when decoding step by step).
    memory: [b, m, hidden] encoder output, or its (keys, values) from `encdec_memory` (computed
      once before step-by-step decoding).
    memory_padding: bool [b, m] or None.
    position: None for whole sequences; the decoder position t (int32 scalar) of a single
      decoding step, whose query then attends to the memory window of block t // query_shape.
    train: TRAIN mode (attention dropout on the weights).
  Returns:
    [b, n, hidden].
  """
  num_heads = hparams.local_num_heads + hparams.sparsity_cluster_num_heads
  depth = hparams.hidden_size // num_heads
  q = heads.split_heads(dense(x, hparams.hidden_size, "q"), num_heads) * depth ** -0.5
  k, v = memory if isinstance(memory, tuple) else encdec_memory(memory, hparams)
  target_length = hparams.max_target_length or hparams.max_length
  block = hparams.memory_query_shape[0]
  local = target_length == k.shape[2] and target_length % block == 0
  if local and position is not None:
    out = incremental.local_attention_step(q, k, v, position, block, hparams.memory_flange[0],
                                           causal=False, padding=memory_padding, scale=1.0)
  elif local:
    out = attention.local_attention(q, k, v, block, hparams.memory_flange[0], causal=False,
                                    padding=memory_padding, scale=1.0,
                                    dropout_rate=attention_dropout_rate(hparams, train))
  else:
    out = attention.full_attention(q, k, v, causal=False, padding=memory_padding, scale=1.0,
                                   dropout_rate=attention_dropout_rate(hparams, train))
  return dense(heads.combine_heads(out), hparams.hidden_size, "output_transform")


def ffn(x, hparams, train=False):
  """Feed-forward block: GEGLU (gelu(x W1) * (x W2)) W3 without biases, or dense-relu-dense."""
  if hparams.ffn_layer == "geglu":
    h = common_layers.gelu(dense(x, hparams.filter_size, "weight1")) * dense(
        x, hparams.filter_size, "weight2")
    if train and hparams.relu_dropout:
      h = tf.nn.dropout(h, rate=hparams.relu_dropout)
    return dense(h, hparams.hidden_size, "weight3")
  if hparams.ffn_layer == "dense_relu_dense":  # T2T's names; variable-scoped (decode reuses them)
    h = tf.nn.relu(dense(x, hparams.filter_size, "conv1", use_bias=True))
    if train and hparams.relu_dropout:
      h = tf.nn.dropout(h, rate=hparams.relu_dropout)
    return dense(h, hparams.hidden_size, "conv2", use_bias=True)
  raise ValueError("ffn_layer=%r is not supported; use 'geglu' or 'dense_relu_dense'."
                   % hparams.ffn_layer)
