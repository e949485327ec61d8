"""Every face that runs a job begins its engine before it reads its inputs
(``mmbatch.engine.early``): ``caption``, ``frames``, ``run`` and ``run_dataset``, each sized
for the media its options or its inputs' names say a prompt carries. Shown by the order of
events, with a fake engine whose start records when it was entered and a listing that, an
engine's start being begun, waits for it to be entered (else the start and the listing race
on a loaded machine); a mistake in the inputs, or Ctrl-C while they are read, closes the
engine begun."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from error_line import one_error
from fake_engine import FakeEngine
from processes import starts_ended
from repo_paths import RECIPES, SAMPLES

from mmbatch import clock
from mmbatch.cli import EXIT_INTERRUPTED, EXIT_JOB_FAILED, EXIT_OK, main
from mmbatch.engine import registry
from mmbatch.engine.config import EngineConfig
from mmbatch.engine.early import EngineStart

LISTING_SECONDS = 0.5
"""How long a listing takes where no engine's start was begun."""
ENTERED_WITHIN = 30.0
"""How long a listing waits, at most, for an engine's start begun to be entered."""
PICTURES = ("sunset.jpg", "checkerboard.png", "shapes_alpha.png")


class ClosedEngine(FakeEngine):
    closed = False

    def close(self) -> None:
        self.closed = True
        super().close()


class Events:
    """What happened, in order, with the engines started and the media each was sized for."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.engines: list[ClosedEngine] = []
        self.media: list[dict[str, int]] = []
        self.sizes: list[int | None] = []
        self.begun = threading.Event()
        """An engine's start was begun in the background."""
        self.entered = threading.Event()

    def engine(self, host: Any, media: dict[str, int], layout: Any) -> tuple[Any, Any]:
        self.names.append("engine start entered")
        self.entered.set()
        self.media.append(dict(media))
        self.engines.append(ClosedEngine())
        return self.engines[-1], layout

    def slowed(self, read: Callable[..., Any], fails: BaseException | None = None) -> Any:
        """``read``, recorded and made slow (or failing with ``fails`` once slowed)."""

        def slow(*args: Any, **kwargs: Any) -> Any:
            self.names.append("listing begun")
            if self.begun.is_set():  # a start begun before: entered meanwhile, if it overlaps
                self.entered.wait(ENTERED_WITHIN)
            else:
                time.sleep(LISTING_SECONDS)
            try:
                if fails is not None:
                    raise fails
                return read(*args, **kwargs)
            finally:
                self.names.append("listing done")

        return slow

    def began_first(self) -> bool:
        return self.names.index("engine start entered") < self.names.index("listing done")


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> Events:
    """Engines started from here on are fake ones, recorded; the start-up's milestones are
    this test's own."""
    seen = Events()
    monkeypatch.setattr(registry, "shared_engine_and_layout", seen.engine)
    monkeypatch.setattr(clock, "_MILESTONES", {})
    begin = EngineStart.begin

    def sized(cls: type[EngineStart], config: Any, media: Any, requests: int | None) -> Any:
        seen.sizes.append(requests)  # the job's size as the face guessed it
        start = begin(config, media, requests)
        if start._thread is not None:
            seen.begun.set()
        return start

    monkeypatch.setattr(EngineStart, "begin", classmethod(sized))
    return seen


