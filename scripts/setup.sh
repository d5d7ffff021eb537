#!/usr/bin/env bash
# One unattended setup for a fresh machine: creates .venv and installs the pinned stack.
# Idempotent: when .venv already matches requirements.txt/constraints.txt/this script, it exits in seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
stamp="$VENV/.routing_transformer_stamp"
want=$(cat requirements.txt constraints.txt pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$VENV/bin/python" -c "import routing_transformer, tensor2tensor, gym, mesh_tensorflow, xdist" 2>/dev/null; then
  echo "setup: $VENV is up to date"
  exit 0
fi

echo "setup: creating $VENV and installing the pinned stack (a few minutes on a fresh machine)"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
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
  sed -i 's/^import tensorflow as tf$/import tensorflow.compat.v1 as tf/' "$script"
done
# The project itself, editable (pyproject.toml): `import routing_transformer` and the rt-* commands
# work from any folder. Its dependencies are the stack above (--no-deps); setuptools 65.5.0 of the
# venv builds it (--no-build-isolation: nothing is fetched).
"${PIP[@]}" install -q --no-deps --no-build-isolation -e .
venv_python="$(cd "$VENV" && pwd)/bin/python"
(cd / && "$venv_python" -c "import routing_transformer, t2t_usr_dir, tensorflow as tf, tensor2tensor, gym, mesh_tensorflow, xdist; print('setup: tensorflow', tf.__version__, 'ready')")
echo "$want" > "$stamp"
