#!/usr/bin/env bash
# Installs smg (the Shepherd Model Gateway 1.13.0 from PyPI, the successor of sglang-router: a Rust router in a
# manylinux wheel, with the Python packages it pulls in, all pinned in scripts/smg-requirements.txt) into its own
# virtual environment (scripts/install_pinned_venv.sh), cached outside the checkout (~/.cache/sftree/smg-<version>, or $SFTREE_CACHE), and links
# it as .tools/smg (idempotent). The fleet (src/sftree/teacher/fleet.py, tests/test_fleet_*.py) runs
# `.tools/smg/bin/smg launch ...` in front of llama-server or teacher-sim workers; docs/serving.md.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_pinned_venv.sh smg 1.13.0 scripts/smg-requirements.txt smg
dest=.tools/smg
echo "install_smg: $dest/bin/smg (smg $("$dest/bin/python" -c 'import importlib.metadata as m; print(m.version("smg"))'))" >&2
