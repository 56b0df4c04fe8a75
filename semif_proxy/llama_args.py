"""The AWS llama.cpp DLC's SM_LLAMA_CPP_* convention, mapped to llama-server argv."""

from __future__ import annotations

from collections.abc import Mapping

PREFIX = "SM_LLAMA_CPP_"
# Chosen by the proxy itself, never forwarded: the model file, where models live, public port.
RESERVED = frozenset({"MODEL", "MODEL_DIR", "PORT"})


def flag_name(env_name: str) -> str:
    return "--" + env_name[len(PREFIX) :].lower().replace("_", "-")


def llama_server_args(env: Mapping[str, str]) -> list[str]:
    """`SM_LLAMA_CPP_N_GPU_LAYERS=999` -> ["--n-gpu-layers", "999"], sorted by variable name.

    `true` (any case) or an empty value gives a bare flag, `false` drops it. Values are single argv
    elements: no shell ever sees them, so spaces or newlines cannot inject arguments.
    """
    args: list[str] = []
    for name in sorted(env):
        if not name.startswith(PREFIX) or name[len(PREFIX) :] in RESERVED:
            continue
        suffix = name[len(PREFIX) :]
        if not suffix:
            continue
        value = env[name]
        lowered = value.strip().lower()
        if lowered == "false":
            continue
        args.append(flag_name(name))
        if lowered not in ("", "true"):
            args.append(value)
    return args


def arg_value(args: list[str], *names: str) -> str | None:
    """The value given to any of `names` in an argv list (last one wins, as in llama-server)."""
    found = None
    for i, arg in enumerate(args):
        if arg in names and i + 1 < len(args) and not args[i + 1].startswith("--"):
            found = args[i + 1]
    return found
