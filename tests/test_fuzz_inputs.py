"""Property-based fuzzing of what a job reads from elsewhere: manifests, OpenAI batch files and
recipes. Whatever the input, it ends as rows (a request per item, an error row for each
item that cannot run) or as a ``MmbatchError`` the command says in its ``mmbatch: error:``
line (exit 2): never another exception, never a traceback.

Each input line ends as one row (an error row for a line that cannot run) or the input as a
whole as one refusal; nothing is printed on the way (no traceback, not even one of an object
cleaned up later), and no connection is made: a check runs offline and says so if something
tried.

The generators mix well-formed entries, near misses (a NUL byte, a lone surrogate, NaN, a
path out of the folder, a ``$ref`` to a URL, a ``$schema`` that is an object, a URL of every
protocol fsspec knows) and noise; the listing and parsing layers run in-process, with no
engine, so thousands of cases take seconds.

The cases are the same from run to run and whatever ran before in the process, so that a
failure is a bug and not the order of the tests: ``derandomize`` seeds the draws from the
test alone, no example database carries cases between runs, and the draws leave out the
constants Hypothesis would otherwise mix in from the source of every local module imported
so far (``drawn_from_the_strategies_alone``), which a test run alone and one in the whole
tier would not share. Cases found once are kept as ``@example``s."""

from __future__ import annotations

import gc
import io
import itertools
import json
import math
import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr
from pathlib import Path
from typing import Any
from unittest import mock

import fsspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from mmbatch import cli
from mmbatch.errors import MmbatchError
from mmbatch.jsonl import encode_line, printable
from mmbatch.openai_batch.reader import read_batch
from mmbatch.openai_batch.writer import OpenAIBatchShape
from mmbatch.output.rows import output_row
from mmbatch.recipe.engine_table import ENGINE_SETTINGS
from mmbatch.recipe.spec import SamplingTable, load_recipe, parse_recipe
from mmbatch.sources.files import SourcePolicy, image_requests
from mmbatch.sources.log import ListingLog
from mmbatch.sources.paths import LocalPaths
from mmbatch.types import Request, Result, Usage


def fuzz(examples: int) -> Any:
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


