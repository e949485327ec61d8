"""One call per task, for a notebook or a script: inputs in, rows out.

    import mmbatch
    rows = mmbatch.caption(["photos/", pil_image], model="Qwen/Qwen2.5-VL-3B-Instruct")

``caption`` takes what a notebook holds: paths (files, folders, globs, manifests), PIL
images and image bytes, in one list; it returns one row per item, in input order, the same
rows ``mmbatch caption`` writes. Given a ``model``, it starts the engine, runs, and closes
it again (the GPU is free when it returns); to run several calls on one engine, open it
with ``load_engine`` in a ``with`` block, which closes it on the way out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from mmbatch.engine import builder
from mmbatch.engine.base import Engine
from mmbatch.engine.config import EngineConfig
from mmbatch.engine.logs import VllmLog, library_log_file
from mmbatch.engine.vllm import VLLMEngine
from mmbatch.errors import ConfigError
from mmbatch.jobs import Job, media_per_prompt, run_in_memory
from mmbatch.media.options import MediaOptions
from mmbatch.pipeline import RunConfig, close_pipeline
from mmbatch.sources import DEFAULT_PROMPT
from mmbatch.sources.mixed_media import Takes, list_media, media_requests, modality_of
from mmbatch.types import MODALITIES, MediaRef, Modality, Request, Sampling


def load_engine(
    model: str,
    *,
    media: Mapping[Modality, int] | None = None,
    vllm_log: VllmLog = "auto",
    **engine_kwargs: Any,
) -> VLLMEngine:
    """The vLLM engine for ``model`` (``engine_kwargs`` go to ``vllm.LLM``), sized for
    ``media`` per prompt (one image by default; ``{"video": 1}`` for clips). Use it in a
    ``with`` block, or ``close()`` it, to free the GPU. vLLM's start-up log goes to a file
    of its own (``vllm_log``, a path or ``"auto"``; None: printed)."""
    config = EngineConfig(model, engine_kwargs, library_log_file(vllm_log))
    host = builder.read_host(config, in_process=True)
    # One engine in this process: a VLLMEngine, which the caller closes.
    return cast(VLLMEngine, builder.start_engine(host, dict(media or {"image": 1}), host.layout()))


def caption(
    inputs: Any,
    *,
    model: str | EngineConfig | None = None,
    engine: Engine | None = None,
    prompt: str | None = None,
    system: str | None = None,
    sampling: Sampling | None = None,
    media: MediaOptions | None = None,
    run: RunConfig | None = None,
) -> list[dict[str, Any]]:
    """One row per item of ``inputs``, in input order: ``text`` and ``error`` (None, or
    what went wrong with that item), and the fields of ``mmbatch caption``'s rows.

    ``inputs`` is one input or a list of them: a path (a file, a folder, a glob or a
    manifest; videos are captioned whole, audio in windows), a PIL image, or an image
    file's bytes. Run on ``engine``, or on a new engine for ``model`` (a name, with vLLM's
    log in a file of its own as ``load_engine`` puts it; or an ``EngineConfig``, with its
    ``vllm.LLM`` arguments and its ``log_file``), closed again before this returns.
    ``prompt``: the question for every item (None: each kind of media its own, a picture
    ``DEFAULT_PROMPT``, a clip, an audio window its own: ``mmbatch.sources.DEFAULT_PROMPTS``).
    ``media``: how media are decoded (``ImageOptions(max_pixels=...)``); ``run``: the
    progress bar, decode workers and media memory."""
    if (engine is None) == (model is None):
        raise ConfigError("caption() takes a model or an engine (load_engine(model))")
    if isinstance(model, str):
        model = EngineConfig(model, {}, library_log_file("auto"))
    config: EngineConfig | None = model if model is not None else getattr(engine, "config", None)
    requests = _requests(_as_list(inputs), prompt, system, config)
    job = Job(requests, sampling or Sampling(), media or MediaOptions())
    run = run or RunConfig()
    if engine is not None:
        on_close = getattr(engine, "on_close", None)  # the pipeline kept for it goes with it
        if on_close is not None:
            on_close(lambda: close_pipeline(engine))
        rows, _ = run_in_memory(job, engine, run)
        return rows
    assert model is not None
    host = builder.read_host(model, in_process=True)
    # Laid out for this job, as a command's engines are: its graphs sized to it.
    layout = host.layout(len(requests))
    with cast(VLLMEngine, builder.start_engine(host, media_per_prompt(requests), layout)) as own:
        return run_in_memory(job, own, run)[0]


def _as_list(inputs: Any) -> list[Any]:
    if isinstance(inputs, (str, Path, bytes, bytearray, memoryview)) or _is_image(inputs):
        return [inputs]
    if isinstance(inputs, Sequence):
        return list(inputs)
    raise ConfigError(f"inputs: expected paths, PIL images or bytes, got {type(inputs).__name__}")


def _requests(
    inputs: list[Any],
    prompt: str | None,
    system: str | None,
    config: EngineConfig | None,
) -> list[Request]:
    """The requests of ``inputs``, in order: paths listed as ``mmbatch caption`` lists them
    (ids are paths), pictures in memory named by their place (``#3``). Files that are not
    pictures are taken if the model's processor takes them (``config``; every kind for an
    engine that names no model). ``prompt``: None asks each kind of media its own
    question (``DEFAULT_PROMPTS``)."""
    requests: list[Request] = []
    picture = prompt or DEFAULT_PROMPT
    for index, item in enumerate(inputs):
        if isinstance(item, (str, Path)):
            files = list_media([str(item)])
            kinds = {modality_of(f.path) for f in files}
            take: set[Modality] = {"image"}
            if kinds - take:  # more than pictures: the model's processor says what it takes
                from mmbatch.engine.processor import model_modalities

                take = set(model_modalities(config)) if config else set(MODALITIES)
            requests += media_requests(files, prompt, system, takes=Takes(take, as_clip=True))
        elif isinstance(item, (bytes, bytearray, memoryview)):
            requests.append(Request(f"#{index}", picture, (_in_memory(index, data=item),), system))
        elif _is_image(item):
            requests.append(Request(f"#{index}", picture, (_in_memory(index, image=item),), system))
        else:
            raise ConfigError(
                f"inputs[{index}]: expected a path, a PIL image or bytes, got {type(item).__name__}"
            )
    return requests


def _in_memory(index: int, **payload: Any) -> MediaRef:
    data = payload.get("data")
    if data is not None:
        payload["data"] = bytes(data)
    return MediaRef("image", f"#{index}", **payload)


def _is_image(value: Any) -> bool:
    return any(
        cls.__module__.startswith("PIL.") and cls.__name__ == "Image" for cls in type(value).__mro__
    )
