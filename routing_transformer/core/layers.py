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
from routing_transformer.core import rebuild

tf1 = tf.compat.v1


def dense(x, units, name, use_bias=False):
  """Dense over the last axis, x [..., inputs] -> [..., units], as tf.compat.v1.layers.dense:
  variables `name/kernel` and `name/bias` (`kernel_variables`), ops in name scope `name`,
  computed by `apply_kernel` (the same tensordot; the input's gradient a `matmul_nt`)."""
  with tf1.variable_scope(name):
    kernel, bias = kernel_variables(x.shape[-1], units, x.dtype.base_dtype, use_bias)
    y = apply_kernel(x, tf.convert_to_tensor(kernel))
    return y if bias is None else tf.nn.bias_add(y, bias)


def dense_initializer():
  """The kernel initializer `dense` gets in the current variable scope: the scope's, else the
  Keras base layer's default (glorot_uniform, tf.compat.v1.layers.dense's), not
  tf.compat.v1.get_variable's own glorot_uniform (other random ops, other initial values)."""
  initializer = tf1.get_variable_scope().initializer
  return initializer if initializer is not None else tf.keras.initializers.get("glorot_uniform")


def kernel_variables(inputs, units, dtype=tf.float32, use_bias=False):
  """(kernel [inputs, units], bias [units] or None) in the current variable scope, as
  tf.compat.v1.layers.dense creates them: `kernel` (`dense_initializer`), `bias` (zeros)."""
  kernel = tf1.get_variable("kernel", [inputs, units], dtype=dtype,
                            initializer=dense_initializer())
  bias = None
  if use_bias:
    bias = tf1.get_variable("bias", [units], dtype=dtype, initializer=tf1.zeros_initializer())
  return kernel, bias


def dense_kernel(name, inputs, units, dtype=tf.float32):
  """The kernel [inputs, units] of `dense(x, units, name)`, for computing with parts of it:
  variable `name/kernel` (`kernel_variables`)."""
  with tf1.variable_scope(name):
    return kernel_variables(inputs, units, dtype)[0]


def dense_variables(name, inputs, units, dtype=tf.float32):
  """(kernel [inputs, units], bias [units]) of `dense(x, units, name, use_bias=True)`: the
  variables `name/kernel` and `name/bias` (`kernel_variables`)."""
  with tf1.variable_scope(name):
    return kernel_variables(inputs, units, dtype, use_bias=True)


def matmul_nt(a, b):
  """a [m, k] times b [n, k] transposed -> [m, n], as a batch matmul of one with b adjoint.
  On the CPU (TF 2.15's oneDNN ops) MatMul(transpose_b=True), what TF's MatMul gradient gives
  the input of y = x W, ran at 0.72-0.81 of the plain rate for n = 512 (bench-8k's hidden
  size), the batch matmul at the plain rate; at n = 1,024 and in bfloat16 both ran alike
  (`make bench-matmul`)."""
  n, k = b.shape
  product = tf.linalg.matmul(tf.reshape(a, [1, -1, k]), tf.reshape(b, [1, n, k]), adjoint_b=True)
  return tf.reshape(product, [-1, n])


def kernel_product(x, kernel):
  """x [..., inputs] times kernel [inputs, units] -> [..., units], one tensordot as
  tf.compat.v1.layers.dense computes it, with TF's gradient (for callers whose own custom
  gradient replaces it)."""
  out = tf.tensordot(x, kernel, [[x.shape.rank - 1], [0]])
  out.set_shape(x.shape[:-1].concatenate(kernel.shape[-1:]))
  return out


