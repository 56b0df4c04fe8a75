#!/bin/bash
# Prints the directory of the base image's libllama.so (the DLC's own build), or fails loudly.
set -euo pipefail
for dir in /usr/local/lib /usr/local/lib64 /usr/lib /usr/lib64 /app /opt; do
  hit="$(find "$dir" -maxdepth 4 -name 'libllama.so*' -print -quit 2>/dev/null || true)"
  if [[ -n "$hit" ]]; then dirname "$hit"; exit 0; fi
done
echo "find-libllama: no libllama.so in the base image; pass SEMIF_LLAMA_LIB_DIR" >&2
exit 1
