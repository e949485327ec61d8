"""The pipeline's bookkeeping, against a fake engine (the real one is in test_end_to_end).

Each test takes about a second: a pipeline that hangs (a row it waits for forever) fails
here within a minute, not at the suite's fifteen."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from fake_engine import FakeEngine, Faults, expected_text

from mmbatch.errors import FatalEngineError
from mmbatch.media.options import MediaOptions
from mmbatch.output.sinks import JsonlSink
from mmbatch.pipeline import RunConfig, run_requests
from mmbatch.sources.files import image_requests
from mmbatch.types import MediaRef, Request, Result, Sampling

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def corpus(tmp_path: Path, samples: Path) -> Path:
    """samples/ plus a zero-byte file, a text file named .jpg and a second copy of a picture."""
    folder = tmp_path / "corpus"
    shutil.copytree(samples, folder)
    (folder / "empty.jpg").write_bytes(b"")
    (folder / "text.jpg").write_text("not an image")
    shutil.copyfile(samples / "checkerboard.png", folder / "checker_again.png")
    return folder


def run(requests: list[Request], out: Path, capacity: int = 4, **engine_kwargs: object) -> tuple:
    """Through the streaming pipeline, the fake engine holding at most ``capacity`` requests
    (so that the media of later ones are still being read while earlier ones run)."""
    engine = FakeEngine(capacity=capacity, **engine_kwargs)  # type: ignore[arg-type]
    with JsonlSink(out) as sink:
        stats = run_requests(
            requests, engine, MediaOptions(), sink, Sampling(), RunConfig(progress=False)
        )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return stats, rows, engine


def test_one_row_per_item_with_the_right_text(corpus: Path, tmp_path: Path) -> None:
    requests = image_requests([str(corpus)], "Describe.")
    stats, rows, _ = run(requests, tmp_path / "out.jsonl")
    assert sorted(r["id"] for r in rows) == sorted(r.id for r in requests)
    for row in rows:
        if row["error"] is None:
            assert row["text"] == expected_text([row["media_hash"]], "Describe.")
    assert stats.ok + stats.failed == len(requests) == stats.total


def test_bad_files_become_error_rows_naming_stage_and_cause(corpus: Path, tmp_path: Path) -> None:
    _, rows, _ = run(image_requests([str(corpus)], "p"), tmp_path / "out.jsonl")
    errors = {Path(r["id"]).name: r["error"] for r in rows if r["error"]}
    assert errors == {
        "empty.jpg": {"stage": "load", "kind": "empty", "message": "empty file (0 bytes)"},
        "text.jpg": {
            "stage": "decode",
            "kind": "not_media",
            "message": "not an image Pillow can identify",
        },
        "truncated.jpg": {
            "stage": "decode",
            "kind": "corrupt",
            "message": errors["truncated.jpg"]["message"],
        },
    }
    assert "truncated" in errors["truncated.jpg"]["message"]
    assert all(r["text"] is None for r in rows if r["error"])


def test_identical_bytes_share_a_key_and_are_decoded_once(corpus: Path, tmp_path: Path) -> None:
    stats, rows, _ = run(image_requests([str(corpus)], "p"), tmp_path / "o.jsonl", capacity=100)
    by_name = {Path(r["id"]).name: r for r in rows}
    assert by_name["sunset.jpg"]["media_hash"] == by_name["sunset_copy.jpg"]["media_hash"]
    assert by_name["checkerboard.png"]["media_hash"] == by_name["checker_again.png"]["media_hash"]
    assert by_name["sunset.jpg"]["media_hash"] != by_name["checkerboard.png"]["media_hash"]
    decodable = {r["media_hash"] for r in rows if r["error"] is None}
    assert stats.decodes == len(decodable) == 4


def test_a_repeated_picture_is_decoded_once_however_the_engine_takes_it(
    samples: Path, tmp_path: Path
) -> None:
    path = str(samples / "sunset.jpg")
    requests = [Request(str(i), "p", (MediaRef("image", path),)) for i in range(10)]
    stats, rows, _ = run(requests, tmp_path / "o.jsonl", capacity=3)
    assert stats.decodes == 1
    assert len(rows) == 10


def test_out_of_order_completion_never_swaps_captions(samples: Path, tmp_path: Path) -> None:
    # Many prompts over few images, prompt-major, finished newest-first by the fake engine.
    images = ["sunset.jpg", "checkerboard.png", "shapes_alpha.png"]
    requests = [
        Request(f"{prompt}:{name}", prompt, (MediaRef("image", str(samples / name)),))
        for prompt in ["caption", "tags", "ocr", "json"]
        for name in images
    ]
    _, rows, engine = run(requests, tmp_path / "o.jsonl", capacity=5, per_step=4)
    keys = {Path(r["source"]).name: r["media_hash"] for r in rows}
    for row in rows:
        prompt, name = row["id"].split(":")
        assert row["prompt"] == prompt
        assert row["text"] == expected_text([keys[name]], prompt)
    assert engine.added != [r.id for r in requests]  # the planner did reorder


@pytest.mark.parametrize("reject_in_step", [False, True])
def test_a_refused_request_fails_alone(samples: Path, tmp_path: Path, reject_in_step: bool) -> None:
    path = str(samples / "sunset.jpg")
    requests = [
        Request(str(i), "bad" if i == 2 else "good", (MediaRef("image", path),)) for i in range(5)
    ]
    stats, rows, _ = run(
        requests,
        tmp_path / "o.jsonl",
        faults=Faults(reject_prompts=frozenset({"bad"}), reject_in_step=reject_in_step),
    )
    failed = [r for r in rows if r["error"]]
    assert [r["id"] for r in failed] == ["2"]
    assert failed[0]["error"]["stage"] == "validate"
    assert stats.ok == 4
    assert stats.failed_by_stage == {"validate": 1}


def test_missing_file_is_a_load_error_row(tmp_path: Path) -> None:
    requests = [Request("gone", "p", (MediaRef("image", str(tmp_path / "gone.jpg")),))]
    _, rows, _ = run(requests, tmp_path / "o.jsonl")
    assert rows[0]["error"]["stage"] == "load"
    assert "cannot read" in rows[0]["error"]["message"]


def test_summary_counts(corpus: Path, tmp_path: Path) -> None:
    stats, _, _ = run(image_requests([str(corpus)], "p"), tmp_path / "o.jsonl")
    text = stats.summary()
    assert f"{stats.total} of {stats.total} items: {stats.ok} ok, 3 failed" in text
    assert "1 at load" in text
    assert "2 at decode" in text
    assert "failures by kind: 1 corrupt, 1 empty, 1 not_media" in text


def test_a_request_the_engine_loses_stops_the_job_loudly_once_the_rest_are_out(
    samples: Path, tmp_path: Path
) -> None:
    """An engine that forgets a request, no result ever, would leave the job waiting for its
    row forever: the pipeline sees the engine hold fewer requests than it sent, sends no more,
    lets those in flight finish (their rows are written), then stops the job saying which."""
    path = str(samples / "sunset.jpg")
    requests = [
        Request(f"r{i}", "lose" if i == 5 else "keep", (MediaRef("image", path),))
        for i in range(20)
    ]
    out = tmp_path / "o.jsonl"
    with pytest.raises(FatalEngineError, match=r"got no result \(e\.g\. 'r5'\)"):
        run(requests, out, capacity=8, per_step=1, faults=Faults(drop_prompts=frozenset({"lose"})))
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert "r5" not in {row["id"] for row in rows}
    assert len(rows) == 19  # one picture, sent together: the others all finished
    for row in rows:
        assert row["text"] == expected_text([row["media_hash"]], "keep")


def test_a_row_the_pipeline_itself_loses_stops_the_job_loudly_and_a_rerun_resumes(
    samples: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The engine answers the third request, the pipeline settles it and writes no row (a
    bug in its own bookkeeping): nothing is left to come, so the job stops at once, naming
    it, exit 2, the other rows kept; the same command then runs only the lost one."""
    from fake_cli import main

    from mmbatch.cli import EXIT_JOB_FAILED, EXIT_OK
    from mmbatch.pipeline import Submission

    real_emit = Submission.emit
    answers: list[str] = []

    def loses_the_third_answer(submission: Submission, result: Result) -> None:
        if result.ok:
            answers.append(result.request_id)
            if len(answers) == 3:
                return
        real_emit(submission, result)

    folder = tmp_path / "pictures"
    folder.mkdir()
    for name in ("sunset.jpg", "checkerboard.png", "shapes_alpha.png", "arrow_exif_rotated.jpg"):
        shutil.copyfile(samples / name, folder / name)
    out = tmp_path / "o.jsonl"
    argv = ["caption", str(folder), "--model", "m", "--out", str(out), "--no-progress"]
    monkeypatch.setattr(Submission, "emit", loses_the_third_answer)
    started = time.monotonic()
    assert main(argv, FakeEngine(per_step=1)) == EXIT_JOB_FAILED
    assert time.monotonic() - started < 10
    lost = answers[2]
    error = capsys.readouterr().err
    said = "mmbatch: error: bug: the pipeline lost 1 request(s), whose rows can no longer come"
    assert f"{said}: {lost!r}\n" in error
    assert "Traceback" not in error
    kept = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(row["id"] for row in kept) == sorted(set(answers) - {lost})
    monkeypatch.undo()
    engine = FakeEngine()
    assert main(argv, engine) == EXIT_OK
    assert [request_id.split(":", 1)[1] for request_id in engine.added] == [lost]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(row["id"] for row in rows) == sorted(answers)
    for row in rows:
        assert row["text"] == expected_text([row["media_hash"]], row["prompt"])


