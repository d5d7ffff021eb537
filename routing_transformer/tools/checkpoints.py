"""Checkpoints of the original release (`sparse_transformer`, e.g. the released PG-19 RT-base).

Our model computes the released model's function (post-norm blocks, bias-free q/k/v/output/GEGLU,
`emb_dense` and untied `final_dense_2` with biases, one [d_head, d_head] map shared by the heads,
LayerNorm-without-scale routing with unscaled logits; routing heads before local heads), but a few
variables live under other names. `LEGACY_NAMES` is the one table of those names; everything else
(embeddings, q/k/v, output_transform, ffn/weight1..3, layer norms, final_dense_*) is identical.

  python -m routing_transformer.tools.checkpoints --from ORIGINAL_CKPT --to OUT_DIR \\
      [--hparams_set pg19_local_cluster8k] [--hparams ...] [--model routing_transformer] \\
      [--hparams_json check|use|ignore] [--vocab VOCAB_FILE] [--t2t_usr_dir DIR,...]

reads with `tf.train.load_checkpoint` (tf.io.gfile: local or gs:// paths), renames, checks names
and shapes against our model built from the hparams (vocab size taken from the checkpoint), and
writes OUT_DIR/model.ckpt-<global_step> plus the `checkpoint` index file, which `t2t-decoder` /
`t2t-trainer --model=routing_transformer --output_dir=OUT_DIR` restore. Adafactor slots are dropped
(default) or renamed with their variable (`--optimizer_slots=map`, to continue training with
t2t-trainer, which also gets the bookkeeping variables it restores: `TRAINER_STATE`).

An hparams.json beside the checkpoint is compared with --hparams_set (one report naming every
difference), or used to build the hparams with --hparams_json=use (`hparams_json`). The tool prints
the model's parameter count and vocabulary size computed from the checkpoint's variables (and the
--vocab file's subword count), never from a file name.
"""
import argparse
import collections
import json
import os
import re
import sys

import numpy as np
import tensorflow as tf

from routing_transformer.t2t import checkpoint_files
from routing_transformer.t2t import hparams_json
from routing_transformer.t2t import model as model_lib
from routing_transformer.t2t import usr_dirs

tf1 = tf.compat.v1

# The checkpoint-file helpers, under the names callers of this module use.
CheckpointError = checkpoint_files.CheckpointError
CheckpointMismatchError = checkpoint_files.CheckpointMismatchError
find_checkpoint = checkpoint_files.find_checkpoint
read_variables = checkpoint_files.read_variables
variables_of = checkpoint_files.variables_of
write_checkpoint = checkpoint_files.write_checkpoint

ORIGINAL_MODEL = "sparse_transformer"
# Written beside a converted checkpoint: it holds an original release's weights
# (`is_original_release`).
ORIGINAL_RELEASE_FILE = "original_release.json"
GLOBAL_STEP = "global_step"
# Variables stock t2t-trainer creates outside TPU (t2t_model.create_dummy_vars) and restores when
# training resumes, with T2T's initial values; kept or added with optimizer_slots="map".
TRAINER_STATE = {
    "losses_avg/problem_0/total_loss": np.float32(100.0),
    "losses_avg/problem_0/extra_loss": np.float32(100.0),
    "losses_avg/problem_0/training_loss": np.float32(100.0),
    "train_stats/problem_0_steps": np.int32(0),
}

# Placeholders of the name templates below: {name} matches the regex.
_FIELDS = {
    "attn": r"(?:decoder|encoder)_layer_\d+/self_attention/self_attention",
    "table": r"relative_positions_(?:keys|values)",
    "kmeans": r"means|ema_count|ema_means",
}

# The one table of renamed variables: (our name, original name), relative to "<model>/body/".
LEGACY_NAMES = (
    ("{attn}/head_dense/kernel", "{attn}/attention_nd/dense/kernel"),
    ("{attn}/local/{table}/embeddings", "{attn}/attention_nd/local_nd/{table}/embeddings"),
    ("{attn}/routing/cluster_attention/{kmeans}",
     "{attn}/attention_nd/cluster_attention/cluster_attention/{kmeans}"),
    ("{attn}/routing/{table}/embeddings",
     "{attn}/attention_nd/cluster_attention/cluster_attention/{table}/embeddings"),
)


