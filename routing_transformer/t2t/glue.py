"""Helpers of the stock T2T binaries' glue (`patches`): one-line messages for their errors and
the Python excepthook that prints them (`install_error_hook`, also used by rt-evaluate), prompts
of --decode_from_file, CPU placement without a GPU. Changes nothing of T2T or TF itself
(`patches` does, with these helpers).
"""
import os
import re
import sys

from absl import flags

OUR_MODELS = ("routing_transformer", "sparse_transformer")
MTF_MODEL = "routing_transformer_mtf"


def model_flag():
  """The binary's --model, or None (flags not parsed, not defined)."""
  try:
    return flags.FLAGS.model
  except (AttributeError, flags.UnparsedFlagAccessError):
    return None


def escape(text):
  """One line of a TSV field: backslash, tab and newline escaped."""
  return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")


def read_prompts(filename, delimiter="\n"):
  """The prompts of a --decode_from_file file, as T2T reads them (one per line)."""
  from tensor2tensor.utils import decoding  # pylint: disable=g-import-not-at-top
  return decoding._get_language_modeling_inputs(filename, delimiter)  # pylint: disable=protected-access


def write_prompts_and_continuations(filename, path, decode_hp, continuations):
  """Writes the decodes file `path` of --decode_from_file `filename`: one line per prompt,
  `<prompt>\\t<continuation>` (beams tab-separated with return_beams), escaped (`escape`)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  with tf.io.gfile.GFile(filename) as f:
    raw = f.read().split(decode_hp.delimiter)
  raw = (raw[:-1] if raw and not raw[-1] else raw) * decode_hp.num_decodes
  if decode_hp.return_beams:  # one continuation per beam, tab-separated
    size = decode_hp.beam_size
    continuations = ["\t".join(escape(c) for c in continuations[i:i + size])
                     for i in range(0, len(continuations), size)]
  else:
    continuations = [escape(c) for c in continuations]
  with tf.io.gfile.GFile(path, "w") as f:
    for prompt, text in zip(raw, continuations):
      f.write("%s\t%s\n" % (escape(prompt), text))
  print("Wrote %d prompt<TAB>continuation lines to %s" % (len(continuations), path))


def check_prompts(prompts, filename, vocabulary, max_length):
  """Exits with a clear message on an empty prompt file or a prompt longer than max_length."""
  if not prompts:
    sys.exit("error: --decode_from_file=%s has no prompts; write one prompt per line (an empty "
             "line asks for an unconditional sample)." % filename)
  for number, prompt in enumerate(prompts, 1):
    try:
      size = len(vocabulary.encode(prompt))
    except ValueError as e:
      sys.exit("error: --decode_from_file=%s line %d cannot be encoded: %s" % (filename, number,
                                                                              e))
    if size > max_length:
      sys.exit("error: --decode_from_file=%s line %d: the prompt is %d tokens, longer than the "
               "model's max_target_length=%d; shorten it." % (filename, number, size, max_length))


def _flag(name):
  try:
    return getattr(flags.FLAGS, name)
  except (AttributeError, flags.UnparsedFlagAccessError):
    return None


# t2t-trainer hands --xla_compile to create_experiment as use_xla, which T2T 1.15.7's
# create_estimator deletes unread (tests/test_t2t_distributed.py checks T2T's source).
XLA_COMPILE_IGNORED = (
    "warning: --xla_compile has no effect with T2T 1.15.7 (trainer_lib.create_estimator drops "
    "it); for XLA on the CPU set TF_XLA_FLAGS='--tf_xla_auto_jit=1 --tf_xla_cpu_global_jit' "
    "(docs/performance.md); TPUEstimator compiles with XLA on TPUs.")


def gpus_visible():
  """Whether TensorFlow sees a GPU (CUDA_VISIBLE_DEVICES respected)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return bool(tf.config.list_physical_devices("GPU"))


ONEDNN_HINT = (
    "oneDNN is off: TensorFlow turns its oneDNN ops on by default only on CPUs with AVX512_VNNI, "
    "AVX512_BF16 or AMX. TF_ENABLE_ONEDNN_OPTS=1 in the environment turns them on (bench-8k's "
    "training step ran 1.4-1.6x faster so on a 2-core AVX2-only EPYC; docs/performance.md); "
    "TF_ENABLE_ONEDNN_OPTS=0 keeps them off and this line away.")


def onednn_enabled():
  """Whether this process's TensorFlow runs its oneDNN ops (TF_ENABLE_ONEDNN_OPTS, read once
  when TensorFlow is imported; by default on only on CPUs with AVX512_VNNI, AVX512_BF16 or AMX,
  TF 2.9's release notes), or None where TF does not say."""
  try:
    from tensorflow.python.util import _pywrap_util_port  # pylint: disable=g-import-not-at-top
    return bool(_pywrap_util_port.IsMklEnabled())
  except (ImportError, AttributeError):
    return None


def onednn_hint(enabled, environ=None):
  """ONEDNN_HINT for a process whose TensorFlow left oneDNN off by its own default; None when
  oneDNN is on, unknown, or TF_ENABLE_ONEDNN_OPTS is set in `environ` (default os.environ)."""
  environ = os.environ if environ is None else environ
  if enabled is None or enabled or "TF_ENABLE_ONEDNN_OPTS" in environ:
    return None
  return ONEDNN_HINT


def on_cpu(device):
  """A local T2T device name with its GPU part on the CPU: 'gpu:1' -> 'cpu:0'. Devices of other
  tasks ('/job:...') and device functions (parameter servers) are left to T2T."""
  if not isinstance(device, str) or "/job:" in device:
    return device
  return re.sub(r"(?i)\bgpu:\d+", "cpu:0", device)


