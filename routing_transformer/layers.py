"""Layers of the Routing Transformer (tf.compat.v1 graph mode, T2T variable scoping).

Shapes: x [b, n, hidden]; heads are [b, h, n, d_head] with d_head = hidden / heads.
"""
import tensorflow as tf

from routing_transformer import attention
from routing_transformer import kmeans
from tensor2tensor.layers import common_layers

tf1 = tf.compat.v1


def dense(x, units, name, use_bias=False):
  """Dense over the last axis (tf.compat.v1 variables `name/kernel`, `name/bias`)."""
  return tf1.layers.dense(x, units, use_bias=use_bias, name=name)


def split_heads(x, heads):
  """[b, n, h * d] -> [b, h, n, d]."""
  shape = common_layers.shape_list(x)
  x = tf.reshape(x, shape[:2] + [heads, shape[2] // heads])
  return tf.transpose(x, [0, 2, 1, 3])


def combine_heads(x):
  """[b, h, n, d] -> [b, n, h * d]."""
  shape = common_layers.shape_list(x)
  x = tf.transpose(x, [0, 2, 1, 3])
  return tf.reshape(x, [shape[0], shape[2], shape[1] * shape[3]])


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


class KMeansStep(object):
  """What a routing layer hands to the model for the (shard-combined) centroid update."""

  def __init__(self, km, x_hats, clusters, weights):
    self.km, self.x_hats, self.clusters, self.weights = km, x_hats, clusters, weights

  def statistics(self):
    """(counts [h, c], sums [h, c, d]) of this shard."""
    return kmeans.combined_statistics(self.x_hats, self.clusters, self.km.num_clusters,
                                      self.weights)


def self_attention(x, hparams, layer_index, padding, causal=True, train=False):
  """Multi-head self-attention mixing local and routing heads.

  Args:
    x: [b, n, hidden].
    hparams: model hparams.
    layer_index: index of the layer (sparsity_skip_first turns routing heads local).
    padding: bool [b, n], True at padding positions, or None.
    causal: decoder (True) or encoder (False) self-attention.
    train: TRAIN mode (random routing draws fresh members; centroids are updated).
  Returns:
    (y [b, n, hidden], commitment loss (scalar, 0 without routing heads), KMeansStep or None).
  """
  num_heads = hparams.local_num_heads + hparams.sparsity_cluster_num_heads
  num_routing = routing_heads(hparams, layer_index)
  num_local = num_heads - num_routing
  depth = hparams.hidden_size // num_heads
  q = split_heads(dense(x, hparams.hidden_size, "q"), num_heads) * depth ** -0.5
  k = split_heads(dense(x, hparams.hidden_size, "k"), num_heads)
  v = split_heads(dense(x, hparams.hidden_size, "v"), num_heads)
  outputs, loss, step = [], 0.0, None
  if num_routing:
    with tf1.variable_scope("routing"):
      km = kmeans.OnlineKMeans(num_routing, hparams.sparsity_cluster_size, depth,
                               decay=hparams.decay, beta=hparams.beta, ema=hparams.ema,
                               name="cluster_attention")
      rel_k, rel_v = relative_tables(hparams, depth, hparams.sparsity_cluster_relative)
    q_r, k_r, v_r = q[:, :num_routing], k[:, :num_routing], v[:, :num_routing]
    if hparams.share_qk:
      k_r = q_r
    out, aux = attention.routing_attention(
        q_r, k_r, v_r, km.means, hparams.sparsity_cluster_attention_window, causal=causal,
        share_qk=hparams.share_qk, padding=padding, relative_keys=rel_k, relative_values=rel_v,
        random_routing=hparams.random_routing)
    x_hats = [aux["q_hat"]] + ([] if hparams.share_qk else [aux["k_hat"]])
    clusters = [aux["query_clusters"]] + ([] if hparams.share_qk else [aux["key_clusters"]])
    loss = km.loss(aux["commitment_loss"], x_hats, clusters, aux["weights"])
    step = KMeansStep(km, x_hats, clusters, aux["weights"]) if train else None
    outputs.append(out)
  if num_local:
    with tf1.variable_scope("local"):
      rel_k, rel_v = relative_tables(hparams, depth, hparams.local_relative)
    outputs.append(attention.local_attention(
        q[:, num_routing:], k[:, num_routing:], v[:, num_routing:], hparams.query_shape[0],
        hparams.memory_flange[0], causal=causal, relative_keys=rel_k, relative_values=rel_v,
        padding=None if causal else padding, scale=1.0))
  out = tf.concat(outputs, axis=1) if len(outputs) > 1 else outputs[0]
  out = tf.nn.dropout(out, rate=hparams.attention_dropout) if train and \
      hparams.attention_dropout else out
  if hparams.head_dense:  # one [d, d] map shared by all heads, as in the released model
    out = dense(out, depth, "head_dense")
  return dense(combine_heads(out), hparams.hidden_size, "output_transform"), loss, step


def encdec_attention(x, memory, hparams, memory_padding):
  """Decoder-to-encoder attention (all heads local over the memory when lengths match).

  Args:
    x: [b, n, hidden] decoder activations.
    memory: [b, m, hidden] encoder output.
    memory_padding: bool [b, m] or None.
  Returns:
    [b, n, hidden].
  """
  num_heads = hparams.local_num_heads + hparams.sparsity_cluster_num_heads
  depth = hparams.hidden_size // num_heads
  q = split_heads(dense(x, hparams.hidden_size, "q"), num_heads) * depth ** -0.5
  k = split_heads(dense(memory, hparams.hidden_size, "k"), num_heads)
  v = split_heads(dense(memory, hparams.hidden_size, "v"), num_heads)
  if q.shape[2] == k.shape[2]:
    block = hparams.memory_query_shape[0]
    out = attention.local_attention(q, k, v, block, hparams.memory_flange[0], causal=False,
                                    padding=memory_padding, scale=1.0)
  else:
    out = attention.full_attention(q, k, v, causal=False, padding=memory_padding, scale=1.0)
  return dense(combine_heads(out), hparams.hidden_size, "output_transform")


def ffn(x, hparams, train=False):
  """Feed-forward block: GEGLU (gelu(x W1) * (x W2)) W3 without biases, or dense-relu-dense."""
  if hparams.ffn_layer == "geglu":
    h = common_layers.gelu(dense(x, hparams.filter_size, "weight1")) * dense(
        x, hparams.filter_size, "weight2")
    if train and hparams.relu_dropout:
      h = tf.nn.dropout(h, rate=hparams.relu_dropout)
    return dense(h, hparams.hidden_size, "weight3")
  if hparams.ffn_layer == "dense_relu_dense":
    return common_layers.dense_relu_dense(
        x, hparams.filter_size, hparams.hidden_size,
        dropout=hparams.relu_dropout if train else 0.0)
  raise ValueError("ffn_layer=%r is not supported; use 'geglu' or 'dense_relu_dense'."
                   % hparams.ffn_layer)
