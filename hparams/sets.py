"""Registered hparams sets of the paper (the original release's), the CIFAR-10 ablation and tiny
sets. The paper's sets derive from one another as the original's do (see below); the helpers map
a group of values onto the hparams.
"""
from tensor2tensor.utils import registry

from hparams import base


def _length(hparams, length):
  """Sequence length; the batch is one sequence of `length` tokens per core."""
  hparams.max_length = length
  hparams.max_target_length = length
  hparams.batch_size = length
  return hparams


def _size(hparams, hidden, emb, filter_size, layers):
  hparams.hidden_size = hidden
  hparams.embedding_dims = emb
  hparams.filter_size = filter_size
  hparams.num_decoder_layers = layers
  hparams.num_hidden_layers = layers
  return hparams


def _heads(hparams, local, routing=0, skip_first=0, clusters=0, window=0):
  """Local heads, and routing heads in the layers after the first `skip_first`."""
  hparams.local_num_heads = local
  hparams.sparsity_cluster_num_heads = routing
  hparams.sparsity_skip_first = skip_first
  hparams.sparsity_cluster_size = clusters
  hparams.sparsity_cluster_attention_window = window
  return hparams


def _blocks(hparams, block, flange, memory_query=0):
  """Local block and flange; the encoder-decoder attention's block `memory_query` (default: the
  block; None: keep the set's own, as the original's text sets keep the base's 512)."""
  hparams.query_shape = (block,)
  if memory_query is not None:
    hparams.memory_query_shape = (memory_query or block,)
  hparams.memory_flange = (flange,)
  return hparams


def _dropouts(hparams, rate):
  """Sets dropout, attention, relu and residual (layer_prepostprocess) dropout to `rate`."""
  hparams.dropout = rate
  hparams.attention_dropout = rate
  hparams.relu_dropout = rate
  hparams.layer_prepostprocess_dropout = rate
  return hparams


def _routing_switches(hparams):
  """The two switches beyond the paper with which routing heads learn far look-ups
  (research/notes/routing_learning.md, phase G): logits scaled by 1/sqrt(d), a query kept off
  itself."""
  hparams.routing_logit_scale = "rsqrt_depth"
  hparams.routing_exclude_self = True
  return hparams


def _no_relative(hparams):
  """Image sets: no relative positions ("-" in the table) but absolute positions.

  The paper's image models use learned positions; the sinusoidal timing signal
  (`add_timing_signal`) stands in for them here.
  """
  hparams.local_relative = False
  hparams.sparsity_cluster_relative = False
  hparams.add_timing_signal = True
  return hparams


def _full(hparams):
  """Every head attends to all earlier tokens (dense causal; the paper's "Transformer")."""
  hparams.full_attention = True
  return hparams


# Tiny, demo and unit-test sets train for hundreds of steps, not the paper's millions: they keep a
# linear warm-up over learning_rate_warmup_steps (the paper sets use base.py's
# "constant*rsqrt_normalized_decay", flat up to the warm-up steps). The unit-test sets then decay
# as the original does, as do the books demo sets (`_books_recipe`):
WARMUP_SCHEDULE = "constant*linear_warmup*rsqrt_normalized_decay"
# The tiny look-up sets (`_tiny_recipe`) hold the rate after the warm-up: no decay.
HELD_SCHEDULE = "constant*linear_warmup"


def _warmup(hparams):
  """The learning rate rises linearly from 0 over learning_rate_warmup_steps, then decays
  (unit-test and books demo sets)."""
  hparams.learning_rate_schedule = WARMUP_SCHEDULE
  return hparams


# The paper's sets derive from one another exactly as the original release's do (its
# sparse_transformer.py and sparse_image_transformer.py), so every value a set inherits there it
# inherits here; tests/test_original_hparams.py checks each against the original's assignments,
# and docs/fidelity.md lists the values that differ on purpose.


def _layers(hparams, layers):
  hparams.num_decoder_layers = layers
  return hparams


# enwik8. The original's enwik8 sets raise max_length but keep the base's max_target_length of
# 4096, and its body clips the targets to max_target_length: they train on the first 4,096 bytes
# of each example. The `_window` sets train on the whole example (the paper's length).


