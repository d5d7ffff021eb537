"""Every change this project makes to Tensor2Tensor, TensorFlow and the modules they import, in
one place, applied only by an explicit `install()`.

Importing `routing_transformer` (or any module of it) patches nothing. `install()` is called by
`t2t_usr_dir` (what the stock T2T binaries and this project's tools import) and, with
`MODEL_FIXES` only, by the T2T models (`t2t.model`, `t2t.mtf`), the hparams sets and the
problems, which cannot build or train on TF 2.15 without them. Each patch is registered with a
one-line reason in `PATCHES`; `install` is idempotent (a patch is applied once per process).
tests/test_patches.py checks each one: that the fixes are still needed on this stack (the
unpatched behaviour is still broken) and that the patched behaviour works.

The fixes (`MODEL_FIXES`) come first; the wrappers of T2T's functions for the stock binaries
(one-line errors, resumable checkpoints, sampling settings, CPU placement) after them. The
non-finite guard wraps `ConditionalOptimizer.apply_gradients` as it is when `install` reaches it:
a fix of that method (e.g. of its global-step order) must come before `nan_guard` in `PATCHES`,
so the guard's update contains it.
"""
import collections
import contextlib
import sys
import types

Patch = collections.namedtuple("Patch", "name reason apply")
PATCHES = []  # in install order
_INSTALLED = set()


def patch(reason):
  """Registers the decorated function as a patch named after it, with its one-line reason."""
  def register(function):
    PATCHES.append(Patch(function.__name__, reason, function))
    return function
  return register


def install(names=None):
  """Applies the patches (all, or those named, in PATCHES order) not applied yet."""
  known = [p.name for p in PATCHES]
  unknown = set(names or ()) - set(known)
  if unknown:
    raise ValueError("unknown patches %s; known: %s" % (sorted(unknown), ", ".join(known)))
  for entry in PATCHES:
    if (names is None or entry.name in names) and entry.name not in _INSTALLED:
      entry.apply()
      _INSTALLED.add(entry.name)


def installed():
  """The names of the patches applied in this process."""
  return sorted(_INSTALLED)


# ---------------------------------------------------------------------------------------------
# Fixes: T2T, tf_slim and mesh_tensorflow on TF 2.15


@patch("TF 2.14 dropped ops.Tensor, ops.IndexedSlices and ops.register_tensor_conversion_function, "
       "which tf_slim (T2T's optimize_loss) and mesh_tensorflow still use")
def tf_aliases():
  from tensorflow.python.framework import ops  # pylint: disable=g-import-not-at-top
  from tensorflow.python.framework import indexed_slices  # pylint: disable=g-import-not-at-top
  from tensorflow.python.framework import tensor as tensor_lib  # pylint: disable=g-import-not-at-top
  from tensorflow.python.framework import tensor_conversion_registry  # pylint: disable=g-import-not-at-top
  if not hasattr(ops, "Tensor"):
    ops.Tensor = tensor_lib.Tensor
  if not hasattr(ops, "IndexedSlices"):
    ops.IndexedSlices = indexed_slices.IndexedSlices
  if not hasattr(ops, "register_tensor_conversion_function"):
    ops.register_tensor_conversion_function = (
        tensor_conversion_registry.register_tensor_conversion_function)


@patch("T2T's ConditionalOptimizer calls get_gradients, which its AdafactorOptimizer lacks on "
       "TF2 (the TF1 base class had it)")
def adafactor_get_gradients():
  from tensor2tensor.utils import adafactor  # pylint: disable=g-import-not-at-top

  def get_gradients(self, loss, var_list):
    return [g for g, _ in self.compute_gradients(loss, var_list)]

  adafactor.AdafactorOptimizer.get_gradients = get_gradients


@patch("T2T's TPUEstimator path (--use_tpu, --use_tpu_estimator) imports tf.contrib, which TF2 "
       "does not have")
