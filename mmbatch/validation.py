"""pydantic's validation errors in mmbatch's words: each problem with where it is (the keys
down to it), what was expected (from the field's own type) and the value found.

Recipes (``mmbatch.recipe.spec``) and OpenAI batch lines (vLLM's own request model) are
checked by pydantic models; this turns what they find into the lines a person reads (``temperature
must be a number, got 'warm'``) instead of pydantic's (``Input should be a valid number,
unable to parse string as a number``). pydantic is imported by the callers, not here: this
module only reads the errors, so that ``mmbatch --help`` loads nothing of it.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

TYPE_ERRORS = frozenset(
    {
        "int_type",
        "int_parsing",
        "int_from_float",
        "float_type",
        "float_parsing",
        "string_type",
        "bool_type",
        "bool_parsing",
        "list_type",
        "tuple_type",
        "dict_type",
        "model_type",
        "model_attributes_type",
        "literal_error",
        "enum",
    }
)
"""pydantic's error types that mean "a value of the wrong kind", said with the field's type."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a value: ``loc`` the keys (and list indexes) down to it."""

    loc: tuple[str | int, ...]
    kind: str
    """pydantic's error type: ``extra_forbidden`` (a key the table does not have),
    ``missing``, a wrong type (``TYPE_ERRORS``), or a constraint."""
    message: str
    """pydantic's words, first letter lower case (``field required``)."""
    value: Any
    context: Mapping[str, Any]
    """What the check compared with: ``{"gt": 0}``, ``{"expected": "'text' or 'json'"}``."""


LISTED_AT_MOST = 10
"""How many problems (or names of one kind) a message lists before it says how many more
there are: a recipe with a hundred thousand unknown keys is read in ten lines, not a hundred
thousand and one, and the first ten say what went wrong."""


def listed(items: Sequence[str], at_most: int = LISTED_AT_MOST) -> list[str]:
    """``items``, or the first ``at_most`` of them and ``... and 99,990 more``: every list of
    problems or names shown to a person goes through here, so all are cut alike."""
    if len(items) <= at_most:
        return list(items)
    return [*items[:at_most], f"... and {len(items) - at_most:,} more"]


def problems(errors: Sequence[Mapping[str, Any]]) -> list[Problem]:
    """``ValidationError.errors()`` as ``Problem``s, in order. Where a value may be one of
    several types, pydantic reports one error per type tried, its loc naming the type tried
    (``('stop', 'list[str]', 0)``); those are left to ``expected``, which says the field's
    whole type, so each loc here is a key path the user wrote."""
    found = []
    for error in errors:
        message = str(error.get("msg", ""))
        found.append(
            Problem(
                tuple(error.get("loc", ())),
                str(error.get("type", "")),
                message[:1].lower() + message[1:],
                error.get("input"),
                dict(error.get("ctx") or {}),
            )
        )
    return found


def expected(annotation: Any, table: str = "an object") -> str:
    """What a value of type ``annotation`` is, in words: ``int | None`` is ``an integer``,
    ``str | list[str]`` is ``a string or a list of strings``; a mapping or a model is
    ``table`` (``a table`` in a TOML recipe, ``an object`` in JSON)."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return expected(args[0], table)
    if origin in (typing.Union, types.UnionType):
        kinds = [expected(a, table) for a in args if a is not type(None)]
        return " or ".join(dict.fromkeys(kinds))
    if origin is typing.Literal:
        return " or ".join(repr(a) for a in args)
    if origin in (list, tuple, Sequence) or annotation in (list, tuple):
        return f"a list of {_plural(expected(args[0], table))}" if args else "a list"
    if origin in (dict, Mapping) or annotation in (dict, Mapping):
        return table
    words = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
    if annotation in words:
        return words[annotation]
    if isinstance(annotation, type) and (
        hasattr(annotation, "model_fields") or typing.is_typeddict(annotation)
    ):
        return table
    return "a valid value"


def _plural(kind: str) -> str:
    """``a string`` -> ``strings``, ``an integer or a list of integers`` -> ``integers or
    lists of integers``."""
    if kind == "true or false":
        return "true or false values"
    plural = []
    for one in kind.split(" or "):
        noun = one.removeprefix("an ").removeprefix("a ")
        head, of, rest = noun.partition(" of ")
        plural.append(f"{head}s{of}{rest}" if noun != one else one)
    return " or ".join(plural)
