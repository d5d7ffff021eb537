"""Module paths from before the core / t2t / tools layout (2026-11-25), forwarded for a
deprecation period: `import routing_transformer.model` and `python -m routing_transformer.score`
still work and give the module at its new path, with a DeprecationWarning."""
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings

MOVED = {
    "attention": "core.attention", "cost": "core.cost", "decoding": "core.decoding",
    "heads": "core.heads", "health": "core.health", "keras": "core.keras",
    "kmeans": "core.kmeans", "layers": "core.layers", "recompute": "core.recompute",
    "sampling": "core.sampling",
    "checkpoint_files": "t2t.checkpoint_files", "compat": "t2t.compat", "t2t_glue": "t2t.glue",
    "hparams_json": "t2t.hparams_json", "model": "t2t.model", "mtf": "t2t.mtf",
    "perplexity": "t2t.perplexity", "reliability": "t2t.reliability", "usr_dirs": "t2t.usr_dirs",
    "analysis": "tools.analysis", "checkpoints": "tools.checkpoints", "curves": "tools.curves",
    "evaluate": "tools.evaluate", "probes": "tools.probes", "score": "tools.score",
}
_PREFIX = "routing_transformer."


def new_name(fullname):
  """'routing_transformer.probes.run' -> 'routing_transformer.tools.probes.run', or None."""
  if not fullname.startswith(_PREFIX):
    return None
  head, _, rest = fullname[len(_PREFIX):].partition(".")
  if head not in MOVED:
    return None
  return _PREFIX + MOVED[head] + ("." + rest if rest else "")


class _Forward(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """Finds an old path; loads it as the module at the new path (one object, two names)."""

  def __init__(self):
    self._specs = {}

  def find_spec(self, fullname, path=None, target=None):
    new = new_name(fullname)
    if new is None:
      return None
    real = importlib.util.find_spec(new)
    if real is None:
      return None
    spec = importlib.machinery.ModuleSpec(fullname, self, origin=real.origin,
                                          is_package=real.submodule_search_locations is not None)
    spec.submodule_search_locations = real.submodule_search_locations
    spec.has_location = real.has_location  # runpy's __file__
    return spec

  def create_module(self, spec):
    warnings.warn("%s moved to %s" % (spec.name, new_name(spec.name)), DeprecationWarning,
                  stacklevel=3)
    module = importlib.import_module(new_name(spec.name))
    self._specs[module.__name__] = module.__spec__
    return module

  def exec_module(self, module):
    module.__spec__ = self._specs[module.__name__]  # import set it to the old path's spec

  def get_code(self, fullname):  # `python -m OLD.PATH` (runpy)
    new = new_name(fullname)
    return importlib.util.find_spec(new).loader.get_code(new)

  def is_package(self, fullname):
    return importlib.util.find_spec(new_name(fullname)).submodule_search_locations is not None


def install():
  if not any(isinstance(f, _Forward) for f in sys.meta_path):
    sys.meta_path.insert(0, _Forward())  # before PathFinder, which would load a copy
