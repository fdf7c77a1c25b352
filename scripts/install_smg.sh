#!/usr/bin/env bash
# Installs smg (the Shepherd Model Gateway 1.13.0 from PyPI, the successor of sglang-router: a Rust router in a
# manylinux wheel, with the Python packages it pulls in, all pinned in scripts/smg-requirements.txt) into its own
# virtual environment, cached outside the checkout (~/.cache/sftree/smg-<version>, or $SFTREE_CACHE), and links
# it as .tools/smg (idempotent). The fleet (src/sftree/teacher/fleet.py, tests/test_fleet_*.py) runs
# `.tools/smg/bin/smg launch ...` in front of llama-server or teacher-sim workers; docs/serving.md.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=1.13.0
reqs=scripts/smg-requirements.txt
cache="${SFTREE_CACHE:-$HOME/.cache/sftree}/smg-$VERSION"
dest=.tools/smg
want="$(sha256sum "$reqs" | cut -d' ' -f1)"
mkdir -p "$cache"
exec 9>"$cache/.lock" && flock 9 # one install at a time (checkouts on one machine share the cache)
if [ "$(cat "$cache/.installed" 2>/dev/null)" != "$want" ] || [ ! -x "$cache/venv/bin/smg" ]; then
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
echo "install_smg: $dest/bin/smg (smg $("$dest/bin/python" -c 'import importlib.metadata as m; print(m.version("smg"))'))" >&2
