"""Per-device memory of one training step of the TF (T2T) model, by arithmetic (no TensorFlow).

For `pg19_local_cluster8k` (the values of hparams/sets.py, checked against the registry by
tests/test_memory_estimate.py) on one device holding one sequence (batch_size = length tokens),
with and without `recompute_layers` and with float32 or bfloat16 activations:

  params      trainable variables (float32)
  grads       one float32 gradient per trainable variable
  optimizer   Adafactor slots (beta1 = 0: factored second moments vr + vc for matrices, v for
              vectors) and the k-means state (means, ema_count, ema_means)
  activations the forward tensors the backward pass reads, counted per op as our TF graph
              saves them (no fusion): per block q/k/v (with share_qk without the routing heads'
              keys, which are not computed; the local heads' key/value memory blocks are
              rebuilt from k and v), attention probabilities, the heads' output (head_dense's
              input), both post-norm LayerNorms' float32 inputs (the residual sums) and GEGLU's
              two matmul outputs x W1 and x W2 (its custom gradient recomputes gelu and the
              product); outside the blocks the embeddings and the logits over the vocabulary
              (logits and the softmax the cross-entropy gradient reads, float32; with
              --logits_chunk_size those of one chunk of positions). REBUILT: the norms'
              outputs (the block input, the FFN input, the output projection's input) and
              head_dense's output are rebuilt in the backward pass (`core/rebuild.py`), not kept.
              With recompute: the block inputs (checkpoints) + one block's other activations (the
              block being re-run, which rebuilds nothing, whose FFN backward pass computes x W1
              and x W2 for 1,024 rows at a time) + the embeddings and logits. With
              --recompute_attention the local heads keep no probabilities and the routing heads
              no q_hat, gathered clusters or probabilities (q, k, v are counted already).
              --recompute_keep heads / qkv (recompute_keep_heads / recompute_keep_qkv, with
              recompute_attention): each block also keeps its heads' output (and with qkv its
              q, k, v), which the re-run block then does not hold again.
              --ffn_rebuild_linear (hparam of the same name): a block that is not re-run keeps
              x W1 but not x W2 (its FFN backward pass computes x W2 again in chunks).
  total       params + grads + optimizer + activations

bfloat16 activations: matmul inputs/outputs and GEGLU in bfloat16 (2 bytes), attention
probabilities, LayerNorm statistics and the logits/softmax in float32 (the softmax, LayerNorm and
loss stay float32). Boolean masks, scalars and transient buffers (the gradient of the tensor being
differentiated, XLA scratch) are not counted: an estimate of what stays alive, not a bound.

Usage: python scripts/memory_estimate.py [--vocab 32768] [--length 8192] [--logits_chunk_size 0]
                                         [--recompute_attention [--recompute_keep heads|qkv]]
                                         [--ffn_rebuild_linear]
"""
import argparse

GIB = 2.0 ** 30

# hparams/sets.py: pg19_local_cluster8k (and sparse_transformer_local's defaults it keeps).
PG19_LOCAL_CLUSTER8K = dict(
    length=8192, hidden=1032, embedding=1032, filter=4096, layers=22, local_heads=6,
    routing_heads=2, skip_first=21, clusters=16, window=512, block=256, flange=256,
    max_relative_position=513, local_relative=True, routing_relative=True, head_dense=True,
    ffn="geglu", ema=True, share_qk=True)
VOCAB = 32768  # the released vocabulary, vocab.pg19_length8k.32768.subwords
FFN_BACKWARD_ROWS = 1024  # routing_transformer/core/layers.py: rows per GEGLU backward chunk
# What a block's backward pass reads but rebuilds instead of keeping (`core/rebuild.py`): the
# norms' outputs and head_dense's output. A re-run block (recompute_layers) keeps them.
REBUILT = ("block input", "head_dense output", "ffn input")


def config_from_hparams(hp):
  """The estimate's config from T2T hparams (for the test against the registry);
  full_attention: one block of the whole length, no flange (as layers.local_span)."""
  length = hp.max_target_length or hp.max_length
  full = hp.get("full_attention", False)
  return dict(
      length=length, hidden=hp.hidden_size,
      embedding=hp.embedding_dims, filter=hp.filter_size, layers=hp.num_decoder_layers,
      local_heads=hp.local_num_heads, routing_heads=hp.sparsity_cluster_num_heads,
      skip_first=hp.sparsity_skip_first, clusters=hp.sparsity_cluster_size,
      window=hp.sparsity_cluster_attention_window, block=length if full else hp.query_shape[0],
      flange=0 if full else hp.memory_flange[0], max_relative_position=hp.max_relative_position,
      local_relative=hp.local_relative, routing_relative=hp.sparsity_cluster_relative,
      head_dense=hp.head_dense, ffn=hp.ffn_layer, ema=hp.ema, share_qk=hp.share_qk)


def layer_heads(cfg, i):
  """(routing heads, local heads, depth per head) of decoder layer i (as layers.head_counts)."""
  heads = cfg["local_heads"] + cfg["routing_heads"]
  routing = cfg["routing_heads"] if i >= cfg["skip_first"] else 0
  return routing, heads - routing, cfg["hidden"] // heads


