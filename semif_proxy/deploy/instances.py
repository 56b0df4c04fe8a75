"""Instance types: which are GPUs, and which AMI their CUDA 13 image needs. The one place that
knows instance families."""

from __future__ import annotations

import re

from semif_proxy.deploy.errors import UsageError

# NVIDIA families CUDA 13 still supports (Turing and newer).
GPU_FAMILIES = ("g4dn", "g5", "g6", "g6e", "p4d", "p4de", "p5", "p5e", "p5en")
# CUDA 13 dropped Pascal and Volta (P2 is Kepler): the GPU image cannot run there.
OLD_GPU_FAMILIES = ("p2", "p3")
# Inferentia / Trainium need a Neuron image; semif-proxy has none.
NEURON_FAMILIES = ("inf1", "inf2", "trn1", "trn2")
# The CUDA 13 image needs NVIDIA driver >= 580: the inference AMI with driver 580 / CUDA 13.0
# (a value of ProductionVariant.InferenceAmiVersion in botocore's SageMaker model).
DEFAULT_GPU_AMI = "al2023-ami-sagemaker-inference-gpu-4-1"

_TYPE = re.compile(r"ml\.([a-z0-9-]+)\.[a-z0-9]+")
# A family is <letters><generation><attributes>[-<variant>]; a "g" among the attributes is AWS
# Graviton (arm64): c6g, c6gd, c7gn, m7g, r8g, t4g, x2gd, g5g, im4gn, is4gen, hpc7g. No other
# SageMaker instance family is arm64.
_GRAVITON = re.compile(r"[a-z]+\d+[a-z]*g[a-z]*(-[a-z0-9]+)?")


def family(instance_type: str, flag: str = "--instance-type") -> str:
    match = _TYPE.fullmatch(instance_type)
    if not match:
        raise UsageError(f"{flag} must look like ml.<family>.<size>, got {instance_type!r}")
    return match.group(1)


def is_arm64(instance_type: str) -> bool:
    return bool(_GRAVITON.fullmatch(family(instance_type)))


def require_amd64(instance_type: str, flag: str = "--instance-type") -> None:
    """The image is built for amd64 only: an arm64 (Graviton) host cannot start it."""
    if is_arm64(instance_type):
        raise UsageError(
            f"{flag} {instance_type} is AWS Graviton (arm64) and the semif-proxy image is amd64 "
            "only: use an Intel or AMD type (ml.c7i, ml.m7i, ml.r7i, ml.c6i, ml.m6i, ...)"
        )


def is_gpu(instance_type: str) -> bool:
    return family(instance_type) in GPU_FAMILIES


def check(instance_type: str, gpu: bool, flag: str = "--instance-type") -> None:
    """Refuse an instance type the chosen image cannot use (or would leave half idle)."""
    fam = family(instance_type, flag)
    require_amd64(instance_type, flag)
    if fam in NEURON_FAMILIES:
        raise UsageError(f"{flag} {instance_type} is Inferentia/Trainium: no Neuron image exists")
    if fam in OLD_GPU_FAMILIES:
        raise UsageError(
            f"{flag} {instance_type} is Kepler/Pascal/Volta, which CUDA 13 no longer supports; "
            f"use one of {', '.join('ml.' + f for f in GPU_FAMILIES)}"
        )
    if fam in GPU_FAMILIES and not gpu:
        raise UsageError(
            f"{flag} {instance_type} is a GPU instance: add --gpu (and an image built with "
            "build-image --gpu); the CPU image would leave the GPU unused"
        )
    if gpu and fam not in GPU_FAMILIES:
        raise UsageError(
            f"--gpu needs a GPU {flag} (ml.<family>.* with family one of "
            f"{', '.join(GPU_FAMILIES)}), got {instance_type}"
        )


def inference_ami(instance_type: str, given: str | None) -> str | None:
    """The InferenceAmiVersion for a variant: the CUDA 13 AMI on GPUs unless --inference-ami
    names another one that botocore knows; none on CPUs."""
    if not is_gpu(instance_type):
        if given:
            raise UsageError(f"--inference-ami applies to GPU instances, not {instance_type}")
        return None
    if given is None:
        return DEFAULT_GPU_AMI
    known = known_amis()
    if known and given not in known:
        raise UsageError(f"--inference-ami must be one of {', '.join(known)}, got {given!r}")
    return given


def known_amis() -> tuple[str, ...]:
    """InferenceAmiVersion values of the installed botocore (empty if botocore is missing)."""
    try:
        import botocore.session
    except ImportError:
        return ()
    model = botocore.session.get_session().get_service_model("sagemaker")
    return tuple(model.shape_for("ProductionVariant").members["InferenceAmiVersion"].enum)
