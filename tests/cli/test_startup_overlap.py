"""The engine's start overlaps the reading of the job's inputs (``mmbatch.engine.early``):
shown by the order of events, with a fake engine whose start records when it was entered
and a batch file whose parse, an engine's start being begun, waits for it to be entered (else
the start and the parse race on a loaded machine)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fake_engine import FakeEngine
from processes import starts_ended

from mmbatch import cli
from mmbatch.cli import EXIT_JOB_FAILED, EXIT_OK
from mmbatch.engine import registry
from mmbatch.engine.early import EngineStart
from mmbatch.openai_batch import reader

PARSE_SECONDS = 0.5
"""How long a parse takes where no engine's start was begun."""
ENTERED_WITHIN = 30.0
"""How long a parse waits, at most, for an engine's start begun to be entered."""


class Events:
    """What happened, in order, with the engines it started."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.engines: list[ClosedEngine] = []
        self.media: list[dict[str, int]] = []
        self.begun = threading.Event()
        """An engine's start was begun in the background."""
        self.entered = threading.Event()

    def engine(self, host: Any, media: dict[str, int], layout: Any) -> tuple[Any, Any]:
        self.names.append("engine start entered")
        self.entered.set()
        self.media.append(dict(media))
        engine = ClosedEngine()
        self.engines.append(engine)
        return engine, layout


class ClosedEngine(FakeEngine):
    closed = False

    def close(self) -> None:
        self.closed = True
        super().close()


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> Events:
    """The engine's start and the batch file's parse, recorded (the parse made slow)."""
    seen = Events()
    parse = reader.read_batch

    def slow_parse(*args: Any, **kwargs: Any) -> Any:
        seen.names.append("parse begun")
        if seen.begun.is_set():  # a start begun before: entered meanwhile, if it overlaps
            seen.entered.wait(ENTERED_WITHIN)
        else:
            time.sleep(PARSE_SECONDS)
        try:
            return parse(*args, **kwargs)
        finally:
            seen.names.append("parse done")

    begin = EngineStart.begin

    def noted(cls: type[EngineStart], config: Any, media: Any, requests: int | None) -> Any:
        start = begin(config, media, requests)
        if start._thread is not None:
            seen.begun.set()
        return start

    monkeypatch.setattr(registry, "shared_engine_and_layout", seen.engine)
    monkeypatch.setattr(reader, "read_batch", slow_parse)
    monkeypatch.setattr(EngineStart, "begin", classmethod(noted))
    return seen


def _batch(tmp_path: Path, lines: list[dict[str, Any]]) -> tuple[Path, Path]:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    requests = tmp_path / "requests.jsonl"
    requests.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return model, requests


def _line(custom_id: str, images: int = 1) -> dict[str, Any]:
    pixel = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="  # noqa: E501
    parts = [{"type": "image_url", "image_url": {"url": pixel}}] * images
    content = [*parts, {"type": "text", "text": "Describe."}]
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 8}
    return {"custom_id": custom_id, "url": "/v1/chat/completions", "body": body}


def _argv(model: Path, requests: Path, out: Path) -> list[str]:
    return ["run-openai-batch", str(requests), "--model", str(model), "--out", str(out),
            "--no-progress", "--decode-workers", "0"]  # fmt: skip


def test_a_batch_files_engine_starts_while_the_file_is_parsed(
    tmp_path: Path, events: Events
) -> None:
    """``run-openai-batch`` begins its engine before the file's parse ends, sized for the
    most pictures a line names, and runs the job on that engine."""
    model, requests = _batch(tmp_path, [_line("a"), _line("b", images=2)])
    assert cli.main(_argv(model, requests, tmp_path / "o.jsonl")) == EXIT_OK
    assert events.names.index("engine start entered") < events.names.index("parse done")
    assert events.names.count("engine start entered") == 1
    assert events.media == [{"image": 2}]
    assert len((tmp_path / "o.jsonl").read_text().splitlines()) == 2
    assert not events.engines[0].closed  # the job's: kept in the registry as any


def test_an_engine_begun_for_a_file_refused_whole_is_closed(
    tmp_path: Path, events: Events, capsys: pytest.CaptureFixture[str]
) -> None:
    """A batch file refused whole (a custom_id used twice) exits 2 with one line and no
    output, and the engine begun while it was read is closed."""
    model, requests = _batch(tmp_path, [_line("a"), _line("a")])
    assert cli.main(_argv(model, requests, tmp_path / "o.jsonl")) == EXIT_JOB_FAILED
    assert "custom_id 'a' is used twice" in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()
    starts_ended()
    assert [e.closed for e in events.engines] == [True]


def test_a_resumed_job_starts_its_engine_once_it_knows_what_is_left(
    tmp_path: Path, events: Events
) -> None:
    """Where the output holds rows, the engine starts after the file is read, and only
    if something is left: a finished job starts none."""
    model, requests = _batch(tmp_path, [_line("a"), _line("b")])
    out = tmp_path / "o.jsonl"
    assert cli.main(_argv(model, requests, out)) == EXIT_OK
    events.names.clear()
    assert cli.main(_argv(model, requests, out)) == EXIT_OK
    assert events.names == ["parse begun", "parse done"]


def test_a_batch_file_is_counted_from_its_bytes(tmp_path: Path) -> None:
    """Its lines, and the most image parts a line names (at least one), without JSON."""
    from mmbatch.openai_batch.reader import BatchSize, count_batch

    _, requests = _batch(tmp_path, [_line("a", images=3), _line("b"), _line("c", images=0)])
    requests.write_text(requests.read_text() + "\n\n")
    assert count_batch(requests) == BatchSize(lines=3, max_images=3)
    assert count_batch(tmp_path / "absent.jsonl") is None
    assert count_batch("s3://bucket/requests.jsonl") is None