@pytest.fixture(autouse=True)
def drawn_from_the_strategies_alone(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Hypothesis draws now and then from the constants it finds in the source of every
    local module imported so far (its "local constants"): what a test draws would depend on
    the tests and imports before it in the process, a test run alone drawing other cases
    than the same test in the whole tier. Here it draws from the strategies (and its own
    fixed constants) alone."""
    from hypothesis.internal.conjecture import providers
    from hypothesis.internal.constants_ast import Constants

    monkeypatch.setattr(providers, "_get_local_constants", Constants)
    providers.CONSTANTS_CACHE.cache.clear()  # filtered from the pool in use before
    yield
    providers.CONSTANTS_CACHE.cache.clear()


NASTY_TEXT = [
    "", " ", ".", "..", "a\0b", "\udc80", "b\udc80.jpg", "\ud800", "x" * 300, "%00", "\n",
    "ok.jpg", "../secret.jpg", "/etc/hostname", "file:///etc/hostname", "file://host/x.jpg",
    "file:///tmp/x%00.jpg", "file://localhost/ok.jpg", "http://127.0.0.1:9/x.jpg", "ftp://a/b",
    "link_out.jpg", "sub/../ok.jpg", "sub", "missing.jpg", "~/x.jpg", "data:image/png;base64,@@",
]  # fmt: skip
"""Strings that have broken inputs before, or come close to the rules."""
KNOWN_PROTOCOLS = sorted(fsspec.available_protocols())
"""Every protocol fsspec has a file system for (its own list, the same in every process of
one installation: imports that register more at run time add to another list)."""
PROTOCOL_URLS = [f"{p}://host/b.jpg" for p in KNOWN_PROTOCOLS]
TAKEN = frozenset({"s3", "s3a", "s3n", "gs", "gcs", "hf", "http", "https", "file"})
"""The protocols the manual says mmbatch takes (Security); a URL of any other is its row's
error."""

texts = st.one_of(st.sampled_from(NASTY_TEXT), st.sampled_from(PROTOCOL_URLS), st.text(max_size=20))
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    texts,
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
DEEP = ["[" * 100_000, "{" * 5000, '{"a":' * 3000 + "1" + "}" * 3000]
raw_lines = st.one_of(
    st.sampled_from(["", "{", "null", "[]", '"x"', "NaN", '{"path": "a"', *DEEP]),
    st.text(max_size=40),
)


def as_line(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def write_lines(path: Path, lines: list[str]) -> Path:
    # surrogatepass: a raw line holding a lone surrogate is a line that is not UTF-8.
    path.write_bytes("".join(line + "\n" for line in lines).encode("utf-8", "surrogatepass"))
    return path


@pytest.fixture
def folder(tmp_path: Path, samples: Path) -> Path:
    return input_folder(tmp_path, samples)


def input_folder(tmp_path: Path, samples: Path) -> Path:
    """An input folder: a picture, a folder, a link out of it, a secret beside it."""
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "ok.jpg").write_bytes((samples / "sunset.jpg").read_bytes())
    (tmp_path / "secret.jpg").write_bytes(b"secret")
    (data / "link_out.jpg").symlink_to(tmp_path / "secret.jpg")
    return data


@contextmanager
def quiet_and_offline() -> Iterator[None]:
    """What runs inside prints nothing on stderr (no traceback, no "Exception ignored" of an
    object half made and cleaned up later) and connects nowhere: an attempt is refused
    (``OSError``) and fails the check."""
    said = io.StringIO()
    tried: list[str] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        tried.append(repr(args[1:] if args and isinstance(args[0], socket.socket) else args))
        raise OSError("no connection is made while listing inputs")

    def unraisable(info: Any) -> None:
        tried.append(f"Exception ignored in {info.object!r}: {info.exc_type.__name__}")

    with (
        redirect_stderr(said),
        mock.patch.object(sys, "unraisablehook", unraisable),
        mock.patch.object(socket.socket, "connect", refuse),
        mock.patch.object(socket.socket, "connect_ex", refuse),
        mock.patch.object(socket, "create_connection", refuse),
        mock.patch.object(socket, "getaddrinfo", refuse),
    ):
        yield
        # Objects made on the way go now, while the hook listens (the young generations:
        # a whole collection per case would cost more than the case; what lives longer is
        # collected later, under pytest's own hook, and fails the test as well).
        gc.collect(1)
    assert not tried, tried
    assert "Traceback" not in said.getvalue(), said.getvalue()


def items_named(path: Path) -> list[str]:
    """The ids of a manifest's items, one per non-blank line, as its reader makes them (an
    id, else the path), each once: a line naming the same file under the same id again is
    the same item."""
    ids: dict[str, None] = {}
    for line in path.read_bytes().split(b"\n"):
        if line.strip():
            row = json.loads(line)
            ids[printable(str(row.get("id", row.get("path"))))] = None
    return list(ids)


def assert_said(exc: MmbatchError, where: str = "") -> None:
    """A job-level refusal: its message is the command's error line (one, or a first line
    and the problems it lists), naming ``where`` first when given."""
    message = str(exc)
    assert message.strip(), repr(exc)
    assert message.startswith(where), message
    assert "Traceback" not in message


def assert_rows(requests: list[Request]) -> None:
    """Each request ends as a row a sink can write, whether it is an error or runs."""
    assert requests
    for request in requests:
        result = (
            Result(request.id, error=request.error)
            if request.error is not None
            else Result(request.id, "a caption", "stop", Usage(3, 2))
        )
        encode_line(output_row(request, (), result))
        if request.error is None:
            assert all(ref.source or ref.data is not None for ref in request.media)


# Manifests ---------------------------------------------------------------------------------

manifest_rows = st.one_of(
    st.fixed_dictionaries(
        {"path": texts},
        optional={"id": json_values, "prompt": json_values, "note": json_values},
    ),
    st.dictionaries(texts, json_values, max_size=4),
)
manifest_lines = st.lists(st.one_of(manifest_rows.map(as_line), raw_lines), min_size=1, max_size=6)


def check_manifest(
    folder: Path, lines: list[str], allow_urls: bool, anywhere: bool
) -> list[Request] | None:
    """The manifest's requests, checked; None where it is refused as a whole."""
    manifest = write_lines(folder / "items.jsonl", lines)
    policy = SourcePolicy(LocalPaths(anywhere=anywhere), allow_urls, keep_columns="all")
    try:
        with quiet_and_offline():
            requests = image_requests([str(manifest)], "p", policy=policy, log=ListingLog())
    except MmbatchError as exc:
        assert_said(exc)
        return None
    assert_rows(requests)
    assert [r.id for r in requests] == items_named(manifest)  # a row for each line
    outside = folder.parent / "secret.jpg"
    if not anywhere:  # nothing outside the folder is ever named to the reader
        assert not any(
            Path(ref.source).resolve() == outside
            for r in requests
            if r.error is None
            for ref in r.media
            if os.path.exists(ref.source)
        )
    return requests


