"""The training-step memory of core/cost.py (scripts/memory_estimate.py prints it): the script's
config is the registered set, the variables are the model's, the GEGLU block keeps what TF's
gradients read, and the totals add up (recompute keeps the checkpoints and one block; bfloat16
halves the rest; recompute_attention drops the local heads' probabilities and the routing heads'
gathered clusters and probabilities; the local heads' memory blocks are never kept)."""
import os
import sys

import numpy as np
import pytest
import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "scripts"))
import memory_estimate  # pylint: disable=g-import-not-at-top,wrong-import-position
from routing_transformer.core import cost  # pylint: disable=g-import-not-at-top,wrong-import-position
from test_model import EVAL, VOCAB, build, random_targets, small_hparams  # pylint: disable=g-import-not-at-top,wrong-import-position

tf1 = tf.compat.v1
VOCAB8K = memory_estimate.VOCAB


def test_config_is_the_registered_set():
  import hparams  # pylint: disable=g-import-not-at-top,unused-import
  from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
  hp = registry.hparams("pg19_local_cluster8k")
  assert cost.config(hp) == memory_estimate.PG19_LOCAL_CLUSTER8K


def test_variables_are_the_models(rng):
  hp = small_hparams()
  cfg = cost.config(hp)
  with tf.Graph().as_default():
    build(hp, EVAL, {"targets": random_targets(rng)})
    built = {True: [v.shape.as_list() for v in tf1.trainable_variables()],
             False: [v.shape.as_list() for v in tf1.global_variables()
                     if v not in tf1.trainable_variables()]}
  for trainable in (True, False):
    ours = [list(s) for _, s, t in cost.variable_shapes(cfg, VOCAB) if t == trainable]
    assert sorted(ours) == sorted(built[trainable])


@pytest.mark.parametrize("bf16", [False, True])
def test_totals_add_up(bf16):
  cfg = memory_estimate.PG19_LOCAL_CLUSTER8K
  plain = cost.step_memory(cfg, VOCAB8K, recompute=False, bf16=bf16)
  recompute = cost.step_memory(cfg, VOCAB8K, recompute=True, bf16=bf16)
  act = 2 if bf16 else 4
  for e in (plain, recompute):
    assert e["total"] == e["params"] + e["grads"] + e["optimizer"] + e["activations"]
    assert e["activations"] == e["block_activations"] + e["outside_activations"]
    assert e["params"] == e["grads"] == 4 * e["parameters"]
  layers = [cost.layer_activation_bytes(cfg, i, act) for i in range(cfg["layers"])]
  # a block that is not re-run keeps everything its ops' gradients read (GEGLU: x W1, x W2)
  assert plain["block_activations"] == sum(sum(layer.values()) for layer in layers)
  n, h, f = cfg["length"], cfg["hidden"], cfg["filter"]
  assert all(layer["ffn intermediates"] == 2 * n * f * act for layer in layers)
  # each block keeps its input: the float32 residual sum before the previous block's last norm
  checkpoints = cfg["layers"] * n * h * 4
  assert recompute["checkpoints"] == checkpoints
  assert recompute["block_activations"] == checkpoints + recompute["one_layer"]
  # the re-run block holds all it keeps without recompute (no chunks of rows)
  assert recompute["one_layer"] == max(sum(x.values()) - x["block input"] for x in layers)
  assert recompute["outside_activations"] == plain["outside_activations"]
  # (bfloat16: the float32 checkpoints are twice the activations' width)
  assert recompute["block_activations"] < plain["block_activations"] / (8 if bf16 else 10)


def test_the_output_projection_keeps_its_input_and_final_dense_1s():
  """hidden == embedding: the projection reads the last norm's output [n, embedding]; else also
  final_dense_1 reads it [n, hidden]."""
  cfg = memory_estimate.PG19_LOCAL_CLUSTER8K
  same = cost.outside_activation_bytes(cfg, 32768, 4)
  other = cost.outside_activation_bytes(dict(cfg, embedding=512), 32768, 4)
  assert same["final_dense_2 input"] == 8192 * 1032 * 4
  assert other["final_dense_2 input"] == 8192 * 512 * 4 + 8192 * 1032 * 4
  chunked = cost.outside_activation_bytes(cfg, 32768, 4, logits_chunk=1024)
  assert chunked["logits and softmax (float32)"] == 2 * 1024 * 32768 * 4


def test_geglu_keeps_what_tfs_gradients_read():
  """The forward [n, filter] tensors the gradient ops of the training GEGLU block
  (`layers.ffn`: gelu(x W1) * (x W2)) W3) read, counted on the graph: cost.FFN_KEPT["geglu"]."""
  import types  # pylint: disable=g-import-not-at-top
  from routing_transformer.core import layers  # pylint: disable=g-import-not-at-top
  n, h, f = 8, 4, 16
  hparams = types.SimpleNamespace(ffn_layer="geglu", filter_size=f, hidden_size=h,
                                  relu_dropout=0.0, ffn_chunk_size=0)
  with tf.Graph().as_default():
    x = tf.constant(np.ones((n, h), np.float32))
    y = layers.ffn(x, hparams, train=True)
    grads = tf1.gradients(tf.reduce_sum(y), [x] + tf1.trainable_variables())
    seen, stack, read = set(), [g.op for g in grads], set()
    while stack:
      op = stack.pop()
      if op in seen:
        continue
      seen.add(op)
      for t in op.inputs:
        stack.append(t.op)
        if "gradients" in op.name and "gradients" not in t.op.name:
          if t.shape.as_list() == [n, f]:
            read.add(t.name)
  assert len(read) == cost.FFN_KEPT["geglu"], sorted(read)


