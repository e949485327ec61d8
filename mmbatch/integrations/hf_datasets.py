"""``Dataset.map(DatasetMap(...), batched=True)``: caption a Hugging Face dataset in place.

What datasets' ``map`` asks of a function, and how this one answers:

* It is pickled to worker processes and hashed (with dill) into the cache fingerprint. So
  the callable holds settings only, never the engine: the engine is built lazily, once per
  process, on the first batch, and kept in this module for the next batches and the next
  ``map`` calls. The settings pickle the same way in every run, so datasets' fingerprint is
  stable and its cache holds across runs; a callable whose state does not pickle the same
  way falls back to a random fingerprint and recomputes everything (datasets #5536).
  ``fingerprint`` is that identity as a string, covering the model directory's files by
  content (``mmbatch.engine.identity``: replaced weights of the same size are another
  model), for ``new_fingerprint=`` or your own bookkeeping. datasets' own cache key hashes
  exactly that string (the callable registers itself with datasets' hasher), so
  ``DatasetMap.pipelined``, the same callable as a coroutine, shares the plain one's cache.
* With ``with_rank=True`` each worker gets a rank, which picks its GPU (round robin over
  ``CUDA_VISIBLE_DEVICES``, or every GPU torch sees) before the engine starts. ``num_proc``
  workers are daemonic processes, which may not start processes of their own, so there the
  engine runs in the worker (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), one GPU each.
* A batch is a dict of columns; the answer is two new columns of the same length, ``text``
  and ``error`` (with ``with_usage=True`` also ``finish_reason``, ``prompt_tokens``,
  ``output_tokens`` and ``cached_tokens``; with ``Sampling(n=...)`` above 1, each text is a
  list of n). One bad row never raises: it gets ``text == ""`` and an ``error`` naming
  the stage and the cause. Both columns are strings, never None, because datasets cannot
  write a column whose first batch is all None (it would have the null type).
* ``Image(decode=False)`` / ``Audio(decode=False)`` cells are ``{bytes, path}``: the raw
  bytes are hashed as they are, like a file's. Decoded ``Image()`` cells (PIL images) are
  hashed by mode, size and pixels.
* A cell that holds only a path (a string column, or ``{bytes: None, path}``) is read from
  disk only inside the folders the caller allows (``allowed_paths``): a dataset from the Hub
  or from memory is data from elsewhere with no folder of its own, and its paths could name
  any file (``mmbatch.sources.paths``). Any other path is its row's error.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import types
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

import xxhash

from mmbatch.engine.builder import may_start_processes
from mmbatch.engine.config import EngineConfig
from mmbatch.engine.identity import model_identity
from mmbatch.engine.logs import VllmLog, library_log_file
from mmbatch.errors import ConfigError, ItemFailure
from mmbatch.jobs import Job, rows_of, run_in_memory, start_in_memory
from mmbatch.media.options import ImageOptions, MediaOptions
from mmbatch.output.rows import TOKEN_COLUMNS, output_row
from mmbatch.sources.cells import BadCell, media_ref
from mmbatch.sources.paths import LocalPaths
from mmbatch.types import ItemError, Modality, Request, Result, Sampling

if TYPE_CHECKING:
    from mmbatch.engine.base import Engine

FINGERPRINT_VERSION = "3"
"""Bumped when the rows this callable writes change for the same settings."""


class DatasetMap:
    """A picklable ``Dataset.map`` function that adds ``text`` and ``error`` columns.

    >>> ds = ds.cast_column("image", datasets.Image(decode=False))  # hash the raw bytes
    >>> ds = ds.map(DatasetMap("Qwen/Qwen2.5-VL-3B-Instruct", "Describe."), batched=True,
    ...             batch_size=512, with_rank=True)

    Cells holding only a path are read inside ``allowed_paths`` only (folders; the rule of
    ``mmbatch.sources.paths``); cells holding their bytes need none.
    """

    def __init__(
        self,
        model: str,
        prompt: str,
        *,
        column: str = "image",
        modality: Modality = "image",
        prompt_column: str | None = None,
        system: str | None = None,
        engine_kwargs: Mapping[str, Any] | None = None,
        sampling: Sampling | None = None,
        image_options: ImageOptions | None = None,
        text_column: str = "text",
        error_column: str = "error",
        with_usage: bool = False,
        allowed_paths: Sequence[str] = (),
        vllm_log: VllmLog = "auto",
    ) -> None:
        self.engine_config = EngineConfig(model, dict(engine_kwargs or {}))
        self.vllm_log = vllm_log
        """Where vLLM's log goes (``mmbatch.engine.logs.VllmLog``): a file of its own by
        default, decided in the process that builds the engine."""
        self.paths = LocalPaths(
            tuple(str(p) for p in allowed_paths), widen="DatasetMap(allowed_paths=[DIR])"
        )
        self.prompt = prompt
        self.column = column
        self.modality: Modality = modality
        self.prompt_column = prompt_column
        self.system = system
        self.sampling = sampling or Sampling()
        self.image_options = image_options or ImageOptions()
        self.text_column = text_column
        self.error_column = error_column
        self.with_usage = with_usage
        if text_column == error_column:
            raise ConfigError(f"text and error columns must differ, both are {text_column!r}")
        # Computed once, here, so that workers and later runs hash the same state.
        revision = self.engine_config.engine_kwargs.get("revision")
        self.fingerprint = _fingerprint(
            self._settings(), model_identity(model, str(revision) if revision else None)
        )
        _hash_by_fingerprint()

    def __call__(self, batch: Mapping[str, Sequence[Any]], *indices_and_rank: Any) -> Any:
        """Caption one batch: its new columns (for the ``pipelined`` twin, a coroutine giving
        them). datasets appends the rows' indices (``with_indices=True``, a list) and the
        worker's rank (``with_rank=True``, an int or None), in that order."""
        if self._coroutine:
            return self._batch_coroutine(batch, indices_and_rank)
        job, engine, size = self._batch_job(batch, indices_and_rank)
        if engine is None:
            return self._columns(job, [], size)
        rows, _ = run_in_memory(job, engine)
        return self._columns(job, rows, size)

    @property
    def pipelined(self) -> DatasetMap:
        """This callable as a coroutine function: ``Dataset.map`` then keeps many batches in
        flight at once, all on this process's one engine, which therefore never drains
        between batches (a plain call returns only once its batch is done)::

            ds.map(captioner.pipelined, batched=True, batch_size=256, with_rank=True)

        Its rows are the plain call's, and so is its datasets cache: switching between the
        two reuses it.
        """
        twin = copy.copy(self)
        twin._coroutine = True
        return twin

    # What ``inspect.iscoroutinefunction`` (which datasets asks) reads of a function: its
    # code, name and defaults. The pipelined twin shows those of ``_batch_coroutine``, so
    # that datasets awaits what its calls return; the plain callable shows none.
    _coroutine = False
    __defaults__ = None
    __kwdefaults__ = None

    @property
    def __code__(self) -> types.CodeType:
        if not self._coroutine:
            raise AttributeError("__code__")
        return DatasetMap._batch_coroutine.__code__

    @property
    def __name__(self) -> str:
        if not self._coroutine:
            raise AttributeError("__name__")
        return "pipelined"

    async def _batch_coroutine(
        self, batch: Mapping[str, Sequence[Any]], indices_and_rank: Sequence[Any]
    ) -> dict[str, list[Any]]:
        job, engine, size = self._batch_job(batch, indices_and_rank)
        if engine is None:
            return self._columns(job, [], size)
        submission = start_in_memory(job, engine)
        loop = asyncio.get_running_loop()
        finished: asyncio.Future[None] = loop.create_future()
        submission.on_done(lambda: loop.call_soon_threadsafe(_resolve, finished))
        await finished
        rows, _ = rows_of(submission)
        return self._columns(job, rows, size)

    def _batch_job(
        self, batch: Mapping[str, Sequence[Any]], indices_and_rank: Sequence[Any]
    ) -> tuple[Job, Engine | None, int]:
        """The batch as a job, the engine to run it on (None when every row of the batch
        failed already: no engine is started for that), and the batch's size."""
        indices, rank = _indices_and_rank(indices_and_rank)
        if self.column not in batch:
            raise ConfigError(
                f"the dataset has no column {self.column!r} (it has {', '.join(batch)})"
            )
        cells = batch[self.column]
        if not isinstance(cells, (list, tuple)):
            raise ConfigError("DatasetMap takes batches: call Dataset.map with batched=True")
        prompts = batch[self.prompt_column] if self.prompt_column else None
        requests = self._requests(cells, prompts, indices)
        job = Job(requests, self.sampling, MediaOptions(image=self.image_options))
        usable = any(r.error is None for r in requests)
        return job, self._engine(rank) if usable else None, len(cells)

    def _columns(self, job: Job, rows: list[dict[str, Any]], size: int) -> dict[str, list[Any]]:
        """Exactly one (text, error) per input row, in input order; a missing one is a bug."""
        by_id = {row["id"]: row for row in rows}
        for request in job.requests:
            if request.id not in by_id:  # failed before any work: its error is its row
                by_id[request.id] = output_row(request, (), Result(request.id, error=request.error))
        ordered = [by_id[str(index)] for index in range(size)]
        # Every value has its column's type in every row, a failed one too (datasets fixes
        # a column's type from its first batch): text is a string, or with n > 1 a list of
        # them (empty for a failed row).
        empty: Any = [] if self.sampling.n > 1 else ""
        columns: dict[str, list[Any]] = {
            self.text_column: [row["text"] or empty for row in ordered],
            self.error_column: [_error_text(row["error"]) for row in ordered],
        }
        if self.with_usage:
            columns["finish_reason"] = [row["finish_reason"] or empty for row in ordered]
            for name in TOKEN_COLUMNS:
                columns[name] = [int(row[name] or 0) for row in ordered]
        return columns

    def _requests(
        self, cells: Sequence[Any], prompts: Sequence[Any] | None, indices: Sequence[int] | None
    ) -> list[Request]:
        """The batch's requests, by position as id; an unusable row carries its error."""
        requests: list[Request] = []
        for index, cell in enumerate(cells):
            # The error lands in the row's own cell, so without indices (with_indices=True)
            # it names no row rather than a position in the batch, which reads as a row.
            label = f"row {indices[index]}" if indices is not None else "this row"
            prompt = self.prompt if prompts is None else prompts[index]
            try:
                if not isinstance(prompt, str) or not prompt:
                    raise BadCell(f"{label}: {self.prompt_column!r} holds no prompt: {prompt!r}")
                ref = media_ref(cell, self.modality, label, self.paths, None)
            except ItemFailure as exc:
                error = ItemError(exc.stage, str(exc), exc.kind)
                requests.append(Request(str(index), "", error=error))
                continue
            requests.append(Request(str(index), prompt, (ref,), self.system))
        return requests

    def _engine(self, rank: int | None) -> Engine:
        from mmbatch.engine.registry import shared_engine

        # The engine is built on this process's first batch, so the GPU is chosen before CUDA
        # starts; later calls narrow CUDA_VISIBLE_DEVICES to the device it already names.
        prepare_engine_process(rank, self.engine_config.engine_kwargs)
        config = replace(self.engine_config, log_file=library_log_file(self.vllm_log))
        return shared_engine(config, {self.modality: 1})

    def _settings(self) -> dict[str, Any]:
        return {
            "engine": {"model": self.engine_config.model, **self.engine_config.engine_kwargs},
            "prompt": self.prompt,
            "column": self.column,
            "modality": self.modality,
            "prompt_column": self.prompt_column,
            "system": self.system,
            "sampling": asdict(self.sampling),
            "image_options": self.image_options.cache_token(),
            "columns": [self.text_column, self.error_column, self.with_usage],
            "allowed_paths": list(self.paths.roots),
        }

    def __repr__(self) -> str:
        return f"DatasetMap({self.engine_config.model!r}, fingerprint={self.fingerprint!r})"


