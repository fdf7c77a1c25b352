#!/usr/bin/env bash
# Two small virtual environments with the libraries that consume results/sft*.jsonl, so the tests can load the
# exported files with the trainers' own code (tests/test_export_consumers.py; they skip when these are absent):
#   .venv-consumers-trl: TRL's data code + the newest `datasets` (TRL requires datasets>=4.7)
#   .venv-consumers-lf:  LLaMA-Factory's converter/template/processor + `datasets` 4.0 (LLaMA-Factory pins <=4.0)
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
