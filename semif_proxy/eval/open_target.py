"""An eval target from its command-line spelling (`semif-proxy eval --target`): a
`sagemaker:<endpoint>`, an http:// or https:// URL, or else a GGUF file."""

from __future__ import annotations

from pathlib import Path

from semif_proxy.eval.local_target import LocalTarget
from semif_proxy.eval.sagemaker_target import SageMakerTarget
from semif_proxy.eval.targets import Target, TargetError
from semif_proxy.eval.url_target import UrlTarget

SAGEMAKER_PREFIX = "sagemaker:"


def open_target(
    spec: str, api_key: str | None = None, region: str | None = None, timeout: float = 120.0
) -> Target:
    """A target from its command-line spelling; the spelling is its name in the results."""
    if spec.startswith(SAGEMAKER_PREFIX):
        endpoint = spec[len(SAGEMAKER_PREFIX) :]
        if not endpoint:
            raise TargetError(f"{spec}: name the endpoint (sagemaker:<endpoint name>)")
        return SageMakerTarget.connect(spec, endpoint, region)
    if spec.startswith(("http://", "https://")):
        return UrlTarget(spec, spec, api_key, timeout)
    return LocalTarget.load(spec, Path(spec))
