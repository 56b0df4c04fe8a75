"""The command line's conventions: one line and exit 2 for a usage mistake, every flag's default
in its help, the settings listed under `serve --help`."""

from __future__ import annotations

import argparse
import textwrap
from typing import Any, NoReturn

from semif_proxy.llama_server.args import PREFIX
from semif_proxy.settings import Settings
from semif_proxy.settings.env import ENV_VARS


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Each flag's default after its help (unless the help says it already, or the flag is
    required or a switch); descriptions and epilogs as written (serve's table of settings)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.help == argparse.SUPPRESS or not action.option_strings or "default" in text:
            return text
        if action.required:
            return f"{text} (required)"
        if isinstance(action, argparse.BooleanOptionalAction):
            return f"{text} (default: {'on' if action.default else 'off'})"
        if action.default is None or action.default is argparse.SUPPRESS or action.nargs == 0:
            return text  # no value to show, or a switch (off unless given)
        if action.default == []:
            return f"{text} (default: none)"
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """argparse with this command's conventions: a usage mistake is one line on stderr (the
    command, what is wrong, where the help is) and exit 2; every parser, the subcommands' too,
    shows defaults with HelpFormatter."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


class UsageError(Exception):
    """Bad input to a command (a file missing, not JSON): main() writes one line naming the
    command and returns 2."""

    def __init__(self, command: str, message: str) -> None:
        super().__init__(f"semif-proxy {command}: {message}")


def usage_error(command: str, message: str) -> NoReturn:
    raise UsageError(command, " ".join(message.split("\n")))


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected 1 or more, got {value}")
    return value


def _shown_default(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (int, float, str)):
        return str(value)
    return "none"  # the calibration: temperature 1, no position prior


def settings_epilog() -> str:
    """`serve --help`'s list of the settings that configure it, from the settings' own table
    of environment variables and the Settings defaults."""

    def row(var: str, default: str, note: str = "") -> str:
        return f"  {var:<34} {default:<14} {note}".rstrip()

    fields = Settings.model_fields
    rows = [
        row("SM_LLAMA_CPP_MODEL", "unset", "the GGUF (absolute, or in the model dir)"),
        row("SM_LLAMA_CPP_MODEL_DIR", "/opt/ml/model", "its first *.gguf when none is named"),
    ]
    for field, (var, fallbacks) in ENV_VARS.items():
        default = _shown_default(fields[field].default) if field in fields else "-"
        rows.append(row(var, default, f"or {', '.join(fallbacks)}" if fallbacks else ""))
    rows += [
        row(f"{PREFIX}<FLAG>", "-", "a llama-server flag (--<flag>), passed on"),
        row("SAGEMAKER_SAFE_PORT_RANGE", "unset", "where llama-server's loopback ports go"),
    ]
    return "\n".join(
        [
            "settings (environment variables, read once at start-up; --model, --port and --host",
            "win over theirs; docs/configuration.md says what each one does):",
            *rows,
        ]
    )


def _paragraph(text: str) -> str:
    return textwrap.fill(text, 88)
