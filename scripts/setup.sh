#!/usr/bin/env bash
# One unattended setup for a fresh machine: creates .venv and installs the pinned stack.
# Idempotent: when .venv already matches requirements.txt/constraints.txt/this script, it exits in seconds.
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
want=$(cat requirements.txt constraints.txt pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)

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
# gym 0.21.0 is an sdist whose setup.py newer setuptools rejects: build it with the old toolchain.
"${PIP[@]}" install -q setuptools==65.5.0 wheel==0.38.4
"${PIP[@]}" install -q --no-build-isolation gym==0.21.0 -c constraints.txt
"${PIP[@]}" install -q -r requirements.txt -c constraints.txt
# tensor2tensor's own metadata pins a tensorflow-probability that cannot import on TF 2.15.
"${PIP[@]}" install -q --no-deps tensor2tensor==1.15.7 -c constraints.txt
# tensor2tensor's console scripts other than t2t-trainer call tf.logging / tf.app (gone in TF2):
# let them import tensorflow.compat.v1, as its t2t-trainer script already does.
for script in "$VENV"/bin/t2t-*; do
  [ -e "$script" ] || continue
  sed -i 's/^import tensorflow as tf$/import tensorflow.compat.v1 as tf/' "$script"
done
# The project itself, editable (pyproject.toml): `import routing_transformer` and the rt-* commands
# work from any folder. Its dependencies are the stack above (--no-deps); setuptools 65.5.0 of the
# venv builds it (--no-build-isolation: nothing is fetched).
"${PIP[@]}" install -q --no-deps --no-build-isolation -e .
venv_python="$(cd "$VENV" && pwd)/bin/python"
(cd / && "$venv_python" -c "import routing_transformer, t2t_usr_dir, tensorflow as tf, tensor2tensor, gym, mesh_tensorflow, xdist; print('setup: tensorflow', tf.__version__, 'ready')")
echo "$want" > "$stamp"