def _hash_by_fingerprint() -> None:
    """Have datasets' hasher write a ``DatasetMap`` as its ``fingerprint`` (its settings and
    its model's content) and nothing else, so that the plain callable and its ``pipelined``
    twin (which differ only in how datasets calls them) make one cache key. datasets hashes
    a map's function by pickling it with a pickler of its own, whose types can be given their
    own writer (``pklregister``); the pickle that carries the callable to worker processes
    is the usual one, twin and all. A datasets without that hook hashes the whole state."""
    try:
        from datasets.utils._dill import Pickler, pklregister
    except ImportError:
        return
    if DatasetMap not in Pickler.dispatch:
        pklregister(DatasetMap)(_save_fingerprint)


def _save_fingerprint(pickler: Any, captioner: DatasetMap) -> None:
    pickler.save(("mmbatch.DatasetMap", FINGERPRINT_VERSION, captioner.fingerprint))


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _error_text(error: Any) -> str:
    """An error column cell: ``stage: message``, or "" for a row that succeeded."""
    return f"{error['stage']}: {error['message']}" if error else ""


def _indices_and_rank(extra: Sequence[Any]) -> tuple[Sequence[int] | None, int | None]:
    indices: Sequence[int] | None = None
    rank: int | None = None
    for value in extra:
        if isinstance(value, (list, range)):
            indices = value
        elif value is None or isinstance(value, int):
            rank = value
        else:
            raise TypeError(
                f"DatasetMap takes (batch, [indices], [rank]) from Dataset.map(batched=True), "
                f"got a {type(value).__name__}; pass batched=True"
            )
    return indices, rank


