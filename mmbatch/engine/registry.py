"""One engine per process and configuration, built on first use and kept until it closes.

Callers that cannot hold an engine themselves (a ``Dataset.map`` function, which is pickled
and must stay small; the runner, called again and again in one process) ask here instead:
the first call in a process builds the engine (``mmbatch.engine.builder``), every later
call with the same settings gets the same one, since building it again would cost the model
load and the GPU memory a second time. An engine kept here that closes is dropped through
its close hook (``on_close``), so the next ask builds another; the engine itself knows
nothing of this registry. A forked child (a ``Dataset.map(num_proc=...)`` worker) keeps
none of its parent's engines: they are the parent's to use and to close, and the child's
first ask builds its own.
"""

from __future__ import annotations

import json
from dataclasses import replace
from functools import partial

from mmbatch.engine import builder
from mmbatch.engine.base import Engine
from mmbatch.engine.builder import Host
from mmbatch.engine.config import EngineConfig
from mmbatch.engine.layout import Layout
from mmbatch.lifetime import emptied_in_forked_children
from mmbatch.types import Modality

_ENGINES: dict[str, tuple[Engine, Layout]] = {}
emptied_in_forked_children(_ENGINES)  # the parent's engines: a child neither uses nor closes
KEPT = "kept from an earlier job in this process, as laid out for that job"
"""Said of a kept engine's layout: its engine count and CUDA graphs were chosen for the job
that built it (graphs up to that job's size), not for the one asking now, which gets it rather
than paying a second model load and the GPU memory of a second engine."""


def shared_engine(
    config: EngineConfig, media_per_prompt: dict[Modality, int], requests: int | None = None
) -> Engine:
    """This process's engine for ``config``, built now if it is the first ask (the host
    read then, ``read_host``), laid out for a job of ``requests`` (None: unknown)."""
    kept = _ENGINES.get(_key(config, media_per_prompt))
    if kept is not None:
        return kept[0]
    host = builder.read_host(config)
    return shared_engine_and_layout(host, media_per_prompt, host.layout(requests))[0]


def kept_engine(config: EngineConfig, media_per_prompt: dict[Modality, int]) -> Engine | None:
    """The engine an earlier ask built for ``config`` in this process, if one is kept."""
    kept = _ENGINES.get(_key(config, media_per_prompt))
    return kept[0] if kept is not None else None


def shared_engine_and_layout(
    host: Host, media_per_prompt: dict[Modality, int], layout: Layout
) -> tuple[Engine, Layout]:
    """``shared_engine`` for the job that read ``host``, and the layout its engine was built
    with (for the job's summary: ``KEPT`` where an earlier ask built it); ``layout``: the one
    chosen for the job (``host.layout``)."""
    key = _key(host.config, media_per_prompt)
    kept = _ENGINES.get(key)
    if kept is not None:  # laid out for the job that built it, which the summary says
        engine, built_for = kept
        return engine, replace(built_for, reason=f"{built_for.reason}; {KEPT}", kept=True)
    engine = builder.start_engine(host, media_per_prompt, layout)
    _ENGINES[key] = (engine, layout)
    on_close = getattr(engine, "on_close", None)
    if on_close is not None:
        on_close(partial(_forget, engine))
    return engine, layout


def _key(config: EngineConfig, media_per_prompt: dict[Modality, int]) -> str:
    """What makes two asks one engine: its settings and the media it was sized for."""
    return json.dumps(
        [
            config.llm_kwargs(),
            config.gpus,
            config.engines_per_gpu,
            config.render_threads,
            sorted(media_per_prompt.items()),
        ],
        sort_keys=True,
        default=repr,
    )


def _forget(engine: Engine) -> None:
    """Drop ``engine`` (it is closing): the next ask builds another. By identity, so that
    a closed engine's hook, run again, never drops the one built after it."""
    for key, (kept, _) in list(_ENGINES.items()):
        if kept is engine:
            del _ENGINES[key]
