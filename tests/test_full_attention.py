"""Full-attention baselines (hparam full_attention): the heads equal the dense reference, the
model reaches every earlier token and stays causal, the sets build and train; attention cost and
reach from hparams (routing_transformer.core.cost) against hand numbers."""
import numpy as np
import pytest
import tensorflow as tf

import reference
from conftest import HParamsStandIn
from routing_transformer.core import cost
from routing_transformer.core import heads
from routing_transformer.core import layers
from test_model import TRAIN, EVAL, VOCAB, build, random_targets, run, small_hparams

tf1 = tf.compat.v1
ATOL = 2e-4


@pytest.fixture(scope="module")
def registry():
  import hparams  # pylint: disable=g-import-not-at-top,unused-import
  from tensor2tensor.utils import registry as t2t_registry  # pylint: disable=g-import-not-at-top
  return t2t_registry


@pytest.mark.parametrize("relative", [False, True])
def test_full_heads_equal_the_dense_causal_reference(rng, relative):
  """mixed_heads with full_attention (block 256 in the hparams, ignored) == dense causal."""
  b, h, n, d = 2, 3, 40, 8
  q, k, v = [rng.standard_normal((b, h, n, d)).astype(np.float32) for _ in range(3)]
  rel = [rng.standard_normal((2 * 10 + 1, d)).astype(np.float32) for _ in range(2)]  # radius 10
  tables = tuple(rel) if relative else (None, None)
  hp = small_hparams(full_attention=True, query_shape=(256,), memory_flange=(256,))
  config = layers.head_config(hp, n)
  assert (config.block_length, config.flange) == (n, 0)
  got, _ = heads.mixed_heads(q, k, v, 0, config, causal=True, local_tables=tables)
  if relative:
    # Explicit [n, n] causal mask with Shaw relative positions (distance j - i).
    want = reference.local(q, k, v, n, 0, True, rel[0], rel[1], scale=1.0)
    allowed = np.tri(n, dtype=bool)
    j_minus_i = np.arange(n)[None, :] - np.arange(n)[:, None]
    want0 = reference.attend(q[0, 0], k[0, 0], v[0, 0], allowed, j_minus_i, rel[0], rel[1])
    np.testing.assert_allclose(want[0, 0], want0, atol=1e-6)
  else:
    want = reference.full(q, k, v, causal=True, scale=1.0)
  np.testing.assert_allclose(got.numpy(), want, atol=ATOL)


@pytest.mark.parametrize("full,reaches", [(False, False), (True, True)])
def test_full_model_reaches_the_first_token_local_does_not(rng, full, reaches):
  """Two local layers (block 16, flange 16) reach 15 + 2 x 16 = 47 back; the last position sees
  the first token only with full attention. Together with test_model's perturbation test (full_attention case): causal."""
  h = small_hparams(sparsity_cluster_num_heads=0, local_num_heads=4, full_attention=full)
  assert cost.local_receptive_field(h) == (63 if full else 47)
  targets = random_targets(rng)
  changed = targets.copy()
  changed[:, 0] = (changed[:, 0] % (VOCAB - 1)) + 1  # another non-padding token
  with tf.Graph().as_default():
    ph = tf1.placeholder(tf.int32, [2, 64, 1, 1])
    logits, _ = build(h, EVAL, {"targets": ph})
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      before, after = (sess.run(logits, {ph: t}) for t in (targets, changed))
  # logits[:, i] are computed at input position i - 1 (targets shifted right by one).
  assert np.allclose(before[:, 0], after[:, 0])
  assert (not np.allclose(before[:, -1], after[:, -1], atol=1e-6)) == reaches


@pytest.mark.parametrize("name,like,length", [
    ("full_transformer_tiny", "local_transformer_tiny", 512),
    ("full_transformer_tiny1k", "local_transformer_tiny1k", 1024),
    ("pg19_full_tiny2k", "pg19_local_tiny2k", 2048),
])
def test_tiny_full_sets_are_their_local_set_with_full_attention(registry, name, like, length):
  hp, base = registry.hparams(name), registry.hparams(like)
  changed = {k for k, v in hp.values().items() if base.values()[k] != v}
  assert changed == {"full_attention"} and hp.full_attention is True
  assert hp.max_length == length and hp.sparsity_cluster_num_heads == 0


def test_cifar10_full_is_the_table1_transformer(registry):
  hp, routing = registry.hparams("cifar10_full"), registry.hparams("cifar10_local_cluster")
  assert hp.full_attention and (hp.local_num_heads, hp.sparsity_cluster_num_heads) == (8, 0)
  for key in ("max_length", "hidden_size", "embedding_dims", "filter_size", "num_decoder_layers",
              "dropout", "add_timing_signal", "local_relative"):
    assert hp.get(key) == routing.get(key), key
  assert cost.relative_to_full(hp) == (1.0, 1.0)


def test_full_set_builds_and_trains_one_step(registry, rng):
  hp = registry.hparams("full_transformer_tiny")
  hp.batch_size = 512  # one sequence
  targets = rng.integers(2, VOCAB, (1, 512, 1, 1)).astype(np.int32)
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    _, losses = build(hp, TRAIN, {"targets": targets})
    loss = losses["training"]
    train_op = tf1.train.AdamOptimizer(1e-3).minimize(loss)
    weights = [v for v in tf1.trainable_variables() if "/q/" in v.name][0]
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      w0, first = sess.run([weights, loss])
      sess.run(train_op)
      w1, second = sess.run([weights, loss])
  assert np.isfinite(first) and np.isfinite(second) and not np.allclose(w0, w1)


def _hp(**kw):
  values = dict(max_length=64, max_target_length=64, hidden_size=32, num_decoder_layers=2,
                local_num_heads=2, sparsity_cluster_num_heads=2, sparsity_skip_first=1,
                sparsity_cluster_size=4, sparsity_cluster_attention_window=16,
                query_shape=(16,), memory_flange=(16,), full_attention=False,
                routing_mode="topk")
  values.update(kw)
  return HParamsStandIn(**values)


def test_cost_and_reach_against_hand_numbers():
  # 2 layers, 4 heads of d = 8; layer 0: 4 local, layer 1: 2 local + 2 routing (4 x 16).
  hp = _hp()
  local_logits = 64 * (16 + 16)          # 2048 per local head
  routing_logits = 4 * 16 * 16           # 1024 per routing head, plus 64 * 4 scores
  memory = 6 * local_logits + 2 * (routing_logits + 256)
  flops = 6 * 4 * 8 * local_logits + 2 * (4 * 8 * routing_logits + 2 * 8 * 256)
  assert cost.attention_cost(hp) == (flops, memory)
  full = cost.full_attention_cost(hp)
  assert full == (4 * 8 * 8 * 64 * 64, 8 * 64 * 64)
  assert cost.relative_to_full(hp) == (flops / full.flops, memory / full.memory)
  assert cost.attention_cost(_hp(full_attention=True, sparsity_cluster_num_heads=0,
                                 local_num_heads=4)) == full
  cw = cost.attention_cost(_hp(routing_mode="causal_window"))
  assert cw.memory == 6 * local_logits + 2 * (64 * 32 + 256)
  assert cost.local_receptive_field(hp) == 15 + 2 * 16
  # Only layers with a non-routing head extend the local reach.
  assert cost.local_receptive_field(_hp(local_num_heads=0, sparsity_skip_first=1)) == 31
  assert cost.local_receptive_field(_hp(full_attention=True)) == 63
