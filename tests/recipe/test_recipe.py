"""Recipes: every shipped recipe validates, and every kind of mistake is named."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from repo_paths import RECIPES

from mmbatch.cli import main
from mmbatch.errors import ConfigError
from mmbatch.recipe.spec import load_recipe

REQUIRED = {
    "short_caption",
    "detailed_caption",
    "tags",
    "ocr",
    "structured_extraction",
    "multi_question",
    "video_frame_captions",
    "video_clip_summary",
    "audio_transcription",
}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "recipe.toml"
    path.write_text(textwrap.dedent(text))
    return path


def problems(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        load_recipe(write(tmp_path, text))
    return str(caught.value)


def test_the_required_recipes_ship_and_validate() -> None:
    found = {p.stem: load_recipe(p) for p in RECIPES.glob("*.toml")}
    assert set(found) >= REQUIRED
    kinds = {name: recipe.media.kind for name, recipe in found.items()}
    assert kinds["video_frame_captions"] == kinds["video_clip_summary"] == "video"
    assert kinds["audio_transcription"] == "audio"
    assert len(found["multi_question"].questions) >= 3
    for name in ("tags", "structured_extraction"):
        recipe = found[name]
        assert recipe.output.format == "json"
        assert recipe.sampling.json_schema == recipe.output.schema
        assert json.loads(recipe.output.schema or "")["type"] == "object"
    for recipe in found.values():
        assert recipe.model, recipe.name  # each names the model it was written for


def test_a_single_prompt_recipe(tmp_path: Path) -> None:
    recipe = load_recipe(
        write(
            tmp_path,
            """
            [prompt]
            text = "Describe."
            system = "Be brief."
            [sampling]
            max_tokens = 20
            temperature = 0.5
            seed = 3
            [engine]
            model = "some/model"
            max_model_len = 2048
            limit_mm_per_prompt = { image = 2 }
            [media]
            max_pixels = 1000
            """,
        )
    )
    assert recipe.name == "recipe"  # the file's stem
    assert [(q.name, q.text) for q in recipe.questions] == [("answer", "Describe.")]
    assert recipe.system == "Be brief."
    assert (recipe.sampling.max_tokens, recipe.sampling.temperature) == (20, 0.5)
    assert recipe.sampling.seed == 3
    assert recipe.sampling.json_schema is None
    assert recipe.model == "some/model"
    # [engine] goes to vllm.LLM untouched (minus the model, which EngineConfig carries).
    assert recipe.engine_kwargs() == {"max_model_len": 2048, "limit_mm_per_prompt": {"image": 2}}
    assert recipe.media.kind == "image"
    assert dict(recipe.media.options) == {"max_pixels": 1000}


def test_unknown_keys_are_named_in_every_table(tmp_path: Path) -> None:
    message = problems(
        tmp_path,
        """
        titel = "x"
        [prompt]
        text = "Describe."
        sytem = "typo"
        [sampling]
        max_token = 20
        [media]
        kind = "image"
        fps = 2.0
        [output]
        format = "text"
        shema = {}
        """,
    )
    assert "5 problems" in message
    assert "unknown key in the recipe's top level: 'titel'" in message
    assert "unknown key in [prompt]: 'sytem'" in message
    assert "unknown key in [sampling]: 'max_token' (known: max_tokens," in message
    assert "unknown key in [media] (kind 'image'): 'fps'" in message
    assert "unknown key in [output]: 'shema'" in message


def test_engine_takes_only_the_allow_listed_settings(tmp_path: Path) -> None:
    """Every shape of value a recipe may set passes as written; a key off the list is
    refused by name (with the closest allowed one), and a value of the wrong shape too."""
    recipe = load_recipe(
        write(
            tmp_path,
            """
            [prompt]
            text = "x"
            [engine]
            dtype = "bfloat16"
            quantization = "awq_marlin"
            max_num_seqs = 64
            gpu_memory_utilization = 0.85
            enforce_eager = false
            compilation_config = { mode = "VLLM_COMPILE", cudagraph_capture_sizes = [1, 8] }
            structured_outputs_config = { backend = "xgrammar", disable_any_whitespace = true }
            limit_mm_per_prompt = { image = 2, video = { count = 1, num_frames = 8 } }
            mm_processor_kwargs = { max_pixels = 1003520, size = { longest_edge = 1003520 } }
            override_generation_config = { temperature = 0.2 }
            generation_config = "vllm"
            """,
        )
    )
    assert recipe.engine_kwargs()["limit_mm_per_prompt"]["video"] == {"count": 1, "num_frames": 8}
    assert load_recipe(write(tmp_path, '[prompt]\ntext = "x"\n[engine]\ncompilation_config = 0'))
    message = problems(
        tmp_path,
        """
        [prompt]
        text = "x"
        [engine]
        an_option_only_a_future_vllm_knows = 1
        max_model_length = 4096
        max_num_seqs = "64"
        limit_mm_per_prompt = { image = 2, smell = 1 }
        mm_processor_kwargs = { max_pixels = 1.5 }
        structured_outputs_config = { backend = "my.backend" }
        """,
    )
    assert "6 problems" in message
    assert (
        "[engine] an_option_only_a_future_vllm_knows: not a vLLM engine setting (see `vllm "
        "serve --help`)\n"
    ) in message
    assert (
        "[engine] max_model_length: not a vLLM engine setting (did you mean 'max_model_len'?)\n"
    ) in message
    assert "[engine] max_num_seqs: must be an integer, got '64'\n" in message
    assert "[engine] limit_mm_per_prompt.smell: must be one of image, video, audio" in message
    assert "[engine] mm_processor_kwargs.max_pixels: must be an integer, got 1.5" in message
    assert (
        "[engine] structured_outputs_config.backend: a recipe may set one of 'auto', 'xgrammar'"
    ) in message


@pytest.mark.parametrize(
    ("line", "said"),
    [
        # A misspelt setting a recipe may hold: the right name, not the misspelt one to pass.
        (
            "max_num_seq = 4",
            "[engine] max_num_seq: not a vLLM engine setting (did you mean 'max_num_seqs'?)",
        ),
        (
            "gpu_memory_utilisation = 0.5",
            "[engine] gpu_memory_utilisation: not a vLLM engine setting (did you mean "
            "'gpu_memory_utilization'?)",
        ),
        # One of vLLM's settings that a recipe may not hold: the command line may pass it.
        (
            'download_dir = "/tmp/x"',
            "[engine] download_dir: not a setting a recipe may set; pass it on the command "
            "line instead: --engine-arg download_dir=VALUE",
        ),
        # A misspelt one of those: its right name, to pass on the command line.
        (
            'chat_templat = "x"',
            "[engine] chat_templat: not a vLLM engine setting (did you mean 'chat_template'? "
            "a recipe may not set it; pass it on the command line instead: --engine-arg "
            "chat_template=VALUE)",
        ),
        ("banana = 1", "[engine] banana: not a vLLM engine setting (see `vllm serve --help`)"),
    ],
)
def test_an_unknown_engine_key_is_named_with_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, said: str
) -> None:
    recipe = write(tmp_path, f'[prompt]\ntext = "x"\n[engine]\n{line}\n')
    assert main(["check", str(recipe)]) == 2
    assert capsys.readouterr().err.splitlines() == [f"mmbatch: error: {recipe}: {said}"]


def test_the_allow_list_names_vllms_own_settings_and_choices() -> None:
    """Every setting a recipe may hold is one vLLM has (so the list cannot drift into
    names vLLM would refuse), and every fixed choice is one of vLLM's own."""
    import dataclasses
    import typing

    from vllm.config import CompilationConfig, StructuredOutputsConfig
    from vllm.config.cache import CacheDType
    from vllm.config.model import ModelDType, TokenizerMode
    from vllm.config.multimodal import MMCacheType, MMEncoderTPMode
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader import LoadFormats

    from mmbatch.recipe.engine_table import ENGINE_SETTINGS, Either, OneOf, Table

    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    assert set(ENGINE_SETTINGS) <= fields
    compilation = ENGINE_SETTINGS["compilation_config"]
    assert isinstance(compilation, Either)
    table = compilation.shapes[1]
    assert isinstance(table, Table)
    assert set(table.keys) <= {f.name for f in dataclasses.fields(CompilationConfig)}
    structured = ENGINE_SETTINGS["structured_outputs_config"]
    assert isinstance(structured, Table)
    assert set(structured.keys) <= {f.name for f in dataclasses.fields(StructuredOutputsConfig)}
    for key, literal in {
        "dtype": ModelDType,
        "kv_cache_dtype": CacheDType,
        "tokenizer_mode": TokenizerMode,
        "load_format": LoadFormats,
        "mm_encoder_tp_mode": MMEncoderTPMode,
        "mm_processor_cache_type": MMCacheType,
    }.items():
        shape = ENGINE_SETTINGS[key]
        assert isinstance(shape, OneOf), key
        assert set(shape.choices) <= set(typing.get_args(literal)), key


