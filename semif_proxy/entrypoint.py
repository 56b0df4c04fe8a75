"""The container's entrypoint, called with the arguments the platform gives the image.

SageMaker runs `docker run <image> serve`; other hosts often pass nothing. Both serve, with every
setting taken from the environment. Any other word (SageMaker's `train`, a typo) is refused
with one line on stderr and exit code 2, so a wrong use fails at once and says why.

Two defaults differ from `semif-proxy serve`'s, each only where the variable is unset (a value
set explicitly wins):
- SEMIF_HOST=0.0.0.0 either way: the platform (or `docker run -p`) connects from outside the
  container, where the loopback default would never be reached.
- SEMIF_INVOCATIONS_PUBLIC=true with `serve` only: that is SageMaker's argv, and SageMaker
  authenticates /invocations at its edge and sends no key of ours. With no arguments (`docker
  run -p` on some host) /invocations needs SEMIF_API_KEY, when one is set, like every compute
  route.
"""

from __future__ import annotations

import os
import sys

# The platform's defaults, set where the variable is unset, before the CLI reads its settings.
IMAGE_DEFAULTS = {"SEMIF_HOST": "0.0.0.0"}
SAGEMAKER_DEFAULTS = {"SEMIF_INVOCATIONS_PUBLIC": "true"}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args != ["serve"]:
        sys.stderr.write(
            f"semif-proxy: this image only serves (run it with 'serve' or with no arguments); "
            f"got {' '.join(args)!r}\n"
        )
        return 2
    defaults = {**IMAGE_DEFAULTS, **(SAGEMAKER_DEFAULTS if args == ["serve"] else {})}
    for name, value in defaults.items():
        # Set but blank counts as unset (settings/env.py reads a blank variable as unset too).
        if not os.environ.get(name, "").strip():
            os.environ[name] = value
    from semif_proxy.cli import main as cli_main

    return cli_main(["serve"])


if __name__ == "__main__":
    raise SystemExit(main())