def variable_shapes(cfg, vocab):
  """[(name, shape, trainable)] of the decoder-only model's variables."""
  h, e, f = cfg["hidden"], cfg["embedding"], cfg["filter"]
  rel = 2 * cfg["max_relative_position"] + 1
  shapes = [("embeddings/embedding", (vocab, e), True), ("emb_dense/kernel", (e, h), True),
            ("emb_dense/bias", (h,), True)]
  for i in range(cfg["layers"]):
    routing, local, d = layer_heads(cfg, i)
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
  """{component: bytes} the backward pass of decoder block i reads (one sequence; a block
  that is not re-run keeps all but REBUILT);
  recompute_attention: the local heads' attention and the routing heads' cluster attention are
  recomputed (hparam of the same name); rebuild_linear: GEGLU keeps x W1 only (hparam
  ffn_rebuild_linear)."""
  n, h, f = cfg["length"], cfg["hidden"], cfg["filter"]
  routing, local, d = layer_heads(cfg, i)
  routing_kept = 3  # q_hat and the gathered q and v
  if recompute_attention:
    local = 0  # no probabilities kept
    routing_kept = 0  # the normalisation and cluster attention re-run from q, k, v
  memory_width = cfg["flange"] + cfg["block"]  # causal: the block and its flange
  # (the key/value memory blocks are rebuilt from k and v in the backward pass: not kept)
  out = {
      "block input": n * h * act,
      "q, k, v": (3 * h - (routing * d if cfg["share_qk"] else 0)) * n * act,
      "local attention probabilities": local * n * memory_width * f32,
      "routing q_hat and gathered q, v": routing * routing_kept * n * d * act,
      "routing attention probabilities": (0 if recompute_attention else
                                          routing * cfg["clusters"] * cfg["window"] ** 2 * f32),
      "heads output": n * h * act,  # head_dense's input (or output_transform's without it)
      "head_dense output": n * h * act if cfg["head_dense"] else 0,
      "post-norm LayerNorm inputs": 2 * n * h * f32,  # the norms keep only their inputs
      "ffn input": n * h * act,
      # GEGLU: x W1, x W2 (x W1 with rebuild_linear); else relu in and out
      "ffn intermediates": (1 if rebuild_linear and cfg["ffn"] == "geglu" else 2) * n * f * act,
  }
  return out


def outside_activation_bytes(cfg, vocab, act, f32=4, logits_chunk=0):
  n = cfg["length"]
  rows = min(n, logits_chunk) if logits_chunk else n
  # The output projection's input is the last norm's output (rebuilt), or with hidden !=
  # embedding final_dense_1's output.
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


def estimate(cfg, vocab=VOCAB, recompute=False, bf16=False, logits_chunk=0,
             recompute_attention=False, keep="", rebuild_linear=False):
  """Bytes per device of one training step; see the module docstring."""
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
  # The block being re-run: everything it saves but its checkpoints.
  one_layer = max(replayed_bytes(cfg, layer, act, keep) for layer in layers)
  if recompute:
    blocks = checkpoints + one_layer
  else:
    blocks = sum(kept_bytes(layer) for layer in layers)
  activations = blocks + outside
  return dict(params=params, grads=params, optimizer=slots + kmeans, adafactor=slots,
              kmeans=kmeans, block_activations=blocks, outside_activations=outside,
              activations=activations, checkpoints=checkpoints if recompute else 0,
              one_layer=one_layer, total=2 * params + slots + kmeans + activations,
              parameters=params // 4)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--vocab", type=int, default=VOCAB)
  parser.add_argument("--length", type=int, default=PG19_LOCAL_CLUSTER8K["length"])
  parser.add_argument("--logits_chunk_size", type=int, default=0,
                      help="positions per chunk of the output projection + loss (0: whole)")
  parser.add_argument("--recompute_attention", action="store_true",
                      help="the local heads' attention recomputed in the backward pass")
  parser.add_argument("--recompute_keep", choices=["heads", "qkv"], default="",
                      help="with --recompute_attention: recompute_keep_heads / recompute_keep_qkv")
  parser.add_argument("--ffn_rebuild_linear", action="store_true",
                      help="GEGLU keeps x W1 only, computing x W2 again in its backward pass")
  args = parser.parse_args(argv)
  if args.recompute_keep and not args.recompute_attention:
    parser.error("--recompute_keep takes effect only with --recompute_attention")
  cfg = dict(PG19_LOCAL_CLUSTER8K, length=args.length)
  print("pg19_local_cluster8k, one sequence of %d tokens per device, vocab %d (%s parameters), "
        "logits_chunk_size %d, recompute_attention %s%s%s" % (
            cfg["length"], args.vocab, "{:,}".format(estimate(cfg, args.vocab)["parameters"]),
            args.logits_chunk_size, args.recompute_attention,
            ", recompute_keep_" + args.recompute_keep if args.recompute_keep else "",
            ", ffn_rebuild_linear" if args.ffn_rebuild_linear else ""))
  print("\n| recompute_layers | activations | params | grads | Adafactor + k-means | "
        "activations (blocks + outside) | total GiB |\n|---|---|---|---|---|---|---|")
  for recompute in (False, True):
    for bf16 in (False, True):
      e = estimate(cfg, args.vocab, recompute, bf16, args.logits_chunk_size,
                   args.recompute_attention, args.recompute_keep, args.ffn_rebuild_linear)
      print("| %s | %s | %.2f | %.2f | %.3f | %.2f (%.2f + %.2f) | **%.2f** |" % (
          recompute, "bfloat16" if bf16 else "float32", e["params"] / GIB, e["grads"] / GIB,
          e["optimizer"] / GIB, e["activations"] / GIB, e["block_activations"] / GIB,
          e["outside_activations"] / GIB, e["total"] / GIB))
  print("\nOne block's activations (float32):")
  for name, value in layer_activation_bytes(cfg, cfg["layers"] - 1, 4,
                                            recompute_attention=args.recompute_attention,
                                            rebuild_linear=args.ffn_rebuild_linear).items():
    rebuilt = "  (rebuilt without recompute_layers)" if name in REBUILT else ""
    print("  %-40s %8.1f MiB%s" % (name, value / 2.0 ** 20, rebuilt))


if __name__ == "__main__":
  main()
