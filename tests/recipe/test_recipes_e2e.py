"""Every recipe on the real vLLM CPU build with the tiny model, and the two new commands.

The tiny model's weights are random, so its answers are gibberish; what these tests check is
everything around them: each recipe's prompts, sampling, media options and output format go
through the real engine, JSON answers follow the schema because vLLM's structured outputs
enforce it, every item gets exactly one row, and each answer of a multi-question row is the
answer that question gets when asked alone.
"""

from __future__ import annotations

import base64
import json
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from conftest import TINY_ENGINE_FLAGS, TINY_ENGINE_KWARGS
from repo_paths import RECIPES

from mmbatch.cli.run import recipe_job
from mmbatch.engine.config import EngineConfig
from mmbatch.jobs import Job, media_per_prompt, run_in_memory
from mmbatch.media.options import ImageOptions, MediaOptions
from mmbatch.pipeline import RunConfig
from mmbatch.recipe.spec import Recipe, load_recipe
from mmbatch.sources.files import IMAGE_SUFFIXES
from mmbatch.types import MediaRef, Request

pytestmark = pytest.mark.slow

TEXT_TOKENS = 12
IMAGE_RECIPES = [
    "short_caption",
    "detailed_caption",
    "tags",
    "ocr",
    "structured_extraction",
    "multi_question",
]


def tiny_kwargs(recipe: Recipe) -> dict[str, Any]:
    """The recipe's [engine] table with the tiny model's settings over it."""
    return {**recipe.engine_kwargs(), **TINY_ENGINE_KWARGS}


@pytest.fixture(scope="module")
def recipe_engines(
    request: pytest.FixtureRequest, tiny_vl_model: Path, tiny_audio_model: Path
) -> dict[str, Any]:
    """Engines by model, [engine] table and media: image recipes whose table adds nothing
    to the tiny settings share the session's engine; the JSON recipes' (compact structured
    outputs) share another; clips and audio get theirs."""
    engines: dict[str, Any] = {}

    def engine_for(recipe: Recipe, requests: list[Request]) -> Any:
        kwargs = tiny_kwargs(recipe)
        media = media_per_prompt(requests)
        model = tiny_audio_model if recipe.media.kind == "audio" else tiny_vl_model
        if model == tiny_vl_model and kwargs == TINY_ENGINE_KWARGS and media == {"image": 1}:
            return request.getfixturevalue("vl_engine")
        key = json.dumps([str(model), kwargs, media], sort_keys=True)
        if key not in engines:
            from mmbatch.engine.registry import shared_engine

            # Kept for the session (the registry holds it): an in-process engine collected
            # at this module's end would take vLLM's global state, which later modules'
            # engines share, along with it.
            engines[key] = shared_engine(EngineConfig(str(model), kwargs), media)
        return engines[key]

    return {"for": engine_for}


def run_recipe(
    recipe: Recipe, engines: dict[str, Any], inputs: list[str], engine: Any = None
) -> tuple[list[dict], Any]:
    """The recipe's job, as `mmbatch run` does it, on the tiny model's engine."""
    job = recipe_job(recipe, inputs, "tiny")
    engine = engine or engines["for"](recipe, job.requests)
    return run_in_memory(job, engine, RunConfig(progress=False))


def short(recipe: Recipe) -> Recipe:
    """Random weights never stop early; a few tokens show the path as well as 500 would."""
    if recipe.output.format != "text":
        return recipe  # a JSON answer needs its tokens to close
    return replace(recipe, sampling=replace(recipe.sampling, max_tokens=TEXT_TOKENS))


@pytest.mark.parametrize("name", IMAGE_RECIPES)
def test_every_image_recipe_runs_on_the_tiny_model(
    name: str, recipe_engines: dict[str, Any], samples: Path
) -> None:
    recipe = short(load_recipe(RECIPES / f"{name}.toml"))
    rows, stats = run_recipe(recipe, recipe_engines, [str(samples)])
    pictures = [p.name for p in samples.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES]
    assert sorted(Path(r["id"]).name for r in rows) == sorted(pictures)
    assert stats.total == len(rows) == stats.ok + stats.failed
    schema = json.loads(recipe.output.schema) if recipe.output.schema else None
    for row in rows:
        if Path(row["id"]).name == "truncated.jpg":
            assert row["error"]["stage"] == "decode"
            continue
        assert row["error"] is None, row
        assert list(row["outputs"]) == [q.name for q in recipe.questions]
        for answer in row["outputs"].values():
            # Random weights may pick tokens that decode to nothing, so text may be "".
            assert isinstance(answer["text"], str), row
            assert answer["output_tokens"] > 0
            if schema is not None:
                # Enforced while decoding, checked again when the row was assembled.
                assert answer["finish_reason"] == "stop", answer
                assert answer["parsed"] == json.loads(answer["text"], strict=False)
                jsonschema.validate(answer["parsed"], schema)
    assert stats.failed == 1


