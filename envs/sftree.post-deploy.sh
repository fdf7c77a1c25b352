#!/usr/bin/env bash
# Run by Snakemake once, inside the new conda env of envs/sftree.yaml (--sdm conda): installs the sftree
# package from this checkout, without dependencies (the env file pins them). Snakemake copies this script
# before running it, so the checkout is found from $SFTREE_SRC or the working directory (the repo root when
# snakemake is started there).
set -euo pipefail
src=${SFTREE_SRC:-$PWD}
if [ ! -f "$src/pyproject.toml" ] || ! grep -q '^name = "sftree"' "$src/pyproject.toml"; then
  echo "sftree post-deploy: no sftree checkout at '$src'; set SFTREE_SRC to the repository root" >&2
  exit 1
fi
python -m pip install --no-deps --no-build-isolation -e "$src"
