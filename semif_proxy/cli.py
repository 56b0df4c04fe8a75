"""Command line: `semif-proxy serve` (the container entrypoint), `decide`, `calibrate`, `eval`,
`selfcheck` and the SageMaker deploy commands.

Conventions (docs/cli.md): a usage mistake is one line on stderr and exit 2; every flag's help
says its default; progress goes to stderr, results to stdout or the files named."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import textwrap
from pathlib import Path
from typing import Any, NoReturn

from semif_proxy import __version__
from semif_proxy import settings as settings_table
from semif_proxy.calibration.position_prior import MIN_QUESTIONS
from semif_proxy.logs import configure_logging
from semif_proxy.settings import Settings, SettingsError, load_settings

log = logging.getLogger("semif_proxy")


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
    """`serve --help`'s list of the settings that configure it, from settings.py's own table
    of environment variables and the Settings defaults."""

    def row(var: str, default: str, note: str = "") -> str:
        return f"  {var:<34} {default:<14} {note}".rstrip()

    fields = Settings.model_fields
    rows = [
        row("SM_LLAMA_CPP_MODEL", "unset", "the GGUF (absolute, or in the model dir)"),
        row("SM_LLAMA_CPP_MODEL_DIR", "/opt/ml/model", "its first *.gguf when none is named"),
    ]
    for field, (var, fallbacks) in settings_table._ENV.items():
        default = _shown_default(fields[field].default) if field in fields else "-"
        rows.append(row(var, default, f"or {', '.join(fallbacks)}" if fallbacks else ""))
    rows += [
        row(f"{settings_table.PREFIX}<FLAG>", "-", "a llama-server flag (--<flag>), passed on"),
        row("SAGEMAKER_SAFE_PORT_RANGE", "unset", "where llama-server's loopback ports go"),
    ]
    return "\n".join(
        [
            "settings (environment variables, read once at start-up; --model, --port and --host",
            "win over theirs; docs/configuration.md says what each one does):",
            *rows,
        ]
    )


def _settings(args: argparse.Namespace, **extra: object) -> Settings:
    try:
        return load_settings(model=args.model, **extra)
    except SettingsError as exc:
        sys.stderr.write(f"semif-proxy: configuration error: {exc}\n")
        raise SystemExit(2) from None


def _log_listening(settings: Settings) -> None:
    """The start-up line, once the port is bound: where it listens, whether a key guards it and
    whether /invocations is open. Never the key itself."""
    keyed = bool(settings.api_key)
    public = not keyed or settings.invocations_public
    if not keyed:
        guard = "no API key: every route is open"
    elif settings.invocations_public:
        guard = "API key set; /invocations is public (SEMIF_INVOCATIONS_PUBLIC: SageMaker's edge)"
    else:
        guard = "API key set; /invocations needs it too"
    log.info(
        f"listening on http://{settings.host}:{settings.port}; {guard}",
        extra={
            "event": "listening",
            "host": settings.host,
            "port": settings.port,
            "api_key_set": keyed,
            "invocations_public": public,
        },
    )


def cmd_serve(args: argparse.Namespace) -> int:
    from aiohttp import web

    from semif_proxy.http.app import create_app
    from semif_proxy.http.keys import STARTUP

    # Configured before the settings are read, so that their own warnings (an ignored
    # SM_LLAMA_CPP_HOST) are JSON lines too; again once the level is known.
    configure_logging()
    settings = _settings(args, port=args.port, host=args.host)
    configure_logging(settings.log_level)
    log.info("settings", extra={"event": "settings", "settings": settings.public_dict()})
    from semif_proxy.model import gpu_memory

    # On a GPU: both processes' weights and KV caches must fit, or the start stops here with
    # the advice (exit 2) instead of an out-of-memory crash minutes later.
    gpu_memory.startup_check(settings)
    from semif_proxy import selfcheck

    try:
        report = selfcheck.run(llama_server=settings.llama_server_binary)
        log.info("selfcheck", extra={"event": "selfcheck", **report})
    except selfcheck.SelfCheckError as exc:
        log.warning("selfcheck failed", extra={"event": "selfcheck", "error": str(exc)})
    # A background load that fails stops the process (SageMaker then sees the container exit).
    app = create_app(settings, on_fatal=lambda: os.kill(os.getpid(), signal.SIGTERM))
    web.run_app(
        app,
        host=settings.host,
        port=settings.port,
        shutdown_timeout=settings.shutdown_grace,
        print=lambda _banner: _log_listening(settings),  # called once the port is bound
        access_log=None,
        handle_signals=True,
        # A client that hangs up cancels its handler: its queued or running engine job stops
        # and its upstream chat call is closed (llama-server then stops generating).
        handler_cancellation=True,
    )
    errors = app[STARTUP].errors
    for message in errors:
        sys.stderr.write(f"semif-proxy: {message}\n")
    return 3 if errors else 0


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


def cmd_calibrate(args: argparse.Namespace) -> int:
    from semif_proxy.api import rows_log
    from semif_proxy.calibration import position_prior
    from semif_proxy.calibration.temperature import PredictionError, calibrate, read_predictions

    if not args.predictions and not args.rows:
        sys.stderr.write(
            "semif-proxy calibrate: give --predictions (temperatures), --rows (position prior) "
            "or both\n"
        )
        return 2
    target = args.target_accuracy
    if target is not None and not (args.predictions and 0.0 < target <= 1.0):
        sys.stderr.write(
            "semif-proxy calibrate: --target-accuracy needs --predictions (labelled rows) and "
            "a value in (0, 1]\n"
        )
        return 2
    fitted = None
    report: dict = {"temperature": {"default": 1.0}, "types": {}}
    try:
        if args.rows:
            rows = rows_log.read_rows(Path(args.rows))
            try:
                fitted = position_prior.fit(rows, args.min_questions)
            except position_prior.RowsError as exc:
                raise position_prior.RowsError(f"{args.rows}: {exc}") from None
        if args.predictions:
            prior = fitted.prior if fitted is not None else None
            preds = read_predictions(Path(args.predictions))
            report = calibrate(preds, prior)
    except (OSError, PredictionError, position_prior.RowsError) as exc:
        sys.stderr.write(f"semif-proxy calibrate: {exc}\n")
        return 2
    if fitted is not None:
        fit = fitted.report
        for key, t in fit["tables"].items():
            prior_text = ", ".join(f"{p:.3f}" for p in t["prior"])
            sys.stderr.write(
                f"prior {key:>10}: n={t['questions']:<5} [{prior_text}]  first-listed "
                f"{t['first_listed_before']:.0%} -> {t['first_listed_after']:.0%} "
                f"(position-blind {t['first_listed_if_position_blind']:.0%})\n"
            )
        if not fit["tables"]:
            sys.stderr.write(
                f"no prior fitted: {fit['balanced_rows']} of {fit['rows']} rows were asked in "
                f"every rotation, and no question type and option count had "
                f"{fit['min_questions']} of them (ask with permutations: n, or lower "
                "--min-questions)\n"
            )
            if not args.predictions:
                return 2
        report["position_prior"] = fitted.prior.as_json()
        report["position_prior_fit"] = fit
    for kind, r in report["types"].items():
        sys.stderr.write(
            f"{kind:>9}: n={r['count']:<5} T={r['temperature']:.3f}  "
            f"ECE {r['ece_before']:.4f} -> {r['ece_after']:.4f}  "
            f"NLL {r['nll_before']:.4f} -> {r['nll_after']:.4f}  accuracy {r['accuracy']:.3f}\n"
        )
    if target is not None:
        # Thresholds on the confidences the server will give: prior and temperature applied.
        from semif_proxy.calibration import abstention
        from semif_proxy.calibration.temperature import debiased

        served = preds if fitted is None else debiased(preds, fitted.prior)
        suggestion = abstention.suggest_thresholds(served, target, report["temperature"])
        report["min_confidence"] = suggestion.pop("min_confidence")
        report["abstention"] = suggestion
        for line in abstention.table(suggestion):
            sys.stderr.write(line + "\n")
    Path(args.output).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    sys.stderr.write(f"wrote {args.output}; serve with SEMIF_CALIBRATION={args.output}\n")
    if target is not None:
        sys.stderr.write(f"  and SEMIF_MIN_CONFIDENCE={args.output} (abstention thresholds)\n")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    """Exit 0: every row asked of every target and answered; 1: results written, but some rows
    were bad or some answers failed; 2: nothing to run (no rows file, a target unusable, no
    valid row); 130: interrupted (the answers so far stay in the rows file: --resume)."""
    from semif_proxy.eval import report as eval_report
    from semif_proxy.eval.runner import evaluate, exit_status, rows_log_path, summary
    from semif_proxy.eval.targets import TargetError, open_target

    configure_logging("WARNING")
    rows_file = Path(args.rows)
    if not rows_file.is_file():
        usage_error("eval", f"{rows_file}: no such file")
    if len(set(args.target)) != len(args.target):
        usage_error("eval", "a target is named twice")
    out = Path(args.out)
    rows_log = rows_log_path(out)
    if args.resume and not rows_log.is_file():
        sys.stderr.write(f"semif-proxy eval: nothing to resume in {rows_log}; asking every row\n")
    api_key = args.api_key or os.environ.get("SEMIF_API_KEY")
    targets = []
    try:
        for spec in args.target:
            targets.append(open_target(spec, api_key, args.region, args.timeout))
        results = evaluate(
            rows_file,
            targets,
            args.limit,
            concurrency=args.concurrency,
            rows_log=rows_log,
            resume=args.resume,
        )
    except (TargetError, OSError, UnicodeDecodeError) as exc:
        usage_error("eval", str(exc))
    except KeyboardInterrupt:
        sys.stderr.write(
            f"semif-proxy eval: interrupted; the answers so far are in {rows_log} "
            "(run the same command with --resume to ask only the rest)\n"
        )
        return 130
    finally:
        for target in targets:
            target.close()
    for line in summary(results):
        sys.stderr.write(line + "\n")
    out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    sys.stderr.write(f"wrote {out} (and each answer as it came to {rows_log})\n")
    if args.html:
        Path(args.html).write_text(eval_report.render(results), encoding="utf-8")
        sys.stderr.write(f"wrote {args.html}\n")
    return exit_status(results)


def cmd_selfcheck(args: argparse.Namespace) -> int:
    from semif_proxy import selfcheck

    try:
        report = selfcheck.run(
            require_system_libllama=args.require_system_libllama, llama_server=args.llama_server
        )
    except selfcheck.SelfCheckError as exc:
        sys.stderr.write(f"semif-proxy selfcheck: FAILED: {exc}\n")
        return 1
    sys.stdout.write(json.dumps({"selfcheck": "ok", **report}) + "\n")
    return 0


def _paragraph(text: str) -> str:
    return textwrap.fill(text, 88)


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


if __name__ == "__main__":
    raise SystemExit(main())
