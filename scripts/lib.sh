# The interpreter search of scripts/setup.sh and scripts/setup_current.sh (sourced by both).
# The sourcing script sets NEED (the Python version, e.g. 3.11), NAME (the prefix of its
# messages) and STACK (what needs that version, e.g. "the pinned stack").

python_version() {  # "3.11" for a working interpreter, nothing otherwise
  "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true
}

choose_python() {  # prints the interpreter to make the venv with, or one line on stderr
  local v candidate
  if [ -n "${PYTHON:-}" ]; then
    v=$(python_version "$PYTHON")
    if [ "$v" = "$NEED" ]; then echo "$PYTHON"; return 0; fi
    echo "$NAME: PYTHON=$PYTHON is ${v:+Python }${v:-not a working interpreter}; $STACK needs Python $NEED (unset PYTHON to search PATH, pyenv and uv)" >&2
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
  echo "$NAME: needs Python $NEED for $STACK, found none (python3 is ${v:-missing}); get one with 'uv python install $NEED', your distribution's python$NEED package or 'pyenv install $NEED', then re-run (or set PYTHON=/path/to/python$NEED)" >&2
  return 1
}

check_venv_python() {  # removes $VENV when it was made with another Python than $NEED
  local have
  if [ -e "$VENV/pyvenv.cfg" ] || [ -e "$VENV/bin/python" ]; then
    have=$(python_version "$VENV/bin/python")
    if [ "$have" != "$NEED" ]; then
      echo "$NAME: $VENV was made with ${have:+Python }${have:-a missing interpreter}, not $NEED: rebuilding it"
      rm -rf "$VENV"
    fi
  fi
}

make_venv() {  # creates $VENV with the chosen interpreter, or stops with one line on stderr
  PYTHON=$(choose_python) || exit 1
  echo "$NAME: creating $VENV with $PYTHON and installing $1 (a few minutes on a fresh machine)"
  "$PYTHON" -m venv "$VENV" > /dev/null 2>&1 || {
    echo "$NAME: $PYTHON -m venv $VENV failed; on Debian/Ubuntu install python$NEED-venv, or use 'uv python install $NEED'" >&2
    exit 1
  }
}

exit_if_up_to_date() {  # exits when $stamp holds "$1" and the venv imports the modules "$2"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$1" ] && "$VENV/bin/python" -c "import $2" 2>/dev/null; then
    echo "$NAME: $VENV is up to date"
    exit 0
  fi
}

open_venv() {  # a new venv installing "$1", or the existing one installing "$2"
  if [ ! -x "$VENV/bin/python" ]; then
    make_venv "$1"
  else
    echo "$NAME: installing $2 into $VENV"
  fi
}
