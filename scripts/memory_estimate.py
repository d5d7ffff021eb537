"""Per-device memory of one training step of the TF (T2T) model, by arithmetic (no TensorFlow):
the table of `routing_transformer.core.cost.step_memory`.

For `pg19_local_cluster8k` (the values of hparams/sets.py, checked against the registry by
tests/test_memory_estimate.py) on one device holding one sequence (batch_size = length tokens),
with and without `recompute_layers` and with float32 or bfloat16 activations:

  params      trainable variables (float32)
  grads       one float32 gradient per trainable variable
  optimizer   Adafactor slots (beta1 = 0: factored second moments vr + vc for matrices, v for
              vectors) and the k-means state (means, ema_count, ema_means)
  activations the forward tensors TF's gradients read (`cost.layer_activation_bytes`, per op,
              no fusion): per block its input, q/k/v (with share_qk without the routing heads'
              keys), attention probabilities (the local heads' key/value memory blocks are
              rebuilt from k and v), the heads' and head_dense's outputs, both post-norm
              LayerNorms' float32 inputs, the FFN input and GEGLU's two [n, filter] products
              (x W1, x W2: the activation is recomputed in the backward pass);
              outside the blocks the embeddings, the output projection's input and the float32
              logits and softmax (with --logits_chunk_size those of one chunk of positions).
              recompute_layers: the block inputs (checkpoints) + one re-run block's tensors.
              --recompute_attention: no attention probabilities, routing q_hat or gathered
              clusters (the attention is re-run from q, k, v); --ffn_chunk_size: no FFN
              intermediates (each chunk of the FFN is re-run from its input).
  total       params + grads + optimizer + activations

bfloat16 activations: matmul inputs/outputs and GEGLU in bfloat16 (2 bytes), attention
probabilities, LayerNorm statistics and the logits/softmax in float32 (the softmax, LayerNorm and
loss stay float32). Boolean masks, scalars and transient buffers (the gradient of the tensor being
differentiated, XLA scratch) are not counted: an estimate of what stays alive, not a bound.

Usage: python scripts/memory_estimate.py [--vocab 32768] [--length 8192] [--logits_chunk_size 0]
                                         [--recompute_attention] [--ffn_chunk_size 0]
       python scripts/memory_estimate.py --paper_sets
--paper_sets: every paper set (read from the registry: imports T2T) in GiB at its max_length,
with the switches added in the order chunk (logits_chunk_size=1024), ffn (ffn_chunk_size=2048),
att (recompute_attention), layers (recompute_layers), then bfloat16 activations, and for 16 / 24
/ 40 GiB devices the first of these that leaves 15% of the device free ("-": the set's dropout
refuses the switch).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from routing_transformer.core import cost  # noqa: E402  pylint: disable=wrong-import-position

GIB = cost.GIB
# hparams/sets.py: pg19_local_cluster8k (and sparse_transformer_local's defaults it keeps), as
# cost.config makes it from the registered set (tests/test_memory_estimate.py checks it).
PG19_LOCAL_CLUSTER8K = dict(
    length=8192, hidden=1032, embedding=1032, filter=4096, layers=22, local_heads=6,
    routing_heads=2, skip_first=21, clusters=16, window=512, block=256, flange=256,
    max_relative_position=513, local_relative=True, routing_relative=True, head_dense=True,
    ffn="geglu", ema=True, share_qk=True, routing_mode="topk", relu_dropout=0.0)
VOCAB = 32768  # the released vocabulary, vocab.pg19_length8k.32768.subwords


PAPER_SETS = ("pg19_local_cluster8k", "pg19_local8k", "enwik8_local8k", "enwik8_local12k",
              "enwik8_local_cluster8k", "enwik8_local_cluster12k", "wikitext103_local4k",
              "wikitext103_local_cluster4k", "wikitext103_local_cluster1k", "imagenet_local1d",
              "imagenet_local_cluster", "cifar10_local1d", "cifar10_local_cluster")
VOCABS = {"pg19": VOCAB, "wikitext103": 267735, "enwik8": 256, "imagenet": 256, "cifar10": 256}
DEVICES_GIB = (16, 24, 40)


def switch_steps(hp):
  """[(label, step_memory kwargs)] in the order the table adds them, up to the first refused:
  ffn_chunk_size refuses relu dropout, recompute_attention attention dropout, recompute_layers
  also random_routing (and needs layer_prepostprocess_dropout=0, which the user sets)."""
  steps = [("none", {}), ("chunk", dict(logits_chunk=1024))]
  kwargs = dict(logits_chunk=1024)
  for label, switch, refused in (
      ("chunk + ffn", dict(ffn_chunk=2048), hp.relu_dropout),
      ("chunk + ffn + att", dict(recompute_attention=True), hp.attention_dropout),
      ("chunk + ffn + att + layers", dict(recompute=True), hp.get("random_routing", False))):
    if refused:
      break
    kwargs = dict(kwargs, **switch)
    steps.append((label, kwargs))
  label, kwargs = steps[-1]
  steps.append((("" if label == "none" else label + " + ") + "bfloat16", dict(kwargs, bf16=True)))
  return steps


COLUMNS = ("none", "chunk + ffn", "chunk + ffn + att", "chunk + ffn + att + layers")


def paper_sets_table():
  """The markdown table of --paper_sets."""
  import hparams  # pylint: disable=g-import-not-at-top,unused-import
  from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
  lines = ["| set | params | none | chunk + ffn | + att | + layers | " +
           " | ".join("%d GiB" % d for d in DEVICES_GIB) + " |", "|---" * 9 + "|"]
  for name in PAPER_SETS:
    hp = registry.hparams(name)
    cfg, vocab = cost.config(hp), VOCABS[name.split("_")[0]]
    estimates = [(label, cost.step_memory(cfg, vocab, **kwargs))
                 for label, kwargs in switch_steps(hp)]
    totals = [(label, e["total"] / GIB) for label, e in estimates]
    by_label = dict(totals)
    fits = [next((label for label, total in totals if total <= 0.85 * device),
                 "does not fit") for device in DEVICES_GIB]
    lines.append("| `%s` | %.1fM | %s | %s |" % (
        name, estimates[0][1]["parameters"] / 1e6,
        " | ".join("%.1f" % by_label[c] if c in by_label else "-" for c in COLUMNS),
        " | ".join(fits)))
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--vocab", type=int, default=VOCAB)
  parser.add_argument("--length", type=int, default=PG19_LOCAL_CLUSTER8K["length"])
  parser.add_argument("--logits_chunk_size", type=int, default=0,
                      help="positions per chunk of the output projection + loss (0: whole)")
  parser.add_argument("--recompute_attention", action="store_true",
                      help="the attention re-run from q, k, v in the backward pass")
  parser.add_argument("--ffn_chunk_size", type=int, default=0,
                      help="positions per chunk of the feed-forward block (0: whole)")
  parser.add_argument("--paper_sets", action="store_true",
                      help="the table of every paper set and the switches that fit a device")
  args = parser.parse_args(argv)
  if args.paper_sets:
    print(paper_sets_table())
    return
  cfg = dict(PG19_LOCAL_CLUSTER8K, length=args.length)
  print("pg19_local_cluster8k, one sequence of %d tokens per device, vocab %d (%s parameters), "
        "logits_chunk_size %d, recompute_attention %s, ffn_chunk_size %d" % (
            cfg["length"], args.vocab,
            "{:,}".format(cost.step_memory(cfg, args.vocab)["parameters"]),
            args.logits_chunk_size, args.recompute_attention, args.ffn_chunk_size))
  print("\n| recompute_layers | activations | params | grads | Adafactor + k-means | "
        "activations (blocks + outside) | total GiB |\n|---|---|---|---|---|---|---|")
  for recompute in (False, True):
    for bf16 in (False, True):
      e = cost.step_memory(cfg, args.vocab, recompute, bf16, args.logits_chunk_size,
                           args.recompute_attention, args.ffn_chunk_size)
      print("| %s | %s | %.2f | %.2f | %.3f | %.2f (%.2f + %.2f) | **%.2f** |" % (
          recompute, "bfloat16" if bf16 else "float32", e["params"] / GIB, e["grads"] / GIB,
          e["optimizer"] / GIB, e["activations"] / GIB, e["block_activations"] / GIB,
          e["outside_activations"] / GIB, e["total"] / GIB))
  print("\nOne block's activations (float32):")
  for name, value in cost.layer_activation_bytes(
      cfg, cfg["layers"] - 1, 4, recompute_attention=args.recompute_attention,
      ffn_chunk=args.ffn_chunk_size).items():
    print("  %-40s %8.1f MiB" % (name, value / 2.0 ** 20))


if __name__ == "__main__":
  main()