def apply_kernel(x, kernel):
  """`kernel_product(x, kernel)` whose gradient is TF's MatMul gradient with x's part as
  `matmul_nt` (dy [rows, units] times the kernel transposed); the kernel's is x^T dy, with x
  rebuilt there when it is `rebuild.rebuildable` (then not kept)."""
  inputs, units = kernel.shape

  @tf.custom_gradient
  def product(x, kernel):
    out = kernel_product(x, kernel)

    def grad(dy):
      rows = tf.reshape(dy, [-1, units])
      shape = x.shape if x.shape.is_fully_defined() else tf.shape(x)
      dx = tf.reshape(matmul_nt(rows, kernel), shape)
      x_kept = tf.reshape(rebuild.for_gradient(x, dy), [-1, inputs])
      return dx, tf.matmul(x_kept, rows, transpose_a=True)

    return out, grad

  return product(x, kernel)


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
  """A projection kernel [hidden, s0 + s1] split by head kind: (first s0 columns, last s1), None
  for a kind of size 0 (and for the first with skip_first). tf.split / tf.slice of the small
  kernel (gradients: a concat / a pad), so the activations are never sliced."""
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
  """q (scaled by d^-0.5), k, v of one layer per head kind: [b, n, hidden] -> (routing, local),
  each (q, k, v) of [b, heads of the kind, n, d], or None for a kind without heads.

  One [hidden, hidden] kernel per projection (variables `q/kernel`, `k/kernel`, `v/kernel`, as
  `dense` creates them) whose first columns belong to the routing heads; each kind is projected
  with its own columns, so no [b, h, n, d] activation is sliced (or its gradient padded) per
  kind. With share_qk the routing heads' keys are their normalised queries: their key columns
  are not multiplied and the routing k is None (the kernel keeps its shape for checkpoints).
  """
  num_routing, num_local, depth = head_counts(hparams, layer_index)
  sizes = (num_routing * depth, num_local * depth)
  kinds = ([], [])
  for name in ("q", "k", "v"):
    kernel = dense_kernel(name, x.shape[-1], hparams.hidden_size, x.dtype.base_dtype)
    skip = name == "k" and hparams.share_qk  # routing heads' keys are their queries
    for kind, columns in enumerate(kind_columns(kernel, sizes, skip)):
      y = None
      if columns is not None:
        y = heads.split_heads(apply_kernel(x, columns), sizes[kind] // depth)
        y = attention.common.times_constant(y, depth ** -0.5) if name == "q" else y
      kinds[kind].append(y)
  return tuple(tuple(t) if size else None for t, size in zip(kinds, sizes))


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
  here: `attention_dropout` drops the attention weights inside the heads, as the original).
  head_dense's output is rebuilt from the heads (which its kernel gradient keeps) for
  output_transform's kernel gradient (`rebuild`), not kept."""
  if not hparams.head_dense:
    return dense(heads.combine_heads(out), hparams.hidden_size, "output_transform")
  # one [d, d] map shared by all heads, as released
  kernel = tf.convert_to_tensor(dense_kernel("head_dense", out.shape[-1], out.shape[-1],
                                             out.dtype.base_dtype))
  mixed = rebuild.rebuildable(heads.combine_heads(apply_kernel(out, kernel)),
                              lambda o, k: heads.combine_heads(kernel_product(o, k)), out, kernel)
  return dense(mixed, hparams.hidden_size, "output_transform")


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
      routing_padding_as_original=bool(hparams.get("routing_padding_as_original", False)),
      recompute_attention=bool(hparams.get("recompute_attention", False)))


def attention_dropout_rate(hparams, train):
  """The attention dropout on the weights: hparam `attention_dropout` in TRAIN mode, else 0."""
  return float(hparams.get("attention_dropout", 0.0) or 0.0) if train else 0.0


