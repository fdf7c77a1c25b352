#!/usr/bin/env bash
# The Coral in ../shared/coral (a pinned copy of the public Coral) in its own virtual environment .venv-coral,
# for the tests that make a real Coral run (`coral start`) or call Coral's own functions. Never in sftree's
# .venv: a user's Coral is their own, and sftree runs without one. Only what the used parts import is installed
# (no litellm: only Coral's gateway needs it), each pinned; numpy for the example tasks' graders. Coral is
# built with hatchling + hatch-vcs, pinned too and installed first (--no-build-isolation).
# Idempotent: rebuilt only when the pins or the Coral copy change. Tests skip without it (tests/coral_helpers.py).
#   CORAL_SRC=DIR  another Coral checkout (default ../shared/coral)   CORAL_VENV=DIR  (default .venv-coral)
set -euo pipefail
cd "$(dirname "$0")/.."
src="${CORAL_SRC:-../shared/coral}"
venv="${CORAL_VENV:-.venv-coral}"
pins=(pyyaml==6.0.3 omegaconf==2.4.0 numpy==2.4.6)
build=(hatchling==1.33.0 hatch-vcs==0.5.0 setuptools-scm==10.3.4 vcs-versioning==2.6.0 packaging==26.4
  pathspec==1.1.1 pluggy==1.7.0 trove-classifiers==2026.9.21.13 tomlkit==0.15.2)
if [ ! -f "$src/pyproject.toml" ]; then
  echo "install_coral: no Coral at $src: the coral tests will skip" >&2
  exit 0
fi
t0=$(date +%s.%N)
# The stamp: the pins and the Coral source (its files' names and sizes and mtimes: cheap, changes when it does).
stamp="${pins[*]} ${build[*]} $(cd "$src" && find coral pyproject.toml -type f -printf '%P %s %T@\n' | sort | sha256sum | cut -c1-16)"
if [ -x "$venv/bin/coral" ] && [ "$(cat "$venv/.stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "install_coral: $venv up to date ($("$venv/bin/coral" --version))"
  exit 0
fi
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "${pins[@]}" "${build[@]}"
# Built from a copy: pip builds in the source tree, and hatch-vcs writes coral/_version.py there.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r "$src/pyproject.toml" "$src/README.md" "$src/LICENSE" "$src/coral" "$tmp/"
chmod -R u+w "$tmp"
SETUPTOOLS_SCM_PRETEND_VERSION=0.0.0 "$venv/bin/python" -m pip install -q --disable-pip-version-check \
  --no-deps --no-build-isolation "$tmp"
"$venv/bin/python" -c 'import coral.agent.manager, coral.grader.daemon, coral.cli.start'
echo "$stamp" >"$venv/.stamp"
echo "install_coral: $("$venv/bin/coral" --version) in $venv ($(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s)"
