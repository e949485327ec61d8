"""``Dataset.map(DatasetMap(...), batched=True)``: caption a Hugging Face dataset in place.

``DatasetMap`` holds a task's settings (model, prompt, columns, sampling); ``ds.map`` calls it
batch by batch, with map's own semantics; ``mmbatch.run_dataset(ds, task)`` runs the same task
over the whole dataset as one job (``mmbatch.integrations.dataset_runs``), with the same rows.

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
* A plain call returns once its batch is done, having submitted the next batch's rows of
  the dataset being mapped, so that the engine does not drain between two calls; a row takes
  such an answer only where it is the request submitted at its place
  (``mmbatch.integrations.lookahead``).
* With ``with_rank=True`` each worker gets a rank, which picks its GPU (round robin over
  ``CUDA_VISIBLE_DEVICES``, or every GPU torch sees) before the engine starts. ``num_proc``
  workers are daemonic processes, which may not start processes of their own, so there the
  engine runs in the worker (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), one GPU each. A worker
  forked from a process that mapped before builds its own engine all the same: the
  parent's engine, pipeline and look-ahead stay the parent's (``mmbatch.lifetime``).
* A batch is a dict of columns; the answer is two new columns of the same length, ``text``
  and ``error`` (with ``with_usage=True`` also ``finish_reason``, ``prompt_tokens``,
  ``output_tokens`` and ``cached_tokens``; with ``Sampling(n=...)`` above 1, each text is a
  list of n). One bad row never raises: it gets ``text == ""`` and an ``error`` naming
  the stage and the cause. Both columns are strings, never None, because datasets cannot
  write a column whose first batch is all None (it would have the null type).
* ``Image(decode=False)``, ``Audio(decode=False)`` and ``Video(decode=False)`` cells are
  ``{bytes, path}``: the raw bytes are hashed as they are, like a file's. Decoded ``Image()``
  cells (PIL images) are hashed by mode, size and pixels.
* A cell that holds only a path (a string column, or ``{bytes: None, path}``) is a file on
  this machine, read as the dataset's origin allows (``mmbatch.integrations.dataset_origin``):
  anywhere for the person's own dataset (one built in memory), as a walk of its folder for
  an ``imagefolder`` (no link out of it), inside its own files' folders or
  ``allowed_paths`` for data from elsewhere. Where the rule cannot
  decide (the callable called outside datasets' ``map``), a refused path stops the call with
  the one-argument fix, rather than filling a column with refusals.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import sys
import types
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import xxhash

from mmbatch.engine.builder import may_start_processes
from mmbatch.engine.config import EngineConfig
from mmbatch.engine.identity import model_identity
from mmbatch.engine.logs import VllmLog, library_log_file
from mmbatch.errors import ConfigError, ItemFailure
from mmbatch.integrations.dataset_origin import (
    UNKNOWN,
    DatasetOrigin,
    folder_of,
    mapped_dataset,
    origin_of,
    remember_data_files,
)
from mmbatch.integrations.lookahead import LookAhead, MapPlace, Predict, map_place
from mmbatch.jobs import Job, rows_of, run_in_memory, start_in_memory
from mmbatch.lifetime import forgotten_in_forked_children
from mmbatch.media.options import MediaOptions
from mmbatch.output.rows import output_row
from mmbatch.row_schema import TOKEN_COLUMNS
from mmbatch.sources.cells import BadCell, media_ref
from mmbatch.sources.paths import LocalPaths
from mmbatch.types import ItemError, Modality, Request, Result, Sampling

if TYPE_CHECKING:
    from mmbatch.engine.base import Engine

# Before any dataset this face may be handed is loaded, where the caller imports it first.
remember_data_files()

FINGERPRINT_VERSION = "4"
"""Bumped when the rows this callable writes change for the same settings."""
WIDEN = "DatasetMap(allowed_paths=[DIR])"
FEATURE_MODALITIES: dict[str, Modality] = {"Image": "image", "Audio": "audio", "Video": "video"}
"""The modality of a column by its datasets feature's type."""


