"""Identical requests answered once (``mmbatch.repeats``), against the fake engine: which
requests reach the engine, and that every id still gets its own row with the answer.

The real engine's side (the copied answer is the one the request gets alone) is in
test_end_to_end."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from fake_engine import FakeEngine, Faults, expected_text

from mmbatch.errors import FatalEngineError
from mmbatch.media.options import ImageOptions, MediaOptions
from mmbatch.output.sinks import MemorySink
from mmbatch.output.stats import JobStats
from mmbatch.pipeline import Pipeline, RunConfig, Submission, run_requests
from mmbatch.repeats import Repeats, request_key
from mmbatch.types import LoadedRequest, MediaItem, MediaRef, Request, Result, Sampling, Turn

pytestmark = pytest.mark.timeout(60)

GREEDY = Sampling()
RUN = RunConfig(progress=False, decode_workers=0)


def asking(samples: Path, count: int, prompt: str = "Describe.", name: str = "sunset.jpg") -> list:
    """``count`` requests asking ``prompt`` of one picture, ids ``r0``, ``r1``, ..."""
    image = (MediaRef("image", str(samples / name)),)
    return [Request(f"r{i}", prompt, image) for i in range(count)]


def run(
    requests: list[Request],
    engine: FakeEngine,
    sampling: Sampling = GREEDY,
    options: MediaOptions | None = None,
) -> tuple[dict[str, dict], JobStats]:  # type: ignore[type-arg]
    sink = MemorySink()
    stats = run_requests(requests, engine, options or MediaOptions(), sink, sampling, RUN)
    rows = {row["id"]: row for row in sink.rows}
    assert len(rows) == len(sink.rows) == len(requests)
    return rows, stats


def rows_of(submission: Submission) -> list[dict]:  # type: ignore[type-arg]
    """The rows a submission wrote to its (default, in-memory) sink."""
    assert isinstance(submission.sink, MemorySink)
    return submission.sink.rows


def sent(engine: FakeEngine) -> list[str]:
    """Our ids of the requests the engine was given, in order."""
    return [engine_id.split(":", 1)[1] for engine_id in engine.added]


def test_greedy_repeats_reach_the_engine_once_and_every_id_gets_the_answer(
    samples: Path,
) -> None:
    engine = FakeEngine()
    rows, stats = run(asking(samples, 5), engine)
    assert len(engine.added) == 1
    text = expected_text([rows["r0"]["media_hash"]], "Describe.")
    for row in rows.values():
        assert row["error"] is None
        assert row["text"] == text
        assert row["output_tokens"] == len(text)  # the answer's usage, as its leader's
    assert stats.ok == 5
    assert stats.answered_by_identical == 4
    assert "repeats: 4 requests answered by an identical request's answer" in stats.summary()
    assert stats.to_dict()["answered_by_identical"] == 4
    # The copies' tokens are in the rows, not in what the engine decoded (nor its rate).
    assert stats.output_tokens == 5 * len(text)
    assert (stats.repeated_output_tokens, stats.decoded_tokens) == (4 * len(text), len(text))
    assert stats.to_dict()["repeated_output_tokens"] == 4 * len(text)


def test_unseeded_sampling_sends_every_repeat(samples: Path) -> None:
    """Each row is a draw of its own: five rows asked, five samples drawn."""
    for sampling in (Sampling(temperature=0.7), Sampling(temperature=None)):
        engine = FakeEngine()
        _, stats = run(asking(samples, 5), engine, sampling)
        assert sorted(sent(engine)) == ["r0", "r1", "r2", "r3", "r4"]
        assert stats.answered_by_identical == 0
        assert "repeats" not in stats.summary()


def test_seeded_sampling_is_answered_once(samples: Path) -> None:
    engine = FakeEngine()
    _, stats = run(asking(samples, 5), engine, Sampling(temperature=0.7, seed=3))
    assert len(engine.added) == 1
    assert stats.answered_by_identical == 4


def test_a_requests_own_sampling_decides_and_is_part_of_the_identity(samples: Path) -> None:
    """The effective sampling counts: a request's own (an OpenAI batch line's) over the
    job's; two requests alike but for it are two requests."""
    image = (MediaRef("image", str(samples / "sunset.jpg")),)
    requests = [
        Request("job", "p", image),
        Request("job again", "p", image),
        Request("own", "p", image, sampling=Sampling(max_tokens=5)),
        Request("own again", "p", image, sampling=Sampling(max_tokens=5)),
        Request("drawn", "p", image, sampling=Sampling(temperature=1.0)),
        Request("drawn again", "p", image, sampling=Sampling(temperature=1.0)),
    ]
    engine = FakeEngine()
    _, stats = run(requests, engine)
    assert sorted(sent(engine)) == ["drawn", "drawn again", "job", "own"]
    assert stats.answered_by_identical == 2


