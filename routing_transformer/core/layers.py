"""Layers of the Routing Transformer in plain TF ops (tf.compat.v1 graph mode, T2T variable
scopes): projections, heads, output projection, FFN, enc-dec attention. x [b, n, hidden]; heads
[b, h, n, d], d = hidden / heads."""
import math

import tensorflow as tf

from routing_transformer.core import attention
from routing_transformer.core import heads
from routing_transformer.core.attention import incremental
from routing_transformer.core.attention import routing
from routing_transformer.core import kmeans
from routing_transformer.core import memory

tf1 = tf.compat.v1


def dense(x, units, name, use_bias=False):
  """tf.compat.v1.layers.dense: x [..., inputs] -> [..., units], variables `name/kernel`, `bias`."""
  with tf1.variable_scope(name):
    kernel, bias = kernel_variables(x.shape[-1], units, x.dtype.base_dtype, use_bias)
    y = matmul(x, kernel)
    return y if bias is None else tf.nn.bias_add(y, bias)


def matmul(x, kernel):
  """x [..., inputs] times kernel [inputs, units] -> [..., units], the tensordot of a dense layer."""
  out = tf.tensordot(x, kernel, [[x.shape.rank - 1], [0]])
  out.set_shape(x.shape[:-1].concatenate(kernel.shape[-1:]))
  return out


def dense_initializer():
  """The scope's initializer, else tf.compat.v1.layers.dense's (Keras' glorot_uniform)."""
  initializer = tf1.get_variable_scope().initializer
  return initializer if initializer is not None else tf.keras.initializers.get("glorot_uniform")


def kernel_variables(inputs, units, dtype=tf.float32, use_bias=False):
  """(kernel [inputs, units], bias [units] or None) as tf.compat.v1.layers.dense makes them."""
  kernel = tf1.get_variable("kernel", [inputs, units], dtype=dtype,
                            initializer=dense_initializer())
  bias = None
  if use_bias:
    bias = tf1.get_variable("bias", [units], dtype=dtype, initializer=tf1.zeros_initializer())
  return kernel, bias


def dense_kernel(name, inputs, units, dtype=tf.float32):
  """The kernel `name/kernel` [inputs, units] of `dense(x, units, name)`."""
  with tf1.variable_scope(name):
    return kernel_variables(inputs, units, dtype)[0]


def dense_variables(name, inputs, units, dtype=tf.float32):
  """(kernel, bias) of `dense(x, units, name, use_bias=True)`."""
  with tf1.variable_scope(name):
    return kernel_variables(inputs, units, dtype, use_bias=True)


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


def kind_columns(kernel, sizes, skip_first=False):
  """A kernel [hidden, s0 + s1] split by head kind: (first s0 columns, last s1), None for a kind
  of size 0 (and for the first with skip_first)."""
  first, second = sizes
  kernel = tf.convert_to_tensor(kernel)
  if skip_first or not first:
    if not second:
      return None, None
    return None, kernel if not first else tf.slice(kernel, [0, first], [-1, second])
  if not second:
    return kernel, None
  return tuple(tf.split(kernel, [first, second], axis=1))


