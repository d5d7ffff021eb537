"""The decoder-only Routing Transformer LM in Mesh-TensorFlow (Roy et al., TACL 2021;
this port's model-parallel variant of the T2T model).

The same architecture as `routing_transformer.t2t.model` (token embedding, dense to hidden_size, per
layer local + routing heads with Shaw relative positions, shared head_dense, output transform,
GEGLU or dense_relu_dense FFN, T2T pre/post-processing, output dense(s), cross-entropy on
non-padding targets plus the k-means losses) written with named dimensions:

  batch, length, d_model (hidden_size), embed (embedding_dims), d_ff (filter_size), vocab,
  d_head, clusters, relative (2 * max_relative_position + 1), and per layer the head dims:
  "heads" in layers whose heads are all local, "local_heads" + "routing_heads" in layers that
  mix both kinds (sizes differ, so a layout can split one and not the other).

A layout (hparams `layout`) may split batch, heads, local_heads, routing_heads, d_ff and vocab
over mesh dimensions (hparams `mesh_shape`); see `check_mtf_hparams`. A head dimension's weights
are slices of the TF model's [hidden, hidden] kernels, so the computation is the same.

Supported: decoder-only LM, routing_mode="topk", share_qk True or False, ema True or False,
relative positions, add_timing_signal, dropouts, target_dropout. Not supported (clear error):
encoder-decoder, routing_mode="causal_window", random_routing, label_smoothing.
"""
import mesh_tensorflow as mtf
import numpy as np
import tensorflow.compat.v1 as tf

from routing_transformer.core import kmeans as tf_kmeans
from routing_transformer.core import layers as tf_layers
from routing_transformer.t2t.mtf import attention
from routing_transformer.t2t.mtf import kmeans

SPLITTABLE = ("batch", "heads", "local_heads", "routing_heads", "d_ff", "vocab")


class MtfHParamsError(ValueError):
  """Hparams or layout the Mesh-TF model cannot run with; the message names the fix."""


def target_length(hparams):
  return hparams.max_target_length or hparams.max_length


