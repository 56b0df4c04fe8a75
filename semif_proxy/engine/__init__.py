"""The decision engine: the worker that turns questions into scored options on libllama
(`worker`), its one thread (`thread`), the native binding (`native`), the prompt and its
labels (`prompt`, `label_tree`), the prefix cache, the special-token policy (`injection`) and
the example the exactness check runs (`examples`). Knows nothing of HTTP or the API schemas."""
