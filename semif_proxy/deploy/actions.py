"""What each deploy subcommand does with its parsed flags: turn them into the step's inputs,
refuse what is wrong before any AWS call (UsageError), make the boto3 clients, run the step and
return the lines to print. The flags themselves and the exit codes are cli.py's."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from semif_proxy.deploy.errors import DeployError, UsageError


def _client(service: str, region: str | None) -> Any:
    try:
        import boto3
    except ImportError:
        raise DeployError("boto3 is missing: pip install 'semif-proxy[aws]'") from None
    return boto3.client(service, region_name=region)


def _role(given: str | None, env: str) -> str:
    role = given or os.environ.get(env)
    if not role:
        raise UsageError(f"give --role or set {env} (an IAM role ARN)")
    return role


def _env_pairs(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--env takes KEY=VALUE, got {pair!r}")
        out[key] = value
    return out


def package_model(args: argparse.Namespace) -> str:
    from semif_proxy.deploy.package import package_model as run

    with tempfile.TemporaryDirectory() as work:
        return run(
            _client("s3", args.region),
            Path(args.gguf),
            args.s3,
            Path(work),
            uncompressed=args.uncompressed,
        )


def build_image(args: argparse.Namespace) -> str:
    from semif_proxy.deploy.image import ImageBuild
    from semif_proxy.deploy.image import build_image as run

    build = ImageBuild(
        project=args.project,
        source=args.source,
        repository=args.repository,
        tag=args.tag,
        variant="gpu" if args.gpu else "cpu",
        base_image=args.base_image,
        role_arn=_role(args.role, "SEMIF_CODEBUILD_ROLE"),
        llama_cpp_ref=args.llama_cpp_ref,
    )
    with tempfile.TemporaryDirectory() as work:
        return run(
            _client("s3", args.region),
            _client("codebuild", args.region),
            _client("ecr", args.region),
            build,
            Path(args.root),
            Path(work),
        )


def _scaling(args: argparse.Namespace) -> Any:
    """A Scaling when any autoscaling flag is given, else None (refusing stray cooldowns)."""
    from semif_proxy.deploy.scaling import Scaling

    given = (args.min_instances, args.max_instances, args.target_invocations, args.target_backlog)
    if all(v is None for v in given):
        if args.scale_in_cooldown is not None or args.scale_out_cooldown is not None:
            raise UsageError("--scale-in-cooldown/--scale-out-cooldown need --max-instances")
        return None
    if args.max_instances is None:
        raise UsageError("autoscaling needs --max-instances")
    cooldowns = {
        name: value
        for name, value in (
            ("scale_in_cooldown", args.scale_in_cooldown),
            ("scale_out_cooldown", args.scale_out_cooldown),
        )
        if value is not None
    }
    return Scaling(
        min_instances=1 if args.min_instances is None else args.min_instances,
        max_instances=args.max_instances,
        target_invocations=args.target_invocations,
        target_backlog=args.target_backlog,
        **cooldowns,
    )


def _async_output(args: argparse.Namespace) -> Any:
    from semif_proxy.deploy.async_config import AsyncOutput

    if not args.asynchronous:
        for flag, value in (
            ("--output", args.output),
            ("--failure-output", args.failure_output),
            ("--max-concurrent-invocations", args.max_concurrent_invocations),
        ):
            if value is not None:
                raise UsageError(f"{flag} is for asynchronous endpoints: add --async")
        return None
    if args.output is None:
        raise UsageError("--async needs --output s3://bucket/prefix/ for the results")
    return AsyncOutput(args.output, args.failure_output, args.max_concurrent_invocations)


def deploy(args: argparse.Namespace) -> str:
    from semif_proxy.deploy.deployment import Deployment, check
    from semif_proxy.deploy.endpoint import deploy as run

    d = Deployment(
        name=args.name,
        image=args.image,
        model_data=args.model_data,
        role_arn=_role(args.role, "SEMIF_SAGEMAKER_ROLE"),
        instance_type=args.instance_type,
        gpu_layers=args.gpu_layers,
        env=_env_pairs(args.env),
        gpu=args.gpu,
        inference_ami=args.inference_ami,
        async_output=_async_output(args),
        scaling=_scaling(args),
    )
    try:
        check(d)  # before any client exists
    except DeployError as exc:  # what is refused without asking AWS is a usage error
        raise UsageError(str(exc)) from None
    # Autoscaling clients always: on an existing endpoint the old settings are removed first.
    desc = run(
        _client("sagemaker", args.region),
        d,
        autoscaling=_client("application-autoscaling", args.region),
        cloudwatch=_client("cloudwatch", args.region),
    )
    lines = [
        f"{desc['EndpointName']} {desc['EndpointStatus']}",
        f"endpoint config {desc['EndpointConfigName']}, model {desc['ModelName']}",
    ]
    for key, label in (("Autoscaling", "autoscaling"), ("Removed", "removed"), ("Kept", "kept")):
        if desc.get(key):
            lines.append(f"{label}: " + ", ".join(desc[key]))
    return "\n".join(lines)


def _pretty(body: bytes) -> str:
    try:
        return json.dumps(json.loads(body), indent=2)
    except ValueError:
        return body.decode("utf-8", "replace")


def invoke(args: argparse.Namespace) -> str:
    body = _read_body(args.body)
    if args.asynchronous:
        from semif_proxy.deploy.async_invoke import invoke_async

        if not args.input_location:
            raise UsageError("--async needs --input-location s3://bucket/prefix/ for the body")
        output, result = invoke_async(
            _client("s3", args.region),
            _client("sagemaker-runtime", args.region),
            args.endpoint,
            body,
            args.input_location,
            timeout=args.timeout,
        )
        sys.stderr.write(f"result: {output}\n")
        return _pretty(result)
    if args.input_location is not None:
        raise UsageError("--input-location is for --async invocations")
    from semif_proxy.deploy.endpoint import invoke as run

    _, reply = run(_client("sagemaker-runtime", args.region), args.endpoint, body)
    return _pretty(reply)


def _read_body(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"--body: cannot read {path}: {exc.strerror}") from None


def batch(args: argparse.Namespace) -> str:
    from semif_proxy.deploy.batch import Transform, check, run, wait_job
    from semif_proxy.deploy.model import Model

    t = Transform(
        model_name=args.model_name,
        input=args.input,
        output=args.output,
        instance_type=args.instance_type,
        instance_count=args.instance_count,
        max_payload_mb=args.max_payload_mb,
        max_concurrent=args.max_concurrent_transforms,
        multi_record=args.multi_record,
    )
    try:
        check(t)  # before any client exists
    except DeployError as exc:  # what is refused without asking AWS is a usage error
        raise UsageError(str(exc)) from None
    create_with = None
    if args.image is not None or args.model_data is not None:
        pairs = (("--image", args.image), ("--model-data", args.model_data))
        missing = [flag for flag, value in pairs if not value]
        if missing:
            raise UsageError(f"creating the model needs {' and '.join(missing)} too")
        create_with = Model(
            args.model_name,
            args.image,
            args.model_data,
            _role(args.role, "SEMIF_SAGEMAKER_ROLE"),
            env=_env_pairs(args.env),
        )
    wait = (lambda sm, job: wait_job(sm, job, timeout=args.timeout)) if args.wait else None
    job, status = run(_client("sagemaker", args.region), t, create_with, wait=wait)
    if status == "Completed":
        return f"{job} Completed: results in {t.output} (<input object>.out for each input)"
    return f"{job} {status}: results will be in {t.output}"


def delete(args: argparse.Namespace) -> str:
    from semif_proxy.deploy.endpoint import delete as run

    removed = run(
        _client("sagemaker", args.region),
        args.endpoint,
        _client("application-autoscaling", args.region),
        _client("cloudwatch", args.region),
    )
    return "deleted " + ", ".join(removed)
