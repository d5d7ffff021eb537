"""Registered hparams sets: consistency, the CIFAR-10 grid, random routing and the tiny sets."""
import itertools

import pytest

# The paper's sets and their values: tests/test_original_hparams.py (the original's sets as data).
PAPER_SETS = ["pg19_local_cluster8k", "pg19_local8k", "enwik8_local8k", "enwik8_local_cluster8k",
              "enwik8_local12k", "enwik8_local_cluster12k", "wikitext103_local4k",
              "wikitext103_local_cluster4k", "wikitext103_local_cluster1k", "cifar10_local1d",
              "cifar10_local_cluster", "cifar10_full", "imagenet_local1d",
              "imagenet_local_cluster"]

GRID = [("cifar10_routing_h%d_l%d_w%d" % (h, l, w), h, l, w)
        for h, l, w in itertools.product((2, 4, 8), (2, 4, 8, 12), (512, 1024))]
TINY = ["routing_transformer_tiny", "local_transformer_tiny",
        "routing_transformer_test", "local_transformer_test"]
ALL_SETS = PAPER_SETS + [g[0] for g in GRID] + ["cifar10_random_routing"] + TINY


@pytest.fixture(scope="module")
def registry():
  import routing_transformer  # pylint: disable=g-import-not-at-top,unused-import
  import hparams  # pylint: disable=g-import-not-at-top,unused-import
  from tensor2tensor.utils import registry as t2t_registry  # pylint: disable=g-import-not-at-top
  return t2t_registry


def _routing_heads(hp):
  return hp.sparsity_cluster_num_heads


@pytest.mark.parametrize("name", ALL_SETS)
def test_consistency(registry, name):
  hp = registry.hparams(name)
  block = hp.query_shape[0]
  assert hp.hidden_size % (hp.local_num_heads + hp.sparsity_cluster_num_heads) == 0
  assert hp.max_length % block == 0
  assert hp.memory_flange[0] % block == 0
  assert hp.max_target_length <= hp.max_length  # enwik8: 4,096 of 8,192 (the original's window)
  if _routing_heads(hp):
    assert 0 < hp.sparsity_cluster_attention_window <= hp.max_target_length
    assert hp.sparsity_cluster_size > 0
    assert hp.sparsity_skip_first < hp.num_decoder_layers


def test_cifar10_grid(registry):
  assert len(GRID) == 24
  names = [n for n in registry.list_hparams("cifar10_routing_")]
  assert sorted(names) == sorted(g[0] for g in GRID)
  base = registry.hparams("cifar10_local_cluster")
  for name, heads, layers, window in GRID:
    hp = registry.hparams(name)
    assert hp.sparsity_cluster_num_heads == heads
    assert hp.local_num_heads == 8 - heads
    assert hp.num_decoder_layers == 12
    assert hp.sparsity_skip_first == 12 - layers
    assert hp.sparsity_cluster_size == 6
    assert hp.sparsity_cluster_attention_window == window
    assert hp.hidden_size == base.hidden_size and hp.max_length == base.max_length
    assert not hp.random_routing


def test_random_routing(registry):
  hp = registry.hparams("cifar10_random_routing")
  base = registry.hparams("cifar10_local_cluster")
  assert hp.random_routing is True
  changed = {k for k, v in hp.values().items() if base.values()[k] != v}
  assert changed == {"random_routing"}


@pytest.mark.parametrize("name,local,routing,clusters,window", [
    ("routing_transformer_tiny", 2, 2, 8, 64),
    ("local_transformer_tiny", 4, 0, 0, 0),
])
def test_tiny(registry, name, local, routing, clusters, window):
  hp = registry.hparams(name)
  assert (hp.max_length, hp.max_target_length, hp.batch_size) == (512, 512, 2048)
  assert (hp.hidden_size, hp.embedding_dims, hp.filter_size) == (128, 128, 256)
  assert hp.num_decoder_layers == hp.num_hidden_layers == 2
  assert (hp.local_num_heads, hp.sparsity_cluster_num_heads) == (local, routing)
  assert hp.sparsity_skip_first == 1
  assert (hp.sparsity_cluster_size, hp.sparsity_cluster_attention_window) == (clusters, window)
  assert tuple(hp.query_shape) == tuple(hp.memory_query_shape) == tuple(hp.memory_flange) == (64,)
  assert hp.max_relative_position == 65
  assert hp.dropout == hp.attention_dropout == hp.relu_dropout == 0.0
  assert hp.layer_prepostprocess_dropout == 0.0
  assert hp.learning_rate_warmup_steps == 100
  assert hp.learning_rate_constant == pytest.approx(0.01)
  assert hp.optimizer == "adafactor"
  assert hp.learning_rate_schedule == "constant*linear_warmup"


