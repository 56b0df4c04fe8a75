"""HTTP routes. Handlers parse, call a service, render; none of them knows llama.cpp."""
