"""One side of the benchmark: its worker's spec, its environment and its process, which a
stopped bench waits for. The workloads (``driver``) and the whole-process runs (``whole``)
both start their sides here."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from mmbatch.engine.config import DEFAULT_RENDER_THREADS

BASE_SIDES = ("naive", "prebuilt")
"""The sides the others are measured against; a variant may be one of them (``"side"``),
with engine arguments of its own (naive with ``tensor_parallel_size=2``)."""

WORKER_STOP_SECONDS = 60.0
"""How long a side's process has to close its engine when the bench is stopped."""


def run_side(argv: list[str], env: dict[str, str], log: Path | None = None) -> None:
    """Run one side's process to its end (its output to ``log``, if given). Stopped (Ctrl-C,
    or SIGTERM from ``timeout``), the bench sends that process SIGTERM, which it takes as
    Ctrl-C (SIGINT itself may be ignored in a background job), and waits for it, so that its
    engine has let go of the GPU before the bench exits: left behind, it held 128 GiB for the
    next command to fail on."""
    with open(log or os.devnull, "wb") as sink:
        where = {"stdout": sink, "stderr": subprocess.STDOUT} if log is not None else {}
        worker = subprocess.Popen(argv, env=env, **where)  # type: ignore[call-overload]
        try:
            code = worker.wait()
        except BaseException:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=WORKER_STOP_SECONDS)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
            raise
    if code:
        tail = log.read_text(errors="replace")[-3000:] if log is not None else ""
        raise subprocess.CalledProcessError(code, argv, output=tail)


def side_spec_for(spec: dict[str, Any], mode: str, variant: dict[str, Any]) -> dict[str, Any]:
    """The worker's spec for the side ``mode`` names: a base side, mmbatch, or a variant of
    either (``--variant``). A variant's engine arguments are its side's own: a baseline
    variant's replace the common ones (a user's ``tensor_parallel_size=2``), an mmbatch
    one's add to mmbatch's."""
    side = mode if mode in BASE_SIDES else variant.get("side", "mmbatch")
    engine = variant.get("engine", {})
    on_base = side in BASE_SIDES
    return {
        **spec,
        "mode": side,
        "render_threads": variant.get("render_threads", DEFAULT_RENDER_THREADS),
        "in_process": bool(variant.get("in_process", False)),
        "gpus": variant.get("gpus"),
        "engines_per_gpu": variant.get("engines_per_gpu"),
        "ray_batch": variant.get("ray_batch"),
        "decode_workers": variant.get("decode_workers", spec["decode_workers"]),
        "common_engine_args": {**spec["common_engine_args"], **(engine if on_base else {})},
        "mmbatch_engine_args": {**spec["mmbatch_engine_args"], **({} if on_base else engine)},
    }


def side_environment(variant: dict[str, Any]) -> dict[str, str]:
    """The environment of a side's process, and so of every process it starts: this one's,
    with the variant's ``"env"`` over it (``{"OMP_NUM_THREADS": "2"}``: how many threads
    torch's operators use in the engine processes, beside vLLM's engine core)."""
    return {**os.environ, **{key: str(value) for key, value in variant.get("env", {}).items()}}
