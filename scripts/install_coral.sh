#!/usr/bin/env bash
# Installs the pinned public Coral (../shared/coral, or $CORAL_SRC) into its own virtual environment .venv-coral,
# as a user's machine has its own Coral beside sftree (idempotent). Tests that compare sftree with the real
# Coral use it (tests/coral_helpers.py); nothing else of sftree needs it.
#   coral     SETUPTOOLS_SCM_PRETEND_VERSION=0.0.0 pip install --no-deps $CORAL_SRC
#   deps      what the parts sftree drives import (config, templates, hub, CLI, grader daemon): pyyaml, omegaconf;
#             and what the example graders' programs import: numpy, scipy
set -euo pipefail
cd "$(dirname "$0")/.."
src="${CORAL_SRC:-../shared/coral}"
venv="${CORAL_VENV:-.venv-coral}"
if [ ! -f "$src/pyproject.toml" ]; then
  echo "install_coral: no Coral source at $src (set CORAL_SRC)" >&2
  exit 1
fi
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
stamp="$venv/.sftree-coral"
want="$(cd "$src" && find coral pyproject.toml -type f -newer /dev/null -printf '%P %s %T@\n' | sort | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && "$venv/bin/python" -c 'import coral.config' 2>/dev/null; then
  echo "install_coral: up to date ($venv)"
  exit 0
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check \
  pyyaml==6.0.3 omegaconf==2.3.0 numpy==2.4.6 scipy==1.17.1
# A copy, not an editable install: the source folder may be read-only.
SETUPTOOLS_SCM_PRETEND_VERSION=0.0.0 "$venv/bin/python" -m pip install -q --disable-pip-version-check \
  --no-deps --force-reinstall "$src"
echo "$want" >"$stamp"
echo "install_coral: coral $("$venv/bin/python" -c 'import coral; print(coral.__version__)') at $venv"
