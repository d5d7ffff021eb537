"""Keras layers (TensorFlow backend, Keras 2.15 and 3): `RoutingSelfAttention`,
`RoutingTransformerBlock`, a small `RoutingTransformerLM`, on the T2T model's functions (same
weights: `layers.self_attention`'s output); no Tensor2Tensor. Centroids: float32 non-trainable
weights, one EMA step per training call from the global batch's statistics.
"""
import math
import os

import tensorflow as tf

from routing_transformer.core import heads
from routing_transformer.core import kmeans
from routing_transformer.core import layers
from routing_transformer.core import memory

ROUTING_MODES = ("topk", "causal_window")
LOGIT_SCALES = ("none", "rsqrt_depth", "learned")  # as the hparam routing_logit_scale


def _backend_message(backend):
  return ("routing_transformer.core.keras needs Keras's TensorFlow backend, but Keras runs on %r: "
          "set KERAS_BACKEND=tensorflow before keras is imported." % (backend,))


class BackendError(RuntimeError):
  """Keras does not run on the TensorFlow backend (one line naming the fix)."""


try:
  import keras  # pylint: disable=g-import-not-at-top
except ImportError as e:  # Keras 3 with KERAS_BACKEND=jax/torch and that framework missing
  requested = os.environ.get("KERAS_BACKEND", "tensorflow")
  if requested != "tensorflow":
    raise BackendError(_backend_message(requested)) from None
  raise

KERAS3 = int(keras.__version__.split(".")[0]) >= 3


def require_tensorflow_backend():
  """Raises BackendError unless Keras computes with TensorFlow (Keras 2 always does)."""
  backend = keras.backend.backend()
  if backend != "tensorflow":
    raise BackendError(_backend_message(backend))


require_tensorflow_backend()
register = keras.utils.register_keras_serializable(package="routing_transformer")


