"""Answers that must be JSON following a schema: checked twice, for different reasons.

The engine enforces the schema while decoding (vLLM's structured outputs), so a finished
answer follows it. But an answer cut off at ``max_tokens`` is a prefix of valid JSON, not
JSON, and a backend may support only part of JSON Schema (formats, patterns) and let the
rest through. So every answer is parsed and validated again here, and one that fails gets
an error saying why instead of a ``parsed`` value that looks right and is not.
"""

from __future__ import annotations

import json
import math
from typing import Any

from mmbatch.errors import ConfigError, ItemFailure


class SchemaFailed(ItemFailure):
    """The schema could not be applied to an answer (a reference it cannot resolve): the
    row's error, saying so, rather than a traceback that ends the job."""

    stage = "validate"
    kind = "other"


def canonical_schema(schema: Any, where: str) -> str:
    """``schema`` as canonical JSON text, after checking that every answer can be validated
    against it: the validator answers get (``answer_validator``) takes it, its references stay
    inside it and lead somewhere without looping in place, and its numbers are finite. A
    schema that passes here fails no row for being the schema it is."""
    import jsonschema

    from mmbatch.output.schema_refs import check_references

    validator = answer_validator(schema, where)
    try:
        type(validator).check_schema(schema)
        check_references(schema, where, type(validator))
        _check_finite(schema, where)
        return json.dumps(schema, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except jsonschema.SchemaError as exc:
        raise ConfigError(f"{where}: not a valid JSON schema: {exc.message}") from None
    except RecursionError:
        raise ConfigError(f"{where}: the JSON schema is nested too deeply") from None


def answer_validator(schema: Any, where: str) -> Any:
    """The validator answers to ``schema`` are checked with, built one way for ``mmbatch
    check``, a recipe's job, a batch file's lines and ``JsonParser``: the dialect its
    ``$schema`` names (2020-12 when it names none, or one jsonschema does not know), references
    resolved through a registry that retrieves nothing. A schema no validator can be built
    for (not an object, a ``$schema`` or ``$id`` that is not a string) is a ``ConfigError``,
    and so is draft-03: its own keywords (schemas inside ``type``, ``disallow``, ``extends``)
    are not what the engine's structured decoding enforces, and references hide in them where
    the reference check does not look."""
    if not isinstance(schema, dict):
        raise ConfigError(f"{where}: a JSON schema must be a table/object, got {schema!r}")
    dialect = schema.get("$schema")
    if dialect is not None and not isinstance(dialect, str):
        raise ConfigError(
            f"{where}: $schema must be a string (a JSON Schema dialect's URI), got {dialect!r}"
        )
    import jsonschema

    from mmbatch.output.schema_refs import local_registry

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    if cls is jsonschema.Draft3Validator:
        raise ConfigError(
            f"{where}: $schema {dialect!r} (draft-03) is not supported: its keywords are not "
            "what the engine enforces; write the schema in draft-07 or 2020-12"
        )
    identity = "id" if cls is jsonschema.Draft4Validator else "$id"
    if not isinstance(schema.get(identity, ""), str):
        raise ConfigError(f"{where}: {identity} must be a string, got {schema[identity]!r}")
    return cls(schema, registry=local_registry())


def _check_finite(schema: Any, where: str) -> None:
    """``ConfigError`` naming the first number of ``schema`` that is NaN or infinite (a TOML
    ``nan``, a batch line's ``NaN``): JSON has none, so no engine could read the schema."""
    stack: list[tuple[str, Any]] = [("", schema)]
    while stack:
        at, value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(
                f"{where}: {at or '(root)'} is {value}: a JSON schema's numbers must be finite"
            )
        if isinstance(value, dict):
            stack.extend((f"{at}/{key}", v) for key, v in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((f"{at}/{i}", v) for i, v in reversed(list(enumerate(value))))


class JsonParser:
    """Parses an answer's text as JSON and validates it against the schema."""

    def __init__(self, schema_text: str) -> None:
        # References resolve inside the schema alone: nothing is fetched or read, even for
        # a schema that did not pass through ``canonical_schema``.
        self._validator = answer_validator(json.loads(schema_text), "[output] schema")

    def __call__(self, text: str) -> Any:
        try:
            # strict=False admits raw control characters inside strings: xgrammar's JSON
            # grammar lets them through (seen with vLLM 0.32), and the value is still whole.
            value = json.loads(text, strict=False)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not valid JSON ({exc.msg} at char {exc.pos})") from None
        except RecursionError:
            raise ValueError("JSON nested too deeply to read") from None
        problems = sorted(self._problems(value), key=lambda e: list(e.path))
        if problems:
            first = problems[0]
            at = "/".join(map(str, first.path)) or "(root)"
            raise ValueError(f"JSON does not match the schema at {at}: {first.message}")
        return value

    def _problems(self, value: Any) -> list[Any]:
        """Where ``value`` breaks the schema; ``SchemaFailed`` when the schema itself cannot
        be applied (jsonschema's and referencing's errors are not ``ValueError``s)."""
        import jsonschema
        from referencing.exceptions import Unresolvable

        try:
            return list(self._validator.iter_errors(value))
        except RecursionError:
            raise SchemaFailed(
                "validating the answer recursed without end (a schema that refers to itself "
                "in place, or an answer nested too deeply for it)"
            ) from None
        except (Unresolvable, jsonschema.exceptions.UnknownType) as exc:
            raise SchemaFailed(f"the schema cannot be applied: {exc}") from None