csv_bodies = st.lists(st.one_of(texts, st.sampled_from(["path,id", "\ufeffpath", "a,b,c"])))


def check_csv_manifest(folder: Path, body: list[str]) -> None:
    manifest = write_lines(folder / "items.csv", ["path,id,prompt", *body])
    try:
        with quiet_and_offline():
            requests = image_requests([str(manifest)], "p", log=ListingLog())
    except MmbatchError as exc:
        assert_said(exc)
        return
    assert_rows(requests)


# OpenAI batch files ------------------------------------------------------------------------

SCHEMA_WORDS = [
    "type", "$ref", "not", "items", "$id", "$schema", "$defs", "definitions", "properties",
    "required", "enum", "const", "pattern", "patternProperties", "format", "allOf", "anyOf",
    "oneOf", "if", "then", "else", "minimum", "maximum", "multipleOf", "minLength",
    "maxLength", "minItems", "uniqueItems", "contains", "prefixItems", "additionalProperties",
    "unevaluatedProperties", "propertyNames", "dependentRequired", "$anchor",
    "$dynamicAnchor", "$dynamicRef", "$recursiveRef", "$vocabulary", "$comment", "default",
]  # fmt: skip
"""The key words of JSON Schema a schema is made of (what validators dispatch on)."""
schemas = st.one_of(
    st.sampled_from(
        [
            {"type": "object"},
            {"$schema": {}},
            {"$schema": ["https://json-schema.org/draft/2020-12/schema"]},
            {"$schema": "http://json-schema.org/draft-03/schema#"},
            {"$schema": "https://example.invalid/unknown"},
            {"$ref": "http://127.0.0.1:9/s.json"},
            {"$ref": "file:///etc/hostname"},
            {"$ref": "#/$defs/missing"},
            {"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n"},
            {"$dynamicRef": "#x"},
            {"items": {"$ref": "#/items"}},
            {"type": "objekt"},
        ]
    ),
    st.dictionaries(st.sampled_from(SCHEMA_WORDS), json_values),
)
image_parts = texts.map(lambda url: {"type": "image_url", "image_url": {"url": url}})
parts = st.one_of(texts.map(lambda t: {"type": "text", "text": t}), image_parts, json_values)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "tool", "developer", 3])},
        optional={"content": st.one_of(texts, st.lists(parts, max_size=3), json_values)},
    ),
    max_size=4,
)
bodies = st.fixed_dictionaries(
    {"messages": messages},
    optional={
        "max_tokens": json_values,
        "temperature": st.one_of(st.floats(allow_nan=True, allow_infinity=True), json_values),
        "top_p": json_values,
        "n": json_values,
        "seed": json_values,
        "stop": json_values,
        "logprobs": json_values,
        "stream": json_values,
        "response_format": st.one_of(
            st.builds(
                lambda s: {"type": "json_schema", "json_schema": {"name": "s", "schema": s}},
                schemas,
            ),
            json_values,
        ),
        "tools": json_values,
    },
)
batch_entries = st.fixed_dictionaries(
    {"custom_id": texts},
    optional={
        "method": st.sampled_from(["POST", "GET", 1]),
        "url": st.sampled_from(["/v1/chat/completions", "/v1/embeddings", None]),
        "body": st.one_of(bodies, json_values),
    },
)
batch_lines = st.lists(
    st.one_of(batch_entries.map(as_line), batch_entries.map(as_line), raw_lines),
    min_size=1,
    max_size=5,
)


