"""A plain ``ds.map(DatasetMap(...))`` call's look-ahead, with a fake engine on a real
``datasets.Dataset``: the next batch is in the engine before this batch's last row is done,
so the engine never drains between batches, and every row still gets its own answer, by
identity, whatever the map does (indices or none, a filtered dataset, ``num_proc`` shards, a
function that hands over a batch other than the dataset's)."""

from __future__ import annotations

import io
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import datasets
import pytest
from fake_engine import FakeEngine
from PIL import Image

from mmbatch.integrations.hf_datasets import DatasetMap
from mmbatch.pipeline import close_pipeline, pipeline_for
from mmbatch.types import LoadedRequest, MediaItem, Result, Sampling

BATCH = 12
"""Rows per batch: three times the engine's capacity, so a batch takes steps to go through."""


HOLD_SECONDS = 30.0
"""The longest a paced engine holds a batch's last row for the next batch's to come."""


class PacedEngine(FakeEngine):
    """Finishes its oldest request first, one a step, each step taking a while (as a real
    model's does), holding four at a time; logs each request's arrival and finish, in
    order, by prompt.

    Where a test says which batch each prompt is of (``batch_of_prompt``) and which batches
    are their shard's last (``last_batches``), the engine keeps the last row it holds of a
    batch unfinished until a row of a later batch is in (``HOLD_SECONDS`` at most), as a real
    engine's slowest request is still running when a look-ahead comes: whether the next batch
    comes in time is then the map's doing, not the machine's load. A map that submits the
    next batch only after this one's rows are back finds the row held, and its batch done
    before the next one begins."""

    batch_of_prompt: Callable[[str], int] | None = None
    last_batches: frozenset[int] = frozenset()

    def __init__(self, log_file: Path) -> None:
        super().__init__(per_step=1, capacity=4, step_seconds=0.02)
        self.log: list[tuple[str, str]] = []
        self.log_file = log_file
        """Where the log is kept too, for a test to read from a worker process's engine."""
        self._prompts: dict[str, str] = {}
        self._held_since: float | None = None

    def add(self, request: LoadedRequest, media: Sequence[MediaItem], sampling: Sampling) -> None:
        super().add(request, media, sampling)
        self._prompts[request.id] = request.request.prompt
        self.log.append(("add", request.request.prompt))

    def step(self) -> list[Result]:
        time.sleep(self.step_seconds)
        if self._holds_its_batch_s_last_row():
            return []
        done, self._queue = self._queue[:1], self._queue[1:]
        self.log.extend(("done", self._prompts[r.request_id]) for r in done)
        self.log_file.write_text(json.dumps(self.log))
        return done

    def _holds_its_batch_s_last_row(self) -> bool:
        batch = type(self).batch_of_prompt
        if batch is None or len(self._queue) != 1:
            self._held_since = None
            return False
        mine = batch(self._prompts[self._queue[0].request_id])
        if mine in self.last_batches or any(batch(p) > mine for p in self._prompts.values()):
            self._held_since = None
            return False
        if self._held_since is None:
            self._held_since = time.monotonic()
        return time.monotonic() - self._held_since < HOLD_SECONDS


