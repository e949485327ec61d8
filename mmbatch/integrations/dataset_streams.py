"""``run_dataset`` over a streaming dataset (``IterableDataset``), in bounded memory.

A stream can be read only once, in order, and may be larger than memory. So it is read in
windows of ``WINDOW_ROWS`` rows, each written, as datasets stores it (media undecoded),
to an Arrow file in the job's folder, where it is run as a job of its own on the engine
the first window started (``mmbatch.integrations.dataset_runs``): memory holds the rows
being written and the media the engine is on, never the stream. The result is those
windows, with their new columns, as one memory-mapped ``Dataset``.

Windows are the unit of resumption: after each one is written, the stream's position
(``IterableDataset.state_dict()``) is saved beside it, so a job killed at any moment
resumes from the last window written (its rows that had finished are not run again, as in
any job) and reads on from where the stream stood, without reading again what came before
where the stream can skip (``load_state_dict``; else it is read past). The job's folder is
named by the task and by what the stream reads (its sources and its transforms), so the
same call on the same stream finds it; a stream whose transforms cannot be named the same
way twice (a function datasets cannot hash) starts a new job each time.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmbatch.integrations.dataset_origin import DatasetOrigin, origin_of, sources_of
from mmbatch.integrations.dataset_tables import forget, job_name, run_table
from mmbatch.integrations.hf_datasets import DatasetMap
from mmbatch.pipeline import RunConfig

if TYPE_CHECKING:
    import datasets

WINDOW_ROWS = 8192
"""Rows per window: enough that one window keeps every engine full and its plan finds the
window's shared media, few enough that rewriting a window after a kill costs little."""
PROGRESS_FILE = "stream.json"


@dataclass(frozen=True)
class StreamProgress:
    """How far a stream's job has read: the windows written, the stream's position after
    the last of them, and whether the stream ended."""

    windows: int = 0
    position: dict[str, Any] | None = None
    ended: bool = False

    @classmethod
    def load(cls, folder: Path) -> StreamProgress:
        path = folder / PROGRESS_FILE
        if not path.is_file():
            return cls()
        saved = json.loads(path.read_text(encoding="utf-8"))
        return cls(int(saved["windows"]), saved.get("position"), bool(saved.get("ended")))

    def save(self, folder: Path) -> None:
        """Written whole or not at all: a kill leaves the last progress saved."""
        path = folder / PROGRESS_FILE
        partial = path.with_name(f"{PROGRESS_FILE}.partial")
        state = {"windows": self.windows, "position": self.position, "ended": self.ended}
        partial.write_text(json.dumps(state), encoding="utf-8")
        os.replace(partial, path)


def run_stream(
    stream: datasets.IterableDataset,
    task: DatasetMap,
    root: Path,
    run: RunConfig | None,
    load_from_cache_file: bool,
) -> datasets.Dataset:
    """``run_dataset`` for a stream: its rows, read once in windows, with ``task``'s columns."""
    import datasets

    origin = origin_of(stream)  # the windows' files are ours: the stream's origin rules
    folder = root / job_name(stream_identity(stream), task)
    if not load_from_cache_file:
        forget(folder)
    folder.mkdir(parents=True, exist_ok=True)
    progress = StreamProgress.load(folder)
    raw = stream.decode(False)  # media as datasets stores them, bytes or paths: no decoding
    rows = _resumed(raw, progress)
    parts: list[datasets.Dataset] = []
    for index in range(progress.windows):
        parts.append(_run_window(_window_file(folder, index), task, origin, run))
    while not progress.ended:
        written = _write_window(rows, raw, _window_file(folder, progress.windows))
        ended = written < WINDOW_ROWS
        windows = progress.windows + (1 if written else 0)
        progress = StreamProgress(windows, _position(raw), ended)
        progress.save(folder)
        if written:
            parts.append(_run_window(_window_file(folder, windows - 1), task, origin, run))
    if not parts:
        raise_empty(task)
    result = datasets.concatenate_datasets(parts)
    failed = sum(1 for error in result[task.error_column] if error)
    print(
        f"mmbatch: the stream's {result.num_rows} rows in {len(parts)} windows: "
        f"{result.num_rows - failed} ok, {failed} failed; the job is in {folder}",
        file=sys.stderr,
    )
    return result


