"""The command line's conventions, on the real `semif-proxy` process: --version; a usage mistake
is one line on stderr and exit 2 (argparse's and the commands' own, the deploy commands'
included, all before any AWS call); every flag has help that shows its default; `serve --help`
lists the settings from the settings' own table (settings/env.py)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from semif_proxy import __version__
from semif_proxy import settings as settings_module
from semif_proxy.cli import build_parser

# No credentials: a usage mistake must be refused before anything asks AWS.
ENV = {
    **{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SEMIF_"))},
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_ACCESS_KEY_ID": "invalid",
    "AWS_SECRET_ACCESS_KEY": "invalid",
    "AWS_EC2_METADATA_DISABLED": "true",
}
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/semif-proxy@sha256:" + "a" * 64
ROLE = "arn:aws:iam::123456789012:role/semif"
DEPLOY = ["deploy", "--image", IMAGE, "--model-data", "s3://m/x.tar.gz"]
BATCH = ["batch", "--input", "s3://d/in/", "--output", "s3://d/out/", "--model-name", "m"]


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "semif_proxy.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
        stdin=subprocess.DEVNULL,
    )


def test_version() -> None:
    out = cli("--version")
    assert out.returncode == 0 and out.stdout == f"semif-proxy {__version__}\n"


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [action] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def flags(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        a
        for a in parser._actions
        if a.option_strings and not isinstance(a, (argparse._HelpAction, argparse._VersionAction))
    ]


def test_every_flag_has_help_that_shows_its_default() -> None:
    commands = subparsers(build_parser())
    assert {"serve", "decide", "calibrate", "eval", "selfcheck", "deploy", "batch"} <= set(commands)
    for name, parser in commands.items():
        shown = " ".join(parser.format_help().split())
        for action in flags(parser):
            flag = action.option_strings[-1]
            assert action.help, f"{name} {flag} has no help"
            help_text = " ".join(parser.formatter_class(name)._get_help_string(action).split())
            switch = action.nargs == 0 and not isinstance(action, argparse.BooleanOptionalAction)
            if action.required:
                assert "(required)" in help_text, (name, flag)
            elif not switch:
                assert "default" in help_text, f"{name} {flag}: no default in {help_text!r}"
            if action.default not in (None, [], argparse.SUPPRESS) and not switch:
                value = action.default
                if isinstance(value, bool):
                    value = "on" if value else "off"
                if "%(default)" in help_text:
                    assert f"(default: {value})" in shown, (name, flag, value)


def test_serve_help_lists_the_settings_with_their_defaults() -> None:
    out = cli("serve", "--help")
    assert out.returncode == 0
    fields = settings_module.Settings.model_fields
    table = settings_module.env.ENV_VARS
    assert len(table) > 30
    for field, (var, fallbacks) in table.items():
        line = next((x for x in out.stdout.splitlines() if x.split()[:1] == [var]), None)
        assert line is not None, f"{var} missing from serve --help"
        default = fields[field].default
        if isinstance(default, bool):
            assert line.split()[1] == ("on" if default else "off"), line
        elif isinstance(default, (int, float, str)):
            assert line.split()[1] == str(default), line
        for other in fallbacks:
            assert other in line, line


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["eval", "rows.jsonl"], "required: --target"),
        (["eval", "rows.jsonl", "--target", "x.gguf", "--concurrency", "0"], "1 or more"),
        (["eval", "no-such-rows.jsonl", "--target", "x.gguf"], "no such file"),
        (["frobnicate"], "invalid choice"),
        (["serve", "--port", "eighty"], "invalid int value"),
        (["decide", "no-such-request.json"], "no such file"),
        (DEPLOY, "--role or set"),
        (
            [*DEPLOY, "--role", ROLE, "--env", "BROKEN"],
            "KEY=VALUE",
        ),
        (
            [*DEPLOY, "--role", ROLE, "--instance-type", "ml.g5.xlarge"],
            "add --gpu",
        ),
        (
            [*DEPLOY, "--role", ROLE, "--async"],
            "--async needs --output",
        ),
        (["invoke", "--endpoint", "e", "--body", "no-such-body.json"], "--body: cannot read"),
        (["invoke", "--endpoint", "e", "--body", __file__, "--async"], "--input-location"),
        (
            [*BATCH, "--image", IMAGE],
            "needs --model-data too",
        ),
        (["package-model", "--s3", "s3://b/p/"], "required: --gguf"),
    ],
)
def test_a_usage_mistake_is_one_line_and_exit_2(args: list[str], says: str) -> None:
    out = cli(*args)
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith("semif-proxy") and says in out.stderr, out.stderr
    assert out.stdout == ""


def test_help_of_every_command_exits_0() -> None:
    for name in subparsers(build_parser()):
        with pytest.raises(SystemExit) as done:
            build_parser().parse_args([name, "--help"])
        assert done.value.code == 0