def test_what_the_engine_does_not_see_does_not_tell_requests_apart(samples: Path) -> None:
    """``id`` and ``columns`` never reach the engine: requests that differ only there are
    one request, each with its own row."""
    image = (MediaRef("image", str(samples / "sunset.jpg")),)
    requests = [
        Request("a", "p", image, columns=(("k", 1),)),
        Request("b", "p", image, columns=(("k", 2),)),
        Request("c", "p", image),
    ]
    engine = FakeEngine()
    sink = MemorySink()
    stats = run_requests(requests, engine, MediaOptions(), sink, GREEDY, RUN)
    assert len(engine.added) == 1
    assert stats.answered_by_identical == 2
    rows = {row["id"]: row for row in sink.rows}
    assert rows["a"]["k"] == 1
    assert rows["b"]["k"] == 2
    assert rows["a"]["text"] == rows["b"]["text"]


def test_requests_that_differ_in_what_the_engine_sees_are_not_merged(samples: Path) -> None:
    image = (MediaRef("image", str(samples / "sunset.jpg")),)
    chat = (Turn("user", "Hello."), Turn("assistant", "Hi."))
    requests = [
        Request("plain", "p", image),
        Request("system", "p", image, system="Be brief."),
        Request("history", "p", image, history=chat),
        Request("other prompt", "q", image),
        Request("other picture", "p", (MediaRef("image", str(samples / "checkerboard.png")),)),
        Request("no picture", "p"),
    ]
    engine = FakeEngine()
    _, stats = run(requests, engine)
    assert sorted(sent(engine)) == sorted(r.id for r in requests)
    assert stats.answered_by_identical == 0


def test_other_decode_options_are_other_requests(samples: Path) -> None:
    """The same file decoded with other options is other media (another key): asked while
    the first asking is in flight on the same engine, it still goes to the engine, and only
    its own repeat follows it."""
    engine = Held()
    pipeline = Pipeline(engine, RUN)
    try:
        first = pipeline.submit(asking(samples, 1), GREEDY)
        until(lambda: engine.added)
        smaller = MediaOptions(image=ImageOptions(max_pixels=64))
        second = pipeline.submit(asking(samples, 2), GREEDY, smaller)
        until(lambda: len(engine.added) == 2 and pipeline._repeats.following == 1)
        engine.release.set()
        assert first.wait().answered_by_identical == 0
        assert second.wait().answered_by_identical == 1
    finally:
        pipeline.close()
    assert len(engine.added) == 2
    assert rows_of(first)[0]["media_hash"] != rows_of(second)[0]["media_hash"]


class FailsFirst(FakeEngine):
    """Fails the first request it is given (an engine error, from ``step``), then answers;
    notes how many steps it had taken when each request came."""

    def __init__(self) -> None:
        super().__init__()
        self.steps_at_add: list[int] = []

    def add(self, request: LoadedRequest, media: Sequence[MediaItem], sampling: Sampling) -> None:
        self.steps_at_add.append(self.steps)
        if self.added:
            super().add(request, media, sampling)
            return
        self.added.append(request.id)
        self._queue.append(Result.failure(request.id, "engine", "vLLM failed it", "engine"))


def test_a_leaders_failure_is_not_copied_its_followers_go_to_the_engine(samples: Path) -> None:
    engine = FailsFirst()
    rows, stats = run(asking(samples, 4), engine)
    leader, *followers = sent(engine)
    assert sorted(followers) == sorted(set(rows) - {leader})
    # The followers waited for their leader, and went to the engine once it had failed.
    assert engine.steps_at_add[0] == 0
    assert min(engine.steps_at_add[1:]) >= 1
    assert rows[leader]["error"]["message"] == "vLLM failed it"
    for request_id in followers:
        assert rows[request_id]["error"] is None
        assert rows[request_id]["text"] == expected_text([rows[leader]["media_hash"]], "Describe.")
    assert stats.answered_by_identical == 0
    assert stats.ok == 3
    assert stats.failed == 1


