# Two commands for a newcomer: `make run` and `make test`. Everything heavy (llama.cpp source and
# build, models, CMake build tree) lives in $(CACHE), outside the repository, and is reused.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CACHE ?= $(HOME)/.cache/semif-proxy
LLAMA_BUILD := b11312
LLAMA_ROOT := $(CACHE)/llama.cpp-$(LLAMA_BUILD)
MODEL := $(CACHE)/models/SmolLM2-135M-Instruct.Q4_1.gguf
QWEN := $(CACHE)/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
QWEN15 := $(CACHE)/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
PORT ?= 8080
PYTEST_ARGS ?=
export SEMIF_CACHE_DIR := $(CACHE)

SOURCES := $(wildcard csrc/*.cpp csrc/*.h) CMakeLists.txt cmake/llama_cpp.cmake pyproject.toml

.PHONY: all build build-gpu model model-qwen model-qwen15 browser run test test-cpu test-gpu test-slow test-qwen bench lint clean \
  gpu-pack gpu-check gpu-check-dry model-random

all: build

# What the build and the tests need, declared once, in pyproject.toml: scripts/deps.py prints
# the build requirements, [project.dependencies] and the `test` extra as a requirements file,
# installed at the exact versions in constraints.txt (so a fresh checkout gets the versions the
# suite last passed with). Only requirements: the package itself is built and installed by
# $(VENV)/.build-cpu, with the -C flags its editable build needs. `make constraints` re-resolves
# the dependencies, every extra and the build requirements to the newest versions that fit, in
# a scratch venv, and rewrites the file.
DEPS := --build test
# make bench's extra (the plots), read the same way; pinned in the same file.
BENCH_DEPS = -r <($(PY) scripts/deps.py bench)
CONSTRAINTS := constraints.txt

$(VENV)/.deps: pyproject.toml $(CONSTRAINTS) scripts/deps.py
	@echo "installing the pinned build and test dependencies (constraints.txt) into $(VENV)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c $(CONSTRAINTS) --upgrade pip
	$(PY) scripts/deps.py $(DEPS) > $(VENV)/requirements.txt
	$(PY) -m pip install -c $(CONSTRAINTS) -r $(VENV)/requirements.txt
	touch $@

.PHONY: constraints
constraints:
	rm -rf $(CACHE)/constraints-venv
	$(PYTHON) -m venv $(CACHE)/constraints-venv
	$(CACHE)/constraints-venv/bin/python -m pip install -q --upgrade pip
	$(CACHE)/constraints-venv/bin/python scripts/deps.py --build --all \
	  > $(CACHE)/constraints-venv/requirements.txt
	$(CACHE)/constraints-venv/bin/python -m pip install -q \
	  -r $(CACHE)/constraints-venv/requirements.txt
	{ echo "# Exact versions of pyproject.toml's dependencies, extras and build requirements, and of what"; \
	  echo "# they pull in (pip install -c; no pip, setuptools or wheel). Regenerate: make constraints"; \
	  $(CACHE)/constraints-venv/bin/python -m pip freeze --exclude-editable \
	  | grep -v '^#' | grep -viE '^(pip|setuptools|wheel|distribute)=='; } > $(CONSTRAINTS)
	rm -rf $(CACHE)/constraints-venv

$(LLAMA_ROOT)/src.sha256:
	$(PYTHON) scripts/fetch_llama_cpp.py

# Editable install: Python sources are used in place, the extension and llama.cpp binaries are
# built once into $(CACHE) (the first llama.cpp build takes ~7-10 minutes on 2 cores). pip -v
# shows the build as it goes: CMake's configure, then ninja's [n/N] steps (llama.cpp's at
# configure time, cmake/llama_cpp.cmake; then the extension's).
$(VENV)/.build-cpu: $(VENV)/.deps $(LLAMA_ROOT)/src.sha256 $(SOURCES)
	@if [ -e $(LLAMA_ROOT)/build-cpu/bin/libllama.so ]; then \
	  echo "building the extension on llama.cpp $(LLAMA_BUILD) (built before, in $(LLAMA_ROOT)/build-cpu; about a minute)"; \
	else \
	  echo "building llama.cpp $(LLAMA_BUILD) and the extension (first time ~8 min on 2 cores; cached in $(CACHE)); ninja's [n/N] lines count the steps"; \
	fi
	$(PY) -m pip install -v --no-build-isolation --no-deps -e . \
	  -Cbuild-dir=$(CACHE)/build/{wheel_tag}-cpu \
	  -Ccmake.define.SEMIF_LLAMA_SOURCE_DIR=$(LLAMA_ROOT)/src \
	  -Ccmake.define.SEMIF_LLAMA_BUILD_DIR=$(LLAMA_ROOT)/build-cpu
	rm -f $(VENV)/.build-cuda
	touch $@

build: $(VENV)/.build-cpu

# The CUDA build for the compute capabilities in ARCH ("90": H100/H200; the GPU image adds
# "86 89" for A10G and L4/L40S), cached in its own build dir. GPU_VENV=.venv-gpu keeps it apart
# from the CPU build (a CUDA extension does not load where no driver is). cuBLAS and a link-time
# libcuda come from scripts/cuda_link_deps.py where the toolkit lacks them.
ARCH ?= 90
CUDA_TAG = sm$(shell echo '$(ARCH)' | tr ' ,;' '---')
GPU_VENV ?= $(VENV)
GPU_PY = $(GPU_VENV)/bin/python
build-gpu: $(LLAMA_ROOT)/src.sha256
	$(MAKE) --no-print-directory VENV=$(GPU_VENV) $(GPU_VENV)/.deps
	$(GPU_PY) scripts/cuda_link_deps.py --out $(CACHE)/cuda-link >/dev/null
	@echo "building llama.cpp $(LLAMA_BUILD) with CUDA (sm $(ARCH)) and the extension (first time: long, see README \"GPU\"; cached in $(CACHE)/llama.cpp-$(LLAMA_BUILD)/build-cuda-$(CUDA_TAG)); ninja's [n/N] lines count the steps"
	$(GPU_PY) -m pip install -v --no-build-isolation --no-deps -e . \
	  -Cbuild-dir=$(CACHE)/build/{wheel_tag}-cuda-$(CUDA_TAG) \
	  -Ccmake.define.SEMIF_CUDA=ON \
	  "-Ccmake.define.SEMIF_CUDA_ARCHITECTURES=$(ARCH)" \
	  -Ccmake.define.SEMIF_CUDA_LINK_FILE=$(CACHE)/cuda-link/cmake-args.txt \
	  -Ccmake.define.SEMIF_LLAMA_SOURCE_DIR=$(LLAMA_ROOT)/src \
	  -Ccmake.define.SEMIF_LLAMA_BUILD_DIR=$(LLAMA_ROOT)/build-cuda-$(CUDA_TAG)
	rm -f $(GPU_VENV)/.build-cpu
	touch $(GPU_VENV)/.build-cuda

$(MODEL):
	$(PYTHON) scripts/fetch_model.py smollm2

$(QWEN):
	$(PYTHON) scripts/fetch_model.py qwen

$(QWEN15):
	$(PYTHON) scripts/fetch_model.py qwen15

model: $(MODEL)
model-qwen: $(QWEN)
model-qwen15: $(QWEN15)

run: build model
	$(VENV)/bin/semif-proxy serve --model $(MODEL) --port $(PORT)

test: test-cpu

# Debian's Chromium drives the playground tests (Playwright's own browser download is not used).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "browser: chromium missing and not root; the playground tests will fail (apt-get install chromium)" >&2; fi; }

# Two parts: most tests in two workers, one file per worker so that a module's server is
# started once; then the `serial` ones alone (they measure CPU use or timing, or take both
# cores). In the first part OpenMP's threads sleep at a barrier instead of spinning: two
# workers' llama.cpp threads on two cores would otherwise wait for a descheduled peer at every
# graph node (a 3-token chat took 9 s instead of 0.1 s). The serial part runs as deployed.
TEST_WORKERS ?= 2
test-cpu: build model browser
	SEMIF_TEST_MODEL=$(MODEL) OMP_WAIT_POLICY=passive $(PY) -m pytest -n $(TEST_WORKERS) \
	  --dist loadfile -m "not slow and not serial" $(PYTEST_ARGS)
	SEMIF_TEST_MODEL=$(MODEL) $(PY) -m pytest -m "not slow and serial" $(PYTEST_ARGS)

test-slow: build model model-qwen model-qwen15
	SEMIF_TEST_MODEL=$(MODEL) SEMIF_TEST_QWEN=$(QWEN) SEMIF_TEST_QWEN15=$(QWEN15) \
	  $(PY) -m pytest -m slow $(PYTEST_ARGS)

# The Qwen2.5 checks of the slow set (a few minutes; the 1.1 GB model is fetched once):
# CI runs them after `make test`.
test-qwen: build model model-qwen model-qwen15
	SEMIF_TEST_MODEL=$(MODEL) SEMIF_TEST_QWEN=$(QWEN) SEMIF_TEST_QWEN15=$(QWEN15) \
	  $(PY) -m pytest -m slow -k qwen $(PYTEST_ARGS)

test-gpu:
	@if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then \
	  echo "test-gpu: no NVIDIA GPU is visible on this machine (nvidia-smi finds none)." >&2; \
	  echo "test-gpu: run it on a GPU host; 'make test' runs the CPU suite." >&2; exit 2; fi
	$(MAKE) build-gpu model
	SEMIF_TEST_MODEL=$(MODEL) SEMIF_TEST_GPU_LAYERS=999 $(GPU_PY) -m pytest -m "not slow" $(PYTEST_ARGS)

# The GPU check for a host without network (README "## GPU"): `gpu-pack` here after
# `build-gpu`, then scripts/gpu_check.sh there with .gpu-carry; `gpu-check-dry` runs its CPU
# parts here. `model-random` writes the ~300M-parameter F16 stand-in model it uses.
gpu-pack: build-gpu
	bash scripts/gpu_pack.sh --arch "$(ARCH)" $(GPU_PACK_ARGS)

gpu-check:
	bash scripts/gpu_check.sh --arch "$(ARCH)"

gpu-check-dry: build
	PYTHON=$(PY) bash scripts/gpu_check.sh --dry-run

model-random: $(VENV)/.deps
	$(PY) -m semif_proxy.model.tiny_gguf --params 300M --out $(CACHE)/models/random-300M-f16.gguf

# A stand-in for the AWS llama.cpp image's /opt/llama.cpp/bin (scripts/base_sim.sh): the pinned
# llama.cpp built as the base builds it (GGML_BACKEND_DL=ON: loadable CPU backend), only bin/
# kept. tests/test_base_image.py builds it too when missing; CI builds it first (~15 min, once).
# SEMIF_BASE_SIM_VARIANTS=one builds one loadable CPU backend instead of the base's 14
# (~7 min less).
.PHONY: base-sim
base-sim: $(LLAMA_ROOT)/src.sha256
	bash scripts/base_sim.sh

# Side-by-side benchmarks; numbers go to bench/results/ (see README "Benchmarks").
BENCH_ARGS ?=
bench: build model model-qwen
	$(VENV)/bin/pip install -q -c $(CONSTRAINTS) $(BENCH_DEPS)
	$(PY) -m bench --model $(MODEL) --tag smollm2 $(BENCH_ARGS) all
	$(PY) -m bench --model $(QWEN) --tag qwen2.5-0.5b --tasks easy,original $(BENCH_ARGS) all

# The generated docs, from the code and bench/results/: docs/configuration.md and README.md's
# settings table (scripts/gen_config_docs.py), docs/benchmarks.md, its plots, README.md's
# headline table and docs/sagemaker.md's autoscaling block (bench.report --docs), the diagram
# (scripts/gen_diagram.py). tests/test_docs.py fails when any of them is stale.
.PHONY: docs
docs: $(VENV)/.deps
	$(VENV)/bin/pip install -q -c $(CONSTRAINTS) $(BENCH_DEPS)
	$(PY) scripts/gen_config_docs.py
	$(PY) -m bench.report --docs
	$(PY) scripts/gen_diagram.py

lint: $(VENV)/.deps
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf $(VENV) build dist *.egg-info
