"""How an engine is built: its settings checked, laid out over the host's GPUs, started.

Every engine starts here, whichever face asks (a command's job, ``DatasetMap``,
``run_dataset``, a notebook's ``caption`` and ``load_engine``, a Ray actor): ``read_host``
reads the host once per job (its GPUs, whether this process may start others) and checks the
settings against it, model name included; ``start_engine`` then starts what the job's layout
(``Host.layout``) describes. The per-process registry (``mmbatch.engine.registry``) keeps
what it starts for the next ask.

What is built follows the host (``mmbatch.engine.layout``): a ``ReplicaEngine`` of one
engine process per GPU, per tensor-parallel group, or (no GPU) one for the CPU, so that an
engine that dies is restarted and the request that killed it isolated; one ``VLLMEngine`` in
this process where the face holds its one engine itself (a notebook's, closed by its
caller) or where this process may not start others (a ``Dataset.map`` worker). Either way
the settings are checked (``preflight``) before the engine is used: a mistake is a one-line
``ConfigError`` before any output is written.
Replica processes start while this process checks (each has vLLM to import: no longer one
import after the other), and a mistake ends them at once.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from mmbatch.clock import milestone
from mmbatch.engine.base import Engine
from mmbatch.engine.config import EngineConfig, check_model_name
from mmbatch.engine.invariance import enable_if_asked, prepare_batch_invariance
from mmbatch.engine.layout import Gpu, Layout, choose_layout, in_process_layout, visible_gpus
from mmbatch.engine.passed_checks import pass_key, passed_before, remember_pass
from mmbatch.errors import ConfigError, FatalEngineError, MmbatchError
from mmbatch.types import Modality

if TYPE_CHECKING:
    from mmbatch.engine.processor import ChatTemplate
    from mmbatch.engine.vllm import VLLMEngine
    from mmbatch.engine.vllm_counts import ProcessingCounts
    from mmbatch.engine.vllm_settings import ModelFacts


@dataclass(frozen=True)
class Host:
    """This host as one job reads it, once (``read_host``), for a ``config`` checked against
    it: what the job is laid out on once its size is known (``layout``), and what
    ``start_engine`` starts."""

    config: EngineConfig
    gpus: tuple[Gpu, ...]
    """The GPUs this process may use (``visible_gpus``)."""
    in_process: bool = False
    """The face holds one engine in this process (``in_process_layout``): a notebook's,
    closed by its caller. (Not a Ray actor's: its engines run in engine processes, so that
    one that dies is restarted inside the replica, ``ray_replica._replica_engine``.)"""
    may_start_processes: bool = True
    """False in a daemonic process (a ``Dataset.map`` worker), which may not have children:
    its engine runs in it, as the job's layout sets it, without the restart a replica
    process gives."""

    def layout(self, requests: int | None = None) -> Layout:
        """The layout of a job of ``requests`` (None: of unknown size)."""
        if self.in_process:
            return in_process_layout(self.config, self.gpus, requests)
        return choose_layout(self.config, self.gpus, requests)


def read_host(config: EngineConfig, *, in_process: bool = False) -> Host:
    """The host ``config`` runs on, read once for the job and checked: a ``ConfigError`` if
    it asks for more GPUs than there are, or names a model folder that is not there (the one
    check of the model's name in an engine's start). Cheap, so a job checks it before
    writing anything, and before anything imports vLLM (20 s and more) only to find the
    model missing. A layout's mistakes do not depend on the job's size, so laying out a job
    of unknown size finds each of them. ``in_process``: the face holds one engine in this
    process (``Host.in_process``)."""
    check_model_name(config.model)
    host = Host(config, tuple(visible_gpus()), in_process, may_start_processes())
    host.layout()
    return host


def start_engine(host: Host, media_per_prompt: dict[Modality, int], layout: Layout) -> Engine:
    """The engine(s) ``layout`` (``host.layout``) describes for the host's config, its
    settings checked first: one ``VLLMEngine`` in this process where the host says so
    (``Host.in_process``, ``Host.may_start_processes``), else a ``ReplicaEngine`` of engine
    processes. Every engine of every face starts here.

    What other libraries log meanwhile in this process (transformers, as the model's
    processor loads here, and vLLM's own engine where it runs here) goes to the engine's
    log file with vLLM's, for a Python call as for a command (``libraries_to_log``)."""
    from mmbatch.engine.logs import libraries_to_log

    with libraries_to_log(host.config.log_file):
        return _start_engine(host, media_per_prompt, layout)


def _start_engine(host: Host, media_per_prompt: dict[Modality, int], layout: Layout) -> Engine:
    prepare_batch_invariance(host.config, host.gpus)  # before vLLM's import, and children's
    kwargs = layout.engine_kwargs(host.config.engine_kwargs)
    if layout.tensor_parallel > 1:
        kwargs.setdefault("tensor_parallel_size", layout.tensor_parallel)
    config = replace(host.config, engine_kwargs=kwargs)
    if host.in_process or not host.may_start_processes:
        # One engine here, without the restart a replica process gives.
        check_engine(config, media_per_prompt)
        return open_engine(config, media_per_prompt)
    from mmbatch.engine.replicas import ReplicaEngine
    from mmbatch.lifetime import engines_may_end_at_once
    from mmbatch.mainguard import check_main_guard

    check_main_guard()  # the engine processes are spawned: a script must be guarded

    read: list[tuple[ChatTemplate, ProcessingCounts]] = []

    def check_then_read_template() -> None:
        read.append(check_then_read(config, media_per_prompt))

    log = config.log_file
    fresh_log = log is not None and not os.path.exists(log)
    new_folders = _missing_folders(log) if log is not None else []
    try:
        # The settings are checked while the replicas start, not before: both import vLLM.
        return ReplicaEngine(
            partial(open_engine, config, media_per_prompt),
            layout.devices(),
            lambda *limits: read[0][0].budget(read[0][1], *limits),
            while_starting=check_then_read_template,
            # An engine of one GPU holds no shared memory; others may hold some, which only
            # a command's quiet resource tracker cleans up without a word.
            end_at_exit=engines_may_end_at_once()
            or (layout.tensor_parallel == 1 and all(layout.groups)),
            log=log,
        )
    except ConfigError:
        # A mistake leaves no log file (nor the folders made for it), though a replica,
        # starting meanwhile, began one.
        if fresh_log:
            Path(str(log)).unlink(missing_ok=True)
        for folder in new_folders:
            with suppress(OSError):  # not empty: something else is there now
                folder.rmdir()
        raise


def check_then_read(
    config: EngineConfig, media_per_prompt: dict[Modality, int]
) -> tuple[ChatTemplate, ProcessingCounts]:
    """What the job's own process needs of the model while its engine processes start:
    the settings checked (``check_engine``, first: it names a missing model best), the
    model's chat template, and vLLM's token counts for the pre-flight budget, these read
    with the ``ModelConfig`` the check made. Each step is a start-up milestone."""
    from mmbatch.engine.processor import ChatTemplate
    from mmbatch.engine.vllm_settings import processing_counts

    checked = check_engine(config, media_per_prompt)
    milestone("preflight_passed")
    trust = bool(config.engine_kwargs.get("trust_remote_code", False))
    template = ChatTemplate(config.model, trust)
    milestone("template_read")
    counts = processing_counts(config, template.render, checked)
    milestone("counts_read")
    return template, counts


def _missing_folders(path: str) -> list[Path]:
    """The folders above ``path`` that do not exist yet, deepest first."""
    missing = []
    folder = Path(path).absolute().parent
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    return missing


def may_start_processes() -> bool:
    """False in a daemonic process, which may not have children. datasets' pools come from
    ``multiprocess`` (dill's fork of multiprocessing), whose process bookkeeping the
    standard module does not see: ask both."""
    import multiprocessing

    modules = [multiprocessing, sys.modules.get("multiprocess")]
    return not any(m is not None and m.current_process().daemon for m in modules)


def check_engine(config: EngineConfig, media_per_prompt: dict[Modality, int]) -> ModelFacts:
    """``ConfigError`` (one line) for settings vLLM would refuse, before any model is
    loaded (the model's name was checked as the host was read, ``read_host``); then says
    where vLLM's log will go. What vLLM's check read of the model (``preflight``)."""
    from mmbatch.engine.vllm_settings import preflight

    with _quietly(config):
        facts = preflight(config, media_per_prompt)
    # What passed here is more than the device-free check reads: a --ray run of the same
    # settings after this one need not import vLLM on its driver for it.
    remember_pass(pass_key(config))
    log = config.log_shown or config.log_file
    if log is not None:
        print(
            f"mmbatch: starting vLLM; its log goes to {log} (to see it here: "
            f"{config.log_shown_by})",
            file=sys.stderr,
        )
    return facts


def check_engine_without_devices(config: EngineConfig) -> None:
    """``check_engine`` as far as a process without the engine's devices can tell (Ray's
    driver may have no GPU): every argument's name, and the model as vLLM reads it with them
    (``dtype``, a ``max_model_len`` within its context, ...). So the model must be reachable
    from that process too; the engine's own process checks the rest as it starts."""
    check_model_name(config.model)  # said as such, before vLLM's import
    settings = json.dumps([config.model, config.engine_kwargs], sort_keys=True, default=str)
    if settings in _CHECKED_WITHOUT_DEVICES:
        return  # the Ray command checks before Ray starts, its runner again: vLLM reads once
    key = pass_key(config)
    if not passed_before(key):  # the same model and settings passed on this host before
        from mmbatch.engine.vllm_settings import model_config

        with _quietly(config):
            model_config(config)
        remember_pass(key)
    _CHECKED_WITHOUT_DEVICES.add(settings)


_CHECKED_WITHOUT_DEVICES: set[str] = set()
"""The model and engine settings ``check_engine_without_devices`` passed in this process."""


@contextmanager
def _quietly(config: EngineConfig) -> Iterator[None]:
    """vLLM's log dropped while settings are checked (where ``config`` sends it to a file):
    a mistake leaves no log file."""
    from mmbatch.engine.logs import engine_log

    with engine_log(None if config.log_file is None else os.devnull):
        yield


def open_engine(config: EngineConfig, media_per_prompt: dict[Modality, int]) -> VLLMEngine:
    """The engine for ``config`` (settings already checked), its start-up log in
    ``config.log_file``; one that fails to start is a ``FatalEngineError`` saying why, not
    a traceback. Runs in a replica process too (``ReplicaEngine``)."""
    enable_if_asked(config)  # a replica's process: before vLLM's import
    from mmbatch.engine.logs import engine_log
    from mmbatch.engine.vllm import VLLMEngine

    log = config.log_file
    try:
        with engine_log(log):
            return VLLMEngine(config, media_per_prompt)
    except MmbatchError:
        raise
    except Exception as exc:  # vLLM raises anything at start-up (memory, devices, weights)
        lines = str(exc).strip().splitlines()
        reason = f"{type(exc).__name__}: {lines[0] if lines else ''}"
        where = f" (its log: {log})" if log is not None else ""
        raise FatalEngineError(f"the vLLM engine did not start{where}: {reason}") from exc