@dataclass(frozen=True, eq=False)
class DatasetMap:
    """A picklable ``Dataset.map`` function that adds ``text`` and ``error`` columns.

    >>> ds = ds.cast_column("image", datasets.Image(decode=False))  # hash the raw bytes
    >>> ds = ds.map(DatasetMap("Qwen/Qwen2.5-VL-3B-Instruct", "Describe."), batched=True,
    ...             batch_size=512, with_rank=True)
    """

    model: str
    prompt: str
    _: KW_ONLY
    column: str = "image"
    """The media column."""
    modality: Modality | None = None
    """What the column holds; None: what its feature says (``Audio``, ``Video``), else image."""
    prompt_column: str | None = None
    """A column holding each row's own prompt, instead of ``prompt``."""
    system: str | None = None
    engine_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Settings for ``vllm.LLM``, passed as they are."""
    sampling: Sampling = field(default_factory=Sampling)
    media: MediaOptions = field(default_factory=MediaOptions)
    """How media are decoded (``ImageOptions(max_pixels=...)``, video frames, audio rate)."""
    text_column: str = "text"
    error_column: str = "error"
    with_usage: bool = False
    """Also ``finish_reason`` and the token counts (``TOKEN_COLUMNS``)."""
    allowed_paths: Sequence[str] = ()
    """Folders whose files a path cell may name, besides what the dataset's origin allows."""
    vllm_log: VllmLog = "auto"
    """Where vLLM's log goes (``mmbatch.engine.logs.VllmLog``): a file of its own by default,
    decided in the process that builds the engine."""
    fingerprint: str = field(init=False)
    """The task's identity (settings and the model's content), stable across processes."""

    def __post_init__(self) -> None:
        if self.text_column == self.error_column:
            raise ConfigError(f"text and error columns must differ, both are {self.text_column!r}")
        # Normalised once, here, so that workers and later runs hash the same state.
        object.__setattr__(self, "engine_kwargs", dict(self.engine_kwargs))
        object.__setattr__(self, "allowed_paths", tuple(str(p) for p in self.allowed_paths))
        revision = self.engine_kwargs.get("revision")
        identity = model_identity(self.model, str(revision) if revision else None)
        object.__setattr__(self, "fingerprint", _fingerprint(self._settings(), identity))
        _hash_by_fingerprint()

    @property
    def engine_config(self) -> EngineConfig:
        return EngineConfig(self.model, dict(self.engine_kwargs))

    @property
    def paths(self) -> LocalPaths:
        """The folders the caller allowed, as the path rule takes them."""
        return LocalPaths(tuple(self.allowed_paths), widen=WIDEN)

    def __call__(self, batch: Mapping[str, Sequence[Any]], *indices_and_rank: Any) -> Any:
        """Caption one batch: its new columns (for the ``pipelined`` twin, a coroutine giving
        them). datasets appends the rows' indices (``with_indices=True``, a list) and the
        worker's rank (``with_rank=True``, an int or None), in that order."""
        if self._coroutine:
            return self._batch_coroutine(batch, indices_and_rank)
        job, engine, size = self._batch_job(batch, indices_and_rank)
        place = map_place(size)
        if engine is None:
            if place is not None and place.last:
                _LOOKAHEAD.finish()
            return self.columns(job.requests, [], size)
        if place is None:
            rows, _ = run_in_memory(job, engine)
        else:
            key = (self.fingerprint, id(engine), place.dataset._fingerprint, place.offset)
            rows = _LOOKAHEAD.run(key, job, engine, place, self._predictor(place))
        return self.columns(job.requests, rows, size)

    @property
    def pipelined(self) -> DatasetMap:
        """This callable as a coroutine function: ``Dataset.map`` then keeps many batches in
        flight at once, all on this process's one engine (a plain call keeps the next batch
        in flight: ``mmbatch.integrations.lookahead``)::

            ds.map(captioner.pipelined, batched=True, batch_size=256, with_rank=True)

        Its rows are the plain call's, and so is its datasets cache: switching between the
        two reuses it.
        """
        twin = copy.copy(self)
        object.__setattr__(twin, "_coroutine", True)
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
            return self.columns(job.requests, [], size)
        submission = start_in_memory(job, engine)
        loop = asyncio.get_running_loop()
        finished: asyncio.Future[None] = loop.create_future()
        submission.on_done(lambda: loop.call_soon_threadsafe(_resolve, finished))
        await finished
        rows, _ = rows_of(submission)
        return self.columns(job.requests, rows, size)

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
        dataset = mapped_dataset()
        origin = origin_of(dataset) if dataset is not None else UNKNOWN
        prompts = batch[self.prompt_column] if self.prompt_column else None
        rows = CellRows(self, origin, self.modality_of(dataset))
        requests = rows.requests(range(len(cells)), indices, cells, prompts)
        rows.say_refusals(len(cells))
        job = Job(requests, self.sampling, self.media)
        if not any(r.error is None for r in requests):
            return job, None, len(cells)
        return job, self._engine(rank, rows.modality, _rows_mapped(dataset)), len(cells)

    def _predictor(self, place: MapPlace) -> Predict:
        """How the look-ahead reads the rows at shard positions of the map at ``place`` and
        makes their requests, each named by its position (a guess: the call for their
        batch takes an answer only for a request that is its own, ``lookahead``)."""

        def predict(positions: range) -> list[Request]:
            dataset = place.dataset
            columns = [self.column, *([self.prompt_column] if self.prompt_column else [])]
            batch = dataset.select_columns(columns)[positions.start : positions.stop]
            prompts = batch[self.prompt_column] if self.prompt_column else None
            rows = CellRows(self, origin_of(dataset), self.modality_of(dataset))
            shown = range(place.offset + positions.start, place.offset + positions.stop)
            indices = shown if place.with_indices else None
            return rows.requests(positions, indices, batch[self.column], prompts)

        return predict

    def modality_of(self, dataset: Any) -> Modality:
        """What the media column holds: ``modality``, else the column's feature's kind."""
        if self.modality is not None:
            return self.modality
        features = getattr(dataset, "features", None) or {}
        kind = type(features[self.column]).__name__ if self.column in features else ""
        return FEATURE_MODALITIES.get(kind, "image")

    def columns(
        self, requests: Sequence[Request], rows: Sequence[Mapping[str, Any]], size: int
    ) -> dict[str, list[Any]]:
        """The new columns for ``size`` rows whose requests are ``requests`` (ids: the row's
        position) and whose finished rows are ``rows``: exactly one (text, error) per row, in
        order; a missing one is a bug."""
        by_id = {row["id"]: row for row in rows}
        for request in requests:
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

    def _engine(self, rank: int | None, modality: Modality, rows: int | None) -> Engine:
        """This process's engine, built on its first batch and laid out, as a job's, for the
        ``rows`` the map runs here (None: unknown)."""
        from mmbatch.engine.registry import shared_engine

        # The engine is built on this process's first batch, so the GPU is chosen before CUDA
        # starts; later calls narrow CUDA_VISIBLE_DEVICES to the device it already names.
        prepare_engine_process(rank, self.engine_kwargs)
        config = EngineConfig(self.model, dict(self.engine_kwargs), self.log_file())
        return shared_engine(config, {modality: 1}, rows)

    def log_file(self) -> str | None:
        """Where this process's engine writes vLLM's log (``vllm_log``)."""
        return library_log_file(self.vllm_log)

    def _settings(self) -> dict[str, Any]:
        return {
            # The model is its identity (a local one by content, whatever its path's spelling).
            "engine": dict(self.engine_kwargs),
            "prompt": self.prompt,
            "column": self.column,
            "modality": self.modality,
            "prompt_column": self.prompt_column,
            "system": self.system,
            "sampling": asdict(self.sampling),
            "media": [o.cache_token() for o in (self.media.image, self.media.video)]
            + [self.media.audio.cache_token()],
            "columns": [self.text_column, self.error_column, self.with_usage],
            "allowed_paths": list(self.allowed_paths),
        }

    def __repr__(self) -> str:
        return f"DatasetMap({self.model!r}, fingerprint={self.fingerprint!r})"


