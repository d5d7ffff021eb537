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

NAME=setup_current
STACK="the current stack"
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

if [ "${1:-}" = "--which-python" ]; then
  choose_python
  exit
fi

check_venv_python
want=$(cat pyproject.toml scripts/setup_current.sh scripts/lib.sh | sha256sum | cut -d' ' -f1)

exit_if_up_to_date "$want" "routing_transformer.core.keras, keras, pytest, xdist"
open_venv "TensorFlow and Keras 3" "the current stack"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check --no-input)
"${PIP[@]}" install -q "${PACKAGES[@]}" "setuptools>=64"
# The project itself, editable and without dependencies (they are the packages above; Tensor2Tensor
# is not among them). --ignore-requires-python: pyproject.toml may still name the pinned stack's
# Python only.
"${PIP[@]}" install -q --no-deps --no-build-isolation --ignore-requires-python -e .
venv_python="$(cd "$VENV" && pwd)/bin/python"
(cd / && TF_CPP_MIN_LOG_LEVEL=3 "$venv_python" -c "import tensorflow as tf, keras, routing_transformer.core.keras; print('setup_current: tensorflow', tf.__version__, 'keras', keras.__version__, 'ready')")
echo "$want" > "$stamp"
