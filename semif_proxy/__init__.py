"""semif-proxy: chat through llama-server and typed decisions from a GGUF model's logits."""

__version__ = "0.1.0"