class CellRows:
    """Turns a task's media cells into requests, by the path rule of the dataset's origin,
    and says where that rule refused paths: a row refused is that row's error, but a rule
    that cannot decide must not fill a column with refusals (``say_refusals``)."""

    def __init__(self, task: DatasetMap, origin: DatasetOrigin, modality: Modality) -> None:
        self.task = task
        self.origin = origin
        self.modality: Modality = modality
        self.paths = origin.paths(task.paths)
        self.refused: list[str] = []
        """The files named by the path cells refused so far."""

    def request(self, row_id: str, label: str, cell: Any, prompt: Any) -> Request:
        """The request for one cell (``prompt``: the row's own, where the task reads a
        prompt column); ``label`` names the row in errors. An unusable row carries its
        error."""
        task = self.task
        prompt = task.prompt if task.prompt_column is None else prompt
        try:
            if not isinstance(prompt, str) or not prompt:
                raise BadCell(f"{label}: {task.prompt_column!r} holds no prompt: {prompt!r}")
            ref = media_ref(cell, self.modality, label, self.paths, self.origin.folder)
        except ItemFailure as exc:
            if exc.kind == "not_allowed":
                self.refused.append(_named_path(cell, self.origin.folder))
            return Request(row_id, "", error=ItemError(exc.stage, str(exc), exc.kind))
        return Request(row_id, prompt, (ref,), task.system)

    def requests(
        self,
        ids: Sequence[int],
        indices: Sequence[int] | None,
        cells: Sequence[Any],
        prompts: Sequence[Any] | None,
    ) -> list[Request]:
        """The requests for a batch of ``cells`` (and the rows' own ``prompts``), named by
        ``ids``; ``indices`` (``with_indices=True``) name the rows in errors."""
        return [
            # The error lands in the row's own cell, so without indices (with_indices=True)
            # it names no row rather than a position in the batch, which reads as a row.
            self.request(
                str(ids[i]),
                f"row {indices[i]}" if indices is not None else "this row",
                cell,
                prompts[i] if prompts is not None else None,
            )
            for i, cell in enumerate(cells)
        ]

    def say_refusals(self, rows: int) -> None:
        """Stop with the one-argument fix where the dataset's origin is unknown and the
        caller allowed no folder (every path would be refused, silently); where the rule
        decided, say once how many rows it refused and how to allow them."""
        if not self.refused:
            return
        folder = folder_of(self.refused[0])
        fix = f"allowed_paths=[{folder!r}]"
        if self.origin.trust == "unknown" and not self.task.allowed_paths:
            raise ConfigError(
                f"DatasetMap cannot tell where this dataset came from, and its cells name files "
                f"on this machine ({self.refused[0]!r}): if the dataset is yours, allow their "
                f"folder with DatasetMap(..., {fix}), or run the whole dataset with "
                "mmbatch.run_dataset(ds, task), which reads a local dataset's own files"
            )
        key = (self.origin.reason, folder)
        if key not in _SAID:
            _SAID.add(key)
            print(
                f"mmbatch: {len(self.refused)} of {rows} rows name files on this machine "
                f"outside the folders allowed for {self.origin.reason} (e.g. "
                f"{self.refused[0]!r}): each is its row's error; if they are yours, allow "
                f"their folder with DatasetMap(..., {fix})",
                file=sys.stderr,
            )


_LOOKAHEAD = LookAhead()
"""This process's plain calls' look-aheads (``mmbatch.integrations.lookahead``)."""


def _forget_lookahead_in_child() -> object:
    """The parent's look-aheads, forgotten in a forked child: they wait on the parent's
    engine."""
    global _LOOKAHEAD
    parents, _LOOKAHEAD = _LOOKAHEAD, LookAhead()
    return parents


forgotten_in_forked_children(_forget_lookahead_in_child)

_SAID: set[tuple[str, str]] = set()
"""Refusals said in this process: once per origin and folder, not once per batch."""


def _rows_mapped(dataset: Any) -> int | None:
    """How many rows the map runs in this process (a ``num_proc`` worker maps its shard),
    where known: the size its engine is laid out for, as a job's is."""
    rows = getattr(dataset, "num_rows", None)
    return rows if isinstance(rows, int) else None


def _named_path(cell: Any, folder: str | None) -> str:
    """Where the path ``cell`` names leads (relative to the dataset's ``folder``): the file
    whose folder a refusal tells the caller to allow."""
    path = cell.get("path") if isinstance(cell, dict) else cell
    return os.path.realpath(os.path.join(folder or "", str(path)))


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