def _compile(template):
  """'{attn}/x' -> regex with named groups matching the whole name."""
  pattern = re.escape(template)
  for field, regex in _FIELDS.items():
    pattern = pattern.replace(re.escape("{%s}" % field), "(?P<%s>%s)" % (field, regex))
  return re.compile(pattern + r"\Z")


_TO_OURS = tuple((_compile(orig), ours) for ours, orig in LEGACY_NAMES)
_TO_ORIGINAL = tuple((_compile(ours), orig) for ours, orig in LEGACY_NAMES)


def _rename(rest, rules):
  """The first rule's template filled with its match of `rest`; `rest` when none matches."""
  for regex, template in rules:
    match = regex.match(rest)
    if match:
      return template.format(**match.groupdict())
  return rest


def _split_model(name):
  """'m/body/rest' -> ('m', 'rest'), or (None, name) for names outside a model body."""
  parts = name.split("/", 2)
  if len(parts) == 3 and parts[1] == "body":
    return parts[0], parts[2]
  return None, name


def from_original(name, model="routing_transformer"):
  """Original variable name -> ours (in scope `model`); names outside the body are unchanged."""
  scope, rest = _split_model(name)
  if scope != ORIGINAL_MODEL:
    return name
  return "%s/body/%s" % (model, _rename(rest, _TO_OURS))


def to_original(name):
  """Our variable name (any model scope) -> the original release's name."""
  scope, rest = _split_model(name)
  if scope is None:
    return name
  return "%s/body/%s" % (ORIGINAL_MODEL, _rename(rest, _TO_ORIGINAL))


def _is_kmeans(name):
  """Centroid variables: updated by EMA, not by the optimizer (no slots)."""
  return re.search(r"/(%s)\Z" % _FIELDS["kmeans"], name) is not None


def _is_model_variable(name, scope):
  return name.startswith(scope + "/body/")


def model_variables(hparams, vocab_size, model="routing_transformer",
                    mode=tf.estimator.ModeKeys.EVAL):
  """{name: shape} of every variable our model creates for `hparams` (built in a fresh graph)."""
  from tensor2tensor.data_generators import problem_hparams  # pylint: disable=g-import-not-at-top
  cls = {"routing_transformer": model_lib.RoutingTransformer,
         "sparse_transformer": model_lib.SparseTransformer}[model]
  hparams = copy_hparams(hparams)
  length = hparams.max_target_length or hparams.max_length
  with tf.Graph().as_default():
    p_hparams = problem_hparams.test_problem_hparams(vocab_size, vocab_size, hparams)
    net = cls(hparams, mode, p_hparams)
    net({"targets": tf.zeros([1, length, 1, 1], tf.int32)})
    return {v.op.name: tuple(v.shape.as_list()) for v in tf1.global_variables()}


def copy_hparams(hparams):
  """An independent copy of an HParams object."""
  from tensor2tensor.utils import hparam  # pylint: disable=g-import-not-at-top
  return hparam.HParams(**hparams.values())


Report = collections.namedtuple(
    "Report", ["renamed", "missing", "unused", "shape_mismatches", "slots", "global_step",
               "zero_slots"])
Report.__doc__ = """What a conversion found.

renamed: {original name: our name} of the model variables written.
missing: our model's variables the checkpoint lacks (sorted names).
unused: checkpoint variables that are neither model variables our model has, nor optimizer slots,
  nor global_step.
shape_mismatches: [(our name, checkpoint shape, our shape)].
slots: {checkpoint name: written name or None (dropped)} of optimizer slots
  (`[prefix/]<model variable>/<slot>`, e.g. `training/.../kernel/Adafactor`) and TRAINER_STATE.
global_step: int or None.
zero_slots: Adafactor slots the checkpoint lacked, written as zeros (Adafactor's initial state).
"""


def _ok(report):
  return not (report.missing or report.shape_mismatches)


