"""The deploy subcommands of `semif-proxy`: their flags, and how an outcome is printed. What is
refused before any AWS call (a flag missing or out of place, a file that cannot be read) is a usage
error: one line, exit 2; what AWS refuses or fails exits 1. What each subcommand does is
actions.py's."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from semif_proxy.deploy import actions
from semif_proxy.deploy.errors import DeployError, UsageError


def add_commands(sub: Any) -> None:
    def command(name: str, fn: Any, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--region", help="AWS region (default: the boto3 default)")
        p.set_defaults(func=lambda a: _run(fn, a))
        return p

    p = command("package-model", actions.package_model, "model.tar.gz (GGUF + manifest) to S3")
    p.add_argument("--gguf", required=True, help="the GGUF model file to package")
    p.add_argument("--s3", required=True, help="s3://bucket/prefix/ to upload model.tar.gz to")
    p.add_argument(
        "--uncompressed",
        action="store_true",
        help="upload the GGUF as is, with its manifest, under a prefix that holds nothing else, "
        "and print that prefix for deploy --model-data: no compressing or unpacking, for large "
        "models; endpoints only, not batch (default: off, a model.tar.gz)",
    )
    p = command("build-image", actions.build_image, "build and push the image with CodeBuild")
    p.add_argument("--repository", required=True, help="ECR repository name")
    p.add_argument("--base-image", required=True, help="DLC image pinned by digest")
    p.add_argument("--source", required=True, help="s3://bucket/prefix/ for the source zip")
    p.add_argument("--project", default="semif-proxy-image", help="CodeBuild project name")
    p.add_argument("--tag", default="latest", help="image tag pushed to the repository")
    p.add_argument(
        "--gpu",
        action="store_true",
        help="build the GPU image (container/Dockerfile with VARIANT=gpu; default: the CPU one)",
    )
    p.add_argument(
        "--llama-cpp-ref",
        help="b<build> or commit the base must run (the build fails otherwise); "
        "default: the base's own, read from its llama-server",
    )
    p.add_argument("--role", help="CodeBuild service role ARN (default: SEMIF_CODEBUILD_ROLE)")
    p.add_argument("--root", default=".", help="repository root")
    p = command("deploy", actions.deploy, "SageMaker model, endpoint config and endpoint")
    p.add_argument("--image", required=True, help="image URI pinned by digest")
    p.add_argument("--model-data", required=True, help="s3://.../model.tar.gz")
    p.add_argument("--name", default="semif-proxy", help="endpoint name")
    p.add_argument("--instance-type", default="ml.c6i.xlarge", help="SageMaker instance type")
    p.add_argument(
        "--gpu-layers", type=int, help="layers to offload (default: all with --gpu, else none)"
    )
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="K=V",
        help="a setting for the container (SEMIF_*, SM_LLAMA_CPP_*); repeat for more "
        "(default: none)",
    )
    p.add_argument("--role", help="SageMaker execution role ARN (default: SEMIF_SAGEMAKER_ROLE)")
    p.add_argument("--gpu", action="store_true", help="GPU instance + image built with --gpu")
    p.add_argument("--inference-ami", help="InferenceAmiVersion on GPUs (default: the CUDA 13 one)")
    p.add_argument("--async", dest="asynchronous", action="store_true", help="async endpoint")
    p.add_argument(
        "--output",
        help="--async: s3://bucket/prefix/ for results (default: none; --async needs it)",
    )
    p.add_argument(
        "--failure-output", help="--async: s3://bucket/prefix/ for failures (default: none)"
    )
    p.add_argument(
        "--max-concurrent-invocations",
        type=int,
        help="--async: per instance (default: SageMaker's)",
    )
    p.add_argument("--min-instances", type=int, help="autoscaling floor (default 1; async: 0 ok)")
    p.add_argument(
        "--max-instances", type=int, help="autoscaling ceiling (turns it on; default: off)"
    )
    p.add_argument(
        "--target-invocations",
        type=float,
        help="requests per instance per minute to hold (default: none)",
    )
    p.add_argument(
        "--target-backlog",
        type=float,
        help="--async: queued requests per instance to hold (default: none)",
    )
    p.add_argument("--scale-in-cooldown", type=int, help="seconds (default 300)")
    p.add_argument("--scale-out-cooldown", type=int, help="seconds (default 60)")
    p = command("invoke", actions.invoke, "POST a JSON body to an endpoint's /invocations")
    p.add_argument("--endpoint", required=True, help="endpoint name")
    p.add_argument("--body", required=True, help="JSON file to send")
    p.add_argument("--async", dest="asynchronous", action="store_true", help="async endpoint")
    p.add_argument(
        "--input-location",
        help="--async: s3://bucket/prefix/ to upload the body to (default: none; --async needs it)",
    )
    p.add_argument("--timeout", type=float, default=1800, help="--async: seconds to wait")
    p = command("batch", actions.batch, "Batch Transform over JSON Lines in S3")
    p.add_argument("--input", required=True, help="s3://bucket/prefix/ of .jsonl objects")
    p.add_argument("--output", required=True, help="s3://bucket/prefix/ for the results")
    p.add_argument("--model-name", required=True, help="SageMaker model (created if missing)")
    p.add_argument(
        "--image",
        help="to create the model: image URI pinned by digest (default: the model exists)",
    )
    p.add_argument(
        "--model-data",
        help="to create the model: s3://.../model.tar.gz (default: the model exists)",
    )
    p.add_argument(
        "--role", help="to create the model: execution role ARN (default: SEMIF_SAGEMAKER_ROLE)"
    )
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="K=V",
        help="to create the model: a container setting; repeat for more (default: none)",
    )
    p.add_argument("--instance-type", default="ml.c6i.xlarge", help="SageMaker instance type")
    p.add_argument("--instance-count", type=int, default=1, help="instances the job runs on")
    p.add_argument(
        "--max-payload-mb", type=int, default=6, help="MaxPayloadInMB: the largest call, in MB"
    )
    p.add_argument(
        "--max-concurrent-transforms",
        type=int,
        default=0,
        help="calls at once per instance (0: what the container's /execution-parameters says)",
    )
    p.add_argument(
        "--multi-record",
        action="store_true",
        help="many lines per call, up to --max-payload-mb (default one line per call): size "
        "inputs so that each call finishes within SEMIF_REQUEST_TIMEOUT",
    )
    p.add_argument(
        "--wait",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="wait for the job to end",
    )
    p.add_argument("--timeout", type=float, default=86400, help="seconds to wait")
    p = command("delete", actions.delete, "delete the endpoint, its config, model and autoscaling")
    p.add_argument("--endpoint", required=True, help="endpoint name")


def _run(fn: Any, args: argparse.Namespace) -> int:
    try:
        out = fn(args)
    except UsageError as exc:
        one_line = " ".join(str(exc).split())
        sys.stderr.write(f"semif-proxy {args.command}: {one_line}\n")
        return 2
    except DeployError as exc:
        sys.stderr.write(f"semif-proxy {args.command}: {exc}\n")
        return 1
    sys.stdout.write(out + "\n")
    return 0