def test_video_frame_captions_recipe(recipe_engines: dict[str, Any], samples: Path) -> None:
    recipe = short(load_recipe(RECIPES / "video_frame_captions.toml"))
    clip = str(samples / "clip.mp4")
    rows, stats = run_recipe(recipe, recipe_engines, [clip])
    # 1 fps: one row per sampled frame, each carrying its video and time (of the 25 fps
    # clip's frames, those FFmpeg's fps=1 shows: each the last before a half second).
    assert [r["pts"] for r in rows] == pytest.approx([i + 0.48 for i in range(len(rows))])
    assert len(rows) >= 2
    assert all(r["video"] == clip for r in rows)
    assert [r["id"] for r in rows] == [f"{clip}@{r['pts']:.3f}" for r in rows]
    for row in rows:
        assert row["error"] is None, row
        assert row["outputs"]["caption"]["output_tokens"] == TEXT_TOKENS
    assert stats.ok == len(rows)


def test_video_clip_summary_recipe(recipe_engines: dict[str, Any], samples: Path) -> None:
    recipe = short(load_recipe(RECIPES / "video_clip_summary.toml"))
    clip = str(samples / "clip.mp4")
    (row,), stats = run_recipe(recipe, recipe_engines, [clip])
    assert row["id"] == clip
    assert row["error"] is None, row
    assert row["outputs"]["summary"]["output_tokens"] == TEXT_TOKENS
    assert row["media_hash"].startswith("video-")
    assert stats.ok == 1


def test_audio_transcription_recipe(recipe_engines: dict[str, Any], samples: Path) -> None:
    recipe = short(load_recipe(RECIPES / "audio_transcription.toml"))
    tone = str(samples / "tone.wav")
    rows, stats = run_recipe(recipe, recipe_engines, [tone])
    (row,) = rows
    assert row["id"] == tone
    assert row["error"] is None, row
    assert row["start"] == 0.0
    assert row["end"] > 0.5
    assert row["outputs"]["transcript"]["output_tokens"] == TEXT_TOKENS
    assert row["media_hash"].startswith("audio-")
    assert stats.ok == 1


def test_questions_of_one_item_share_its_prefix_and_match_asked_alone(
    vl_engine: Any, samples: Path, request: pytest.FixtureRequest
) -> None:
    recipe = load_recipe(RECIPES / "multi_question.toml")
    # The prefix cache holds whole KV blocks (32 tokens here), and the tiny model sees a
    # picture as a few tokens: a longer system prompt makes the shared prefix span a block.
    system = f"{recipe.system} Be precise, be concrete, and name what you see. " * 2
    recipe = replace(
        recipe, system=system, sampling=replace(recipe.sampling, max_tokens=TEXT_TOKENS)
    )
    names = ["sunset.jpg", "checkerboard.png"]
    rows, stats = run_recipe(recipe, {}, [str(samples / n) for n in names], vl_engine)
    # Each picture decoded at most once for its four questions (not at all when an earlier
    # job on this engine's pipeline still holds it).
    assert stats.decodes <= 2
    by_name = {Path(r["id"]).name: r for r in rows}
    for row in rows:
        cached = [a["cached_tokens"] for a in row["outputs"].values()]
        # Every question after the item's first found the template, the system prompt and
        # the picture's tokens in the prefix cache, so it did not encode the picture again.
        assert sorted(cached)[1:] == [c for c in sorted(cached)[1:] if c >= 32], cached
        assert sum(c > 0 for c in cached) >= len(cached) - 1, cached
    # The reference: each question asked alone (window 1: one request in the engine at a
    # time) on an engine with every cache off.
    alone = [
        Request(
            f"{name}#{q.name}", q.text, (MediaRef("image", str(samples / name)),), recipe.system
        )
        for name in names
        for q in recipe.questions
    ]
    media = MediaOptions(image=ImageOptions(**recipe.media.options))
    uncached = request.getfixturevalue("uncached_vl_engine")
    reference = [  # each question asked on its own, on an engine with its caches off
        row
        for solo in alone
        for row in run_in_memory(Job([solo], recipe.sampling, media), uncached)[0]
    ]
    texts = set()
    for solo in reference:
        name, question = solo["id"].rsplit("#", 1)
        answer = by_name[name]["outputs"][question]
        assert solo["error"] is None
        assert answer["text"] == solo["text"], solo["id"]
        assert answer["output_tokens"] == solo["output_tokens"]
        texts.add(answer["text"])
    assert len(texts) >= 3  # distinct answers, or a swapped one could not be told apart


def test_a_request_vllm_fails_alone_is_an_error_row_not_an_empty_answer(
    recipe_engines: dict[str, Any], samples: Path
) -> None:
    recipe = load_recipe(RECIPES / "tags.toml")
    # vLLM fails a request alone (finish_reason "error") when its grammar does not compile.
    # The one way to make that happen on demand here: xgrammar 0.2.8 warns that vLLM 0.32
    # passes a deprecated argument while compiling, and as an error that warning fails the
    # compilation.
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "max_rollback_tokens is deprecated", DeprecationWarning)
        rows, stats = run_recipe(recipe, recipe_engines, [str(samples / "sunset.jpg")])
    (row,) = rows
    if row["error"] is None:
        pytest.skip("xgrammar no longer warns while compiling: no way left to fail a grammar")
    assert row["error"]["stage"] == "engine"
    assert "finish_reason 'error'" in row["error"]["message"]
    assert row["outputs"]["tags"]["parsed"] is None
    assert stats.failed == 1