def describe(report, limit=20):
  """Multi-line human summary of a Report (lists are cut at `limit` entries)."""
  def listing(items):
    items = list(items)
    more = "" if len(items) <= limit else " ... (%d more)" % (len(items) - limit)
    return ", ".join(str(i) for i in items[:limit]) + more

  kept = sum(1 for v in report.slots.values() if v)
  lines = ["model variables: %d renamed/kept; optimizer slots and trainer state: %d kept, "
           "%d dropped; global_step: %s" % (len(report.renamed), kept, len(report.slots) - kept,
                                report.global_step)]
  if report.zero_slots:
    lines.append("Adafactor slots the checkpoint lacked, written as zeros: %d"
                 % len(report.zero_slots))
  if report.missing:
    lines.append("MISSING in the checkpoint (%d): %s" % (len(report.missing),
                                                        listing(report.missing)))
  if report.shape_mismatches:
    lines.append("SHAPE MISMATCHES (%d; name checkpoint-shape vs model-shape): %s" % (
        len(report.shape_mismatches),
        listing("%s %s vs %s" % (n, list(a), list(b)) for n, a, b in report.shape_mismatches)))
  if report.unused:
    lines.append("unused checkpoint variables (%d, not written): %s"
                 % (len(report.unused), listing(report.unused)))
  return "\n".join(lines)


def _owner(name, leaves, scope):
  """(prefix, model variable) of a slot `[prefix/]<model variable>/<slot>`, or None."""
  start = name.find(scope + "/body/")
  if start < 0 or (start and name[start - 1] != "/"):
    return None
  parts = name[start:].split("/")
  for i in range(1, len(parts)):
    if "/".join(parts[:i]) in leaves:
      return name[:start], "/".join(parts[:i])
  return None


def _embedding_rows(variables, names):
  for name in names:
    if name in variables and len(variables[name][0]) == 2:
      return variables[name][0][0]
  return None


def plan(variables, hparams=None, model="routing_transformer", optimizer_slots="drop"):
  """Decides every variable's fate without reading values.

  Args:
    variables: {checkpoint name: (shape, dtype)} (see `read_variables`); original names
      (`sparse_transformer/...`) or ours (`routing_transformer/...`, converted again unchanged).
    hparams: model hparams to check names and shapes against, or None (rename only).
    model: target model scope, "routing_transformer" or "sparse_transformer".
    optimizer_slots: "drop" or "map" (rename `<var>/<slot>` along with its variable).
  Returns:
    Report.
  """
  if model not in ("routing_transformer", "sparse_transformer"):
    raise CheckpointError("--model=%s: use routing_transformer or sparse_transformer" % model)
  if optimizer_slots not in ("drop", "map"):
    raise CheckpointError("optimizer_slots=%r: use 'drop' or 'map'" % optimizer_slots)
  scopes = [s for s in (ORIGINAL_MODEL, "routing_transformer") if any(
      _is_model_variable(n, s) for n in variables)]
  if not scopes:
    raise CheckpointError("the checkpoint has no variables under sparse_transformer/body/ or "
                          "routing_transformer/body/; is it a Routing Transformer checkpoint?")
  scope = scopes[0]

  def ours(name):
    if scope == ORIGINAL_MODEL:
      return from_original(name, model)
    return from_original(to_original(name), model)

  candidates = {n for n in variables if _is_model_variable(n, scope)}
  leaves = {n for n in candidates if _owner(n, candidates, scope) is None}
  slot_owner = {n: _owner(n, leaves, scope) for n in variables if n not in leaves}
  slot_owner = {n: o for n, o in slot_owner.items() if o is not None}
  owners = sorted(leaves)
  renamed = {name: ours(name) for name in owners}

  expected = None
  if hparams is not None:
    vocab = _embedding_rows(variables, [n for n in owners if n.endswith("/embeddings/embedding")])
    if vocab is None:
      raise CheckpointError("the checkpoint has no <model>/body/embeddings/embedding; cannot tell "
                            "its vocabulary size")
    expected = model_variables(hparams, vocab, model)
    expected.pop(GLOBAL_STEP, None)

  missing, mismatches = [], []
  if expected is not None:
    have = {renamed[n]: variables[n][0] for n in owners}
    missing = sorted(n for n in expected if n not in have)
    mismatches = sorted((n, have[n], expected[n]) for n in expected
                        if n in have and tuple(have[n]) != tuple(expected[n]))
    unused_model = sorted(n for n in owners if renamed[n] not in expected)
    for name in unused_model:
      del renamed[name]
  else:
    unused_model = []
  trainable_targets = {v for v in renamed.values() if not _is_kmeans(v)}
  slots = {}
  for name, (prefix, owner) in slot_owner.items():
    target = renamed.get(owner)
    if optimizer_slots == "map" and target in trainable_targets:
      slots[name] = prefix + target + name[len(prefix) + len(owner):]
    else:
      slots[name] = None
  for name in TRAINER_STATE:
    if name in variables:
      slots[name] = name if optimizer_slots == "map" else None
  others = sorted(n for n in variables
                  if n not in leaves and n not in slots and n != GLOBAL_STEP)
  return Report(renamed=renamed, missing=missing, unused=unused_model + others,
                shape_mismatches=mismatches, slots=slots, global_step=None, zero_slots=[])


