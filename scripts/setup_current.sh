#!/usr/bin/env bash
# The current-stack virtualenv: .venv-current with Python 3.12, current TensorFlow (2.21) and
# Keras 3, for the model core and its Keras layers without Tensor2Tensor (`make test-current`).
# Idempotent: when .venv-current already matches this script and pyproject.toml, it exits in seconds.
#   bash scripts/setup_current.sh [--which-python]   (VENV=dir to use another venv, PYTHON=interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-current}
stamp="$VENV/.routing_transformer_stamp"
NEED=3.12
# The current stack: TensorFlow 2.21 brings Keras 3 as its dependency.
PACKAGES=("tensorflow==2.21.*" "keras>=3.10" "numpy" "pytest" "pytest-xdist")

python_version() {  # "3.12" for a working interpreter, nothing otherwise
  "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true
}

choose_python() {  # prints the interpreter to make the venv with, or one line on stderr
  local v candidate
  if [ -n "${PYTHON:-}" ]; then
    v=$(python_version "$PYTHON")
    if [ "$v" = "$NEED" ]; then echo "$PYTHON"; return 0; fi
    echo "setup_current: PYTHON=$PYTHON is ${v:+Python }${v:-not a working interpreter}; the current stack is set up with Python $NEED (unset PYTHON to search PATH, pyenv and uv)" >&2
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
  echo "setup_current: needs Python $NEED, found none (python3 is ${v:-missing}); get one with 'uv python install $NEED', your distribution's python$NEED package or 'pyenv install $NEED', then re-run (or set PYTHON=/path/to/python$NEED)" >&2
  return 1
}

if [ "${1:-}" = "--which-python" ]; then
  choose_python
  exit
fi

if [ -e "$VENV/pyvenv.cfg" ] || [ -e "$VENV/bin/python" ]; then
  have=$(python_version "$VENV/bin/python")
  if [ "$have" != "$NEED" ]; then
    echo "setup_current: $VENV was made with ${have:+Python }${have:-a missing interpreter}, not $NEED: rebuilding it"
    rm -rf "$VENV"
  fi
fi
want=$(cat pyproject.toml scripts/setup_current.sh | sha256sum | cut -d' ' -f1)

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$VENV/bin/python" -c "import routing_transformer.core.keras, keras, pytest, xdist" 2>/dev/null; then
  echo "setup_current: $VENV is up to date"
  exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
  PYTHON=$(choose_python) || exit 1
  echo "setup_current: creating $VENV with $PYTHON and installing TensorFlow and Keras 3 (a few minutes on a fresh machine)"
  "$PYTHON" -m venv "$VENV" > /dev/null 2>&1 || {
    echo "setup_current: $PYTHON -m venv $VENV failed; on Debian/Ubuntu install python$NEED-venv, or use 'uv python install $NEED'" >&2
    exit 1
  }
else
  echo "setup_current: installing the current stack into $VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check --no-input)
"${PIP[@]}" install -q "${PACKAGES[@]}" "setuptools>=64"
# The project itself, editable and without dependencies (they are the packages above; Tensor2Tensor
# is not among them). --ignore-requires-python: pyproject.toml may still name the pinned stack's
# Python only.
"${PIP[@]}" install -q --no-deps --no-build-isolation --ignore-requires-python -e .
venv_python="$(cd "$VENV" && pwd)/bin/python"
(cd / && TF_CPP_MIN_LOG_LEVEL=3 "$venv_python" -c "import tensorflow as tf, keras, routing_transformer.core.keras; print('setup_current: tensorflow', tf.__version__, 'keras', keras.__version__, 'ready')")
echo "$want" > "$stamp"