@registry.register_hparams
def enwik8_local8k():
  """enwik8 local-attention baseline (trains on 4,096-byte windows, as the original)."""
  hparams = base.sparse_transformer_local()
  hparams.max_length = 8192
  hparams.batch_size = 8192
  hparams.hidden_size = 1024
  hparams.embedding_dims = 1024
  _layers(hparams, 22)
  hparams.local_num_heads = 8
  hparams.filter_size = 3072
  _blocks(hparams, 256, 256, memory_query=None)
  hparams.max_relative_position = 513
  hparams.attention_dropout = 0.4
  hparams.relu_dropout = 0.4
  return hparams


@registry.register_hparams
def enwik8_local_cluster8k():
  """enwik8 routing model (paper: 0.99 bpc; trains on 4,096-byte windows, as the original)."""
  hparams = enwik8_local8k()
  _heads(hparams, local=4, routing=4, skip_first=0, clusters=16, window=512)
  _layers(hparams, 12)
  hparams.attention_dropout = 0.0
  hparams.relu_dropout = 0.0
  return hparams


@registry.register_hparams
def enwik8_local12k():
  """enwik8 local-attention baseline, 12k (trains on 4,096-byte windows, as the original)."""
  hparams = enwik8_local8k()
  hparams.max_length = 12288
  hparams.batch_size = 12288
  _blocks(hparams, 128, 128, memory_query=None)
  hparams.max_relative_position = 257
  return hparams


@registry.register_hparams
def enwik8_local_cluster12k():
  """enwik8 routing model, 12k (trains on 4,096-byte windows, as the original)."""
  hparams = enwik8_local12k()
  _heads(hparams, local=4, routing=4, skip_first=0, clusters=48, window=256)
  _layers(hparams, 12)
  hparams.attention_dropout = 0.0
  hparams.relu_dropout = 0.0
  return hparams


def _whole_window(hparams):
  """Trains on the whole max_length example (the paper's sequence length)."""
  hparams.max_target_length = hparams.max_length
  return hparams


def _register_whole_window_sets():
  for name in ("enwik8_local8k", "enwik8_local_cluster8k", "enwik8_local12k",
               "enwik8_local_cluster12k"):
    fn = globals()[name]

    def whole(fn=fn):
      return _whole_window(fn())

    whole.__name__ = name + "_window"
    whole.__doc__ = "`%s` trained on whole %d-byte examples (the paper's length)." % (
        name, fn().max_length)
    registry.register_hparams(whole.__name__)(whole)


_register_whole_window_sets()


# WikiText-103.


@registry.register_hparams
def wikitext103_local4k():
  """WikiText-103 local-attention baseline."""
  hparams = base.sparse_transformer_local()
  hparams.max_length = 4096
  hparams.batch_size = 4096
  hparams.hidden_size = 1024
  hparams.embedding_dims = 256
  hparams.filter_size = 3072
  hparams.local_num_heads = 16
  _layers(hparams, 14)
  _blocks(hparams, 256, 256, memory_query=None)
  hparams.attention_dropout = 0.4
  hparams.relu_dropout = 0.4
  hparams.dropout = 0.4
  hparams.target_dropout = 0.25
  hparams.max_relative_position = 513
  hparams.weight_decay = 2e-5
  return hparams


@registry.register_hparams
def wikitext103_local_cluster4k():
  """WikiText-103 routing model, 4k tokens."""
  hparams = wikitext103_local4k()
  hparams.local_num_heads = 8
  hparams.sparsity_cluster_num_heads = 8
  hparams.sparsity_cluster_attention_window = 512
  hparams.sparsity_cluster_size = 8
  return hparams


@registry.register_hparams
def wikitext103_local_cluster1k():
  """WikiText-103 routing model, 1k tokens. (The original leaves max_target_length at 4096,
  which only clips examples longer than 4,096; ours is the model's static length: 1,024.)"""
  hparams = wikitext103_local_cluster4k()
  hparams.max_length = 1024
  hparams.max_target_length = 1024
  hparams.batch_size = 1024
  hparams.sparsity_cluster_size = 2
  _layers(hparams, 20)
  hparams.target_dropout = 0.2
  return hparams


