"""scripts/setup.sh's choice of interpreter and its check of an existing venv, with fake
interpreters (small shell scripts answering the version query) on a PATH of their own: no real
Python is searched for or installed."""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETUP = os.path.join(ROOT, "scripts", "setup.sh")
BUILD_CONSTRAINTS = os.path.join(ROOT, "constraints-build.txt")
TOOLS = ("dirname", "cat", "sha256sum", "cut", "rm", "sed", "mkdir", "cp", "sh")

FAKE = """#!/bin/sh
# A fake Python {version}: answers -c version queries, makes a venv of itself, logs the rest.
case "$1" in
  -c) case "$2" in *version_info*) echo {version};; *) echo "$0 $*" >> "{log}";; esac ;;
  -m) if [ "$2" = venv ]; then
        mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && echo "version = {version}" > "$3/pyvenv.cfg"
      else
        echo "${{PIP_CONSTRAINT:+PIP_CONSTRAINT=$PIP_CONSTRAINT }}$0 $*" >> "{log}"
      fi ;;
esac
"""


def fake_python(path, version, log):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    f.write(FAKE.format(version=version, log=log))
  os.chmod(path, 0o755)
  return path


@pytest.fixture
def machine(tmp_path):
  """(tmp_path, run): run(*args, env=...) runs setup.sh with PATH = a bin/ of fakes + the few
  tools it needs, HOME = tmp_path (no real pyenv / uv)."""
  tools = tmp_path / "tools"
  tools.mkdir()
  for tool in TOOLS:
    os.symlink(shutil.which(tool), str(tools / tool))
  (tmp_path / "bin").mkdir()

  def run(*args, **env):
    full_env = {"PATH": "%s:%s" % (tmp_path / "bin", tools), "HOME": str(tmp_path)}
    full_env.update(env)
    return subprocess.run(["/bin/bash", SETUP] + list(args), capture_output=True, text=True,
                          env=full_env, timeout=60)  # a hang guard, not a speed check
  return tmp_path, run


def test_only_newer_pythons_stop_at_once_with_one_line_naming_the_fix(machine):
  home, run = machine
  log = str(home / "log")
  fake_python(str(home / "bin" / "python3"), "3.12", log)
  fake_python(str(home / "bin" / "python3.13"), "3.13", log)
  fake_python(str(home / ".pyenv" / "versions" / "3.12.7" / "bin" / "python"), "3.12", log)
  for args in (["--which-python"], []):  # the choice alone, and a whole run without a venv
    result = run(*args, VENV=str(home / "venv"))
    assert result.returncode != 0
    lines = (result.stdout + result.stderr).splitlines()
    assert len(lines) == 1, lines
    assert "needs Python 3.11" in lines[0] and "python3 is 3.12" in lines[0]
    assert "uv python install 3.11" in lines[0] and "pyenv install 3.11" in lines[0]
    assert "python3.11 package" in lines[0]
  assert not os.path.exists(str(home / "venv")) and not os.path.exists(log)


@pytest.mark.parametrize("where", ["python3", "python3.11", "pyenv", "uv", "uv python find"])
def test_a_python_3_11_is_found_where_it_usually_lives(machine, where):
  home, run = machine
  log = str(home / "log")
  fake_python(str(home / "bin" / "python3"), "3.11" if where == "python3" else "3.12", log)
  fake_python(str(home / "bin" / "python3.9"), "3.9", log)  # not the pinned version
  path = str(home / {"python3": "bin/python3", "python3.11": "bin/python3.11",
                     "pyenv": ".pyenv/versions/3.11.9/bin/python",
                     "uv": ".local/share/uv/python/cpython-3.11.9-linux-x86_64-gnu/bin/python3.11",
                     "uv python find": "elsewhere/python"}[where])
  if where != "python3":
    fake_python(path, "3.11", log)
  if where == "uv python find":
    with open(str(home / "bin" / "uv"), "w") as f:
      f.write('#!/bin/sh\n[ "$*" = "python find 3.11" ] && echo %s\n' % path)
    os.chmod(str(home / "bin" / "uv"), 0o755)
  result = run("--which-python")
  assert result.returncode == 0, result.stderr
  assert result.stdout == path + "\n"


