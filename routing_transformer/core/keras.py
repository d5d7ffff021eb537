"""Keras (TF2, eager) API: `RoutingSelfAttention` and a small `RoutingTransformerLM`.

The layer owns its weights (`add_weight`) and calls the same functions as the T2T model (the head
dispatch `heads.mixed_heads` and the centroid update `kmeans.assign_ema_update`), so both paths
compute the same thing with the same weights
(`tests/test_keras.py` checks it against `layers.self_attention`). Importing this module does not
import Tensor2Tensor.

    from routing_transformer.core import keras as rt_keras
    layer = rt_keras.RoutingSelfAttention(hidden_size=128, local_heads=2, routing_heads=2,
                                          num_clusters=8, window=64, block_length=64, flange=64)
    y = layer(x, training=True)   # x [b, n, 128]; the centroid EMA steps once; layer.losses holds
                                  # the k-means loss (kmeans.clustering_loss)

Shapes: x [b, n, hidden]; heads [b, h, n, d] with d = hidden / (local_heads + routing_heads).
"""
import math

import tensorflow as tf

from routing_transformer.core import heads
from routing_transformer.core import kmeans

ROUTING_MODES = ("topk", "causal_window")
LOGIT_SCALES = ("none", "rsqrt_depth", "learned")  # as the hparam routing_logit_scale


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