def tpu_estimator_without_contrib():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow.compat.v1 as tf1  # pylint: disable=g-import-not-at-top
  from tensor2tensor.data_generators import problem  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import contrib  # pylint: disable=g-import-not-at-top
  from tensorflow_estimator.python.estimator.tpu import tpu_config  # pylint: disable=g-import-not-at-top
  from tensorflow_estimator.python.estimator.tpu import tpu_estimator  # pylint: disable=g-import-not-at-top

  def tpu():
    return types.SimpleNamespace(
        RunConfig=tf1.estimator.tpu.RunConfig,
        TPUConfig=tf1.estimator.tpu.TPUConfig,
        TPUEstimator=tf1.estimator.tpu.TPUEstimator,
        TPUEstimatorSpec=tf1.estimator.tpu.TPUEstimatorSpec,
        InputPipelineConfig=tf1.estimator.tpu.InputPipelineConfig,
        CrossShardOptimizer=tf1.tpu.CrossShardOptimizer,
        bfloat16_scope=tf1.tpu.bfloat16_scope,
    )

  def cluster_resolver():
    return tf.distribute.cluster_resolver

  contrib.tpu = tpu
  contrib.cluster_resolver = cluster_resolver
  if getattr(problem, "tpu_config", None) is None:
    problem.tpu_config = tpu_config
  # trainer_lib.create_estimator does `from tensorflow.contrib.tpu.python.tpu import
  # tpu_estimator`; serve exactly that import path (and nothing else of contrib).
  name = "tensorflow.contrib.tpu.python.tpu"
  if name not in sys.modules:
    parts = name.split(".")
    for i in range(2, len(parts) + 1):
      mod_name = ".".join(parts[:i])
      if mod_name not in sys.modules:
        sys.modules[mod_name] = types.ModuleType(mod_name)
    sys.modules[name].tpu_estimator = tpu_estimator


@patch("TF2 Keras runs T2TModel.call through autograph also in graph mode: 15-20 s of every "
       "graph build transpiling TF1 graph code that does not need it")
def t2t_model_call_without_autograph():
  """T2T's and this project's model code is TF1 graph code (tf.cond / tf.while_loop, no Python
  control flow on tensors), so the graph is the same without autograph; code that did need it
  would fail at graph build ("using a tf.Tensor as a Python bool"), not silently differ."""
  from tensor2tensor.utils import t2t_model  # pylint: disable=g-import-not-at-top
  from tensorflow.python.autograph.impl import api  # pylint: disable=g-import-not-at-top
  call = t2t_model.T2TModel.__dict__["call"]
  if not api.is_autograph_artifact(call):
    t2t_model.T2TModel.call = api.do_not_convert(call)


# The maintainer's fix of ConditionalOptimizer.apply_gradients' global-step order goes here, as
# one more @patch function, listed in MODEL_FIXES before "nan_guard".

@patch("T2T 1.15.7's TF2 ConditionalOptimizer increments the global step unordered with the "
       "learning-rate and Adafactor decay-rate reads: training must read it before, as TF1 does")
def step_order():
  """Increments the global step after the update, as TF1's `apply_gradients(global_step=...)`.

  On TF2, T2T's `ConditionalOptimizer.apply_gradients` runs the update under a control
  dependency on `assign_add(global_step, 1)`, while the learning-rate schedule and Adafactor's
  decay rate (`1 - (step + 1)^-0.8`) read the global step with no order against that increment:
  each step saw the old or the new number as the threads ran, so two runs from one seed differed
  (the first step's decay rate was 0.0 or 0.42565). Here every read that feeds the update precedes
  the increment, always, as in the original release's TF1 graph.
  """
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import optimize  # pylint: disable=g-import-not-at-top

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    if global_step is None:  # T2T's TF2 branch always increments the global step
      global_step = tf.train.get_or_create_global_step()
    if isinstance(self._opt, tf.train.Optimizer):  # Adafactor, SGD, ...: TF1's own order
      return self._opt.apply_gradients(grads_and_vars, global_step=global_step, name=name)
    update = self._opt.apply_gradients(grads_and_vars, name=name)  # Keras optimizers
    with tf.control_dependencies([update]), tf.colocate_with(global_step):
      return tf.assign_add(global_step, 1).op

  optimize.ConditionalOptimizer.apply_gradients = apply_gradients


