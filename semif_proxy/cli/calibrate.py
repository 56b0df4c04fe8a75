"""`semif-proxy calibrate`: temperatures from labelled rows, a position prior from the rows log."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

log = logging.getLogger("semif_proxy")


def cmd_calibrate(args: argparse.Namespace) -> int:
    from semif_proxy.api import rows_log
    from semif_proxy.calibration import position_prior
    from semif_proxy.calibration.temperature import PredictionError, calibrate, read_predictions
    from semif_proxy.engine.prompt import LETTER_LABELS, NUMBER_LABELS

    # The position prior is the labels' preference: rows of the other readouts don't carry it.
    label_versions = frozenset({LETTER_LABELS.prompt_version, NUMBER_LABELS.prompt_version})

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
                fitted = position_prior.fit(rows, args.min_questions, label_versions)
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
