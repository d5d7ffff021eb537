"""The model's cost, by arithmetic from its hparams (no TensorFlow): attention FLOPs and memory,
the local heads' reach, and the memory of one training step per device.

Per head and decoder layer, with n positions and d = hidden / heads:
  local (blocked) head   n (b + m) logits         (block b = query_shape, flange m)
  full head              n^2 logits               (full_attention: one block of n, no flange)
  routing head, "topk"   k w^2 logits + n k centroid scores   (k clusters, window w)
  routing, causal_window n 2w logits + n k centroid scores    (blocks of w in cluster order)
FLOPs: 4 d per logit (q.k and the weighted sum of v, a multiply-add each) plus 2 d per centroid
score; memory: the attention weights held per layer (logits + centroid scores), in floats.
Counts are of what the implementation computes (masked entries included).

Training-step memory (`config`, `step_memory`; scripts/memory_estimate.py prints it, and
scripts/mtf_memory_estimate.py adds Mesh-TF's per-device sizes up as `step_total` does): the
variables, Adafactor's slots, the k-means state and the forward tensors the backward pass reads
(see the script's docstring for what each block keeps).
"""
import collections

Cost = collections.namedtuple("Cost", ["flops", "memory"])


def _get(hparams, name, default=None):
  getter = getattr(hparams, "get", None)
  return getter(name, default) if getter else getattr(hparams, name, default)


def length_of(hparams):
  return _get(hparams, "max_target_length") or hparams.max_length


def local_span(hparams, length, as_local=False):
  """(block, flange) of the non-routing heads (as routing_transformer.core.layers.local_span);
  `as_local`: those of the local heads even when `full_attention` is set."""
  if _get(hparams, "full_attention", False) and not as_local:
    return length, 0
  return hparams.query_shape[0], hparams.memory_flange[0]


def heads_of_layer(local, routing, skip_first, hidden, layer):
  """(routing heads, other heads, depth per head) of decoder layer `layer` (as
  layers.head_counts): the first `skip_first` layers' routing heads attend locally."""
  heads = local + routing
  routing = routing if layer >= skip_first else 0
  return routing, heads - routing, hidden // heads


def layer_heads(hparams, layer):
  """(routing heads, other heads, depth per head) of decoder layer `layer`."""
  return heads_of_layer(hparams.local_num_heads, hparams.sparsity_cluster_num_heads,
                        hparams.sparsity_skip_first, hparams.hidden_size, layer)


def attention_logits(length, block, flange, clusters, window, causal_window=False):
  """(logits of a local head, logits of a routing head, centroid scores of a routing head) over
  `length` positions (see the module docstring)."""
  routing = length * 2 * window if causal_window else clusters * window * window
  return length * (block + flange), routing, length * clusters


def local_receptive_field(hparams, length=None, as_local=False):
  """How far back (in positions) a chain of the non-routing heads reaches through the decoder
  layers: the first hop from a query at the end of its block reaches b - 1 + m back (its block
  start, then the flange m), every further layer with such heads m more (it hops from a block
  start); the residual stream carries positions through other layers unchanged. So
  (b - 1) + L m with L the layers that have non-routing heads; full attention: n - 1. With
  `as_local`: the reach of the model's local twin (its query_shape / memory_flange, every
  decoder layer with local heads), so every model of a family, full attention and routing
  heads alone included, is split at the same distance."""
  n = length or length_of(hparams)
  block, flange = local_span(hparams, n, as_local)
  layers = range(hparams.num_decoder_layers)
  num_local = len(layers) if as_local else sum(1 for i in layers if layer_heads(hparams, i)[1])
  if not num_local:
    return 0
  return min(block - 1 + num_local * flange, n - 1)


def attention_cost(hparams, length=None):
  """Cost(flops, memory) of the decoder's self-attention for one sequence of `length`."""
  n = length or length_of(hparams)
  block, flange = local_span(hparams, n)
  clusters = hparams.sparsity_cluster_size
  window = hparams.sparsity_cluster_attention_window
  causal_window = _get(hparams, "routing_mode", "topk") == "causal_window"
  flops = memory = 0
  local_logits, logits, scores = attention_logits(n, block, flange, clusters, window,
                                                  causal_window)
  for layer in range(hparams.num_decoder_layers):
    routing, other, depth = layer_heads(hparams, layer)
    flops += other * 4 * depth * local_logits
    memory += other * local_logits
    if routing:
      flops += routing * (4 * depth * logits + 2 * depth * scores)
      memory += routing * (logits + scores)
  return Cost(flops, memory)


def full_attention_cost(hparams, length=None):
  """The cost of the same model with every head full (dense causal)."""
  n = length or length_of(hparams)
  heads = hparams.local_num_heads + hparams.sparsity_cluster_num_heads
  depth = hparams.hidden_size // heads
  logits = hparams.num_decoder_layers * heads * n * n
  return Cost(4 * depth * logits, logits)


def relative_to_full(hparams, length=None):
  """(FLOPs, memory) of the model's attention divided by full attention's."""
  cost, full = attention_cost(hparams, length), full_attention_cost(hparams, length)
  return cost.flops / full.flops, cost.memory / full.memory


