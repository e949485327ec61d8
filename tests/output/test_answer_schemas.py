"""A JSON schema that passes ``check`` fails no row for being the schema it is: ``check``,
``run`` (and ``run --ray``) and a batch file's reader build the validator every answer gets,
one way, and refuse what it could not apply (a ``$schema`` that is no string, draft-03, a
``$ref`` circling in place, a NaN bound): a recipe's is the one-line exit 2, a batch line's
is that line's 400 row while the other lines are served."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from error_line import one_error
from fake_cli import main as fake_main
from fake_engine import FakeEngine

from mmbatch.cli import EXIT_ITEMS_FAILED, EXIT_JOB_FAILED, main
from mmbatch.errors import ConfigError
from mmbatch.output.answers import JsonParser, SchemaFailed, canonical_schema

DRAFT_03 = "http://json-schema.org/draft-03/schema#"
ELSEWHERE = "http://127.0.0.1:9/s.json"

REFUSED: list[tuple[str, dict[str, Any], str, str]] = [
    # (case, schema, the schema as a TOML inline table, what the error says)
    (
        "$schema an object",
        {"$schema": {"a": 1}, "type": "integer"},
        '{ "$schema" = { a = 1 }, type = "integer" }',
        "$schema must be a string (a JSON Schema dialect's URI), got {'a': 1}",
    ),
    (
        "$schema a list",
        {"$schema": [1], "type": "integer"},
        '{ "$schema" = [1], type = "integer" }',
        "$schema must be a string",
    ),
    (
        "draft-03 schemas inside type",
        {"$schema": DRAFT_03, "type": [{"$ref": ELSEWHERE}]},
        f'{{ "$schema" = "{DRAFT_03}", type = [{{ "$ref" = "{ELSEWHERE}" }}] }}',
        "(draft-03) is not supported",
    ),
    (
        "draft-03 disallow",
        {"$schema": DRAFT_03, "type": "object", "disallow": "object"},
        f'{{ "$schema" = "{DRAFT_03}", type = "object", disallow = "object" }}',
        "(draft-03) is not supported",
    ),
    (
        "a $ref to itself",
        {"$ref": "#"},
        '{ "$ref" = "#" }',
        "$ref '#' leads back where it started without looking into the answer",
    ),
    (
        "a circle through allOf",
        {"type": "object", "allOf": [{"$ref": "#"}]},
        '{ type = "object", allOf = [{ "$ref" = "#" }] }',
        "$ref '#' leads back where it started",
    ),
    (
        "a circle of two definitions",
        {
            "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"not": {"$ref": "#/$defs/a"}}},
            "$ref": "#/$defs/a",
        },
        '{ "$defs" = { a = { "$ref" = "#/$defs/b" }, b = { not = { "$ref" = "#/$defs/a" } } }, '
        '"$ref" = "#/$defs/a" }',
        "leads back where it started",
    ),
    (
        "maximum nan",
        {"type": "number", "maximum": float("nan")},
        '{ type = "number", maximum = nan }',
        "/maximum is nan: a JSON schema's numbers must be finite",
    ),
    (
        "an infinite enum value",
        {"enum": [1, float("-inf")]},
        "{ enum = [1, -inf] }",
        "/enum/1 is -inf",
    ),
]
IDS = [case for case, *_ in REFUSED]


@pytest.mark.parametrize(("case", "schema", "toml", "said"), REFUSED, ids=IDS)
def test_a_schema_no_answer_could_be_validated_against_is_refused(
    case: str, schema: dict[str, Any], toml: str, said: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        canonical_schema(schema, "[output] schema")
    assert str(caught.value).startswith("[output] schema: ")
    assert said in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(("case", "schema", "toml", "said"), REFUSED, ids=IDS)
def test_check_run_and_run_on_ray_refuse_it_in_one_line(
    case: str,
    schema: dict[str, Any],
    toml: str,
    said: str,
    tmp_path: Path,
    samples: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    recipe = tmp_path / "answers.toml"
    recipe.write_text(f'[prompt]\ntext = "What?"\n[output]\nformat = "json"\nschema = {toml}\n')
    assert main(["check", str(recipe)]) == EXIT_JOB_FAILED
    assert said in one_error(capsys)
    out = tmp_path / "out" / "rows.jsonl"
    argv = ["run", str(recipe), str(samples / "sunset.jpg"), "--model", "m"]
    argv += ["--out", str(out), "--no-progress"]
    assert fake_main(argv) == EXIT_JOB_FAILED
    assert said in one_error(capsys)
    assert fake_main([*argv, "--ray", "--gpus-per-replica", "0"]) == EXIT_JOB_FAILED
    assert said in one_error(capsys)
    assert not out.parent.exists()


def batch_line(custom_id: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": "Say a number."}],
        "max_tokens": 5,
    }
    if schema is not None:
        spec = {"name": "number", "schema": schema}
        body["response_format"] = {"type": "json_schema", "json_schema": spec}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


@pytest.mark.parametrize(("case", "schema", "toml", "said"), REFUSED, ids=IDS)
def test_a_batch_line_with_such_a_schema_is_its_400_row_and_the_others_are_served(
    case: str, schema: dict[str, Any], toml: str, said: str, tmp_path: Path
) -> None:
    lines = [
        batch_line("a"),
        batch_line("b", {"type": "integer"}),
        batch_line("bad", schema),
        batch_line("d", {"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n"}),
        batch_line("e"),
    ]
    requests = tmp_path / "requests.jsonl"
    requests.write_text("".join(json.dumps(line) + "\n" for line in lines))  # NaN as JSON's NaN
    out = tmp_path / "out.jsonl"
    argv = ["run-openai-batch", str(requests), "--model", "m", "--out", str(out), "--no-progress"]
    assert main(argv, FakeEngine()) == EXIT_ITEMS_FAILED
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["custom_id"] for row in rows] == ["a", "b", "bad", "d", "e"]
    statuses = {row["custom_id"]: row["response"]["status_code"] for row in rows}
    assert statuses == {"a": 200, "b": 200, "bad": 400, "d": 200, "e": 200}
    error = rows[2]["response"]["body"]["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith("response_format.json_schema.schema: ")
    assert said in error["message"]


@pytest.mark.parametrize(
    ("schema", "good", "bad"),
    [
        # A circle that looks into the answer on its way round ends with the answer.
        (
            {
                "$defs": {
                    "node": {
                        "anyOf": [
                            {"type": "null"},
                            {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}},
                        ]
                    }
                },
                "$ref": "#/$defs/node",
            },
            {"next": {"next": None}},
            {"next": 1},
        ),
        # Before 2019-09 a $ref stands for its whole schema: the allOf beside it is not
        # followed, as the validator does not follow it, so it makes no circle.
        (
            {
                "$schema": "http://json-schema.org/draft-07/schema#",
                "definitions": {"n": {"type": "integer"}},
                "$ref": "#/definitions/n",
                "allOf": [{"$ref": "#"}],
            },
            5,
            "x",
        ),
        # A $schema jsonschema does not know reads as the latest dialect (with no warning).
        ({"$schema": "http://json-schema.org/schema#", "maximum": 3}, 3, 4),
    ],
)
def test_schemas_whose_references_end_are_taken(
    schema: dict[str, Any], good: Any, bad: Any
) -> None:
    parse = JsonParser(canonical_schema(schema, "s"))
    assert parse(json.dumps(good)) == good
    with pytest.raises(ValueError, match="does not match the schema"):
        parse(json.dumps(bad))


def test_a_schema_past_the_check_still_fails_its_row_not_the_job() -> None:
    """A schema built in Python that never passed the check: its circle is the row's error."""
    parse = JsonParser(json.dumps({"items": {"$ref": "#/items"}}))
    assert parse("[]") == []
    with pytest.raises(SchemaFailed, match="recursed"):
        parse("[1]")
