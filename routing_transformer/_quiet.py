"""Quiet start-up for this project's commands: the `rt-*` commands, `python -m
routing_transformer...` (the tools) and `python -m
problems.shakespeare`. Such a command prints only its own lines, an error first: TensorFlow's C++
start-up lines (among them "E ... Unable to register cuDNN/cuFFT/cuBLAS factory"), google.api_core's
Python-version FutureWarning, tensorflow-addons' end-of-life notice and TensorFlow's INFO and
deprecation logging stay off the console.

`routing_transformer/__init__.py` calls `apply_if_command()` before anything imports TensorFlow
(TensorFlow reads TF_CPP_MIN_LOG_LEVEL once, at its first log line, during its import). Any other
process that imports the package (a library user's program, the stock T2T binaries, pytest) keeps
TensorFlow's logging as it is. A TF_CPP_MIN_LOG_LEVEL set in the environment wins, e.g.
`TF_CPP_MIN_LOG_LEVEL=0 rt-score ...` shows TensorFlow's C++ logging again.

Imports only the standard library (and absl's logging when present).
"""
import logging
import os
import sys
import warnings

COMMAND_PREFIX = "rt-"  # the console scripts of pyproject.toml
MODULE_PREFIXES = ("routing_transformer.", "problems.shakespeare")
_OPTIONS_WITH_VALUE = ("-W", "-X")  # interpreter options whose value is the next argument


def module_run(orig_argv):
  """MODULE of an interpreter command line `python [options] -m MODULE ...`, else None."""
  args = list(orig_argv[1:])
  while args:
    arg = args.pop(0)
    if arg == "-m":
      return args[0] if args else None
    if arg.startswith("-m"):
      return arg[2:]
    if arg in _OPTIONS_WITH_VALUE:
      args = args[1:]
    elif arg == "-c" or arg == "-" or not arg.startswith("-"):
      return None  # a -c program, stdin or a script
  return None


def is_command(argv0=None, orig_argv=None):
  """True when this process is one of the project's commands (see the module docstring)."""
  argv0 = sys.argv[0] if argv0 is None else argv0
  orig_argv = getattr(sys, "orig_argv", []) if orig_argv is None else orig_argv
  module = module_run(orig_argv)
  if module is not None:
    return module.startswith(MODULE_PREFIXES)
  return os.path.basename(argv0).startswith(COMMAND_PREFIX)


def quiet():
  """Silences the start-up noise; call before TensorFlow is imported. Errors stay visible:
  TensorFlow's Python logging at ERROR, absl's at WARNING, Python exceptions untouched."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # 3: also the cuDNN/cuFFT/cuBLAS E lines
  warnings.filterwarnings("ignore", category=FutureWarning, module=r"google\.api_core")
  warnings.filterwarnings("ignore", message=r"\s*TensorFlow Addons \(TFA\) has ended",
                          category=UserWarning)
  logging.getLogger("tensorflow").setLevel(logging.ERROR)  # the logger tf.get_logger() returns
  try:
    from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  except ImportError:
    return
  absl_logging.set_verbosity(absl_logging.WARNING)


def apply_if_command():
  """quiet() when this process is one of the project's commands; returns whether it applied."""
  if not is_command():
    return False
  quiet()
  return True
