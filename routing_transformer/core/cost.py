"""The model's cost from its hparams (no TensorFlow): attention FLOPs and memory, the local reach,
a training step's memory per device. Per head and layer (masked entries counted): local n (b + m)
logits (block b, flange m; full: n^2), routing k w^2 (k clusters of window w; causal_window: n 2w)
+ n k centroid scores; FLOPs 4 d per logit, 2 d per score; memory: attention weights, in floats.
"""
import collections
import math

Cost = collections.namedtuple("Cost", ["flops", "memory"])
GIB = 2.0 ** 30


def _get(hparams, name, default=None):
  getter = getattr(hparams, "get", None)
  return getter(name, default) if getter else getattr(hparams, name, default)


def length_of(hparams):
  return _get(hparams, "max_target_length") or hparams.max_length


def local_span(hparams, length, as_local=False):
  """(block, flange) of the non-routing heads (`layers.local_span`); as_local: ignore full."""
  full = _get(hparams, "full_attention", False) and not as_local
  return (length, 0) if full else (hparams.query_shape[0], hparams.memory_flange[0])


def heads_of_layer(local, routing, skip_first, hidden, layer):
  """(routing heads, other heads, depth per head) of decoder layer `layer` (layers.head_counts)."""
  routing_here = routing if layer >= skip_first else 0
  return routing_here, local + routing - routing_here, hidden // (local + routing)


def layer_heads(hparams, layer):
  """(routing heads, other heads, depth per head) of decoder layer `layer`."""
  return heads_of_layer(hparams.local_num_heads, hparams.sparsity_cluster_num_heads,
                        hparams.sparsity_skip_first, hparams.hidden_size, layer)


def attention_logits(length, block, flange, clusters, window, causal_window=False):
  """(local head logits, routing head logits, routing head centroid scores)."""
  routing = length * 2 * window if causal_window else clusters * window * window
  return length * (block + flange), routing, length * clusters


def local_receptive_field(hparams, length=None, as_local=False):
  """How far back the non-routing heads reach through the decoder: (b - 1) + L m (L layers with
  such heads), at most n - 1; `as_local`: that of the model's all-local twin."""
  n = length or length_of(hparams)
  block, flange = local_span(hparams, n, as_local)
  layers = range(hparams.num_decoder_layers)
  num_local = len(layers) if as_local else sum(1 for i in layers if layer_heads(hparams, i)[1])
  return min(block - 1 + num_local * flange, n - 1) if num_local else 0


def attention_cost(hparams, length=None):
  """Cost(flops, memory) of the decoder's self-attention for one sequence of `length`."""
  n = length or length_of(hparams)
  block, flange = local_span(hparams, n)
  causal_window = _get(hparams, "routing_mode", "topk") == "causal_window"
  local_logits, logits, scores = attention_logits(
      n, block, flange, hparams.sparsity_cluster_size, hparams.sparsity_cluster_attention_window,
      causal_window)
  flops = memory = 0
  for layer in range(hparams.num_decoder_layers):
    routing, other, depth = layer_heads(hparams, layer)
    flops += other * 4 * depth * local_logits + routing * (4 * depth * logits + 2 * depth * scores)
    memory += other * local_logits + routing * (logits + scores)
  return Cost(flops, memory)