# PG-19.


@registry.register_hparams
def pg19_local_cluster8k():
  """PG-19 routing model (paper: 33.2 test perplexity; the released checkpoint's set)."""
  hparams = wikitext103_local4k()
  _length(hparams, 8192)
  hparams.hidden_size = 1032
  hparams.embedding_dims = 1032
  hparams.filter_size = 4096
  _heads(hparams, local=6, routing=2, skip_first=21, clusters=16, window=512)
  _layers(hparams, 22)
  _blocks(hparams, 256, 256, memory_query=None)
  hparams.attention_dropout = 0.0
  hparams.relu_dropout = 0.0
  hparams.dropout = 0.0
  hparams.target_dropout = 0.0
  hparams.max_relative_position = 513
  hparams.weight_decay = 0.0
  return hparams


@registry.register_hparams
def pg19_local8k():
  """PG-19 local-attention baseline (paper: 39.3)."""
  hparams = pg19_local_cluster8k()
  hparams.local_num_heads = 8
  hparams.sparsity_cluster_num_heads = 0
  return _layers(hparams, 24)


# Images (raster-scan RGB bytes). The original's image base (sparse_image_transformer.py) is
# not the text base: no relative positions, T2T's dense_relu_dense FFN (its "conv_hidden_relu"
# falls through to it), learned positions (here: a timing signal, docs/fidelity.md), and
# residual dropout 0.3 set by the local1d sets and inherited by the routing sets.


def _image_set(length, layers, local):
  hparams = _length(base.sparse_transformer_local(), length)
  hparams.hidden_size = 1024
  hparams.embedding_dims = 1024
  hparams.filter_size = 2048
  hparams.ffn_layer = "dense_relu_dense"
  hparams.local_num_heads = local
  _layers(hparams, layers)
  _blocks(hparams, 256, 256)
  _no_relative(hparams)
  hparams.max_relative_position = 0
  hparams.layer_prepostprocess_dropout = 0.3
  hparams.pad_batch = False  # as the original's image base: padded images would enter the metrics
  hparams.summarize_vars = False
  return hparams


@registry.register_hparams
def cifar10_local1d():
  """CIFAR-10 local-attention baseline."""
  return _image_set(3072, layers=12, local=8)


@registry.register_hparams
def cifar10_local_cluster():
  """CIFAR-10 routing model."""
  return _heads(cifar10_local1d(), local=4, routing=4, skip_first=0, clusters=6, window=512)


@registry.register_hparams
def cifar10_full():
  """CIFAR-10 full attention, the paper's Table 1 "Transformer" row (2.983 bits/dim): 12 layers,
  8 heads, every head dense causal (the original: one 3,072-token query block)."""
  return _full(cifar10_local1d())


@registry.register_hparams
def imagenet_local1d():
  """ImageNet-64 local-attention baseline."""
  return _image_set(12288, layers=24, local=16)


@registry.register_hparams
def imagenet_local_cluster():
  """ImageNet-64 routing model (paper: 3.43 bits/dim)."""
  return _heads(imagenet_local1d(), local=12, routing=4, skip_first=0, clusters=8, window=2048)


# CIFAR-10 ablation (paper Table 1): 12 layers, 8 heads, k = 6 clusters.

CIFAR10_GRID_HEADS = (2, 4, 8)
CIFAR10_GRID_LAYERS = (2, 4, 8, 12)
CIFAR10_GRID_WINDOWS = (512, 1024)


def cifar10_routing_name(heads, layers, window):
  return "cifar10_routing_h%d_l%d_w%d" % (heads, layers, window)


def cifar10_routing(heads, layers, window):
  """`cifar10_local_cluster` with `heads` routing heads in the top `layers` layers."""
  hparams = cifar10_local_cluster()
  total_heads = hparams.local_num_heads + hparams.sparsity_cluster_num_heads
  return _heads(
      hparams,
      local=total_heads - heads,
      routing=heads,
      skip_first=hparams.num_decoder_layers - layers,
      clusters=6,
      window=window)