def self_attention(x, hparams, layer_index, padding=None, causal=True, train=False,
                   read_centroids=None, cache=None, position=None, heads_only=False, qkv=None):
  """Multi-head self-attention mixing local and routing heads, over whole sequences or (with
  `cache`) one cached causal decoding step.

  Args:
    x: [b, n, hidden]; with `cache`, [b, 1, hidden] the input of position `position`.
    hparams: model hparams.
    layer_index: index of the layer (sparsity_skip_first turns routing heads local).
    padding: bool [b, n], True at padding positions, or None.
    causal: decoder (True) or encoder (False) self-attention.
    train: TRAIN mode (random routing draws fresh members; centroids are updated; attention
      dropout on the weights).
    read_centroids: optional km -> [h, c, d] centroid values to route with (default: read
      km.means); recompute_layers replays the forward's read in the backward pass.
    cache: None for whole sequences; when decoding, the layer's caches from
      `self_attention_cache`, updated in place (as T2T's multihead_attention updates its cache).
    position: int32 scalar t of the decoding step (with `cache`).
    heads_only: return the heads' output [b, h, n, d] before `attention_output` (head_dense,
      output_transform), which the caller applies in the same variable scope.
    qkv: optional `projections(x, ...)` computed by the caller (x is then not read).
  Returns:
    (y [b, n, hidden], k-means loss (scalar, 0 without routing heads or with `cache`),
    kmeans.KMeansStep or None).
  """
  num_routing, num_local, _ = head_counts(hparams, layer_index)
  routing_qkv, local_qkv = qkv or projections(x, hparams, layer_index)
  length = next(t for t in (routing_qkv or local_qkv) if t is not None).shape[2]
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
  with heads.in_layer(layer_index):
    out, aux = heads.kind_heads(routing_qkv, local_qkv, config, causal, padding, means,
                                routing_tables, local_tables, options,
                                attention_dropout_rate(hparams, train), cache, position)
  if aux is not None:
    x_hats, clusters = kmeans.routed_vectors(aux, hparams.share_qk)
    loss = km.loss(aux["commitment_loss"], x_hats, clusters, aux["weights"])
    if train:
      statistics = routing.routing_statistics(aux["member_count"], aux["self_weight"],
                                              aux["weights"])
      step = kmeans.KMeansStep(km, x_hats, clusters, aux["weights"], statistics)
  return (out if heads_only else attention_output(out, hparams)), loss, step


def self_attention_cache(hparams, layer_index, batch, length, dtype=tf.float32):
  """Zero caches of one decoder layer for `self_attention` (static shapes; `length`: the
  decoder's N, max_target_length or max_length).

  Returns:
    dict (see heads.local_heads_attention, heads.routing_heads_attention): local heads,
    "local_k", "local_v" [b, local heads, R, d] ring buffers of the last R = flange + block
    positions (at most N) and "local_pos" int32 [b, R] (-1 = empty; rows equal); routing heads,
    "topk": "routing_k", "routing_v" [b, routing heads, N, d] and "routing_scores"
    [b, routing heads, c, N]; "causal_window": "routing_window", the per-cluster caches of
    `attention.incremental.causal_window_cache`.
  """
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


def gelu(x):
  """GELU's tanh approximation (Hendrycks & Gimpel 2016), op for op as Tensor2Tensor's
  `common_layers.gelu`, which the original release's GEGLU used: the same values, bit for bit."""
  cdf = 0.5 * (1.0 + tf.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * tf.pow(x, 3))))
  return x * cdf


def geglu_hidden(a, b):
  """gelu(a) * b (`gelu`: the tanh approximation)."""
  return gelu(a) * b


@tf.custom_gradient
def geglu_activation(a, b):
  """gelu(a) * b, [..., f]; the backward pass keeps only a and b and recomputes gelu (the
  gradients are those of `geglu_hidden`: the same ops differentiated)."""
  def grad(dh):
    a2, b2 = rebuild.after(dh, a, b)
    return tf.gradients(geglu_hidden(a2, b2), [a2, b2], dh)

  return geglu_hidden(a, b), grad


@tf.custom_gradient
def geglu_output(a, b, kernel):
  """(gelu(a) * b) kernel: [..., f] x 2, [f, hidden] -> [..., hidden]. The backward pass keeps
  only a and b (and the kernel), recomputing gelu(a) * b, where the plain ops keep gelu's input,
  its tanh and cdf, its output, b and the product; the gradients are those of the plain ops."""
  def grad(dy):
    a2, b2, kernel2 = rebuild.after(dy, a, b, kernel)
    return tf.gradients(apply_kernel(geglu_hidden(a2, b2), kernel2), [a2, b2, kernel2], dy)

  return kernel_product(geglu_hidden(a, b), kernel), grad


FFN_BACKWARD_ROWS = 1024  # positions per chunk of the GEGLU block's backward pass
FFN_MAX_CHUNKS = 16  # at most this many chunks where a, b are kept: then rows / 16 per chunk


