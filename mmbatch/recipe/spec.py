"""Recipes: one TOML file per job, read into a frozen ``Recipe`` and checked before any work.

A recipe has five tables, each read by one stage::

    name = "short-caption"                  # optional; defaults to the file's stem
    description = "..."                     # optional
    [prompt]    system = "..."  (optional), and either  text = "..."  (one answer, named by
                name = "..." or "answer") or  [[prompt.questions]]  name = "...", text = "..."
                (several answers per item, one request each, sharing the item's media)
    [sampling]  max_tokens, temperature, top_p, top_k, min_p, repetition_penalty,
                presence_penalty, frequency_penalty, stop, n, seed (what is left out takes
                the model's generation_config)
    [engine]    settings for vllm.LLM, from an allow-list (``engine_table``); model = "..."
                names the model (--model overrides)
    [media]     kind = "image" | "video" | "audio", and that kind's decode options
    [output]    format = "text" | "json"; json needs  schema = {...}  (a JSON Schema)

Every key is checked, by pydantic models of the tables (``RecipeFile``: strict types, no
key a table does not have): a key a table does not know is an error that names it and lists
the keys it does know, so a typo (``max_token``) fails at ``mmbatch check`` rather than being
ignored for a whole job. What pydantic finds, and the rules that tie keys together (one of
``text`` or questions, a sampling mode and its setting), are said one line per problem,
every problem at once.

Recipes are data: TOML only, nothing is evaluated, and a recipe cannot make anything else run
code or read files either. Recipes are shared like documents, so the person running one
decides what code runs and what files are read, on the command line: [engine] may set only
the vLLM settings that name no code and no file (``mmbatch.recipe.engine_table``: numbers,
sizes, dtypes, limits, fixed choices), and not ``trust_remote_code = true`` (the model's own
Python; ``--trust-remote-code`` allows it); ``--engine-arg KEY=VALUE`` sets anything else.
"""

from __future__ import annotations

import re
import sys
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError

from mmbatch.errors import ConfigError
from mmbatch.recipe.engine_table import engine_problems
from mmbatch.types import MODALITIES, Modality, Sampling, sampling_problems
from mmbatch.validation import TYPE_ERRORS, Problem, expected, listed, problems

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

AnswerFormat = Literal["text", "json"]

DEFAULT_ANSWER_NAME = "answer"
"""The name of a single-prompt recipe's answer in the output row, unless [prompt] names it."""

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")

Positive = Annotated[int, Field(gt=0)]
PositiveNumber = Annotated[float, Field(gt=0)]


class _Table(BaseModel):
    """A TOML table: each key typed, strictly (``"64"`` is no integer, ``true`` no number,
    ``nan`` and ``inf`` no setting's value), and no key the table does not have."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class QuestionTable(_Table):
    name: str | None = None
    text: str | None = None


class PromptTable(_Table):
    system: str | None = None
    text: str | None = None
    name: str | None = None
    questions: list[QuestionTable] | None = None


class SamplingTable(_Table):
    """``Sampling``'s settings a recipe may set (the others take the model's
    generation_config); their ranges are ``Sampling``'s own checks."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stop: list[str] | None = None
    n: int | None = None
    seed: int | None = None


class ImageMedia(_Table):
    kind: Literal["image"] = "image"
    max_pixels: Positive | None = None
    max_source_pixels: Positive | None = None


VideoSampling = Literal["fps", "num_frames", "keyframes", "timestamps"]
VIDEO_SAMPLINGS: tuple[str, ...] = typing.get_args(VideoSampling)
VIDEO_SETTINGS = ("fps", "num_frames", "timestamps")
"""A video's sampling settings, each read by the sampling mode of its name alone."""


class VideoMedia(_Table):
    """The video loader's options (``VideoOptions``); ``as_clip`` hands the sampled
    frames over as one video."""

    kind: Literal["video"]
    sampling: VideoSampling | None = None
    num_frames: Positive | None = None
    fps: PositiveNumber | None = None
    timestamps: list[Annotated[float, Field(ge=0)]] | None = None
    max_frames: Positive | None = None
    max_pixels: Positive | None = None
    min_frames: Positive | None = None
    min_pixels: Positive | None = None
    max_source_pixels: Positive | None = None
    as_clip: bool | None = None


class AudioMedia(_Table):
    kind: Literal["audio"]
    sample_rate: Positive | None = None
    window_s: PositiveNumber | None = None
    overlap_s: Annotated[float, Field(ge=0)] | None = None


def _media_kind(table: Any) -> str | None:
    return table.get("kind", "image") if isinstance(table, dict) else None


MediaTable = Annotated[
    Annotated[ImageMedia, Tag("image")]
    | Annotated[VideoMedia, Tag("video")]
    | Annotated[AudioMedia, Tag("audio")],
    Discriminator(_media_kind),
]