def _make_grid_fn(heads, layers, window):
  """Binds the grid point now (a plain closure in the loop would see the last one)."""

  def fn():
    return cifar10_routing(heads, layers, window)

  fn.__name__ = cifar10_routing_name(heads, layers, window)
  fn.__doc__ = "CIFAR-10 ablation: %d routing heads, top %d layers, window %d." % (
      heads, layers, window)
  return fn


def _register_cifar10_grid():
  for heads in CIFAR10_GRID_HEADS:
    for layers in CIFAR10_GRID_LAYERS:
      for window in CIFAR10_GRID_WINDOWS:
        name = cifar10_routing_name(heads, layers, window)
        registry.register_hparams(name)(_make_grid_fn(heads, layers, window))


_register_cifar10_grid()


@registry.register_hparams
def cifar10_random_routing():
  """Random Transformer baseline (Table 1): cluster members drawn at random."""
  hparams = cifar10_local_cluster()
  hparams.random_routing = True
  return hparams


# Tiny sets for the synthetic long-range problem (512 tokens), the demo and tests.


def _tiny_recipe(hparams):
  """How the tiny sets (2 layers, hidden 128) train: the paper's optimizer (Adafactor), the rate
  rising linearly to 0.01 over 100 steps and then held there (`HELD_SCHEDULE`), and
  initializer_gain=1.0 (paper sets: 0.2). At gain 0.2 every matrix of the attention branch (v,
  head_dense, output_transform) scales its output by 0.2, so the branch starts at ~1% of the
  residual with logits of std ~0.04, and a tiny model learns no look-up in 500 steps. With the
  rate decaying from 0.05 (`WARMUP_SCHEDULE`: 0.016 at step 1,000) full attention answered
  0.46-0.74 of the far look-ups after 3,000 steps, with 0.05 held none; held at 0.01 it answers
  0.92-0.97, three seeds (research/notes/routing_learning.md, the look-up study, phases H-M)."""
  hparams.learning_rate_schedule = HELD_SCHEDULE
  hparams.initializer_gain = 1.0
  hparams.learning_rate_warmup_steps = 100
  hparams.learning_rate_constant = 0.01
  return hparams


def _books_recipe(hparams):
  """`_tiny_recipe` with the rate rising to 0.05 over 100 steps, then decaying as rsqrt
  (`WARMUP_SCHEDULE`: 0.019 at step 700): `make demo`'s 700 steps on the books reach a validation
  loss of 4.78 with it and 5.14 with the rate held at 0.01 (research/notes/routing_learning.md)."""
  _warmup(_tiny_recipe(hparams))
  hparams.learning_rate_constant = 0.05
  return hparams


@registry.register_hparams
def routing_transformer_tiny():
  """Tiny routing model for the synthetic long-range problem; learning rate 0.01 after a linear
  warm-up over 100 steps (`_tiny_recipe`), as every set derived from it."""
  hparams = _length(base.sparse_transformer_local(), 512)
  hparams.batch_size = 2048  # tokens: 4 sequences
  _size(hparams, hidden=128, emb=128, filter_size=256, layers=2)
  _heads(hparams, local=2, routing=2, skip_first=1, clusters=8, window=64)
  _blocks(hparams, 64, 64)
  hparams.max_relative_position = 65
  _dropouts(hparams, 0.0)
  return _tiny_recipe(hparams)


@registry.register_hparams
def routing_transformer_tiny_causal():
  """`routing_transformer_tiny` with strictly causal routing (routing_mode="causal_window")."""
  hparams = routing_transformer_tiny()
  hparams.routing_mode = "causal_window"
  return hparams


@registry.register_hparams
def local_transformer_tiny():
  """`routing_transformer_tiny` with local heads only."""
  return _heads(routing_transformer_tiny(), local=4, skip_first=1)


@registry.register_hparams
def full_transformer_tiny():
  """`local_transformer_tiny` with full attention: the ceiling of the tiny comparisons."""
  return _full(local_transformer_tiny())


