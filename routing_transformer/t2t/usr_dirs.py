"""`--t2t_usr_dir` for this project's own tools (evaluate, score, analysis, the converter).

The stock T2T binaries import one user directory; the tools here first register this project's
models, problems and hparams sets (its `t2t_usr_dir/`), then import every directory of a
comma-separated `--t2t_usr_dir` the way T2T does (the directory's parent on sys.path while its
`__init__.py` runs), so a user's own problems and hparams sets resolve by name.
"""
import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROJECT_USR_DIR = os.path.join(ROOT, "t2t_usr_dir")


class UsrDirError(ValueError):
  """A --t2t_usr_dir entry that is not an importable directory; the message names it."""
  one_line = True


def register_project():
  """Imports this project's t2t_usr_dir (TF2 fixes, models, problems, hparams sets) once."""
  if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
  import t2t_usr_dir  # pylint: disable=g-import-not-at-top,unused-import


def split_dirs(value):
  """'a, b,,c' -> absolute paths ['.../a', '.../b', '.../c'] (None or '' -> [])."""
  return [os.path.abspath(os.path.expanduser(p.strip()).rstrip("/"))
          for p in (value or "").split(",") if p.strip()]


def _module_name(path):
  """The name `path` was imported under, else its folder name (or folder_N when another module
  holds that name, e.g. a user directory also called t2t_usr_dir)."""
  init = os.path.join(path, "__init__.py")
  for name, module in list(sys.modules.items()):
    if getattr(module, "__file__", None) == init:
      return name
  name, suffix = os.path.basename(path), 0
  while (name if not suffix else "%s_%d" % (name, suffix)) in sys.modules:
    suffix += 1
  return name if not suffix else "%s_%d" % (name, suffix)


def import_dir(path):
  """Imports the package at directory `path` (its parent on sys.path meanwhile); returns it."""
  init = os.path.join(path, "__init__.py")
  if not os.path.isdir(path) or not os.path.isfile(init):
    raise UsrDirError("--t2t_usr_dir: %s is not a directory with an __init__.py (a T2T user "
                      "directory registers problems/hparams sets when imported)" % path)
  name = _module_name(path)
  if name in sys.modules:
    return sys.modules[name]
  spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[path])
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  sys.path.insert(0, os.path.dirname(path))
  try:
    spec.loader.exec_module(module)
  except Exception as e:  # pylint: disable=broad-except
    del sys.modules[name]
    raise UsrDirError("--t2t_usr_dir: importing %s failed: %s: %s" % (path, type(e).__name__, e))
  finally:
    if os.path.dirname(path) in sys.path:
      sys.path.remove(os.path.dirname(path))
  return module


def import_usr_dirs(value=None):
  """Registers this project, then every directory of the comma-separated `value`."""
  register_project()
  for path in split_dirs(value):
    if path != PROJECT_USR_DIR:
      import_dir(path)
