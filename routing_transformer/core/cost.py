"""Attention cost and reach of a model, computed from its hparams (no TensorFlow).

Per head and decoder layer, with n positions and d = hidden / heads:
  local (blocked) head   n (b + m) logits         (block b = query_shape, flange m)
  full head              n^2 logits               (full_attention: one block of n, no flange)
  routing head, "topk"   k w^2 logits + n k centroid scores   (k clusters, window w)
  routing, causal_window n 2w logits + n k centroid scores    (blocks of w in cluster order)
FLOPs: 4 d per logit (q.k and the weighted sum of v, a multiply-add each) plus 2 d per centroid
score; memory: the attention weights held per layer (logits + centroid scores), in floats.
Counts are of what the implementation computes (masked entries included).
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


def layer_heads(hparams, layer):
  """(routing heads, other heads, depth per head) of decoder layer `layer`."""
  heads = hparams.local_num_heads + hparams.sparsity_cluster_num_heads
  routing = hparams.sparsity_cluster_num_heads if layer >= hparams.sparsity_skip_first else 0
  return routing, heads - routing, hparams.hidden_size // heads


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
  for layer in range(hparams.num_decoder_layers):
    routing, other, depth = layer_heads(hparams, layer)
    local_logits = n * (block + flange)
    flops += other * 4 * depth * local_logits
    memory += other * local_logits
    if routing:
      logits = n * 2 * window if causal_window else clusters * window * window
      flops += routing * (4 * depth * logits + 2 * depth * n * clusters)
      memory += routing * (logits + n * clusters)
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