def test_bfloat16_halves_only_the_bfloat16_tensors():
  cfg = memory_estimate.PG19_LOCAL_CLUSTER8K
  f32 = cost.layer_activation_bytes(cfg, 0, 4)
  b16 = cost.layer_activation_bytes(cfg, 0, 2)
  for name in f32:
    kept = "probabilities" in name or "LayerNorm" in name
    np.testing.assert_equal(b16[name], f32[name] if kept else f32[name] / 2)
  assert (cost.step_memory(cfg, VOCAB8K, bf16=True)["params"] ==
          cost.step_memory(cfg, VOCAB8K)["params"])


def test_recompute_attention_drops_the_attention_probabilities():
  """pg19_local_cluster8k's first block (8 local heads of 129): the probabilities 8 x 8192 x 512
  x 4 bytes are gone; nothing else changes (the key/value memory blocks, rebuilt from k and v by
  `local.memory_product`, are kept in neither)."""
  cfg = memory_estimate.PG19_LOCAL_CLUSTER8K
  plain = cost.layer_activation_bytes(cfg, 0, 4)
  recomputed = cost.layer_activation_bytes(cfg, 0, 4, recompute_attention=True)
  assert not any("memory blocks" in k for k in plain)
  assert plain["local attention probabilities"] == 8 * 8192 * 512 * 4
  gone = {"local attention probabilities"}
  assert {k for k in plain if recomputed[k] != plain[k]} == gone
  assert all(recomputed[k] == 0 for k in gone)
  saved = (cost.step_memory(cfg, VOCAB8K)["total"] -
           cost.step_memory(cfg, VOCAB8K, recompute_attention=True)["total"])
  last_layer_routing_heads = 2 * 8192 * 512 * 4  # local there: 6
  # and in the last block the 2 routing heads keep neither q_hat and the gathered q and v
  # (3 x 2 x 8192 x 129 x 4 bytes) nor the probabilities (2 x 16 x 512 x 512 x 4 bytes)
  routing_saved = 3 * 2 * 8192 * 129 * 4 + 2 * 16 * 512 * 512 * 4
  assert saved == 22 * sum(plain[k] for k in gone) - last_layer_routing_heads + routing_saved


def test_one_attention_model_serves_cost_and_memory():
  """The attention weights the memory model keeps per block are the attention memory of
  `cost.attention_cost` (which also counts the routing heads' centroid scores), in float32."""
  import hparams  # pylint: disable=g-import-not-at-top,unused-import
  from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
  for name in ("pg19_local_cluster8k", "routing_transformer_tiny_causal", "full_transformer_tiny"):
    hp = registry.hparams(name)
    cfg = cost.config(hp)
    kept = sum(layer["local attention probabilities"] + layer["routing attention probabilities"]
               for layer in (cost.layer_activation_bytes(cfg, i, 4) for i in range(cfg["layers"])))
    scores = sum(cost.layer_heads(hp, i)[0] for i in range(cfg["layers"])) * (
        cfg["length"] * cfg["clusters"])
    assert kept == 4 * (cost.attention_cost(hp).memory - scores), name


def test_the_scripts_print_the_cost_models_numbers(capsys):
  memory_estimate.main([])
  out = capsys.readouterr().out
  e = cost.step_memory(memory_estimate.PG19_LOCAL_CLUSTER8K, VOCAB8K)
  assert "**%.2f** |" % (e["total"] / cost.GIB) in out
  assert "{:,}".format(e["parameters"]) in out


def test_paper_sets_table_rows_are_the_cost_models_totals():
  """--paper_sets: a row per set with the plain step's total and the first switches that fit,
  from cost.step_memory; an attention-dropout set shows "-" for the switches it refuses."""
  import hparams  # pylint: disable=g-import-not-at-top,unused-import
  from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
  rows = {line.split(" | ")[0][3:-1]: line.split(" | ")
          for line in memory_estimate.paper_sets_table().splitlines()[2:]}
  assert set(rows) == set(memory_estimate.PAPER_SETS)
  pg19 = rows["pg19_local_cluster8k"]
  cfg = cost.config(registry.hparams("pg19_local_cluster8k"))
  plain = cost.step_memory(cfg, VOCAB8K)["total"] / cost.GIB
  ffn = cost.step_memory(cfg, VOCAB8K, logits_chunk=1024, ffn_chunk=2048)["total"] / cost.GIB
  layers = cost.step_memory(cfg, VOCAB8K, recompute=True, recompute_attention=True,
                            logits_chunk=1024, ffn_chunk=2048)["total"] / cost.GIB
  assert pg19[2] == "%.1f" % plain and pg19[3] == "%.1f" % ffn and pg19[5] == "%.1f" % layers
  hp = registry.hparams("pg19_local_cluster8k")
  fits_16 = next(label for label, kwargs in memory_estimate.switch_steps(hp)
                 if cost.step_memory(cfg, VOCAB8K, **kwargs)["total"] <= 0.85 * 16 * cost.GIB)
  assert pg19[6] == fits_16 == "chunk + ffn"  # plain 19.9, chunk 18.2, chunk + ffn 12.7 GiB
  assert rows["wikitext103_local4k"][4:6] == ["-", "-"]  # attention_dropout 0.4
