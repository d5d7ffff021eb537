"""Glue for the stock T2T binaries: fail fast, with a message naming the fix, on bad hparams.

`t2t-trainer`/`t2t-decoder` build hparams with `trainer_lib.create_hparams` long before the model
body runs (after the input pipeline is built). `guard_create_hparams()` wraps that function so an
unknown hparams set, or hparams our models cannot run with, end the program at once with one
clear line instead of a traceback from inside the Estimator.
"""
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
  from routing_transformer import model as model_lib  # pylint: disable=g-import-not-at-top
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