def _run_window(
    path: Path, task: DatasetMap, origin: DatasetOrigin, run: RunConfig | None
) -> datasets.Dataset:
    """One window's rows with their columns (run now, or loaded where its job finished);
    its job says one line, not a summary each."""
    import datasets

    from mmbatch.jobs import JobReport

    def one_line(report: JobReport) -> list[str]:
        counts = f"{report.output.ok} ok, {report.output.failed} failed"
        return [f"mmbatch: {path.stem}: {report.total} rows, {counts}"]

    # Each window's job is named by the window, whatever datasets makes of its file.
    window = datasets.Dataset.from_file(str(path))
    return run_table(window, task, origin, path.parent / "jobs", run, one_line, path.stem)


def _resumed(raw: datasets.IterableDataset, progress: StreamProgress) -> Iterator[dict[str, Any]]:
    """The stream's rows from where the last window written ended."""
    if progress.windows and progress.position is not None:
        raw.load_state_dict(progress.position)
        return iter(raw)
    return islice(iter(raw), progress.windows * WINDOW_ROWS, None)


def _write_window(rows: Iterator[dict[str, Any]], raw: datasets.IterableDataset, path: Path) -> int:
    """Write the next ``WINDOW_ROWS`` rows to the Arrow file ``path`` (whole or not at all);
    how many there were (0: the stream had ended, and no file is written)."""
    from datasets.arrow_writer import ArrowWriter

    partial = path.with_name(path.name + ".partial")
    count = 0
    writer = ArrowWriter(features=raw.features, path=str(partial))
    try:
        for row in islice(rows, WINDOW_ROWS):
            writer.write(row)
            count += 1
        writer.finalize()
    finally:
        writer.close()
    if count:
        os.replace(partial, path)
    else:
        partial.unlink(missing_ok=True)
    return count


def _position(raw: datasets.IterableDataset) -> dict[str, Any] | None:
    """The stream's position after the rows read so far, if it can be saved as JSON."""
    try:
        position = raw.state_dict()
        json.dumps(position)
    except (TypeError, ValueError, NotImplementedError):
        return None
    return position  # type: ignore[no-any-return]


def _window_file(folder: Path, index: int) -> Path:
    return folder / f"window-{index:05d}.arrow"


def stream_identity(stream: datasets.IterableDataset) -> str:
    """What the stream reads, named the same way in every process: its sources (a builder's
    name and configuration, or a dataset's fingerprint) and each step between them and the
    rows (its kind, settings and functions, hashed as datasets hashes ``map``'s)."""
    from datasets.fingerprint import Hasher

    parts: list[Any] = [str(stream.features)]
    for source in sources_of(stream._ex_iterable):
        fingerprint = getattr(source, "_fingerprint", None)
        config_id = getattr(source, "config_id", None)
        parts.append(fingerprint or f"{getattr(source, 'name', '?')}:{config_id}")
    for step in _steps(stream._ex_iterable):
        settings = {
            key: value
            for key, value in sorted(vars(step).items())
            if isinstance(value, (int, float, str, bool, type(None))) and not key.startswith("_")
        }
        function = getattr(step, "function", None)  # a map's or a filter's
        if function is not None:
            settings["function"] = Hasher.hash(function)
        parts.append([type(step).__name__, settings])
    return json.dumps(parts, sort_keys=True, default=repr)


def _steps(iterable: Any) -> Iterator[Any]:
    """Each examples iterable of a stream's chain, outermost first."""
    yield iterable
    for inner in [getattr(iterable, "ex_iterable", None), *getattr(iterable, "ex_iterables", ())]:
        if inner is not None:
            yield from _steps(inner)


def raise_empty(task: DatasetMap) -> None:
    from mmbatch.errors import ConfigError

    raise ConfigError(f"the stream has no rows to run {task!r} on")
