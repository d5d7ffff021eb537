"""Test setup: repo root on sys.path, quiet TensorFlow, deterministic seeds."""
import os
import subprocess
import sys
import types

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position
import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position


@pytest.fixture
def rng():
  return np.random.default_rng(1234)

BIN = os.path.dirname(sys.executable)


class HParamsStandIn(types.SimpleNamespace):
  """Plain attributes standing in for T2T HParams in layer tests, with HParams.get."""

  def get(self, name, default=None):
    return getattr(self, name, default)


def run_t2t(binary, *args, timeout=600, env=None):
  """Runs a stock T2T binary with --t2t_usr_dir=t2t_usr_dir; returns the CompletedProcess."""
  cmd = [os.path.join(BIN, binary), "--t2t_usr_dir=" + os.path.join(ROOT, "t2t_usr_dir")]
  full_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  full_env.update(env or {})
  return subprocess.run(cmd + [str(a) for a in args], capture_output=True, text=True,
                        timeout=timeout, cwd=ROOT, env=full_env)


def synthetic_data(tmp_path_factory, name, num_train, num_eval):
  """A small synthetic_long_range dataset written by the problem's own generate_data."""
  import t2t_usr_dir  # pylint: disable=g-import-not-at-top,unused-import
  from problems import synthetic  # pylint: disable=g-import-not-at-top
  path = str(tmp_path_factory.mktemp(name))
  problem = synthetic.SyntheticLongRange()
  problem.num_train, problem.num_eval = num_train, num_eval
  problem.generate_data(path, path)
  return path
