"""Test setup: repo root on sys.path, quiet TensorFlow, deterministic seeds, and the runs that
several modules share (made once per test run, also across pytest-xdist workers)."""
import fcntl
import importlib
import json
import os
import shutil
import subprocess
import sys
import types

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position
import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position

import forked_binaries  # pylint: disable=g-import-not-at-top,wrong-import-position


def grappler_config():
  """A ConfigProto whose sessions run Grappler's default rewrites in the tests too."""
  from tensorflow.core.protobuf import config_pb2  # pylint: disable=g-import-not-at-top
  from tensorflow.core.protobuf import rewriter_config_pb2  # pylint: disable=g-import-not-at-top
  config = config_pb2.ConfigProto()
  config.graph_options.rewrite_options.meta_optimizer_iterations = (
      rewriter_config_pb2.RewriterConfig.TWO)
  return config


def _sessions_without_grappler():
  """tf.compat.v1 sessions made in the test processes run their graphs without Grappler's
  rewrites (disable_meta_optimizer): a test runs each small graph a few times, and optimising
  it costs more than running it. What a user's training runs, Grappler included, the
  end-to-end runs through the T2T binaries (their own processes) keep. A test that needs
  Grappler asks for it with `grappler_config()`, which names its number of passes."""
  from tensorflow.core.protobuf import config_pb2  # pylint: disable=g-import-not-at-top
  from tensorflow.python.client import session as session_lib  # pylint: disable=g-import-not-at-top
  init = session_lib.Session.__init__

  def __init__(self, target="", graph=None, config=None):
    ours = config_pb2.ConfigProto()
    if config is not None:
      ours.CopyFrom(config)
    if ours.graph_options.rewrite_options.meta_optimizer_iterations == 0:  # DEFAULT_NUM_ITERS
      ours.graph_options.rewrite_options.disable_meta_optimizer = True
    init(self, target, graph, ours)

  session_lib.Session.__init__ = __init__


if os.environ.get("RT_TESTS_GRAPPLER", "0") != "1":
  _sessions_without_grappler()


def benchmark_module(name):
  """benchmarks/<name>.py, imported with benchmarks/ on sys.path (its modules import each other)."""
  here = os.path.join(ROOT, "benchmarks")
  if here not in sys.path:
    sys.path.insert(0, here)
  return importlib.import_module(name)


@pytest.fixture
def rng():
  return np.random.default_rng(1234)

BIN = os.path.dirname(sys.executable)

# The order modules are handed to the workers under `make test` (pytest-xdist, --dist loadscope
# --no-loadscope-reorder): each module runs whole on one worker, and a worker is given the next
# module once its current one has at most 2 tests left (so a module of <= 2 tests brings the next
# one along at once). The long modules come first and the short ones last, so both workers stay
# busy to the end. The shared trained run is built by test_t2t_binaries' first test; the other
# worker meanwhile runs test_reliability, which needs no shared run, and test_t2t_distributed,
# queued behind it, starts after the shared run exists: neither worker waits for the other.
FIRST = (
    "test_t2t_binaries.py",      # the shared trained run, its checks, 5 one-line-error runs
    "test_reliability.py",       # SIGKILL + restart, then damaged checkpoint + full disk
    "test_t2t_distributed.py",   # 2 runs continuing the shared trained run
    "test_t2t_decoder.py",       # 5 t2t-decoder runs on the shared trained run
    "test_mtf_trainer.py",       # the Mesh-TF run
    # the longest modules that are not `slow`
    "test_memorise.py", "test_step_order.py",
    "test_health.py", "test_step_memory.py", "test_mtf_model.py", "test_problems.py",
    "test_keras.py",
    "test_recompute.py", "test_causal_window.py", "test_analysis.py", "test_books.py",
    "test_probes.py", "test_decoding.py", "test_scoring.py", "test_patches.py",
)
LAST = ("test_usr_dirs.py", "test_placement.py", "test_memory_estimate.py", "test_progress.py")


def pytest_collection_modifyitems(items):
  """Orders modules: FIRST, other `slow` modules, the rest, LAST (stable: a module's tests keep
  their order)."""
  def rank(item):
    name = os.path.basename(str(item.fspath))
    if name in FIRST:
      return FIRST.index(name)
    if name in LAST:
      return len(FIRST) + 2 + LAST.index(name)
    return len(FIRST) + (0 if item.get_closest_marker("slow") else 1)
  items.sort(key=rank)


def _base_defaults():
  """The project's hparams defaults (hparams/base.py's sparse_transformer_local) by name; without
  Tensor2Tensor (the current-TensorFlow profile) the literal values base.py sets, read from its
  source."""
  if not hasattr(_base_defaults, "values"):
    try:
      from hparams import base  # pylint: disable=g-import-not-at-top
      _base_defaults.values = base.sparse_transformer_local().values()
    except ImportError:
      _base_defaults.values = _base_literals()
  return _base_defaults.values


def _base_literals():
  """{name: value} of `hparams.name = literal` and `_add(hparams, name=literal)` in
  hparams/base.py's sparse_transformer_local."""
  import ast  # pylint: disable=g-import-not-at-top
  with open(os.path.join(ROOT, "hparams", "base.py")) as f:
    tree = ast.parse(f.read())
  function = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and
                  node.name == "sparse_transformer_local")
  values = {}
  for node in ast.walk(function):
    if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Attribute) and
        getattr(node.targets[0].value, "id", None) == "hparams"):
      values[node.targets[0].attr] = ast.literal_eval(node.value)
    elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "_add":
      values.update((kw.arg, ast.literal_eval(kw.value)) for kw in node.keywords)
  return values