@pytest.fixture
def engines(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[dict[int, PacedEngine]]:
    """Each process's engine, a paced fake one built on its first batch (a ``num_proc``
    worker builds its own, as it would its vLLM engine)."""
    built: dict[int, PacedEngine] = {}
    lock = threading.Lock()

    def engine(task: DatasetMap, rank: Any, modality: Any, rows: Any) -> PacedEngine:
        with lock:
            pid = os.getpid()
            if pid not in built:
                built[pid] = PacedEngine(tmp_path / f"engine-{pid}.json")
            return built[pid]

    monkeypatch.setattr(DatasetMap, "_engine", engine)
    yield built
    for each in built.values():
        close_pipeline(each)


def picture(shade: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (8, 8), (shade, 255 - shade, 40)).save(out, format="PNG")
    return out.getvalue()


def dataset(rows: int) -> datasets.Dataset:
    """Rows each with a prompt of their own (``row N``) and one of five pictures: every
    answer names its row, and pictures repeat across batches."""
    cells = [{"bytes": picture(n % 5 * 50), "path": None} for n in range(rows)]
    prompts = [f"row {n}" for n in range(rows)]
    ds = datasets.Dataset.from_dict({"image": cells, "prompt": prompts, "n": list(range(rows))})
    return ds.cast_column("image", datasets.Image(decode=False))


def task(tmp_path: Path) -> DatasetMap:
    return DatasetMap(str(tmp_path), "unused", prompt_column="prompt")


def assert_own_answers(out: datasets.Dataset, prompts: Sequence[str] | None = None) -> None:
    """Each row's answer is for its own prompt (the fake engine echoes it)."""
    prompts = list(prompts) if prompts is not None else list(out["prompt"])
    assert out["error"] == [""] * out.num_rows
    for text, prompt in zip(out["text"], prompts, strict=True):
        assert text.endswith(f"|{prompt}"), (text, prompt)


def batch_of(prompt: str) -> int:
    return int(prompt.split()[1]) // BATCH


def held_for_the_next(
    monkeypatch: pytest.MonkeyPatch, batch: Callable[[str], int], last: Sequence[int]
) -> None:
    """Paced engines (a ``num_proc`` worker's too) hold each batch's last row until the
    next batch is in: ``batch`` tells a prompt's batch, ``last`` the shards' last ones."""
    monkeypatch.setattr(PacedEngine, "batch_of_prompt", staticmethod(batch))
    monkeypatch.setattr(PacedEngine, "last_batches", frozenset(last))


def assert_looked_ahead(log: Sequence[tuple[str, str]], batches: range) -> None:
    """Each batch but the last had the next one's rows in the engine before its own last
    row was done: the engine did not drain between them."""
    held = [0]
    for what, _ in log:
        held.append(held[-1] + (1 if what == "add" else -1))
    for batch in batches[:-1]:
        next_added = min(i for i, (w, p) in enumerate(log) if w == "add" and batch_of(p) > batch)
        last_done = max(i for i, (w, p) in enumerate(log) if w == "done" and batch_of(p) == batch)
        assert next_added < last_done, (batch, log)
        assert held[last_done + 1] > 0, (batch, log)  # not drained when the batch is done


@pytest.mark.parametrize("with_indices", [False, True])
def test_the_next_batch_is_in_the_engine_before_this_one_is_done(
    tmp_path: Path,
    engines: dict[int, PacedEngine],
    with_indices: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    held_for_the_next(monkeypatch, batch_of, last=[3])
    ds = dataset(4 * BATCH)
    out = ds.map(task(tmp_path), batched=True, batch_size=BATCH, with_indices=with_indices)
    assert_own_answers(out)
    [engine] = engines.values()
    log = engine.log
    assert Counter(prompt for what, prompt in log if what == "add") == Counter(ds["prompt"])
    assert_looked_ahead(log, range(4))
    # The last batch guessed nothing: the map leaves nothing running.
    assert not pipeline_for(engine).busy
    assert engine.num_unfinished() == 0


def test_a_filtered_dataset_and_a_dropped_last_batch(
    tmp_path: Path, engines: dict[int, PacedEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = dataset(5 * BATCH).filter(lambda row: row["n"] % 3 != 1)
    index = {prompt: n for n, prompt in enumerate(ds["prompt"])}
    held_for_the_next(monkeypatch, lambda prompt: index[prompt] // BATCH, last=[2])
    out = ds.map(task(tmp_path), batched=True, batch_size=BATCH, drop_last_batch=True)
    assert out.num_rows == ds.num_rows // BATCH * BATCH == 3 * BATCH
    assert_own_answers(out)
    [engine] = engines.values()
    added = Counter(prompt for what, prompt in engine.log if what == "add")
    assert added == Counter(out["prompt"])  # each row once: guessed right, none beyond
    # Batches of the filtered rows: a batch is BATCH rows of it, not of the whole dataset.
    place = {prompt: f"row {index}" for index, prompt in enumerate(out["prompt"])}
    assert_looked_ahead([(what, place[prompt]) for what, prompt in engine.log], range(3))
    assert not pipeline_for(engine).busy


def test_decoded_pictures_are_guessed_by_their_pixels(
    tmp_path: Path, engines: dict[int, PacedEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    held_for_the_next(monkeypatch, batch_of, last=[2])
    ds = dataset(3 * BATCH).cast_column("image", datasets.Image())  # PIL images
    out = ds.map(task(tmp_path), batched=True, batch_size=BATCH)
    assert_own_answers(out)
    [engine] = engines.values()
    assert_looked_ahead(engine.log, range(3))  # a guess that missed would stop after one


def reversed_prompts(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
    return {**batch, "prompt": batch["prompt"][::-1]}


def one_prompt_changed(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
    return {**batch, "prompt": [f"{batch['prompt'][0]} changed", *batch["prompt"][1:]]}


@pytest.mark.parametrize("change", [reversed_prompts, one_prompt_changed])
def test_a_batch_other_than_the_one_guessed_gets_its_own_answers(
    tmp_path: Path,
    engines: dict[int, PacedEngine],
    change: Callable[[dict[str, list[Any]]], dict[str, list[Any]]],
) -> None:
    """A function that changes the batch before handing it over: datasets' frames name the
    rows guessed, yet they are not the rows asked for. Each row that is not as guessed runs
    itself; a look-ahead that missed every row stops the guessing."""
    captioner = task(tmp_path)
    ds = dataset(4 * BATCH)
    out = ds.map(lambda batch: captioner(change(batch)), batched=True, batch_size=BATCH)
    batches = [ds[start : start + BATCH] for start in range(0, ds.num_rows, BATCH)]
    handed = [prompt for batch in batches for prompt in change(batch)["prompt"]]
    assert_own_answers(out, handed)
    [engine] = engines.values()
    added = [prompt for what, prompt in engine.log if what == "add"]
    if change is reversed_prompts:
        # Batch 1 was guessed, every row missed, and ran itself: no guess after that.
        assert len(added) == ds.num_rows + BATCH
    else:
        # Each batch's other rows were taken as guessed; its changed row ran itself.
        guessed = [p for p in added if p not in handed]
        assert guessed == ["row 12", "row 24", "row 36"]
        assert Counter(p for p in added if p in handed) == Counter(handed)
    assert not pipeline_for(engine).busy


def test_num_proc_shards_each_look_ahead_in_their_own(
    tmp_path: Path,
    engines: dict[int, PacedEngine],
    environ_kept: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    held_for_the_next(monkeypatch, batch_of, last=[2, 5])  # a shard of three batches each
    ds = dataset(6 * BATCH)
    out = ds.map(
        task(tmp_path),
        batched=True,
        batch_size=BATCH,
        num_proc=2,
        with_rank=True,
        with_indices=True,
    )
    assert out["n"] == list(range(ds.num_rows))
    assert_own_answers(out)
    shards = sorted(tmp_path.glob("engine-*.json"))
    assert len(shards) == 2  # an engine in each worker
    for shard in shards:  # three batches each, looked ahead within the shard
        log = [(what, prompt) for what, prompt in json.loads(shard.read_text())]
        first = min(batch_of(prompt) for _, prompt in log)
        assert_looked_ahead(log, range(first, first + 3))


def decode_in_a_fork(data: bytes) -> None:
    from mmbatch.media.decode import ImageJob, decode
    from mmbatch.media.decoders import decode_pool
    from mmbatch.media.options import ImageOptions

    pool = decode_pool(1)
    pool.submit(decode, ImageJob("k", data, ImageOptions())).result(timeout=30)
    pool.shutdown()  # or the process waits for its worker at exit


def test_a_forked_worker_decodes_in_pools_of_its_own() -> None:
    """datasets' ``num_proc`` workers are forked from a process that may have decoded
    already (an earlier map): the decode pool they inherit, copied without the threads that
    feed it, would take their jobs and never run them, and the map would hang."""
    import multiprocessing

    from mmbatch.media.decode import ImageJob, decode
    from mmbatch.media.decoders import decode_pool
    from mmbatch.media.options import ImageOptions

    data = picture(0)
    decode_pool(1).submit(decode, ImageJob("k", data, ImageOptions())).result(timeout=60)
    worker = multiprocessing.get_context("fork").Process(target=decode_in_a_fork, args=(data,))
    worker.start()
    worker.join(timeout=90)
    if worker.is_alive():
        worker.kill()
        worker.join()
    assert worker.exitcode == 0