def adafactor_slots(name, shape, factored=True):
  """{slot name: shape} T2T's Adafactor (beta1 = 0) gives a variable under t2t-trainer's
  `training/` scope: factored second moments vr, vc for matrices, else v."""
  base = "training/%s/Adafactor" % name
  if factored and len(shape) >= 2:
    return {base: tuple(shape[:-1]), base + "_1": tuple(shape[:-2]) + tuple(shape[-1:])}
  return {base: tuple(shape)}


def _zero_slots(report, variables, hparams, written):
  """Zero Adafactor slots for mapped trainable variables whose slots the checkpoint lacks."""
  if hparams is None or hparams.optimizer.lower() != "adafactor" or \
      hparams.optimizer_adafactor_beta1:
    return {}
  out = {}
  for orig, ours in report.renamed.items():
    if _is_kmeans(ours):
      continue
    for name, shape in adafactor_slots(ours, variables[orig][0],
                                       hparams.optimizer_adafactor_factored).items():
      if name not in written:
        out[name] = np.zeros(shape, np.float32)
  return out


def convert(source, output_dir, hparams=None, model="routing_transformer",
            optimizer_slots="drop", strict=False, overwrite=False):
  """Converts an original-release checkpoint into one our model restores.

  Args:
    source: checkpoint prefix or directory (local or gs://).
    output_dir: directory to write model.ckpt-<global_step> and `checkpoint` into.
    hparams: HParams of the model (names and shapes are checked) or None (rename only).
    model: "routing_transformer" (scope of `--model=routing_transformer`) or "sparse_transformer".
    optimizer_slots: "drop" or "map".
    strict: also refuse checkpoints with unused variables.
    overwrite: allow an output_dir that already holds a checkpoint.
  Returns:
    (Report, written checkpoint prefix).
  Raises:
    CheckpointError: missing variables, shape mismatches (or unused ones when strict), or an
      existing checkpoint in output_dir; nothing is written then.
  """
  source = find_checkpoint(source)
  reader = tf.train.load_checkpoint(source)
  variables = variables_of(reader)
  report = plan(variables, hparams, model, optimizer_slots)
  step = int(reader.get_tensor(GLOBAL_STEP)) if GLOBAL_STEP in variables else 0
  report = report._replace(global_step=step)
  if not _ok(report) or (strict and report.unused):
    raise CheckpointError("cannot convert %s: %s" % (source, describe(report).replace("\n", "; ")))
  if not overwrite and tf.io.gfile.isdir(output_dir) and tf.train.latest_checkpoint(output_dir):
    raise CheckpointError("%s already holds a checkpoint; choose an empty directory or pass "
                          "--overwrite" % output_dir)
  tensors = {ours: reader.get_tensor(orig) for orig, ours in report.renamed.items()}
  tensors.update({ours: reader.get_tensor(orig) for orig, ours in report.slots.items() if ours})
  if optimizer_slots == "map":
    for name, value in TRAINER_STATE.items():
      tensors.setdefault(name, np.asarray(value))
    zeros = _zero_slots(report, variables, hparams, tensors)
    tensors.update(zeros)
    report = report._replace(zero_slots=sorted(zeros))
  tensors[GLOBAL_STEP] = np.asarray(step, np.int64)
  tf.io.gfile.makedirs(output_dir)
  prefix = os.path.join(output_dir, "model.ckpt-%d" % step)
  write_checkpoint(prefix, tensors)
  tf1.train.update_checkpoint_state(output_dir, prefix)
  with tf.io.gfile.GFile(os.path.join(output_dir, ORIGINAL_RELEASE_FILE), "w") as f:
    json.dump({"checkpoint": os.path.basename(prefix), "source": source}, f)
  return report, prefix


