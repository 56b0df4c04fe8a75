"""docs/img/paths.png: the two paths through semif-proxy, drawn with matplotlib.

    python scripts/gen_diagram.py            # rewrite docs/img/paths.png
    python scripts/gen_diagram.py --out DIR  # write DIR/docs/img/paths.png (the tests compare)

Needs matplotlib (`pip install 'semif-proxy[bench]'`); the same version draws the same bytes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGE = Path("docs/img/paths.png")

# (x, y, width, height, title, lines below it)
BOXES = {
    "client": (0.1, 1.55, 1.6, 1.1, "client", ["curl, requests,", "typesafe-sdk, boto3"]),
    "proxy": (
        2.2,
        1.2,
        2.0,
        1.8,
        "semif-proxy",
        [":8080, one port", "auth, limits, routes", "/ping /health /metrics"],
    ),
    "server": (
        6.3,
        2.45,
        2.3,
        1.1,
        "llama-server",
        ["127.0.0.1, supervised child", "generates text"],
    ),
    "engine": (
        6.3,
        0.25,
        2.3,
        1.1,
        "decision engine",
        ["one thread in the proxy", "prompt, checks, scoring"],
    ),
    "libllama": (9.1, 0.25, 1.8, 1.1, "libllama", ["llama_decode:", "the options' logits"]),
    "gguf": (9.1, 2.45, 1.8, 1.1, "model.gguf", ["one file, loaded", "by both"]),
}
# (from, to, label, colour, label offset from the arrow's middle)
ARROWS = [
    ("client", "proxy", "", "#333333", 0.0),
    ("proxy", "server", "chat:\n/v1/chat/completions", "#1f77b4", 0.42),
    ("proxy", "engine", "decisions: /v1/decisions,\n/v1/systemone, /invocations", "#d62728", -0.62),
    ("engine", "libllama", "", "#d62728", 0.0),
    ("server", "gguf", "", "#888888", 0.0),
    ("libllama", "gguf", "", "#888888", 0.0),
]


def _edge(box: tuple, towards: tuple[float, float]) -> tuple[float, float]:
    """The point where the line from the box's centre towards a point leaves the box."""
    x, y, w, h = box[:4]
    cx, cy = x + w / 2, y + h / 2
    dx, dy = towards[0] - cx, towards[1] - cy
    scale = min(
        (w / 2) / abs(dx) if dx else float("inf"),
        (h / 2) / abs(dy) if dy else float("inf"),
    )
    return cx + dx * scale, cy + dy * scale


def draw(path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    fig, ax = plt.subplots(figsize=(8.4, 2.9))
    ax.set_xlim(0, 11)
    ax.set_ylim(0, 3.8)
    ax.axis("off")
    fills = {"proxy": "#f2f2f2", "server": "#e8f1fa", "engine": "#fbeaea", "libllama": "#fbeaea"}
    for name, (x, y, w, h, title, lines) in BOXES.items():
        ax.add_patch(
            FancyBboxPatch(
                (x, y),
                w,
                h,
                boxstyle="round,pad=0.02,rounding_size=0.08",
                facecolor=fills.get(name, "white"),
                edgecolor="#444444",
                linewidth=1.0,
            )
        )
        ax.text(x + w / 2, y + h - 0.25, title, ha="center", va="center", fontsize=9, weight="bold")
        for i, line in enumerate(lines):
            ax.text(x + w / 2, y + h - 0.55 - 0.24 * i, line, ha="center", va="center", fontsize=7)
    for src, dst, label, colour, offset in ARROWS:
        a, b = BOXES[src], BOXES[dst]
        ca = (a[0] + a[2] / 2, a[1] + a[3] / 2)
        cb = (b[0] + b[2] / 2, b[1] + b[3] / 2)
        start, end = _edge(a, cb), _edge(b, ca)
        ax.add_patch(
            FancyArrowPatch(
                start,
                end,
                arrowstyle="-|>",
                mutation_scale=12,
                color=colour,
                linewidth=1.4,
                shrinkA=2,
                shrinkB=2,
            )
        )
        if label:
            mx, my = (start[0] + end[0]) / 2, (start[1] + end[1]) / 2
            ax.text(
                mx,
                my + offset,
                label,
                ha="center",
                va="center",
                fontsize=7,
                color=colour,
            )
    fig.tight_layout(pad=0.2)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT, help="root to write into (the repo)")
    args = parser.parse_args(argv)
    try:
        draw(args.out / IMAGE)
    except ImportError:
        print("gen_diagram: needs matplotlib: pip install 'semif-proxy[bench]'", file=sys.stderr)
        return 2
    print(f"wrote {args.out / IMAGE}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
