"""The Routing Transformer as a Tensor2Tensor model (`routing_transformer`, `sparse_transformer`).

Decoder-only LM (num_encoder_layers = 0) or encoder-decoder. Embeddings, the projection to
hidden_size and the output projection live in the body (as in the released model), so the
model's bottom and top are identities and the body returns logits [b, n, 1, 1, vocab] plus
{"extra_loss": sum of the layers' k-means losses (`kmeans.clustering_loss`)}. Sequences are padded
to max_target_length / max_length so every shape is static (TPU/XLA).

Centroid updates: in TRAIN mode each routing layer reports its k-means statistics; after all
data-parallel shards are built, `model_fn_sharded` averages them over shards (cross-replica sum
on TPU) and applies one EMA update per layer, so every shard keeps identical centroids.
"""
import collections

import tensorflow as tf

from routing_transformer.t2t import checkpoint_files
from routing_transformer.t2t import patches
from routing_transformer.core import health
from routing_transformer.core import kmeans
from routing_transformer.core import layers
from routing_transformer.core import memory as memory_lib

# T2T cannot build or train the model on TF 2.15 without these fixes (and the non-finite guard).
patches.install(patches.MODEL_FIXES)

# pylint: disable=g-import-not-at-top,wrong-import-position
from tensor2tensor.layers import common_attention
from tensor2tensor.layers import common_layers
from tensor2tensor.layers import modalities
from tensor2tensor.utils import beam_search
from tensor2tensor.utils import quantization
from tensor2tensor.utils import registry
from tensor2tensor.utils import t2t_model
# pylint: enable=g-import-not-at-top,wrong-import-position

tf1 = tf.compat.v1


MAX_CHUNKS = 256  # logits_chunk_size, ffn_chunk_size: chunks per sequence (each adds graph ops)
ACTIVATION_DTYPES = {"float32": tf.float32, "bfloat16": tf.bfloat16}


class HParamsError(ValueError):
  """Inconsistent hparams; the message names the hparam and the fix."""


