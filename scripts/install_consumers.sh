#!/usr/bin/env bash
# Two small virtual environments with the libraries that consume results/sft*.jsonl, so the tests can load the
# exported files with the trainers' own code (tests/test_export_consumers.py; they skip when these are absent):
#   .venv-consumers-trl: TRL's data_utils + the newest `datasets` (TRL requires datasets>=4.7)
#   .venv-consumers-lf:  LLaMA-Factory's converter/template/processor + `datasets` 4.0 (LLaMA-Factory pins <=4.0)
# No torch: the trainers are installed with --no-deps plus what their data code imports. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
make_env() {  # name, then pinned requirements
  local dir=".venv-consumers-$1" stamp
  shift
  stamp="$*"
  if [ -f "$dir/.stamp" ] && [ "$(cat "$dir/.stamp")" = "$stamp" ]; then return 0; fi
  rm -rf "$dir"
  python3 -m venv "$dir"
  "$dir/bin/python" -m pip install -q "$@"
  echo "$stamp" >"$dir/.stamp"
}
make_env trl datasets==5.2.0 transformers==5.6.0 jinja2==3.1.6
.venv-consumers-trl/bin/python -m pip install -q --no-deps trl==1.16.0
make_env lf datasets==4.0.0 transformers==4.57.1 jinja2==3.1.6 typing_extensions
.venv-consumers-lf/bin/python -m pip install -q --no-deps llamafactory==0.9.5
