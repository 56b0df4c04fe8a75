#!/usr/bin/env bash
# Make .gpu-carry/ (git-ignored): what scripts/gpu_check.sh needs on a GPU host that has no
# network. Run after `make build-gpu ARCH=90` on the CPU machine.
#
#   bash scripts/gpu_pack.sh [--arch 90] [--with-source] [--no-prebuilt]
#
#   .gpu-carry/wheels/                 the suite's Python packages the GPU image lacks, at the
#                                      versions of .venv, as CPython 3.12 manylinux wheels
#   .gpu-carry/llama-cuda-sm90.tar.xz  the CUDA build's libraries, llama-server and
#                                      llama-quantize (stripped, $ORIGIN RPATHs), llama.h/ggml*.h
#   .gpu-carry/jevbench-easy.jsonl     the 48 JevBench easy tasks, when ../shared/jevbench is there
#   .gpu-carry/llama-src.tar.gz        (--with-source) the pinned source without docs, models,
#                                      tests, examples and other backends' code
# Then it prints the sizes against the device tool's 64 MiB (working tree + carried files).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
ARCH=90
WITH_SOURCE=0
PREBUILT=1
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) ARCH=$2; shift ;;
    --with-source) WITH_SOURCE=1 ;;
    --no-prebuilt) PREBUILT=0 ;;
    *) echo "gpu_pack: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
CACHE=${SEMIF_CACHE_DIR:-$HOME/.cache/semif-proxy}
LLAMA_ROOT=$CACHE/llama.cpp-b11312
TAG=sm$(echo "$ARCH" | tr ' ,;' '---')
BUILD=$LLAMA_ROOT/build-cuda-$TAG
CARRY=$ROOT/.gpu-carry
VENV_PY=$ROOT/.venv/bin/python

# The carried files travel through `carry`, not as part of the working tree.
EXCLUDE=$(git rev-parse --git-path info/exclude)
grep -qxF /.gpu-carry/ "$EXCLUDE" 2>/dev/null || echo /.gpu-carry/ >>"$EXCLUDE"
mkdir -p "$CARRY"

# -- wheels ----------------------------------------------------------------------------------------
# What the suite imports that the GPU image (KINDS.md, nvidia-h200) does not have, or has at
# another version, with their dependencies; pinned to .venv's versions.
PACKAGES=(aiohttp aiohappyeyeballs aiosignal attrs frozenlist multidict propcache yarl idna
  backports.zstd pydantic pydantic-core annotated-types typing-inspection typing-extensions
  pytest pluggy iniconfig pygments packaging pytest-asyncio pytest-aiohttp pytest-timeout
  hypothesis sortedcontainers gguf typesafe-sdk httpx2 httpcore2 h11 anyio tenacity truststore
  jinja2 markupsafe scikit-build-core pathspec pybind11 pytest-xdist execnet)
PINS=()
for p in "${PACKAGES[@]}"; do
  v=$("$VENV_PY" -m pip show "$p" 2>/dev/null | awk '/^Version:/{print $2}')
  if [ -n "$v" ]; then PINS+=("$p==$v"); else echo "gpu_pack: $p is not in .venv, skipped" >&2; fi
done
rm -rf "$CARRY/wheels" && mkdir -p "$CARRY/wheels"
PLATFORMS=()
for n in 17 27 28 31 34 35; do PLATFORMS+=(--platform "manylinux_2_${n}_x86_64"); done
"$VENV_PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  "${PLATFORMS[@]}" -d "$CARRY/wheels" "${PINS[@]}"
echo "wheels: $(find "$CARRY/wheels" -name '*.whl' | wc -l) files, $(du -sh "$CARRY/wheels" | cut -f1)"