class OutputTable(_Table):
    format: AnswerFormat = "text"
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")


class RecipeFile(_Table):
    """A recipe's TOML, as read: the tables and their keys, typed."""

    name: str | None = None
    description: str | None = None
    prompt: PromptTable
    sampling: SamplingTable = SamplingTable()
    engine: dict[str, Any] = Field(default_factory=dict)
    media: MediaTable = ImageMedia()
    output: OutputTable = OutputTable()


@dataclass(frozen=True)
class Question:
    """One prompt asked of every item; its answer is stored under ``name``."""

    name: str
    text: str


@dataclass(frozen=True)
class MediaSpec:
    """The [media] table: which kind of media the recipe reads and how to decode it."""

    kind: Modality = "image"
    options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class OutputSpec:
    """The [output] table: free text, or JSON following ``schema`` (canonical JSON text)."""

    format: AnswerFormat = "text"
    schema: str | None = None


@dataclass(frozen=True)
class Recipe:
    """A validated recipe. ``questions`` holds one entry for a single-prompt recipe."""

    name: str
    questions: tuple[Question, ...]
    system: str | None
    description: str
    sampling: Sampling
    engine: Mapping[str, Any]
    media: MediaSpec
    output: OutputSpec
    path: str | None = None

    def __post_init__(self) -> None:
        # However a Recipe is made (read from TOML, or built in Python and handed to a Ray
        # job), its [engine] holds only what a recipe may set.
        raise_problems(self.path or "recipe", engine_problems(self.engine))

    @property
    def model(self) -> str | None:
        """The model named in [engine], if any."""
        model = self.engine.get("model")
        return str(model) if model is not None else None

    def engine_kwargs(self) -> dict[str, Any]:
        """[engine] without ``model``: the keyword arguments for ``vllm.LLM``."""
        return {k: v for k, v in self.engine.items() if k != "model"}


def load_recipe(path: str | Path) -> Recipe:
    """Read and validate the recipe at ``path``; ``ConfigError`` lists every problem found."""
    path = Path(path)
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except OSError as exc:
        raise ConfigError(f"cannot read recipe {str(path)!r}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{path}: not a recipe: its TOML is nested too deeply") from None
    return parse_recipe(data, str(path), default_name=path.stem)


def parse_recipe(data: Mapping[str, Any], where: str, default_name: str = "recipe") -> Recipe:
    """Validate a recipe's parsed TOML ``data``; ``where`` names it in error messages, which
    list every problem found."""
    found: list[str] = []
    try:
        file: RecipeFile | None = RecipeFile.model_validate(data)
    except ValidationError as exc:
        file = None
        found += _in_words(problems(exc.errors()), data)
    found += _prompt_rules(data.get("prompt"))
    found += _sampling_rules(data.get("sampling"))
    engine = data.get("engine")
    found += engine_problems(engine) if isinstance(engine, Mapping) else []
    found += _media_rules(data.get("media"))
    schema, problem = _output_schema(data.get("output"))
    found += [problem] if problem else []
    raise_problems(where, found)
    assert file is not None  # pydantic found nothing, or the lines above would say what
    return Recipe(
        name=file.name or default_name,
        description=file.description or "",
        system=file.prompt.system,
        questions=_questions(file.prompt),
        sampling=replace(_sampling(file.sampling), json_schema=schema),
        engine=MappingProxyType(dict(file.engine)),
        media=MediaSpec(
            file.media.kind,
            MappingProxyType(file.media.model_dump(exclude_none=True, exclude={"kind"})),
        ),
        output=OutputSpec("json", schema) if schema is not None else OutputSpec(),
        path=where,
    )


def raise_problems(where: str, found: Sequence[str]) -> None:
    """``ConfigError`` listing ``found``, one line each (a single one: the command's one
    line), if there is any; past ``LISTED_AT_MOST``, how many more there are."""
    if len(found) == 1:
        raise ConfigError(f"{where}: {found[0]}")
    if found:
        lines = "\n  ".join(listed(found))
        raise ConfigError(f"{where}: {len(found):,} problems:\n  {lines}")


def _questions(prompt: PromptTable) -> tuple[Question, ...]:
    if prompt.text is not None:
        return (Question(prompt.name or DEFAULT_ANSWER_NAME, prompt.text),)
    return tuple(Question(str(q.name), str(q.text)) for q in prompt.questions or ())


def _sampling(table: SamplingTable) -> Sampling:
    """``Sampling``'s own checks of the ranges (``InvalidSetting``)."""
    return Sampling(**_sampling_values(table))


def _sampling_values(table: SamplingTable) -> dict[str, Any]:
    values = table.model_dump(exclude_none=True)
    if "stop" in values:
        values["stop"] = tuple(values["stop"])
    return values


