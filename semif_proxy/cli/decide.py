"""`semif-proxy decide`: decisions from a file or stdin, one JSON body or JSON Lines, answered
in this process."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from semif_proxy.cli.parser import usage_error
from semif_proxy.cli.serve import _settings
from semif_proxy.logs import configure_logging


def _decide_input(source: str | None) -> tuple[bytes, str]:
    """The request bytes and the name to give them in errors: a file, or stdin for `-` (or no
    argument when stdin is not a terminal)."""
    if source is None and sys.stdin.isatty():
        usage_error("decide", "give a request file, or pipe one on stdin (see --help)")
    if source in (None, "-"):
        return sys.stdin.buffer.read(), "<stdin>"
    try:
        return Path(source).read_bytes(), source
    except FileNotFoundError:
        usage_error("decide", f"{source}: no such file")
    except OSError as exc:
        usage_error("decide", f"{source}: cannot read: {exc.strerror or exc}")


def _decide_lines(raw: bytes, name: str, jsonl: bool) -> list[bytes] | None:
    """The input's JSON Lines, or None when it is one JSON body: JSON Lines when --jsonl says
    so, the file is named *.jsonl, or the whole input is no JSON but has several lines."""
    from semif_proxy.http.jsonlines import split_lines

    if not raw.strip():
        usage_error("decide", f"{name}: empty input (a JSON body, or JSON Lines)")
    if jsonl or name.endswith((".jsonl", ".jsonlines")):
        return split_lines(raw)
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        lines = split_lines(raw)
        if sum(1 for line in lines if line.strip()) > 1:
            return lines
        usage_error("decide", f"{name}: not JSON ({exc})")
    if not isinstance(body, dict):
        usage_error("decide", f"{name}: the request must be a JSON object")
    return None


def cmd_decide(args: argparse.Namespace) -> int:
    """Exit 0: answered (every line, for JSON Lines); 1: the request (or some line) was
    refused, its error body printed; 2: no usable input, settings or model."""
    raw, name = _decide_input(args.request)
    lines = _decide_lines(raw, name, args.jsonl)
    from semif_proxy.api import services
    from semif_proxy.engine.worker import DecisionEngine
    from semif_proxy.errors import ApiError, InvalidRequest
    from semif_proxy.http.bodies import parse_json

    settings = _settings(args, chat=False)
    configure_logging("WARNING")
    try:
        engine = DecisionEngine.load(settings)
    except (RuntimeError, ValueError) as exc:  # not a GGUF, an architecture libllama lacks
        usage_error("decide", f"{settings.model_path}: the model does not load: {exc}")
    # The command line is bound by the API's own limits only, not the server's.
    service = services.Decisions(limited=False)

    def answer(body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise InvalidRequest("the line must be a JSON object", field="body")
        return service.answer(engine, service.plan(body, settings, engine.sha256)).body

    try:
        if lines is None:
            try:
                out = answer(json.loads(raw))
            except ApiError as exc:
                json.dump(exc.body(), sys.stdout, indent=2)
                sys.stdout.write("\n")
                return 1
            json.dump(out, sys.stdout, indent=2)
            sys.stdout.write("\n")
            return 0
        # JSON Lines: one answer line per line, in order; a bad line gets its error object
        # (with its line number and status) on its line, as the server's JSON Lines do.
        failed = 0
        for number, line in enumerate(lines, 1):
            try:
                if not line.strip():
                    raise InvalidRequest(
                        "the line is blank; every line must hold one JSON request (a blank line "
                        "is answered with this error so that answers stay line for line)",
                        field="body",
                    )
                out = answer(parse_json(line))
            except ApiError as exc:
                failed += 1
                out = {**exc.body(), "line": number, "status": exc.status}
            sys.stdout.write(json.dumps(out) + "\n")
            sys.stdout.flush()
        return 1 if failed else 0
    finally:
        engine.close()
