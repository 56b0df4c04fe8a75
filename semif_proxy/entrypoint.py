"""The container's entrypoint, called with the arguments the platform gives the image.

SageMaker runs `docker run <image> serve`; other hosts often pass nothing. Both serve, with every
setting taken from the environment. Any other word (SageMaker's `train`, a typo) is refused
with one line on stderr and exit code 2, so a wrong use fails at once and says why.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args != ["serve"]:
        sys.stderr.write(
            f"semif-proxy: this image only serves (run it with 'serve' or with no arguments); "
            f"got {' '.join(args)!r}\n"
        )
        return 2
    from semif_proxy.cli import main as cli_main

    return cli_main(["serve"])


if __name__ == "__main__":
    raise SystemExit(main())