def check_batch_file(folder: Path, lines: list[str], anywhere: bool = False) -> None:
    requests_file = write_lines(folder / "requests.jsonl", lines)
    try:
        with quiet_and_offline():
            batch = read_batch(requests_file, paths=LocalPaths(anywhere=anywhere))
    except MmbatchError as exc:
        assert_said(exc)
        return
    custom_ids = [
        json.loads(line)["custom_id"]
        for line in requests_file.read_bytes().split(b"\n")
        if line.strip()
    ]
    assert [r.id for r in batch.requests] == custom_ids  # one row for each line
    shape = OpenAIBatchShape("m")
    for request in batch.requests:
        result = (
            Result(request.id, error=request.error)
            if request.error is not None
            else Result(request.id, "an answer", "stop", Usage(3, 2))
        )
        line = shape.add(request, (), result).data
        assert line["custom_id"] == request.id
        encode_line(line)  # a custom_id that is not valid Unicode is written all the same


# Recipes -----------------------------------------------------------------------------------

numbers = st.one_of(
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=True, allow_infinity=True),
)
setting_values = st.one_of(numbers, json_values)
recipes = st.fixed_dictionaries(
    {},
    optional={
        "name": json_values,
        "prompt": st.one_of(
            st.fixed_dictionaries(
                {},
                optional={
                    "text": texts,
                    "name": texts,
                    "system": json_values,
                    "questions": st.lists(
                        st.fixed_dictionaries({}, optional={"name": texts, "text": texts}),
                        max_size=3,
                    ),
                },
            ),
            json_values,
        ),
        "sampling": st.dictionaries(
            st.sampled_from([*SamplingTable.model_fields, "max_token"]), setting_values
        ),
        "engine": st.dictionaries(
            st.sampled_from([*list(ENGINE_SETTINGS)[:40], "worker_cls", "chat_template"]),
            setting_values,
            max_size=4,
        ),
        "media": st.one_of(
            st.fixed_dictionaries(
                {"kind": st.sampled_from(["image", "video", "audio", "smell"])},
                optional=dict.fromkeys(
                    ("fps", "num_frames", "sampling", "window_s", "overlap_s"), setting_values
                ),
            ),
            json_values,
        ),
        "output": st.fixed_dictionaries(
            {"format": st.sampled_from(["text", "json", "yaml"])},
            optional={"schema": st.one_of(schemas, json_values)},
        ),
    },
)


def check_recipe(data: dict[str, Any]) -> None:
    try:
        recipe = parse_recipe(data, "r.toml")
    except MmbatchError as exc:
        assert_said(exc, "r.toml: ")
        return
    numbers_of = [v for v in recipe.engine.values() if isinstance(v, float)]
    assert all(math.isfinite(v) for v in numbers_of)


toml_text = st.lists(
    st.one_of(
        st.sampled_from(
            [
                "[prompt]", 'text = "x"', "[sampling]", "temperature = nan", "top_p = inf",
                "[engine]", 'distributed_executor_backend = "ray"', "[output]",
                'format = "json"', 'schema = { "$ref" = "http://127.0.0.1:9/x" }',
                "x = " + "[" * 2000, "[[prompt.questions]]", 'name = "a"', "[media]",
                'kind = "video"', "fps = -inf", "max_tokens = 0", "n = 2",
            ]
        ),
        st.text(max_size=30),
    ),
    max_size=8,
)  # fmt: skip


def check_command(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str], lines: list[str]
) -> None:
    """Through ``mmbatch check``, in-process: exit 0 with the recipe described, or exit 2
    with the error line (and the problems it lists), nothing else."""
    recipe = tmp_path_factory.getbasetemp() / "fuzzed.toml"
    recipe.write_bytes("\n".join(lines).encode("utf-8", "surrogatepass"))
    code = cli.main(["check", str(recipe)])
    err = capsys.readouterr().err
    assert code in (cli.EXIT_OK, cli.EXIT_JOB_FAILED)
    if code == cli.EXIT_JOB_FAILED:
        first, *rest = err.splitlines()
        assert first.startswith("mmbatch: error: "), err
        assert all(line.startswith("  ") for line in rest), err
    else:
        load_recipe(recipe)  # what check read, the run reads


