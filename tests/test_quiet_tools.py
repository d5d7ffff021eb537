"""The project's commands print only their own lines (routing_transformer/_quiet.py): no
TensorFlow start-up logging, google.api_core FutureWarning or tensorflow-addons notice before a
tool's output, and a tool's error is the first line. The stock T2T binaries keep their logging."""
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from conftest import BIN
from conftest import ROOT
from routing_transformer import _quiet
from routing_transformer.t2t import checkpoint_files

# What TensorFlow 2.15, google.api_core and tensorflow-addons print at start-up when not quieted.
NOISE = ("cuDNN", "cuFFT", "cuBLAS", "TensorRT", "oneDNN", "This TensorFlow binary",
         "FutureWarning", "TensorFlow Addons", "TFA has entered", "WARNING:tensorflow",
         "INFO:tensorflow")


@pytest.mark.parametrize("orig_argv,argv0,expected", [
    (["python", "-m", "routing_transformer.tools.score", "--help"], "-m", True),
    (["python", "-u", "-W", "ignore", "-m", "routing_transformer.tools.evaluate"], "-m", True),
    (["python", "-mrouting_transformer.tools.probes"], "-m", True),
    (["python", "-m", "problems.shakespeare", "--out_dir=x"], "-m", True),  # rt-books
    (["/v/bin/python", "/v/bin/rt-score", "--help"], "/v/bin/rt-score", True),
    (["/v/bin/python", "/v/bin/rt-books"], "/v/bin/rt-books", True),
    (["python", "-m", "pytest", "tests"], "-m", False),
    (["/v/bin/python", "/v/bin/t2t-trainer", "--problem=p"], "/v/bin/t2t-trainer", False),
    (["python", "-c", "import routing_transformer", "-m", "routing_transformer.x"], "-c", False),
    (["python", "train.py", "-m", "routing_transformer.tools.score"], "train.py", False),
], ids=["module", "options", "attached_m", "books_module", "rt_score", "rt_books",
        "pytest", "t2t_trainer", "program", "script"])
def test_only_the_projects_commands_are_quieted(orig_argv, argv0, expected):
  assert _quiet.is_command(argv0, orig_argv) == expected


def command(args, cwd):
  """Runs a command as a user's shell would (no TF_CPP_MIN_LOG_LEVEL; this checkout's code)."""
  env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
  env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in [env.get("PYTHONPATH")] if p])
  return subprocess.run(args, capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def assert_quiet_with_error_first(run, error):
  text = run.stdout + run.stderr
  assert not [n for n in NOISE if n in text], text[:3000]
  assert run.returncode != 0 and run.stdout == "", text[:3000]
  lines = run.stderr.splitlines()
  assert lines and lines[0].startswith(error), text[:3000]
  assert len(lines) == 1, text[:3000]  # the error is the whole output


def test_rt_score_on_a_damaged_checkpoint_prints_the_error_as_its_first_line(tmp_path):
  """rt-score (a console script) imports TensorFlow and Tensor2Tensor before it finds the damage;
  its one-line error is still the first line of the output."""
  folder = str(tmp_path / "run")
  prefix = os.path.join(folder, "model.ckpt-3")
  checkpoint_files.write_checkpoint(prefix, {"global_step": np.asarray(3, np.int64),
                                             "w": np.ones([4, 4], np.float32)})
  tf.train.update_checkpoint_state(folder, prefix)
  with open(prefix + ".data-00000-of-00001", "r+b") as f:
    f.truncate(10)
  text_file = tmp_path / "text.txt"
  text_file.write_text("k1 v2 f3\n")
  run = command([os.path.join(BIN, "rt-score"), "--checkpoint=" + folder,
                 "--hparams_set=routing_transformer_tiny", "--problem=synthetic_long_range",
                 "--text_file=%s" % text_file], cwd=str(tmp_path))
  assert_quiet_with_error_first(run, "error: checkpoint %s is damaged: " % prefix)


def test_probes_module_on_a_missing_file_prints_only_the_error(tmp_path):
  """`python -m routing_transformer.tools.probes` (imports TensorFlow through the package)."""
  missing = str(tmp_path / "missing" / "probes.json")
  run = command([sys.executable, "-m", "routing_transformer.tools.probes", "--merge=" + missing,
                 "--output=" + str(tmp_path / "out")], cwd=str(tmp_path))
  assert_quiet_with_error_first(run, "error: --merge: %s not found" % missing)
