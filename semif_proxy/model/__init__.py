"""Model files: GGUF metadata reading, finding and hashing a model directory, the tiny GGUF
writer the self-check and the tests use, and the GPU memory estimate."""