@pytest.mark.parametrize("name,local,routing,clusters,window", [
    ("routing_transformer_test", 2, 2, 4, 16),
    ("local_transformer_test", 4, 0, 0, 0),
])
def test_unit_test_sets(registry, name, local, routing, clusters, window):
  hp = registry.hparams(name)
  assert (hp.max_length, hp.max_target_length, hp.batch_size) == (64, 64, 128)
  assert (hp.hidden_size, hp.embedding_dims, hp.filter_size) == (32, 32, 64)
  assert hp.num_decoder_layers == hp.num_hidden_layers == 2
  assert (hp.local_num_heads, hp.sparsity_cluster_num_heads) == (local, routing)
  assert hp.sparsity_skip_first == 1
  assert (hp.sparsity_cluster_size, hp.sparsity_cluster_attention_window) == (clusters, window)
  assert tuple(hp.query_shape) == tuple(hp.memory_query_shape) == tuple(hp.memory_flange) == (16,)
  assert hp.max_relative_position == 17
  assert hp.dropout == hp.layer_prepostprocess_dropout == 0.0


def test_base_optimizer_settings(registry):
  hp = registry.hparams("pg19_local_cluster8k")
  assert hp.optimizer == "adafactor"
  assert hp.optimizer_adafactor_beta1 == 0.0
  assert hp.optimizer_adafactor_beta2 == pytest.approx(0.999)
  assert hp.optimizer_adafactor_clipping_threshold == 1.0
  assert hp.optimizer_adafactor_decay_type == "pow"
  assert hp.optimizer_adafactor_memory_exponent == pytest.approx(0.8)
  assert hp.optimizer_adafactor_multiply_by_parameter_scale is True
  assert hp.learning_rate_schedule == "constant*rsqrt_normalized_decay"
  assert hp.learning_rate_constant == pytest.approx(0.01)
  assert hp.learning_rate_warmup_steps == 10000
  assert hp.initializer == "uniform_unit_scaling"
  assert hp.initializer_gain == pytest.approx(0.2)
  assert hp.clip_grad_norm == 0.0
  assert hp.label_smoothing == 0.0