class Held(FakeEngine):
    """Answers nothing until ``release`` is set; holds ``capacity`` requests at once."""

    def __init__(self, capacity: int = 64) -> None:
        super().__init__(capacity=capacity)
        self.release = threading.Event()
        self.aborted: list[str] = []

    def step(self) -> list[Result]:
        if not self.release.is_set():
            time.sleep(0.01)
            return []
        return super().step()

    def abort(self, request_ids: Sequence[str]) -> None:
        self.aborted += request_ids
        super().abort(request_ids)


def until(condition: object, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.01)
    assert condition(), "timed out"  # type: ignore[operator]


@pytest.mark.parametrize("repeats", ["following", "remembered"])
def test_interleaved_repeats_of_two_pictures_each_get_their_own_pictures_answer(
    samples: Path, tmp_path: Path, repeats: str
) -> None:
    """Two pictures asked three times each, interleaved (a, b, a, b, a, b), each asking its
    own file (copies: planned apart, read apart). The two first askings lead, both in
    flight, and the engine answers the newer one first; the repeats either wait for them,
    asked by a second caller while both are in flight (``following``), or are asked once
    both answers are back, the engine holding only the two leaders (``remembered``). Every
    row is the answer for its own picture, never the other leader's."""
    pictures = {"a": samples / "sunset.jpg", "b": samples / "checkerboard.png"}
    requests = []
    for n in range(3):
        for name, picture in pictures.items():
            copy = tmp_path / f"{name}{n}{picture.suffix}"
            shutil.copyfile(picture, copy)
            requests.append(Request(f"{name}{n}", "Describe.", (MediaRef("image", str(copy)),)))
    engine = Held(capacity=64 if repeats == "following" else 2)
    pipeline = Pipeline(engine, RUN)
    try:
        if repeats == "following":
            submissions = [pipeline.submit(requests[:2], GREEDY)]
            until(lambda: len(engine.added) == 2)
            submissions.append(pipeline.submit(requests[2:], GREEDY))
            until(lambda: pipeline._repeats.following == 4)
        else:
            submissions = [pipeline.submit(requests, GREEDY)]
            until(lambda: len(engine.added) == 2)
        engine.release.set()
        copied = sum(submission.wait().answered_by_identical for submission in submissions)
    finally:
        pipeline.close()
    assert len(engine.added) == 2
    assert copied == 4
    rows = {row["id"]: row for submission in submissions for row in rows_of(submission)}
    assert sorted(rows) == sorted(r.id for r in requests)
    hashes = {name: {rows[f"{name}{n}"]["media_hash"] for n in range(3)} for name in pictures}
    assert all(len(each) == 1 for each in hashes.values())
    assert hashes["a"] != hashes["b"]
    for row in rows.values():
        assert row["error"] is None
        assert row["text"] == expected_text([row["media_hash"]], "Describe.")


def test_a_repeat_in_another_submission_follows_the_leader_in_flight(samples: Path) -> None:
    """Followers may belong to another submission on a shared engine: each gets its row in
    its own submission, and neither submission ends before its rows are in."""
    engine = Held()
    pipeline = Pipeline(engine, RUN)
    try:
        first = pipeline.submit(asking(samples, 1), GREEDY)
        until(lambda: engine.added)
        second = pipeline.submit(asking(samples, 2), GREEDY)  # r0 and r1, like first's r0
        until(lambda: pipeline._repeats.following == 2)
        assert not first.done
        assert not second.done
        engine.release.set()
        first_stats, second_stats = first.wait(), second.wait()
    finally:
        pipeline.close()
    assert len(engine.added) == 1
    assert (first_stats.answered_by_identical, second_stats.answered_by_identical) == (0, 2)
    text = rows_of(first)[0]["text"]
    assert [row["text"] for row in rows_of(second)] == [text, text]
    assert sorted(row["id"] for row in rows_of(second)) == ["r0", "r1"]


