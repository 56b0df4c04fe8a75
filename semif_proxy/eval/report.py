"""The HTML page of a `semif-proxy eval` run: one self-contained file (styles inline, plots as
base64 PNGs). The plots need matplotlib (the `bench` extra); without it the page has the same
tables, the reliability table included, and says how to get the plots."""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from typing import Any

from semif_proxy.eval.runner import OTHER

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { background: #f2f2f2; }
td.hit { background: #e3f2e3; }
.note { color: #666; }
"""


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return html.escape(str(value))


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def reliability_png(targets: Sequence[dict[str, Any]]) -> bytes | None:
    """One reliability diagram, every target's points over the same diagonal; None without
    matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(5.5, 5))
    ax.plot([0, 1], [0, 1], "--", color="grey", label="perfect calibration")
    for t in targets:
        points = [b for b in t["metrics"]["reliability"] if b["rows"]]
        ax.plot(
            [b["confidence"] for b in points],
            [b["accuracy"] for b in points],
            "o-",
            label=f"{t['name']} (ECE {t['metrics']['ece']:.3f})",
        )
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("confidence (probability of the argmax label)")
    ax.set_ylabel("accuracy")
    ax.set_title("Reliability (10 bins)")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=110)
    plt.close(fig)
    return out.getvalue()


def _summary(targets: Sequence[dict[str, Any]]) -> str:
    rows = []
    for t in targets:
        m = t["metrics"]
        lat = m["latency_seconds"]
        rows.append(
            [
                t["name"],
                t["kind"],
                f"{m['answered']}/{m['rows']}",
                m["accuracy"],
                m["balanced_accuracy"],
                m["ece"],
                _ms(lat["p50"]),
                _ms(lat["p95"]),
                _ms(lat["max"]),
                m["input_tokens"]["total"],
            ]
        )
    headers = [
        "target",
        "kind",
        "answered",
        "accuracy",
        "balanced accuracy",
        "ECE",
        "p50",
        "p95",
        "max",
        "input tokens",
    ]
    return table(headers, rows)


def _bin_name(lo: float, hi: float) -> str:
    return f"[{lo:.1f}, {hi:.1f}{']' if hi >= 1 else ')'}"


def _target_section(t: dict[str, Any]) -> str:
    m = t["metrics"]
    bins = [
        [_bin_name(*b["bin"]), b["rows"], b["confidence"], b["accuracy"]] for b in m["reliability"]
    ]
    labels = m["confusion"]["labels"]
    matrix_rows = "".join(
        "<tr><th>"
        + html.escape(label)
        + "</th>"
        + "".join(
            f'<td class="{"hit" if i == j and n and label != OTHER else ""}">{n}</td>'
            for j, n in enumerate(m["confusion"]["matrix"][i])
        )
        + "</tr>"
        for i, label in enumerate(labels)
    )
    head = "".join(f"<th>{html.escape(label)}</th>" for label in labels)
    return (
        f"<h3>{html.escape(t['name'])}</h3>"
        "<p>Reliability: the rows in each confidence bin, their mean confidence and accuracy.</p>"
        + table(["bin", "rows", "confidence", "accuracy"], bins)
        + "<p>Confusion of the most frequent labels (rows: expected, columns: answered).</p>"
        f"<table><thead><tr><th>expected \\ answered</th>{head}</tr></thead>"
        f"<tbody>{matrix_rows}</tbody></table>"
    )


def _disagreements(results: dict[str, Any]) -> str:
    rows = results["disagreements"]
    if len(results["targets"]) < 2:
        return "<p class='note'>One target: nothing to compare.</p>"
    if not rows:
        return "<p>The targets gave the same argmax label on every row they answered.</p>"
    names = [t["name"] for t in results["targets"]]
    out = []
    for r in rows:
        cells = [r["id"], r["line"], r["expected"]]
        for n in names:
            a = r["answers"].get(n)
            cells.append("-" if a is None else f"{a['predicted']} ({a['probability']:.3f})")
        out.append(cells)
    return table(["row", "line", "expected", *names], out)


def _errors(results: dict[str, Any]) -> str:
    rows = [[b["id"] or "", b["line"], "(row)", b["error"]] for b in results["bad_rows"]]
    for r in results["results"]:
        for name, a in r["answers"].items():
            if "error" in a:
                rows.append([r["id"], r["line"], name, a["error"]])
    if not rows:
        return "<p>None.</p>"
    return table(["row", "line", "target", "error"], rows)


def render(results: dict[str, Any]) -> str:
    targets = results["targets"]
    png = reliability_png(targets)
    if png is None:
        plot = (
            "<p class='note'>No plot: matplotlib is not installed "
            "(pip install 'semif-proxy[bench]'); the tables below hold the same points.</p>"
        )
    else:
        data = base64.b64encode(png).decode("ascii")
        plot = f'<img alt="reliability diagram" src="data:image/png;base64,{data}">'
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>semif-proxy eval: {html.escape(results['rows_file'])}</title>"
        f"<style>{STYLE}</style></head><body>"
        f"<h1>semif-proxy eval</h1><p>{results['rows']} rows from "
        f"<code>{html.escape(results['rows_file'])}</code>, "
        f"{len(results['bad_rows'])} bad rows skipped.</p>"
        "<h2>Targets</h2>"
        + _summary(targets)
        + "<h2>Reliability</h2>"
        + plot
        + "".join(_target_section(t) for t in targets)
        + f"<h2>Disagreements ({len(results['disagreements'])})</h2>"
        + _disagreements(results)
        + "<h2>Bad rows and errors</h2>"
        + _errors(results)
        + "</body></html>\n"
    )