def batch_size(hparams):
  """Sequences per step: batch_size with use_fixed_batch_size, else batch_size tokens / length."""
  if hparams.get("use_fixed_batch_size", False):
    return hparams.batch_size
  return max(1, hparams.batch_size // target_length(hparams))


def padded_vocab_size(vocab_size, hparams):
  """Vocab rounded up to hparams.vocab_divisor (the extra logits are masked out)."""
  divisor = hparams.get("vocab_divisor", 1) or 1
  return vocab_size + (-vocab_size) % divisor


def head_dim_sizes(hparams):
  """Sizes of the head dimensions the model uses: {name: size}."""
  sizes = {}
  for i in range(hparams.num_decoder_layers):
    num_routing, num_local, _ = tf_layers.head_counts(hparams, i)
    if num_routing:
      sizes["routing_heads"] = num_routing
    if num_local:
      sizes["local_heads" if num_routing else "heads"] = num_local
  return sizes


def dimension_sizes(hparams, vocab_size):
  """Every splittable dimension name of the model -> size."""
  sizes = dict(head_dim_sizes(hparams), batch=batch_size(hparams), d_ff=hparams.filter_size,
               vocab=padded_vocab_size(vocab_size, hparams))
  return sizes


# The hparams of the TF model (hparams/base.py) that routing_transformer_mtf implements. Every
# other hparam of the TF model set away from its default is refused (`unimplemented_switches`).
MTF_IMPLEMENTS = frozenset((
    "add_timing_signal", "attention_dropout", "beta", "decay", "ema", "embedding_dims",
    "ffn_layer", "filter_size", "head_dense", "local_num_heads", "local_relative",
    "max_target_length", "memory_flange", "num_decoder_layers", "query_shape", "relu_dropout",
    "share_qk", "sparsity_cluster_attention_window", "sparsity_cluster_num_heads",
    "sparsity_cluster_relative", "sparsity_cluster_size", "sparsity_skip_first",
    "target_dropout",
    # read by no training model: decoding (routing_transformer decodes), data reading, the
    # encoder-decoder attention's block (decoder-only here), the non-finite guard (none here)
    "fast_decode", "nucleus_sampling", "sampling_keep_top_k", "skip_corrupt_records",
    "memory_query_shape", "nan_guard"))
# T2T hparams whose non-default values the TF model implements and this one does not.
T2T_SWITCHES = ("activation_dtype", "weight_dtype")


def unimplemented_switches(hparams):
  """Names of the TF model's hparams set away from their defaults that this model lacks."""
  from hparams import base  # pylint: disable=g-import-not-at-top
  from tensor2tensor.layers import common_hparams  # pylint: disable=g-import-not-at-top
  defaults = base.sparse_transformer_local().values()
  t2t = common_hparams.basic_params1().values()
  names = sorted(set(defaults) - set(t2t) - MTF_IMPLEMENTS) + list(T2T_SWITCHES)
  values = hparams.values()
  return [name for name in names if name in values and values[name] != defaults[name]]


def check_mtf_hparams(hparams, vocab_size=None):
  """Raises MtfHParamsError (one line naming the fix) on unsupported hparams or layouts."""
  problems = []
  unimplemented = unimplemented_switches(hparams)
  if unimplemented:
    problems.append("%s: not implemented by routing_transformer_mtf; unset them or use "
                    "--model=routing_transformer" % ", ".join(
                        "%s=%r" % (name, hparams.get(name)) for name in unimplemented))
  if hparams.label_smoothing:
    problems.append("label_smoothing=%s is not supported; use label_smoothing=0"
                    % hparams.label_smoothing)
  if hparams.norm_type != "layer":
    problems.append("norm_type=%r is not supported; use 'layer'" % hparams.norm_type)
  if hparams.ffn_layer not in ("geglu", "dense_relu_dense"):
    problems.append("ffn_layer=%r is not supported; use 'geglu' or 'dense_relu_dense'"
                    % hparams.ffn_layer)
  if hparams.optimizer.lower() not in ("adafactor", "sgd"):
    problems.append("optimizer=%r: routing_transformer_mtf trains with 'adafactor' or 'sgd'"
                    % hparams.optimizer)
  try:
    mesh_shape = mtf.convert_to_shape(hparams.mesh_shape)
    rules = mtf.convert_to_layout_rules(hparams.layout)
  except (ValueError, IndexError) as e:
    raise MtfHParamsError("cannot parse mesh_shape=%r / layout=%r (%s); write e.g. "
                          "mesh_shape='batch:2;model:4' layout='batch:batch;heads:model'"
                          % (hparams.mesh_shape, hparams.layout, e))
  mesh_sizes = {d.name: d.size for d in mesh_shape.dims}
  sizes = dimension_sizes(hparams, vocab_size or 1)
  for tensor_dim, mesh_dim in sorted(rules._pairs):  # pylint: disable=protected-access
    if mesh_dim not in mesh_sizes:
      continue  # a rule for a mesh dimension that does not exist is ignored by Mesh-TF too
    if tensor_dim not in SPLITTABLE:
      problems.append("layout splits %r, which routing_transformer_mtf keeps whole; split only "
                      "%s" % (tensor_dim, ", ".join(SPLITTABLE)))
    elif tensor_dim in sizes and (tensor_dim != "vocab" or vocab_size) and \
        sizes[tensor_dim] % mesh_sizes[mesh_dim]:
      fix = ("set vocab_divisor=%d" % mesh_sizes[mesh_dim] if tensor_dim == "vocab" else
             "drop %s:%s from layout or change the mesh" % (tensor_dim, mesh_dim))
      problems.append("%s (size %d) is not divisible by mesh dimension %s:%d; %s"
                      % (tensor_dim, sizes[tensor_dim], mesh_dim, mesh_sizes[mesh_dim], fix))
  if problems:
    raise MtfHParamsError("Unsupported hparams for routing_transformer_mtf: " +
                          "; ".join(problems))
  return mesh_shape, rules


def initializer(hparams, fan_in, fan_out):
  """T2T's hparams.initializer for the logical [fan_in, fan_out] matrix, cut to the shape.

  So a [d_model, heads, d_head] weight (all heads or one head kind's share of them) is
  distributed like the TF model's [hidden, hidden] kernel.
  """
  from tensor2tensor.utils import optimize  # pylint: disable=g-import-not-at-top
  base = optimize.get_variable_initializer(hparams)

  def init(shape, dtype=tf.float32, partition_info=None):  # pylint: disable=unused-argument
    size = int(np.prod(shape))
    return tf.reshape(tf.reshape(base([fan_in, fan_out], dtype=dtype), [-1])[:size], shape)

  return init


class MtfRoutingTransformer(object):
  """Builds the LM on a mtf.Mesh; call `loss_and_logits` once per graph."""

  def __init__(self, hparams, mesh, vocab_size, train=False, batch=None):
    self.hparams, self.mesh, self.train = hparams, mesh, train
    self.vocab_size = vocab_size
    heads = hparams.local_num_heads + hparams.sparsity_cluster_num_heads
    self.dims = {
        "batch": mtf.Dimension("batch", batch or batch_size(hparams)),
        "length": mtf.Dimension("length", target_length(hparams)),
        "d_model": mtf.Dimension("d_model", hparams.hidden_size),
        "embed": mtf.Dimension("embed", hparams.embedding_dims),
        "d_ff": mtf.Dimension("d_ff", hparams.filter_size),
        "vocab": mtf.Dimension("vocab", padded_vocab_size(vocab_size, hparams)),
        "d_head": mtf.Dimension("d_head", hparams.hidden_size // heads),
        "clusters": mtf.Dimension("clusters", max(1, hparams.sparsity_cluster_size)),
        "relative": mtf.Dimension("relative", 2 * hparams.max_relative_position + 1),
    }
    self.update_ops = []

  # Small pieces.

  def weight(self, name, dims, fan_in, fan_out):
    return attention.get_variable(self.mesh, name, mtf.Shape(dims),
                                  initializer=initializer(self.hparams, fan_in, fan_out))

  def bias(self, name, dim):
    return attention.get_variable(self.mesh, name, mtf.Shape([dim]),
                                  initializer=tf.zeros_initializer())

  def dense(self, x, in_dim, out_dims, name, use_bias=False, fan_out=None):
    """x [..., in_dim] -> [..., out_dims] (variables name/kernel, name/bias).

    fan_out: of the TF model's kernel when this one is a share of it (default: its own size).
    """
    out_dims = out_dims if isinstance(out_dims, list) else [out_dims]
    with tf.variable_scope(name):
      kernel = self.weight("kernel", [in_dim] + out_dims, in_dim.size,
                           fan_out or int(np.prod([d.size for d in out_dims])))
      y = mtf.einsum([x, kernel], output_shape=(x.shape - in_dim) + out_dims)
      if use_bias:
        y += self.bias("bias", out_dims[-1])
    return y

  def dropout(self, x, rate):
    return mtf.dropout(x, self.train, rate=rate) if self.train and rate else x

  def layer_norm(self, x, name="layer_norm"):
    """T2T's layer norm over d_model (scale and bias variables, epsilon norm_epsilon)."""
    dim = self.dims["d_model"]
    with tf.variable_scope(name):
      scale = attention.get_variable(self.mesh, "layer_norm_scale", mtf.Shape([dim]),
                                     initializer=tf.ones_initializer())
      bias = self.bias("layer_norm_bias", dim)
    return attention.layer_norm_no_scale(x, dim, self.hparams.norm_epsilon) * scale + bias

  def process(self, previous, x, sequence):
    """T2T layer_preprocess / layer_postprocess: 'a' add, 'n' norm, 'd' dropout."""
    if sequence == "none":
      return x
    for c in sequence:
      if c == "a":
        x += previous
      elif c == "n":
        x = self.layer_norm(x)
      elif c == "d":
        x = self.dropout(x, self.hparams.layer_prepostprocess_dropout)
      else:
        raise MtfHParamsError("layer pre/postprocess step %r is not supported; use a, n, d" % c)
    return x

  # Blocks.

  def relative_tables(self, enabled):
    hparams = self.hparams
    if not enabled or not hparams.max_relative_position:
      return None
    rel, d = self.dims["relative"], self.dims["d_head"]
    init = tf.random_normal_initializer(stddev=d.size ** -0.5)
    tables = []
    for scope in ("relative_positions_keys", "relative_positions_values"):
      with tf.variable_scope(scope):
        tables.append(attention.get_variable(self.mesh, "embeddings", mtf.Shape([rel, d]),
                                             initializer=init))
    return tables[0], tables[1], rel

  def self_attention(self, x, layer_index, weights):
    """Local + routing heads; returns (y [b, n, d_model], the k-means loss or 0)."""
    hparams, dims = self.hparams, self.dims
    b, n, d_model, d = dims["batch"], dims["length"], dims["d_model"], dims["d_head"]
    num_routing, num_local, _ = tf_layers.head_counts(hparams, layer_index)
    heads_total = num_routing + num_local
    groups = []
    if num_routing:
      groups.append(("routing", mtf.Dimension("routing_heads", num_routing)))
    if num_local:
      groups.append(("local", mtf.Dimension("local_heads" if num_routing else "heads",
                                            num_local)))
    outputs, loss = [], 0.0
    drop = lambda probs: self.dropout(probs, hparams.attention_dropout)  # on the weights
    for kind, h in groups:
      with tf.variable_scope(kind):
        shared = kind == "routing" and hparams.share_qk  # no key projection: keys = queries
        q, k, v = (None if shared and name == "k" else
                   self.dense(x, d_model, [h, d], name, fan_out=d_model.size)
                   for name in ("q", "k", "v"))
        q *= d.size ** -0.5  # as the TF model (routing normalises, local logits unscaled)
        k = q if shared else k
        q, k, v = (attention.ordered(t, [b, h, n, d]) for t in (q, k, v))
        if kind == "routing":
          km = kmeans.MtfKMeans(self.mesh, h, dims["clusters"], d, decay=hparams.decay,
                                beta=hparams.beta, ema=hparams.ema)
          out, aux = attention.routing_attention(
              q, k, v, km.means,
              hparams.sparsity_cluster_attention_window,
              dict(batch=b, heads=h, length=n, d_head=d, clusters=dims["clusters"]),
              share_qk=hparams.share_qk, weights=weights,
              relative=self.relative_tables(hparams.sparsity_cluster_relative), dropout=drop)
          x_hats, clusters = tf_kmeans.routed_vectors(aux, hparams.share_qk)
          loss = km.loss(aux["commitment_loss"], x_hats, clusters, weights)
          if self.train:  # with ema=False only the EMA statistics move (MtfKMeans.update)
            self.update_ops += km.update(x_hats, clusters, weights)[0]
        else:
          out = attention.local_attention(
              q, k, v, hparams.query_shape[0], hparams.memory_flange[0], n, d,
              relative=self.relative_tables(hparams.local_relative), dropout=drop)
        outputs.append((h, out))
    y = 0.0
    for h, out in outputs:
      if hparams.head_dense:  # one [d, d] map shared by all heads (and both kinds)
        d_out = mtf.Dimension("d_head_out", d.size)
        out = mtf.rename_dimension(self.dense(out, d, d_out, "head_dense"), "d_head_out",
                                   "d_head")
      # The output transform's [h * d, hidden] kernel, one slice per head kind.
      with tf.variable_scope("output_transform_" + h.name):
        kernel = self.weight("kernel", [h, d, d_model], heads_total * d.size, d_model.size)
      y += mtf.einsum([out, kernel], output_shape=[b, n, d_model])
    return y, loss

  def ffn(self, x):
    hparams, d_model, d_ff = self.hparams, self.dims["d_model"], self.dims["d_ff"]
    if hparams.ffn_layer == "geglu":
      h = mtf.gelu(self.dense(x, d_model, d_ff, "weight1")) * self.dense(x, d_model, d_ff,
                                                                          "weight2")
      h = self.dropout(h, hparams.relu_dropout)
      return self.dense(h, d_ff, d_model, "weight3")
    h = mtf.relu(self.dense(x, d_model, d_ff, "conv1", use_bias=True))
    h = self.dropout(h, hparams.relu_dropout)
    return self.dense(h, d_ff, d_model, "conv2", use_bias=True)

  def embed(self, ids):
    """ids [b, n] -> [b, n, d_model]: embedding lookup (no scaling), dropout, dense (+timing)."""
    hparams, dims = self.hparams, self.dims
    with tf.variable_scope("embeddings"):
      table = attention.get_variable(self.mesh, "embedding",
                                     mtf.Shape([dims["vocab"], dims["embed"]]),
                                     initializer=tf.random_normal_initializer(0.0, 1.0))
    x = self.dropout(mtf.gather(table, ids, dims["vocab"]), hparams.dropout)
    x = self.dense(x, dims["embed"], dims["d_model"], "emb_dense", use_bias=True)
    if hparams.add_timing_signal:
      from tensor2tensor.layers import common_attention  # pylint: disable=g-import-not-at-top
      signal = common_attention.get_timing_signal_1d(dims["length"].size, dims["d_model"].size)
      x += mtf.import_fully_replicated(self.mesh, signal[0], mtf.Shape([dims["length"],
                                                                        dims["d_model"]]))
    return x

  def logits(self, x):
    dims = self.dims
    if self.hparams.hidden_size != self.hparams.embedding_dims:
      x = self.dense(x, dims["d_model"], dims["embed"], "final_dense_1", use_bias=True)
      x_dim = dims["embed"]
    else:
      x_dim = dims["d_model"]
    logits = self.dense(x, x_dim, dims["vocab"], "final_dense_2", use_bias=True)
    if dims["vocab"].size > self.vocab_size:  # padded vocab entries never win
      extra = mtf.greater_equal(mtf.range(self.mesh, dims["vocab"], tf.int32), self.vocab_size)
      logits += mtf.cast(extra, logits.dtype) * attention.MASK
    return logits

  def loss_and_logits(self, targets):
    """targets int32 [batch, length] (0 = padding) -> (loss, xent, extra_loss, logits).

    loss = mean cross-entropy over non-padding targets + extra_loss (the k-means losses).
    """
    hparams, dims = self.hparams, self.dims
    weights = mtf.cast(mtf.not_equal(targets, 0), tf.float32)  # [b, n]
    ids = targets
    if self.train and hparams.target_dropout:
      drop = mtf.less(mtf.random_uniform(self.mesh, targets.shape), hparams.target_dropout)
      ids = mtf.where(drop, mtf.zeros_like(targets), targets)
    shifted = mtf.shift(ids, 1, dims["length"], wrap=False)
    # the decoder's input dropout (layer_prepostprocess_dropout), as the TF model and the original
    x = self.dropout(self.embed(shifted), hparams.layer_prepostprocess_dropout)
    extra = []
    for i in range(hparams.num_decoder_layers):
      with tf.variable_scope("decoder_layer_%d" % i):
        with tf.variable_scope("self_attention"):
          y, loss = self.self_attention(self.process(None, x, hparams.layer_preprocess_sequence),
                                        i, weights)
          x = self.process(x, y, hparams.layer_postprocess_sequence)
          if not isinstance(loss, float):
            extra.append(loss)
        with tf.variable_scope("ffn"):
          y = self.ffn(self.process(None, x, hparams.layer_preprocess_sequence))
          x = self.process(x, y, hparams.layer_postprocess_sequence)
    x = self.process(None, x, hparams.layer_preprocess_sequence)
    logits = self.logits(x)
    xent = mtf.layers.softmax_cross_entropy_with_logits(logits, targets, dims["vocab"])
    xent = mtf.reduce_sum(xent * weights) / mtf.maximum(mtf.reduce_sum(weights), 1.0)
    extra_loss = mtf.add_n(extra) if extra else mtf.zeros(self.mesh, mtf.Shape([]))
    return xent + extra_loss, xent, extra_loss, logits
