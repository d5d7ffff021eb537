"""Base hparams of the Routing Transformer (the original release's `sparse_transformer_local`).

Every other set starts from `sparse_transformer_local()` and changes only what the paper's
configuration changes. Names follow the original release so its command lines keep working.
"""
from tensor2tensor.layers import common_hparams
from tensor2tensor.utils import registry


def _add(hparams, **kwargs):
  for name, value in kwargs.items():
    if name in hparams.values():
      hparams.set_hparam(name, value)
    else:
      hparams.add_hparam(name, value)
  return hparams


@registry.register_hparams
def sparse_transformer_local():
  """Local-attention-only base model (the original release's `sparse_transformer_local`,
  google-research `routing_transformer/`); routing sets add routing heads."""
  hparams = common_hparams.basic_params1()
  hparams.max_length = 4096
  hparams.batch_size = 4096
  hparams.hidden_size = 512
  hparams.dropout = 0.0
  # layer_prepostprocess_dropout stays basic_params1's 0.1, as in the original: in TRAIN mode it
  # drops the decoder (and encoder) input and every sub-layer's output in the "dan" post-process.
  hparams.label_smoothing = 0.0
  hparams.weight_decay = 0.0
  hparams.clip_grad_norm = 0.0
  hparams.initializer = "uniform_unit_scaling"
  hparams.initializer_gain = 0.2
  # Post-norm residual blocks (T2T's "dan"), as in the released model.
  hparams.layer_preprocess_sequence = "none"
  hparams.layer_postprocess_sequence = "dan"
  hparams.norm_epsilon = 1e-6
  hparams.optimizer = "adafactor"
  hparams.optimizer_adafactor_beta1 = 0.0
  hparams.optimizer_adafactor_beta2 = 0.999
  hparams.optimizer_adafactor_clipping_threshold = 1.0
  hparams.optimizer_adafactor_decay_type = "pow"
  hparams.optimizer_adafactor_memory_exponent = 0.8
  hparams.optimizer_adafactor_multiply_by_parameter_scale = True
  # The original's schedule: flat learning_rate_constant up to learning_rate_warmup_steps, then
  # rsqrt decay (0.01 * sqrt(10000 / max(step, 10000))); no warm-up. The tiny/demo/test sets of
  # sets.py add a linear warm-up (sets.WARMUP_SCHEDULE).
  hparams.learning_rate_schedule = "constant*rsqrt_normalized_decay"
  hparams.learning_rate_constant = 0.01
  hparams.learning_rate_warmup_steps = 10000
  # The original sets shared_embedding(_and_softmax_weights) = True, but its model never reads
  # them: its embedding and output matrices are separate variables (docs/fidelity.md).
  hparams.shared_embedding_and_softmax_weights = False
  hparams.pad_batch = True  # TPU: pad the remainder eval batch instead of dropping it
  hparams.tpu_enable_host_call = True  # TPU: summaries through host_call
  hparams.summarize_vars = True  # T2T logs and summarises every variable
  _add(
      hparams,
      max_target_length=4096,
      filter_size=2048,
      attention_dropout=0.0,
      relu_dropout=0.0,
      embedding_dims=512,
      num_decoder_layers=24,
      num_encoder_layers=0,
      local_num_heads=8,
      sparsity_cluster_num_heads=0,
      sparsity_skip_first=0,
      sparsity_cluster_size=0,             # number of clusters (centroids) per routing head
      sparsity_cluster_attention_window=0,  # members per cluster (w)
      query_shape=(512,),
      memory_flange=(512,),
      memory_query_shape=(512,),
      max_relative_position=1024,
      local_relative=True,
      sparsity_cluster_relative=True,
      ffn_layer="geglu",
      share_qk=True,
      ema=True,
      beta=1e-4,
      decay=0.999,
      target_dropout=0.0,
      add_timing_signal=False,
      # Full attention (the paper's "Transformer" baseline): every non-routing head attends to
      # all earlier tokens (one block spanning the sequence); query_shape/memory_flange unused.
      full_attention=False,
      routing_mode="topk",       # "topk" (paper) or "causal_window" (strictly causal)
      random_routing=False,      # Random Transformer baseline: members drawn at random
      # Legacy switches reproducing defects of the original release (off in every set):
      # for its checkpoints trained with share_qk=False, causal keys routed by their own centroid
      # scores with a rank-triangle mask (core/attention/routing.py);
      legacy_causal_key_routing=False,
      # to continue or compare its runs step for step, its k-means counts, which interleave the
      # routing heads with the positions (kmeans.interleaved_counts; the sums stay per head).
      legacy_kmeans_counts=False,
      # Padding as the original release routes it: padding positions compete for cluster slots
      # and enter the k-means statistics and commitment loss (no key mask in the decoder). The
      # Scorer sets it for original-release checkpoints (core/attention/routing.py).
      routing_padding_as_original=False,
      # Extensions beyond the paper (off here and in every paper set;
      # research/notes/routing_learning.md):
      routing_exclude_self=False,  # a routing query skips its own position if it has others
      routing_logit_scale="none",  # "none" (paper) | "rsqrt_depth" | "learned" (per head)
      head_dense=True,           # shared per-head [d_head, d_head] map after attention
      nucleus_sampling=0.9,
      sampling_keep_top_k=-1,
      fast_decode=True,
      nan_guard=True,            # stop at a non-finite loss/gradient/centroid (health.py)
      reseed_dead_clusters=False,  # re-seed dead centroids from this step's queries
      dead_cluster_check_steps=1000,  # log dead clusters every N steps (0: never)
      skip_corrupt_records=False,  # True: skip corrupt/truncated TFRecords with a warning
      # Memory (core/memory.py): re-run each layer in the backward pass, keeping its input.
      recompute_layers=False,
      # Re-run each layer's attention heads in the backward pass, keeping q, k, v: the routing
      # heads together, then the local heads two at a time (no attention dropout or
      # random_routing); off in every set.
      recompute_attention=False,
      # Training loss from the output projection this many positions at a time, recomputed in
      # the backward pass (never the whole [batch, length, vocab] logits); 0: off.
      logits_chunk_size=0,
      # The feed-forward block this many positions at a time in training, recomputed in the
      # backward pass one chunk after another (no relu_dropout); 0: off.
      ffn_chunk_size=0,
  )
  return hparams
