"""Answers that must be JSON following a schema: checked twice, for different reasons.

The engine enforces the schema while decoding (vLLM's structured outputs), so a finished
answer follows it. But an answer cut off at ``max_tokens`` is a prefix of valid JSON, not
JSON, and a backend may support only part of JSON Schema (formats, patterns) and let the
rest through. So every answer is parsed and validated again here, and one that fails gets
an error saying why instead of a ``parsed`` value that looks right and is not.
"""

from __future__ import annotations

import json
from typing import Any

from mmbatch.errors import ConfigError, ItemFailure


class SchemaFailed(ItemFailure):
    """The schema could not be applied to an answer (a reference it cannot resolve): the
    row's error, saying so, rather than a traceback that ends the job."""

    stage = "validate"
    kind = "other"


def canonical_schema(schema: Any, where: str) -> str:
    """``schema`` as canonical JSON text, after checking it is a valid JSON Schema."""
    if not isinstance(schema, dict):
        raise ConfigError(f"{where}: a JSON schema must be a table/object, got {schema!r}")
    import jsonschema

    from mmbatch.output.schema_refs import check_references

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
        check_references(schema, where)
        return json.dumps(schema, sort_keys=True, separators=(",", ":"))
    except jsonschema.SchemaError as exc:
        raise ConfigError(f"{where}: not a valid JSON schema: {exc.message}") from None
    except RecursionError:
        raise ConfigError(f"{where}: the JSON schema is nested too deeply") from None


class JsonParser:
    """Parses an answer's text as JSON and validates it against the schema."""

    def __init__(self, schema_text: str) -> None:
        import jsonschema

        from mmbatch.output.schema_refs import local_registry

        schema = json.loads(schema_text)
        # References resolve inside the schema alone: nothing is fetched or read, even for
        # a schema that did not pass through ``canonical_schema``.
        cls = jsonschema.validators.validator_for(schema)
        self._validator = cls(schema, registry=local_registry())

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