_GUARDED = []  # stack of (loss, centroid variables) set by `guarding`


@contextlib.contextmanager
def guarding(loss, centroids):
  """While active, T2T's ConditionalOptimizer.apply_gradients applies a step only when the loss,
  its gradients and the centroids are finite (`core.health.guarded_update`; needs `nan_guard`
  installed)."""
  if "nan_guard" not in _INSTALLED:
    raise RuntimeError("routing_transformer.t2t.patches.install() first: the non-finite guard "
                       "wraps T2T's optimizer.")
  _GUARDED.append((loss, list(centroids)))
  try:
    yield
  finally:
    _GUARDED.pop()


@patch("the non-finite guard (hparams nan_guard) decides inside T2T's optimizer whether a step "
       "is applied; T2T has no hook there")
def nan_guard():
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import optimize  # pylint: disable=g-import-not-at-top
  from routing_transformer.core import health  # pylint: disable=g-import-not-at-top
  original = optimize.ConditionalOptimizer.apply_gradients

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    if not _GUARDED:
      return original(self, grads_and_vars, global_step=global_step, name=name)
    grads_and_vars = list(grads_and_vars)
    loss, centroids = _GUARDED[-1]
    step = tf.train.get_or_create_global_step() if global_step is None else global_step
    return health.guarded_update(
        lambda: original(self, grads_and_vars, global_step=global_step, name=name), loss,
        grads_and_vars, centroids, tf.convert_to_tensor(step))

  optimize.ConditionalOptimizer.apply_gradients = apply_gradients


MODEL_FIXES = ("tf_aliases", "adafactor_get_gradients", "tpu_estimator_without_contrib",
               "t2t_model_call_without_autograph", "step_order", "nan_guard")


# ---------------------------------------------------------------------------------------------
# The stock T2T binaries: one-line errors, checkpoints, decoding, placement (t2t_usr_dir)


@patch("t2t-trainer/t2t-decoder build hparams long before the model runs: an unknown set or "
       "hparams our models cannot run must stop at once with one line")
def create_hparams_checks():
  from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import trainer_lib  # pylint: disable=g-import-not-at-top
  from routing_transformer.t2t import glue  # pylint: disable=g-import-not-at-top
  original = trainer_lib.create_hparams

  def create_hparams(hparams_set, *args, **kwargs):
    ours = glue.model_flag() in glue.OUR_MODELS
    if ours and hparams_set not in registry.list_hparams():
      import hparams  # pylint: disable=g-import-not-at-top
      sets = [s for s in hparams.PROJECT_SETS if not s.startswith("cifar10_routing_h")]
      sys.exit("error: unknown hparams set %r for --model=%s. Registered sets of this project: "
               "%s, cifar10_routing_h*_l*_w* (all: t2t-trainer --registry_help)." % (
                   hparams_set, glue.model_flag(), ", ".join(sets)))
    hparams = original(hparams_set, *args, **kwargs)
    problem = registry.model(glue.model_flag()).hparams_error(hparams) if ours else None
    if problem:
      sys.exit("error: --hparams_set=%s: %s" % (hparams_set, problem))
    return hparams

  trainer_lib.create_hparams = create_hparams


@patch("routing_transformer_mtf's hparams and layout must be checked where t2t-trainer makes "
       "them (a layout the mesh cannot split fails deep inside the Estimator otherwise)")
def mtf_create_hparams_checks():
  from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import trainer_lib  # pylint: disable=g-import-not-at-top
  from routing_transformer.t2t import glue  # pylint: disable=g-import-not-at-top
  original = trainer_lib.create_hparams

  def create_hparams(*args, **kwargs):
    hparams = original(*args, **kwargs)
    if glue.model_flag() == glue.MTF_MODEL:
      problem = registry.model(glue.MTF_MODEL).hparams_error(hparams)
      if problem:
        sys.exit("error: --model=%s: %s" % (glue.MTF_MODEL, problem))
    return hparams

  trainer_lib.create_hparams = create_hparams


