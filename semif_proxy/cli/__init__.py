"""Command line: `semif-proxy serve` (the container entrypoint), `decide`, `calibrate`, `eval`,
`selfcheck` and the SageMaker deploy commands, one module each.

Conventions (docs/cli.md): a usage mistake is one line on stderr and exit 2; every flag's help
says its default; progress goes to stderr, results to stdout or the files named."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from semif_proxy import __version__
from semif_proxy.calibration.position_prior import MIN_QUESTIONS
from semif_proxy.cli.calibrate import cmd_calibrate
from semif_proxy.cli.decide import cmd_decide
from semif_proxy.cli.evaluate import cmd_eval
from semif_proxy.cli.parser import (
    Parser,
    UsageError,
    _paragraph,
    positive_int,
    settings_epilog,
)
from semif_proxy.cli.serve import cmd_selfcheck, cmd_serve


def build_parser() -> argparse.ArgumentParser:
    from semif_proxy.eval.runner import RETRY_BUDGET, RETRY_TRIES

    parser = Parser(prog="semif-proxy", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = sub.add_parser(
        "serve",
        help="run the proxy (chat + decisions)",
        description="Run the proxy: llama-server's chat and the decision engine on one port.",
        epilog=settings_epilog(),
    )
    serve.add_argument("--model", help="GGUF file (default: SM_LLAMA_CPP_MODEL / model dir)")
    serve.add_argument(
        "--port",
        type=int,
        help="public port (default: SAGEMAKER_BIND_TO_PORT, SM_LLAMA_CPP_PORT or 8080)",
    )
    serve.add_argument("--host", help="bind address (default: SEMIF_HOST or 127.0.0.1)")
    serve.set_defaults(func=cmd_serve)
    decide = sub.add_parser(
        "decide",
        help="answer decision requests from a file or stdin (JSON or JSON Lines)",
        description=_paragraph(
            "Answer one decision request (a JSON body: the answer, indented) or many (JSON "
            "Lines: one answer line per line, a bad line's error object on its line) with the "
            "model in this process. Exit 0: answered; 1: refused (the error body printed); 2: "
            "no usable input, settings or model."
        ),
    )
    decide.add_argument(
        "request",
        nargs="?",
        help="request file ({'decision': ...} or {'decisions': [...]}, or one per line); '-' or "
        "none: stdin (default: stdin when it is not a terminal)",
    )
    decide.add_argument(
        "--jsonl",
        action="store_true",
        help="read JSON Lines even if the input is one line (*.jsonl files always are)",
    )
    decide.add_argument("--model", help="GGUF file (default: SM_LLAMA_CPP_MODEL / model dir)")
    decide.set_defaults(func=cmd_decide)
    cal = sub.add_parser(
        "calibrate", help="fit a softmax temperature per question type and a position prior"
    )
    cal.add_argument(
        "--predictions",
        help="JSONL: {type, option_logits, label} (or expected + option_ids) per line; fits the "
        "temperatures (default: none fitted)",
    )
    cal.add_argument(
        "--rows",
        help="JSONL the server writes (SEMIF_ROWS_LOG): questions asked in rotated orders, "
        "unlabelled; fits the position prior (default: none fitted)",
    )
    cal.add_argument(
        "--min-questions",
        type=int,
        default=MIN_QUESTIONS,
        help="fewest questions asked in every rotation for a prior at one type and option count",
    )
    cal.add_argument(
        "--target-accuracy",
        type=float,
        help="also suggest min_confidence thresholds per question type and option count that "
        "keep answers right this often (0-1; SEMIF_MIN_CONFIDENCE reads the file; default: none)",
    )
    cal.add_argument("--output", default="temperature.json", help="file SEMIF_CALIBRATION reads")
    cal.set_defaults(func=cmd_calibrate)
    ev = sub.add_parser(
        "eval",
        help="score targets on labelled rows (JevBench or decisions)",
        description=_paragraph(
            "Ask labelled rows of one or more targets and score them side by side. Each answer "
            "is appended as it comes to OUT.rows.jsonl, so that an interrupted run can --resume; "
            f"a 429 or 503 is retried (at most {RETRY_TRIES} tries and {RETRY_BUDGET:g} s of "
            "waits per row, Retry-After honoured). See docs/eval.md."
        ),
    )
    ev.add_argument("rows", help="JSONL: JevBench rows or {'decision': ..., 'expected': id}")
    ev.add_argument(
        "--target",
        action="append",
        required=True,
        help="model.gguf (in-process), http://host:port (a server), sagemaker:<endpoint>; "
        "repeat to compare",
    )
    ev.add_argument(
        "--out",
        default="eval-results.json",
        help="results JSON (each answer as it comes: OUT.rows.jsonl)",
    )
    ev.add_argument("--html", help="also write an HTML report here (default: none)")
    ev.add_argument(
        "--api-key", help="Bearer key for URL targets (default: SEMIF_API_KEY, never shown)"
    )
    ev.add_argument("--region", help="AWS region of sagemaker: targets (default: boto3's)")
    ev.add_argument("--timeout", type=float, default=120.0, help="seconds per URL request")
    ev.add_argument("--limit", type=positive_int, help="read only the first N rows (default: all)")
    ev.add_argument(
        "--concurrency",
        type=positive_int,
        default=1,
        help="rows asked at once of each target (fewer while it answers 429/503; an in-process "
        "model answers one at a time)",
    )
    ev.add_argument(
        "--resume",
        action="store_true",
        help="keep the answers OUT.rows.jsonl already holds and ask only the rest (without it the "
        "file is started afresh)",
    )
    ev.set_defaults(func=cmd_eval)
    check = sub.add_parser("selfcheck", help="check the engine, libllama and llama-server")
    check.add_argument(
        "--require-system-libllama",
        action="store_true",
        help="fail unless libllama comes from the system (the container image), not the wheel",
    )
    check.add_argument(
        "--llama-server", type=Path, help="llama-server to check (default: bundled, or on PATH)"
    )
    check.set_defaults(func=cmd_selfcheck)
    from semif_proxy.deploy.cli import add_commands

    add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except UsageError as exc:
        sys.stderr.write(f"{exc}\n")
        return 2


__all__ = ["build_parser", "main"]