def learning_rates(hparams_sets, steps):
  """T2T's learning_rate_schedule of each hparams set at each global step: [sets, steps]."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import learning_rate  # pylint: disable=g-import-not-at-top
  with tf.Graph().as_default():
    global_step = tf.compat.v1.train.get_or_create_global_step()
    rates = [learning_rate.learning_rate_schedule(hp) for hp in hparams_sets]
    with tf.compat.v1.Session() as sess:
      values = []
      for step in steps:
        global_step.load(step, sess)
        values.append(sess.run(rates))
  return np.array(values).T


def is_tiny(name):
  """Tiny, demo and unit-test sets (they keep a warm-up)."""
  return "_tiny" in name or name.endswith("_test") or "_test_" in name


def test_paper_sets_train_with_the_original_learning_rate(registry):
  """The original's `constant*rsqrt_normalized_decay`, constant 0.01, 10,000 warm-up steps: flat
  0.01 up to step 10,000, then 0.01 * sqrt(10000 / step) (0.005 at 40,000); no warm-up."""
  import hparams  # pylint: disable=g-import-not-at-top
  names = [name for name in hparams.PROJECT_SETS if not is_tiny(name)]
  assert len(names) >= len(PAPER_SETS) + len(GRID) + 2
  steps = (1, 1000, 10000, 40000)
  got = learning_rates([registry.hparams(name) for name in names], steps)
  for name, rates in zip(names, got):
    assert rates == pytest.approx([0.01, 0.01, 0.01, 0.005], rel=1e-6), name


def test_tiny_sets_keep_a_linear_warm_up(registry):
  """The tiny/demo/test sets rise linearly over learning_rate_warmup_steps; then the tiny look-up
  sets hold the rate (0.01 from step 100), the books demo and unit-test sets decay as the
  original does."""
  import hparams  # pylint: disable=g-import-not-at-top
  names = [name for name in hparams.PROJECT_SETS if is_tiny(name)]
  assert {"routing_transformer_tiny", "pg19_local_cluster_tiny2k", "routing_transformer_test",
          "routing_transformer_tiny1k", "routing_transformer_mtf_tiny"} <= set(names)
  hps = [registry.hparams(name) for name in names]
  steps = (1, 50, 100, 400, 3000)
  got = learning_rates(hps, steps)
  for name, hp, rates in zip(names, hps, got):
    warmup = hp.learning_rate_warmup_steps
    held = "_test" not in name and "tiny2k" not in name
    want = [hp.learning_rate_constant * min(1.0, s / warmup) *
            (1.0 if held else (warmup / max(s, warmup)) ** 0.5) for s in steps]
    assert rates == pytest.approx(want, rel=1e-5), name
    assert rates[0] < rates[1], name  # rising at the start: a warm-up
  got = dict(zip(names, got))
  for name in ("routing_transformer_tiny", "full_transformer_tiny1k",
               "routing_transformer_mtf_tiny"):
    assert got[name] == pytest.approx([1e-4, 0.005, 0.01, 0.01, 0.01], rel=1e-5), name
  books = [5e-4, 0.025, 0.05, 0.025, 0.05 * (100 / 3000) ** 0.5]
  for name in ("pg19_local_cluster_tiny2k", "pg19_local_tiny2k"):
    assert got[name] == pytest.approx(books, rel=1e-5), name


def test_legacy_kmeans_counts_is_off_in_every_set(registry):
  import hparams  # pylint: disable=g-import-not-at-top
  for name in hparams.PROJECT_SETS:
    assert registry.hparams(name).legacy_kmeans_counts is False, name


def test_sets_are_fresh_objects(registry):
  first = registry.hparams("routing_transformer_tiny")
  first.hidden_size = 7
  assert registry.hparams("routing_transformer_tiny").hidden_size == 128


def test_routing_only_set_is_the_layout_that_learns_far_look_ups(registry):
  """research/notes/routing_learning.md phases E-G: four routing heads in both layers, no local
  heads, logits scaled by 1/sqrt(d), self exclusion; the paper's routing sets keep neither
  switch."""
  hp = registry.hparams("routing_only_transformer_tiny1k")
  assert (hp.local_num_heads, hp.sparsity_cluster_num_heads, hp.sparsity_skip_first) == (0, 4, 0)
  assert (hp.sparsity_cluster_size, hp.sparsity_cluster_attention_window) == (8, 128)
  assert hp.routing_logit_scale == "rsqrt_depth" and hp.share_qk
  assert hp.routing_exclude_self and hp.max_length == 1024
  for paper in ("pg19_local_cluster8k", "routing_transformer_tiny1k", "enwik8_local_cluster8k"):
    paper = registry.hparams(paper)
    assert paper.routing_logit_scale == "none" and not paper.routing_exclude_self


@pytest.mark.parametrize("name", ["routing_transformer_tiny", "local_transformer_tiny",
                                  "full_transformer_tiny", "routing_transformer_tiny_causal",
                                  "routing_transformer_tiny1k", "local_transformer_tiny1k",
                                  "full_transformer_tiny1k", "routing_only_transformer_tiny1k",
                                  "pg19_local_cluster_tiny2k",
                                  "pg19_local_tiny2k", "pg19_full_tiny2k"])
def test_tiny_sets_carry_the_recipe_that_learns_look_ups(registry, name):
  """research/notes/routing_learning.md: at the paper's gain 0.2 a tiny model learns no look-up."""
  hp = registry.hparams(name)
  assert hp.initializer_gain == 1.0 and hp.initializer == "uniform_unit_scaling"
  assert hp.optimizer == "adafactor" and hp.optimizer_adafactor_multiply_by_parameter_scale
  if "tiny2k" in name:  # the books demo sets: make demo's 700 steps learn more with the decay
    assert (hp.learning_rate_warmup_steps, hp.learning_rate_constant) == (100, 0.05)
    assert hp.learning_rate_schedule == "constant*linear_warmup*rsqrt_normalized_decay"
  else:
    assert (hp.learning_rate_warmup_steps, hp.learning_rate_constant) == (100, 0.01)
    assert hp.learning_rate_schedule == "constant*linear_warmup"  # held: no decay
  assert registry.hparams("pg19_local_cluster8k").initializer_gain == pytest.approx(0.2)


def test_layer_tests_stand_in_defaults_without_t2t_are_the_registered_ones():
  """conftest's fallback for the current-TensorFlow profile (no T2T) reads base.py's literal
  values; each equals what the registered base set holds."""
  import conftest  # pylint: disable=g-import-not-at-top
  from hparams import base  # pylint: disable=g-import-not-at-top
  literals, registered = conftest._base_literals(), base.sparse_transformer_local().values()  # pylint: disable=protected-access
  assert len(literals) > 40 and "legacy_kmeans_counts" in literals
  for name, value in literals.items():
    normal = lambda x: list(x) if isinstance(x, (list, tuple)) else x
    assert normal(registered[name]) == normal(value), name
