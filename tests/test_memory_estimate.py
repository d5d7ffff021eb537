"""The training-step memory of core/cost.py (scripts/memory_estimate.py prints it): the script's
config is the registered set, the variables are the model's,
and its totals add up (recompute keeps the checkpoints and one block; bfloat16 halves the rest;
recompute_attention drops the local heads' probabilities and the routing heads' gathered clusters
and probabilities; the local heads' memory blocks are never kept)."""
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
  # a block that is not re-run rebuilds its norms' outputs and head_dense's output
  rebuilt = {"block input", "head_dense output", "ffn input"}
  assert set(cost.REBUILT) == rebuilt
  assert plain["block_activations"] == sum(
      sum(v for k, v in layer.items() if k not in rebuilt) for layer in layers)
  assert all(layer[k] == cfg["length"] * cfg["hidden"] * act for layer in layers for k in rebuilt)
  checkpoints = cfg["layers"] * cfg["length"] * cfg["hidden"] * act
  assert recompute["checkpoints"] == checkpoints
  assert recompute["block_activations"] == checkpoints + recompute["one_layer"]
  # the re-run block's FFN backward pass: x W1 and x W2 for 1,024 of 8,192 rows at a time
  assert recompute["one_layer"] == max(sum(x.values()) - x["block input"] -
                                       x["ffn intermediates"] * 7 // 8 for x in layers)
  assert recompute["outside_activations"] == plain["outside_activations"]
  assert recompute["block_activations"] < plain["block_activations"] / 10


def test_the_output_projection_input_is_kept_only_after_final_dense_1():
  """hidden == embedding: the projection reads the last norm's output, which is rebuilt; else
  final_dense_1's output [n, embedding], which is kept."""
  cfg = memory_estimate.PG19_LOCAL_CLUSTER8K
  same = cost.outside_activation_bytes(cfg, 32768, 4)
  other = cost.outside_activation_bytes(dict(cfg, embedding=512), 32768, 4)
  assert same["final_dense_2 input"] == 0
  assert other["final_dense_2 input"] == 8192 * 512 * 4


def test_bfloat16_halves_only_the_bfloat16_tensors():
  cfg = memory_estimate.PG19_LOCAL_CLUSTER8K
  f32 = cost.layer_activation_bytes(cfg, 0, 4)
  b16 = cost.layer_activation_bytes(cfg, 0, 2)
  for name in f32:
    kept = "probabilities" in name or "LayerNorm" in name
    np.testing.assert_equal(b16[name], f32[name] if kept else f32[name] / 2)
  assert (cost.step_memory(cfg, VOCAB8K, bf16=True)["params"] ==
          cost.step_memory(cfg, VOCAB8K)["params"])


def test_recompute_attention_drops_the_local_heads_probabilities():
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


@pytest.mark.parametrize("bf16", [False, True])
def test_recompute_keep_moves_the_kept_tensors_into_the_checkpoints(bf16):
  """--recompute_keep heads: each block also keeps its heads' output [n, hidden]; qkv: and its
  q, k, v (the routing heads keep no q_hat with recompute_attention: it is re-run from q); the
  re-run block then holds them not again."""
  cfg, act = memory_estimate.PG19_LOCAL_CLUSTER8K, 2 if bf16 else 4
  n, h = cfg["length"], cfg["hidden"]
  lean, heads, qkv = (cost.step_memory(cfg, VOCAB8K, recompute=True, bf16=bf16,
                                       recompute_attention=True, keep=keep)
                      for keep in ("", "heads", "qkv"))
  assert heads["checkpoints"] - lean["checkpoints"] == 22 * n * h * act
  layers = [cost.layer_activation_bytes(cfg, i, act, recompute_attention=True)
            for i in range(22)]
  assert all(x["routing q_hat and gathered q, v"] == 0 for x in layers)
  extra = sum(x["q, k, v"] for x in layers)
  assert qkv["checkpoints"] - heads["checkpoints"] == extra
  assert lean["one_layer"] - heads["one_layer"] == n * h * act
  assert heads["one_layer"] > qkv["one_layer"]
  with pytest.raises(ValueError, match="recompute_attention"):
    cost.step_memory(cfg, VOCAB8K, recompute=True, keep="heads")


def test_ffn_backward_rows_are_the_models():
  from routing_transformer.core import layers  # pylint: disable=g-import-not-at-top
  assert cost.FFN_BACKWARD_ROWS == layers.FFN_BACKWARD_ROWS


@pytest.mark.parametrize("bf16", [False, True])
def test_ffn_rebuild_linear_drops_x_w2_from_every_kept_block(bf16):
  """--ffn_rebuild_linear: a block that is not re-run keeps x W1 [n, filter] but not x W2;
  with recompute_layers nothing changes (the re-run block's FFN computes both in chunks)."""
  cfg, act = memory_estimate.PG19_LOCAL_CLUSTER8K, 2 if bf16 else 4
  n, f = cfg["length"], cfg["filter"]
  plain, rebuilt = (cost.step_memory(cfg, VOCAB8K, bf16=bf16, rebuild_linear=r)
                    for r in (False, True))
  assert plain["total"] - rebuilt["total"] == 22 * n * f * act
  assert (cost.step_memory(cfg, VOCAB8K, recompute=True, bf16=bf16, rebuild_linear=True) ==
          cost.step_memory(cfg, VOCAB8K, recompute=True, bf16=bf16))
  layer = cost.layer_activation_bytes(cfg, 0, act, rebuild_linear=True)
  assert layer["ffn intermediates"] == n * f * act


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
