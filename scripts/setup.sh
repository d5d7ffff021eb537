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

NAME=setup
STACK="TensorFlow 2.15 and the pinned stack"
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

if [ "${1:-}" = "--which-python" ]; then
  choose_python
  exit
fi

# A venv made with another Python (e.g. 3.12 before this check existed) can never hold the stack.
check_venv_python
want=$(cat requirements.txt requirements-dev.txt constraints.txt constraints-build.txt pyproject.toml scripts/setup.sh scripts/lib.sh | sha256sum | cut -d' ' -f1)

exit_if_up_to_date "$want" "routing_transformer, t2t_usr_dir, tensor2tensor, gym, mesh_tensorflow, xdist"
open_venv "the pinned stack" "the pinned stack"
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
