"""A llama-server that starts only when the test says so: a wrapper script the proxy runs as
its llama-server (SEMIF_LLAMA_SERVER). While the gate file exists, each start waits for the
release file before exec'ing the real binary; so "llama-server is (re)starting" is a state a
test holds for as long as it needs, instead of a window it has to hit in time."""

from __future__ import annotations

from pathlib import Path

from semif_proxy.engine import native


class LlamaGate:
    def __init__(self, folder: Path, closed: bool = False) -> None:
        real = native.llama_server_path()
        assert real is not None
        self.gate = folder / "llama-gate"
        self.release = folder / "llama-release"
        self.binary = folder / "gated-llama-server"
        # Only a start that serves waits: `--help` and `--version` (read at start-up to map
        # SM_LLAMA_CPP_* settings and to check the build) go straight through.
        self.binary.write_text(
            "#!/bin/sh\n"
            'case " $* " in *" --help "*|*" --version "*) exec "' + str(real) + '" "$@";; esac\n'
            f'if [ -e "{self.gate}" ]; then\n'
            f'  while [ ! -e "{self.release}" ]; do sleep 0.05; done\n'
            "fi\n"
            f'exec "{real}" "$@"\n'
        )
        self.binary.chmod(0o755)
        if closed:
            self.close()

    def close(self) -> None:
        """Starts from now on wait (the one running is not touched)."""
        self.release.unlink(missing_ok=True)
        self.gate.touch()

    def open(self) -> None:
        """Waiting starts go ahead, and later ones start at once."""
        self.release.touch()

    @property
    def env(self) -> dict[str, str]:
        return {"SEMIF_LLAMA_SERVER": str(self.binary)}