# The tests: a share of each sweep (``tests/manual/test_fuzz_sweep.py`` runs 5,400 cases).


FOUND_IN_NO_STORE = [
    '{"path": "zip://a/b.jpg"}',
    '{"path": "webhdfs://a"}',
    '{"id": 1, "path": "github://a/b"}',
]
"""Rows naming protocols that fsspec knows and mmbatch does not take, whose file systems
cannot be made from a URL alone."""


@fuzz(300)
@given(lines=manifest_lines, allow_urls=st.booleans(), anywhere=st.booleans())
@example(lines=['{"path": "ftp://a/b"}'], allow_urls=False, anywhere=True)
@example(lines=[*FOUND_IN_NO_STORE], allow_urls=True, anywhere=True)
@example(lines=[*FOUND_IN_NO_STORE], allow_urls=False, anywhere=False)
def test_any_manifest_ends_as_rows_or_one_error(
    folder: Path, lines: list[str], allow_urls: bool, anywhere: bool
) -> None:
    check_manifest(folder, lines, allow_urls, anywhere)


@fuzz(100)
@given(body=csv_bodies)
def test_any_csv_manifest_ends_as_rows_or_one_error(folder: Path, body: list[str]) -> None:
    check_csv_manifest(folder, body)


@fuzz(300)
@given(lines=batch_lines, anywhere=st.booleans())
def test_any_batch_file_ends_as_lines_or_one_error(
    folder: Path, lines: list[str], anywhere: bool
) -> None:
    check_batch_file(folder, lines, anywhere)


@fuzz(300)
@given(data=recipes)
def test_any_recipe_is_read_or_refused_in_the_commands_words(data: dict[str, Any]) -> None:
    check_recipe(data)


@fuzz(40)
@given(lines=toml_text)
def test_the_check_command_says_every_recipe_in_one_place(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str], lines: list[str]
) -> None:
    check_command(tmp_path_factory, capsys, lines)


def test_a_url_of_every_protocol_fsspec_knows_is_a_row_or_one_error(folder: Path) -> None:
    """Every protocol, those imports registered at run time too (``datasets`` adds its
    compression file systems), in a manifest and a batch file, whichever path rule holds."""
    protocols = sorted(set(fsspec.available_protocols()) | set(fsspec.registry))
    for protocol, anywhere in itertools.product(protocols, (False, True)):
        url = f"{protocol}://host/b.jpg"
        requests = check_manifest(folder, [json.dumps({"path": url})], True, anywhere)
        if protocol not in TAKEN:  # its row's error, never the job's
            assert requests is not None, url
            assert requests[0].error is not None, url
            assert requests[0].error.kind == "unsupported", requests[0].error
        check_batch_file(folder, [json.dumps(asking_about(url))], anywhere)


def asking_about(url: str) -> dict[str, Any]:
    """A batch line whose picture is at ``url``; the line ends with the assistant's turn,
    its own error once its picture is read, so that no line's parameters are checked
    (which imports vLLM)."""
    picture = {"type": "image_url", "image_url": {"url": url}}
    messages = [{"role": "user", "content": [picture]}, {"role": "assistant", "content": "x"}]
    return {"custom_id": url, "url": "/v1/chat/completions", "body": {"messages": messages}}


def test_the_cases_drawn_do_not_depend_on_what_was_imported_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same test draws the same cases before and after a new local module, full of
    constants, is imported: a sweep's cases are the same alone and in the whole tier."""

    def drawn() -> list[list[str]]:
        cases: list[list[str]] = []

        @fuzz(150)
        @given(lines=manifest_lines)
        def draw(lines: list[str]) -> None:
            cases.append(lines)

        draw()
        return cases

    before = drawn()
    probe = tmp_path / "probe" / "constants_probe.py"
    probe.parent.mkdir()
    probe.write_text(
        "".join(f"TEXT_{i} = {f'probe-{i}.jpg'!r}\nNUMBER_{i} = {1000 + i}\n" for i in range(200))
    )
    monkeypatch.syspath_prepend(str(probe.parent))
    try:
        __import__("constants_probe")
        assert drawn() == before
    finally:
        sys.modules.pop("constants_probe", None)
