"""Glue for the stock T2T binaries: fail fast, with a message naming the fix, on bad hparams.

`t2t-trainer`/`t2t-decoder` build hparams with `trainer_lib.create_hparams` long before the model
body runs (after the input pipeline is built). `guard_create_hparams()` wraps that function so an
unknown hparams set, or hparams our models cannot run with, end the program at once with one
clear line instead of a traceback from inside the Estimator.
"""
import os
import re
import sys

from absl import flags

OUR_MODELS = ("routing_transformer", "sparse_transformer")


def _model_flag():
  try:
    return flags.FLAGS.model
  except (AttributeError, flags.UnparsedFlagAccessError):
    return None


def guard_create_hparams():
  """Wraps trainer_lib.create_hparams once (idempotent)."""
  from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import trainer_lib  # pylint: disable=g-import-not-at-top
  from routing_transformer.t2t import model as model_lib  # pylint: disable=g-import-not-at-top
  original = trainer_lib.create_hparams
  if getattr(original, "_routing_guard", False):
    return

  def create_hparams(hparams_set, *args, **kwargs):
    ours = _model_flag() in OUR_MODELS
    if ours and hparams_set not in registry.list_hparams():
      import hparams  # pylint: disable=g-import-not-at-top
      sets = [s for s in hparams.PROJECT_SETS if not s.startswith("cifar10_routing_h")]
      sys.exit("error: unknown hparams set %r for --model=%s. Registered sets of this project: "
               "%s, cifar10_routing_h*_l*_w* (all: t2t-trainer --registry_help)." % (hparams_set, _model_flag(),
                                                                ", ".join(sets)))
    hparams = original(hparams_set, *args, **kwargs)
    if ours:
      try:
        model_lib.check_hparams(hparams)
      except model_lib.HParamsError as e:
        sys.exit("error: --hparams_set=%s: %s" % (hparams_set, e))
    return hparams

  create_hparams._routing_guard = True  # pylint: disable=protected-access
  trainer_lib.create_hparams = create_hparams


def add_sampling_decode_hparams():
  """Lets `--decode_hparams` set sampling_method, sampling_temp, sampling_keep_top_k and
  nucleus_sampling (unset values fall back to the model hparams of the same names)."""
  from tensor2tensor.utils import decoding  # pylint: disable=g-import-not-at-top
  from routing_transformer.core import decoding as ours  # pylint: disable=g-import-not-at-top
  original = decoding.decode_hparams
  if getattr(original, "_routing_guard", False):
    return

  def decode_hparams(overrides=""):
    hp = original("")
    for name, unset in ours.UNSET.items():
      if name not in hp.values():
        hp.add_hparam(name, unset)
    try:
      hp.parse(overrides)
    except ValueError as e:
      sys.exit("error: --decode_hparams=%r: %s" % (overrides, e))
    return hp

  decode_hparams._routing_guard = True  # pylint: disable=protected-access
  decoding.decode_hparams = decode_hparams


def escape(text):
  """One line of a TSV field: backslash, tab and newline escaped."""
  return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")


def read_prompts(filename, delimiter="\n"):
  """The prompts of a --decode_from_file file, as T2T reads them (one per line)."""
  from tensor2tensor.utils import decoding  # pylint: disable=g-import-not-at-top
  return decoding._get_language_modeling_inputs(filename, delimiter)  # pylint: disable=protected-access


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