def projections(x, hparams, layer_index):
  """x [b, n, hidden] -> (routing, local), each (q * d^-0.5, k, v) [b, heads of the kind, n, d]
  or None; routing heads' columns first; with share_qk the routing k is None."""
  num_routing, num_local, depth = head_counts(hparams, layer_index)
  sizes = (num_routing * depth, num_local * depth)
  kinds = ([], [])
  for name in ("q", "k", "v"):
    kernel = dense_kernel(name, x.shape[-1], hparams.hidden_size, x.dtype.base_dtype)
    skip = name == "k" and hparams.share_qk  # routing heads' keys are their queries
    for kind, columns in enumerate(kind_columns(kernel, sizes, skip)):
      y = None
      if columns is not None:
        y = matmul(x, columns)
        y = heads.split_heads(y, sizes[kind] // depth)
        y = y * depth ** -0.5 if name == "q" else y
      kinds[kind].append(y)
  return tuple(tuple(t) if size else None for t, size in zip(kinds, sizes))


def routing_variables(hparams, layer_index):
  """The routing heads' k-means (centroids) and relative tables, in scope `routing`."""
  num_routing, _, depth = head_counts(hparams, layer_index)
  with tf1.variable_scope("routing"):
    km = kmeans.OnlineKMeans(num_routing, hparams.sparsity_cluster_size, depth,
                             decay=hparams.decay, beta=hparams.beta, ema=hparams.ema,
                             legacy_counts=hparams.legacy_kmeans_counts,
                             name="cluster_attention")
    rel_k, rel_v = relative_tables(hparams, depth, hparams.sparsity_cluster_relative)
  return km, rel_k, rel_v


def routing_options(hparams, layer_index):
  """The routing extensions (off in the paper's sets): routing_exclude_self, routing_logit_scale
  ("none"; "rsqrt_depth": d^-0.5; "learned": per head, its log the variable routing/logit_scale)."""
  num_routing, _, depth = head_counts(hparams, layer_index)
  mode = hparams.routing_logit_scale
  scale = None
  if mode == "rsqrt_depth":
    scale = depth ** -0.5
  elif mode == "learned":
    with tf1.variable_scope("routing"):
      log_scale = tf1.get_variable(
          "logit_scale", [num_routing],
          initializer=tf1.constant_initializer(-0.5 * math.log(depth)))
    scale = tf.exp(log_scale)
  return {"exclude_self": bool(hparams.routing_exclude_self),
          "logit_scale": scale}


def local_variables(hparams, layer_index):
  """The local heads' relative tables, in scope `local`."""
  with tf1.variable_scope("local"):
    return relative_tables(hparams, head_counts(hparams, layer_index)[2],
                           hparams.local_relative)


def attention_output(out, hparams):
  """Heads [b, h, n, d] -> [b, n, hidden]: head_dense ([d, d], shared by all heads, as released)."""
  if hparams.head_dense:
    out = dense(out, out.shape[-1], "head_dense")
  return dense(heads.combine_heads(out), hparams.hidden_size, "output_transform")


def local_span(hparams, length):
  """(block, flange) of the local heads: query_shape, memory_flange; full_attention: (length, 0)."""
  if hparams.full_attention:
    return length, 0
  return hparams.query_shape[0], hparams.memory_flange[0]


def head_config(hparams, length=None):
  """heads.HeadConfig of the hparams (`length`: default max_target_length or max_length)."""
  block, flange = local_span(hparams, length or hparams.max_target_length or hparams.max_length)
  return heads.HeadConfig(
      window=hparams.sparsity_cluster_attention_window, block_length=block,
      flange=flange, share_qk=hparams.share_qk,
      routing_mode=hparams.routing_mode, random_routing=hparams.random_routing,
      legacy_causal_key_routing=hparams.legacy_causal_key_routing,
      routing_padding_as_original=bool(hparams.routing_padding_as_original))


def attention_dropout_rate(hparams, train):
  """The attention dropout on the weights: hparam `attention_dropout` in TRAIN mode, else 0."""
  return float(hparams.attention_dropout) if train else 0.0


def self_attention(x, hparams, layer_index, padding=None, causal=True, train=False,
                   read_centroids=None, cache=None, position=None):
  """Self-attention of routing and local heads, over whole sequences or one cached decoding step.

  Args:
    x: [b, n, hidden]; with `cache`, [b, 1, hidden] at `position`.
    hparams, layer_index: model hparams and the layer (sparsity_skip_first: no routing heads).
    padding: optional bool [b, n], True at padding; causal: decoder self-attention.
    train: TRAIN mode (random members, centroid statistics, dropout, `recompute_attention`).
    read_centroids: optional km -> [h, c, d] centroids to route with (default km.means).
    cache, position: one decoding step's caches (`self_attention_cache`, updated in place) and
      int32 scalar position.
  Returns:
    (y [b, n, hidden], k-means loss (0 without routing heads or with cache), KMeansStep or None).
  """
  num_routing, num_local, _ = head_counts(hparams, layer_index)
  routing_qkv, local_qkv = projections(x, hparams, layer_index)
  length = x.shape[1]
  loss, step = 0.0, None
  means, routing_tables, local_tables, options = None, (None, None), (None, None), {}
  if num_routing:
    km, rel_k, rel_v = routing_variables(hparams, layer_index)
    means = km.means if read_centroids is None else read_centroids(km)
    routing_tables = (rel_k, rel_v)
    options = routing_options(hparams, layer_index)
  if num_local:
    local_tables = local_variables(hparams, layer_index)
  config = head_config(hparams, length if cache is None else None)  # decoding: N positions
  dropout = attention_dropout_rate(hparams, train)

  def attend(routing_qkv, local_qkv, routing_tables, local_tables, options):
    with heads.in_layer(layer_index):
      return heads.kind_heads(routing_qkv, local_qkv, config, causal, padding, means,
                              routing_tables, local_tables, options, dropout, cache, position)

  if train and cache is None and hparams.recompute_attention:
    memory.refuse_random({"attention_dropout": dropout, "random_routing": hparams.random_routing},
                         "recompute_attention")
    out, aux = (None, None) if routing_qkv is None else memory.recompute_heads(
        lambda qkv, tables, kw: attend(qkv, None, tables, (None, None), kw), routing_qkv,
        routing_tables, options)
    if local_qkv is not None:
      local = local_head_groups(local_qkv, local_tables, config, causal, padding, layer_index)
      out = local if out is None else tf.concat([out, local], axis=1)
  else:
    out, aux = attend(routing_qkv, local_qkv, routing_tables, local_tables, options)
  if aux is not None:
    x_hats, clusters = kmeans.routed_vectors(aux, hparams.share_qk)
    loss = km.loss(aux["commitment_loss"], x_hats, clusters, aux["weights"])
    if train:
      statistics = routing.routing_statistics(aux["member_count"], aux["self_weight"],
                                              aux["weights"])
      step = kmeans.KMeansStep(km, x_hats, clusters, aux["weights"], statistics)
  return attention_output(out, hparams), loss, step


def local_head_groups(qkv, tables, config, causal, padding, layer_index, group=2):
  """`recompute_attention`'s local heads [b, hl, n, d], `group` at a time (`memory.chunked`): the
  backward pass holds one group's attention weights. tables: (relative keys, values) or Nones."""
  present = [tf.convert_to_tensor(t) for t in tables if t is not None]

  def attend(q, k, v, *read):
    read = iter(read)
    with heads.in_layer(layer_index):
      return heads.local_heads_attention(q, k, v, config, causal, padding,
                                         tuple(None if t is None else next(read) for t in tables))

  return memory.chunked(attend, list(qkv), present, group)


def self_attention_cache(hparams, layer_index, batch, length, dtype=tf.float32):
  """Zero caches (a dict, static shapes) of one decoder layer for `self_attention` over N =
  `length` positions, as the `heads` functions read them (local rings of flange + block slots)."""
  num_routing, num_local, depth = head_counts(hparams, layer_index)
  cache = {}
  if num_local:
    ring = min(length, sum(local_span(hparams, length)))
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


def encdec_memory(memory, hparams):
  """Keys and values of the encoder output for encdec_attention: 2 x [b, heads, m, d]."""
  num_heads = hparams.local_num_heads + hparams.sparsity_cluster_num_heads
  k = heads.split_heads(dense(memory, hparams.hidden_size, "k"), num_heads)
  v = heads.split_heads(dense(memory, hparams.hidden_size, "v"), num_heads)
  return k, v


def encdec_attention(x, memory, hparams, memory_padding, position=None, train=False):
  """Decoder-to-encoder attention [b, n, hidden] -> [b, n, hidden], local when the lengths match,
  else full; memory: [b, m, hidden] or its `encdec_memory`; memory_padding: bool [b, m] or None;
  position: the int32 step of one decoding step; train: attention dropout."""
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


def gelu(x):
  """GELU's tanh approximation (Hendrycks & Gimpel 2016), op for op as Tensor2Tensor's
  `common_layers.gelu`, which the original release's GEGLU used: the same values, bit for bit."""
  cdf = 0.5 * (1.0 + tf.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * tf.pow(x, 3))))
  return x * cdf


