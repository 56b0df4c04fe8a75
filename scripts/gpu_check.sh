#!/usr/bin/env bash
# The GPU check: one command on a GPU host, everything it finds written to $OUT.
#
#   bash scripts/gpu_check.sh              # on the GPU host (device tool: carry [".gpu-carry"])
#   bash scripts/gpu_check.sh --dry-run    # here, without a GPU: says what it would do and runs
#                                          # the CPU parts (model, memory estimate, test
#                                          # collection, tests/test_gpu_prep.py, bench --quick)
#
# Steps (README "## GPU" has the times): 1 nvidia-smi; 2 Python packages (carried wheels);
# 3 llama.cpp with CUDA (carried prebuilt libraries, else the carried source); 4 the extension
# against it; 5 a generated ~300M-parameter F16 model; 6 the memory estimate, 6b the engine's
# exactness self-check on each model (whether decisions are served at all); 7 the `not slow`
# suite with full offload (8 workers, then the serial tests); 8 bench/gpu.py (with the carried
# JevBench easy tasks and a Q4_K_M copy of the model when they are there); 9 summary.
# What comes back ($OUT, at most 8 files): gpu_check.log, nvidia-smi.txt, build.log, pytest.log,
# junit.xml, bench_gpu.json, server_logs.txt, summary.md.
#
# Inputs, made on the CPU machine by scripts/gpu_pack.sh into .gpu-carry/ (git-ignored there):
#   wheels/*.whl                  Python packages the GPU image lacks (cp312)
#   llama-cuda-sm<ARCH>.tar.xz    prebuilt llama.cpp CUDA libraries, llama-server,
#                                 llama-quantize, headers
#   jevbench-easy.jsonl           (optional) JevBench easy tasks for bench/gpu.py
#   llama-src.tar.gz              (optional) the trimmed llama.cpp source: built here when no
#                                 prebuilt libraries came or they do not load
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2
DRY=0
ARCH=${SEMIF_CUDA_ARCH:-90}
LLAMA_MODE=${SEMIF_GPU_LLAMA:-auto}     # auto | prebuilt | source
PARAMS=${SEMIF_GPU_MODEL_PARAMS:-300M}
DEADLINE=${SEMIF_GPU_DEADLINE:-480}     # seconds for everything: with the machine's start, a
                                        # run leaves a second start room for an early failure
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --arch) ARCH=$2; shift ;;
    --llama) LLAMA_MODE=$2; shift ;;
    --params) PARAMS=$2; shift ;;
    --deadline) DEADLINE=$2; shift ;;
    -h|--help) awk 'NR > 1 && /^set -uo/ {exit} NR > 1' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

BENCH_SECONDS=${SEMIF_GPU_BENCH_SECONDS:-150}   # kept for step 8 when step 7 takes its budget
CARRY=${SEMIF_GPU_CARRY:-$ROOT/.gpu-carry}
WORK=${SEMIF_GPU_WORK:-/tmp/semif-gpu-check}
OUT=${OUT:-$WORK/out}    # the device tool sets OUT; what is written there comes back
mkdir -p "$WORK" "$OUT"
LOG=$OUT/gpu_check.log
: >"$LOG"
: >"$OUT/build.log"
STARTED=$(date +%s)
FAILED=()

elapsed() { echo $(($(date +%s) - STARTED)); }
left() { echo $((DEADLINE - $(elapsed))); }
say() { echo "[$(printf '%3d' "$(elapsed)")s] $*" | tee -a "$LOG"; }
step() { say "== $*"; }
fail() { say "FAILED: $*"; FAILED+=("$1"); }
logged() { "$@" 2>&1 | tee -a "$LOG"; return "${PIPESTATUS[0]}"; }
would() { say "would run: $*"; }

# -- 1. the GPU ----------------------------------------------------------------------------------
step "1 GPU"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  { nvidia-smi; nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,compute_cap \
      --format=csv; } >"$OUT/nvidia-smi.txt" 2>&1
  logged nvidia-smi -L
  CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '. ')
  if [ -n "$CAP" ] && [ "$CAP" != "$ARCH" ]; then
    say "note: the GPU is sm_$CAP, the libraries are built for sm_$ARCH"
  fi
else
  echo "no NVIDIA GPU visible (nvidia-smi finds none)" >"$OUT/nvidia-smi.txt"
  if [ "$DRY" = 0 ]; then
    say "no NVIDIA GPU is visible: run this on the GPU host, or with --dry-run"
    exit 2
  fi
  say "no GPU here: dry run (the GPU steps are described, the CPU parts run)"
