"""The AWS llama.cpp DLC's SM_LLAMA_CPP_* convention, mapped to llama-server argv the way the
binary that will run parses it (its flags are read from its own --help: llama_flags.py).

`SM_LLAMA_CPP_<NAME>=<value>` names the flag `--<name>` (lower case, `_` as `-`), or, when the
binary has no such long flag, its short form `-<name>` (`SM_LLAMA_CPP_C=2048` -> `-c 2048`).
Values are single argv elements: no shell ever sees them, so spaces or newlines cannot inject
arguments. A variable that names no flag of the binary, or a value its flag cannot take, stops
start-up with a message that names the variable.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from semif_proxy.llama_server.flags import Flag, FlagTable, HelpError, read_flags

log = logging.getLogger("semif_proxy.settings")

PREFIX = "SM_LLAMA_CPP_"
# Read by the proxy itself (settings/env.py), never forwarded: the model file, where models live,
# the public port, the API key and weight repacking. The key is the proxy's own (when
# SEMIF_API_KEY is unset): llama-server listens on loopback only and every call reaches it
# through the proxy, which checks the key; a key of llama-server's own would only make it
# refuse the proxy's calls. Repacking is SEMIF_REPACK's alias: the engine and every llama-server
# obey it together (with_defaults adds --no-repack).
READ_BY_PROXY = frozenset({"MODEL", "MODEL_DIR", "PORT", "API_KEY", "REPACK"})
# Set, but not forwarded, with a warning: llama-server must stay on loopback, behind the key.
IGNORED = {
    "HOST": "llama-server listens on 127.0.0.1 only, behind the proxy; the public address is "
    "SEMIF_HOST",
}
REFUSED = {
    "API_KEY_FILE": "not supported: semif-proxy checks the API key itself and keeps llama-server "
    "on loopback; set SEMIF_API_KEY (or SM_LLAMA_CPP_API_KEY)",
}
# Flags the proxy decides, in any spelling (`-m` is `--model`): set by a variable they stop
# start-up, since llama-server would then serve another model, elsewhere, or not at all.
_MODEL = "the model is chosen by semif-proxy (SM_LLAMA_CPP_MODEL, SM_LLAMA_CPP_MODEL_DIR)"
_EXITS = "llama-server would print and exit instead of serving"
PROXY_FLAGS = {
    "--model": _MODEL,
    "--model-url": _MODEL,
    "--hf-repo": _MODEL,
    "--docker-repo": _MODEL,
    "--models-dir": _MODEL,
    "--models-preset": _MODEL,
    "--host": "llama-server listens on 127.0.0.1 only, behind the proxy",
    "--port": "llama-server's loopback port is LLAMA_CPP_UPSTREAM_PORT",
    "--api-prefix": "the proxy forwards llama-server's routes at their usual paths",
    "--api-key": "the proxy checks the API key (SEMIF_API_KEY)",
    "--api-key-file": "the proxy checks the API key (SEMIF_API_KEY)",
    "--ssl-key-file": "the proxy speaks plain HTTP to llama-server on loopback",
    "--ssl-cert-file": "the proxy speaks plain HTTP to llama-server on loopback",
    "--repack": "weight repacking is SEMIF_REPACK (or SM_LLAMA_CPP_REPACK): on, off or auto, "
    "set for the engine and llama-server together",
    "--help": _EXITS,
    "--version": _EXITS,
    "--completion-bash": _EXITS,
    "--list-devices": _EXITS,
    "--cache-list": _EXITS,
}
# The words settings/env.py reads as on/off, plus llama.cpp's own (enabled/disabled). An empty
# value is "on": the bare flag, as `SM_LLAMA_CPP_NO_MMAP=` always meant.
TRUE = frozenset({"", "1", "true", "on", "yes", "enabled"})
FALSE = frozenset({"0", "false", "off", "no", "disabled"})


class LlamaArgsError(ValueError):
    """A variable llama-server would reject; the message names it."""


def forwarded(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """(variable, value) of every SM_LLAMA_CPP_* variable meant for llama-server, sorted."""
    items = []
    for name in sorted(env):
        suffix = name[len(PREFIX) :]
        if not name.startswith(PREFIX) or not suffix or suffix in READ_BY_PROXY:
            continue
        if suffix in REFUSED:
            raise LlamaArgsError(f"{name}: {REFUSED[suffix]}")
        if suffix in IGNORED:
            log.warning(
                f"{name} is ignored: {IGNORED[suffix]}",
                extra={"event": "setting_ignored", "variable": name},
            )
            continue
        items.append((name, env[name]))
    return items


def _flag_name(table: FlagTable, var: str) -> tuple[str, Flag]:
    word = var[len(PREFIX) :].lower().replace("_", "-")
    for name in (f"--{word}", f"-{word}"):
        flag = table.get(name)
        if flag is not None:
            return name, flag
    raise LlamaArgsError(f"{var}: this llama-server has no flag --{word} (nor -{word})")


def _off_switch(table: FlagTable, flag: Flag) -> str | None:
    """How to turn a switch off: its negation, or (older builds list `-nocb, --no-cont-batching`
    as an option of its own) a separate `--no-<name>` switch; None when it has neither."""
    negations = [n for n in flag.negations if n.startswith("--")] or list(flag.negations)
    if negations:
        return negations[-1]
    other = table.get("--no-" + flag.long_name.lstrip("-"))
    return other.long_name if other is not None and other.values == 0 else None


def _args_for(var: str, name: str, flag: Flag, value: str, table: FlagTable) -> list[str]:
    lowered = value.strip().lower()
    if flag.removed:
        raise LlamaArgsError(f"{var}: llama-server {name}: {flag.help}")
    if flag.values == 0:
        if lowered in TRUE:
            return [name]
        if lowered in FALSE:
            if name in flag.negations:
                return [flag.long_name]  # SM_LLAMA_CPP_NO_X=false: --x
            off = _off_switch(table, flag)
            return [off] if off else []  # nothing to turn off: the default stands
        raise LlamaArgsError(
            f"{var}: llama-server {name} is an on/off switch (true/false), got {value!r}"
        )
    switch = flag.switch_values
    if switch is not None and lowered in TRUE and lowered:
        return [name, switch[0]]
    if switch is not None and lowered in FALSE:
        return [name, switch[1]]
    if flag.choices is not None:
        for choice in flag.choices:
            if choice.lower() == lowered:
                return [name, choice]
        raise LlamaArgsError(
            f"{var}: llama-server {name} takes {'|'.join(flag.choices)}, got {value!r}"
        )
    if not value.strip():
        raise LlamaArgsError(f"{var}: llama-server {name} needs a value ({flag.hint})")
    if flag.values == 2:
        parts = value.split()
        if len(parts) != 2:
            raise LlamaArgsError(
                f"{var}: llama-server {name} takes two values ({flag.hint}) separated by a "
                f"space, got {value!r}"
            )
        return [name, *parts]
    return [name, value]


def env_to_args(env: Mapping[str, str], table: FlagTable) -> list[str]:
    """`SM_LLAMA_CPP_N_GPU_LAYERS=999` -> ["--n-gpu-layers", "999"], sorted by variable name.

    A switch (no value) takes true/false (on/off, 1/0, yes/no): the flag, its `--no-` form, or
    nothing when it has none. A flag whose value is on|off(|auto) or 0|1 gets that spelling of
    true/false; one with enumerated values takes only those.
    """
    return _map(forwarded(env), table)


def _map(items: list[tuple[str, str]], table: FlagTable) -> list[str]:
    args: list[str] = []
    seen: dict[Flag, str] = {}
    for var, value in items:
        name, flag = _flag_name(table, var)
        for word in (*flag.names, *flag.negations):
            if word in PROXY_FLAGS:
                raise LlamaArgsError(f"{var}: llama-server {name}: {PROXY_FLAGS[word]}")
        if flag in seen:
            raise LlamaArgsError(
                f"{var}: {seen[flag]} sets the same llama-server flag ({flag.long_name}); "
                "set one of them"
            )
        seen[flag] = var
        args += _args_for(var, name, flag, value, table)
    return args


def find_binary(configured: Path | None) -> Path | None:
    """The llama-server that will run (SEMIF_LLAMA_SERVER, the bundled one, or PATH)."""
    from semif_proxy.engine import native  # the compiled extension: only needed when chat is on

    return native.llama_server_path(configured)


def llama_server_args(env: Mapping[str, str], configured: Path | None) -> list[str]:
    """env_to_args against the flags of the llama-server that will run (read from its --help,
    cached); the binary is looked for only when there is a variable to map."""
    items = forwarded(env)
    if not items:
        return []
    var = items[0][0]
    binary = find_binary(configured)
    if binary is None:
        raise LlamaArgsError(
            f"{var}: no llama-server binary to check it against (bundled, SEMIF_LLAMA_SERVER "
            "or PATH)"
        )
    try:
        table = read_flags(binary)
    except HelpError as exc:
        raise LlamaArgsError(f"{var}: cannot check it against llama-server: {exc}") from None
    return _map(items, table)


def with_defaults(args: Sequence[str], threads: int | None, repack: bool = True) -> list[str]:
    """The operator's arguments plus what the proxy chooses where the operator did not:
    - threads from the CPU plan (cpu/plan.py);
    - `--no-repack` when SEMIF_REPACK resolves to off (settings.repack_choice), as the engine
      loads: the weights then stay in the mmap'ed file every process shares;
    - flash attention off, as in the engine. Then the same prompt gives the same next-token
      distribution through /completion as through a decision (with it on, llama.cpp's CPU
      kernels sum attention in another order: up to 0.06 apart in probability), and prompt
      processing was as fast either way on the CPU (docs/benchmarks.md)."""
    out = list(args)
    if threads is not None and not any(a in ("--threads", "-t") for a in out):
        out += ["--threads", str(threads)]
    if not any(a in ("--flash-attn", "-fa") for a in out):
        out += ["--flash-attn", "off"]
    if not repack and not any(a in ("--no-repack", "-nr") for a in out):
        out.append("--no-repack")
    return out
