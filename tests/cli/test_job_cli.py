"""The caption command as a resumable job, with the fake engine in place of vLLM: exit codes,
the job fingerprint, fatal engine errors, --retry-errors and the quarantine file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from unittest import mock

import pytest
from fake_cli import main
from fake_engine import FakeEngine, Faults, expected_text
from processes import starts_ended
from repo_paths import RECIPES

from mmbatch.cli import EXIT_ITEMS_FAILED, EXIT_JOB_FAILED, EXIT_OK


@pytest.fixture
def good(tmp_path: Path, samples: Path) -> Path:
    folder = tmp_path / "good"
    folder.mkdir()
    for name in ["sunset.jpg", "checkerboard.png", "shapes_alpha.png", "arrow_exif_rotated.jpg"]:
        shutil.copyfile(samples / name, folder / name)
    return folder


def rows(out: Path) -> dict[str, dict]:  # type: ignore[type-arg]
    found = [json.loads(line) for line in out.read_text().splitlines()]
    by_id = {r["id"]: r for r in found}
    assert len(by_id) == len(found), "an id has two rows"
    return by_id


def caption(inputs: Path, out: Path, *extra: str, engine: FakeEngine | None = None) -> int:
    argv = ["caption", str(inputs), "--model", "fake", "--out", str(out), "--no-progress"]
    return main([*argv, *extra], engine or FakeEngine())


def test_exit_codes_tell_all_ok_from_some_failed(
    good: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert caption(good, tmp_path / "ok.jsonl") == EXIT_OK
    assert not (tmp_path / "ok.jsonl.quarantine.jsonl").exists()
    (good / "broken.jpg").write_bytes(b"\xff\xd8\xff garbage")
    (good / "empty.png").write_bytes(b"")
    out = tmp_path / "some.jsonl"
    assert caption(good, out) == EXIT_ITEMS_FAILED
    err = capsys.readouterr().err
    assert "failures by kind: 1 empty, 1 not_media" in err
    assert "rows written to" in err
    assert "4 ok, 2 failed" in err
    quarantine = [
        json.loads(line)
        for line in (tmp_path / "some.jsonl.quarantine.jsonl").read_text().splitlines()
    ]
    assert sorted((Path(q["id"]).name, q["stage"], q["kind"]) for q in quarantine) == [
        ("broken.jpg", "decode", "not_media"),
        ("empty.png", "load", "empty"),
    ]


def test_a_finished_job_rerun_does_nothing_and_starts_no_engine(good: Path, tmp_path: Path) -> None:
    out = tmp_path / "o.jsonl"
    assert caption(good, out) == EXIT_OK
    before = out.read_bytes()
    idle = FakeEngine()
    assert caption(good, out, engine=idle) == EXIT_OK
    assert out.read_bytes() == before
    assert idle.added == []
    assert idle.steps == 0


def test_a_resumed_job_keeps_earlier_failures_in_its_exit_code(good: Path, tmp_path: Path) -> None:
    (good / "empty.png").write_bytes(b"")
    out = tmp_path / "o.jsonl"
    assert caption(good, out) == EXIT_ITEMS_FAILED
    assert caption(good, out) == EXIT_ITEMS_FAILED  # nothing redone, the error row stands
    (good / "empty.png").write_bytes((good / "sunset.jpg").read_bytes())  # fixed
    assert caption(good, out, "--retry-errors") == EXIT_OK
    fixed = rows(out)[str(good / "empty.png")]
    assert fixed["error"] is None
    assert fixed["text"] == expected_text([fixed["media_hash"]], fixed["prompt"])
    assert not (tmp_path / "o.jsonl.quarantine.jsonl").exists()


def test_a_changed_job_is_refused_with_the_reason_unless_forced(
    good: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o.jsonl"
    assert caption(good, out, "--max-tokens", "16") == EXIT_OK
    before = out.read_bytes()
    assert caption(good, out, "--max-tokens", "32") == EXIT_JOB_FAILED
    err = capsys.readouterr().err
    assert "was written by a different job (--max-tokens 16 -> 32)" in err
    assert "--force" in err
    # A changed setting is named with its two values, not the whole tables that hold it.
    fps = tmp_path / "fps.jsonl"
    assert caption(good, fps, "--fps", "1") == EXIT_OK
    assert caption(good, fps, "--fps", "2") == EXIT_JOB_FAILED
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "different job (the video decode option fps 1.0 -> 2.0); use another --out" in line
    assert "{" not in line
    assert out.read_bytes() == before
    assert caption(good, out, "--max-tokens", "32", "--force") == EXIT_OK


REFUSAL_WAYS = (
    "use another --out, --overwrite to replace it once this job has finished, or --force to "
    "append to it (its rows are kept; the job record is replaced by this job's)"
)


@pytest.mark.parametrize(
    ("first", "then", "said"),
    [
        (["--prompt", "What is it?"], ["--prompt", "Describe it."], "the prompt changed"),
        (["--max-tokens", "64"], ["--max-tokens", "128"], "--max-tokens 64 -> 128"),
        (["--model", "org/one"], ["--model", "org/two"], "the model changed: org/one -> org/two"),
        (
            ["--prompt", "a", "--temperature", "0.5"],
            ["--prompt", "b", "--seed", "3", "--max-tokens", "9", "--as-clip"],
            "--as-clip off -> on; the prompt changed; and 3 more settings",
        ),
    ],
)
def test_a_refused_rerun_says_what_changed_in_the_users_words(
    good: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    first: list[str],
    then: list[str],
    said: str,
) -> None:
    out = tmp_path / "o.jsonl"
    assert caption(good, out, *first) == EXIT_OK
    capsys.readouterr()
    assert caption(good, out, *then) == EXIT_JOB_FAILED
    last = capsys.readouterr().err.splitlines()[-1]
    assert last == f"mmbatch: error: {out} was written by a different job ({said}); {REFUSAL_WAYS}"


def test_a_rerun_with_nothing_to_do_keeps_the_last_runs_figures(good: Path, tmp_path: Path) -> None:
    out = tmp_path / "o.jsonl"
    summary = tmp_path / "o.jsonl.summary.json"
    assert caption(good, out) == EXIT_OK
    first = json.loads(summary.read_text())
    assert first["stats"]["items_per_second"] > 0
    assert caption(good, out) == EXIT_OK  # 0 items to do
    again = json.loads(summary.read_text())
    measured = ("items_per_second", "wall_seconds", "decodes", "startup_seconds")
    for name in measured:
        assert again["stats"][name] == first["stats"][name], name
    assert again["stats"]["figures_from"] == first["finished_at"]
    assert (again["stats"]["ok"], again["stats"]["total"]) == (4, 4)
    assert caption(good, out) == EXIT_OK  # and again: still the first run's
    assert json.loads(summary.read_text())["stats"]["figures_from"] == first["finished_at"]


def test_a_fatal_engine_error_stops_the_job_saves_rows_and_says_how_to_resume(
    good: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o.jsonl"
    dying = FakeEngine(per_step=1, faults=Faults(die_after_steps=2))
    assert caption(good, out, engine=dying) == EXIT_JOB_FAILED
    err = capsys.readouterr().err
    assert "the fake engine died" in err
    assert "The 2 rows finished are saved" in err
    assert "(2 items left)" in err
    assert "run the same command again to resume" in err
    assert len(rows(out)) == 2
    assert caption(good, out) == EXIT_OK
    done = rows(out)
    assert len(done) == 4
    for row in done.values():
        assert row["text"] == expected_text([row["media_hash"]], row["prompt"])


@pytest.mark.parametrize("suffix", [".parquet", "_folder"])
def test_columnar_outputs_resume_too(good: Path, tmp_path: Path, suffix: str) -> None:
    from mmbatch.output.formats import read_output

    out = tmp_path / f"captions{suffix}"
    fmt = ["--out-format", "datasets"] if suffix == "_folder" else []
    dying = FakeEngine(per_step=1, faults=Faults(die_after_steps=3))
    assert caption(good, out, *fmt, engine=dying) == EXIT_JOB_FAILED
    assert len(list(read_output(out))) == 3  # the rows finished, in the output's own format
    rest = FakeEngine()
    assert caption(good, out, *fmt, engine=rest) == EXIT_OK
    assert len(rest.added) == 1
    done = list(read_output(out))
    assert sorted(Path(r["id"]).name for r in done) == sorted(p.name for p in good.iterdir())
    idle = FakeEngine()
    assert caption(good, out, *fmt, engine=idle) == EXIT_OK  # finished: nothing redone
    assert idle.added == []
    assert len(list(read_output(out))) == 4
    assert not (tmp_path / f"captions{suffix}.rows.jsonl").exists()


def test_a_multi_question_recipe_resumes_by_item(good: Path, tmp_path: Path) -> None:
    recipe = RECIPES / "multi_question.toml"
    out = tmp_path / "answers.jsonl"
    argv = ["run", str(recipe), str(good), "--model", "fake", "--out", str(out)]
    argv.append("--no-progress")
    # Dies after 5 answers: at most two of the four items are complete, none is half written.
    assert main(argv, FakeEngine(per_step=1, faults=Faults(die_after_steps=5))) == EXIT_JOB_FAILED
    first = rows(out)
    assert 0 < len(first) < 4
    rest = FakeEngine()
    assert main(argv, rest) == EXIT_OK
    done = rows(out)
    assert sorted(done) == sorted(str(p) for p in good.iterdir())
    questions = {name for row in done.values() for name in row["outputs"]}
    assert len(questions) > 1
    for row in done.values():
        assert set(row["outputs"]) == questions
        for answer in row["outputs"].values():
            assert answer["text"] == expected_text([row["media_hash"]], answer["prompt"])
    # Only the unfinished items' questions were asked again.
    assert len(rest.added) == (4 - len(first)) * len(questions)


def test_a_recipe_run_into_parquet_writes_parquet(good: Path, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    recipe = RECIPES / "multi_question.toml"
    out = tmp_path / "answers.parquet"
    argv = ["run", str(recipe), str(good), "--model", "fake", "--out", str(out)]
    assert main([*argv, "--no-progress"], FakeEngine()) == EXIT_OK
    assert out.read_bytes()[:4] == b"PAR1"
    table = pq.read_table(out)
    assert table.num_rows == 4
    assert "outputs" in table.column_names


def test_a_job_whose_every_item_is_refused_starts_no_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A batch file whose every line is refused writes its error rows and finishes: no
    engine (nor decode worker) starts for nothing to run."""
    from mmbatch import cli, jobs
    from mmbatch.engine import registry

    def started(*args: object) -> None:
        raise AssertionError("an engine or decode workers were started")

    monkeypatch.setattr(jobs, "_engine", started)
    monkeypatch.setattr(jobs, "start_decoders", started)
    begun: list[FakeEngine] = []

    def begin(host: object, media: object, layout: object) -> tuple[FakeEngine, object]:
        begun.append(FakeEngine())  # the engine begun while the file was read
        return begun[-1], layout

    monkeypatch.setattr(registry, "shared_engine_and_layout", begin)
    closed = mock.patch.object(FakeEngine, "close", autospec=True)
    content = [{"type": "image_url", "image_url": {"url": "https://example.com/a.jpg"}}]
    lines = [
        {"custom_id": "a", "url": "/v1/embeddings", "body": {}},
        {"custom_id": "b", "url": "/v1/chat/completions",
         "body": {"messages": [{"role": "user", "content": content}]}},
    ]  # fmt: skip
    requests = tmp_path / "requests.jsonl"
    requests.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "o.jsonl"
    argv = ["run-openai-batch", str(requests), "--model", "no-such-model", "--out", str(out)]
    with closed as close:
        assert cli.main([*argv, "--no-progress"]) == EXIT_ITEMS_FAILED
        starts_ended()
    assert [c.args[0] for c in close.call_args_list] == begun  # and stopped, not used
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["custom_id"], r["response"]["status_code"]) for r in rows] == [
        ("a", 400),
        ("b", 400),
    ]
    err = capsys.readouterr().err
    assert "none of the 2 requests left can run" in err
    assert "no engine started" in err
    assert "start-up" not in err  # no engine started: no start-up to count
    summary = json.loads((tmp_path / "o.jsonl.summary.json").read_text())
    assert "engines" not in summary["job"]
