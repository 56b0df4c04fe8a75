"""`semif-proxy eval`: targets scored on labelled rows."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from semif_proxy.cli.parser import usage_error
from semif_proxy.logs import configure_logging

log = logging.getLogger("semif_proxy")


def cmd_eval(args: argparse.Namespace) -> int:
    """Exit 0: every row asked of every target and answered; 1: results written, but some rows
    were bad or some answers failed; 2: nothing to run (no rows file, a target unusable, no
    valid row); 130: interrupted (the answers so far stay in the rows file: --resume)."""
    from semif_proxy.eval import report as eval_report
    from semif_proxy.eval.open_target import open_target
    from semif_proxy.eval.runner import evaluate, exit_status, rows_log_path, summary
    from semif_proxy.eval.targets import TargetError

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