def add_weight(layer, name, shape, initializer, trainable=True, float32=False):
  """layer.add_weight for Keras 2 and 3; `float32`: never autocast, the first replica's value."""
  kwargs = dict(name=name, shape=shape, initializer=initializer, trainable=trainable)
  if float32:
    kwargs["dtype"] = "float32"
    if KERAS3:
      kwargs.update(autocast=False, aggregation="only_first_replica")
    else:
      kwargs.update(experimental_autocast=False,
                    aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
  return layer.add_weight(**kwargs)


def global_batch_statistics(counts, sums):
  """(counts, sums) summed over a tf.distribute strategy's replicas: the global batch's."""
  context = tf.distribute.get_replica_context()
  if context is not None and context.num_replicas_in_sync > 1:
    counts, sums = context.all_reduce(tf.distribute.ReduceOp.SUM, [counts, sums])
  return counts, sums


def timing_signal(length, channels, min_timescale=1.0, max_timescale=1.0e4):
  """Sinusoid position signal [1, length, channels] (T2T's `add_timing_signal_1d` formula)."""
  position = tf.cast(tf.range(length), tf.float32)
  num_timescales = channels // 2
  log_increment = math.log(max_timescale / min_timescale) / max(num_timescales - 1, 1)
  inv_timescales = min_timescale * tf.exp(
      tf.cast(tf.range(num_timescales), tf.float32) * -log_increment)
  scaled = position[:, tf.newaxis] * inv_timescales[tf.newaxis, :]
  signal = tf.concat([tf.sin(scaled), tf.cos(scaled)], axis=1)
  signal = tf.pad(signal, [[0, 0], [0, channels % 2]])
  return signal[tf.newaxis]


def check_config(hidden_size, local_heads, routing_heads, num_clusters, window, block_length,
                 flange, routing_mode):
  """Raises ValueError (one line naming the fix) for a configuration the layer cannot run."""
  total = local_heads + routing_heads
  if total <= 0 or hidden_size % total:
    raise ValueError("RoutingSelfAttention: hidden_size=%d is not divisible by local_heads + "
                     "routing_heads = %d; change one of them." % (hidden_size, total))
  if routing_heads and (num_clusters <= 0 or window <= 0):
    raise ValueError("RoutingSelfAttention: routing_heads=%d needs num_clusters > 0 and window > "
                     "0 (got %d, %d)." % (routing_heads, num_clusters, window))
  if local_heads and (block_length <= 0 or flange < 0 or flange % block_length):
    raise ValueError("RoutingSelfAttention: flange=%d must be a non-negative multiple of "
                     "block_length=%d." % (flange, block_length))
  if routing_mode not in ROUTING_MODES:
    raise ValueError("RoutingSelfAttention: routing_mode=%r is not supported; use 'topk' or "
                     "'causal_window'." % (routing_mode,))


ATTENTION_ARGS = ("hidden_size", "local_heads", "routing_heads", "num_clusters", "window",
                  "block_length", "flange", "causal", "share_qk", "routing_mode",
                  "max_relative_position", "local_relative", "routing_relative", "head_dense",
                  "attention_dropout", "decay", "beta", "epsilon", "exclude_self", "logit_scale")


@register
class RoutingSelfAttention(keras.layers.Layer):
  """Self-attention of routing heads (first) and local heads (Roy et al., 2021), weights named as
  `layers.self_attention`'s; centroids `means` [routing_heads, c, d], `ema_count`, `ema_means`.
  call(x [b, n, hidden], padding=None (bool [b, n]), mask=None, training=None) -> [b, n, hidden];
  training: one EMA step, attention dropout; the k-means loss goes to `add_loss`."""

  def __init__(self, hidden_size, local_heads=2, routing_heads=2, num_clusters=8, window=64,
               block_length=64, flange=64, causal=True, share_qk=True, routing_mode="topk",
               max_relative_position=0, local_relative=True, routing_relative=True,
               head_dense=True, attention_dropout=0.0, decay=kmeans.DECAY, beta=kmeans.BETA,
               epsilon=kmeans.EPSILON, exclude_self=False, logit_scale="none", **kwargs):
    require_tensorflow_backend()
    super().__init__(**kwargs)
    check_config(hidden_size, local_heads, routing_heads, num_clusters, window, block_length,
                 flange, routing_mode)
    if logit_scale not in LOGIT_SCALES:
      raise ValueError("RoutingSelfAttention: logit_scale=%r is not supported; use one of %s."
                       % (logit_scale, ", ".join(LOGIT_SCALES)))
    self.hidden_size, self.local_heads, self.routing_heads = hidden_size, local_heads, routing_heads
    self.num_clusters, self.window = num_clusters, window
    self.block_length, self.flange = block_length, flange
    self.causal, self.share_qk, self.routing_mode = causal, share_qk, routing_mode
    self.max_relative_position = max_relative_position
    self.local_relative, self.routing_relative = local_relative, routing_relative
    self.head_dense, self.attention_dropout = head_dense, attention_dropout
    self.decay, self.beta, self.epsilon = decay, beta, epsilon
    self.exclude_self, self.logit_scale = exclude_self, logit_scale
    self.depth = hidden_size // (local_heads + routing_heads)
    self.supports_masking = True

  def get_config(self):
    config = super().get_config()
    config.update({k: getattr(self, k) for k in ATTENTION_ARGS})
    return config

  def _kernel(self, name, shape):
    return add_weight(self, name, shape, keras.initializers.GlorotUniform())

  def _relative(self, prefix):
    rows = 2 * self.max_relative_position + 1
    init = keras.initializers.RandomNormal(stddev=self.depth ** -0.5)
    return (add_weight(self, prefix + "_relative_positions_keys", [rows, self.depth], init),
            add_weight(self, prefix + "_relative_positions_values", [rows, self.depth], init))

  def build(self, input_shape):
    hidden = self.hidden_size
    if input_shape[-1] != hidden:
      raise ValueError("RoutingSelfAttention: input depth %s differs from hidden_size=%d; project "
                       "the inputs to hidden_size first." % (input_shape[-1], hidden))
    self.q_kernel = self._kernel("q", [hidden, hidden])
    self.k_kernel = self._kernel("k", [hidden, hidden])
    self.v_kernel = self._kernel("v", [hidden, hidden])
    self.head_dense_kernel = self._kernel("head_dense", [self.depth, self.depth]) \
        if self.head_dense else None
    self.output_kernel = self._kernel("output_transform", [hidden, hidden])
    self.routing_tables = self.local_tables = (None, None)
    if self.routing_heads:
      shape = [self.routing_heads, self.num_clusters, self.depth]
      # one draw for both: ema_means starts equal to the means, as in OnlineKMeans
      with tf.init_scope():  # eager also when the layer is built inside fit's tf.function
        init = kmeans.initial_means(*shape).numpy()
      initial = lambda shape, dtype=None: tf.constant(init, tf.float32)
      self.means = add_weight(self, "means", shape, initial, trainable=False, float32=True)
      self.ema_count = add_weight(self, "ema_count", shape[:2], "zeros", trainable=False,
                                  float32=True)
      self.ema_means = add_weight(self, "ema_means", shape, initial, trainable=False,
                                  float32=True)
      if self.routing_relative and self.max_relative_position:
        self.routing_tables = self._relative("routing")
      if self.logit_scale == "learned":  # its log, as layers.routing_options
        self.log_logit_scale = add_weight(
            self, "routing_logit_scale", [self.routing_heads],
            keras.initializers.Constant(-0.5 * math.log(self.depth)), float32=True)
    if self.local_heads and self.local_relative and self.max_relative_position:
      self.local_tables = self._relative("local")
    self.built = True

  def compute_output_shape(self, input_shape):
    return input_shape

  def compute_mask(self, inputs, mask=None):  # pylint: disable=unused-argument
    return mask

  def projections(self, x):
    """q (scaled by d^-0.5), k, v: [b, n, hidden] -> 3 x [b, heads, n, d]."""
    num_heads = self.local_heads + self.routing_heads
    q = heads.split_heads(tf.matmul(x, self.q_kernel), num_heads) * self.depth ** -0.5
    k = heads.split_heads(tf.matmul(x, self.k_kernel), num_heads)
    v = heads.split_heads(tf.matmul(x, self.v_kernel), num_heads)
    return q, k, v

  def head_config(self):
    """The heads.HeadConfig of this layer."""
    return heads.HeadConfig(window=self.window, block_length=self.block_length,
                            flange=self.flange, share_qk=self.share_qk,
                            routing_mode=self.routing_mode, random_routing=False,
                            legacy_causal_key_routing=False)

  def routing_options(self):
    """The extensions beyond the paper (hparams routing_exclude_self, routing_logit_scale)."""
    scale = {"none": None, "rsqrt_depth": self.depth ** -0.5}.get(self.logit_scale)
    if self.logit_scale == "learned":
      scale = tf.exp(tf.convert_to_tensor(self.log_logit_scale))
    return {"exclude_self": self.exclude_self, "logit_scale": scale}

  def update_centroids(self, aux):
    """One EMA step of the centroids from this routing aux, with the global batch's statistics."""
    x_hats, clusters = kmeans.routed_vectors(aux, self.share_qk)
    counts, sums = kmeans.combined_statistics(x_hats, clusters, self.num_clusters,
                                              aux["weights"])
    counts, sums = global_batch_statistics(counts, sums)
    kmeans.assign_ema_update(self.means, self.ema_count, self.ema_means, counts, sums,
                             self.decay, self.epsilon)

  @tf.autograph.experimental.do_not_convert  # plain Python over static shapes: trace it as is
  def call(self, x, padding=None, mask=None, training=None):
    training = bool(training)
    if mask is not None:
      masked = tf.logical_not(tf.cast(mask, tf.bool))
      padding = masked if padding is None else tf.logical_or(tf.cast(padding, tf.bool), masked)
    q, k, v = self.projections(x)
    r = self.routing_heads
    means = tf.convert_to_tensor(self.means) if r else None
    out, aux = heads.mixed_heads(q, k, v, r, self.head_config(), self.causal, padding, means,
                                 self.routing_tables, self.local_tables, self.routing_options(),
                                 self.attention_dropout if training else 0.0)
    if r:
      self.add_loss(tf.cast(kmeans.clustering_loss(aux["commitment_loss"], self.beta),
                            tf.float32))
      if training:
        self.update_centroids(aux)
    if self.head_dense_kernel is not None:
      out = tf.matmul(out, self.head_dense_kernel)
    return tf.matmul(heads.combine_heads(out), self.output_kernel)


BLOCK_ARGS = ("hidden_size", "filter_size", "local_heads", "routing_heads", "num_clusters",
              "window", "block_length", "flange", "causal", "routing_mode",
              "max_relative_position", "dropout")


@register
class RoutingTransformerBlock(keras.layers.Layer):
  """Post-norm layer: x = LN(x + attention(x)); x = LN(x + (gelu(x W1) * (x W2)) W3), no biases;
  call as `RoutingSelfAttention`'s; in training, dropout on both residual branches."""

  def __init__(self, hidden_size, filter_size=256, local_heads=2, routing_heads=2,
               num_clusters=8, window=64, block_length=64, flange=64, causal=True,
               routing_mode="topk", max_relative_position=0, dropout=0.0, **kwargs):
    require_tensorflow_backend()
    super().__init__(**kwargs)
    self.hidden_size, self.filter_size = hidden_size, filter_size
    self.local_heads, self.routing_heads = local_heads, routing_heads
    self.num_clusters, self.window = num_clusters, window
    self.block_length, self.flange, self.causal = block_length, flange, causal
    self.routing_mode, self.max_relative_position = routing_mode, max_relative_position
    self.dropout = dropout
    self.supports_masking = True
    self.attention = RoutingSelfAttention(
        hidden_size, local_heads=local_heads, routing_heads=routing_heads,
        num_clusters=num_clusters, window=window, block_length=block_length, flange=flange,
        causal=causal, routing_mode=routing_mode, max_relative_position=max_relative_position,
        name="attention")
    self.norm1 = keras.layers.LayerNormalization(epsilon=1e-6, name="norm1")
    self.weight1 = keras.layers.Dense(filter_size, use_bias=False, name="weight1")
    self.weight2 = keras.layers.Dense(filter_size, use_bias=False, name="weight2")
    self.weight3 = keras.layers.Dense(hidden_size, use_bias=False, name="weight3")
    self.norm2 = keras.layers.LayerNormalization(epsilon=1e-6, name="norm2")

  def get_config(self):
    config = super().get_config()
    config.update({k: getattr(self, k) for k in BLOCK_ARGS})
    return config

  def build(self, input_shape):
    shape = tuple(input_shape)
    self.attention.build(shape)
    self.norm1.build(shape)
    self.weight1.build(shape)
    self.weight2.build(shape)
    self.weight3.build(shape[:-1] + (self.filter_size,))
    self.norm2.build(shape)
    self.built = True

  def compute_output_shape(self, input_shape):
    return input_shape

  def compute_mask(self, inputs, mask=None):  # pylint: disable=unused-argument
    return mask

  @tf.autograph.experimental.do_not_convert  # plain Python over static shapes: trace it as is
  def call(self, x, padding=None, mask=None, training=None):
    rate = self.dropout if training else 0.0
    y = self.attention(x, padding=padding, mask=mask, training=training)
    x = self.norm1(x + (tf.nn.dropout(y, rate) if rate else y))
    # the activation recomputed in the backward pass (keeps x W1, x W2 and the product)
    y = self.weight3(memory.recompute_tensors(layers.geglu_hidden, self.weight1(x),
                                              self.weight2(x)))
    return self.norm2(x + (tf.nn.dropout(y, rate) if rate else y))


LM_ARGS = ("vocab_size", "length", "hidden_size", "filter_size", "num_layers", "local_heads",
           "routing_heads", "skip_first", "num_clusters", "window", "block_length", "flange",
           "routing_mode", "max_relative_position", "add_timing_signal", "dropout")


@register
class RoutingTransformerLM(keras.Model):
  """Decoder-only LM: ids [b, n] (0 = padding, shifted right inside) -> float32 logits [b, n,
  vocab]; routing heads from layer `skip_first` on; the k-means losses in `model.losses`."""

  def __init__(self, vocab_size, length, hidden_size=128, filter_size=256, num_layers=2,
               local_heads=2, routing_heads=2, skip_first=1, num_clusters=8, window=64,
               block_length=64, flange=64, routing_mode="topk", max_relative_position=0,
               add_timing_signal=True, dropout=0.0, **kwargs):
    require_tensorflow_backend()
    super().__init__(**kwargs)
    self.vocab_size, self.length = vocab_size, length
    self.hidden_size, self.filter_size, self.num_layers = hidden_size, filter_size, num_layers
    self.local_heads, self.routing_heads, self.skip_first = local_heads, routing_heads, skip_first
    self.num_clusters, self.window = num_clusters, window
    self.block_length, self.flange, self.routing_mode = block_length, flange, routing_mode
    self.max_relative_position = max_relative_position
    self.add_timing_signal, self.dropout = add_timing_signal, dropout
    self.embedding = keras.layers.Embedding(
        vocab_size, hidden_size, embeddings_initializer=keras.initializers.RandomNormal(0, 1),
        name="embedding")
    self.emb_dense = keras.layers.Dense(hidden_size, name="emb_dense")
    self.blocks = []
    for i in range(num_layers):
      routing = routing_heads if i >= skip_first else 0
      self.blocks.append(RoutingTransformerBlock(
          hidden_size, filter_size=filter_size, local_heads=local_heads + routing_heads - routing,
          routing_heads=routing, num_clusters=num_clusters, window=window,
          block_length=block_length, flange=flange, routing_mode=routing_mode,
          max_relative_position=max_relative_position, dropout=dropout, name="layer_%d" % i))
    self.logits_dense = keras.layers.Dense(vocab_size, name="logits")

  def get_config(self):
    config = {"name": self.name}
    config.update({k: getattr(self, k) for k in LM_ARGS})
    return config

  @classmethod
  def from_config(cls, config):
    return cls(**config)

  def build(self, input_shape):
    batch = tuple(input_shape)[0]
    hidden = (batch, self.length, self.hidden_size)
    self.embedding.build((batch, self.length))
    self.emb_dense.build(hidden)
    for block in self.blocks:
      block.build(hidden)
    self.logits_dense.build(hidden)
    self.built = True

  def attention_layers(self):
    """The RoutingSelfAttention layers, bottom to top."""
    return [block.attention for block in self.blocks]

  @tf.autograph.experimental.do_not_convert
  def call(self, ids, training=None):
    ids = tf.cast(ids, tf.int32)
    if ids.shape[1] != self.length:
      raise ValueError("RoutingTransformerLM: inputs have length %s, the model was built for "
                       "length=%d; pad or cut the ids to it." % (ids.shape[1], self.length))
    padding = tf.equal(ids, 0)
    shifted = tf.pad(ids, [[0, 0], [1, 0]])[:, :-1]
    x = self.emb_dense(self.embedding(shifted))
    if self.add_timing_signal:
      x += tf.cast(timing_signal(x.shape[1], x.shape[2]), x.dtype)
    for block in self.blocks:
      x = block(x, padding=padding, training=training)
    return tf.cast(self.logits_dense(x), tf.float32)
