"""Sampling: the same settings from the command line, recipes, OpenAI batch lines and the
Python API; the model's generation_config under what is left unset; n completions per item."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import TINY_ENGINE_KWARGS
from fake_cli import main
from fake_engine import FakeEngine, expected_text
from repo_paths import RECIPES

from mmbatch.cli import EXIT_OK
from mmbatch.jobs import Job, run_in_memory
from mmbatch.pipeline import RunConfig
from mmbatch.recipe.spec import parse_recipe
from mmbatch.types import InvalidSetting, MediaRef, Request, Sampling, Turn


def rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_caption_asks_for_n_completions_and_rows_list_them(samples: Path, tmp_path: Path) -> None:
    out = tmp_path / "o.jsonl"
    engine = FakeEngine()
    argv = ["caption", str(samples / "sunset.jpg"), "--model", "m", "--out", str(out)]
    flags = ["--n", "3", "--temperature", "0.8", "--top-k", "5", "--no-progress"]
    assert main([*argv, *flags], engine) == EXIT_OK
    [row] = rows(out)
    base = expected_text([row["media_hash"]], row["prompt"])
    assert row["text"] == [f"{base}#{i}" for i in range(3)]
    assert row["finish_reason"] == ["stop"] * 3
    assert row["output_tokens"] == sum(map(len, row["text"]))
    [sampling] = engine.sampling.values()
    assert (sampling.n, sampling.top_k, sampling.temperature) == (3, 5, 0.8)


def test_run_takes_sampling_flags_over_the_recipe(samples: Path, tmp_path: Path) -> None:
    recipe = RECIPES / "structured_extraction.toml"
    out = tmp_path / "o.jsonl"
    engine = FakeEngine()
    argv = ["run", str(recipe), str(samples / "sunset.jpg"), "--model", "m"]
    flags = ["--max-tokens", "7", "--temperature", "0.3", "--stop", "END", "--stop", "STOP"]
    flags += ["--repetition-penalty", "1.1", "--out", str(out), "--no-progress"]
    # The fake's answers are not JSON: the row is an error, but the request went out.
    main([*argv, *flags], engine)
    [sampling] = set(engine.sampling.values())
    assert (sampling.max_tokens, sampling.temperature) == (7, 0.3)
    assert (sampling.stop, sampling.repetition_penalty) == (("END", "STOP"), 1.1)
    assert sampling.json_schema is not None  # the recipe's schema is kept
    record = json.loads((tmp_path / "o.jsonl.job.json").read_text())
    assert record["fingerprint"]["sampling"]["max_tokens"] == 7


def test_recipes_take_every_sampling_setting() -> None:
    table = {
        "max_tokens": 9,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 40,
        "min_p": 0.1,
        "repetition_penalty": 1.05,
        "presence_penalty": 0.2,
        "frequency_penalty": 0.3,
        "stop": ["\n\n"],
        "n": 2,
        "seed": 7,
    }
    recipe = parse_recipe({"prompt": {"text": "x"}, "sampling": table}, "r.toml")
    assert recipe.sampling == Sampling(**{**table, "stop": ("\n\n",)})


def test_a_json_recipe_parses_each_of_n_answers(samples: Path) -> None:
    schema = {"type": "string"}
    recipe = parse_recipe(
        {
            "prompt": {"text": "x"},
            "sampling": {"n": 2, "temperature": 0.5},
            "output": {"format": "json", "schema": schema},
        },
        "r.toml",
    )
    from mmbatch.cli.run import recipe_job

    job = recipe_job(recipe, [str(samples / "sunset.jpg")], "m")
    [row], _ = run_in_memory(job, FakeEngine(), RunConfig(progress=False))
    answer = row["outputs"]["answer"]
    # The fake's texts are not JSON strings: both fail to parse, and the answer says so.
    assert len(answer["text"]) == 2
    assert answer["parsed"] is None
    assert answer["error"]["stage"] == "parse"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"top_k": -2}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"n": 0}, "n"),
        ({"n": 2}, "n"),  # greedy (temperature 0) gives one answer however often asked
        ({"stop": "\n"}, "stop"),
        ({"temperature": True}, "temperature"),
    ],
)
def test_settings_out_of_range_name_themselves(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidSetting) as info:
        Sampling(**kwargs)
    assert info.value.field == field


# --- on the real engine ------------------------------------------------------------


@pytest.fixture(scope="module")
def penalised_model(tiny_vl_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's tiny model (same weights) whose generation_config sets a strong
    repetition penalty, as Qwen's sets a mild one."""
    model = tmp_path_factory.mktemp("penalised") / "model"
    shutil.copytree(tiny_vl_model, model)
    config = json.loads((model / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps({**config, "repetition_penalty": 3.0}))
    return model


def texts(engine: Any, samples: Path, sampling: Sampling) -> list[str | None]:
    requests = [
        Request(name, "Describe.", (MediaRef("image", str(samples / name)),))
        for name in ("sunset.jpg", "checkerboard.png", "shapes_alpha.png")
    ]
    got, _ = run_in_memory(Job(requests, sampling), engine, RunConfig(progress=False))
    assert all(row["error"] is None for row in got)
    return [row["text"] for row in sorted(got, key=lambda row: row["id"])]


@pytest.mark.slow
def test_the_model_generation_config_applies_to_what_is_left_unset(
    vl_engine: Any, penalised_model: Path, samples: Path
) -> None:
    from mmbatch.engine.config import EngineConfig
    from mmbatch.engine.registry import shared_engine

    # The engine runs in its own process (a ReplicaEngine): what it applies shows in its text.
    engine = shared_engine(EngineConfig(str(penalised_model), TINY_ENGINE_KWARGS), {"image": 1})
    greedy = Sampling(max_tokens=24)
    plain = texts(vl_engine, samples, greedy)
    # Same weights, the model's penalty applied: the random model's repeats change.
    assert texts(engine, samples, greedy) != plain
    # A setting given explicitly wins over the model's.
    assert texts(engine, samples, Sampling(max_tokens=24, repetition_penalty=1.0)) == plain


@pytest.mark.slow
def test_n_completions_and_stop_strings_on_the_engine(vl_engine: Any, samples: Path) -> None:
    [greedy, *_] = texts(vl_engine, samples, Sampling(max_tokens=24))
    assert isinstance(greedy, str)
    assert len(greedy) > 8
    cut = greedy[len(greedy) // 2 :][:3]
    [stopped, *_] = texts(vl_engine, samples, Sampling(max_tokens=24, stop=(cut,)))
    assert stopped == greedy[: greedy.index(cut)]
    [several, *_] = texts(vl_engine, samples, Sampling(max_tokens=8, n=3, temperature=1.0, seed=3))
    assert isinstance(several, list)
    assert len(several) == 3
    assert len(set(several)) > 1


@pytest.mark.slow
def test_a_conversation_renders_as_vllm_chat_renders_it(uncached_vl_engine: Any) -> None:
    """A multi-turn batch line gets what vLLM's own chat entry point gives the same messages
    (the text and the prompt's length), at temperature 0. The engine is the in-process one:
    the reference needs its ``LLM``."""
    vl_engine = uncached_vl_engine
    from vllm import SamplingParams

    history = (Turn("user", "Name a colour."), Turn("assistant", "Blue."))
    request = Request("c", "And another?", system="Be brief.", history=history)
    sampling = Sampling(max_tokens=12)
    [row], _ = run_in_memory(Job([request], sampling), vl_engine, RunConfig(progress=False))
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "And another?"},
    ]
    [reference] = vl_engine.llm.chat(
        messages, SamplingParams(max_tokens=12, temperature=0.0), use_tqdm=False
    )
    assert row["text"] == reference.outputs[0].text
    assert row["prompt_tokens"] == len(reference.prompt_token_ids)