# What pydantic found, in a recipe's words ------------------------------------------------


def _in_words(found: Sequence[Problem], data: Mapping[str, Any]) -> list[str]:
    """One line per problem pydantic found; the unknown keys of a table on one line."""
    lines: list[str] = []
    unknown: dict[tuple[str | int, ...], list[str]] = {}
    for problem in found:
        if problem.kind == "extra_forbidden":
            unknown.setdefault(problem.loc[:-1], []).append(str(problem.loc[-1]))
        else:
            lines.append(_said(problem, data))
    for table, keys in unknown.items():
        known = ", ".join(f.alias or name for name, f in _model_at(table).model_fields.items())
        plural = "s" if len(keys) > 1 else ""
        where = _table_name(table, kind=True)
        lines.append(
            f"unknown key{plural} in {where}: {', '.join(listed([repr(k) for k in keys]))} "
            f"(known: {known})"
        )
    return lines


def _said(problem: Problem, data: Mapping[str, Any]) -> str:
    loc = problem.loc
    path = _key_path(loc)
    if len(path) == 1 and path[0] in _TABLES:  # a whole table
        key = str(path[0])
        value = data.get(key)
        if problem.kind == "missing":
            return f"missing the [{key}] table"
        if isinstance(value, Mapping) and key == "media" and "kind" in value:  # not known
            return f"[media] kind must be one of {', '.join(MODALITIES)}, got {value['kind']!r}"
        if isinstance(value, Mapping):  # a table, with a key that is no text
            return f"[{key}]: {problem.message}"
        return f"{key!r} must be a table ([{key}]), got {value!r}"
    if path[:2] == ("prompt", "questions") and len(path) <= 3:
        value = _raw(data, path)
        if len(path) == 2:
            return f"[[prompt.questions]] must be a non-empty array of tables, got {value!r}"
        return f"{_table_name(loc)} must be a table, got {value!r}"
    at = max(i for i, step in enumerate(path) if isinstance(step, str))  # the key, not an item
    key = str(path[at])
    table_loc = loc[: at + len(loc) - len(path)]
    table = _table_name(table_loc)
    value = _raw(data, path[: at + 1])
    each = " each" if at < len(path) - 1 else ""
    if problem.kind == "literal_error":
        return f"{table} {key} must be {problem.context.get('expected')}, got {value!r}"
    if problem.kind in _BOUNDS:
        sign, name = _BOUNDS[problem.kind]
        return f"{table} {key} must{each} be {sign} {problem.context.get(name):g}, got {value!r}"
    if problem.kind in TYPE_ERRORS:
        model = _model_at(table_loc)
        field = model.model_fields.get(_field_name(model, key))
        kind = expected(field.annotation, "a table") if field is not None else "another value"
        return f"{table}: {key!r} must be {kind}, got {value!r}"
    return f"{table}: {key!r}: {problem.message}"


_TABLES = ("prompt", "sampling", "engine", "media", "output")
_BOUNDS = {
    "greater_than": (">", "gt"),
    "greater_than_equal": (">=", "ge"),
    "less_than": ("<", "lt"),
    "less_than_equal": ("<=", "le"),
}
"""pydantic's bound errors: the sign, and the key of the bound in the error's context."""


def _key_path(loc: tuple[str | int, ...]) -> tuple[str | int, ...]:
    """``loc`` as keys of the TOML: without the media kind pydantic's union adds."""
    return (loc[0], *loc[2:]) if loc[:1] == ("media",) and len(loc) > 1 else loc


def _model_at(loc: tuple[str | int, ...]) -> type[BaseModel]:
    """The model of the table at pydantic's ``loc``."""
    models: dict[Any, type[BaseModel]] = {
        (): RecipeFile,
        ("prompt",): PromptTable,
        ("sampling",): SamplingTable,
        ("output",): OutputTable,
        ("media", "image"): ImageMedia,
        ("media", "video"): VideoMedia,
        ("media", "audio"): AudioMedia,
    }
    if loc[:2] == ("prompt", "questions"):
        return QuestionTable
    return models.get(tuple(loc), RecipeFile)


def _field_name(model: type[BaseModel], key: str) -> str:
    return next((n for n, f in model.model_fields.items() if (f.alias or n) == key), key)


def _table_name(loc: tuple[str | int, ...], kind: bool = False) -> str:
    """How a recipe's messages name the table at pydantic's ``loc``: ``[sampling]``,
    ``[[prompt.questions]] #2``; ``[media] (kind 'video')`` when ``kind``."""
    if not loc:
        return "the recipe's top level"
    if loc[:2] == ("prompt", "questions") and len(loc) > 2 and isinstance(loc[2], int):
        return f"[[prompt.questions]] #{loc[2] + 1}"
    if loc[0] == "media" and kind and len(loc) > 1:
        return f"[media] (kind {loc[1]!r})"
    return f"[{loc[0]}]"