class HParamsStandIn(types.SimpleNamespace):
  """Plain attributes standing in for T2T HParams in layer tests, with HParams.get; an attribute
  not given is the project's default (hparams/base.py), as in every registered set."""

  def __getattr__(self, name):
    defaults = _base_defaults()
    if name in defaults:
      return defaults[name]
    raise AttributeError(name)

  def get(self, name, default=None):
    return getattr(self, name, default)


def t2t_argv(*args):
  """A T2T binary's command line after its name: --t2t_usr_dir=t2t_usr_dir, then `args`."""
  return ["--t2t_usr_dir=" + os.path.join(ROOT, "t2t_usr_dir")] + [str(a) for a in args]


def t2t_env():
  """The environment the suite runs T2T binaries in: this one, TensorFlow's C++ log quiet."""
  return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")


def run_t2t(binary, *args, timeout=600, env=None):
  """Runs a stock T2T binary with --t2t_usr_dir=t2t_usr_dir; returns the CompletedProcess.
  t2t-trainer and t2t-decoder run forked from a process that imported TF and T2T once
  (forked_binaries); with `env` (variables TF may read when it is imported) and for the other
  binaries, the installed console script runs as a subprocess."""
  argv = t2t_argv(*args)
  full_env = t2t_env()
  if binary in forked_binaries.FORKED and not env:
    return forked_binaries.run(binary, argv, full_env, ROOT, timeout=timeout)
  full_env.update(env or {})
  return subprocess.run([os.path.join(BIN, binary)] + argv, capture_output=True, text=True,
                        timeout=timeout, cwd=ROOT, env=full_env)


def write_synthetic_data(path, num_train, num_eval):
  """A small synthetic_long_range dataset written by the problem's own generate_data."""
  import t2t_usr_dir  # pylint: disable=g-import-not-at-top,unused-import
  from problems import synthetic  # pylint: disable=g-import-not-at-top
  problem = synthetic.SyntheticLongRange()
  problem.num_train, problem.num_eval = num_train, num_eval
  problem.generate_data(path, path)
  return path


def synthetic_data(tmp_path_factory, name, num_train, num_eval):
  """write_synthetic_data into a new temporary directory of this module."""
  return write_synthetic_data(str(tmp_path_factory.mktemp(name)), num_train, num_eval)


def shared_dir(tmp_path_factory, name, build):
  """(path, result): a directory made once per test run by `build(path)` and shared by every
  module and every pytest-xdist worker; `result` is build's return value (JSON), the same for all.

  The first caller builds under a file lock in the run's base temporary directory (with xdist, the
  parent of the workers' own ones, as xdist documents); the others wait for it and reuse it. A
  build that raises leaves nothing behind, so the next caller tries again and fails the same way.
  Treat the directory as read-only: copy it before changing anything.
  """
  base = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    base = base.parent
  path = os.path.join(str(base), "shared_" + name)
  result_file = path + ".json"
  with open(path + ".lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not os.path.exists(result_file):
      shutil.rmtree(path, ignore_errors=True)
      os.makedirs(path)
      try:
        result = build(path)
      except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
      with open(result_file + ".tmp", "w") as f:
        json.dump(result, f)
      os.rename(result_file + ".tmp", result_file)
  with open(result_file) as f:
    return path, json.load(f)


@pytest.fixture(scope="session")
def synthetic_data_dir(tmp_path_factory):
  """synthetic_long_range data (400 train, 40 eval sequences) for every module that trains or
  decodes on it; read-only."""
  path, _ = shared_dir(tmp_path_factory, "synthetic_data",
                       lambda p: bool(write_synthetic_data(p, 400, 40)))
  return path


TRAINED_STEPS = 10


@pytest.fixture(scope="session")
def trained_run(synthetic_data_dir, tmp_path_factory):
  """(output_dir, stderr) of one tiny routing model trained TRAINED_STEPS steps, evaluated and
  checkpointed by stock t2t-trainer, for every module that needs a trained checkpoint (TensorFlow's
  C++ warnings shown, so the log shows whether placement warnings come back). Read-only: copy
  the directory before training on or writing into it."""
  def train(out):
    run = run_t2t("t2t-trainer", "--problem=synthetic_long_range", "--model=routing_transformer",
                  "--hparams_set=routing_transformer_tiny", "--data_dir=" + synthetic_data_dir,
                  "--output_dir=" + out, "--train_steps=%d" % TRAINED_STEPS, "--eval_steps=1",
                  "--local_eval_frequency=%d" % TRAINED_STEPS,
                  "--schedule=continuous_train_and_eval", env={"TF_CPP_MIN_LOG_LEVEL": "1"})
    return {"returncode": run.returncode, "stderr": run.stderr}

  out, run = shared_dir(tmp_path_factory, "trained_run", train)
  assert run["returncode"] == 0, run["stderr"][-4000:]
  return out, run["stderr"]


@pytest.fixture
def data_dir(synthetic_data_dir):
  """The shared synthetic dataset (a module may define its own `data_dir`)."""
  return synthetic_data_dir


@pytest.fixture
def trained(trained_run):
  """The shared trained run (a module may define its own `trained`)."""
  return trained_run
