"""The command-line flags a llama-server binary accepts, read from its own `--help`.

llama.cpp changes its flags between builds (`--flash-attn` was a bare switch, later it takes
`on|off|auto`; `--mmap` gave way to `--load-mode`), and the production image runs an older build
than the one bundled here. So the binary that will run is asked, once per file version.

`--help` prints one entry per option (common/arg.cpp, `common_arg::to_string`):

    -fa,   --flash-attn [on|off|auto]       set Flash Attention use ('on', 'off', or 'auto', ...
    -cb,   --cont-batching, -nocb, --no-cont-batching
                                            whether to enable continuous batching ...

every name (short and long), then the negations (`args_neg`) of an on/off option, then the value
hint; the help text starts at column 40, or on the next line when the names are longer.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

HELP_COLUMN = 40
HELP_TIMEOUT = 30.0

# Enumerated value hints: [on|off|auto], [on|off], <0|1>, {none,layer,row}, sgd|adamw.
_PIPE_CHOICES = re.compile(r"[\[<]?(?P<items>[\w.+-]+(?:\|[\w.+-]+)+)[\]>]?")
_BRACE_CHOICES = re.compile(r"\{(?P<items>[\w.+-]+(?:, ?[\w.+-]+)+)\}")
_NAME = re.compile(r"-{1,2}[A-Za-z0-9][\w.-]*")


class HelpError(RuntimeError):
    """The binary's --help could not be run or read."""


@dataclass(frozen=True)
class Flag:
    """One llama-server option."""

    names: tuple[str, ...]  # every positive spelling, short and long: ("-fa", "--flash-attn")
    negations: tuple[str, ...] = ()  # ("-nocb", "--no-cont-batching")
    values: int = 0  # argv elements after the flag: 0 (a switch), 1, or 2
    choices: tuple[str, ...] | None = None  # the enumerated values, when the hint lists them
    hint: str = ""
    help: str = ""

    @property
    def long_name(self) -> str:
        longs = [n for n in self.names if n.startswith("--")]
        return longs[-1] if longs else self.names[-1]

    @property
    def removed(self) -> bool:
        return self.help.lower().startswith("the argument has been removed")

    @property
    def switch_values(self) -> tuple[str, str] | None:
        """(on, off) spellings when the value is an on/off choice: on|off(|auto), 0|1."""
        if not self.choices:
            return None
        for on, off in (("on", "off"), ("1", "0"), ("true", "false"), ("enabled", "disabled")):
            if on in self.choices and off in self.choices:
                return on, off
        return None


@dataclass(frozen=True)
class FlagTable:
    flags: tuple[Flag, ...]

    @functools.cached_property
    def by_name(self) -> dict[str, Flag]:
        table: dict[str, Flag] = {}
        for flag in self.flags:
            for name in (*flag.names, *flag.negations):
                table.setdefault(name, flag)
        return table

    def get(self, name: str) -> Flag | None:
        return self.by_name.get(name)


def _hint_tokens(hint: str) -> list[str]:
    """Split a value hint on the spaces outside brackets: `START END` is two values,
    `<tensor name pattern>=<buffer type>,...` and `{pca, mean}` are one."""
    tokens: list[str] = []
    depth = 0
    current = ""
    for ch in hint:
        if ch in "[{(<":
            depth += 1
        elif ch in "]})>":
            depth = max(0, depth - 1)
        if ch == " " and depth == 0:
            if current:
                tokens.append(current)
            current = ""
        else:
            current += ch
    if current:
        tokens.append(current)
    return tokens


def _choices(hint: str) -> tuple[str, ...] | None:
    for pattern in (_PIPE_CHOICES, _BRACE_CHOICES):
        found = pattern.fullmatch(hint)
        if found:
            return tuple(v.strip() for v in re.split(r"[|,]", found.group("items")))
    return None


def _parse_spec(spec: str, help_text: str) -> Flag | None:
    names: list[str] = []
    rest = spec
    while True:
        found = _NAME.match(rest)
        if not found:
            break
        names.append(found.group())
        rest = rest[found.end() :]
        if not rest.startswith(","):
            break
        rest = rest[1:].lstrip()
    if not names:
        return None
    hint = rest.strip()
    negations: tuple[str, ...] = ()
    if not hint and any(n.startswith("--no-") and "--" + n[5:] in names for n in names):
        # An on/off option: its args come first, then its args_neg (after the last positive
        # long name; a lone `--no-mmap` of older builds stays a positive switch).
        last = max(
            i for i, n in enumerate(names) if n.startswith("--") and not n[2:].startswith("no-")
        )
        names, negations = names[: last + 1], tuple(names[last + 1 :])
    tokens = _hint_tokens(hint)
    return Flag(
        names=tuple(names),
        negations=negations,
        values=min(len(tokens), 2),
        choices=_choices(tokens[0]) if len(tokens) == 1 else None,
        hint=hint,
        help=" ".join(help_text.split()),
    )


def parse_help(text: str) -> FlagTable:
    """Every option `--help` lists, in its order."""
    flags: list[Flag] = []
    spec: str | None = None
    help_lines: list[str] = []

    def finish() -> None:
        if spec is not None:
            flag = _parse_spec(spec, " ".join(help_lines))
            if flag is not None:
                flags.append(flag)

    for line in text.splitlines():
        if line.startswith("-") and not line.startswith("-----"):
            finish()
            help_lines = []
            # Names that fit end before column 40 with at least three spaces of padding.
            if len(line) > HELP_COLUMN - 3 and line[HELP_COLUMN - 3 : HELP_COLUMN].isspace():
                spec, first_help = line[:HELP_COLUMN].rstrip(), line[HELP_COLUMN:].strip()
                help_lines.append(first_help)
            else:
                spec = line.rstrip()
        elif spec is not None and line.startswith(" "):
            help_lines.append(line.strip())
        else:
            finish()
            spec = None
            help_lines = []
    finish()
    return FlagTable(tuple(flags))


@functools.lru_cache(maxsize=8)
def _read(path: str, mtime_ns: int, size: int) -> FlagTable:
    try:
        done = subprocess.run(
            [path, "--help"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=HELP_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HelpError(f"could not run {path} --help: {exc}") from None
    table = parse_help(done.stdout.decode("utf-8", "replace"))
    if not table.flags:  # some builds print their usage to stderr
        table = parse_help(done.stderr.decode("utf-8", "replace"))
    if done.returncode != 0 or not table.flags:
        tail = done.stderr.decode("utf-8", "replace").strip()[-300:]
        raise HelpError(f"{path} --help exited with {done.returncode} and listed no flags: {tail}")
    return table


def read_flags(binary: Path) -> FlagTable:
    """The binary's flags, from its --help; cached per path, modification time and size."""
    try:
        st = os.stat(binary)
    except OSError as exc:
        raise HelpError(f"llama-server binary {binary}: {exc.strerror}") from None
    return _read(str(binary), st.st_mtime_ns, st.st_size)