class WarmingEngine(FakeEngine):
    """Answers nothing for ``warm_up`` seconds, and ``step`` does not block meanwhile: an
    engine process compiling for its first batch, as the parent's ``ReplicaEngine`` sees it."""

    def __init__(self, warm_up: float) -> None:
        super().__init__(per_step=1)
        self.ready_at = time.time() + warm_up
        self.first_answer_at: float | None = None

    def step(self) -> list[Result]:
        if time.time() < self.ready_at:
            time.sleep(0.02)
            return []
        time.sleep(0.02)
        done = super().step()
        if done and self.first_answer_at is None:
            self.first_answer_at = time.time()
        return done


def test_the_progress_bar_times_the_work_from_the_engines_first_answer(
    samples: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ETA counted the engine's warm-up as work (``2/300 [00:41<1:35:41]``): the bar's
    clock now starts once the engine answers."""
    import io

    from tqdm import tqdm

    from mmbatch import pipeline

    bars: list[tqdm] = []  # type: ignore[type-arg]

    class Recorded(tqdm):  # type: ignore[type-arg]
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, file=io.StringIO(), **kwargs)  # type: ignore[arg-type]
            bars.append(self)

    monkeypatch.setattr(pipeline, "tqdm", Recorded)
    engine = WarmingEngine(warm_up=2.5)  # the bar appears after 1 s, meanwhile
    requests = [
        Request(f"r{i}", "p", (MediaRef("image", str(samples / "sunset.jpg")),)) for i in range(30)
    ]
    with JsonlSink(tmp_path / "out.jsonl") as sink:
        stats = run_requests(requests, engine, MediaOptions(), sink, Sampling(), RunConfig())
    assert stats.ok == 30
    [bar] = bars
    assert engine.first_answer_at is not None
    assert bar.start_t >= engine.first_answer_at
    assert bar.n == 30
