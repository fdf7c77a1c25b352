#!/usr/bin/env bash
# Installs the pinned public Coral (../shared/coral, or $CORAL_SRC) into its own virtual environment .venv-coral,
# as a user's machine has its own Coral beside sftree (idempotent). Tests that compare sftree with the real
# Coral, or make a real Coral run (`coral start`), use it (tests/coral_helpers.py); nothing else of sftree needs it.
#   coral     SETUPTOOLS_SCM_PRETEND_VERSION=0.0.0 pip install --no-deps, from a copy of $CORAL_SRC: pip builds in
#             the source tree, and Coral's build (hatchling + hatch-vcs, pinned below, no build isolation) writes
#             coral/_version.py there
#   deps      what the parts sftree drives import (config, templates, hub, CLI, manager, grader daemon): pyyaml,
#             omegaconf (and its antlr4 runtime); what the example graders' programs import: numpy, scipy.
#             No litellm: only Coral's gateway needs it
# Rebuilt only when the pins or the Coral source change (its files' names, sizes and mtimes).
set -euo pipefail
cd "$(dirname "$0")/.."
src="${CORAL_SRC:-../shared/coral}"
venv="${CORAL_VENV:-.venv-coral}"
deps=(pyyaml==6.0.3 omegaconf==2.3.0 antlr4-python3-runtime==4.9.3 numpy==2.4.6 scipy==1.17.1)
build=(hatchling==1.33.0 hatch-vcs==0.5.0 setuptools-scm==10.3.4 vcs-versioning==2.6.0 packaging==26.4
  pathspec==1.1.1 pluggy==1.7.0 trove-classifiers==2026.9.21.13 tomlkit==0.15.2)
if [ ! -f "$src/pyproject.toml" ]; then
  echo "install_coral: no Coral source at $src (set CORAL_SRC)" >&2
  exit 1
fi
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
stamp="$venv/.sftree-coral"
want="$(
  echo "${deps[*]} ${build[*]}"
  cd "$src" && find coral pyproject.toml -type f -newer /dev/null -printf '%P %s %T@\n' | sort
)"
want="$(echo "$want" | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && "$venv/bin/python" -c 'import coral.config' 2>/dev/null; then
  echo "install_coral: up to date ($venv)"
  exit 0
fi
t0=$(date +%s.%N)
"$venv/bin/python" -m pip install -q --disable-pip-version-check "${deps[@]}" "${build[@]}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r "$src/pyproject.toml" "$src/README.md" "$src/LICENSE" "$src/coral" "$tmp/"
chmod -R u+w "$tmp"
SETUPTOOLS_SCM_PRETEND_VERSION=0.0.0 "$venv/bin/python" -m pip install -q --disable-pip-version-check \
  --no-deps --no-build-isolation --force-reinstall "$tmp"
"$venv/bin/python" -c 'import coral.agent.manager, coral.grader.daemon, coral.cli.start'
echo "$want" >"$stamp"
echo "install_coral: coral $("$venv/bin/python" -c 'import coral; print(coral.__version__)') at $venv" \
  "($(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s)"