@tf.keras.utils.register_keras_serializable(package="routing_transformer")
class RoutingSelfAttention(tf.keras.layers.Layer):
  """Multi-head self-attention mixing local heads and routing heads (Roy et al., 2021).

  Weights (names follow the T2T variable scopes of `layers.self_attention`): q, k, v, [head_dense],
  output_transform kernels; per head type optional Shaw relative tables; routing centroids
  `means` [routing_heads, num_clusters, d] with `ema_count`, `ema_means` (non-trainable).
  Routing heads come first along the head axis, as in the T2T model.

  call(x, padding=None, training=None):
    x: [b, n, hidden] (n static).
    padding: optional bool [b, n], True at padding positions.
    training: when true, one EMA step of the centroids from this batch's assignments (and the
      attention dropout on the attention weights); otherwise the centroids stay as they are.
  Returns [b, n, hidden]; the k-means loss `kmeans.clustering_loss` (2 * beta * commitment_loss)
  is added with `add_loss`.
  """

  def __init__(self, hidden_size, local_heads=2, routing_heads=2, num_clusters=8, window=64,
               block_length=64, flange=64, causal=True, share_qk=True, routing_mode="topk",
               max_relative_position=0, local_relative=True, routing_relative=True,
               head_dense=True, attention_dropout=0.0, decay=kmeans.DECAY, beta=kmeans.BETA,
               epsilon=kmeans.EPSILON, exclude_self=False, logit_scale="none", **kwargs):
    super().__init__(**kwargs)
    check_config(hidden_size, local_heads, routing_heads, num_clusters, window, block_length,
                 flange, routing_mode)
    self.hidden_size, self.local_heads, self.routing_heads = hidden_size, local_heads, routing_heads
    self.num_clusters, self.window = num_clusters, window
    self.block_length, self.flange = block_length, flange
    self.causal, self.share_qk, self.routing_mode = causal, share_qk, routing_mode
    self.max_relative_position = max_relative_position
    self.local_relative, self.routing_relative = local_relative, routing_relative
    self.head_dense, self.attention_dropout = head_dense, attention_dropout
    self.decay, self.beta, self.epsilon = decay, beta, epsilon
    if logit_scale not in LOGIT_SCALES:
      raise ValueError("RoutingSelfAttention: logit_scale=%r is not supported; use one of %s."
                       % (logit_scale, ", ".join(LOGIT_SCALES)))
    self.exclude_self, self.logit_scale = exclude_self, logit_scale
    self.depth = hidden_size // (local_heads + routing_heads)

  def get_config(self):
    config = super().get_config()
    config.update({k: getattr(self, k) for k in (
        "hidden_size", "local_heads", "routing_heads", "num_clusters", "window", "block_length",
        "flange", "causal", "share_qk", "routing_mode", "max_relative_position", "local_relative",
        "routing_relative", "head_dense", "attention_dropout", "decay", "beta", "epsilon",
        "exclude_self", "logit_scale")})
    return config

  def _kernel(self, name, shape):
    return self.add_weight(name=name, shape=shape, trainable=True,
                           initializer=tf.keras.initializers.GlorotUniform())

  def _relative(self, prefix):
    rows = 2 * self.max_relative_position + 1
    init = tf.keras.initializers.RandomNormal(stddev=self.depth ** -0.5)
    return (self.add_weight(name=prefix + "/relative_positions_keys", shape=[rows, self.depth],
                            initializer=init),
            self.add_weight(name=prefix + "/relative_positions_values", shape=[rows, self.depth],
                            initializer=init))

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
      init = kmeans.initial_means(self.routing_heads, self.num_clusters, self.depth).numpy()
      shape = [self.routing_heads, self.num_clusters, self.depth]
      constant = tf.keras.initializers.Constant(init)
      self.means = self.add_weight(name="means", shape=shape, initializer=constant,
                                   trainable=False)
      self.ema_count = self.add_weight(name="ema_count", shape=shape[:2], initializer="zeros",
                                       trainable=False)
      self.ema_means = self.add_weight(name="ema_means", shape=shape, initializer=constant,
                                       trainable=False)
      if self.routing_relative and self.max_relative_position:
        self.routing_tables = self._relative("routing")
      if self.logit_scale == "learned":  # its log, as layers.routing_options
        self.log_logit_scale = self.add_weight(
            name="routing/logit_scale", shape=[self.routing_heads],
            initializer=tf.keras.initializers.Constant(-0.5 * math.log(self.depth)))
    if self.local_heads and self.local_relative and self.max_relative_position:
      self.local_tables = self._relative("local")
    super().build(input_shape)

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
      scale = tf.exp(self.log_logit_scale)
    return {"exclude_self": self.exclude_self, "logit_scale": scale}

  def update_centroids(self, aux):
    """One EMA step of the centroids (`kmeans.assign_ema_update`) from this routing aux."""
    x_hats, clusters = kmeans.routed_vectors(aux, self.share_qk)
    counts, sums = kmeans.combined_statistics(x_hats, clusters, self.num_clusters,
                                              aux["weights"])
    kmeans.assign_ema_update(self.means, self.ema_count, self.ema_means, counts, sums,
                             self.decay, self.epsilon)

  def call(self, x, padding=None, training=None):
    training = bool(training)
    q, k, v = self.projections(x)
    r = self.routing_heads
    out, aux = heads.mixed_heads(q, k, v, r, self.head_config(), self.causal, padding,
                                 self.means if r else None, self.routing_tables,
                                 self.local_tables, self.routing_options(),
                                 self.attention_dropout if training else 0.0)
    if r:
      self.add_loss(kmeans.clustering_loss(aux["commitment_loss"], self.beta))
      if training:
        self.update_centroids(aux)
    if self.head_dense_kernel is not None:
      out = tf.matmul(out, self.head_dense_kernel)
    return tf.matmul(heads.combine_heads(out), self.output_kernel)


