#!/usr/bin/env bash
# Installs the pinned public Coral (../shared/coral, or $CORAL_SRC) into its own virtual environment .venv-coral,
# as a user's machine has its own Coral beside sftree (idempotent). Tests that compare sftree with the real
# Coral, or make a real Coral run (`coral start`), use it (tests/helpers/coral.py); nothing else of sftree needs it.
#   coral     editable (SETUPTOOLS_SCM_PRETEND_VERSION=0.0.0 pip install -e --no-deps, no build isolation, the
#             build deps pinned below, editables for its editable wheel) from a copy kept in the venv
#             ($venv/coral-src): Coral's setup_grader_env installs Coral into a task's grader venv from the folder
#             holding its package, so that folder must be a source root (pyproject.toml), as in a user's clone. The copy is a git repository tagged v0.0.0, so
#             that build (uv, isolated, Coral's own command) finds its version without any variable set
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
  pathspec==1.1.1 pluggy==1.7.0 trove-classifiers==2026.9.21.13 tomlkit==0.15.2 editables==0.6)
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
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && [ -f "$venv/coral-src/pyproject.toml" ] &&
  "$venv/bin/python" -c 'import coral.config' 2>/dev/null; then
  echo "install_coral: up to date ($venv)"
  exit 0
fi
t0=$(date +%s.%N)
"$venv/bin/python" -m pip install -q --disable-pip-version-check "${deps[@]}" "${build[@]}"
# The source root, refreshed whole: a copy made by an earlier pin or source is replaced, never patched.
root="$(cd "$venv" && pwd -P)/coral-src"  # resolved: the editable install records this path
rm -rf "$root.new"
mkdir "$root.new"
cp -r "$src/pyproject.toml" "$src/README.md" "$src/LICENSE" "$src/coral" "$root.new/"
chmod -R u+w "$root.new"
find "$root.new" -name __pycache__ -prune -exec rm -rf {} +
(
  cd "$root.new"
  git init -q
  printf '__pycache__/\ncoral/_version.py\n' >.git/info/exclude
  git add -A
  git -c user.name=sftree -c user.email=sftree@localhost -c commit.gpgsign=false commit -qm "coral from $src"
  git tag v0.0.0
)
rm -rf "$root"
mv "$root.new" "$root"
SETUPTOOLS_SCM_PRETEND_VERSION=0.0.0 "$venv/bin/python" -m pip install -q --disable-pip-version-check \
  --no-deps --no-build-isolation --force-reinstall -e "$root"
"$venv/bin/python" -c 'import coral.agent.manager, coral.grader.daemon, coral.cli.start'
echo "$want" >"$stamp"
echo "install_coral: coral $("$venv/bin/python" -c 'import coral; print(coral.__version__)') at $venv" \
  "($(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s)"
