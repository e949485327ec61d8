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

Every key is checked: a key a table does not know is an error that names it and lists the
keys it does know, so a typo (``max_token``) fails at ``mmbatch check`` rather than being
ignored for a whole job.

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
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from mmbatch.errors import ConfigError
from mmbatch.recipe.engine_table import engine_problems
from mmbatch.types import InvalidSetting, Modality, Sampling

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

AnswerFormat = Literal["text", "json"]

DEFAULT_ANSWER_NAME = "answer"
"""The name of a single-prompt recipe's answer in the output row, unless [prompt] names it."""

_TOP_KEYS = ("name", "description", "prompt", "sampling", "engine", "media", "output")
_PROMPT_KEYS = ("system", "text", "name", "questions")
_QUESTION_KEYS = ("name", "text")
_SAMPLING_KEYS = {
    "max_tokens": int,
    "temperature": float,
    "top_p": float,
    "top_k": int,
    "min_p": float,
    "repetition_penalty": float,
    "presence_penalty": float,
    "frequency_penalty": float,
    "stop": list,
    "n": int,
    "seed": int,
}
"""``Sampling``'s settings a recipe may set; the others take the model's generation_config."""
_OUTPUT_KEYS = ("format", "schema")
_MEDIA_KEYS: dict[str, dict[str, Any]] = {
    # kind -> option -> expected type. Video and audio options follow issue 3's loaders
    # (VideoOptions, AudioOptions); ``as_clip`` hands the sampled frames over as one video.
    "image": {"max_pixels": int, "max_source_pixels": int},
    "video": {
        "sampling": str,
        "num_frames": int,
        "fps": float,
        "timestamps": list,
        "max_frames": int,
        "max_pixels": int,
        "min_frames": int,
        "min_pixels": int,
        "max_source_pixels": int,
        "as_clip": bool,
    },
    "audio": {"sample_rate": int, "window_s": float, "overlap_s": float},
}
_VIDEO_SAMPLINGS = ("fps", "num_frames", "keyframes", "timestamps")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


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
        problems = _Problems(self.path or "recipe")
        for problem in engine_problems(self.engine):
            problems.add(problem)
        problems.raise_if_any()

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
    return parse_recipe(data, str(path), default_name=path.stem)


def parse_recipe(data: Mapping[str, Any], where: str, default_name: str = "recipe") -> Recipe:
    """Validate a recipe's parsed TOML ``data``; ``where`` names it in error messages."""
    problems = _Problems(where)
    problems.unknown_keys("the recipe's top level", data, _TOP_KEYS)
    name = problems.typed(data, "name", str, "the recipe's top level") or default_name
    description = problems.typed(data, "description", str, "the recipe's top level") or ""
    prompt = problems.table(data, "prompt", required=True)
    system, questions = _prompt(prompt, problems)
    sampling = _sampling(problems.table(data, "sampling"), problems)
    engine = problems.table(data, "engine")
    for problem in engine_problems(engine):
        problems.add(problem)
    media = _media(problems.table(data, "media"), problems)
    output = _output(problems.table(data, "output"), problems)
    problems.raise_if_any()
    if output.schema is not None:
        sampling = replace(sampling, json_schema=output.schema)
    return Recipe(
        name=name,
        description=description,
        system=system,
        questions=questions,
        sampling=sampling,
        engine=MappingProxyType(dict(engine)),
        media=media,
        output=output,
        path=where,
    )


