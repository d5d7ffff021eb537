"""The `hparams.json` kept beside a checkpoint (T2T writes one into every output_dir; the original
release's RT-base keeps one beside ckpt-3530000): compare it with an hparams set, or build from it.

Modes of the converter's and scorer's `--hparams_json`:
  check   (default) a differing hparams.json stops the tool with one report naming every
          difference (both values); no hparams.json: nothing to check
  use     build the hparams from hparams.json (over --hparams_set, default the base set), then
          apply --hparams
  ignore  do not read it

Compared: the hparams both sides have, except optimizer/learning-rate/batch/dropout/decoding
settings, which do not change what a trained model computes (TRAINING_ONLY). Names the model does
not know are reported (when set to a true value) but never used.
"""
import json
import os
import re

import tensorflow as tf

FILENAME = "hparams.json"
MODES = ("check", "use", "ignore")
BASE_SET = "sparse_transformer_local"
TRAINING_ONLY = re.compile(
    r"(optimizer|learning_rate|batch_size|min_length|length_bucket|max_input_seq|"
    r"max_target_seq|.*dropout|weight_decay|weight_noise|clip_grad_norm|grad_noise|"
    r"label_smoothing|daisy_chain|summarize|eval_|use_fixed_batch|split_to_length|"
    r"sampling_|nucleus_sampling|fast_decode|nan_guard|dead_cluster|reseed_dead|"
    r"skip_corrupt|initializer|moe_|symbol_modality|scheduled_sampling|pack_dataset|"
    r"factored_logits|shared_embedding|multiproblem|mixed_precision|activation_dtype|"
    r"weight_dtype|bottom|top|loss|logits_chunk|name|mode).*\Z")


class HParamsJsonError(ValueError):
  """hparams.json disagrees with the hparams, or cannot be read; the message names the fix."""
  one_line = True


def path_beside(checkpoint_prefix):
  """<checkpoint directory>/hparams.json if that file exists, else None."""
  path = os.path.join(os.path.dirname(checkpoint_prefix), FILENAME)
  return path if tf.io.gfile.exists(path) else None


def read(path):
  """{name: value} of an hparams.json; one-line error when it is not a JSON object."""
  try:
    with tf.io.gfile.GFile(path) as f:
      values = json.loads(f.read())
  except (ValueError, tf.errors.OpError) as e:
    raise HParamsJsonError("%s cannot be read as JSON (%s); fix or remove it, or pass "
                           "--hparams_json=ignore" % (path, e))
  if not isinstance(values, dict):
    raise HParamsJsonError("%s is not a JSON object of hparams; pass --hparams_json=ignore"
                           % path)
  return values


def _normal(value):
  """Comparable form: lists/tuples -> tuples, ints -> floats (1 == 1.0)."""
  if isinstance(value, (list, tuple)):
    return tuple(_normal(v) for v in value)
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    return value
  return float(value)


def differences(hparams, stored):
  """(changed, unknown): changed = [(name, json value, hparams value)] of compared names whose
  values differ; unknown = [(name, json value)] of names the hparams lack, set to a true value."""
  ours = hparams.values()
  changed = sorted((name, value, ours[name]) for name, value in stored.items()
                   if name in ours and not TRAINING_ONLY.match(name) and
                   _normal(value) != _normal(ours[name]))
  unknown = sorted((name, value) for name, value in stored.items()
                   if name not in ours and value)
  return changed, unknown


def report(path, set_name, changed, unknown):
  """One line naming every difference with both values."""
  parts = ["%s (hparams.json %r, %s %r)" % (name, theirs, set_name, mine)
           for name, theirs, mine in changed]
  text = "%s differs from %s in %d hparam(s): %s" % (path, set_name, len(changed),
                                                       "; ".join(parts))
  if unknown:
    text += "; set there but unknown to this model (ignored): %s" % ", ".join(
        "%s=%r" % item for item in unknown)
  return text + (". Pass --hparams_json=use to build the model from hparams.json, --hparams to "
                 "match it, or --hparams_json=ignore")


def build(hparams, stored):
  """hparams with every name it shares with `stored` set to the stored value (in place)."""
  ours = hparams.values()
  for name, value in stored.items():
    if name in ours and value != ours[name]:
      try:
        hparams.set_hparam(name, list(value) if isinstance(value, tuple) else value)
      except (ValueError, TypeError) as e:
        raise HParamsJsonError("hparams.json: %s=%r does not fit this model's hparam (%s)"
                               % (name, value, e))
  return hparams


def check(hparams, path, set_name):
  """Raises HParamsJsonError with the report when hparams.json at `path` differs."""
  changed, unknown = differences(hparams, read(path))
  if changed:
    raise HParamsJsonError(report(path, set_name, changed, unknown))