def _raw(data: Any, path: Sequence[str | int]) -> Any:
    """The value the recipe wrote at ``path`` (None where there is none)."""
    for step in path:
        if isinstance(step, int) and isinstance(data, list) and step < len(data):
            data = data[step]
        elif isinstance(step, str) and isinstance(data, Mapping):
            data = data.get(step)
        else:
            return None
    return data


# The rules that tie keys together ----------------------------------------------------------
# They read the recipe as written, whatever pydantic found, so that one check reports
# everything; a value of the wrong type is pydantic's to report, and passed over here.


def _prompt_rules(prompt: Any) -> list[str]:
    if not isinstance(prompt, Mapping):
        return []
    text, questions = prompt.get("text"), prompt.get("questions")
    if (text is None) == (questions is None):
        return ["[prompt] needs exactly one of 'text' or [[prompt.questions]]"]
    found = []
    if isinstance(text, str):
        name = prompt.get("name", DEFAULT_ANSWER_NAME)
        found += _name_rule(name, "[prompt] name")
        if not text.strip():
            found.append("[prompt] text is empty")
        return found
    if "name" in prompt:
        found.append("[prompt] 'name' names a single answer; each question has its own name")
    if questions == []:
        found.append("[[prompt.questions]] must be a non-empty array of tables, got []")
    names: set[str] = set()
    for i, question in enumerate(questions if isinstance(questions, list) else [], start=1):
        if not isinstance(question, Mapping):
            continue
        where = f"[[prompt.questions]] #{i}"
        name, q_text = question.get("name"), question.get("text")
        if not isinstance(name, str) or not isinstance(q_text, str) or not q_text.strip():
            found.append(f"{where} needs a 'name' and a non-empty 'text'")
            continue
        found += _name_rule(name, f"{where} name")
        if name in names:
            found.append(f"{where}: the name {name!r} is used twice")
        names.add(name)
    return found


def _name_rule(name: Any, where: str) -> list[str]:
    if isinstance(name, str) and not _NAME.match(name):
        return [f"{where} {name!r} must be letters, digits, '_' or '-'"]
    return []


def _sampling_rules(table: Any) -> list[str]:
    """``Sampling``'s range checks, every one at once, of the settings whose types are right
    (the others are pydantic's problems, said already)."""
    if not isinstance(table, Mapping):
        return []
    try:
        SamplingTable.model_validate(table)
        typed = dict(table)
    except ValidationError as exc:
        wrong = {error["loc"][0] for error in exc.errors() if error["loc"]}
        typed = {k: v for k, v in table.items() if k in SamplingTable.model_fields}
        typed = {k: v for k, v in typed.items() if k not in wrong}
    values = SamplingTable.model_validate(typed)
    return [
        f"[sampling] {exc.field} = {exc.value!r}: must be {exc.rule}"
        for exc in sampling_problems(_sampling_values(values))
    ]


def _media_rules(table: Any) -> list[str]:
    if not isinstance(table, Mapping):
        return []
    found = []
    kind = table.get("kind", "image")
    if kind == "video":
        sampling = table.get("sampling", "num_frames")
        if sampling == "timestamps" and not table.get("timestamps"):
            found.append("[media] sampling = 'timestamps' needs a non-empty 'timestamps' list")
        if sampling in VIDEO_SAMPLINGS:
            for key in VIDEO_SETTINGS:
                if key in table and sampling != key:
                    found.append(
                        f"[media] {key!r} is set but sampling is {sampling!r} "
                        f"(set sampling = {key!r})"
                    )
    if kind == "audio" and _is_number(table.get("overlap_s")):
        window = table.get("window_s", 30.0)
        if _is_number(window) and table["overlap_s"] >= window:
            found.append(
                f"[media] overlap_s must be below window_s ({window}), got {table['overlap_s']}"
            )
    return found


def _output_schema(table: Any) -> tuple[str | None, str | None]:
    """[output]'s schema as canonical JSON text, or what is wrong with it."""
    from mmbatch.output.answers import canonical_schema

    if not isinstance(table, Mapping):
        return None, None
    fmt, schema = table.get("format", "text"), table.get("schema")
    if fmt == "text" and schema is not None:
        return None, "[output] schema is set but format is 'text' (set format = 'json')"
    if fmt != "json":
        return None, None
    if schema is None:
        return None, "[output] format = 'json' needs a schema ([output.schema])"
    if not isinstance(schema, Mapping):
        return None, None  # pydantic's problem, said already
    try:
        return canonical_schema(schema, "[output] schema"), None
    except ConfigError as exc:
        return None, str(exc)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