def guard_decode_from_file():
  """Wraps decoding.decode_from_file for our language models (no inputs):

  checks the prompts first (empty file, too long), then writes the decodes file as one line per
  prompt: `<prompt>\\t<continuation>` (tabs/newlines inside escaped as \\t, \\n), so prompt and
  continuation stay clearly apart. Other models keep T2T's behaviour.
  """
  from tensor2tensor.utils import decoding  # pylint: disable=g-import-not-at-top
  original = decoding.decode_from_file
  if getattr(original, "_routing_guard", False):
    return
  original_log = decoding.log_decode_results

  def decode_from_file(estimator, filename, hparams, decode_hp, decode_to_file=None,
                       checkpoint_path=None):
    p_hp = hparams.problem_hparams
    language_model = "inputs" not in p_hp.vocabulary
    if _model_flag() not in OUR_MODELS or not language_model:
      return original(estimator, filename, hparams, decode_hp, decode_to_file, checkpoint_path)
    prompts = read_prompts(filename, decode_hp.delimiter)
    check_prompts(prompts, filename, p_hp.vocabulary["targets"],
                  hparams.max_target_length or hparams.max_length)
    continuations = []

    def log_decode_results(*args, **kwargs):
      result = original_log(*args, **kwargs)
      continuations.append(result[1])
      return result

    decoding.log_decode_results = log_decode_results
    try:
      original(estimator, filename, hparams, decode_hp, decode_to_file, checkpoint_path)
    finally:
      decoding.log_decode_results = original_log
    if decode_to_file:
      path = decoding._add_shard_to_filename(decode_to_file, decode_hp)  # pylint: disable=protected-access
    else:
      path = decoding._decode_filename(  # pylint: disable=protected-access
          decoding._add_shard_to_filename(filename, decode_hp), flags.FLAGS.problem, decode_hp)
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

  decode_from_file._routing_guard = True  # pylint: disable=protected-access
  decoding.decode_from_file = decode_from_file


def guard_create_estimator():
  """Checks the sampling settings (model and decode hparams) before any decoding graph is built."""
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import trainer_lib  # pylint: disable=g-import-not-at-top
  from routing_transformer.core import decoding  # pylint: disable=g-import-not-at-top
  original = trainer_lib.create_estimator
  if getattr(original, "_routing_guard", False):
    return

  def create_estimator(model_name, hparams, run_config, *args, **kwargs):
    decode_hp = kwargs.get("decode_hparams", args[1] if len(args) > 1 else None)
    if model_name in OUR_MODELS and decode_hp is not None:
      try:
        note = decoding.inherited_top_p_note(hparams, decode_hp)
      except decoding.DecodeError as e:
        sys.exit("error: sampling settings (--hparams/--decode_hparams): %s" % e)
      if note:
        tf.logging.warning(note)
      if hparams.get("fast_decode", True):
        try:
          decoding.check_cached_decoding(hparams)
        except decoding.DecodeError as e:
          sys.exit("error: %s" % e)
    return original(model_name, hparams, run_config, *args, **kwargs)

  create_estimator._routing_guard = True  # pylint: disable=protected-access
  trainer_lib.create_estimator = create_estimator


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


def guard_checkpoints():
  """Wraps T2T's create_run_config and create_experiment once (t2t-trainer):

  - `--xla_compile`, which T2T ignores, prints one warning line (`XLA_COMPILE_IGNORED`);
  - before the Estimator exists, the chief makes the run restore the newest complete checkpoint
    (`checkpoint_files.prepare_resume`: a damaged newest one is moved to <output_dir>/damaged/,
    with one warning line), or stops with one line when none is complete;
  - `--save_checkpoints_secs=S` saves every S seconds *as well as* every
    max(iterations_per_loop, local_eval_frequency) steps (T2T alone replaces the steps by the
    seconds); without the flag, every `reliability.DEFAULT_CHECKPOINT_SECS` (0 turns it off).
    On TPU T2T's behaviour is kept.
  """
  from tensor2tensor.utils import trainer_lib  # pylint: disable=g-import-not-at-top
  from routing_transformer.t2t import checkpoint_files  # pylint: disable=g-import-not-at-top
  from routing_transformer.t2t import reliability  # pylint: disable=g-import-not-at-top
  original_config, original_experiment = trainer_lib.create_run_config, trainer_lib.create_experiment
  if getattr(original_experiment, "_routing_guard", False):
    return
  timed = {}

  def create_run_config(*args, **kwargs):
    if not (kwargs.get("use_tpu") or kwargs.get("use_tpu_estimator")):
      secs = kwargs.get("save_checkpoints_secs")
      given = "save_checkpoints_secs" in flags.FLAGS and flags.FLAGS[
          "save_checkpoints_secs"].present
      timed["secs"] = secs if (secs or given) else reliability.DEFAULT_CHECKPOINT_SECS
      kwargs["save_checkpoints_secs"] = None
    return original_config(*args, **kwargs)

  def create_experiment(run_config, hparams, *args, **kwargs):
    if kwargs.get("use_xla"):
      sys.stderr.write(XLA_COMPILE_IGNORED + "\n")
    if run_config.is_chief:
      try:
        warning = checkpoint_files.prepare_resume(run_config.model_dir)
      except checkpoint_files.DamagedCheckpointError as e:
        sys.exit("error: %s" % e)
      if warning:
        sys.stderr.write(warning + "\n")
    if "secs" in timed and run_config.model_dir:
      hooks = list(kwargs.get("additional_train_hooks") or [])
      hooks.append(reliability.TimedCheckpointHook(run_config.model_dir, timed["secs"]))
      kwargs["additional_train_hooks"] = hooks
    return original_experiment(run_config, hparams, *args, **kwargs)

  create_experiment._routing_guard = True  # pylint: disable=protected-access
  trainer_lib.create_run_config = create_run_config
  trainer_lib.create_experiment = create_experiment


