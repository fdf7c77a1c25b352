#!/usr/bin/env bash
# A virtual environment with a real trainer (TRL's SFTTrainer on torch's CPU build) for tests/test_export_trainer.py,
# which trains a tiny Student on an export for a few steps and checks that exactly the exported completions are
# trained (docs/outputs.md, "Training"). Cached outside the checkout (~/.cache/sftree/trainer/venv, or
# $SFTREE_CACHE), rebuilt only when the pins below change (idempotent).
# torch is pinned to its CPU build, `torch==2.13.0+cpu` (a ~190 MB wheel from the CPU index, or the same wheel in
# pip's find-links where a machine keeps one): from PyPI, torch pulls several GB of CUDA packages. It is installed
# alone without dependencies first, so that index is asked for nothing else; then its dependencies and the rest
# come from PyPI, pinned as in scripts/install_consumers.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH=torch==2.13.0+cpu
TORCH_INDEX=https://download.pytorch.org/whl/cpu
PINS=(trl==1.16.0 transformers==5.6.0 datasets==5.2.0 accelerate==1.16.0 huggingface_hub==1.33.0
  gguf==0.19.0 numpy==2.4.6 pyarrow==26.0.1 tokenizers==0.22.2 jinja2==3.1.6)
cache="${SFTREE_CACHE:-$HOME/.cache/sftree}/trainer"
want="$TORCH $TORCH_INDEX ${PINS[*]}"
mkdir -p "$cache"
exec 9>"$cache/.lock" && flock 9 # one install at a time (checkouts on one machine share the cache)
if [ "$(cat "$cache/.installed" 2>/dev/null)" != "$want" ] || [ ! -x "$cache/venv/bin/python" ]; then
  rm -rf "$cache/venv" "$cache/.installed"
  python3 -m venv "$cache/venv"
  py="$cache/venv/bin/python"
  "$py" -m pip install -q --disable-pip-version-check --retries 2 --no-deps --extra-index-url "$TORCH_INDEX" "$TORCH"
  "$py" -m pip install -q --disable-pip-version-check "$TORCH" "${PINS[@]}"
  "$py" -c 'import torch; assert torch.version.cuda is None, torch.version.cuda' # the CPU build, no CUDA
  "$py" -m pip check >&2
  echo "$want" >"$cache/.installed"
fi
echo "install_trainer: $cache/venv ($("$cache/venv/bin/python" -c 'import torch, trl; print("torch", torch.__version__, "trl", trl.__version__)'))" >&2
