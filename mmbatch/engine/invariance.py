"""Batch-invariant decoding: an answer that does not depend on what it was batched with.

vLLM's kernels reduce in an order that depends on the shape of the batch (matmuls split
along K, attention split over the KV cache), so on near-tie logits a token can flip with the
batch, even greedy: the rows a resumed job writes after an interruption, or that Ray
replicas write, can differ from those of one uninterrupted local run. vLLM's batch-invariant
mode (``VLLM_BATCH_INVARIANT=1``) fixes those orders.

What it guarantees, with ``EngineConfig(batch_invariant=True)`` (``--batch-invariant``):
the same request (prompt, media, sampling and seed) on the same model, vLLM version, GPU
model and engine settings (dtype, tensor-parallel size, ...) gives the same tokens whatever
it is batched with. So a job killed and resumed, or spread over replicas, writes the texts an
uninterrupted run writes. Its limits: nothing across GPU models, vLLM or driver versions,
dtypes or tensor-parallel sizes; it is in beta in vLLM, which may refuse or slow down some
attention backends and features under it; it costs throughput; and it is process-wide in
vLLM (an engine built in a process that enabled it is invariant too).

Where it runs: NVIDIA GPUs of compute capability 9.0 and up (H100, H200, B200), and 8.0 and
up (A100) from vLLM 0.32, which also lists AMD and Intel GPUs: those are not detected here and
are refused. Anything else (the CPU build, no GPU visible) is refused before the job writes
anything, in one line, rather than a run that is silently not invariant.

The mode is an environment variable read by vLLM's modules as they are imported (some keep
it in a module constant), so it is set in this process before vLLM is imported here; the
engine's processes (replicas, vLLM's engine core, Ray actors through their ``runtime_env``)
inherit it. A process that imported vLLM without it cannot turn it on: that is refused too.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from typing import Any

from mmbatch.engine.config import EngineConfig
from mmbatch.engine.installed_vllm import vllm_version
from mmbatch.engine.layout import Gpu
from mmbatch.errors import ConfigError

ENV_VAR = "VLLM_BATCH_INVARIANT"
WHAT = "batch-invariant decoding (--batch-invariant, VLLM_BATCH_INVARIANT=1)"
CAPABILITY = (9, 0)
"""The compute capability vLLM's batch invariance needs from 0.26 (the oldest supported) to
0.31 (its documentation), and where the version is not known."""
CAPABILITY_FROM_0_32 = (8, 0)
"""From vLLM 0.32 (the newest supported: the CPU build's), which added kernels for Ampere."""


def prepare_batch_invariance(config: EngineConfig, gpus: Sequence[Gpu]) -> None:
    """For a ``config`` that asks for batch invariance: ``ConfigError`` where this host's
    GPUs (``gpus``, as the job read them: ``mmbatch.engine.builder.read_host``) cannot give
    it, else the mode switched on in this process's environment, for vLLM and every process
    the engine starts."""
    if not config.batch_invariant:
        return
    check_platform(gpus, vllm_version())
    enable()


def enable_if_asked(config: EngineConfig) -> None:
    """The mode switched on for a ``config`` that asks for it, in a process whose platform
    the process that laid out its engine checked (``prepare_batch_invariance``): an engine
    process, which inherits the variable, or one that set it already."""
    if config.batch_invariant:
        enable()


def recorded(config: EngineConfig) -> dict[str, Any]:
    """What a job's record and summary say of the mode: that it was on (nothing when off,
    so the records of jobs run without it are as they were)."""
    return {"batch_invariant": True} if config.batch_invariant else {}


def check_platform(gpus: Sequence[Gpu], version: str | None) -> None:
    """``ConfigError`` unless every GPU of ``gpus`` has the compute capability vLLM
    ``version`` needs for batch invariance (None: a version not known, held to the
    stricter need)."""
    need = required_capability(version)
    wanted = f"an NVIDIA GPU of compute capability {need[0]}.{need[1]} or newer"
    if not gpus:
        raise ConfigError(f"{WHAT} needs {wanted} (vLLM {version or '?'}); none is visible here")
    short = [gpu for gpu in gpus if gpu.capability is None or gpu.capability < need]
    if short:
        named = ", ".join(f"GPU {gpu.name} ({_capability(gpu)})" for gpu in short)
        raise ConfigError(f"{WHAT} needs {wanted} (vLLM {version or '?'}); {named} is not")


def required_capability(version: str | None) -> tuple[int, int]:
    """The compute capability vLLM ``version`` needs for batch invariance."""
    found = re.match(r"(\d+)\.(\d+)", version or "")
    if found is None:
        return CAPABILITY
    return CAPABILITY_FROM_0_32 if (int(found[1]), int(found[2])) >= (0, 32) else CAPABILITY


def enable() -> None:
    """``VLLM_BATCH_INVARIANT=1`` in this process's environment; ``ConfigError`` when vLLM
    was imported here without it (some of its modules read it once, at their import)."""
    if os.environ.get(ENV_VAR) == "1":
        return
    if "vllm" in sys.modules:
        raise ConfigError(
            f"{WHAT}: vLLM was imported in this process before it was asked for; set "
            f"{ENV_VAR}=1 before importing vllm, or run the job in a new process"
        )
    os.environ[ENV_VAR] = "1"


def _capability(gpu: Gpu) -> str:
    if gpu.capability is None:
        return "compute capability unknown"
    return f"compute capability {gpu.capability[0]}.{gpu.capability[1]}"
