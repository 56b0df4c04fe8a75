"""The deploy subcommands of `semif-proxy`: argument parsing and printing only."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from semif_proxy.deploy.errors import DeployError


def _client(service: str, region: str | None) -> Any:
    try:
        import boto3
    except ImportError:
        raise DeployError("boto3 is missing: pip install 'semif-proxy[aws]'") from None
    return boto3.client(service, region_name=region)


def _role(given: str | None, env: str) -> str:
    role = given or os.environ.get(env)
    if not role:
        raise DeployError(f"give --role or set {env} (an IAM role ARN)")
    return role


def _env_pairs(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise DeployError(f"--env takes KEY=VALUE, got {pair!r}")
        out[key] = value
    return out


def package_model(args: argparse.Namespace) -> str:
    from semif_proxy.deploy.package import package_model as run

    with tempfile.TemporaryDirectory() as work:
        return run(_client("s3", args.region), Path(args.gguf), args.s3, Path(work))


def build_image(args: argparse.Namespace) -> str:
    from semif_proxy.deploy.image import ImageBuild
    from semif_proxy.deploy.image import build_image as run

    build = ImageBuild(
        project=args.project,
        source=args.source,
        repository=args.repository,
        tag=args.tag,
        dockerfile="container/Dockerfile.gpu" if args.gpu else "container/Dockerfile",
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


def deploy(args: argparse.Namespace) -> str:
    from semif_proxy.deploy.endpoint import Deployment
    from semif_proxy.deploy.endpoint import deploy as run

    d = Deployment(
        name=args.name,
        image=args.image,
        model_data=args.model_data,
        role_arn=_role(args.role, "SEMIF_SAGEMAKER_ROLE"),
        instance_type=args.instance_type,
        gpu_layers=args.gpu_layers,
        env=_env_pairs(args.env),
    )
    desc = run(_client("sagemaker", args.region), d)
    return f"{desc['EndpointName']} {desc['EndpointStatus']}"


def invoke(args: argparse.Namespace) -> str:
    from semif_proxy.deploy.endpoint import invoke as run

    _, body = run(
        _client("sagemaker-runtime", args.region), args.endpoint, Path(args.body).read_bytes()
    )
    try:
        return json.dumps(json.loads(body), indent=2)
    except ValueError:
        return body.decode("utf-8", "replace")


def delete(args: argparse.Namespace) -> str:
    from semif_proxy.deploy.endpoint import delete as run

    return "deleted " + ", ".join(run(_client("sagemaker", args.region), args.endpoint))


def add_commands(sub: Any) -> None:
    def command(name: str, fn: Any, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--region", help="AWS region (default: the boto3 default)")
        p.set_defaults(func=lambda a: _run(fn, a))
        return p

    p = command("package-model", package_model, "model.tar.gz (GGUF + manifest) to S3")
    p.add_argument("--gguf", required=True)
    p.add_argument("--s3", required=True, help="s3://bucket/prefix/")
    p = command("build-image", build_image, "build and push the image with CodeBuild")
    p.add_argument("--repository", required=True, help="ECR repository name")
    p.add_argument("--base-image", required=True, help="DLC image pinned by digest")
    p.add_argument("--source", required=True, help="s3://bucket/prefix/ for the source zip")
    p.add_argument("--project", default="semif-proxy-image")
    p.add_argument("--tag", default="latest")
    p.add_argument("--gpu", action="store_true", help="use container/Dockerfile.gpu")
    p.add_argument("--llama-cpp-ref", default="b11312")
    p.add_argument("--role", help="CodeBuild service role ARN (or SEMIF_CODEBUILD_ROLE)")
    p.add_argument("--root", default=".", help="repository root")
    p = command("deploy", deploy, "SageMaker model, endpoint config and endpoint")
    p.add_argument("--image", required=True, help="image URI pinned by digest")
    p.add_argument("--model-data", required=True, help="s3://.../model.tar.gz")
    p.add_argument("--name", default="semif-proxy")
    p.add_argument("--instance-type", default="ml.c6i.xlarge")
    p.add_argument("--gpu-layers", type=int)
    p.add_argument("--env", action="append", default=[], metavar="K=V")
    p.add_argument("--role", help="SageMaker execution role ARN (or SEMIF_SAGEMAKER_ROLE)")
    p = command("invoke", invoke, "POST a JSON body to an endpoint's /invocations")
    p.add_argument("--endpoint", required=True)
    p.add_argument("--body", required=True, help="JSON file")
    p = command("delete", delete, "delete the endpoint, its config and its model")
    p.add_argument("--endpoint", required=True)


def _run(fn: Any, args: argparse.Namespace) -> int:
    try:
        out = fn(args)
    except DeployError as exc:
        sys.stderr.write(f"semif-proxy {args.command}: {exc}\n")
        return 1
    sys.stdout.write(out + "\n")
    return 0