fi
say "$(uname -srm); $(nproc) cores; deadline ${DEADLINE}s; llama.cpp: $LLAMA_MODE; sm_$ARCH"
# The tree travels without .git: the caller names the commit (scripts/gpu_env.py record reads it).
say "commit: ${SEMIF_BENCH_COMMIT:-unknown}"

# -- 2. Python -----------------------------------------------------------------------------------
step "2 Python packages"
if [ "$DRY" = 1 ]; then
  PY=${PYTHON:-$ROOT/.venv/bin/python}
  if [ -d "$CARRY/wheels" ]; then
    would "$PY -m pip install --no-index --no-deps --target $WORK/site" \
      "($(find "$CARRY/wheels" -name '*.whl' | wc -l) wheels from .gpu-carry/wheels)"
  fi
else
  PY=${PYTHON:-python3}
  if [ -d "$CARRY/wheels" ]; then
    logged "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$WORK/site" "$CARRY"/wheels/*.whl || fail "wheels"
    export PYTHONPATH=$WORK/site${PYTHONPATH:+:$PYTHONPATH}
    # Tests that start `semif-proxy serve` with an environment of their own (no PYTHONPATH)
    # still find what the image lacks: a .pth adds the folder after the image's packages.
    SITE_DIR=$("$PY" -c 'import site; print(site.getsitepackages()[0])')
    echo "$WORK/site" >"$SITE_DIR/semif-gpu-check.pth" 2>/dev/null \
      || say "note: $SITE_DIR is not writable; tests with their own environment may miss packages"
  else
    say "no .gpu-carry/wheels: using what $PY has"
  fi
fi
logged "$PY" scripts/gpu_env.py imports || fail "imports"

# -- 3. llama.cpp with CUDA ----------------------------------------------------------------------
step "3 llama.cpp b11312 with CUDA (sm_$ARCH)"
PREBUILT=$CARRY/llama-cuda-sm$ARCH.tar.xz
SOURCE=$CARRY/llama-src.tar.gz
LLAMA_DIR=$WORK/llama-cuda-sm$ARCH    # bin/ (libraries and llama-server) and include/
LLAMA_FROM=""
if [ "$DRY" = 1 ]; then
  if [ -f "$PREBUILT" ]; then
    would "unpack $PREBUILT into $LLAMA_DIR ($(du -h "$PREBUILT" | cut -f1)); ldd check"
  elif [ -f "$SOURCE" ]; then
    would "build $SOURCE with the extension, ninja -j$(nproc) (cmake/llama_cpp.cmake, CUDA on)"
  else
    say "nothing in .gpu-carry yet: scripts/gpu_pack.sh makes it"
  fi
  say "the CUDA runtime it would use: $("$PY" scripts/gpu_env.py runtime-dirs || true)"
else
  RUNTIME_DIRS=$("$PY" scripts/gpu_env.py runtime-dirs)
  export LD_LIBRARY_PATH=$LLAMA_DIR/bin${RUNTIME_DIRS:+:$RUNTIME_DIRS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  say "CUDA runtime libraries from: ${RUNTIME_DIRS:-the default loader paths}"
  if [ "$LLAMA_MODE" != source ] && [ -f "$PREBUILT" ]; then
    rm -rf "$LLAMA_DIR" && mkdir -p "$LLAMA_DIR"
    # Python's tarfile reads xz without an xz binary, which the GPU image may lack.
    if "$PY" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="tar")' \
        "$PREBUILT" "$LLAMA_DIR" 2>&1 | tee -a "$LOG"; then
      MISSING=$(ldd "$LLAMA_DIR/bin/libggml-cuda.so" 2>&1 | grep "not found")
      if [ -z "$MISSING" ]; then
        LLAMA_FROM=prebuilt
        say "prebuilt libraries: $(du -sh "$LLAMA_DIR/bin" | cut -f1)"
      else
        say "prebuilt libraries do not load: $MISSING"
      fi
    fi
  fi
  if [ -z "$LLAMA_FROM" ] && [ "$LLAMA_MODE" != prebuilt ] && [ -f "$SOURCE" ]; then
    rm -rf "$WORK/llama-src" && mkdir -p "$WORK/llama-src"
    if tar -xzf "$SOURCE" -C "$WORK/llama-src" && "$PY" scripts/cuda_link_deps.py --offline \
        --out "$WORK/cuda-link" >>"$OUT/build.log" 2>&1; then
      LLAMA_FROM=source
      say "llama.cpp will be built from source with the extension ($(nproc) cores)"
    fi
  fi
  [ -n "$LLAMA_FROM" ] || fail "llama.cpp"
fi

# -- 4. the extension ----------------------------------------------------------------------------
step "4 the extension (semif_proxy._engine)"
# Prebuilt: mode (b) of cmake/llama_cpp.cmake (link the unpacked libraries). Source: mode (a),
# llama.cpp built at configure time with every core, as `make build-gpu` does.
EXT=(-m pip install -q --no-build-isolation --no-deps --no-index -e . -Cbuild-dir="$WORK/ext")
if [ "$LLAMA_FROM" = source ]; then
  EXT+=(-Ccmake.define.SEMIF_CUDA=ON -Ccmake.define.SEMIF_CUDA_ARCHITECTURES="$ARCH"
        -Ccmake.define.SEMIF_CUDA_LINK_FILE="$WORK/cuda-link/cmake-args.txt"
        -Ccmake.define.SEMIF_LLAMA_SOURCE_DIR="$WORK/llama-src"
        -Ccmake.define.SEMIF_LLAMA_BUILD_DIR="$WORK/llama-build")
else
  EXT+=(-Ccmake.define.SEMIF_LLAMA_LIB_DIR="$LLAMA_DIR/bin"
        -Ccmake.define.SEMIF_LLAMA_INCLUDE_DIR="$LLAMA_DIR/include"
        -Ccmake.define.SEMIF_LLAMA_SERVER_PATH="$LLAMA_DIR/bin/llama-server")
fi
if [ "$DRY" = 1 ]; then
  would "$PY ${EXT[*]}"
  say "dry run: the CPU build already installed for $PY is used"
elif [ -n "$LLAMA_FROM" ]; then
  t0=$(date +%s)
  if "$PY" "${EXT[@]}" >>"$OUT/build.log" 2>&1; then
    say "extension ($LLAMA_FROM) built in $(($(date +%s) - t0)) s"
  else
    fail "extension"
    tail -30 "$OUT/build.log" | tee -a "$LOG"
  fi
fi
NATIVE_OK=0
if [ "$DRY" = 1 ]; then
  logged "$PY" scripts/gpu_env.py native && NATIVE_OK=1
else
  logged "$PY" scripts/gpu_env.py native --need-gpu && NATIVE_OK=1
fi
[ "$NATIVE_OK" = 1 ] || fail "native"

# -- 5. the model --------------------------------------------------------------------------------
step "5 a generated model"
mkdir -p "$WORK/models"
MODEL=$WORK/models/model.gguf
if [ "$DRY" = 1 ]; then
  would "$PY -m semif_proxy.model.tiny_gguf --params $PARAMS --out $MODEL"
  say "dry run: 20M parameters instead (2 cores)"
  MODEL_ARGS=(--params 20M --n-embd 256 --n-head 4)
else
  MODEL_ARGS=(--params "$PARAMS")
fi
logged "$PY" -m semif_proxy.model.tiny_gguf "${MODEL_ARGS[@]}" --out "$MODEL" || fail "model"
# The same model in Q4_K_M (what a deployed GGUF usually is): its matrix products take the
# quantized GPU kernels, compared with the CPU's in step 8. Only with a carried llama-quantize.
QMODEL=$WORK/models/model-q4_k_m.gguf
QUANTIZE=$LLAMA_DIR/bin/llama-quantize
rm -f "$QMODEL"
if [ "$DRY" = 1 ]; then
  would "$QUANTIZE $MODEL $QMODEL Q4_K_M"
elif [ -x "$QUANTIZE" ] && [ -f "$MODEL" ]; then
  if "$QUANTIZE" "$MODEL" "$QMODEL" Q4_K_M "$(nproc)" >>"$OUT/build.log" 2>&1; then
    say "quantized: $(du -h "$QMODEL" | cut -f1) Q4_K_M"
  else
    fail "quantize"; rm -f "$QMODEL"
  fi
else
  say "no llama-quantize carried: agreement on the F16 model only"
fi

BENCH_EXTRA=()
[ -f "$CARRY/jevbench-easy.jsonl" ] && BENCH_EXTRA+=(--jevbench "$CARRY/jevbench-easy.jsonl")
[ -f "$QMODEL" ] && BENCH_EXTRA+=(--quantized "$QMODEL")

# -- 6. the memory estimate ----------------------------------------------------------------------
step "6 GPU memory for the engine + llama-server (semif_proxy.model.gpu_memory)"
FREE_ARGS=()
[ "$DRY" = 1 ] && FREE_ARGS=(--free-gib 80)   # no GPU here: as on an 80 GiB card
logged "$PY" -m semif_proxy.model.gpu_memory --model "$MODEL" --server-ctx 8192 --engine-ctx 8192 \
  "${FREE_ARGS[@]}" || fail "gpu_memory"

# -- 6b. the exactness self-check ----------------------------------------------------------------
# What decides whether the engine serves decisions at all with this offload (engine/exactness.py),
# on each model, first: seconds, and the one figure a later step's failures all follow from.
step "6b the engine's exactness self-check, full offload"
for m in "$MODEL" "$QMODEL"; do
  [ -f "$m" ] || continue
  if [ "$DRY" = 1 ]; then
    logged "$PY" scripts/gpu_env.py exactness --model "$m" --gpu-layers 0 || fail "exactness"
  elif [ "$NATIVE_OK" = 1 ]; then
    logged timeout 60 "$PY" scripts/gpu_env.py exactness --model "$m" --gpu-layers 999 \
      || fail "exactness $(basename "$m")"
  fi
done

# -- 7. the test suite ---------------------------------------------------------------------------
# A warm machine keeps $WORK: no junit of an earlier run may be counted as this one's.
rm -f "$WORK/junit-serial.xml" "$OUT/junit.xml"
step "7 tests: -m 'not slow', SEMIF_TEST_GPU_LAYERS=999, the generated model"
# Left out: none touches the GPU path, and each needs what the GPU host lacks.
IGNORE=(
  tests/test_deploy.py tests/test_deploy_async.py tests/test_deploy_batch.py  # moto, boto3
  tests/test_deploy_gpu.py tests/test_deploy_scaling.py                       # moto, boto3
  tests/test_deploy_progress.py tests/test_deploy_uncompressed.py             # moto, boto3
  tests/test_deploy_update.py tests/test_eval.py                              # moto, boto3
  tests/test_container.py    # hadolint and the Dockerfiles' text
  tests/test_base_image.py   # builds the CPU base-image stand-in (~15 min)
  tests/test_packaging.py    # CPU wheel builds of llama.cpp
  tests/test_playground.py   # Chromium
)
# Only the suite's own pytest plugins: the GPU image's Python has others (benchmark, cov, xdist,
# ...) that would load themselves under filterwarnings=error.
PYTEST_ENV=(SEMIF_TEST_MODEL="$MODEL" SEMIF_TEST_GPU_LAYERS=999 SEMIF_TEST_GENERATED_MODEL=1
            SEMIF_LOAD_SECONDS=10 PYTHONUNBUFFERED=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1)
PLUGINS=(-p pytest_asyncio.plugin -p pytest_aiohttp.plugin -p pytest_timeout
         -p _hypothesis_pytestplugin -p anyio.pytest_plugin -p no:cacheprovider)
# As `make test` runs them: most files in workers (one file per worker: a module's server starts
# once; 16 cores and one card hold 8 of them), then the `serial` ones alone.
WORKERS=${SEMIF_GPU_TEST_WORKERS:-8}
PYTEST_ARGS=("${PLUGINS[@]}" -ra)
for f in "${IGNORE[@]}"; do PYTEST_ARGS+=(--ignore="$f"); done
PARALLEL_ARGS=(-m "not slow and not serial" -p xdist.plugin -n "$WORKERS" --dist loadfile
               --junitxml="$OUT/junit.xml")
SERIAL_ARGS=(-m "not slow and serial" --junitxml="$WORK/junit-serial.xml")
# The files that exercise the GPU path run first (tests/helpers/gpu_run.py), then the rest: if
# the time runs out, what matters most has run.
PYTEST_ENV+=("SEMIF_TEST_FIRST=tests/test_native.py tests/test_engine.py tests/test_decide_cli.py
tests/test_one_answer.py tests/test_server.py tests/test_systemone.py tests/test_sagemaker.py
tests/test_robustness.py tests/test_chaos.py")
PYTEST_ARGS+=(tests)
if [ "$DRY" = 1 ]; then
  would "env ${PYTEST_ENV[*]} $PY -m pytest ${PYTEST_ARGS[*]} ${PARALLEL_ARGS[*]}"
  would "... then ${SERIAL_ARGS[*]}"
  say "dry run: collection only (the suite is not run here), then tests/test_gpu_prep.py"
  env "${PYTEST_ENV[@]}" "$PY" -m pytest -m "not slow" "${PYTEST_ARGS[@]}" --collect-only -q \
    >"$OUT/pytest.log" 2>&1 || fail "collect"
  grep -c "::" "$OUT/pytest.log" | sed 's/^/tests that would run: /' | tee -a "$LOG"
  grep "gpu_run:" "$OUT/pytest.log" | tee -a "$LOG"
  env PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 timeout 900 "$PY" -m pytest "${PLUGINS[@]}" -ra \
    tests/test_gpu_prep.py \
    >>"$OUT/pytest.log" 2>&1 || fail "test_gpu_prep"
  tail -3 "$OUT/pytest.log" | tee -a "$LOG"
elif [ "$NATIVE_OK" = 0 ]; then
  say "tests not run: the extension does not see a GPU (step 4)"
else
  BUDGET=$(($(left) - BENCH_SECONDS - 20))
  [ "$BUDGET" -gt 300 ] && BUDGET=300
  if [ "$BUDGET" -lt 60 ]; then
    fail "tests"; say "tests not run: only $(left) s left"
  else
    # SIGINT at the budget: pytest stops there and still writes its summary and junit.xml.
    T0=$(date +%s)
    say "tests get ${BUDGET}s ($WORKERS workers, then the serial ones)"
    env "${PYTEST_ENV[@]}" timeout -s INT -k 20 "$BUDGET" "$PY" -m pytest "${PYTEST_ARGS[@]}" \
      "${PARALLEL_ARGS[@]}" >"$OUT/pytest.log" 2>&1
    rc=$?
    [ $rc = 0 ] || fail "tests (exit $rc$([ $rc = 124 ] && echo ', timed out'))"
    tail -25 "$OUT/pytest.log" | tee -a "$LOG"
    SERIAL=$((BUDGET - $(date +%s) + T0))
    if [ "$SERIAL" -lt 30 ]; then
      fail "serial tests"; say "serial tests not run: only ${SERIAL}s of the budget left"
    else
      say "serial tests get ${SERIAL}s"
      echo "===== serial" >>"$OUT/pytest.log"
      env "${PYTEST_ENV[@]}" timeout -s INT -k 20 "$SERIAL" "$PY" -m pytest "${PYTEST_ARGS[@]}" \
        "${SERIAL_ARGS[@]}" >>"$OUT/pytest.log" 2>&1
      rc=$?
      [ $rc = 0 ] || fail "serial tests (exit $rc$([ $rc = 124 ] && echo ', timed out'))"
      tail -15 "$OUT/pytest.log" | tee -a "$LOG"
    fi
    # One junit.xml comes back (the device returns 8 files): the serial part joins it.
    "$PY" scripts/gpu_env.py merge-junit "$OUT/junit.xml" "$WORK/junit-serial.xml" 2>>"$LOG"
  fi
fi

# -- 8. benchmarks -------------------------------------------------------------------------------
step "8 bench/gpu.py"
mkdir -p "$WORK/logs"
if [ "$DRY" = 1 ]; then
  would "$PY -m bench.gpu --model $MODEL --out $OUT/bench_gpu.json (full offload)"
  say "dry run: --quick --gpu-layers 0 (the 'GPU' server is a CPU one here)"
  logged timeout 1200 "$PY" -m bench.gpu --model "$MODEL" --out "$OUT/bench_gpu.json" \
    --logs "$WORK/logs" --quick --gpu-layers 0 "${BENCH_EXTRA[@]}" || fail "bench"
elif [ "$NATIVE_OK" = 0 ]; then
  say "benchmarks not run: the extension does not see a GPU (step 4)"
else
  BUDGET=$(($(left) - 10))
  [ "$BUDGET" -gt "$BENCH_SECONDS" ] && BUDGET=$BENCH_SECONDS
  if [ "$BUDGET" -lt 45 ]; then
    fail "bench"; say "bench not run: only $(left) s left"
  else
    logged timeout -k 10 "$BUDGET" "$PY" -m bench.gpu --model "$MODEL" --budget $((BUDGET - 30)) \
      "${BENCH_EXTRA[@]}" --out "$OUT/bench_gpu.json" --logs "$WORK/logs" || fail "bench"
  fi
fi

# -- 9. summary ----------------------------------------------------------------------------------
step "9 summary"
for f in "$WORK"/logs/*.log; do
  [ -f "$f" ] && { echo "===== $(basename "$f")"; tail -c 2000000 "$f"; }
done >"$OUT/server_logs.txt" 2>/dev/null
"$PY" scripts/gpu_env.py summary --out "$OUT" --failed "${FAILED[*]:-}" --seconds "$(elapsed)" \
  >"$OUT/summary.md" 2>>"$LOG" || fail "summary"
tee -a "$LOG" <"$OUT/summary.md"
for f in "$OUT"/*; do   # the device tool returns files of at most 16 MiB
  if [ "$(stat -c %s "$f")" -gt 16000000 ]; then tail -c 15000000 "$f" >"$f.tmp"; mv "$f.tmp" "$f"; fi
done
say "done in $(elapsed) s; failed: ${FAILED[*]:-nothing}"
[ ${#FAILED[@]} = 0 ]