def geglu_hidden(a, b, dtype=None):
  """gelu(a) * b; with dtype in float32 for bfloat16 activations, cast to dtype."""
  if dtype is None:
    return gelu(a) * b
  wide = kmeans.compute_dtype(dtype)
  return tf.cast(gelu(tf.cast(a, wide)) * tf.cast(b, wide), dtype)


def ffn(x, hparams, train=False):
  """FFN: GEGLU (gelu(x W1) * (x W2)) W3 without biases (`weight1..3`) or T2T's dense-relu-dense
  (`conv1`, `conv2`); relu_dropout on the hidden units in training.

  GEGLU's activation and output projection are one `memory.recompute_tensors` block: the
  backward pass keeps x W1 and x W2 and computes gelu(x W1) * (x W2) again, instead of keeping
  the five [b, n, filter] tensors of TF's own gradients of the activation (the same values; with
  relu_dropout the block ends before the dropout, which draws random numbers). With
  `ffn_chunk_size` in training the whole FFN is recomputed `ffn_chunk_size` positions at a time
  (`chunked_ffn`)."""
  if hparams.ffn_layer not in ("geglu", "dense_relu_dense"):
    raise ValueError("ffn_layer=%r is not supported; use 'geglu' or 'dense_relu_dense'."
                     % hparams.ffn_layer)
  if train and hparams.ffn_chunk_size:
    return chunked_ffn(x, hparams, hparams.ffn_chunk_size)
  if hparams.ffn_layer == "geglu":
    a, b = dense(x, hparams.filter_size, "weight1"), dense(x, hparams.filter_size, "weight2")
    hidden = lambda a, b: geglu_hidden(a, b, a.dtype)
    if not (train and hparams.relu_dropout):
      kernel = tf.convert_to_tensor(
          dense_kernel("weight3", hparams.filter_size, hparams.hidden_size, a.dtype))
      return memory.recompute_tensors(lambda a, b, w: matmul(hidden(a, b), w), a, b, kernel)
    h = tf.nn.dropout(memory.recompute_tensors(hidden, a, b), rate=hparams.relu_dropout)
    return dense(h, hparams.hidden_size, "weight3")
  h = tf.nn.relu(dense(x, hparams.filter_size, "conv1", use_bias=True))
  if train and hparams.relu_dropout:
    h = tf.nn.dropout(h, rate=hparams.relu_dropout)
  return dense(h, hparams.hidden_size, "conv2", use_bias=True)