@patch("--decode_hparams knows only T2T's decode hparams: sampling_method, sampling_temp, "
       "sampling_keep_top_k and nucleus_sampling must be settable there")
def sampling_decode_hparams():
  """Unset values fall back to the model hparams of the same names."""
  from tensor2tensor.utils import decoding  # pylint: disable=g-import-not-at-top
  from routing_transformer.t2t import decode_settings  # pylint: disable=g-import-not-at-top
  original = decoding.decode_hparams

  def decode_hparams(overrides=""):
    hp = original("")
    for name, unset in decode_settings.UNSET.items():
      if name not in hp.values():
        hp.add_hparam(name, unset)
    try:
      hp.parse(overrides)
    except ValueError as e:
      sys.exit("error: --decode_hparams=%r: %s" % (overrides, e))
    return hp

  decoding.decode_hparams = decode_hparams


@patch("T2T's decode_from_file accepts empty or too long prompts and writes continuations "
       "without their prompts: check them first, write `<prompt>\\t<continuation>` lines")
def decode_from_file_prompts():
  """For our language models (no inputs) only; tabs/newlines inside are escaped as \\t, \\n.
  Other models keep T2T's behaviour."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import decoding  # pylint: disable=g-import-not-at-top
  from routing_transformer.t2t import glue  # pylint: disable=g-import-not-at-top
  original = decoding.decode_from_file
  original_log = decoding.log_decode_results

  def decode_from_file(estimator, filename, hparams, decode_hp, decode_to_file=None,
                       checkpoint_path=None):
    p_hp = hparams.problem_hparams
    language_model = "inputs" not in p_hp.vocabulary
    if glue.model_flag() not in glue.OUR_MODELS or not language_model:
      return original(estimator, filename, hparams, decode_hp, decode_to_file, checkpoint_path)
    prompts = glue.read_prompts(filename, decode_hp.delimiter)
    glue.check_prompts(prompts, filename, p_hp.vocabulary["targets"],
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
    # pylint: disable=protected-access
    if decode_to_file:
      path = decoding._add_shard_to_filename(decode_to_file, decode_hp)
    else:
      path = decoding._decode_filename(
          decoding._add_shard_to_filename(filename, decode_hp), flags.FLAGS.problem, decode_hp)
    # pylint: enable=protected-access
    glue.write_prompts_and_continuations(filename, path, decode_hp, continuations)

  decoding.decode_from_file = decode_from_file


@patch("sampling settings (model and decode hparams) must be checked before any decoding graph "
       "is built; T2T checks none of them")
def create_estimator_checks():
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import trainer_lib  # pylint: disable=g-import-not-at-top
  from routing_transformer.core import decoding  # pylint: disable=g-import-not-at-top
  from routing_transformer.t2t import decode_settings  # pylint: disable=g-import-not-at-top
  from routing_transformer.t2t import glue  # pylint: disable=g-import-not-at-top
  original = trainer_lib.create_estimator

  def create_estimator(model_name, hparams, run_config, *args, **kwargs):
    decode_hp = kwargs.get("decode_hparams", args[1] if len(args) > 1 else None)
    if model_name in glue.OUR_MODELS and decode_hp is not None:
      try:
        note = decode_settings.inherited_top_p_note(hparams, decode_hp)
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

  trainer_lib.create_estimator = create_estimator


@patch("t2t-trainer ignores --xla_compile silently, resumes from a damaged newest checkpoint, and "
       "--save_checkpoints_secs replaces the step-based saves instead of adding to them")
def trainer_checkpoints():
  """Wraps T2T's create_run_config and create_experiment:

  - `--xla_compile`, which T2T ignores, prints one warning line (`glue.XLA_COMPILE_IGNORED`);
  - before the Estimator exists, the chief makes the run restore the newest complete checkpoint
    (`checkpoint_files.prepare_resume`: a damaged newest one is moved to <output_dir>/damaged/,
    with one warning line), or stops with one line when none is complete;
  - `--save_checkpoints_secs=S` saves every S seconds *as well as* every
    max(iterations_per_loop, local_eval_frequency) steps; without the flag, every
    `reliability.DEFAULT_CHECKPOINT_SECS` (0 turns it off). On TPU T2T's behaviour is kept.
  """
  from absl import flags  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import trainer_lib  # pylint: disable=g-import-not-at-top
  from routing_transformer.t2t import checkpoint_files  # pylint: disable=g-import-not-at-top
  from routing_transformer.t2t import glue  # pylint: disable=g-import-not-at-top
  from routing_transformer.t2t import reliability  # pylint: disable=g-import-not-at-top
  original_config = trainer_lib.create_run_config
  original_experiment = trainer_lib.create_experiment
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
      sys.stderr.write(glue.XLA_COMPILE_IGNORED + "\n")
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

  trainer_lib.create_run_config = create_run_config
  trainer_lib.create_experiment = create_experiment


@patch("t2t-decoder restores a damaged or missing checkpoint with a traceback deep inside the "
       "Estimator; check it first and name the newest good one")
def decoder_checkpoints():
  """Wraps decode_from_dataset / decode_from_file / decode_interactively (after
  `decode_from_file_prompts`): the checkpoint to restore (--checkpoint_path, else the latest in
  --output_dir) is checked first."""
  from tensor2tensor.utils import decoding  # pylint: disable=g-import-not-at-top
  from routing_transformer.t2t import checkpoint_files  # pylint: disable=g-import-not-at-top

  def checked(original):
    def decode(estimator, *args, **kwargs):
      path = kwargs.get("checkpoint_path") or estimator.model_dir
      try:
        checkpoint_files.find_checkpoint(path)
      except checkpoint_files.CheckpointError as e:
        sys.exit("error: %s" % e)
      return original(estimator, *args, **kwargs)
    return decode

  for name in ("decode_from_dataset", "decode_from_file", "decode_interactively"):
    setattr(decoding, name, checked(getattr(decoding, name)))


@patch("T2T places the model on gpu:0 by default: without a GPU, soft placement logs thousands "
       "of colocation warnings per t2t-trainer start")
def cpu_placement_without_gpu():
  """Wraps T2T's devices.data_parallelism: with no GPU visible, its shards and variables go on
  cpu:0 instead of gpu:0..N-1 (as many shards as --worker_gpu asks for); with a GPU T2T's
  placement is kept. Without a GPU and with oneDNN off by TF's default (an AVX2-only CPU), one
  more INFO line says how to turn it on (`glue.onednn_hint`)."""
  from tensor2tensor.utils import devices  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import expert_utils  # pylint: disable=g-import-not-at-top
  from routing_transformer.t2t import glue  # pylint: disable=g-import-not-at-top
  original = devices.data_parallelism

  def data_parallelism(*args, **kwargs):
    parallelism = original(*args, **kwargs)
    if glue.gpus_visible():
      return parallelism
    # pylint: disable=protected-access
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    tf.compat.v1.logging.info("No GPU visible: the %d data shard(s) %s and their variables are "
                              "placed on cpu:0.", parallelism.n, parallelism._devices)
    hint = glue.onednn_hint(glue.onednn_enabled())
    if hint:
      tf.compat.v1.logging.info(hint)
    return expert_utils.Parallelism(
        [glue.on_cpu(d) for d in parallelism._devices], reuse=parallelism._reuse,
        caching_devices=parallelism._caching_devices,
        daisy_chain_variables=parallelism._daisy_chain_variables,
        ps_devices=[glue.on_cpu(d) for d in parallelism._ps_devices])

  devices.data_parallelism = data_parallelism


@patch("uncaught errors of the binaries (bad input, full disk, a non-finite step) must print "
       "one line naming the fix, not a traceback")
def one_line_errors():
  from routing_transformer.t2t import glue  # pylint: disable=g-import-not-at-top
  glue.install_error_hook()