class _Problems:
    """Collects every problem in a recipe, so one ``check`` reports them all at once."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.found: list[str] = []

    def add(self, message: str) -> None:
        self.found.append(message)

    def unknown_keys(self, table: str, data: Mapping[str, Any], known: Any) -> None:
        unknown = [k for k in data if k not in known]
        if unknown:
            self.add(
                f"unknown key{'s' if len(unknown) > 1 else ''} in {table}: "
                f"{', '.join(map(repr, unknown))} (known: {', '.join(known)})"
            )

    def table(self, data: Mapping[str, Any], key: str, required: bool = False) -> dict[str, Any]:
        value = data.get(key)
        if value is None:
            if required:
                self.add(f"missing the [{key}] table")
            return {}
        if not isinstance(value, dict):
            self.add(f"{key!r} must be a table ([{key}]), got {value!r}")
            return {}
        return value

    def typed(self, data: Mapping[str, Any], key: str, kind: type, table: str) -> Any:
        value = data.get(key)
        if value is None:
            return None
        if not _is(value, kind):
            self.add(f"{table}: {key!r} must be {_kind_name(kind)}, got {value!r}")
            return None
        return value

    def raise_if_any(self) -> None:
        if len(self.found) == 1:  # the command's one line
            raise ConfigError(f"{self.where}: {self.found[0]}")
        if self.found:
            lines = "\n  ".join(self.found)
            raise ConfigError(f"{self.where}: {len(self.found)} problems:\n  {lines}")


def _is(value: Any, kind: type) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _kind_name(kind: type) -> str:
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
        kind, f"a {kind.__name__}"
    )


def _prompt(prompt: dict[str, Any], problems: _Problems) -> tuple[str | None, tuple[Question, ...]]:
    problems.unknown_keys("[prompt]", prompt, _PROMPT_KEYS)
    system = problems.typed(prompt, "system", str, "[prompt]")
    text = problems.typed(prompt, "text", str, "[prompt]")
    raw_questions = prompt.get("questions")
    if prompt and (text is None) == (raw_questions is None):
        problems.add("[prompt] needs exactly one of 'text' or [[prompt.questions]]")
        return system, ()
    if text is not None:
        name = problems.typed(prompt, "name", str, "[prompt]") or DEFAULT_ANSWER_NAME
        _check_name(name, "[prompt] name", problems)
        if not text.strip():
            problems.add("[prompt] text is empty")
        return system, (Question(name, text),)
    if "name" in prompt:
        problems.add("[prompt] 'name' names a single answer; each question has its own name")
    if not isinstance(raw_questions, list) or not raw_questions:
        problems.add(
            f"[[prompt.questions]] must be a non-empty array of tables, got {raw_questions!r}"
        )
        return system, ()
    questions: list[Question] = []
    for i, raw in enumerate(raw_questions, start=1):
        where = f"[[prompt.questions]] #{i}"
        if not isinstance(raw, dict):
            problems.add(f"{where} must be a table, got {raw!r}")
            continue
        problems.unknown_keys(where, raw, _QUESTION_KEYS)
        name = problems.typed(raw, "name", str, where)
        q_text = problems.typed(raw, "text", str, where)
        if name is None or q_text is None or not q_text.strip():
            problems.add(f"{where} needs a 'name' and a non-empty 'text'")
            continue
        _check_name(name, f"{where} name", problems)
        if any(q.name == name for q in questions):
            problems.add(f"{where}: the name {name!r} is used twice")
        questions.append(Question(name, q_text))
    return system, tuple(questions)


def _check_name(name: str, where: str, problems: _Problems) -> None:
    if not _NAME.match(name):
        problems.add(f"{where} {name!r} must be letters, digits, '_' or '-'")


def _sampling(table: dict[str, Any], problems: _Problems) -> Sampling:
    problems.unknown_keys("[sampling]", table, tuple(_SAMPLING_KEYS))
    values: dict[str, Any] = {}
    for key, kind in _SAMPLING_KEYS.items():
        value = problems.typed(table, key, kind, "[sampling]")
        if value is not None:
            values[key] = tuple(value) if key == "stop" else value
    try:
        return Sampling(**values)
    except InvalidSetting as exc:
        problems.add(f"[sampling] {exc.field} = {exc.value!r}: must be {exc.rule}")
        return Sampling()


def _media(table: dict[str, Any], problems: _Problems) -> MediaSpec:
    kind = table.get("kind", "image")
    if kind not in _MEDIA_KEYS:
        problems.add(f"[media] kind must be one of {', '.join(_MEDIA_KEYS)}, got {kind!r}")
        return MediaSpec()
    known = _MEDIA_KEYS[kind]
    problems.unknown_keys(f"[media] (kind {kind!r})", table, ("kind", *known))
    options: dict[str, Any] = {}
    for key, expected in known.items():
        value = problems.typed(table, key, expected, "[media]")
        if value is not None:
            options[key] = value
    for key, value in options.items():
        if _is(value, float):
            at_least = ">= 0" if key == "overlap_s" else "> 0"
            if (value < 0) if key == "overlap_s" else (value <= 0):
                problems.add(f"[media] {key} must be {at_least}, got {value!r}")
    if kind == "video":
        _video_options(options, problems)
    if kind == "audio" and "overlap_s" in options:
        window = options.get("window_s", 30.0)
        if options["overlap_s"] >= window:
            problems.add(
                f"[media] overlap_s must be below window_s ({window}), got {options['overlap_s']}"
            )
    return MediaSpec(kind, MappingProxyType(options))


def _video_options(options: dict[str, Any], problems: _Problems) -> None:
    sampling = options.get("sampling", "num_frames")
    if sampling not in _VIDEO_SAMPLINGS:
        problems.add(
            f"[media] sampling must be one of {', '.join(_VIDEO_SAMPLINGS)}, got {sampling!r}"
        )
        return
    timestamps = options.get("timestamps")
    if sampling == "timestamps" and not timestamps:
        problems.add("[media] sampling = 'timestamps' needs a non-empty 'timestamps' list")
    if timestamps is not None and not all(_is(t, float) and t >= 0 for t in timestamps):
        problems.add(f"[media] timestamps must be seconds >= 0, got {timestamps!r}")
    for key, needs in (("fps", "fps"), ("num_frames", "num_frames"), ("timestamps", "timestamps")):
        if key in options and sampling != needs:
            problems.add(
                f"[media] {key!r} is set but sampling is {sampling!r} (set sampling = {needs!r})"
            )


def _output(table: dict[str, Any], problems: _Problems) -> OutputSpec:
    from mmbatch.out.answers import canonical_schema

    problems.unknown_keys("[output]", table, _OUTPUT_KEYS)
    fmt = table.get("format", "text")
    if fmt not in ("text", "json"):
        problems.add(f"[output] format must be 'text' or 'json', got {fmt!r}")
        return OutputSpec()
    schema = table.get("schema")
    if fmt == "text":
        if schema is not None:
            problems.add("[output] schema is set but format is 'text' (set format = 'json')")
        return OutputSpec()
    if schema is None:
        problems.add("[output] format = 'json' needs a schema ([output.schema])")
        return OutputSpec()
    try:
        return OutputSpec("json", canonical_schema(schema, "[output] schema"))
    except ConfigError as exc:
        problems.add(str(exc))
        return OutputSpec()
