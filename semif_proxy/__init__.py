"""semif-proxy: chat through llama-server and typed decisions from a GGUF model's logits.

The package's rooms and the one import rule they keep (tests/test_import_rule.py reads every
import, those inside functions and under TYPE_CHECKING too, and fails on a forbidden arrow):

- ground: `errors`, `logs`, `redact`, `readout`, `jsonl_files`, `progress` import no other
  module of the package but each other.
- `engine/` (the worker on libllama, its thread, prompt, labels, prefix cache) never imports
  `http/`, `api/`, `eval/`, `deploy/`, the commands (`cli`, `entrypoint`), aiohttp or pydantic.
- `api/` (the decisions and System One services, their schemas, the service registry) never
  imports `http/`, `eval/`, `deploy/`, the commands or aiohttp.
- `cpu/`, `calibration/`, `model/`, `llama_server/` never import `http/`, `api/`, `eval/`,
  `deploy/` or the commands.
- `eval/` and `deploy/` never import `http/`; nothing in the package imports `testing/`.

`settings` (every setting and default, validated once) sits above the lower rooms and below
`engine/`, `api/` and `http/`; `cli` and `entrypoint` are the commands on top.
"""

__version__ = "0.1.0"
