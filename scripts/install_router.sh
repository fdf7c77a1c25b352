#!/usr/bin/env bash
# Installs SGLang's router (`sglang-router` 0.3.2 from PyPI, a Rust binary in a manylinux wheel, with the Python
# packages it pulls in, all pinned in scripts/router-requirements.txt) into its own virtual environment, cached
# outside the checkout (~/.cache/sftree/sglang-router-<version>, or $SFTREE_CACHE), and links it as
# .tools/sglang-router (idempotent). The fleet test bed (src/sftree/teacher/fleet.py, tests/test_fleet_*.py,
# benchmarks/fleet.py) runs `.tools/sglang-router/bin/sglang-router launch ...` in front of llama-server or
# teacher-sim workers; docs/serving.md.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.3.2
reqs=scripts/router-requirements.txt
cache="${SFTREE_CACHE:-$HOME/.cache/sftree}/sglang-router-$VERSION"
dest=.tools/sglang-router
want="$(sha256sum "$reqs" | cut -d' ' -f1)"
mkdir -p "$cache"
exec 9>"$cache/.lock" && flock 9 # one install at a time (checkouts on one machine share the cache)
if [ "$(cat "$cache/.installed" 2>/dev/null)" != "$want" ] || [ ! -x "$cache/venv/bin/sglang-router" ]; then
  rm -rf "$cache/venv" "$cache/.installed"
  python3 -m venv "$cache/venv"
  "$cache/venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r "$reqs"
  "$cache/venv/bin/python" -m pip check >&2
  echo "$want" >"$cache/.installed"
fi
mkdir -p .tools
if [ "$(readlink "$dest" 2>/dev/null)" != "$cache/venv" ]; then
  rm -rf "$dest" && ln -s "$cache/venv" "$dest"
fi
echo "install_router: $dest/bin/sglang-router ($("$dest/bin/sglang-router" --version 2>&1 | head -1))" >&2
