"""Per-device memory of a routing_transformer_mtf training step, computed from the Mesh-TF graph.

Builds the model of an hparams set (default `pg19_local_cluster8k`) as a Mesh-TF graph with its
gradients and the Adafactor update (nothing is lowered or run: only shapes), then, for each
mesh/layout, sums per-device slice sizes (Mesh-TF's own `slice_size` under the layout):

  params     trainable variables
  optimizer  Adafactor slots and the k-means state (non-trainable variables)
  grads      one gradient per trainable variable (transient, as large as the params)
  saved      the forward tensors the backward pass of the matmuls needs (operands of every
             einsum that are not variables): what must stay alive when XLA fuses and recomputes
             elementwise ops, so a realistic estimate of activation memory
  all acts   every float tensor of the forward pass kept (no rematerialisation, no fusion):
             an upper bound
  total      params + grads + optimizer + saved (`routing_transformer.core.cost.step_total`,
             as the TF model's arithmetic estimate scripts/memory_estimate.py adds up)

Usage: .venv/bin/python scripts/mtf_memory_estimate.py [--hparams_set=...] [--vocab=32768]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# pylint: disable=g-import-not-at-top,wrong-import-position
from routing_transformer.t2t import patches  # noqa: E402

patches.install(["tf_aliases"])  # mesh_tensorflow imports what TF 2.14 dropped
import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from routing_transformer.core import cost

# (model-parallel ways, mesh_shape, layout, note)
MESHES = [
    (1, "model:1", "", "one device"),
    (8, "model:8", "batch:batch;heads:model;d_ff:model;vocab:model",
     "heads (8) of the 21 all-local layers, d_ff and vocab split 8 ways"),
    (32, "model:32", "batch:batch;d_ff:model;vocab:model",
     "heads (8) cannot split 32 ways: only d_ff and vocab split"),
    (32, "batch:4;model:8", "batch:batch;heads:model;d_ff:model;vocab:model",
     "32 cores as 4 x 8-way model parallel, 4 sequences (1 per model group)"),
]
GIB = cost.GIB


def build(hparams, vocab):
  """The training graph (loss, gradients, Adafactor, k-means updates) -> (graph, forward ops)."""
  from routing_transformer.t2t.mtf import estimator
  from routing_transformer.t2t.mtf import model
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  net = model.MtfRoutingTransformer(hparams, mesh, vocab, train=True)
  targets = mtf.zeros(mesh, mtf.Shape([net.dims["batch"], net.dims["length"]]), tf.int32)
  loss = net.loss_and_logits(targets)[0]
  forward = list(graph.operations)
  variables = graph.trainable_variables
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  lr = mtf.constant(mesh, 0.01, mtf.Shape([]))
  estimator.make_optimizer(hparams, lr).apply_grads(grads, variables)
  return graph, forward


def per_device_bytes(graph, forward, mesh_shape, layout):
  """Bytes per device of params, optimizer state, gradients and forward activations."""
  shape = mtf.convert_to_shape(mesh_shape)
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(
      shape, mtf.convert_to_layout_rules(layout), [""] * shape.size)

  def size(t):
    return impl.slice_size(t.shape) * t.dtype.size

  params = sum(size(v.outputs[0]) for v in graph.trainable_variables)
  state = sum(size(v.outputs[0]) for v in graph.all_variables if not v.trainable)
  acts = sum(size(t) for op in forward if not isinstance(op, mtf.Variable)
             for t in op.outputs if t.dtype.is_floating)
  operands = {t for op in forward if isinstance(op, mtf.EinsumOperation) for t in op.inputs
              if not isinstance(t.operation, mtf.Variable) and t.dtype.is_floating}
  saved = sum(size(t) for t in operands)
  return dict(params=params, optimizer=state, grads=params, acts=acts, saved=saved,
              total=cost.step_total(params, state, saved))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--hparams_set", default="pg19_local_cluster8k")
  parser.add_argument("--vocab", type=int, default=32768, help="target vocabulary size")
  args = parser.parse_args()
  import hparams  # noqa: F401  (registers the sets)
  from tensor2tensor.utils import registry
  from hparams import mtf as mtf_sets
  rows = []
  for ways, mesh_shape, layout, note in MESHES:
    sequences = mtf.convert_to_shape(mesh_shape).to_integer_list[0] if "batch" in mesh_shape \
        else 1
    hp = mtf_sets.with_mesh(registry.hparams(args.hparams_set), mesh_shape, layout, sequences)
    with tf.Graph().as_default():
      graph, forward = build(hp, args.vocab)
      rows.append((ways, mesh_shape, layout, note, sequences,
                   per_device_bytes(graph, forward, mesh_shape, layout)))
  header = ("| ways | mesh_shape | layout | seqs | params | Adafactor+k-means | grads | "
            "saved activations | all activations (bound) | total GiB/device | note |")
  print("Per-device memory of one training step of %s (float32, length %d, vocab %d):"
        % (args.hparams_set, hp.max_length, args.vocab))
  print(header)
  print("|" + "---|" * 11)
  for ways, mesh_shape, layout, note, seqs, b in rows:
    print("| %d | `%s` | `%s` | %d | %.2f | %.2f | %.2f | %.2f | %.1f | **%.2f** | %s |" % (
        ways, mesh_shape, layout or "-", seqs, b["params"] / GIB, b["optimizer"] / GIB,
        b["grads"] / GIB, b["saved"] / GIB, b["acts"] / GIB, b["total"] / GIB, note))


if __name__ == "__main__":
  main()