def hparams_from_flags(hparams_set, overrides="", t2t_usr_dir=None):
  """A registered hparams set (ours, or of a comma-separated --t2t_usr_dir) with `k=v,...`
  overrides."""
  from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
  try:
    usr_dirs.import_usr_dirs(t2t_usr_dir)
  except usr_dirs.UsrDirError as e:
    raise CheckpointError(str(e))
  try:
    hparams = registry.hparams(hparams_set)
  except LookupError:
    raise CheckpointError("unknown hparams set %r; e.g. pg19_local_cluster8k (the released "
                          "model's set)" % hparams_set)
  if overrides:
    hparams.parse(overrides)
  return hparams


def resolve_hparams(checkpoint, hparams_set=None, overrides="", mode="check", t2t_usr_dir=None):
  """The model hparams for a checkpoint prefix, with its hparams.json (see `hparams_json`).

  hparams_set: a registered name, an HParams object, or None (rename only, unless mode "use").
  Returns HParams or None. Raises CheckpointError (including the hparams.json report).
  """
  if mode not in hparams_json.MODES:
    raise CheckpointError("--hparams_json=%s: use one of %s" % (mode, ", ".join(
        hparams_json.MODES)))
  path = hparams_json.path_beside(checkpoint) if mode != "ignore" else None
  if mode == "use" and path is None:
    raise CheckpointError("--hparams_json=use: there is no %s beside %s" % (
        hparams_json.FILENAME, checkpoint))
  if hparams_set is None and mode != "use":
    return None
  if isinstance(hparams_set, str) or hparams_set is None:
    name = hparams_set or hparams_json.BASE_SET
    hparams = hparams_from_flags(name, "" if mode == "use" else overrides, t2t_usr_dir)
    label = "--hparams_set=%s%s" % (name, " --hparams=%s" % overrides if overrides else "")
  else:
    hparams, label = copy_hparams(hparams_set), "the given hparams"
    if overrides and mode != "use":
      hparams.parse(overrides)
  try:
    if mode == "use":
      hparams_json.build(hparams, hparams_json.read(path))
      if overrides:
        hparams.parse(overrides)
    elif path:
      hparams_json.check(hparams, path, label)
  except hparams_json.HParamsJsonError as e:
    raise CheckpointError(str(e))
  return hparams


def legacy_note(hparams):
  """One line telling to turn on legacy_causal_key_routing, or None when it does not apply."""
  if hparams is None or hparams.share_qk or hparams.legacy_causal_key_routing:
    return None
  if not (hparams.sparsity_cluster_num_heads and
          hparams.sparsity_skip_first < hparams.num_decoder_layers):
    return None
  return ("note: share_qk=False: the original release routed causal keys by their own centroid "
          "scores; run this checkpoint with --hparams=legacy_causal_key_routing=True (decode "
          "with fast_decode=False) to compute its function.")


def is_original_release(prefix, variables=None):
  """Whether checkpoint `prefix` holds an original-release model: its variables carry the
  original's names, or the converter wrote it (ORIGINAL_RELEASE_FILE beside it names it).

  variables: {name: (shape, dtype)} of the checkpoint if already read.
  """
  variables = read_variables(prefix) if variables is None else variables
  if any(from_original(name, ORIGINAL_MODEL) != name for name in variables):
    return True
  path = os.path.join(os.path.dirname(prefix), ORIGINAL_RELEASE_FILE)
  if not tf.io.gfile.exists(path):
    return False
  with tf.io.gfile.GFile(path) as f:
    return json.load(f).get("checkpoint") == os.path.basename(prefix)


def has_routing_heads(hparams):
  """Whether some decoder layer of `hparams` has routing heads."""
  return bool(hparams.sparsity_cluster_num_heads and
              hparams.sparsity_skip_first < hparams.num_decoder_layers)


def padding_note(hparams):
  """One line on routing_padding_as_original for a converted checkpoint with routing heads."""
  if hparams is None or not has_routing_heads(hparams):
    return None
  return ("note: the original release lets padding take part in routing (cluster membership, "
          "k-means statistics); the scorer and the probes set routing_padding_as_original=True "
          "for this checkpoint, so inputs shorter than max_target_length score as the original "
          "code scores them.")


def vocab_file_size(path):
  """Subwords in a T2T SubwordTextEncoder vocab file: its number of non-empty lines."""
  if not tf.io.gfile.exists(path):
    raise CheckpointError("--vocab %s: file not found" % path)
  with tf.io.gfile.GFile(path) as f:
    return sum(1 for line in f if line.strip())


