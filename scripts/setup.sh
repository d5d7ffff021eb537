#!/usr/bin/env bash
# One unattended setup for a fresh machine: creates .venv and installs the pinned stack.
# Idempotent: when .venv already matches requirements*.txt/constraints*.txt/pyproject.toml/this script,
# it exits in seconds.
#   bash scripts/setup.sh [--which-python]   (VENV=dir to use another venv, PYTHON=interpreter)
# --which-python only prints the interpreter a new venv would be made with (or why there is none).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
stamp="$VENV/.routing_transformer_stamp"

# The pinned stack (TF 2.15.1, array_record 0.8.6, contourpy 1.3.3, ...) has wheels for CPython
# 3.11 only: pip fails deep in a build on any other version, so look for a 3.11 first.
NEED=3.11

python_version() {  # "3.11" for a working interpreter, nothing otherwise
  "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true
}

choose_python() {  # prints the interpreter to make the venv with, or one line on stderr
  local v candidate
  if [ -n "${PYTHON:-}" ]; then
    v=$(python_version "$PYTHON")
    if [ "$v" = "$NEED" ]; then echo "$PYTHON"; return 0; fi
    echo "setup: PYTHON=$PYTHON is ${v:+Python }${v:-not a working interpreter}; the pinned stack needs Python $NEED (unset PYTHON to search PATH, pyenv and uv)" >&2
    return 1
  fi
  local pyenv_root=${PYENV_ROOT:-$HOME/.pyenv}
  local uv_root=${UV_PYTHON_INSTALL_DIR:-${XDG_DATA_HOME:-$HOME/.local/share}/uv/python}
  for candidate in python3 "python$NEED" "$pyenv_root"/versions/"$NEED"*/bin/python \
      "$(pyenv which "python$NEED" 2>/dev/null || true)" \
      "$uv_root"/cpython-"$NEED"*/bin/python3* "$(uv python find "$NEED" 2>/dev/null || true)"; do
    if [ -n "$candidate" ] && [ "$(python_version "$candidate")" = "$NEED" ]; then
      command -v "$candidate"; return 0
    fi
  done
  v=$(python_version python3)
  echo "setup: needs Python $NEED for TensorFlow 2.15 and the pinned stack, found none (python3 is ${v:-missing}); get one with 'uv python install $NEED', your distribution's python$NEED package or 'pyenv install $NEED', then re-run (or set PYTHON=/path/to/python$NEED)" >&2
  return 1
}

if [ "${1:-}" = "--which-python" ]; then
  choose_python
  exit
fi

# A venv made with another Python (e.g. 3.12 before this check existed) can never hold the stack.
if [ -e "$VENV/pyvenv.cfg" ] || [ -e "$VENV/bin/python" ]; then
  have=$(python_version "$VENV/bin/python")
  if [ "$have" != "$NEED" ]; then
    echo "setup: $VENV was made with ${have:+Python }${have:-a missing interpreter}, not $NEED: rebuilding it"
    rm -rf "$VENV"
  fi
fi
want=$(cat requirements.txt requirements-dev.txt constraints.txt constraints-build.txt pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$VENV/bin/python" -c "import routing_transformer, t2t_usr_dir, tensor2tensor, gym, mesh_tensorflow, xdist" 2>/dev/null; then
  echo "setup: $VENV is up to date"
  exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
  PYTHON=$(choose_python) || exit 1
  echo "setup: creating $VENV with $PYTHON and installing the pinned stack (a few minutes on a fresh machine)"
  "$PYTHON" -m venv "$VENV" > /dev/null 2>&1 || {
    echo "setup: $PYTHON -m venv $VENV failed; on Debian/Ubuntu install python$NEED-venv, or use 'uv python install $NEED'" >&2
    exit 1
  }
else
  echo "setup: installing the pinned stack into $VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check --no-input)
# pip 24.1+ refuses gym 0.21.0 (its metadata holds `opencv-python>=3.`): keep the venv's pip older.
"${PIP[@]}" install -q "pip<24.1"
# The [t2t] profile's documented install (docs/install.md, requirements.txt's header), with the
# test tools and the project editable:
# - the whole pinned set with --no-deps: tensor2tensor 1.15.7's metadata pins a
#   tensorflow-probability that cannot import on TF 2.15;
# - gym 0.21.0 (an sdist) and this project built with constraints-build.txt's setuptools 65.5.0
#   and wheel 0.38.4 (pip reads PIP_CONSTRAINT in its isolated build environments too);
# - this project installed after tensor2tensor, so its t2t-* console scripts replace T2T's own,
#   nine of which call tf.logging / tf.app, gone in TF2 (routing_transformer/t2t/binaries.py).
PIP_CONSTRAINT="$PWD/constraints-build.txt" \
  "${PIP[@]}" install -q --no-deps -r requirements-dev.txt -c constraints.txt -e .
venv_python="$(cd "$VENV" && pwd)/bin/python"
(cd / && "$venv_python" -c "import routing_transformer, t2t_usr_dir, tensorflow as tf, tensor2tensor, gym, mesh_tensorflow, xdist; print('setup: tensorflow', tf.__version__, 'ready')")
# Every t2t-* command is this project's (binaries.script_owner), not a T2T script installed later.
(cd / && "$venv_python" -c "import sys; from routing_transformer.t2t import binaries as b; theirs = [c for c in b.BINARIES if b.script_owner(c) != 'routing-transformer-tf']; theirs and sys.exit('setup: T2T scripts without the TF2 fix (reinstall the project): %s' % ' '.join(theirs))")
echo "$want" > "$stamp"
