#!/usr/bin/env bash
# Installs what sftree needs on a fresh Debian machine (idempotent): system packages, then the package itself.
set -euo pipefail
cd "$(dirname "$0")/.."
need_apt=()
command -v git >/dev/null || need_apt+=(git)
command -v bwrap >/dev/null || need_apt+=(bubblewrap)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
  else
    echo "setup: please install: ${need_apt[*]} (Debian packages)" >&2
  fi
fi
python3 -m pip install -q -e '.[dev]'
# OpenCode (agent.backend: opencode; its tests skip without it): pinned npm package into .tools/opencode.
bash scripts/install_opencode.sh || echo "setup: WARNING: OpenCode not installed (needs npm); the opencode backend and its tests are unavailable" >&2