def full_attention_cost(hparams, length=None):
  """The cost of the same model with every head full (dense causal)."""
  n = length or length_of(hparams)
  heads = hparams.local_num_heads + hparams.sparsity_cluster_num_heads
  logits = hparams.num_decoder_layers * heads * n * n
  return Cost(4 * (hparams.hidden_size // heads) * logits, logits)


def relative_to_full(hparams, length=None):
  """(FLOPs, memory) of the model's attention divided by full attention's."""
  cost, full = attention_cost(hparams, length), full_attention_cost(hparams, length)
  return cost.flops / full.flops, cost.memory / full.memory


# --- Memory of one training step per device (one sequence), from a `config` ---------------------

# [n, filter] tensors the FFN keeps for its gradients: GEGLU x W1 and x W2 (the activation and
# output projection are recomputed, `layers.ffn`); dense_relu_dense relu's output.
FFN_KEPT = {"geglu": 2, "dense_relu_dense": 1}


def config(hparams):
  """The memory model's config (plain numbers) from T2T hparams."""
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
      share_qk=hparams.share_qk, routing_mode=_get(hparams, "routing_mode", "topk"),
      relu_dropout=hparams.relu_dropout)


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


def adafactor_slot_elements(shape):
  """T2T Adafactor with beta1 = 0: vr [..., rows] + vc [..., cols] for rank >= 2, else v."""
  if len(shape) >= 2:
    return math.prod(shape[:-1]) + math.prod(shape[:-2] + shape[-1:])
  return math.prod(shape)


def layer_activation_bytes(cfg, i, act, f32=4, recompute_attention=False, ffn_chunk=0):
  """{component: bytes} decoder block i keeps for the gradients (one sequence), `act` bytes per
  activation; recompute_attention: no probabilities, q_hat or gathered clusters; ffn_chunk
  (ffn_chunk_size): no FFN intermediates (each chunk is re-run from the FFN input)."""
  n, h, f = cfg["length"], cfg["hidden"], cfg["filter"]
  routing, local, d = config_heads(cfg, i)
  local_logits, routing_logits, _ = attention_logits(
      n, cfg["block"], cfg["flange"], cfg["clusters"], cfg["window"],
      cfg.get("routing_mode") == "causal_window")
  kept = 0 if recompute_attention else 1
  return {
      "block input": n * h * act,  # the q, k, v products' input
      "q, k, v": (3 * h - (routing * d if cfg["share_qk"] else 0)) * n * act,
      "local attention probabilities": kept * local * local_logits * f32,
      "routing q_hat and gathered q, v": kept * routing * 3 * n * d * act,
      "routing attention probabilities": kept * routing * routing_logits * f32,
      "heads output": n * h * act,  # head_dense's input (output_transform's without it)
      "head_dense output": n * h * act if cfg["head_dense"] else 0,
      "post-norm LayerNorm inputs": 2 * n * h * f32,  # the residual sums (the norms' kept inputs)
      "ffn input": n * h * act,
      # relu_dropout: also the dropped hidden units (W3's input) and the keep mask (bool)
      "ffn intermediates": 0 if ffn_chunk else (
          FFN_KEPT[cfg["ffn"]] * n * f * act +
          (n * f * (act + 1) if cfg.get("relu_dropout") else 0)),
  }


def outside_activation_bytes(cfg, vocab, act, f32=4, logits_chunk=0):
  """{component: bytes} kept outside the blocks; logits of `logits_chunk` positions (0: all)."""
  n, e = cfg["length"], cfg["embedding"]
  rows = min(n, logits_chunk) if logits_chunk else n
  final_1 = n * cfg["hidden"] * act if cfg["hidden"] != e else 0
  return {"embeddings": 2 * n * e * act, "final_dense_2 input": n * e * act + final_1,
          "logits and softmax (float32)": 2 * rows * vocab * f32}


def step_total(params, optimizer, activations):
  """Bytes of a training step: variables, their gradients, optimizer state, activations."""
  return 2 * params + optimizer + activations


def step_memory(cfg, vocab, recompute=False, bf16=False, logits_chunk=0,
                recompute_attention=False, ffn_chunk=0):
  """Bytes per device of a training step of one sequence, by component (dict, and `total`);
  recompute (recompute_layers): block inputs (checkpoints) + one re-run block (one_layer)."""
  act = 2 if bf16 else 4
  shapes = variable_shapes(cfg, vocab)
  params = sum(math.prod(s) for _, s, trainable in shapes if trainable) * 4
  slots = sum(adafactor_slot_elements(s) for _, s, trainable in shapes if trainable) * 4
  kmeans = sum(math.prod(s) for _, s, trainable in shapes if not trainable) * 4
  layers = [layer_activation_bytes(cfg, i, act, recompute_attention=recompute_attention,
                                   ffn_chunk=ffn_chunk) for i in range(cfg["layers"])]
  outside = sum(outside_activation_bytes(cfg, vocab, act, logits_chunk=logits_chunk).values())
  # kept per block: its input, the previous block's float32 residual sum before its last norm
  checkpoints = sum(layer["post-norm LayerNorm inputs"] // 2 for layer in layers)
  one_layer = max(sum(layer.values()) - layer["block input"] for layer in layers)
  blocks = checkpoints + one_layer if recompute else sum(sum(x.values()) for x in layers)
  activations = blocks + outside
  return dict(params=params, grads=params, optimizer=slots + kmeans, adafactor=slots,
              kmeans=kmeans, block_activations=blocks, outside_activations=outside,
              activations=activations, checkpoints=checkpoints if recompute else 0,
              one_layer=one_layer, total=step_total(params, slots + kmeans, activations),
              parameters=params // 4)