def test_python_variable_is_honoured_and_checked(machine):
  home, run = machine
  log = str(home / "log")
  fake_python(str(home / "bin" / "python3.11"), "3.11", log)
  mine = fake_python(str(home / "opt" / "py"), "3.11", log)
  assert run("--which-python", PYTHON=mine).stdout.strip() == mine
  newer = fake_python(str(home / "opt" / "py12"), "3.12", log)
  result = run("--which-python", PYTHON=newer)
  assert result.returncode != 0 and result.stdout == ""
  assert result.stderr.count("\n") == 1
  assert "PYTHON=%s is Python 3.12" % newer in result.stderr
  assert "needs Python 3.11" in result.stderr


def test_a_venv_of_the_wrong_python_is_rebuilt_then_left_alone(machine):
  home, run = machine
  log = str(home / "log")
  fake_python(str(home / "bin" / "python3"), "3.12", log)
  good = fake_python(str(home / "bin" / "python3.11"), "3.11", log)
  venv = str(home / "venv")
  subprocess.check_call([fake_python(str(home / "py12"), "3.12", log), "-m", "venv", venv])
  open(os.path.join(venv, "made-by-3.12"), "w").close()
  result = run(VENV=venv)
  assert result.returncode == 0, result.stdout + result.stderr
  assert "%s was made with Python 3.12, not 3.11: rebuilding it" % venv in result.stdout
  assert "creating %s with %s" % (venv, good) in result.stdout
  assert not os.path.exists(os.path.join(venv, "made-by-3.12"))
  assert open(os.path.join(venv, "pyvenv.cfg")).read() == "version = 3.11\n"
  with open(log) as f:
    calls = f.read().splitlines()
  # every install went through the new venv's interpreter, the pinned requirements among them
  python = os.path.join(venv, "bin", "python")
  assert calls and all(c.split("PIP_CONSTRAINT=%s " % BUILD_CONSTRAINTS)[-1].startswith(python + " ")
                       for c in calls)
  # the documented [t2t] install (docs/install.md) with the test tools and the project editable,
  # after making sure of a pip that still installs gym 0.21.0
  pip = python + " -m pip --disable-pip-version-check --no-input install -q "
  assert calls[:2] == [pip + "pip<24.1", "PIP_CONSTRAINT=%s %s--no-deps -r requirements-dev.txt "
                       "-c constraints.txt -e ." % (BUILD_CONSTRAINTS, pip)], calls
  again = run(VENV=venv)
  assert again.returncode == 0 and again.stdout == "setup: %s is up to date\n" % venv


def test_a_python_without_venv_support_is_named_with_the_package_to_install(machine):
  home, run = machine
  log = str(home / "log")
  path = fake_python(str(home / "bin" / "python3.11"), "3.11", log)
  with open(path) as f:  # Debian/Ubuntu without python3.11-venv: "ensurepip is not available"
    text = f.read().replace('if [ "$2" = venv ]; then', 'if [ "$2" = venv ]; then exit 1;')
  with open(path, "w") as f:
    f.write(text)
  result = run(VENV=str(home / "venv"))
  assert result.returncode != 0 and result.stdout.startswith("setup: creating")
  assert result.stderr.count("\n") == 1 and "install python3.11-venv" in result.stderr


def test_protobuf_runs_its_compiled_backend():
  """The pinned protobuf (4.25) runs compiled (upb): the pure-Python backend of protobuf 3.20, the
  only build it has for Python 3.11, makes each graph build and checkpoint save seconds slower."""
  from google.protobuf.internal import api_implementation  # pylint: disable=g-import-not-at-top
  assert api_implementation.Type() == "upb", (
      "protobuf runs its %s backend: run `make setup` (requirements.txt pins protobuf 4.25.3)"
      % api_implementation.Type())