def prepare_engine_process(rank: int | None, engine_kwargs: Mapping[str, Any]) -> None:
    """Ready this process to build its engine: its GPU by rank, and, in a ``num_proc``
    worker, vLLM's engine core kept in-process (datasets' workers are daemonic, and a
    daemonic process may not start the process vLLM would otherwise start)."""
    select_gpu(rank)
    if may_start_processes():
        return
    parallel = [
        k
        for k in ("tensor_parallel_size", "pipeline_parallel_size")
        if int(engine_kwargs.get(k, 1)) > 1
    ]
    if parallel:
        raise ConfigError(
            f"{', '.join(parallel)} > 1 needs worker processes, which a Dataset.map worker "
            "(num_proc) cannot start: map with num_proc=None and let the engine use the GPUs"
        )
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def select_gpu(rank: int | None) -> None:
    """Make this process see one GPU, chosen by ``rank`` round robin; no-op without a rank or
    a GPU. Must run before CUDA starts in the process, which building the engine does."""
    if rank is None:
        return
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        devices = [d.strip() for d in visible.split(",") if d.strip()]
    else:
        import torch

        devices = [str(i) for i in range(torch.cuda.device_count())]
    if devices:
        os.environ["CUDA_VISIBLE_DEVICES"] = devices[rank % len(devices)]


def _fingerprint(settings: Mapping[str, Any], identity: str) -> str:
    canonical = json.dumps(
        {"v": FINGERPRINT_VERSION, "settings": settings, "model": identity},
        sort_keys=True,
        default=repr,
    )
    return xxhash.xxh3_64_hexdigest(canonical.encode())