def chunked_ffn(x, hparams, chunk):
  """`ffn` in training `chunk` positions at a time (`memory.chunked`), the same
  variables and values; x [b, n, hidden], n static. No relu_dropout (a re-run draws anew)."""
  memory.refuse_random({"relu_dropout": hparams.relu_dropout}, "ffn_chunk_size")
  dtype, filters, hidden = x.dtype.base_dtype, hparams.filter_size, hparams.hidden_size
  if hparams.ffn_layer == "geglu":
    weights = [dense_kernel(name, *shape, dtype) for name, shape in (
        ("weight1", (x.shape[-1], filters)), ("weight2", (x.shape[-1], filters)),
        ("weight3", (filters, hidden)))]
    fn = lambda x, w1, w2, w3: matmul(geglu_hidden(matmul(x, w1), matmul(x, w2), dtype), w3)
  else:
    weights = (list(dense_variables("conv1", x.shape[-1], filters, dtype)) +
               list(dense_variables("conv2", filters, hidden, dtype)))
    fn = lambda x, k1, b1, k2, b2: tf.nn.bias_add(
        matmul(tf.nn.relu(tf.nn.bias_add(matmul(x, k1), b1)), k2), b2)
  return memory.chunked(fn, [x], [tf.convert_to_tensor(w) for w in weights], chunk)