@pytest.fixture
def model(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


@pytest.fixture
def pictures(tmp_path: Path) -> Path:
    folder = tmp_path / "pictures"
    folder.mkdir()
    for name in PICTURES:
        shutil.copy(SAMPLES / name, folder / name)
    return folder


def _phases(out: Path) -> dict[str, float]:
    summary = json.loads(out.with_name(out.name + ".summary.json").read_text())
    phases: dict[str, float] = summary["stats"]["startup_phases"]
    return phases


def _job_args(model: Path, out: Path) -> list[str]:
    return ["--model", str(model), "--out", str(out), "--no-progress", "--decode-workers", "0"]


# -- caption ---------------------------------------------------------------------------


def test_caption_begins_its_engine_before_the_folder_is_listed(
    tmp_path: Path, model: Path, pictures: Path, events: Events, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sized for a picture a prompt, the job run on it, and its summary's start-up phases
    say the engine's start began before the inputs were listed."""
    from mmbatch.sources import mixed_media

    monkeypatch.setattr(mixed_media, "list_media", events.slowed(mixed_media.list_media))
    out = tmp_path / "o.jsonl"
    assert main(["caption", str(pictures), *_job_args(model, out)]) == EXIT_OK
    assert events.began_first()
    assert events.media == [{"image": 1}]
    assert events.sizes == [len(PICTURES)]
    assert len(out.read_text().splitlines()) == len(PICTURES)
    assert not events.engines[0].closed  # the job's: kept in the registry as any
    phases = _phases(out)
    assert phases["engine_start_begun"] < phases["inputs_listed"]


def test_a_trial_begins_an_engine_laid_out_for_its_limit(
    tmp_path: Path, model: Path, pictures: Path, events: Events
) -> None:
    """``--limit 1`` of a folder: the engine begun is laid out for one request, not for
    every picture the folder holds."""
    out = tmp_path / "o.jsonl"
    assert main(["caption", str(pictures), "--limit", "1", *_job_args(model, out)]) == EXIT_OK
    assert events.sizes == [1]


def test_a_folder_without_media_exits_2_and_begins_no_engine(
    tmp_path: Path, model: Path, events: Events, capsys: pytest.CaptureFixture[str]
) -> None:
    """A folder that holds no media: one line, no output, and no engine begun (a glance
    that counts nothing gives the job no size to lay an engine out for)."""
    empty = tmp_path / "notes"
    empty.mkdir()
    (empty / "readme.txt").write_text("no pictures here")
    out = tmp_path / "o.jsonl"
    assert main(["caption", str(empty), *_job_args(model, out)]) == EXIT_JOB_FAILED
    assert "no media file found" in one_error(capsys)
    starts_ended()
    assert events.engines == []
    assert list(tmp_path.glob("o.jsonl*")) == []


def test_a_missing_input_begins_no_engine(
    tmp_path: Path, model: Path, events: Events, capsys: pytest.CaptureFixture[str]
) -> None:
    """A path that is not there is refused by the listing: no engine is begun for it."""
    out = tmp_path / "o.jsonl"
    for command in (["caption"], ["frames", "--num-frames", "2"]):
        argv = [*command, str(tmp_path / "nope"), *_job_args(model, out)]
        assert main(argv) == EXIT_JOB_FAILED
        assert "does not exist" in one_error(capsys)
    starts_ended()
    assert events.names == []
    assert list(tmp_path.glob("o.jsonl*")) == []


def test_ctrl_c_while_the_inputs_are_listed_closes_the_engine_begun(
    tmp_path: Path,
    model: Path,
    pictures: Path,
    events: Events,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from mmbatch.sources import mixed_media

    monkeypatch.setattr(
        mixed_media, "list_media", events.slowed(mixed_media.list_media, KeyboardInterrupt())
    )
    out = tmp_path / "o.jsonl"
    assert main(["caption", str(pictures), *_job_args(model, out)]) == EXIT_INTERRUPTED
    assert "interrupted" in capsys.readouterr().err
    starts_ended()
    assert [e.closed for e in events.engines] == [True]
    assert list(tmp_path.glob("o.jsonl*")) == []


def test_a_resumed_caption_starts_its_engine_once_it_knows_what_is_left(
    tmp_path: Path, model: Path, pictures: Path, events: Events
) -> None:
    out = tmp_path / "o.jsonl"
    assert main(["caption", str(pictures), *_job_args(model, out)]) == EXIT_OK
    assert main(["caption", str(pictures), *_job_args(model, out)]) == EXIT_OK
    assert events.names == ["engine start entered"]  # the finished job starts none


def test_caption_guesses_a_prompts_media_from_the_names_and_options(tmp_path: Path) -> None:
    """Pictures: one each, counted; videos only as clips; audio beside other media only
    with --sample-rate; what only the listing knows (a manifest, windows, clips) not counted."""
    from mmbatch.cli import build_parser
    from mmbatch.cli.caption import _engine_guess
    from mmbatch.cli.options import clip_split_from

    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for name in ("sunset.jpg", "checkerboard.png", "clip.mp4"):
        shutil.copy(SAMPLES / name, mixed / name)
    (mixed / ".hidden.jpg").write_bytes(b"")
    (mixed / "notes.txt").write_text("")

    def guess(*argv: str) -> tuple[dict[str, int] | None, int | None]:
        args = build_parser().parse_args(["caption", *argv, "--model", "m", "--out", "o"])
        clips = clip_split_from(args)
        return _engine_guess(args, clips, "files")  # type: ignore[return-value]

    assert guess(str(mixed)) == ({"image": 1}, 2)
    assert guess(str(mixed), "--as-clip") == ({"image": 1, "video": 1}, 3)
    assert guess(str(mixed), "--clip-seconds", "2") == ({"image": 1, "video": 1}, None)
    shutil.copy(SAMPLES / "tone.wav", mixed / "tone.wav")  # cut into windows: not counted
    assert guess(str(mixed)) == ({"image": 1}, None)
    assert guess(str(mixed), "--sample-rate", "16000") == ({"audio": 1, "image": 1}, None)
    assert guess(str(mixed / "tone.wav")) == ({"audio": 1}, None)
    assert guess(str(mixed / "clip.mp4"), "--as-clip") == ({"video": 1}, 1)
    (mixed / "tone.wav").unlink()
    for folder in ("more", ".hidden"):  # walked as the listing walks: hidden ones not
        (mixed / folder).mkdir()
        shutil.copy(SAMPLES / "sunset.jpg", mixed / folder / "again.jpg")
    assert guess(str(mixed)) == ({"image": 1}, 3)
    manifest = tmp_path / "items.jsonl"
    manifest.write_text(json.dumps({"path": str(mixed / "clip.mp4")}) + "\n")
    assert guess(str(manifest), "--as-clip") == ({"video": 1}, None)
    assert guess(str(tmp_path / "nope.jpg")) == (None, None)


# -- frames ----------------------------------------------------------------------------


def test_frames_begins_its_engine_before_the_videos_are_indexed(
    tmp_path: Path, model: Path, events: Events, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mmbatch.sources import timeline

    monkeypatch.setattr(timeline, "frame_requests", events.slowed(timeline.frame_requests))
    out = tmp_path / "o.jsonl"
    argv = ["frames", str(SAMPLES / "clip.mp4"), "--num-frames", "2", *_job_args(model, out)]
    assert main(argv) == EXIT_OK
    assert events.began_first()
    assert events.media == [{"image": 1}]  # each frame a picture
    assert events.sizes == [2]
    assert len(out.read_text().splitlines()) == 2
    phases = _phases(out)
    assert phases["engine_start_begun"] < phases["inputs_listed"]


# -- run (recipes) ---------------------------------------------------------------------


@pytest.fixture
def fitted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The recipe's fit to the model (vLLM's own reading of it) left as the config is."""
    from mmbatch.recipe import fit

    monkeypatch.setattr(fit, "fit_engine", lambda recipe, config: (config, None))


def test_run_begins_its_engine_before_the_recipes_inputs_are_listed(
    tmp_path: Path,
    model: Path,
    pictures: Path,
    events: Events,
    fitted: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mmbatch.recipe import requests

    monkeypatch.setattr(requests, "recipe_requests", events.slowed(requests.recipe_requests))
    out = tmp_path / "o.jsonl"
    recipe = str(RECIPES / "short_caption.toml")
    assert main(["run", recipe, str(pictures), *_job_args(model, out)]) == EXIT_OK
    assert events.began_first()
    assert events.media == [{"image": 1}]
    assert events.sizes == [len(PICTURES)]  # one question a picture
    assert len(out.read_text().splitlines()) == len(PICTURES)
    phases = _phases(out)
    assert phases["engine_start_begun"] < phases["inputs_listed"]


def test_run_with_a_bad_recipe_or_inputs_exits_2_and_leaves_no_engine(
    tmp_path: Path,
    model: Path,
    events: Events,
    fitted: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A recipe that does not read is said before any engine begins; so is a folder the
    recipe finds nothing in (nothing counted: no size to begin an engine for). Neither
    writes output."""
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\n[prompt]\nname = "p"\ntext = "t"\n[media]\nkind = "smell"\n')
    out = tmp_path / "o.jsonl"
    assert main(["run", str(bad), str(tmp_path), *_job_args(model, out)]) == EXIT_JOB_FAILED
    assert "kind" in one_error(capsys)
    assert events.names == []
    videos = tmp_path / "videos"
    videos.mkdir()
    shutil.copy(SAMPLES / "clip.mp4", videos / "clip.mp4")
    recipe = str(RECIPES / "short_caption.toml")
    assert main(["run", recipe, str(videos), *_job_args(model, out)]) == EXIT_JOB_FAILED
    assert "no images found" in one_error(capsys)
    starts_ended()
    assert events.engines == []
    assert list(tmp_path.glob("o.jsonl*")) == []


# -- run_dataset -----------------------------------------------------------------------


def test_run_dataset_begins_its_engine_before_the_rows_become_requests(
    tmp_path: Path, model: Path, events: Events, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sized for the column's media (audio, by its feature) and the dataset's rows."""
    import datasets

    from mmbatch import DatasetMap, run_dataset
    from mmbatch.integrations import dataset_tables

    monkeypatch.setattr(
        dataset_tables, "dataset_requests", events.slowed(dataset_tables.dataset_requests)
    )
    wav = (SAMPLES / "tone.wav").read_bytes()
    ds = datasets.Dataset.from_dict({"audio": [{"bytes": wav, "path": None}] * 3})
    ds = ds.cast_column("audio", datasets.Audio(decode=False))
    task = DatasetMap(str(model), "Transcribe.", column="audio")
    done = run_dataset(ds, task, cache_dir=tmp_path / "jobs")
    assert done.num_rows == 3
    assert events.began_first()
    assert events.media == [{"audio": 1}]
    assert events.sizes == [3]
    assert not events.engines[0].closed
    [rows] = (tmp_path / "jobs").rglob("rows.jsonl")
    phases = _phases(rows)
    assert phases["engine_start_begun"] < phases["inputs_listed"]


# -- the engine begun for a guess -------------------------------------------------------


def test_an_engine_begun_for_media_the_job_does_not_carry_is_started_again_for_its_own(
    tmp_path: Path, model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start begun for a guess that failed (a model that takes no audio, started for a
    folder's audio files) is the job's to start again for the media it carries; where the
    job carries what the start was begun for, its failure is the job's error."""
    starts: list[dict[str, int]] = []

    def start(host: Any, media: dict[str, int], layout: Any) -> tuple[Any, Any]:
        starts.append(dict(media))
        if "audio" in media:
            raise RuntimeError("this model takes no audio")
        return FakeEngine(), layout

    monkeypatch.setattr(registry, "shared_engine_and_layout", start)
    config = EngineConfig(str(model))
    guessed = EngineStart.begin(config, {"audio": 1, "image": 1}, 4)
    engine, _ = guessed.engine({"image": 1})
    assert isinstance(engine, FakeEngine)
    assert starts == [{"audio": 1, "image": 1}, {"image": 1}]
    again = EngineStart.begin(config, {"audio": 1}, 4)
    with pytest.raises(RuntimeError, match="takes no audio"):
        again.engine({"audio": 1})
    bigger = EngineStart.begin(config, {"image": 1}, 4)
    bigger.engine({"image": 2})
    assert starts[-2:] == [{"image": 1}, {"image": 2}]


def test_ctrl_c_while_any_face_reads_its_inputs_closes_the_engine_begun(
    tmp_path: Path,
    model: Path,
    pictures: Path,
    events: Events,
    fitted: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``frames`` indexing its videos, ``run`` listing a recipe's inputs, ``run_dataset``
    reading its rows: each interrupted, the engine it began is closed, no rows written."""
    import datasets

    from mmbatch import DatasetMap, run_dataset
    from mmbatch.integrations import dataset_tables
    from mmbatch.recipe import requests
    from mmbatch.sources import timeline

    stop = KeyboardInterrupt()
    monkeypatch.setattr(timeline, "frame_requests", events.slowed(timeline.frame_requests, stop))
    monkeypatch.setattr(requests, "recipe_requests", events.slowed(requests.recipe_requests, stop))
    monkeypatch.setattr(
        dataset_tables, "dataset_requests", events.slowed(dataset_tables.dataset_requests, stop)
    )
    out = tmp_path / "o.jsonl"
    frames = ["frames", str(SAMPLES / "clip.mp4"), "--num-frames", "2", *_job_args(model, out)]
    assert main(frames) == EXIT_INTERRUPTED
    recipe = str(RECIPES / "short_caption.toml")
    assert main(["run", recipe, str(pictures), *_job_args(model, out)]) == EXIT_INTERRUPTED
    ds = datasets.Dataset.from_dict({"image": [(SAMPLES / "sunset.jpg").read_bytes()]})
    with pytest.raises(KeyboardInterrupt):
        run_dataset(ds, DatasetMap(str(model), "Describe."), cache_dir=tmp_path / "jobs")
    starts_ended()
    assert [e.closed for e in events.engines] == [True, True, True]
    assert list(tmp_path.glob("o.jsonl*")) == []
    assert list((tmp_path / "jobs").rglob("rows.jsonl")) == []
