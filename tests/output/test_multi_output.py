"""Multi-output jobs against the fake engine: one row per item holding every answer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fake_engine import FakeEngine, Faults, expected_text
from repo_paths import RECIPES

from mmbatch.errors import SourceError
from mmbatch.media.options import MediaOptions
from mmbatch.output.answers import JsonParser, canonical_schema
from mmbatch.output.rows import ItemRows
from mmbatch.output.sinks import MemorySink
from mmbatch.pipeline import RunConfig, run_requests
from mmbatch.recipe.requests import recipe_media, recipe_requests, recipe_shape
from mmbatch.recipe.spec import load_recipe
from mmbatch.types import MediaRef, Request, Result, Sampling, Usage


@pytest.fixture
def corpus(tmp_path: Path, samples: Path) -> Path:
    folder = tmp_path / "corpus"
    shutil.copytree(samples, folder)
    (folder / "empty.jpg").write_bytes(b"")
    return folder


def run(requests: list[Request], rows: ItemRows, capacity: int, **engine_kwargs: object) -> tuple:
    """Through the pipeline, the fake engine holding at most ``capacity`` requests."""
    engine = FakeEngine(capacity=capacity, **engine_kwargs)  # type: ignore[arg-type]
    sink = MemorySink()
    run = RunConfig(progress=False)
    stats = run_requests(requests, engine, MediaOptions(), sink, Sampling(), run, rows)
    return stats, sink.rows, engine


def test_every_item_gets_one_row_with_every_answer(corpus: Path) -> None:
    recipe = load_recipe(RECIPES / "multi_question.toml")
    names = [q.name for q in recipe.questions]
    requests = recipe_requests([str(corpus)], recipe)
    assert len(requests) == len(names) * 7
    # The engine holds 3 requests at once, fewer than an item's 4 questions.
    stats, rows, engine = run(requests, recipe_shape(recipe).builder(requests), capacity=3)
    assert sorted(r["id"] for r in rows) == sorted({r.item_id for r in requests})
    assert stats.total == stats.done == 7
    for row in rows:
        assert list(row["outputs"]) == names  # the recipe's order, not the finish order
        if row["error"] is not None:
            continue
        for question in recipe.questions:
            answer = row["outputs"][question.name]
            assert answer["prompt"] == question.text
            assert answer["text"] == expected_text([row["media_hash"]], question.text)
            assert answer["error"] is None
        assert row["output_tokens"] == sum(a["output_tokens"] for a in row["outputs"].values())
    # 7 files, 6 readable, 5 distinct pictures (two names for one), 4 of them decodable:
    # each decoded once, though 4 questions ask about each.
    assert stats.decodes == 4
    # An item's questions reach the engine together (the planner groups them by image);
    # those of the second name for one picture are the first's, answered once
    # (``mmbatch.repeats``).
    items = [request_id.rsplit("#", 1)[0] for request_id in engine.added]
    runs = [items[i : i + 4] for i in range(0, len(items), 4)]
    assert all(len(set(run)) == 1 for run in runs)
    assert len(runs) == 4
    assert stats.answered_by_identical == 4


def test_a_bad_picture_fails_every_answer_with_one_reason(corpus: Path) -> None:
    recipe = load_recipe(RECIPES / "multi_question.toml")
    requests = recipe_requests([str(corpus)], recipe)
    stats, rows, _ = run(requests, recipe_shape(recipe).builder(requests), capacity=8)
    by_name = {Path(r["id"]).name: r for r in rows}
    empty = by_name["empty.jpg"]
    assert empty["error"] == {"stage": "load", "kind": "empty", "message": "empty file (0 bytes)"}
    assert all(a["error"] == empty["error"] for a in empty["outputs"].values())
    assert by_name["truncated.jpg"]["error"]["stage"] == "decode"
    assert stats.failed == 2
    assert stats.failed_by_stage == {"load": 1, "decode": 1}


def test_a_refused_question_fails_alone(samples: Path) -> None:
    recipe = load_recipe(RECIPES / "multi_question.toml")
    requests = recipe_requests([str(samples / "sunset.jpg")], recipe)
    refused = recipe.questions[1].text
    stats, rows, _ = run(
        requests,
        recipe_shape(recipe).builder(requests),
        capacity=8,
        faults=Faults(reject_prompts=frozenset({refused})),
    )
    (row,) = rows
    outputs = row["outputs"]
    assert outputs["setting"]["error"]["stage"] == "validate"
    assert outputs["setting"]["text"] is None
    for name in ("subject", "mood", "text"):
        assert outputs[name]["error"] is None
        assert outputs[name]["text"]
    assert row["error"]["stage"] == "validate"
    assert row["error"]["message"].startswith("1 of 4 outputs failed (setting: validate: ")
    assert stats.failed == 1
    assert stats.ok == 0


def test_single_question_recipes_keep_a_manifest_prompt_and_multi_refuse_it(
    tmp_path: Path, samples: Path
) -> None:
    manifest = tmp_path / "m.jsonl"
    shutil.copyfile(samples / "sunset.jpg", tmp_path / "sunset.jpg")  # inside the root
    manifest.write_text(json.dumps({"path": "sunset.jpg", "id": "a", "prompt": "Own?"}) + "\n")
    single = load_recipe(RECIPES / "short_caption.toml")
    (request,) = recipe_requests([str(manifest)], single)
    assert (request.id, request.item_id, request.output) == ("a#caption", "a", "caption")
    assert request.prompt == "Own?"
    with pytest.raises(SourceError, match="brings its own prompt"):
        recipe_requests([str(manifest)], load_recipe(RECIPES / "multi_question.toml"))


def test_video_and_audio_recipes_make_their_items(samples: Path) -> None:
    clip, tone = str(samples / "clip.mp4"), str(samples / "tone.wav")
    frames = recipe_requests([clip], load_recipe(RECIPES / "video_frame_captions.toml"))
    assert len(frames) >= 2  # 1 fps over a 2 s clip
    for request in frames:
        columns = dict(request.columns)
        assert request.item_id == f"{clip}@{columns['pts']:.3f}"
        assert request.id == f"{request.item_id}#caption"
        assert columns["video"] == clip
        assert [m.modality for m in request.media] == ["image"]
    (summary,) = recipe_requests([clip], load_recipe(RECIPES / "video_clip_summary.toml"))
    assert (summary.item_id, summary.output) == (clip, "summary")
    assert [m.modality for m in summary.media] == ["video"]
    (speech,) = recipe_requests([tone], load_recipe(RECIPES / "audio_transcription.toml"))
    assert (speech.item_id, speech.media[0].modality) == (tone, "audio")
    assert dict(speech.columns)["start"] == 0.0
    clip_media = recipe_media(load_recipe(RECIPES / "video_clip_summary.toml"))
    assert clip_media.video.num_frames == 8
    assert clip_media.video.min_frames == 4


SCHEMA = canonical_schema(
    {
        "type": "object",
        "properties": {"n": {"type": "integer", "maximum": 5}},
        "required": ["n"],
    },
    "test",
)


@pytest.mark.parametrize(
    ("text", "parsed", "error"),
    [
        ('{"n": 3}', {"n": 3}, None),
        ('{"n": 9}', None, "JSON does not match the schema at n: 9 is greater than the maximum"),
        ('{"m": 1}', None, "at (root): 'n' is a required property"),
        ('{"n": 3', None, "not valid JSON"),
    ],
)
def test_json_answers_are_parsed_and_checked(text: str, parsed: object, error: str | None) -> None:
    requests = [
        Request("x#a", "p", item_id="x", output="a"),
        Request("x#b", "q", item_id="x", output="b"),
    ]
    rows = ItemRows(requests, JsonParser(SCHEMA))
    assert rows.add(requests[0], (), Result("x#a", '{"n": 1}', "stop", Usage(5, 4, 2))) is None
    assert rows.unfinished() == ["x"]
    row = rows.add(requests[1], (), Result("x#b", text, "length", Usage(5, 6, 3)))
    assert row is not None
    assert rows.unfinished() == []
    answer = row.data["outputs"]["b"]
    assert answer["parsed"] == parsed
    assert answer["text"] == text  # the raw text is kept either way
    assert row.data["outputs"]["a"]["parsed"] == {"n": 1}
    assert (row.data["prompt_tokens"], row.data["output_tokens"]) == (10, 10)
    assert row.data["cached_tokens"] == 5
    if error is None:
        assert answer["error"] is None
        assert row.outcome.error is None
    else:
        assert answer["error"]["stage"] == "parse"
        assert error in answer["error"]["message"]
        assert row.outcome.error is not None
        assert row.outcome.error.stage == "parse"


def test_item_rows_refuse_ambiguous_requests() -> None:
    with pytest.raises(ValueError, match="names no item_id"):
        ItemRows([Request("a", "p")])
    twice = [Request(f"a{i}", "p", item_id="a", output="o") for i in range(2)]
    with pytest.raises(ValueError, match="asks 'o' twice"):
        ItemRows(twice)


def test_items_sharing_a_picture_still_get_their_own_rows(samples: Path) -> None:
    ref = (MediaRef("image", str(samples / "sunset.jpg")),)
    requests = [
        Request(f"{item}#{q}", q, ref, item_id=item, output=q)
        for item in ("one", "two")
        for q in ("a", "b")
    ]
    stats, rows, _ = run(requests, ItemRows(requests), capacity=2, per_step=1)
    assert sorted(r["id"] for r in rows) == ["one", "two"]
    assert stats.decodes == 1
