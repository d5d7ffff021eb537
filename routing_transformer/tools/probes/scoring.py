"""Scoring probe inputs: score_fn(inputs, targets) -> nll, one forward pass per input.

    scorer = build_scorer(checkpoint, "pg19_local_cluster8k", vocab, as_local=False)
    score_fn = make_score_fn(scorer)
    nll = score_fn(ids, positions)   # ids int32 [B, N] (N <= L, 0 = padding), positions [B, K]
                                     # nll float64 [B, K] = -log p(ids[b, p] | ids[b, :p])

Inputs are right-padded with 0 to the model's static length L (the padding is masked as keys;
with top-k routing it also never wins a cluster slot over a real token; an original-release
checkpoint is scored with routing_padding_as_original=True instead, padding routed as the
original code routes it, which build_scorer prints), rows batched `batch_size` at a time, and
only the K asked rows of the logits go through the softmax.

The derived local model (`as_local`): every routing head evaluated as a local head with the
same weights (q, k, v, output maps; the local heads' relative-position tables), no retraining:
the hparams override sparsity_skip_first = number of layers, which turns each layer's routing
heads into local heads (routing heads come first along the head axis, so head i keeps its
projections).
"""
import copy
import sys

import numpy as np

from routing_transformer.tools.probes.errors import ProbeError


def as_local_overrides(hparams):
  """The hparams overrides that evaluate every routing head as a local head."""
  return "sparsity_skip_first=%d" % max(hparams.num_hidden_layers, hparams.num_decoder_layers)


def local_receptive_field(hparams):
  """Tokens back a stack of local heads can reach: layers x (block + flange - 1) (a query
  attends to its own block causally and to the `memory_flange` tokens before the block)."""
  layers = hparams.num_decoder_layers or hparams.num_hidden_layers
  return layers * (hparams.query_shape[0] + hparams.memory_flange[0] - 1)


def build_scorer(checkpoint, hparams_set, vocab=None, hparams="", as_local=False, batch_size=1,
                 t2t_usr_dir=None, hparams_json="check", problem=None, data_dir=None,
                 reading="lines"):
  """A score.Scorer restored once; as_local: the derived local model of the same checkpoint.

  The hparams (set, overrides, hparams.json beside the checkpoint) are resolved and checked
  as the Scorer does; the as_local override is applied after that check. `reading`: how the
  books were read (`problems.pg19_reading`), checked against the vocabulary.
  """
  from routing_transformer.tools import checkpoints  # pylint: disable=g-import-not-at-top
  from routing_transformer.tools import score  # pylint: disable=g-import-not-at-top
  from routing_transformer.t2t import usr_dirs  # pylint: disable=g-import-not-at-top
  try:
    usr_dirs.import_usr_dirs(t2t_usr_dir)
    prefix = checkpoints.find_checkpoint(checkpoint)
    hp = checkpoints.resolve_hparams(prefix, hparams_set, hparams, hparams_json, t2t_usr_dir)
  except (checkpoints.CheckpointError, usr_dirs.UsrDirError) as e:
    raise ProbeError("%s: %s" % (checkpoint, e))
  if hp is None:
    raise ProbeError("%s: pass its --hparams_set (or --hparams_json=use)" % checkpoint)
  if as_local:
    hp = copy.deepcopy(hp)
    hp.parse(as_local_overrides(hp))
  try:
    scorer = score.Scorer(prefix, hp, vocab, batch_size=batch_size, problem=problem,
                          data_dir=data_dir, hparams_json="ignore", reading=reading)
  except score.ScorerError as e:
    raise ProbeError("%s: %s" % (checkpoint, e))
  for note in scorer.notes:  # e.g. routing_padding_as_original for original-release checkpoints
    sys.stderr.write("[probes] %s: %s\n" % (checkpoint, note))
  return scorer


def make_score_fn(scorer):
  """score_fn(inputs int [B, N], targets int [B, K]) -> nll float64 [B, K] (module docstring)."""
  from routing_transformer.tools import score  # pylint: disable=g-import-not-at-top

  def score_fn(inputs, targets):
    inputs = np.asarray(inputs)
    if inputs.ndim == 2 and inputs.shape[1] > scorer.length:
      raise ProbeError("N=%d is above the model's length L=%d; use prefix lengths <= %d"
                       % (inputs.shape[1], scorer.length, scorer.length))
    try:
      return -scorer.log_probs_at(inputs, targets).astype(np.float64)
    except score.ScorerError as e:
      raise ProbeError(str(e))

  score_fn.notes = list(getattr(scorer, "notes", []))
  score_fn.length = scorer.length
  score_fn.batch_size = scorer.batch_size
  score_fn.close = scorer.close
  return score_fn


def forward_flops_per_token(hparams, vocab_size, length):
  """Forward FLOPs per token (2 x multiply-adds): q/k/v/output maps (and head_dense), attention,
  FFN (geglu: 3 matrices), embedding dense, logits; layer norms and softmaxes left out.

  Attention per layer: local heads attend to block + flange keys, routing heads to `window`
  keys (queries x keys x depth x 2 for logits and for values).
  """
  h, f = hparams.hidden_size, hparams.filter_size
  layers = hparams.num_decoder_layers or hparams.num_hidden_layers
  heads = hparams.local_num_heads + hparams.sparsity_cluster_num_heads
  depth = h // heads
  ffn = 3 * h * f if hparams.ffn_layer == "geglu" else 2 * h * f
  maps = 4 * h * h + (h * depth if getattr(hparams, "head_dense", False) else 0)
  total = 0
  for i in range(layers):
    routing = 0 if i < hparams.sparsity_skip_first else hparams.sparsity_cluster_num_heads
    local_keys = hparams.query_shape[0] + hparams.memory_flange[0]
    routing_keys = min(hparams.sparsity_cluster_attention_window, length)
    attention = 2 * depth * ((heads - routing) * local_keys + routing * routing_keys)
    total += 2 * (maps + ffn) + 2 * attention
  return total + 2 * h * vocab_size + 2 * hparams.embedding_dims * h
