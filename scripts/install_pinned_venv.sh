#!/usr/bin/env bash
# Installs a PyPI tool pinned by a requirements file into its own virtual environment, cached outside the checkout
# (~/.cache/sftree/<name>-<version>, or $SFTREE_CACHE; reinstalled when the requirements file changes), and links
# it as .tools/<name> (idempotent; one install at a time, as checkouts on one machine share the cache).
#   bash scripts/install_pinned_venv.sh NAME VERSION REQUIREMENTS BINARY
# The router installers (install_router.sh, install_smg.sh) are this with their pins.
set -euo pipefail
cd "$(dirname "$0")/.."
name=$1 version=$2 reqs=$3 bin=$4
cache="${SFTREE_CACHE:-$HOME/.cache/sftree}/$name-$version"
dest=.tools/$name
want="$(sha256sum "$reqs" | cut -d' ' -f1)"
mkdir -p "$cache"
exec 9>"$cache/.lock" && flock 9
if [ "$(cat "$cache/.installed" 2>/dev/null)" != "$want" ] || [ ! -x "$cache/venv/bin/$bin" ]; then
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