def test_a_later_submission_asks_the_engine_again(samples: Path) -> None:
    """Answers are remembered for their own submission: a later call (a job run again as
    the reference for another, the next batch of a ``Dataset.map``) reaches the engine,
    its own repeats answered once."""
    engine = FakeEngine()
    pipeline = Pipeline(engine, RUN)
    try:
        first = pipeline.submit(asking(samples, 1), GREEDY)
        first.wait()
        second = pipeline.submit(asking(samples, 3), GREEDY)
        stats = second.wait()
    finally:
        pipeline.close()
    assert len(engine.added) == 2
    assert stats.answered_by_identical == 2
    text = rows_of(first)[0]["text"]
    assert [row["text"] for row in rows_of(second)] == [text] * 3


def test_two_files_with_the_same_bytes_are_asked_once(samples: Path) -> None:
    """Different planner groups (their sources differ), one request to the engine."""
    requests = [
        Request("sunset", "p", (MediaRef("image", str(samples / "sunset.jpg")),)),
        Request("copy", "p", (MediaRef("image", str(samples / "sunset_copy.jpg")),)),
    ]
    engine = FakeEngine()
    rows, stats = run(requests, engine)
    assert len(engine.added) == 1
    assert rows["sunset"]["text"] == rows["copy"]["text"]
    assert stats.answered_by_identical == 1


def test_a_closed_pipeline_aborts_the_leader_and_ends_its_followers_once(samples: Path) -> None:
    engine = Held()
    pipeline = Pipeline(engine, RUN)
    submission = pipeline.submit(asking(samples, 3), GREEDY)
    until(lambda: pipeline._repeats.following == 2)
    pipeline.close()
    with pytest.raises(RuntimeError, match="closed before this work was done"):
        submission.wait()
    assert len(engine.added) == 1
    assert engine.aborted == engine.added
    assert submission.emitted == set()
    assert pipeline._repeats.following == 0


def test_a_dead_engine_ends_the_followers_with_their_leader(samples: Path) -> None:
    engine = FakeEngine(faults=Faults(die_after_steps=0))
    with pytest.raises(FatalEngineError, match="fake engine died"):
        run(asking(samples, 3), engine)


def loaded(prompt: str) -> LoadedRequest:
    return LoadedRequest(Request("x", prompt), ())


def test_the_memory_keeps_the_most_recently_used_answers() -> None:
    repeats: Repeats[str] = Repeats(remember=2)
    keys = {p: request_key(loaded(p), GREEDY) for p in "abc"}
    for n, prompt in enumerate("abc"):
        key = keys[prompt]
        assert key is not None
        repeats.lead(key, f"e{n}")
        assert repeats.settle(f"e{n}", Result(f"e{n}", prompt), "job") == []
        if prompt == "b":
            assert repeats.answer(keys["a"], "job") is not None  # "a" used: "b" is oldest now
    assert repeats.answer(keys["b"], "job") is None  # type: ignore[arg-type]
    assert [repeats.answer(keys[p], "job").text for p in "ac"] == ["a", "c"]  # type: ignore[arg-type, union-attr]


def test_answers_are_remembered_for_their_submission_until_it_is_forgotten() -> None:
    repeats: Repeats[str] = Repeats()
    key = request_key(loaded("p"), GREEDY)
    assert key is not None
    for n, scope in enumerate(("one", "two")):
        repeats.lead(key, f"e{n}")
        repeats.settle(f"e{n}", Result(f"e{n}", scope), scope)
    repeats.forget("one")
    assert repeats.answer(key, "one") is None
    assert repeats.answer(key, "two").text == "two"  # type: ignore[union-attr]
    assert repeats.answer(key, "three") is None


def test_a_failed_answer_is_not_remembered() -> None:
    repeats: Repeats[str] = Repeats()
    key = request_key(loaded("p"), GREEDY)
    assert key is not None
    repeats.lead(key, "e0")
    assert repeats.follow(key, "follower")
    failure = Result.failure("e0", "engine", "gone", "engine")
    assert repeats.settle("e0", failure, "job") == ["follower"]
    assert repeats.answer(key, "job") is None
    assert not repeats.follow(key, "late")  # no leader in flight: it goes to the engine


def test_unseeded_sampling_has_no_identity() -> None:
    assert request_key(loaded("p"), Sampling(temperature=0.7)) is None
    assert request_key(loaded("p"), Sampling(temperature=None)) is None
    assert request_key(loaded("p"), Sampling(temperature=None, seed=0)) is not None
