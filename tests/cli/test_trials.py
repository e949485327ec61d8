"""Trials before a big job: ``--limit N`` runs the first N items of any job command (and a
later run without it goes on with the rest), ``--dry-run`` says what the job would do
without an engine, without vLLM or torch, without writing anything."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fake_engine import FakeEngine
from PIL import Image
from repo_paths import RECIPES, REPO

from mmbatch.cli import EXIT_OK, main


@pytest.fixture(scope="module")
def thousand(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of 1,000 tiny pictures (8x8 PNGs), each of its own colour."""
    folder = tmp_path_factory.mktemp("thousand")
    for n in range(1000):
        Image.new("RGB", (8, 8), (n % 256, n // 256, 7)).save(folder / f"p{n:04d}.png")
    return folder


def rows(out: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_limit_2_of_a_thousand_pictures_captions_the_first_2_and_resume_runs_the_rest(
    thousand: Path, tmp_path: Path
) -> None:
    out = tmp_path / "captions.jsonl"
    argv = ["caption", str(thousand), "--model", "fake", "--out", str(out), "--no-progress"]
    trial = FakeEngine()
    assert main([*argv, "--limit", "2"], trial) == EXIT_OK
    first = [str(thousand / "p0000.png"), str(thousand / "p0001.png")]
    assert [r["id"] for r in rows(out)] == first  # the first 2 in listing order
    assert sorted(added.split(":", 1)[1] for added in trial.added) == first
    written, files = out.read_bytes(), sorted(tmp_path.iterdir())
    assert main([*argv, "--dry-run"], FakeEngine()) == EXIT_OK
    assert out.read_bytes() == written  # a dry run of an output there leaves it be
    assert sorted(tmp_path.iterdir()) == files
    rest = FakeEngine()
    assert main(argv, rest) == EXIT_OK  # the whole job: the 2 rows are kept
    assert len(rest.added) == 998
    assert not {added.split(":", 1)[1] for added in rest.added} & set(first)
    assert len(rows(out)) == 1000


def test_limit_keeps_every_question_of_a_recipes_item(thousand: Path, tmp_path: Path) -> None:
    out = tmp_path / "answers.jsonl"
    recipe = str(RECIPES / "multi_question.toml")
    engine = FakeEngine()
    argv = ["run", recipe, str(thousand), "--model", "fake", "--out", str(out), "--limit", "3"]
    assert main([*argv, "--no-progress"], engine) == EXIT_OK
    assert [Path(r["id"]).name for r in rows(out)] == ["p0000.png", "p0001.png", "p0002.png"]
    assert all(len(r["outputs"]) == 4 for r in rows(out))
    assert len(engine.added) == 3 * 4


def test_limit_cuts_frames_and_openai_batch_jobs(samples: Path, tmp_path: Path) -> None:
    out = tmp_path / "frames.jsonl"
    argv = ["frames", str(samples / "clip.mp4"), "--num-frames", "5", "--out", str(out)]
    assert main([*argv, "--limit", "2", "--no-progress"]) == EXIT_OK  # no model: decode only
    assert [r["frame_index"] for r in rows(out)] == sorted(r["frame_index"] for r in rows(out))
    assert len(rows(out)) == 2
    batch = tmp_path / "batch.jsonl"
    lines = [
        {
            "custom_id": f"r{n}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "user", "content": f"say {n}"}]},
        }
        for n in range(5)
    ]
    batch.write_text("".join(json.dumps(line) + "\n" for line in lines))
    results = tmp_path / "results.jsonl"
    engine = FakeEngine()
    argv = ["run-openai-batch", str(batch), "--model", "fake", "--out", str(results)]
    assert main([*argv, "--limit", "3", "--no-progress"], engine) == EXIT_OK
    assert [r["custom_id"] for r in rows(results)] == ["r0", "r1", "r2"]


def test_limit_applies_on_ray_too(thousand: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """On Ray the job is cut where every face's is (seen by a dry run: Ray is not started)."""
    argv = ["caption", str(thousand), "--model", "fake", "--ray", "--limit", "2", "--dry-run"]
    assert main(argv, FakeEngine()) == EXIT_OK
    said = capsys.readouterr().out
    assert "dry run: 2 items (--limit 2: the first 2)" in said
    assert "plan: 2 requests, 2 distinct media (by source), 2 groups" in said
    assert "one per Ray actor" in said


@pytest.mark.parametrize("limit", ["0", "-1", "two"])
def test_a_limit_that_is_no_count_is_one_line_and_exit_2(
    limit: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["caption", "x.jpg", "--model", "m", "--out", "o.jsonl", f"--limit={limit}"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "not a count of items" in err


def test_dry_run_answers_without_vllm_or_torch_and_writes_nothing(
    tiny_vl_model: Path, samples: Path, tmp_path: Path
) -> None:
    """The user's first question, on the tiny model: the samples listed, what is passed over
    and why, the plan, the token budget and the engines, in a process that never imports
    vLLM nor torch (the seconds that a real run spends before its first answer)."""
    script = (
        "import sys, json\n"
        "from mmbatch.cli import main\n"
        "code = main(sys.argv[1:])\n"
        "print(json.dumps({'code': code, 'heavy': [m for m in ('vllm', 'torch', "
        "'transformers') if m in sys.modules]}))\n"
    )
    argv = ["caption", str(samples), "--model", str(tiny_vl_model), "--dry-run"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", script, *argv],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    said = done.stdout.splitlines()
    assert json.loads(said[-1]) == {"code": 0, "heavy": []}, done.stderr
    text = "\n".join(said)
    assert f"{samples / 'sunset.jpg'}" in text  # the inputs, listed
    assert "1 video (caption it whole with --as-clip)" in text  # passed over, and why
    assert "plan: 7 requests, 7 distinct media (by source), 7 groups" in text
    assert "token budget: 4096 tokens a request" in text
    assert "engines: one engine on this machine" in text
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_dry_run_of_a_recipe_describes_it_as_check_does(
    samples: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mmbatch.cli.describe import describe_recipe
    from mmbatch.recipe.spec import load_recipe

    recipe = str(RECIPES / "multi_question.toml")
    argv = ["run", recipe, str(samples / "sunset.jpg"), "--model", "fake", "--dry-run"]
    assert main(argv, FakeEngine()) == EXIT_OK
    said = capsys.readouterr().out.splitlines()
    assert said[0] == describe_recipe(recipe, load_recipe(recipe), "fake")
    assert "plan: 4 requests, 1 distinct media (by source), 1 groups" in said
    assert list(tmp_path.iterdir()) == []


def test_out_is_needed_but_for_a_dry_run(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["caption", "x.jpg", "--model", "m"])
    assert stop.value.code == 2
    assert capsys.readouterr().err == (
        "mmbatch: error: the following arguments are required: --out (or --dry-run) "
        "(see mmbatch caption --help)\n"
    )