# ---------------------------------------------------------------------------------------------
# Memory of one training step per device (one sequence), from a `config`

GIB = 2.0 ** 30
FFN_BACKWARD_ROWS = 1024  # core/layers.py: rows per GEGLU backward chunk
# What a block's backward pass reads but rebuilds instead of keeping (`core/rebuild.py`): the
# norms' outputs and head_dense's output. A re-run block (recompute_layers) keeps them.
REBUILT = ("block input", "head_dense output", "ffn input")


def config(hparams):
  """The memory model's config (a dict of plain numbers) from T2T hparams; full_attention: one
  block of the whole length, no flange (`local_span`)."""
  length = length_of(hparams)
  block, flange = local_span(hparams, length)
  return dict(
      length=length, hidden=hparams.hidden_size, embedding=hparams.embedding_dims,
      filter=hparams.filter_size, layers=hparams.num_decoder_layers,
      local_heads=hparams.local_num_heads, routing_heads=hparams.sparsity_cluster_num_heads,
      skip_first=hparams.sparsity_skip_first, clusters=hparams.sparsity_cluster_size,
      window=hparams.sparsity_cluster_attention_window, block=block, flange=flange,
      max_relative_position=hparams.max_relative_position,
      local_relative=hparams.local_relative, routing_relative=hparams.sparsity_cluster_relative,
      head_dense=hparams.head_dense, ffn=hparams.ffn_layer, ema=hparams.ema,
      share_qk=hparams.share_qk, routing_mode=_get(hparams, "routing_mode", "topk"))


def config_heads(cfg, layer):
  """(routing heads, local heads, depth per head) of decoder layer `layer` of a config."""
  return heads_of_layer(cfg["local_heads"], cfg["routing_heads"], cfg["skip_first"],
                        cfg["hidden"], layer)


def variable_shapes(cfg, vocab):
  """[(name, shape, trainable)] of the decoder-only model's variables."""
  h, e, f = cfg["hidden"], cfg["embedding"], cfg["filter"]
  rel = 2 * cfg["max_relative_position"] + 1
  shapes = [("embeddings/embedding", (vocab, e), True), ("emb_dense/kernel", (e, h), True),
            ("emb_dense/bias", (h,), True)]
  for i in range(cfg["layers"]):
    routing, local, d = config_heads(cfg, i)
    p = "layer_%d/" % i
    shapes += [(p + name, (h, h), True) for name in ("q", "k", "v", "output_transform")]
    if cfg["head_dense"]:
      shapes.append((p + "head_dense", (d, d), True))
    if local and cfg["local_relative"] and cfg["max_relative_position"]:
      shapes += [(p + "local/relative_" + kv, (rel, d), True) for kv in ("keys", "values")]
    if routing:
      if cfg["routing_relative"] and cfg["max_relative_position"]:
        shapes += [(p + "routing/relative_" + kv, (rel, d), True) for kv in ("keys", "values")]
      c = cfg["clusters"]
      shapes += [(p + "routing/means", (routing, c, d), not cfg["ema"]),
                 (p + "routing/ema_count", (routing, c), False),
                 (p + "routing/ema_means", (routing, c, d), False)]
    if cfg["ffn"] == "geglu":
      shapes += [(p + "weight1", (h, f), True), (p + "weight2", (h, f), True),
                 (p + "weight3", (f, h), True)]
    else:
      shapes += [(p + "conv1/kernel", (h, f), True), (p + "conv1/bias", (f,), True),
                 (p + "conv2/kernel", (f, h), True), (p + "conv2/bias", (h,), True)]
    shapes += [(p + "layer_norm_%d/%s" % (j, w), (h,), True) for j in (0, 1)
               for w in ("scale", "bias")]
  if h != e:
    shapes += [("final_dense_1/kernel", (h, e), True), ("final_dense_1/bias", (e,), True)]
  shapes += [("final_dense_2/kernel", (e, vocab), True), ("final_dense_2/bias", (vocab,), True)]
  return shapes


def _size(shape):
  n = 1
  for s in shape:
    n *= s
  return n


def adafactor_slot_elements(shape):
  """T2T Adafactor with beta1 = 0: vr [..., rows] + vc [..., cols] for rank >= 2, else v."""
  if len(shape) >= 2:
    return _size(shape[:-1]) + _size(shape[:-2] + shape[-1:])
  return _size(shape)


