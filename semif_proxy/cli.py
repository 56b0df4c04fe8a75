"""Command line: `semif-proxy serve` (the container entrypoint), `decide`, `calibrate`, `eval`,
`selfcheck` and the SageMaker deploy commands."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from pathlib import Path

from semif_proxy.calibration.position_prior import MIN_QUESTIONS
from semif_proxy.logs import configure_logging
from semif_proxy.settings import Settings, SettingsError, load_settings

log = logging.getLogger("semif_proxy")


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


def cmd_decide(args: argparse.Namespace) -> int:
    from semif_proxy.api import services
    from semif_proxy.engine.worker import DecisionEngine
    from semif_proxy.errors import ApiError

    settings = _settings(args, chat=False)
    configure_logging("WARNING")
    body = json.loads(Path(args.request).read_text())
    engine = DecisionEngine.load(settings)
    # The command line is bound by the API's own limits only, not the server's.
    service = services.Decisions(limited=False)
    try:
        out = service.answer(engine, service.plan(body, settings, engine.sha256)).body
    except ApiError as exc:
        json.dump(exc.body(), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 1
    finally:
        engine.close()
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


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
    valid row)."""
    from semif_proxy.eval import report as eval_report
    from semif_proxy.eval.runner import evaluate, exit_status, summary
    from semif_proxy.eval.targets import TargetError, open_target

    configure_logging("WARNING")
    rows_file = Path(args.rows)
    if not rows_file.is_file():
        sys.stderr.write(f"semif-proxy eval: {rows_file}: no such file\n")
        return 2
    if len(set(args.target)) != len(args.target):
        sys.stderr.write("semif-proxy eval: a target is named twice\n")
        return 2
    targets = []
    try:
        for spec in args.target:
            targets.append(open_target(spec, args.api_key, args.region, args.timeout))
        results = evaluate(rows_file, targets, args.limit)
    except (TargetError, OSError, UnicodeDecodeError) as exc:
        sys.stderr.write(f"semif-proxy eval: {exc}\n")
        return 2
    finally:
        for target in targets:
            target.close()
    for line in summary(results):
        sys.stderr.write(line + "\n")
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    sys.stderr.write(f"wrote {args.out}\n")
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="semif-proxy", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the proxy (chat + decisions)")
    serve.add_argument("--model", help="GGUF file (default: SM_LLAMA_CPP_MODEL / model dir)")
    serve.add_argument("--port", type=int, help="public port (default: SM_LLAMA_CPP_PORT or 8080)")
    serve.add_argument("--host", help="bind address (default: SEMIF_HOST or 127.0.0.1)")
    serve.set_defaults(func=cmd_serve)
    decide = sub.add_parser("decide", help="answer a decision request from a JSON file")
    decide.add_argument("request", help="request JSON ({'decision': ...} or {'decisions': [...]})")
    decide.add_argument("--model", help="GGUF file")
    decide.set_defaults(func=cmd_decide)
    cal = sub.add_parser(
        "calibrate", help="fit a softmax temperature per question type and a position prior"
    )
    cal.add_argument(
        "--predictions",
        help="JSONL: {type, option_logits, label} (or expected + option_ids) per line",
    )
    cal.add_argument(
        "--rows",
        help="JSONL the server writes (SEMIF_ROWS_LOG): questions asked in rotated orders, "
        "unlabelled; fits the position prior",
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
        "keep answers right this often (0-1; SEMIF_MIN_CONFIDENCE reads the file)",
    )
    cal.add_argument("--output", default="temperature.json", help="file SEMIF_CALIBRATION reads")
    cal.set_defaults(func=cmd_calibrate)
    ev = sub.add_parser("eval", help="score targets on labelled rows (JevBench or decisions)")
    ev.add_argument("rows", help="JSONL: JevBench rows or {'decision': ..., 'expected': id}")
    ev.add_argument(
        "--target",
        action="append",
        required=True,
        help="model.gguf (in-process), http://host:port (a server), sagemaker:<endpoint>; "
        "repeat to compare",
    )
    ev.add_argument("--out", default="eval-results.json", help="results JSON")
    ev.add_argument("--html", help="also write an HTML report here")
    ev.add_argument(
        "--api-key",
        default=os.environ.get("SEMIF_API_KEY"),
        help="Bearer key for URL targets (default: SEMIF_API_KEY)",
    )
    ev.add_argument("--region", help="AWS region of sagemaker: targets (default: boto3's)")
    ev.add_argument("--timeout", type=float, default=120.0, help="seconds per URL request")
    ev.add_argument("--limit", type=int, help="read only the first N rows")
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
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