def test_questions(tmp_path: Path) -> None:
    recipe = load_recipe(
        write(
            tmp_path,
            """
            [prompt]
            [[prompt.questions]]
            name = "subject"
            text = "What?"
            [[prompt.questions]]
            name = "where"
            text = "Where?"
            """,
        )
    )
    assert [q.name for q in recipe.questions] == ["subject", "where"]
    message = problems(
        tmp_path,
        """
        [prompt]
        [[prompt.questions]]
        name = "a"
        text = "x"
        [[prompt.questions]]
        name = "a"
        text = "y"
        [[prompt.questions]]
        name = "b#c"
        text = "z"
        extra = 1
        """,
    )
    assert "the name 'a' is used twice" in message
    assert "'b#c' must be letters" in message
    assert "unknown key in [[prompt.questions]] #3: 'extra'" in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "missing the [prompt] table"),
        ('[prompt]\ntext = "a"\n[[prompt.questions]]\nname="b"\ntext="c"', "exactly one of"),
        ('[prompt]\ntext = "  "', "[prompt] text is empty"),
        ("[prompt]\ntext = 3", "'text' must be a string, got 3"),
        ('prompt = "x"', "'prompt' must be a table"),
        (
            '[prompt]\ntext = "x"\n[sampling]\nmax_tokens = 0',
            "max_tokens = 0: must be an integer >= 1",
        ),
        ('[prompt]\ntext = "x"\n[sampling]\ntemperature = "hot"', "must be a number"),
        ('[prompt]\ntext = "x"\n[sampling]\nmax_tokens = 1.5', "must be an integer"),
        ('[prompt]\ntext = "x"\n[media]\nkind = "smell"', "kind must be one of"),
        ('[prompt]\ntext = "x"\n[media]\nmax_pixels = -4', "max_pixels must be > 0"),
        ('[prompt]\ntext = "x"\n[output]\nformat = "yaml"', "format must be 'text' or 'json'"),
        ('[prompt]\ntext = "x"\n[output]\nformat = "json"', "needs a schema"),
        ('[prompt]\ntext = "x"\n[output]\nschema = {type = "object"}', "format is 'text'"),
        (
            '[prompt]\ntext = "x"\n[output]\nformat = "json"\nschema = {type = "objekt"}',
            "not a valid JSON schema",
        ),
        ('[prompt\ntext = "x"', "not valid TOML"),
    ],
)
def test_mistakes_are_reported(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in problems(tmp_path, text)


def test_every_sampling_range_problem_is_said_at_once(tmp_path: Path) -> None:
    """As [engine] does: a recipe with five bad sampling values names all five (a type
    pydantic refuses beside the ranges)."""
    message = problems(
        tmp_path,
        """
        [prompt]
        text = "x"
        [sampling]
        max_tokens = 0
        top_p = 2.0
        min_p = -1.0
        n = 2
        temperature = 0.0
        seed = "x"
        """,
    )
    assert "5 problems" in message
    assert "[sampling]: 'seed' must be an integer" in message
    assert "[sampling] max_tokens = 0: must be an integer >= 1" in message
    assert "[sampling] top_p = 2.0: must be in (0, 1]" in message
    assert "[sampling] min_p = -1.0: must be in [0, 1]" in message
    assert "[sampling] n = 2: must be 1 at temperature 0" in message


def test_a_hundred_thousand_problems_are_said_in_a_dozen_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every list of problems is cut alike (``mmbatch.validation.listed``): the first ten, then
    how many more; the unknown keys of one table, on their one line, too."""
    recipe = tmp_path / "many.toml"
    keys = "".join(f"k{i} = 1\n" for i in range(100_000))
    recipe.write_text(f'[prompt]\ntext = "x"\n[engine]\n{keys}[sampling]\n{keys}')
    assert main(["check", str(recipe)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == f"mmbatch: error: {recipe}: 100,001 problems:"
    assert len(lines) == 12
    unknown = "unknown keys in [sampling]: 'k0', 'k1', 'k2', 'k3', 'k4', 'k5', 'k6', 'k7', "
    assert lines[1].startswith(f"  {unknown}'k8', 'k9', ... and 99,990 more (known: max_tokens")
    assert [line.split(":")[0] for line in lines[2:11]] == [f"  [engine] k{i}" for i in range(9)]
    assert lines[11] == "  ... and 99,991 more"


@pytest.mark.parametrize(
    ("table", "line", "key"),
    [
        ("sampling", "temperature = inf", "'temperature'"),
        ("sampling", "top_p = nan", "'top_p'"),
        ("sampling", "repetition_penalty = +inf", "'repetition_penalty'"),
        ("engine", "gpu_memory_utilization = nan", "[engine] gpu_memory_utilization"),
        ("engine", "cpu_offload_gb = inf", "[engine] cpu_offload_gb"),
        ("engine", "override_generation_config = { temperature = -inf }", "temperature"),
        ("engine", "mm_processor_kwargs = { fps = nan }", "[engine] mm_processor_kwargs.fps"),
        ("media", 'kind = "video"\nsampling = "fps"\nfps = inf', "'fps'"),
        ("media", 'kind = "audio"\nwindow_s = inf', "'window_s'"),
    ],
)
def test_nan_and_infinity_are_no_setting(tmp_path: Path, table: str, line: str, key: str) -> None:
    """TOML has ``nan`` and ``inf``; no number of a recipe means them."""
    message = problems(tmp_path, f'[prompt]\ntext = "x"\n[{table}]\n{line}')
    assert key in message
    assert "finite" in message


def test_video_and_audio_options_are_checked(tmp_path: Path) -> None:
    message = problems(
        tmp_path,
        """
        [prompt]
        text = "x"
        [media]
        kind = "video"
        sampling = "num_frames"
        fps = 2.0
        as_clip = "yes"
        sample_rate = 16000
        """,
    )
    assert "'fps' is set but sampling is 'num_frames'" in message
    assert "'as_clip' must be true or false" in message
    assert "unknown key in [media] (kind 'video'): 'sample_rate'" in message
    assert "timestamps' list" in problems(
        tmp_path, '[prompt]\ntext = "x"\n[media]\nkind = "video"\nsampling = "timestamps"'
    )
    assert "overlap_s must be below window_s" in problems(
        tmp_path, '[prompt]\ntext = "x"\n[media]\nkind = "audio"\nwindow_s = 5.0\noverlap_s = 5'
    )


def test_every_problem_is_said_with_its_table_and_key(tmp_path: Path) -> None:
    """pydantic's problems (types, unknown keys, choices, bounds) and the rules that tie keys
    together, all in one check, each naming where it is."""
    message = problems(
        tmp_path,
        """
        name = 4
        [prompt]
        [[prompt.questions]]
        name = "a"
        text = "x"
        [[prompt.questions]]
        name = 5
        text = "y"
        [sampling]
        stop = ["a", 1]
        [media]
        kind = "video"
        sampling = "fps"
        fps = 0
        timestamps = [1.0, -2.0]
        [output]
        format = "yaml"
        """,
    )
    assert "8 problems" in message
    assert "the recipe's top level: 'name' must be a string, got 4" in message
    assert "[[prompt.questions]] #2: 'name' must be a string, got 5" in message
    assert "[[prompt.questions]] #2 needs a 'name' and a non-empty 'text'" in message
    assert "[sampling]: 'stop' must be a list of strings, got ['a', 1]" in message
    assert "[media] fps must be > 0, got 0" in message
    assert "[media] timestamps must each be >= 0, got [1.0, -2.0]" in message
    assert "[media] 'timestamps' is set but sampling is 'fps'" in message
    assert "[output] format must be 'text' or 'json', got 'yaml'" in message


def test_reading_a_recipe_imports_no_vllm() -> None:
    code = (
        "import glob, sys\nfrom mmbatch.recipe.spec import load_recipe\n"
        f"for path in glob.glob({str(RECIPES / '*.toml')!r}):\n    load_recipe(path)\n"
        "print(' '.join(m for m in ('torch', 'vllm') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == []


def test_missing_recipe_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read recipe"):
        load_recipe(tmp_path / "nope.toml")


def test_check_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = RECIPES / "multi_question.toml"
    assert main(["check", str(good)]) == 0
    out = capsys.readouterr().out
    assert "multi_question.toml: ok: multi-question: image input, 4 question(s)" in out
    bad = write(tmp_path, '[prompt]\ntext = "x"\n[sampling]\nmax_token = 3\n')
    assert main(["check", str(good), str(bad)]) == 2
    captured = capsys.readouterr()
    assert "unknown key in [sampling]: 'max_token'" in captured.err
    assert "multi_question.toml: ok" in captured.out  # the good one is still reported
    video = RECIPES / "video_clip_summary.toml"
    assert main(["check", str(video)]) == 0
    captured = capsys.readouterr()
    assert "video_clip_summary.toml: ok: video-clip-summary: video input" in captured.out
    # Every shipped recipe's [engine] table is within what a recipe may set.
    shipped = sorted(RECIPES.glob("*.toml"))
    assert main(["check", *map(str, shipped)]) == 0
    assert capsys.readouterr().out.count(": ok: ") == len(shipped)
