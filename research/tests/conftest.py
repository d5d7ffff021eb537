"""Test setup of the research tests (`make test-research`): the repository root, research/ and
benchmarks/ on sys.path (the studies import the suite's `common` and `train_step`), quiet
TensorFlow, a seeded generator."""
import importlib
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
RESEARCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(RESEARCH)
for _path in (os.path.join(ROOT, "benchmarks"), RESEARCH, ROOT):
  if _path not in sys.path:
    sys.path.insert(0, _path)

import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position
import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position


def research_module(name):
  """research/<name>.py (or benchmarks/<name>.py for the suite's modules) as a module."""
  return importlib.import_module(name)


@pytest.fixture
def rng():
  return np.random.default_rng(1234)


@pytest.fixture(scope="module")
def registry():
  """T2T's registry with the product's and the studies' sets (research/usr_dir)."""
  from routing_transformer.t2t import usr_dirs  # pylint: disable=g-import-not-at-top
  usr_dirs.import_usr_dirs(os.path.join(RESEARCH, "usr_dir"))
  from tensor2tensor.utils import registry as t2t_registry  # pylint: disable=g-import-not-at-top
  return t2t_registry