_KINDS = {"problems": "problem", "env_problems": "problem", "models": "model",
          "hparams": "hparams set", "ranged_hparams": "ranged hparams set"}


def unknown_name_message(error):
  """One line for T2T's KeyError 'X never registered with registry Y. Available: ...'."""
  if not isinstance(error, KeyError):
    return None
  match = re.search(r"(\S+) never registered with registry (\w+)", str(error))
  if not match:
    return None
  return unknown_message(_KINDS.get(match.group(2), match.group(2)),
                         match.group(1).strip("'\""))


def unknown_message(kind, name):
  """'unknown <kind> <name>. This project's: ...' (kind: problem, model, hparams set, ...)."""
  ours = {"problem": "problems.PROJECT_PROBLEMS", "model": None,
          "hparams set": "hparams.PROJECT_SETS"}.get(kind)
  listing = ""
  if kind == "model":
    listing = "routing_transformer, sparse_transformer, routing_transformer_mtf"
  elif ours:
    module, attr = ours.split(".")
    try:
      names = getattr(__import__(module), attr)
      listing = ", ".join(n for n in names if not n.startswith("cifar10_routing_h"))
    except (ImportError, AttributeError):
      listing = ""
  return ("unknown %s %r. This project's: %s (all registered names: t2t-trainer "
          "--registry_help)." % (kind, name, listing or "-"))


DATAGEN_NO_PROBLEM = "You must specify one of the supported problems to generate data for"


def datagen_problem_message(error):
  """One line for t2t-datagen's ValueError that lists every problem when --problem names none
  (a misspelt or unregistered name), or None."""
  if not isinstance(error, ValueError) or not str(error).startswith(DATAGEN_NO_PROBLEM):
    return None
  try:
    requested = flags.FLAGS.problem
  except (AttributeError, flags.UnparsedFlagAccessError):
    requested = None
  if not requested:
    return "t2t-datagen needs --problem=NAME, e.g. --problem=synthetic_long_range."
  return unknown_message("problem", requested)


ONE_LINE_ERRORS = ("DataError", "CheckpointMismatchError", "HParamsError")


def wrapped_one_line(error):
  """The message of a one-line error that autograph re-raised inside a StagingError, or None."""
  match = re.search(r"\b(%s): (.*)" % "|".join(ONE_LINE_ERRORS), str(error))
  return match.group(2).strip() if match else None


def corrupt_record_message(error):
  """One line for TF's DataLossError on a corrupt or truncated TFRecord shard, or None."""
  text = str(error)
  if type(error).__name__ != "DataLossError" and "corrupted record" not in text:
    return None
  detail = text.strip().splitlines()[0] if text.strip() else type(error).__name__
  return ("a TFRecord shard is corrupt or truncated (%s). Delete that shard and its stats file "
          "(<data_dir>/<problem>-stats/) and re-run t2t-datagen, which rewrites only missing "
          "shards; or pass --hparams=skip_corrupt_records=True to skip bad records with a "
          "warning." % detail)


def own_one_line(error):
  """The message of an error this project marks `one_line` (e.g. DataError), or None."""
  return str(error) if getattr(error, "one_line", False) else None


def vocabulary_mismatch_message(error):
  """The VocabularyMismatch text raised by a problem's record check inside the graph, or None."""
  if "VocabularyMismatch: " not in str(error):
    return None
  text = str(error).split("VocabularyMismatch: ", 1)[1].split("\n")[0]
  return re.sub(r"[\]\[]", "", text).strip()


def non_finite_message(error):
  """One line for the non-finite guard's stop (routing_transformer.core.health), or None."""
  from routing_transformer.core import health  # pylint: disable=g-import-not-at-top
  nonfinite = health.one_line(error)
  if not nonfinite:
    return None
  return ("training stopped: %s. No checkpoint was written for this step; restart from the "
          "last checkpoint with a lower learning rate (or clip_grad_norm), or set "
          "nan_guard=False to let it run." % nonfinite)


def disk_message(kind, value, traceback):
  """One line for a write that failed for lack of disk (full, read-only, vanished folder), with
  the full traceback written to a log file it names; or None (`reliability.disk_message`)."""
  from routing_transformer.t2t import reliability  # pylint: disable=g-import-not-at-top
  try:
    problem = reliability.disk_problem(value)
  except Exception:  # pylint: disable=broad-except
    return None
  if not problem:
    return None
  log_path = reliability.write_traceback(kind, value, traceback)
  output_dir, data_dir = _flag("output_dir"), _flag("data_dir")
  if output_dir:
    output_dir = os.path.expanduser(output_dir)
  if data_dir:
    data_dir = os.path.expanduser(data_dir)
  program = os.path.basename(sys.argv[0] or "")
  return reliability.disk_message(problem[0], problem[1],
                                  model_dir=None if program == "t2t-datagen" else output_dir,
                                  data_dir=data_dir, log_path=log_path)


def install_error_hook():
  """Uncaught errors marked `one_line` (e.g. problems.errors.DataError) print as one line.

  They reach Python's excepthook through absl's app.run; anything else keeps its traceback.
  """
  previous = sys.excepthook
  if getattr(previous, "_routing_guard", False):
    return

  def hook(kind, value, traceback):
    disk = disk_message(kind, value, traceback)
    if disk:
      sys.stderr.write("error: %s\n" % disk)
      return
    for message in (own_one_line, wrapped_one_line, unknown_name_message, datagen_problem_message,
                    corrupt_record_message, vocabulary_mismatch_message, non_finite_message):
      text = message(value)
      if text:
        sys.stderr.write("error: %s\n" % text)
        return
    previous(kind, value, traceback)

  hook._routing_guard = True  # pylint: disable=protected-access
  sys.excepthook = hook