# Tiny sets for the 1,024-token one-hop retrieval problems (problems/retrieval.py).


@registry.register_hparams
def routing_transformer_tiny1k():
  """`routing_transformer_tiny` over 1,024 tokens (4 sequences a step): 8 clusters x 128."""
  hparams = _length(routing_transformer_tiny(), 1024)
  hparams.batch_size = 4096
  return _heads(hparams, local=2, routing=2, skip_first=1, clusters=8, window=128)


@registry.register_hparams
def local_transformer_tiny1k():
  """`routing_transformer_tiny1k` with local heads only."""
  return _heads(routing_transformer_tiny1k(), local=4, skip_first=1)


@registry.register_hparams
def full_transformer_tiny1k():
  """`local_transformer_tiny1k` with full attention."""
  return _full(local_transformer_tiny1k())


@registry.register_hparams
def routing_only_transformer_tiny1k():
  """`routing_transformer_tiny1k` with four routing heads in both layers (8 clusters x 128) and no
  local heads, routing logits scaled by 1/sqrt(d) (`routing_logit_scale=rsqrt_depth`) and a query
  kept off its own position (`routing_exclude_self`), two switches beyond the paper: the routing
  model that learns look-ups beyond a local window at this scale
  (research/notes/routing_learning.md, phases E-G). With local heads beside the routing heads,
  or with the paper's unscaled logits, tiny models learn none in 1,000 steps (the paper's layout
  none in 3,000 at the held rate, phase L)."""
  hparams = _heads(routing_transformer_tiny1k(), local=0, routing=4, skip_first=0, clusters=8,
                   window=128)
  return _routing_switches(hparams)


@registry.register_hparams
def routing_transformer_test():
  """Smallest routing set, for unit tests; learning rate with a linear warm-up
  (`WARMUP_SCHEDULE`, over the base's 10,000 steps), as every set derived from it."""
  hparams = _warmup(_length(base.sparse_transformer_local(), 64))
  hparams.batch_size = 128
  _size(hparams, hidden=32, emb=32, filter_size=64, layers=2)
  _heads(hparams, local=2, routing=2, skip_first=1, clusters=4, window=16)
  _blocks(hparams, 16, 16)
  hparams.max_relative_position = 17
  return _dropouts(hparams, 0.0)


@registry.register_hparams
def routing_transformer_test_causal():
  """`routing_transformer_test` with routing_mode="causal_window"."""
  hparams = routing_transformer_test()
  hparams.routing_mode = "causal_window"
  return hparams


@registry.register_hparams
def local_transformer_test():
  """`routing_transformer_test` with local heads only."""
  return _heads(routing_transformer_test(), local=4, skip_first=1)


# Tiny PG-19 sets for `pg19_length2k` (`make demo`: real books on 2 cores).


@registry.register_hparams
def pg19_local_cluster_tiny2k():
  """Tiny PG-19 routing model, 2,048-subword examples: 2 layers, hidden 128; layer 1 has
  2 local + 2 routing heads (4 clusters x 512), layer 0 4 local heads. Learning rate 0.05 after
  a linear warm-up over 100 steps, then rsqrt decay (`_books_recipe`), as every set derived from
  it."""
  hparams = _length(base.sparse_transformer_local(), 2048)
  hparams.batch_size = 2048  # tokens: one sequence per step (a 15-minute demo on 2 cores)
  _size(hparams, hidden=128, emb=128, filter_size=512, layers=2)
  _heads(hparams, local=2, routing=2, skip_first=1, clusters=4, window=512)
  _blocks(hparams, 128, 128)
  hparams.max_relative_position = 129
  _dropouts(hparams, 0.0)
  return _books_recipe(hparams)


@registry.register_hparams
def pg19_local_tiny2k():
  """`pg19_local_cluster_tiny2k` with local heads only (same head count, widths, layers)."""
  return _heads(pg19_local_cluster_tiny2k(), local=4, skip_first=1)


@registry.register_hparams
def pg19_full_tiny2k():
  """`pg19_local_tiny2k` with full attention (every head sees all earlier subwords)."""
  return _full(pg19_local_tiny2k())
