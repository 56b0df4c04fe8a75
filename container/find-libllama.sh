#!/bin/bash
# Prints the folder of the base image's libllama.so (the DLC's own build), or fails loudly.
# Looked for where the base's own loader looks first: the LD_LIBRARY_PATH entries (the DLC sets
# /opt/llama.cpp/bin), then llama-server's folder (the DLC copies build/bin/ whole), then the
# usual prefixes.
set -euo pipefail
candidates=()
IFS=: read -r -a ld_dirs <<< "${LD_LIBRARY_PATH:-}"
for dir in "${ld_dirs[@]}"; do
  [[ -n "$dir" ]] && candidates+=("$dir")  # an empty entry means the working directory: skip
done
if server="$(command -v llama-server)"; then
  candidates+=("$(dirname "$(readlink -f "$server")")")
fi
for dir in "${candidates[@]}"; do
  if [[ -e "$dir/libllama.so" ]]; then echo "$dir"; exit 0; fi
done
for dir in /opt/llama.cpp/bin /usr/local/lib /usr/local/lib64 /usr/lib /usr/lib64 /app /opt; do
  hit="$(find "$dir" -maxdepth 4 -name 'libllama.so*' -print -quit 2>/dev/null || true)"
  if [[ -n "$hit" ]]; then dirname "$hit"; exit 0; fi
done
echo "find-libllama: no libllama.so on LD_LIBRARY_PATH, next to llama-server or under the usual" \
     "prefixes; pass SEMIF_LLAMA_LIB_DIR" >&2
exit 1
