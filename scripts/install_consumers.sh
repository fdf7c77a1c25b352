#!/usr/bin/env bash
# Two small virtual environments with the libraries that consume results/sft*.jsonl, so the tests can load the
# exported files with the trainers' own code (tests/test_export_consumers.py; they skip when these are absent):
#   .venv-consumers-trl: TRL's data code + the newest `datasets` (TRL requires datasets>=4.7)
#   .venv-consumers-lf:  LLaMA-Factory's converter/template/processor + `datasets` 4.0 (LLaMA-Factory pins <=4.0)
#   .venv-consumers-atif: atif-scan, an ATIF reader with its own parser (not the `atif` models the main tests use),
#                        reading back results/sft.atif.jsonl (export.atif; tests/test_export_atif.py)
# No torch: the trainers are installed with --no-deps, beside what their data code imports. Idempotent: an env
# is rebuilt only when its pins change.
set -euo pipefail
cd "$(dirname "$0")/.."
make_env() {  # name, the trainer (installed without its dependencies), then the pinned libraries it needs
  local dir=".venv-consumers-$1" trainer=$2 stamp
  shift 2
  stamp="$trainer $*"
  if [ -f "$dir/.stamp" ] && [ "$(cat "$dir/.stamp")" = "$stamp" ]; then return 0; fi
  rm -rf "$dir"
  python3 -m venv "$dir"
  "$dir/bin/python" -m pip install -q "$@"
  "$dir/bin/python" -m pip install -q --no-deps "$trainer"
  echo "$stamp" >"$dir/.stamp"
}
common=(numpy==2.4.6 pyarrow==26.0.1 tokenizers==0.22.2 jinja2==3.1.6)
make_env trl trl==1.16.0 datasets==5.2.0 transformers==5.6.0 huggingface_hub==1.33.0 "${common[@]}"
make_env lf llamafactory==0.9.5 datasets==4.0.0 transformers==4.57.1 huggingface_hub==0.36.2 \
  typing_extensions==4.16.0 "${common[@]}"
make_env_with_deps() {  # name, then the pinned library installed with its own dependencies (pure Python)
  local dir=".venv-consumers-$1" stamp
  shift
  stamp="$*"
  if [ -f "$dir/.stamp" ] && [ "$(cat "$dir/.stamp")" = "$stamp" ]; then return 0; fi
  rm -rf "$dir"
  python3 -m venv "$dir"
  "$dir/bin/python" -m pip install -q "$@"
  echo "$stamp" >"$dir/.stamp"
}
make_env_with_deps atif atif-scan==0.7.3
