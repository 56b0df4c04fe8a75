"""stdlib logging, configured once: one JSON object per line."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from semif_proxy import redact

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                data[key] = value
        if isinstance(data.get("argv"), (list, tuple)):
            # A command line (llama-server's): key/token/secret/password flags lose their values.
            data["argv"] = redact.redact_argv([str(a) for a in data["argv"]])
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        # Every value registered as secret (redact.register, at start-up), wherever it appears.
        return redact.redact_text(json.dumps(data, default=str, ensure_ascii=False))


def configure_logging(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # llama.cpp's load chatter is INFO; keep it out of normal logs unless asked for.
    logging.getLogger("semif_proxy.llama").setLevel(
        logging.DEBUG if level == "DEBUG" else logging.WARNING
    )
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
