#!/usr/bin/env bash
# A stand-in for the AWS llama.cpp SageMaker image ("the DLC", our images' base) without Docker:
# the pinned llama.cpp built the way the DLC builds its own, and only its build/bin/ copied into
# <root>/opt/llama.cpp/bin, as the DLC's runtime stage does (no headers, no lib/ or include/).
# Prints <root>. tests/test_base_image.py runs the image's builder steps and entrypoint on it.
#
# What the DLC does (aws/deep-learning-containers docker/llama_cpp/Dockerfile.cpu):
#   cmake -DGGML_NATIVE=OFF -DGGML_CPU_ALL_VARIANTS=ON -DGGML_BACKEND_DL=ON -DGGML_OPENMP=ON
#         -DLLAMA_CURL=ON; COPY build/bin/ /opt/llama.cpp/bin/; PATH and LD_LIBRARY_PATH on it.
# What differs here, and why:
#   - The CPU backends are the DLC's by default: 14 x86 variants (libggml-cpu-<arch>.so), of
#     which ggml loads the best for this CPU. 1,841 s of CPU here (about 15 minutes on 2 idle cores, 31 on
#     2 shared ones); the variants are ~53 % of it. SEMIF_BASE_SIM_VARIANTS=one builds a single
#     loadable libggml-cpu.so instead (GGML_CPU_ALL_VARIANTS=OFF, still GGML_BACKEND_DL=ON,
#     AVX2-level like our normal build), about 7 minutes less: loaded the same way, but through
#     ggml's fallback for an unsuffixed module rather than its choice among variants.
#   - LLAMA_CURL is left out: at b11312 it is a deprecated no-op (HTTPS is OpenSSL's now), and
#     LLAMA_OPENSSL=OFF, LLAMA_USE_PREBUILT_UI=OFF, no tests/examples: what this machine needs.
#   - The build number and commit are given (the source tree has no .git; the DLC's clone does).
#   - No build-tree RPATH: in the DLC it names the builder stage's folder, which the runtime
#     stage does not have, so libraries are found through LD_LIBRARY_PATH alone. Here the build
#     folder would still exist and hide a missing LD_LIBRARY_PATH entry.
# The build is cached per llama.cpp build and variant set and only redone when missing.
set -euo pipefail

CACHE="${SEMIF_CACHE_DIR:-$HOME/.cache/semif-proxy}"
LLAMA_BUILD="${LLAMA_BUILD:-b11312}"
LLAMA_COMMIT="${LLAMA_COMMIT:-0c1e570}"
VARIANTS="${SEMIF_BASE_SIM_VARIANTS:-all}"
ROOT_DIR="$CACHE/llama.cpp-$LLAMA_BUILD"
SRC="$ROOT_DIR/src"

case "$VARIANTS" in
  all) cpu_opts=(-DGGML_CPU_ALL_VARIANTS=ON) ;;
  # The haswell variant's instruction sets (x86-64-v3), as cmake/llama_cpp.cmake builds.
  one) cpu_opts=(-DGGML_CPU_ALL_VARIANTS=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON
                 -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON) ;;
  *) echo "base_sim: SEMIF_BASE_SIM_VARIANTS must be 'all' or 'one', not '$VARIANTS'" >&2; exit 2 ;;
esac
if [[ ! -f "$SRC/include/llama.h" ]]; then
  echo "base_sim: no llama.cpp tree at $SRC; run 'python3 scripts/fetch_llama_cpp.py' first" >&2
  exit 2
fi

BUILD="$ROOT_DIR/build-base-sim-$VARIANTS"
SIM="$ROOT_DIR/base-sim-$VARIANTS"
BIN="$SIM/opt/llama.cpp/bin"

if [[ ! -f "$BUILD/.complete" ]]; then
  generator=()
  if command -v ninja >/dev/null 2>&1 && [[ ! -f "$BUILD/CMakeCache.txt" ]]; then
    generator=(-G Ninja)
  fi
  start=$SECONDS
  cmake -S "$SRC" -B "$BUILD" "${generator[@]}" \
    -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_OPENMP=ON "${cpu_opts[@]}" \
    -DLLAMA_BUILD_NUMBER="${LLAMA_BUILD#b}" -DLLAMA_BUILD_COMMIT="$LLAMA_COMMIT" \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DCMAKE_SKIP_BUILD_RPATH=ON >&2
  # ggml depends on every CPU variant module, so building llama-server builds them all.
  cmake --build "$BUILD" --target llama-server --parallel "$(nproc)" >&2
  echo "base_sim: built llama.cpp $LLAMA_BUILD ($VARIANTS) in $((SECONDS - start)) s" >&2
  touch "$BUILD/.complete"
fi

# The DLC's runtime stage: build/bin/ as it is (symlinks kept), nothing else.
if [[ ! -f "$SIM/.complete" || "$BUILD/.complete" -nt "$SIM/.complete" ]]; then
  rm -rf "$SIM"
  mkdir -p "$BIN"
  cp -a "$BUILD/bin/." "$BIN/"
  touch "$SIM/.complete"
fi
echo "$SIM"
