#!/bin/bash
# The images' builder step, also run by tests/test_base_image.py against a simulated base:
# builds semif-proxy into a fresh venv in CMake mode (b), against the base image's own libllama.
#
#   container/build-extension.sh <source dir> <venv dir>
#
# 1. Asks the base's `llama-server --version` (on PATH) which llama.cpp build and commit it is.
# 2. Fails if that cannot be read, or if LLAMA_CPP_EXPECT (b<build>, <build> or a commit
#    prefix; optional) names another one.
# 3. Fetches the headers of exactly that commit (the base ships libraries, no headers): GitHub's
#    archive of the commit (LLAMA_HEADERS_URL overrides the address), checked to hold that
#    commit, or the llama.cpp tree in LLAMA_HEADERS_TREE (tests, offline builds).
# 4. Finds the base's libllama (find-libllama.sh, or SEMIF_LLAMA_LIB_DIR) and pip-installs the
#    package against it, build number and commit as read in 1. Nothing of llama.cpp is bundled.
# PYTHON names the venv's interpreter (default python3.12, the base's).
set -euo pipefail

fail() { echo "build-extension: $*" >&2; exit 1; }

[[ $# -eq 2 ]] || fail "usage: $0 <source dir> <venv dir>"
src="$(cd "$1" && pwd)"
venv="$2"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python3.12}"
command -v "$python" >/dev/null || fail "no $python on PATH"

# 1. Which llama.cpp the base runs.
server="$(command -v llama-server)" || fail "no llama-server on PATH (the base keeps it in /opt/llama.cpp/bin)"
version="$("$server" --version 2>&1)" || fail "'$server --version' failed: $version"
parsed="$(printf '%s\n' "$version" | PYTHONPATH="$src" "$python" -m semif_proxy.llama_server.version)" \
  || fail "cannot read the llama.cpp build from '$server --version' (output above)"
read -r build commit <<< "$parsed"
if [[ "$build" == 0 || ! "$commit" =~ ^[0-9a-f]{7,40}$ ]]; then
  fail "'$server --version' names build $build, commit '$commit': the base was built without" \
       "git metadata, so its headers cannot be fetched by commit"
fi
echo "build-extension: the base runs llama.cpp build $build, commit $commit ($server)" >&2

# 2. The build the caller expects, if any.
expect="${LLAMA_CPP_EXPECT:-}"
if [[ -n "$expect" ]]; then
  if [[ "$expect" =~ ^b?[0-9]{1,6}$ ]]; then
    [[ "${expect#b}" == "$build" ]]
  else  # a commit, abbreviated or not, on either side
    [[ "$commit" == "${expect:0:${#commit}}" || "$expect" == "${commit:0:${#expect}}" ]]
  fi || fail "LLAMA_CPP_EXPECT=$expect but the base runs build $build (commit $commit)"
fi

# 3. The headers of that commit, in one folder.
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
headers="$work/include"
mkdir -p "$headers"
tree="${LLAMA_HEADERS_TREE:-}"
if [[ -z "$tree" ]]; then
  url="${LLAMA_HEADERS_URL:-https://github.com/ggml-org/llama.cpp/archive/${commit}.tar.gz}"
  echo "build-extension: fetching headers from $url" >&2
  curl -fsSL --retry 3 -o "$work/llama.tar.gz" "$url" || fail "cannot download $url"
  # GitHub's archives are `git archive` output: the commit is in the pax header's comment.
  full="$("$python" -c 'import sys, tarfile; print(tarfile.open(sys.argv[1]).pax_headers.get("comment", ""))' \
         "$work/llama.tar.gz")"
  [[ "$full" == "$commit"* ]] || fail "$url holds commit '$full', not $commit"
  mkdir -p "$work/tree"
  tar -xzf "$work/llama.tar.gz" -C "$work/tree" --strip-components=1
  tree="$work/tree"
fi
[[ -f "$tree/include/llama.h" && -f "$tree/ggml/include/ggml.h" ]] \
  || fail "$tree is not a llama.cpp tree (no include/llama.h or ggml/include/ggml.h)"
cp "$tree"/include/*.h "$tree"/ggml/include/*.h "$headers/"

# 4. Build and install against the base's libllama.
lib_dir="${SEMIF_LLAMA_LIB_DIR:-}"
if [[ -z "$lib_dir" ]]; then
  lib_dir="$(bash "$here/find-libllama.sh")" || fail "cannot find the base's libllama.so"
fi
echo "build-extension: linking $lib_dir/libllama.so" >&2
"$python" -m venv "$venv"
"$venv/bin/pip" install --quiet "scikit-build-core>=0.10" "pybind11>=2.12"
"$venv/bin/pip" install --quiet --no-build-isolation "$src" \
  -Ccmake.define.SEMIF_LLAMA_LIB_DIR="$lib_dir" \
  -Ccmake.define.SEMIF_LLAMA_INCLUDE_DIR="$headers" \
  -Ccmake.define.SEMIF_LLAMA_BUILD_NUMBER="$build" \
  -Ccmake.define.SEMIF_LLAMA_BUILD_COMMIT="$commit"
"$venv/bin/pip" uninstall --quiet --yes scikit-build-core pybind11
