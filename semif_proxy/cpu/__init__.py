"""How the engine and llama-server share the machine's cores: the thread plan and the CPU
sharing policies."""
