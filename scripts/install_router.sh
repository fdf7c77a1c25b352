#!/usr/bin/env bash
# Installs SGLang's router (`sglang-router` 0.3.2 from PyPI, a Rust binary in a manylinux wheel, with the Python
# packages it pulls in, all pinned in scripts/router-requirements.txt) into its own virtual environment, cached
# outside the checkout (~/.cache/sftree/sglang-router-<version>, or $SFTREE_CACHE), and links it as
# .tools/sglang-router (idempotent). The fleet test bed (src/sftree/teacher/fleet.py, tests/test_fleet_*.py,
# benchmarks/fleet.py) runs `.tools/sglang-router/bin/sglang-router launch ...` in front of llama-server or
# teacher-sim workers; docs/serving.md.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_pinned_venv.sh sglang-router 0.3.2 scripts/router-requirements.txt sglang-router
dest=.tools/sglang-router
echo "install_router: $dest/bin/sglang-router ($("$dest/bin/sglang-router" --version 2>&1 | head -1))" >&2
