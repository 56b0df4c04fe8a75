"""The throw-away child that times one layout of the weights for SEMIF_REPACK=auto
(engine/layout.py starts it, once per layout): load the model as the engine would, prefill a
fixed prompt and generate a few tokens greedily, and print one JSON line with the rates and the
anonymous memory the load took. A layout whose kernels kill the process (an illegal instruction
on a CPU the build did not expect) kills only this child.

    python -m semif_proxy.engine.layout_probe --model M --threads N --repack on|off
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from semif_proxy.settings.defaults import (
    LAYOUT_PROBE_CTX,
    LAYOUT_PROBE_GENERATE_TOKENS,
    LAYOUT_PROBE_PREFILL_TOKENS,
    LAYOUT_PROBE_REPEATS,
    LAYOUT_PROBE_WARMUP_TOKENS,
)

# Ordinary prose, so that generation runs on past a few tokens; repeated to the length asked.
_TEXT = (
    "The support team sorts incoming tickets by product, urgency and the customer's plan. "
    "A refund request from an enterprise customer goes to billing within the hour, while a "
    "question about the API's rate limits goes to the developer relations queue. "
)


def anon_bytes() -> int | None:
    """This process's anonymous resident memory (RssAnon): a repacked copy of the weights is
    allocated there, while the unrepacked weights stay in the mmap'ed file's pages."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def measure(model: str, threads: int, repack: bool, backend_dir: str | None) -> dict:
    from semif_proxy.engine import native

    if backend_dir:
        native.load_backends(backend_dir)
    before = anon_bytes()
    start = time.perf_counter()
    core = native.Engine(
        model, n_ctx=LAYOUT_PROBE_CTX, n_threads=threads, n_gpu_layers=0, n_seq=3, repack=repack
    )
    load_s = time.perf_counter() - start
    after = anon_bytes()
    tokens: list[int] = [core.bos] if core.add_bos else []
    piece = core.tokenize(_TEXT)
    while len(tokens) < LAYOUT_PROBE_PREFILL_TOKENS:
        tokens.extend(piece)
    tokens = tokens[:LAYOUT_PROBE_PREFILL_TOKENS]
    # The first compute allocates its buffers: not timed.
    core.generate(tokens[:LAYOUT_PROBE_WARMUP_TOKENS], 1)
    prefill: list[float] = []
    generate: list[float] = []
    generated = 0
    for _ in range(LAYOUT_PROBE_REPEATS):
        core.reset()  # no prefix held: every repeat prefills the whole prompt
        out, _stop, stats = core.generate(tokens, LAYOUT_PROBE_GENERATE_TOKENS)
        prefill.append(len(tokens) / max(stats["prefill_seconds"], 1e-9))
        # The budget's last token is read from the last row, never decoded: n - 1 decodes.
        decoded = max(0, len(out) - 1)
        if decoded:
            generate.append(decoded / max(stats["suffix_seconds"], 1e-9))
        generated = len(out)
    return {
        "repack": repack,
        "load_seconds": round(load_s, 3),
        "prefill_tokens": len(tokens),
        "prefill_tokens_per_s": max(prefill),
        "generated_tokens": generated,
        "generate_tokens_per_s": max(generate) if generate else None,
        "anon_bytes": (after - before) if before is not None and after is not None else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m semif_proxy.engine.layout_probe",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--model", required=True, help="the GGUF to load")
    parser.add_argument("--threads", type=int, default=1, help="compute threads")
    parser.add_argument("--repack", choices=("on", "off"), required=True, help="the layout")
    parser.add_argument("--backend-dir", default=None, help="ggml backends to load first")
    args = parser.parse_args(argv)
    result = measure(args.model, args.threads, args.repack == "on", args.backend_dir)
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