def check_vocab(variables, path):
  """'--vocab file: N subwords' after checking N <= the checkpoint's embedding rows."""
  subwords = vocab_file_size(path)
  rows = _embedding_rows(variables, [n for n in variables
                                     if n.endswith("/body/embeddings/embedding")])
  if rows is not None and subwords > rows:
    raise CheckpointError("--vocab %s has %d subwords but the checkpoint's embedding only %d "
                          "rows; pass the vocabulary the model was trained with"
                          % (path, subwords, rows))
  return "--vocab file: %d subwords" % subwords


def model_summary(variables, report):
  """One line: parameters and vocabulary size computed from the written model variables.

  variables: {checkpoint name: (shape, dtype)}; report: its conversion Report. Trainable
  parameters exclude the k-means centroids and EMA statistics (counted apart). Vocabulary: rows
  of the embedding and columns of final_dense_2.
  """
  shapes = {ours: variables[orig][0] for orig, ours in report.renamed.items()}
  size = lambda shape: int(np.prod(shape, dtype=np.int64))
  trainable = sum(size(s) for n, s in shapes.items() if not _is_kmeans(n))
  kmeans = sum(size(s) for n, s in shapes.items() if _is_kmeans(n))
  rows = sorted({s[0] for n, s in shapes.items() if n.endswith("/body/embeddings/embedding")})
  columns = sorted({s[-1] for n, s in shapes.items() if n.endswith("/final_dense_2/kernel")})
  text = "parameters: %d (%.1fM) trainable, %d in k-means centroids/EMA statistics; vocabulary: " \
      "%s embedding rows, %s output columns" % (trainable, trainable / 1e6, kmeans,
                                                 "/".join(map(str, rows)) or "-",
                                                 "/".join(map(str, columns)) or "-")
  return text


def main(argv=None):
  parser = argparse.ArgumentParser(
      prog="python -m routing_transformer.tools.checkpoints",
      description="Convert an original-release Routing Transformer checkpoint to this project.")
  parser.add_argument("--from", dest="source", required=True,
                      help="original checkpoint prefix or directory (local or gs://)")
  parser.add_argument("--to", dest="output_dir", required=True, help="output directory")
  parser.add_argument("--hparams_set", default=None,
                      help="check names and shapes against this set (e.g. pg19_local_cluster8k)")
  parser.add_argument("--hparams", default="", help="overrides, k=v,k=v")
  parser.add_argument("--model", default="routing_transformer",
                      choices=["routing_transformer", "sparse_transformer"])
  parser.add_argument("--optimizer_slots", default="drop", choices=["drop", "map"])
  parser.add_argument("--strict", action="store_true", help="fail on unused variables too")
  parser.add_argument("--overwrite", action="store_true")
  parser.add_argument("--hparams_json", default="check", choices=hparams_json.MODES,
                      help="hparams.json beside the checkpoint: check it against --hparams_set "
                           "(default), use it to build the hparams, or ignore it")
  parser.add_argument("--vocab", default=None,
                      help="subword vocab file: its size is checked against the checkpoint")
  parser.add_argument("--t2t_usr_dir", default=None,
                      help="comma-separated user directories (their hparams sets)")
  args = parser.parse_args(argv)
  try:
    source = find_checkpoint(args.source)
    hparams = resolve_hparams(source, args.hparams_set, args.hparams, args.hparams_json,
                              args.t2t_usr_dir)
    variables = read_variables(source)
    vocab = check_vocab(variables, args.vocab) if args.vocab else None  # before any writing
    report, prefix = convert(source, args.output_dir, hparams, args.model,
                             args.optimizer_slots, args.strict, args.overwrite)
    summary = model_summary(variables, report) + ("; " + vocab if vocab else "")
  except (CheckpointError, ValueError, tf.errors.OpError) as e:
    sys.exit("error: %s" % (e.message if isinstance(e, tf.errors.OpError) else e))
  print(describe(report))
  print(summary)
  print("wrote %s (restore with --model=%s --output_dir=%s)" % (prefix, args.model,
                                                               args.output_dir))
  for note in (padding_note(hparams), legacy_note(hparams)):
    if note:
      print(note)
  return 0


if __name__ == "__main__":
  main()
