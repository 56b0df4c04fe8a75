"""llama-server as a child process: its supervisor, the mapping of SM_LLAMA_CPP_* to its
argv, its flag table and its version."""
