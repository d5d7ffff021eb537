"""Hparams sets of `routing_transformer_mtf` (Mesh-TensorFlow, model-parallel).

Each set is a set of the TF model plus the mesh: `mesh_shape` (mesh dimensions, e.g.
"batch:4;model:8") and `layout` (tensor dimension -> mesh dimension rules, e.g.
"batch:batch;heads:model"). The model's splittable dimensions are batch, heads (layers with
only local heads), local_heads and routing_heads (layers mixing both), d_ff and vocab. Batches
are a fixed number of sequences (`use_fixed_batch_size`), the vocabulary is padded to a
multiple of `vocab_divisor` so it splits evenly (padded logits are masked).
"""
from tensor2tensor.utils import registry

from hparams import base
from hparams import sets

MODEL_PARALLEL_LAYOUT = "batch:batch;heads:model;local_heads:model;routing_heads:model;" \
                        "d_ff:model;vocab:model"


def with_mesh(hparams, mesh_shape, layout, sequences, vocab_divisor=128):
  """Adds the Mesh-TF hparams: mesh, layout, a batch of `sequences` sequences."""
  base._add(hparams, mesh_shape=mesh_shape, layout=layout,  # pylint: disable=protected-access
            use_fixed_batch_size=True, vocab_divisor=vocab_divisor)
  hparams.batch_size = sequences
  return hparams


@registry.register_hparams
def mtf_pg19_local_cluster8k():
  """The paper's PG-19 routing model (`pg19_local_cluster8k`) on a TPU v3-8: 8-way model parallel.

  Heads of the 21 all-local layers (8), d_ff (4096) and the vocabulary split 8 ways; the last
  layer's 6 local + 2 routing heads cannot split 8 ways and stay replicated. On a larger slice
  add data parallelism, e.g. mesh_shape="batch:4;model:8" (32 cores) with batch_size=4.
  """
  return with_mesh(sets.pg19_local_cluster8k(), "batch:1;model:8",
                   "batch:batch;heads:model;d_ff:model;vocab:model", sequences=1)


@registry.register_hparams
def routing_transformer_mtf_tiny():
  """`routing_transformer_tiny` split 2 ways (heads, d_ff, vocab) for the synthetic problem."""
  return with_mesh(sets.routing_transformer_tiny(), "model:2", MODEL_PARALLEL_LAYOUT,
                   sequences=4, vocab_divisor=8)


@registry.register_hparams
def routing_transformer_mtf_test():
  """`routing_transformer_test` on one device (tests override mesh_shape/layout)."""
  return with_mesh(sets.routing_transformer_test(), "model:1", MODEL_PARALLEL_LAYOUT,
                   sequences=2, vocab_divisor=8)