def guard_decoding_checkpoints():
  """Wraps T2T's decode_from_dataset / decode_from_file / decode_interactively once
  (t2t-decoder): the checkpoint to restore (--checkpoint_path, else the latest in --output_dir)
  is checked first; a damaged or missing one stops with one line naming the newest good one."""
  from tensor2tensor.utils import decoding  # pylint: disable=g-import-not-at-top
  from routing_transformer.t2t import checkpoint_files  # pylint: disable=g-import-not-at-top

  def checked(original):
    if getattr(original, "_checkpoint_guard", False):
      return original

    def decode(estimator, *args, **kwargs):
      path = kwargs.get("checkpoint_path") or estimator.model_dir
      try:
        checkpoint_files.find_checkpoint(path)
      except checkpoint_files.CheckpointError as e:
        sys.exit("error: %s" % e)
      return original(estimator, *args, **kwargs)

    decode._checkpoint_guard = True  # pylint: disable=protected-access
    decode._routing_guard = getattr(original, "_routing_guard", False)  # pylint: disable=protected-access
    return decode

  for name in ("decode_from_dataset", "decode_from_file", "decode_interactively"):
    setattr(decoding, name, checked(getattr(decoding, name)))


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


def place_on_cpu_without_gpu():
  """Wraps T2T's devices.data_parallelism once: with no GPU visible, its shards and variables
  go on cpu:0 instead of gpu:0..N-1 (as many shards as --worker_gpu asks for).

  T2T places the model on gpu:0 by default. Without a GPU, soft placement moves everything to
  the CPU, and TensorFlow's placer logs a multi-line "Failed to place the graph without changing
  the devices of some resources ... Colocation Debug Info" warning for every group of ops
  colocated with a variable: thousands of lines per t2t-trainer start. With a GPU visible T2T's
  placement is kept. Without a GPU and with oneDNN off by TF's default (an AVX2-only CPU), one
  more INFO line says how to turn it on (`onednn_hint`).
  """
  from tensor2tensor.utils import devices  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import expert_utils  # pylint: disable=g-import-not-at-top
  original = devices.data_parallelism
  if getattr(original, "_routing_guard", False):
    return

  def data_parallelism(*args, **kwargs):
    parallelism = original(*args, **kwargs)
    if gpus_visible():
      return parallelism
    # pylint: disable=protected-access
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    tf.compat.v1.logging.info("No GPU visible: the %d data shard(s) %s and their variables are "
                              "placed on cpu:0.", parallelism.n, parallelism._devices)
    hint = onednn_hint(onednn_enabled())
    if hint:
      tf.compat.v1.logging.info(hint)
    return expert_utils.Parallelism(
        [on_cpu(d) for d in parallelism._devices], reuse=parallelism._reuse,
        caching_devices=parallelism._caching_devices,
        daisy_chain_variables=parallelism._daisy_chain_variables,
        ps_devices=[on_cpu(d) for d in parallelism._ps_devices])

  data_parallelism._routing_guard = True  # pylint: disable=protected-access
  devices.data_parallelism = data_parallelism


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
