#!/usr/bin/env bash
# Installs the OpenCode CLI (npm package opencode-ai, pinned) into a local prefix, .tools/opencode, and links
# the binary to .tools/bin/opencode. Idempotent: does nothing when the pinned version is already there.
# Usage: scripts/install_opencode.sh [PREFIX]      (env OPENCODE_VERSION overrides the pin)
# The agent backend finds the binary via agent.opencode.binary, $SFTREE_OPENCODE_BIN, .tools/bin, then PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
version="${OPENCODE_VERSION:-1.18.33}"
prefix="${1:-.tools/opencode}"
bin_dir=".tools/bin"
# OpenCode's grep/glob tools run ripgrep and download it from GitHub when it is not on PATH: install it first.
if ! command -v rg >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get install -y -qq ripgrep >/dev/null 2>&1 ||
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ripgrep >/dev/null; }
  else
    echo "install_opencode: please install ripgrep (rg); OpenCode would try to download it" >&2
  fi
fi
if ! command -v npm >/dev/null; then
  echo "install_opencode: npm not found; install Node.js (>= 18) and npm, then rerun" >&2
  exit 1
fi
if [ -x "$bin_dir/opencode" ] && [ "$("$bin_dir/opencode" --version 2>/dev/null)" = "$version" ]; then
  echo "install_opencode: opencode $version already installed at $bin_dir/opencode"
  exit 0
fi
mkdir -p "$prefix" "$bin_dir"
# --prefix keeps it out of the system; the postinstall step picks the platform binary package.
npm install -g --prefix "$prefix" --no-fund --no-audit --loglevel=error "opencode-ai@$version"
ln -sf "$(cd "$prefix/bin" && pwd)/opencode" "$bin_dir/opencode"
got="$("$bin_dir/opencode" --version 2>/dev/null || true)"
if [ "$got" != "$version" ]; then
  echo "install_opencode: installed binary reports version '$got', expected $version" >&2
  exit 1
fi
echo "install_opencode: opencode $got at $bin_dir/opencode"
