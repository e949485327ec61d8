"""A JSON schema refers only to itself: no ``$ref`` makes a job read a file or send a request,
at ``mmbatch check``, at ``mmbatch run`` or when an answer is validated."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from error_line import one_error
from fake_cli import main as fake_main

from mmbatch.cli import EXIT_JOB_FAILED, main
from mmbatch.errors import ConfigError
from mmbatch.output.answers import JsonParser, SchemaFailed, canonical_schema
from mmbatch.output.rows import ItemRows
from mmbatch.types import Request, Result, Usage


class Listener:
    """A local HTTP server that records every request it gets (and answers with a schema
    that would make any answer fail, were it fetched)."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        listener = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                listener.paths.append(self.path)
                body = json.dumps({"type": "string"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/x.json"


@pytest.fixture
def listener() -> Iterator[Listener]:
    found = Listener()
    thread = threading.Thread(target=found.server.serve_forever, daemon=True)
    thread.start()
    yield found
    found.server.shutdown()
    found.server.server_close()
    thread.join()


def test_a_schema_naming_a_url_is_refused_and_never_fetched(listener: Listener) -> None:
    schema = {"type": "integer", "not": {"$ref": listener.url}}
    with pytest.raises(ConfigError, match=f"\\$ref '{listener.url}' leaves the schema"):
        canonical_schema(schema, "[output] schema")
    # A schema that did not pass the check (a Recipe built in Python) still fetches nothing:
    # the reference fails the answer instead.
    with pytest.raises(SchemaFailed, match="cannot be applied"):
        JsonParser(json.dumps(schema))("5")
    assert listener.paths == []


def test_a_schema_naming_a_file_is_refused_and_the_file_never_read(tmp_path: Path) -> None:
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"type": "string"}))
    schema = {"$ref": secret.as_uri()}
    with pytest.raises(ConfigError, match="leaves the schema"):
        canonical_schema(schema, "s")
    with pytest.raises(SchemaFailed):
        JsonParser(json.dumps(schema))("5")


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        ({"$ref": "other.json"}, "$ref 'other.json' leaves the schema"),
        ({"$ref": "./defs.json#/a"}, "$ref './defs.json#/a' leaves the schema"),
        ({"items": {"$ref": "file:///etc/hostname"}}, "$ref 'file:///etc/hostname'"),
        ({"$ref": "#/$defs/missing"}, "$ref '#/$defs/missing' leads nowhere"),
        ({"$ref": "#nowhere"}, "$ref '#nowhere' leads nowhere"),
        (
            {"$defs": {"a": {"$id": "http://example.com/a", "type": "integer"}}},
            "a nested $id 'http://example.com/a' is not supported",
        ),
        ({"$dynamicRef": "#meta"}, "$dynamicRef '#meta' is not supported"),
        (
            {
                "$schema": "https://json-schema.org/draft/2019-09/schema",
                "$recursiveRef": "#",
            },
            "$recursiveRef '#' is not supported",
        ),
        (
            {
                "$schema": "http://json-schema.org/draft-07/schema#",
                "properties": {"x": {"$ref": "https://example.com/s.json"}},
            },
            "$ref 'https://example.com/s.json' leaves the schema",
        ),
    ],
)
def test_every_reference_that_leaves_the_schema_is_named(schema: dict, named: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ConfigError) as caught:
        canonical_schema(schema, "[output] schema")
    assert str(caught.value).startswith("[output] schema: ")
    assert named in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("schema", "good", "bad"),
    [
        ({"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n"}, 5, "x"),
        (
            {
                "$id": "https://example.com/root.json",
                "$defs": {"n": {"type": "integer"}},
                "properties": {"a": {"$ref": "#/$defs/n"}},
            },
            {"a": 1},
            {"a": "x"},
        ),
        ({"$defs": {"n": {"$anchor": "num", "type": "integer"}}, "$ref": "#num"}, 1, "x"),
        (
            {
                "$schema": "http://json-schema.org/draft-07/schema#",
                "definitions": {"n": {"type": "integer"}},
                "properties": {"a": {"$ref": "#/definitions/n"}},
            },
            {"a": 1},
            {"a": "x"},
        ),
        # A property named "$ref" and a constant holding one are not references.
        ({"properties": {"$ref": {"type": "string"}}}, {"$ref": "x"}, {"$ref": 1}),
        ({"const": {"$ref": "http://example.com"}}, {"$ref": "http://example.com"}, {}),
        # A recursive schema descends into the answer: it ends with it.
        (
            {
                "$defs": {"t": {"type": "array", "items": {"$ref": "#/$defs/t"}}},
                "$ref": "#/$defs/t",
            },
            [[[]], []],
            [[1]],
        ),
    ],
)
def test_references_inside_the_schema_resolve(schema: dict, good: object, bad: object) -> None:  # type: ignore[type-arg]
    parse = JsonParser(canonical_schema(schema, "s"))
    assert parse(json.dumps(good)) == good
    with pytest.raises(ValueError, match="does not match the schema"):
        parse(json.dumps(bad))


RECIPE = """
[prompt]
text = "What number?"
[output]
format = "json"
schema = {{ type = "integer", not = {{ "$ref" = "{url}" }} }}
"""


def test_check_and_run_refuse_a_recipe_whose_schema_names_a_url(
    listener: Listener, tmp_path: Path, samples: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = tmp_path / "numbers.toml"
    recipe.write_text(RECIPE.format(url=listener.url))
    assert main(["check", str(recipe)]) == EXIT_JOB_FAILED
    assert f"$ref '{listener.url}' leaves the schema" in one_error(capsys)
    out = tmp_path / "out" / "rows.jsonl"
    argv = ["run", str(recipe), str(samples / "sunset.jpg"), "--model", "m"]
    assert fake_main([*argv, "--out", str(out), "--no-progress"]) == EXIT_JOB_FAILED
    assert f"$ref '{listener.url}'" in one_error(capsys)
    assert not out.parent.exists()
    assert listener.paths == []


def test_a_schema_that_cannot_be_applied_fails_its_row_not_the_job(listener: Listener) -> None:
    """A reference unresolvable at validation time (a schema built in Python, past the
    check) is that answer's error; the item's other answers and the next items go on."""
    schema = json.dumps({"type": "integer", "not": {"$ref": listener.url}})
    requests = [
        Request("x#a", "p", item_id="x", output="a"),
        Request("x#b", "q", item_id="x", output="b"),
    ]
    rows = ItemRows(requests, JsonParser(schema))
    assert rows.add(requests[0], (), Result("x#a", "oops", "stop", Usage(1, 1))) is None
    row = rows.add(requests[1], (), Result("x#b", "5", "stop", Usage(1, 1)))
    assert row is not None
    answer = row.data["outputs"]["b"]
    assert answer["error"]["stage"] == "validate"
    assert "the schema cannot be applied" in answer["error"]["message"]
    assert answer["text"] == "5"
    assert row.data["outputs"]["a"]["error"]["kind"] == "unparsable"
    assert listener.paths == []


def test_a_schema_looping_in_place_is_refused() -> None:
    """``{"items": {"$ref": "#/items"}}`` refers to itself without descending: validating an
    answer with an item could not end, so the check refuses it (unchecked, it fails the row:
    ``test_answer_schemas.py``)."""
    with pytest.raises(ConfigError, match=r"\$ref '#/items' leads back where it started"):
        canonical_schema({"items": {"$ref": "#/items"}}, "s")