# -- prebuilt llama.cpp ----------------------------------------------------------------------------
if [ "$PREBUILT" = 1 ]; then
  [ -f "$BUILD/bin/libggml-cuda.so" ] || { echo "gpu_pack: no $BUILD/bin/libggml-cuda.so:" \
    "run make build-gpu ARCH=$ARCH first" >&2; exit 2; }
  STAGE=$(mktemp -d)
  mkdir -p "$STAGE/bin" "$STAGE/include"
  # llama-quantize turns the check's generated F16 model into Q4_K_M there, so the quantized
  # matrix kernels (what a deployed GGUF runs) are compared with the CPU's too.
  cmake --build "$BUILD" --target llama-quantize >/dev/null
  cp -a "$BUILD"/bin/lib*.so "$BUILD/bin/llama-server" "$BUILD/bin/llama-quantize" "$STAGE/bin/"
  strip --strip-unneeded "$STAGE"/bin/*
  cp "$LLAMA_ROOT"/src/include/*.h "$LLAMA_ROOT"/src/ggml/include/*.h "$STAGE/include/"
  # xz, not gzip: 4 MB smaller, which keeps tree + carry under the device's 64 MiB (the check
  # unpacks it with Python's tarfile, so the GPU host needs no xz binary).
  rm -f "$CARRY/llama-cuda-$TAG.tar.gz"
  tar -cf - -C "$STAGE" bin include | xz -T0 -9 >"$CARRY/llama-cuda-$TAG.tar.xz"
  echo "prebuilt: $(du -sh "$STAGE/bin" | cut -f1) stripped," \
    "$(du -h "$CARRY/llama-cuda-$TAG.tar.xz" | cut -f1) packed"
  rm -rf "$STAGE"
fi

# -- JevBench easy ---------------------------------------------------------------------------------
# Bench input only (bench/gpu.py --jevbench): GPU latency and GPU-vs-CPU agreement on the tasks
# the AWS SemIf sample reports its GPU figures on. Taken from the checkout beside this one when
# it is there; nothing runs or tests from it.
JEV=$ROOT/../shared/jevbench/easy.jsonl
if [ -f "$JEV" ]; then
  cp "$JEV" "$CARRY/jevbench-easy.jsonl"
  echo "jevbench: $(wc -l <"$JEV") easy tasks"
else
  rm -f "$CARRY/jevbench-easy.jsonl"
  echo "gpu_pack: no $JEV: the check runs without JevBench" >&2
fi

# -- trimmed source --------------------------------------------------------------------------------
if [ "$WITH_SOURCE" = 1 ]; then
  SRC=$LLAMA_ROOT/src
  EXCLUDES=(--exclude=./docs --exclude=./models --exclude=./tests --exclude=./examples
    --exclude=./benches --exclude=./scripts --exclude=./conversion --exclude=./gguf-py
    --exclude=./.github --exclude=./media --exclude=./tools/server/webui)
  for b in "$SRC"/ggml/src/ggml-*/; do
    name=$(basename "$b")
    case "$name" in ggml-cpu|ggml-cuda) ;; *) EXCLUDES+=("--exclude=./ggml/src/$name") ;; esac
  done
  tar -czf "$CARRY/llama-src.tar.gz" -C "$SRC" "${EXCLUDES[@]}" .
  echo "source: $(du -h "$CARRY/llama-src.tar.gz" | cut -f1) packed"
else
  rm -f "$CARRY/llama-src.tar.gz"
fi

# -- what travels ----------------------------------------------------------------------------------
TREE=$( (git ls-files; git ls-files --others --exclude-standard) | sort -u \
  | while IFS= read -r f; do [ -f "$f" ] && stat -c %s "$f"; done | awk '{s+=$1} END {print s}')
CARRIED=$(du -sb "$CARRY" | cut -f1)
awk -v t="$TREE" -v c="$CARRIED" 'BEGIN {
  printf "travels: working tree %.1f MiB + .gpu-carry %.1f MiB = %.1f MiB of 64 MiB\n",
         t / 1048576, c / 1048576, (t + c) / 1048576
  if (t + c > 64 * 1048576) { print "gpu_pack: OVER the 64 MiB limit" > "/dev/stderr"; exit 1 }
}'
echo "run it: device run with carry [\".gpu-carry\"], command 'bash scripts/gpu_check.sh'"