def ffn_chunk_rows(rows, keep_products=True):
  """Positions per chunk of the GEGLU block's chunked passes over `rows` positions:
  FFN_BACKWARD_ROWS, or with `keep_products` rows / FFN_MAX_CHUNKS (rounded up) where that is
  more. Each chunk is ~100 graph ops per pass, and a chunk count growing with the length made
  the graph build grow with it (25-28 s at 65,536 tokens, 10 s with 16 chunks, where the
  step's peak fell 0.9 GiB too); a re-run block's FFN (`keep_products` False), whose chunks
  compute x W1 and x W2 anew, keeps its chunks of FFN_BACKWARD_ROWS (with 16 chunks its peak at
  65,536 tokens rose by 0.55 GiB)."""
  if not keep_products:
    return FFN_BACKWARD_ROWS
  return max(FFN_BACKWARD_ROWS, -(-rows // FFN_MAX_CHUNKS))


def row_chunks(rows, size):
  """[(start, size)] covering range(rows) in consecutive chunks of `size` (the last shorter)."""
  return [(start, min(size, rows - start)) for start in range(0, rows, size)]


def geglu_ffn(x, w1, w2, w3, chunk_rows=None, chunk_forward=False, keep_products=True,
              rebuild_linear=False):
  """The GEGLU block (gelu(x W1) * (x W2)) W3: x [..., hidden] (leading dims static), kernels
  [hidden, f], [hidden, f], [f, hidden] -> [..., hidden].

  The backward pass keeps x (or rebuilds it, `rebuild.for_gradient`), a = x W1 and b = x W2 (what
  the plain ops' matmul gradients read anyway) and runs over `chunk_rows` positions at a time, one
  chunk after the other: each chunk recomputes gelu(a) * b of its rows, differentiates those ops,
  and takes its share of the gradients of x and of the three kernels. The [positions, f]
  temporaries of the backward pass (gelu's intermediates, the product, their gradients) then exist
  for one chunk of rows at a time instead of for all positions (chunk_rows: default
  `ffn_chunk_rows`: FFN_BACKWARD_ROWS, up to 16 chunks where a and b are kept). The output is the
  plain ops'; the gradients are theirs up to the order of the sums over rows (a kernel's gradient
  adds the chunks' products). With `chunk_forward` (training) the forward pass also computes
  gelu(a) * b and its product with W3 one chunk of rows after the other, so gelu's [positions, f]
  temporaries are not alive for all positions at once there either; the output then equals the
  plain ops' up to the matmul's rounding of row blocks. With `keep_products` False the backward
  pass keeps only x and each chunk computes its rows of a and b anew: for a re-run whose output is
  not needed (`recompute_layers`' replay, where x W1 and x W2 would be computed only for this
  backward pass), the same matmuls, and no [positions, f] tensor at all. With `rebuild_linear`
  (and `keep_products`) the backward pass keeps a but not b: each chunk computes its rows of
  b = x W2 anew (one more [rows, hidden] x [hidden, f] matmul per chunk), and with
  `chunk_forward` the forward pass computes b one chunk of rows at a time too (the same matmul on
  the same rows, so the backward pass's b is the forward's, bit for bit)."""
  rows = x.shape[:-1].num_elements()
  chunk_rows = chunk_rows or ffn_chunk_rows(rows, keep_products)
  keep_b = keep_products and not rebuild_linear
  rows_of_b = chunk_forward and keep_products and rebuild_linear  # b only per forward chunk

  @tf.custom_gradient
  def block(x, w1, w2, w3):
    with tf.name_scope("weight1"):  # the block's gradient is `grad`: TF's products suffice
      a = kernel_product(x, w1)
    b = None
    if not rows_of_b:
      with tf.name_scope("weight2"):
        b = kernel_product(x, w2)

    def grad(dy):
      kept = ((rebuild.for_gradient(x, dy), dy) + ((a,) if keep_products else ()) +
              ((b,) if keep_b else ()))
      flat = [tf.reshape(t, [rows, t.shape[-1]]) for t in kept]
      dxs, sums, after = [], None, [dy]
      for start, size in row_chunks(rows, chunk_rows):
        with tf.control_dependencies(after):  # one chunk after the other
          x_c, dy_c, *products = [tf.slice(t, [start, 0], [size, -1]) for t in flat]
        a_c = products[0] if products else tf.matmul(x_c, w1)
        b_c = products[1] if len(products) > 1 else tf.matmul(x_c, w2)
        da, db, dw3 = tf.gradients(tf.matmul(geglu_hidden(a_c, b_c), w3), [a_c, b_c, w3], dy_c)
        dxs.append(matmul_nt(da, w1) + matmul_nt(db, w2))
        parts = [tf.matmul(x_c, da, transpose_a=True), tf.matmul(x_c, db, transpose_a=True), dw3]
        sums = parts if sums is None else [s + p for s, p in zip(sums, parts)]
        after = [dxs[-1]] + sums
      dx = tf.reshape(tf.concat(dxs, axis=0) if len(dxs) > 1 else dxs[0], x.shape)
      return [dx] + sums

    if not chunk_forward:
      return kernel_product(geglu_hidden(a, b), w3), grad
    # with rows_of_b each chunk computes b from its rows of x, as the backward pass does
    flat = [tf.reshape(t, [rows, t.shape[-1]]) for t in (a, x if rows_of_b else b)]
    ys = []
    for start, size in row_chunks(rows, chunk_rows):
      with tf.control_dependencies(ys[-1:]):  # one chunk after the other
        a_c, rows_c = [tf.slice(t, [start, 0], [size, -1]) for t in flat]
      b_c = tf.matmul(rows_c, w2) if rows_of_b else rows_c
      ys.append(tf.matmul(geglu_hidden(a_c, b_c), w3))
    y = tf.concat(ys, axis=0) if len(ys) > 1 else ys[0]
    return tf.reshape(y, x.shape[:-1].as_list() + [w3.shape[-1]]), grad

  return block(x, w1, w2, w3)


def ffn(x, hparams, train=False, keep_products=True):
  """Feed-forward block: GEGLU (gelu(x W1) * (x W2)) W3 without biases, or dense-relu-dense.

  GEGLU (variables `weight1/kernel`, `weight2/kernel`, `weight3/kernel`, as `dense` creates
  them) keeps only x, x W1 and x W2 for its backward pass (only x without `keep_products`),
  which runs `ffn_chunk_rows` positions at a time, as does the training forward past the two
  matmuls (`geglu_ffn`); with the hparam `ffn_rebuild_linear` it keeps x W1 but not x W2, which
  each chunk computes anew. With relu_dropout in training, or leading dims not static,
  `geglu_activation` / `geglu_output` on the whole tensors."""
  if hparams.ffn_layer == "geglu":
    dtype, hidden, filters = x.dtype.base_dtype, x.shape[-1], hparams.filter_size
    w1, w2 = [tf.convert_to_tensor(dense_kernel(name, hidden, filters, dtype))
              for name in ("weight1", "weight2")]
    w3 = tf.convert_to_tensor(dense_kernel("weight3", filters, hparams.hidden_size, dtype))
    dropout = train and hparams.relu_dropout
    if x.shape[:-1].is_fully_defined() and not dropout:
      return geglu_ffn(x, w1, w2, w3, chunk_forward=train, keep_products=keep_products,
                       rebuild_linear=bool(hparams.get("ffn_rebuild_linear", False)))
    with tf.name_scope("weight1"):
      a = apply_kernel(x, w1)
    with tf.name_scope("weight2"):
      b = apply_kernel(x, w2)
    if dropout:
      h = tf.nn.dropout(geglu_activation(a, b), rate=hparams.relu_dropout)
      return apply_kernel(h, w3)
    return geglu_output(a, b, w3)
  if hparams.ffn_layer == "dense_relu_dense":  # T2T's names; variable-scoped (decode reuses them)
    h = tf.nn.relu(dense(x, hparams.filter_size, "conv1", use_bias=True))
    if train and hparams.relu_dropout:
      h = tf.nn.dropout(h, rate=hparams.relu_dropout)
    return dense(h, hparams.hidden_size, "conv2", use_bias=True)
  raise ValueError("ffn_layer=%r is not supported; use 'geglu' or 'dense_relu_dense'."
                   % hparams.ffn_layer)
