"""`python -m semif_proxy.cli`."""

from semif_proxy.cli import main

raise SystemExit(main())