def mmbatch(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """The command in this process, with the tiny settings over the recipe's: its engine is
    the one an earlier test kept with the same settings (``mmbatch.engine.registry``: the
    session's, or the JSON recipes'), and its exit code and stderr."""
    from mmbatch.cli import main

    capsys.readouterr()
    code = main([*args, "--no-progress", *TINY_ENGINE_FLAGS])
    return code, capsys.readouterr().err


def test_run_command_writes_one_row_per_item(
    tiny_vl_model: Path, samples: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rows.jsonl"
    code, stderr = mmbatch(
        "run",
        str(RECIPES / "multi_question.toml"),
        str(samples / "sunset.jpg"),
        str(samples / "truncated.jpg"),
        "--model",
        str(tiny_vl_model),
        "--out",
        str(out),
        capsys=capsys,
    )
    assert code == 1, stderr[-3000:]  # the truncated JPEG
    rows = {Path(r["id"]).name: r for r in map(json.loads, out.read_text().splitlines())}
    assert sorted(rows) == ["sunset.jpg", "truncated.jpg"]
    assert rows["truncated.jpg"]["error"]["stage"] == "decode"
    good = rows["sunset.jpg"]
    assert good["error"] is None
    assert list(good["outputs"]) == ["subject", "setting", "mood", "text"]
    assert all(a["text"] for a in good["outputs"].values())
    assert "2 of 2 items: 1 ok, 1 failed (1 at decode)" in stderr
    assert "media: 1 decoded" in stderr


def test_run_openai_batch_command(
    tiny_vl_model: Path, samples: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sunset = (
        "data:image/jpeg;base64," + base64.b64encode((samples / "sunset.jpg").read_bytes()).decode()
    )
    schema = {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "n": {"type": "integer", "minimum": 0, "maximum": 99},
        },
        "required": ["color", "n"],
        "additionalProperties": False,
    }

    def entry(custom_id: str, url: str, text: str, **body: Any) -> str:
        content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]
        return json.dumps(
            {
                "custom_id": custom_id,
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": "gpt-4o",
                    "messages": [{"role": "user", "content": content}],
                    "temperature": 0,
                    **body,
                },
            }
        )

    requests = tmp_path / "requests.jsonl"
    requests.write_text(
        "\n".join(
            [
                entry("inline", sunset, "Describe.", max_tokens=8),
                entry("file", str(samples / "sunset_copy.jpg"), "Describe.", max_tokens=8),
                entry(
                    "json",
                    str(samples / "checkerboard.png"),
                    "Answer as JSON.",
                    max_completion_tokens=200,
                    response_format={
                        "type": "json_schema",
                        "json_schema": {"name": "c", "strict": True, "schema": schema},
                    },
                ),
                entry("broken", str(samples / "truncated.jpg"), "Describe.", max_tokens=8),
                entry("refused", sunset, "Describe.", logit_bias={"7": 5.0}),
            ]
        )
        + "\n"
    )
    out = tmp_path / "results.jsonl"
    code, stderr = mmbatch(
        "run-openai-batch",
        str(requests),
        "--model",
        str(tiny_vl_model),
        "--out",
        str(out),
        "--engine-arg",
        'structured_outputs_config={"backend": "xgrammar", "disable_any_whitespace": true}',
        "--input-root",  # the batch names the samples by absolute path, outside its folder
        str(samples),
        capsys=capsys,
    )
    assert code == 1, stderr[-3000:]
    rows = {r["custom_id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert sorted(rows) == ["broken", "file", "inline", "json", "refused"]
    ok = {k: rows[k]["response"] for k in ("inline", "file", "json")}
    for response in ok.values():
        assert response["status_code"] == 200
        assert response["body"]["object"] == "chat.completion"
    content = {k: r["body"]["choices"][0]["message"]["content"] for k, r in ok.items()}
    # One picture, inline and as a file: the same answer (greedy), from one decode.
    assert content["inline"] == content["file"]
    usage = ok["file"]["body"]["usage"]
    assert usage["completion_tokens"] == 8
    assert ok["json"]["body"]["choices"][0]["finish_reason"] == "stop"
    jsonschema.validate(json.loads(content["json"], strict=False), schema)
    assert rows["broken"]["response"]["status_code"] == 400
    assert rows["broken"]["response"]["body"]["error"]["stage"] == "decode"
    assert rows["broken"]["response"]["body"]["error"]["code"] == "corrupt"
    refused = rows["refused"]["response"]["body"]["error"]["message"]
    assert "unsupported parameter(s): 'logit_bias'" in refused
    assert "5 of 5 items: 3 ok, 2 failed" in stderr