@tf.keras.utils.register_keras_serializable(package="routing_transformer")
class RoutingTransformerLM(tf.keras.Model):
  """A small decoder-only Routing Transformer language model.

  Token embedding + dense to hidden_size (+ optional sinusoid timing signal), `num_layers` post-norm
  blocks (x = LN(x + attention(x)); x = LN(x + GEGLU(x))) whose layers from `skip_first` on have
  `routing_heads` routing heads (earlier layers: all heads local), then logits over the vocabulary.
  Inputs are ids [b, n] (0 = padding), n fixed; outputs logits [b, n, vocab] where position i
  predicts token i (inputs are shifted right inside, as in the T2T model). The commitment losses
  of the routing layers are in `model.losses`, so `model.fit` with
  `SparseCategoricalCrossentropy(from_logits=True)` trains the same objective.
  """

  def __init__(self, vocab_size, length, hidden_size=128, filter_size=256, num_layers=2,
               local_heads=2, routing_heads=2, skip_first=1, num_clusters=8, window=64,
               block_length=64, flange=64, routing_mode="topk", max_relative_position=0,
               add_timing_signal=True, dropout=0.0, **kwargs):
    super().__init__(**kwargs)
    self.config = dict(
        vocab_size=vocab_size, length=length, hidden_size=hidden_size, filter_size=filter_size,
        num_layers=num_layers, local_heads=local_heads, routing_heads=routing_heads,
        skip_first=skip_first, num_clusters=num_clusters, window=window,
        block_length=block_length, flange=flange, routing_mode=routing_mode,
        max_relative_position=max_relative_position, add_timing_signal=add_timing_signal,
        dropout=dropout)
    self.embedding = tf.keras.layers.Embedding(
        vocab_size, hidden_size, embeddings_initializer=tf.keras.initializers.RandomNormal(0, 1),
        name="embedding")
    self.emb_dense = tf.keras.layers.Dense(hidden_size, name="emb_dense")
    self.blocks = []
    for i in range(num_layers):
      routing = routing_heads if i >= skip_first else 0
      self.blocks.append({
          "attention": RoutingSelfAttention(
              hidden_size, local_heads=local_heads + routing_heads - routing,
              routing_heads=routing, num_clusters=num_clusters, window=window,
              block_length=block_length, flange=flange, routing_mode=routing_mode,
              max_relative_position=max_relative_position, name="layer_%d_attention" % i),
          "norm1": tf.keras.layers.LayerNormalization(epsilon=1e-6, name="layer_%d_norm1" % i),
          "weight1": tf.keras.layers.Dense(filter_size, use_bias=False, name="layer_%d_w1" % i),
          "weight2": tf.keras.layers.Dense(filter_size, use_bias=False, name="layer_%d_w2" % i),
          "weight3": tf.keras.layers.Dense(hidden_size, use_bias=False, name="layer_%d_w3" % i),
          "norm2": tf.keras.layers.LayerNormalization(epsilon=1e-6, name="layer_%d_norm2" % i),
      })
    self.logits_dense = tf.keras.layers.Dense(vocab_size, name="logits")

  def get_config(self):
    return dict(self.config)

  @classmethod
  def from_config(cls, config):
    return cls(**config)

  def attention_layers(self):
    """The RoutingSelfAttention layers, bottom to top."""
    return [block["attention"] for block in self.blocks]

  def call(self, ids, training=None):
    ids = tf.cast(ids, tf.int32)
    if ids.shape[1] != self.config["length"]:
      raise ValueError("RoutingTransformerLM: inputs have length %s, the model was built for "
                       "length=%d; pad or cut the ids to it." % (ids.shape[1],
                                                                  self.config["length"]))
    padding = tf.equal(ids, 0)
    shifted = tf.pad(ids, [[0, 0], [1, 0]])[:, :-1]
    rate = self.config["dropout"] if training else 0.0
    x = self.emb_dense(self.embedding(shifted))
    if self.config["add_timing_signal"]:
      x += timing_signal(x.shape[1], x.shape[2])
    for block in self.blocks:
      y = block["attention"](x, padding=padding, training=training)
      x = block["norm1"](x + (tf.nn.dropout(y, rate) if rate else y))
      h = tf.nn.gelu(block["weight1"](x), approximate=True) * block["weight2"](x)
      y = block["weight3"](h)
      x = block["norm2"](x + (tf.nn.dropout(y, rate) if rate else y))
    return self.logits_dense(x)