def layer_activation_bytes(cfg, i, act, f32=4, recompute_attention=False, rebuild_linear=False):
  """{component: bytes} the backward pass of decoder block i reads (one sequence; a block that
  is not re-run keeps all but REBUILT); recompute_attention: the local heads' attention and the
  routing heads' cluster attention are recomputed (hparam of the same name); rebuild_linear:
  GEGLU keeps x W1 only (hparam ffn_rebuild_linear)."""
  n, h, f = cfg["length"], cfg["hidden"], cfg["filter"]
  routing, local, d = config_heads(cfg, i)
  local_logits, routing_logits, _ = attention_logits(
      n, cfg["block"], cfg["flange"], cfg["clusters"], cfg["window"],
      cfg.get("routing_mode") == "causal_window")
  routing_kept = 3  # q_hat and the gathered q and v
  if recompute_attention:
    local = 0  # no probabilities kept
    routing_kept = 0  # the normalisation and cluster attention re-run from q, k, v
  # (the local heads' key/value memory blocks are rebuilt from k and v in the backward pass)
  return {
      "block input": n * h * act,
      "q, k, v": (3 * h - (routing * d if cfg["share_qk"] else 0)) * n * act,
      "local attention probabilities": local * local_logits * f32,
      "routing q_hat and gathered q, v": routing * routing_kept * n * d * act,
      "routing attention probabilities": (0 if recompute_attention else
                                          routing * routing_logits * f32),
      "heads output": n * h * act,  # head_dense's input (or output_transform's without it)
      "head_dense output": n * h * act if cfg["head_dense"] else 0,
      "post-norm LayerNorm inputs": 2 * n * h * f32,  # the norms keep only their inputs
      "ffn input": n * h * act,
      # GEGLU: x W1, x W2 (x W1 with rebuild_linear); else relu in and out
      "ffn intermediates": (1 if rebuild_linear and cfg["ffn"] == "geglu" else 2) * n * f * act,
  }


def outside_activation_bytes(cfg, vocab, act, f32=4, logits_chunk=0):
  """{component: bytes} kept outside the blocks: embeddings, the output projection's input
  (final_dense_1's output; the last norm's output is rebuilt), logits and softmax (float32)."""
  n = cfg["length"]
  rows = min(n, logits_chunk) if logits_chunk else n
  final = n * cfg["embedding"] * act if cfg["hidden"] != cfg["embedding"] else 0
  return {"embeddings": 2 * n * cfg["embedding"] * act, "final_dense_2 input": final,
          "logits and softmax (float32)": 2 * rows * vocab * f32}


def kept_bytes(layer):
  """Bytes a block that is not re-run keeps: what its backward pass reads but REBUILT."""
  return sum(v for k, v in layer.items() if k not in REBUILT)


def block_checkpoints(cfg, layer, act, keep=""):
  """Bytes a recomputed block keeps for the backward pass: its input, with keep="heads" its
  heads' output, with keep="qkv" also its q, k, v."""
  kept = layer["block input"] + (cfg["length"] * cfg["hidden"] * act if keep else 0)
  if keep == "qkv":
    kept += layer["q, k, v"]
  return kept


def replayed_bytes(cfg, layer, act, keep=""):
  """Bytes of a block being re-run beyond its checkpoints: its FFN backward pass computes x W1
  and x W2 one chunk of FFN_BACKWARD_ROWS rows at a time."""
  chunk = min(1.0, FFN_BACKWARD_ROWS / cfg["length"])
  ffn = layer["ffn intermediates"]
  return (sum(layer.values()) - block_checkpoints(cfg, layer, act, keep) - ffn +
          int(ffn * chunk))


def step_total(params, optimizer, activations):
  """Bytes of a training step: the variables, one gradient each, the optimizer's and k-means'
  state and the kept activations."""
  return 2 * params + optimizer + activations


def step_memory(cfg, vocab, recompute=False, bf16=False, logits_chunk=0,
                recompute_attention=False, keep="", rebuild_linear=False):
  """Bytes per device of one training step of one sequence: {params, grads, optimizer
  (adafactor + kmeans), block_activations, outside_activations, activations, checkpoints,
  one_layer, total, parameters (count)}."""
  if keep and not recompute_attention:
    raise ValueError("keep=%r (recompute_keep_%s) takes effect only with recompute_attention"
                     % (keep, keep))
  act = 2 if bf16 else 4
  shapes = variable_shapes(cfg, vocab)
  params = sum(_size(s) for _, s, trainable in shapes if trainable) * 4
  slots = sum(adafactor_slot_elements(s) for _, s, trainable in shapes if trainable) * 4
  kmeans = sum(_size(s) for _, s, trainable in shapes if not trainable) * 4
  # rebuild_linear only where blocks are not re-run (a re-run block's FFN computes x W1 and
  # x W2 in chunks anyway)
  layers = [layer_activation_bytes(cfg, i, act, recompute_attention=recompute_attention,
                                   rebuild_linear=rebuild_linear and not recompute)
            for i in range(cfg["layers"])]
  outside = sum(outside_activation_bytes(cfg, vocab, act, logits_chunk=logits_chunk).values())
  checkpoints = sum(block_checkpoints(cfg, layer, act, keep) for layer in layers)
  one_layer = max(replayed_bytes(cfg, layer, act, keep) for layer in layers)
  blocks = checkpoints + one_layer if recompute else sum(kept_bytes(layer) for layer in layers)
  activations = blocks + outside
  return dict(params=params, grads=params, optimizer=slots + kmeans, adafactor=slots,
              kmeans=kmeans, block_activations=blocks, outside_activations=outside,
              activations=activations, checkpoints=checkpoints if recompute else 0,
              one_layer=one_layer, total=step_total(params, slots + kmeans, activations),
              parameters=params // 4)