def check_hparams(hparams, length=None):
  """Fails fast on hparams the model cannot run with; returns None or raises HParamsError."""
  heads = hparams.local_num_heads + hparams.sparsity_cluster_num_heads
  length = length or hparams.max_target_length or hparams.max_length
  block, flange = hparams.query_shape[0], hparams.memory_flange[0]
  problems = []
  if heads <= 0 or hparams.hidden_size % heads:
    problems.append("hidden_size=%d is not divisible by local_num_heads + "
                    "sparsity_cluster_num_heads = %d; change one of them"
                    % (hparams.hidden_size, heads))
  full = hparams.full_attention
  if not full and (block <= 0 or length % block):
    problems.append("max_length/max_target_length=%d is not a multiple of query_shape=%d; use "
                    "e.g. max_length=%d" % (length, block, -(-length // max(block, 1)) * block))
  if not full and block > 0 and flange % block:
    problems.append("memory_flange=%d is not a multiple of query_shape=%d" % (flange, block))
  routing = hparams.sparsity_cluster_num_heads > 0 and (
      hparams.sparsity_skip_first < hparams.num_decoder_layers or
      hparams.num_encoder_layers > 0)
  if routing:
    clusters = hparams.sparsity_cluster_size
    window = hparams.sparsity_cluster_attention_window
    if clusters <= 0 or window <= 0:
      problems.append("sparsity_cluster_num_heads=%d needs sparsity_cluster_size > 0 and "
                      "sparsity_cluster_attention_window > 0 (got %d and %d); set them or use "
                      "sparsity_cluster_num_heads=0" % (hparams.sparsity_cluster_num_heads,
                                                        clusters, window))
    elif window > length:
      problems.append("sparsity_cluster_attention_window=%d exceeds the length %d; lower it"
                      % (window, length))
    elif clusters * window < length and (hparams.routing_mode != "causal_window" or
                                         hparams.num_encoder_layers > 0):
      problems.append("sparsity_cluster_size * sparsity_cluster_attention_window = %d * %d < "
                      "length %d leaves tokens out of every cluster; use sparsity_cluster_size "
                      ">= %d" % (clusters, window, length, -(-length // window)))
  if hparams.legacy_causal_key_routing and hparams.routing_mode != "topk":
    problems.append("legacy_causal_key_routing=True reproduces the original's top-k routing; "
                    "use it with routing_mode='topk'")
  if hparams.routing_logit_scale not in ("none", "rsqrt_depth", "learned"):
    problems.append("routing_logit_scale=%r is not supported; use 'none' (paper), "
                    "'rsqrt_depth' or 'learned'" % hparams.routing_logit_scale)
  for name, part in (("logits_chunk_size", "the output layer"), ("ffn_chunk_size", "the FFN")):
    chunk = getattr(hparams, name)
    if chunk < 0 or (chunk and -(-length // chunk) > MAX_CHUNKS):
      problems.append("%s=%d must be 0 (off) or at least %d: at most %d chunks of the length %d "
                      "(each chunk adds a copy of %s to the graph)"
                      % (name, chunk, -(-length // MAX_CHUNKS), MAX_CHUNKS, length, part))
  if hparams.routing_mode not in ("topk", "causal_window"):
    problems.append("routing_mode=%r is not supported; use 'topk' (paper routing) or "
                    "'causal_window' (strictly causal)" % hparams.routing_mode)
  if hparams.activation_dtype not in ACTIVATION_DTYPES:
    problems.append("activation_dtype=%r is not supported; use 'float32' or 'bfloat16'"
                    % hparams.activation_dtype)
  if hparams.weight_dtype != "float32":
    problems.append("weight_dtype=%r is not supported: the variables are float32 (bfloat16 "
                    "activations: activation_dtype='bfloat16'); use weight_dtype='float32'"
                    % hparams.weight_dtype)
  if problems:
    raise HParamsError("Inconsistent hparams for routing_transformer: " + "; ".join(problems))


# Memory switches whose recomputation XLA (the TPU path) merges with the forward pass: XLA's
# buffer assignment of bench-8k's step with each of them on is 0.96-1.00x the plain step's
# (benchmarks/xla_memory.py at 8,192 tokens; recompute_attention's local head groups keep
# 0.96x), with chunked logits 1.04x it: under the 10% a switch must save.
XLA_INERT_SWITCHES = ("recompute_layers", "recompute_attention", "logits_chunk_size",
                      "ffn_chunk_size")


def refuse_xla_inert_switches(hparams):
  """HParamsError (one line) when a switch of XLA_INERT_SWITCHES is on for a TPU run: XLA merges
  their recomputation with the forward pass (benchmarks/xla_memory.py: the step's buffers are
  0.96-1.00x the plain step's, more with chunked logits)."""
  on = ["%s=%s" % (name, getattr(hparams, name)) for name in XLA_INERT_SWITCHES
        if getattr(hparams, name)]
  if on:
    raise HParamsError(
        "%s: save at most 4%% of memory on TPU: XLA merges their recomputation with the "
        "forward pass (benchmarks/xla_memory.py); unset them with --use_tpu "
        "(activation_dtype=bfloat16 remains)" % ", ".join(on))


def activation_dtype(hparams):
  """tf.float32, or tf.bfloat16 with hparams.activation_dtype="bfloat16"."""
  return ACTIVATION_DTYPES[hparams.activation_dtype]


def pad_to_length(ids, length, name):
  """Pads int ids [b, n] with 0 to exactly `length` (static); fails if n > length: at graph build
  for a static n, else in the step (InvalidArgumentError of an op named after the fix), with no
  host op (tf.ensure_shape, not an Assert: the training step stays on the device)."""
  if ids.shape[1] is not None and ids.shape[1] > length:
    raise ValueError("%s longer than the model's static length %d (%d); raise max_length/"
                     "max_target_length or shorten the examples" % (name, length, ids.shape[1]))
  n = tf.shape(ids)[1]
  padded = tf.pad(ids, [[0, 0], [0, tf.maximum(length - n, 0)]])
  return tf.ensure_shape(padded, [ids.shape[0], length], name=(
      "%s_longer_than_the_static_length_%d_raise_max_length_or_max_target_length" % (name, length)))


def cross_replica_sum(counts, sums):
  """TPU: k-means statistics summed over replicas, so every replica keeps identical centroids."""
  return tf1.tpu.cross_replica_sum(counts), tf1.tpu.cross_replica_sum(sums)


@registry.register_model
class RoutingTransformer(t2t_model.T2TModel):
  """Routing Transformer LM / encoder-decoder (Roy et al., 2021)."""

  def __init__(self, *args, **kwargs):
    super(RoutingTransformer, self).__init__(*args, **kwargs)
    self._kmeans_steps = collections.OrderedDict()

  @property
  def is_train(self):
    return self.hparams.mode == tf.estimator.ModeKeys.TRAIN

  def bottom(self, features):
    return dict(features)  # embeddings are part of the body

  def clip_targets(self, features):
    """Targets cut to max_target_length, as the original's body cuts them (its enwik8 sets keep
    max_target_length 4096 under max_length 8192 or 12288: they train on 4,096-byte windows)."""
    length = self.hparams.max_target_length
    if not length or "targets" not in features:
      return features
    features = dict(features)
    features["targets"] = features["targets"][:, :length]
    return features

  def model_fn(self, features):
    return super(RoutingTransformer, self).model_fn(self.clip_targets(features))

  def estimator_spec_eval(self, features, logits, labels, loss, losses_dict):
    """T2T's evaluation with the targets cut as in `model_fn`, so the metrics compare the
    logits with the targets they predict."""
    features = self.clip_targets(features)
    if labels is not None and self.hparams.max_target_length:
      labels = labels[:, :self.hparams.max_target_length]
    return super(RoutingTransformer, self).estimator_spec_eval(features, logits, labels, loss,
                                                               losses_dict)

  def input_dropout(self, x):
    """The original's dropout of the decoder's and encoder's input (rate
    layer_prepostprocess_dropout, TRAIN only), before the first layer."""
    rate = self.hparams.layer_prepostprocess_dropout
    return tf.nn.dropout(x, rate=rate) if self.is_train and rate else x

  def top(self, body_output, features):
    return body_output  # the body returns logits

  def embed(self, ids, name, feature="targets", position=None):
    """ids [b, n] -> [b, n, hidden]: embedding_dims lookup (no scaling), dropout, dense.

    `position` (int32 scalar) is the position of a single decoding step (ids [b, 1]).
    """
    hparams = self.hparams
    vocab = self._problem_hparams.vocab_size[feature]
    with tf1.variable_scope(name):
      table = tf1.get_variable("embedding", [vocab, hparams.embedding_dims],
                               initializer=tf1.random_normal_initializer(0.0, 1.0))
    x = tf.cast(tf.gather(table, ids), activation_dtype(hparams))
    if self.is_train and hparams.dropout:
      x = tf.nn.dropout(x, rate=hparams.dropout)
    x = layers.dense(x, hparams.hidden_size, "emb_dense" if name == "embeddings" else
                     name + "_dense", use_bias=True)
    if hparams.add_timing_signal and position is None:
      x = common_attention.add_timing_signal_1d(x)
    elif hparams.add_timing_signal:
      x = common_attention.add_timing_signal_1d_given_position(
          x, tf.fill(tf.shape(ids), position))
    return x

  def layer_stack(self, x, prefix, num_layers, attend, memory_attend=None, wrap=None):
    """Residual blocks: self-attention, [enc-dec attention], FFN with T2T pre/post-processing.

    Args:
      x: [b, n, hidden].
      prefix: "encoder" or "decoder" (variable scopes `<prefix>_layer_<i>`).
      num_layers: number of blocks.
      attend: (normalised x, layer index) -> self-attention output [b, n, hidden].
      memory_attend: optional (normalised x, layer index) -> enc-dec attention output.
      wrap: optional (x, layer index) -> block output, run in the block's variable scope
        instead of `block` (recompute_layers).
    Returns:
      [b, n, hidden] (final layer_preprocess applied).
    """
    for i in range(num_layers):
      with tf1.variable_scope("%s_layer_%d" % (prefix, i)):
        x = wrap(x, i) if wrap is not None else self.block(x, i, attend, memory_attend)
    return self.preprocess(x)

  def preprocess(self, x):
    """T2T's layer_preprocess (`process`, default scope `layer_prepostprocess`)."""
    return self.process(None, x, self.hparams.layer_preprocess_sequence, "layer_prepostprocess")

  def postprocess(self, x, y, deferred=None):
    """T2T's layer_postprocess of y with residual x (`process`, scope `layer_postprocess`)."""
    return self.process(x, y, self.hparams.layer_postprocess_sequence, "layer_postprocess",
                        deferred)

  def process(self, previous, x, sequence, default_name, deferred=None):
    """T2T's `layer_prepostprocess`, step for step and in its variable scopes: "a" adds
    `previous`, "d" drops out (layer_prepostprocess_dropout), "n" normalises (`norm`). With
    bfloat16 activations and an "n" in the sequence the steps run in float32 and the result comes
    back as bfloat16. deferred: a list; a final "n" is left out and (its variable scope, the
    result's dtype) appended for `deferred_norm`, which applies it (the result stays float32)."""
    hparams = self.hparams
    dtype = x.dtype
    wide = dtype != tf.float32 and "n" in sequence
    with tf1.variable_scope(None, default_name=default_name):
      if sequence == "none":
        return x
      if deferred is not None and sequence.endswith("n"):
        deferred.append((tf1.get_variable_scope(), dtype))
        sequence, dtype = sequence[:-1], tf.float32 if wide else dtype
      if wide:
        x = tf.cast(x, tf.float32)
        previous = None if previous is None else tf.cast(previous, tf.float32)
      for step in sequence:
        if step == "a":
          x += previous
        elif step == "d":
          x = common_layers.dropout_with_broadcast_dims(
              x, 1.0 - hparams.layer_prepostprocess_dropout,
              broadcast_dims=common_layers.comma_separated_string_to_integer_list(
                  hparams.layer_prepostprocess_dropout_broadcast_dims))
        elif step == "n":
          x = self.norm(x)
        else:
          raise ValueError("layer pre/postprocess step %r is not supported; use 'a', 'd', 'n'"
                           % step)
      return tf.cast(x, dtype) if wide else x

  def deferred_norm(self, x, deferred, reuse=None):
    """The normalisation `process` left out (deferred: its (variable scope, dtype)) applied to
    x in that scope: the same variables and values as in `process`."""
    scope, dtype = deferred
    with tf1.variable_scope(scope, reuse=reuse):
      return tf.cast(self.norm(x), dtype)

  def norm(self, x):
    """T2T's `apply_norm` (norm_type, norm_epsilon). In training T2T's layer norm is a
    `memory.recompute_tensors` block of x and its variables (T2T's `layer_norm_vars`, the same
    names): the backward pass keeps x and normalises again instead of keeping the
    normalisation's [b, n, hidden] intermediates (the same values)."""
    hparams = self.hparams
    if not (self.is_train and hparams.norm_type == "layer"):
      return common_layers.apply_norm(x, hparams.norm_type, None, hparams.norm_epsilon)
    with tf1.variable_scope(None, default_name="layer_norm", values=[x]):
      scale, bias = common_layers.layer_norm_vars(x.shape[-1])
    return memory_lib.recompute_tensors(
        lambda x, scale, bias: common_layers.layer_norm_compute(
            x, hparams.norm_epsilon, scale, bias), x, tf.convert_to_tensor(scale),
        tf.convert_to_tensor(bias))

  def block(self, x, i, attend, memory_attend=None, deferred=None):
    """One residual block (in scope `<prefix>_layer_<i>`); see `layer_stack`. deferred: a list;
    the block's last normalisation is left out for `deferred_norm` (see `process`)."""
    hparams = self.hparams
    with tf1.variable_scope("self_attention"):
      with tf1.variable_scope("self_attention"):
        y = attend(self.preprocess(x), i)
      x = self.postprocess(x, y)
      if memory_attend is not None:
        with tf1.variable_scope("encdec_attention"):
          y = memory_attend(self.preprocess(x), i)
        x = self.postprocess(x, y)
      with tf1.variable_scope("ffn"):
        y = layers.ffn(self.preprocess(x), hparams, self.is_train)
      x = self.postprocess(x, y, deferred)
    return x

  def stack(self, x, padding, causal, prefix, num_layers, memory=None, memory_padding=None):
    """Whole-sequence layers; returns (x [b, n, hidden], summed commitment losses)."""
    hparams = self.hparams
    if self.is_train and hparams.recompute_layers:
      return self.recomputed_stack(x, padding, causal, prefix, num_layers, memory,
                                   memory_padding)
    losses = []

    def attend(y, i):
      out, loss, step = layers.self_attention(y, hparams, i, padding, causal=causal,
                                              train=self.is_train)
      if step is not None:
        self._kmeans_steps.setdefault(step.km.means.name, []).append(step)
      losses.append(tf.cast(loss, tf.float32))
      return out

    memory_attend = None if memory is None else (
        lambda y, i: layers.encdec_attention(y, memory, hparams, memory_padding,
                                             train=self.is_train))
    x = self.layer_stack(x, prefix, num_layers, attend, memory_attend)
    return x, tf.add_n(losses)

  def recomputed_stack(self, x, padding, causal, prefix, num_layers, memory_input=None,
                       memory_padding=None):
    """`stack` with every block recomputed in the backward pass (hparam recompute_layers).

    The forward call of a block registers its k-means statistics and reads the centroids; the
    backward re-run (replay) registers nothing and routes with the centroids the forward read,
    so the EMA update happens once per step and the gradients equal those without recompute.
    A block's last normalisation (post-norm, "dan") runs at the start of the next recomputed
    block (after the last block, alone), which keeps its input, the residual sum: a re-run need
    not compute the feed-forward's output, whose gradient is the residual's (with ffn_chunk_size
    the chunks' forward would otherwise run three times), and keeps no more than before.
    """
    hparams = self.hparams
    random = [name for name in ("attention_dropout", "relu_dropout",
                                "layer_prepostprocess_dropout") if hparams.get(name)]
    if random or hparams.random_routing:
      raise HParamsError(
          "recompute_layers=True re-runs each block in the backward pass and would draw its "
          "random numbers again; set %s to 0 or recompute_layers=False"
          % " and ".join(random + (["random_routing=False"] if hparams.random_routing else [])))
    losses = []

    def read_means(means, km, replay):
      if not replay:
        means[km.means.ref()] = tf.convert_to_tensor(km.means)
      return means[km.means.ref()]

    pending = []  # the previous block's deferred normalisation: (variable scope, dtype)

    def wrap(x, i):
      """Block i, recomputed in the backward pass (`memory_lib.recompute`), keeping its input."""
      means = {}  # this block's centroid reads in the forward: variable ref -> tensor
      previous, deferred = pending[:], []

      def run(x, *mem, replay=False):
        found = {"loss": tf.zeros([])}
        if previous:
          x = self.deferred_norm(x, previous[0], reuse=replay or None)

        def attend(y, i):
          out, loss, step = layers.self_attention(
              y, hparams, i, padding, causal=causal, train=True,
              read_centroids=lambda km: read_means(means, km, replay))
          if step is not None and not replay:
            self._kmeans_steps.setdefault(step.km.means.name, []).append(step)
          found["loss"] = tf.cast(loss, tf.float32)
          return out

        memory_attend = (lambda y, i: layers.encdec_attention(y, mem[0], hparams,
                                                              memory_padding)) if mem else None
        return self.block(x, i, attend, memory_attend, [] if replay else deferred), found["loss"]

      inputs = [x] + ([memory_input] if memory_input is not None else [])
      y, loss = memory_lib.recompute(run, inputs, lambda: means)
      losses.append(loss)
      pending[:] = deferred
      if deferred and i == num_layers - 1:
        return self.deferred_norm(y, deferred[0])
      return y

    x = self.layer_stack(x, prefix, num_layers, None, None, wrap=wrap)
    return x, tf.add_n(losses)

  def output_layer(self, x):
    """The output projection's input and variables: x [b, n, hidden] -> (x [b, n, e] after
    final_dense_1 when hidden_size != embedding_dims, final_dense_2's kernel [e, vocab] and
    bias [vocab]), all float32 (bfloat16 activations are cast: logits and loss in float32)."""
    hparams = self.hparams
    x = tf.cast(x, tf.float32)
    if hparams.hidden_size != hparams.embedding_dims:
      x = layers.dense(x, hparams.embedding_dims, "final_dense_1", use_bias=True)
    vocab = self._problem_hparams.vocab_size["targets"]
    kernel, bias = layers.dense_variables("final_dense_2", x.shape[-1], vocab,
                                          x.dtype.base_dtype)
    return x, tf.convert_to_tensor(kernel), tf.convert_to_tensor(bias)

  def logits(self, x):
    """[b, n, hidden] -> [b, n, vocab]: [final_dense_1 when dims differ], final_dense_2."""
    return memory_lib.project(*self.output_layer(x))

  def loss_weights_fn(self):
    """T2T's per-token weights function of the targets (hparams.weights_fn or the modality's)."""
    modality = self._problem_hparams.modality["targets"]
    overrides = self.hparams.get("weights_fn", None) or {}
    return overrides.get("targets", modalities.get_weights_fn(modality))

  def plain_loss_problems(self, features):
    """Why T2T's training loss of these features is not the targets modality's generic
    cross-entropy with weights_nonzero (a loss or weights_fn override, targets_mask, a loss
    cutoff, a multi-problem, scheduled sampling): [] when it is. Only that loss can take logits
    longer than the targets (it pads them with weight-0 zeros) or be computed chunk by chunk."""
    hparams = self.hparams
    modality = self._problem_hparams.modality["targets"]
    loss = (hparams.get("loss", None) or {}).get("targets", modalities.get_loss(modality))
    problems = []
    if loss is not modalities.generic_loss:
      problems.append("the targets loss is %s, not T2T's generic cross-entropy" %
                      getattr(loss, "__name__", loss))
    if self.loss_weights_fn() is not common_layers.weights_nonzero:
      problems.append("the targets weights_fn is not weights_nonzero")
    if "targets_mask" in features:
      problems.append("the features have targets_mask")
    if getattr(hparams, "video_modality_loss_cutoff", 0.0):
      problems.append("video_modality_loss_cutoff is set")
    if hasattr(hparams, "problem") and hasattr(hparams.problem, "task_list"):
      problems.append("the problem is a multi-problem")
    if hparams.get("scheduled_sampling_prob", 0.0) > 0.0:
      problems.append("scheduled_sampling_prob > 0 needs the logits")
    return problems

  def check_chunked_loss(self, features):
    """Raises HParamsError unless T2T's loss of these features is the one `chunked_training_loss`
    computes (`plain_loss_problems`)."""
    problems = self.plain_loss_problems(features)
    if problems:
      raise HParamsError("logits_chunk_size=%d computes T2T's cross-entropy chunk by chunk, but "
                         "%s; set logits_chunk_size=0" % (self.hparams.logits_chunk_size,
                                                          " and ".join(problems)))

  def chunked_training_loss(self, x, kernel, bias, targets):
    """T2T's training loss (num, den) of targets [b, n] (0 = padding) from the output layer
    (x [b, n, e], kernel, bias of `output_layer`), `logits_chunk_size` positions at a time
    (`memory_lib.chunked_loss`): the sum over the positions of weights_nonzero(targets) x T2T's
    smoothing cross-entropy (label_smoothing as in T2T's loss) times the problem's
    loss_multiplier, and the sum of the weights."""
    hparams = self.hparams
    confidence = 1.0 - hparams.label_smoothing

    def xent(logits, labels):
      logits = tf.cast(logits, tf.float32)
      return common_layers.smoothing_cross_entropy(logits, labels, logits.shape[-1], confidence)

    weights = common_layers.weights_nonzero(targets)
    num = memory_lib.chunked_loss(x, kernel, bias, targets, weights,
                                    hparams.logits_chunk_size, xent)
    return num * self._problem_hparams.loss_multiplier, tf.reduce_sum(weights)

  def encode(self, features):
    """(memory [b, m, hidden], memory_padding [b, m], commitment loss) or Nones without inputs."""
    hparams = self.hparams
    if hparams.num_encoder_layers <= 0 or "inputs" not in features:
      return None, None, 0.0
    inputs = tf.cast(features["inputs"], tf.int32)
    in_ids = tf.reshape(inputs, common_layers.shape_list(inputs)[:2])
    in_ids = pad_to_length(in_ids, hparams.max_length, "inputs")
    memory_padding = tf.equal(in_ids, 0)
    memory, loss = self.stack(self.input_dropout(self.embed(in_ids, "input_embeddings", "inputs")),
                              memory_padding, False, "encoder", hparams.num_encoder_layers)
    return memory, memory_padding, loss

  def body(self, features):
    """Logits [b, n, 1, 1, vocab] and {"extra_loss"[, "training"]} of the features; with
    activation_dtype="bfloat16" the variables stay float32, cast to bfloat16 where used
    (T2T's bfloat16_activations_var_getter)."""
    check_hparams(self.hparams)
    if activation_dtype(self.hparams) == tf.float32:
      return self.body_ops(features)
    with tf1.variable_scope(tf1.get_variable_scope(), auxiliary_name_scope=False,
                            custom_getter=quantization.bfloat16_activations_var_getter):
      return self.body_ops(features)

  def body_ops(self, features):
    """`body` in the current variable scope."""
    hparams = self.hparams
    targets = tf.cast(features["targets"], tf.int32)
    ids = tf.reshape(targets, common_layers.shape_list(targets)[:2])
    actual_length = tf.shape(ids)[1]
    length = hparams.max_target_length or hparams.max_length
    ids = pad_to_length(ids, length, "targets")
    if self.is_train and hparams.target_dropout:
      drop = tf.random.uniform(tf.shape(ids)) < hparams.target_dropout
      ids_in = tf.where(drop, tf.zeros_like(ids), ids)
    else:
      ids_in = ids
    shifted = tf.pad(ids_in, [[0, 0], [1, 0]])[:, :-1]
    padding = tf.equal(ids, 0)  # position i is padding when its target is padding

    memory, memory_padding, extra = self.encode(features)
    x = self.input_dropout(self.embed(shifted, "embeddings"))
    x, loss = self.stack(x, padding, True, "decoder", hparams.num_decoder_layers, memory,
                         memory_padding)
    losses = {"extra_loss": loss + extra}
    if self.is_train and hparams.logits_chunk_size:
      # T2T then skips its top and loss; the logits are computed only if something fetches them.
      self.check_chunked_loss(features)
      output = self.output_layer(x)
      losses["training"] = self.chunked_training_loss(*output, ids)
      logits = memory_lib.project(*output)
    elif self.is_train and not self.plain_loss_problems(features):
      # T2T's loss pads the targets with 0 (weight 0) to the logits' length: no slice (whose
      # gradient would copy the [b, n, vocab] gradient into a new tensor).
      logits = self.logits(x)
    else:
      logits = tf.slice(self.logits(x), [0, 0, 0], [-1, actual_length, -1])
      logits.set_shape([ids.shape[0], targets.shape[1], None])
    logits = tf.expand_dims(tf.expand_dims(logits, 2), 2)  # [b, n, 1, 1, vocab]
    return logits, losses

  def infer(self, features=None, decode_length=50, beam_size=1, top_beams=1, alpha=0.0,
            use_tpu=False):
    """Cached incremental decoding (`routing_transformer.core.decoding`) unless fast_decode=False."""
    if not self.hparams.fast_decode:
      return super(RoutingTransformer, self).infer(features, decode_length, beam_size,
                                                   top_beams, alpha, use_tpu)
    from routing_transformer.t2t import decode_settings  # pylint: disable=g-import-not-at-top
    check_hparams(self.hparams)
    return decode_settings.infer(self, features, decode_length, beam_size=beam_size,
                                 top_beams=top_beams, alpha=alpha,
                                 beam_search=beam_search.beam_search)

  @staticmethod
  def hparams_error(hparams):
    """What `check_hparams` finds wrong with `hparams` (one line), or None (the binaries stop
    with it where they make the hparams: `t2t.patches`)."""
    try:
      check_hparams(hparams)
    except HParamsError as e:
      return str(e)
    return None

  @staticmethod
  def train_hooks(hook_context):
    """The non-finite guard's stop after a non-finite step (health.NonFiniteHook) and dead-cluster
    warnings every `dead_cluster_check_steps` steps (health.DeadClusterHook)."""
    hooks = [health.NonFiniteHook()] if hook_context.hparams.nan_guard else []
    every = hook_context.hparams.dead_cluster_check_steps
    return hooks + ([health.DeadClusterHook(every)] if every else [])

  def optimize(self, loss, num_async_replicas=1, use_tpu=False, variables=None):
    """T2T's optimizer, with the non-finite guard of `health` unless nan_guard=False or TPU:
    a step with a non-finite loss, gradient or centroid applies nothing (decided on the device);
    `train_hooks`' NonFiniteHook then stops training. With use_tpu, refuses the memory switches
    that save nothing under XLA (`refuse_xla_inert_switches`)."""
    if use_tpu:
      refuse_xla_inert_switches(self.hparams)
    if use_tpu or not self.hparams.nan_guard:
      return super().optimize(loss, num_async_replicas, use_tpu, variables)
    centroids = [v for v in tf1.global_variables() if v.op.name.endswith("/means")]
    with patches.guarding(loss, centroids):
      return super().optimize(loss, num_async_replicas, use_tpu, variables)

  def model_fn_sharded(self, sharded_features):
    self._kmeans_steps = collections.OrderedDict()
    sharded_logits, losses = super(RoutingTransformer, self).model_fn_sharded(sharded_features)
    if self.hparams.mode != tf.estimator.ModeKeys.PREDICT:  # decoding may name its checkpoint
      checkpoint_files.check_restorable(self.hparams.get("model_dir"), tf1.global_variables())
    if self.is_train and self._kmeans_steps:
      updates = [self.centroid_update(steps) for steps in self._kmeans_steps.values()]
      with tf.control_dependencies(updates):
        losses["extra_loss"] = tf.identity(losses.get("extra_loss", 0.0))
    return sharded_logits, losses

  def centroid_update(self, steps):
    """One EMA update of a layer's centroids from every shard (`kmeans.shard_update`), the
    statistics summed across TPU replicas; TRAIN summaries of its occupancy and routing."""
    on_tpu = common_layers.is_xla_compiled()
    # Re-seeding values come from the first shard's queries (off on TPU: see docs).
    reseed = self.hparams.reseed_dead_clusters and not on_tpu
    op, counts = kmeans.shard_update(steps, cross_replica_sum if on_tpu else None, reseed)
    if common_layers.should_generate_summaries():
      name = steps[0].km.means.name.split("/body/")[-1].replace("/means:0", "")
      scalars = dict(kmeans.occupancy(counts))  # cluster balance: min/max share, entropy
      for key in steps[0].routing_statistics:  # no_cluster_share, self_attention_share
        scalars[key] = tf.add_n([s.routing_statistics[key] for s in steps]) / len(steps)
      for key, value in scalars.items():
        tf1.summary.scalar("routing/%s/%s" % (name, key), value)
    return op


@registry.register_model("sparse_transformer")
class SparseTransformer(RoutingTransformer):
  """The same model under the original release's name (its variables live in that scope)."""
