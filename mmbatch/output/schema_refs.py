"""A JSON schema's references stay inside the schema: nothing is read from a file or a URL.

A schema comes with a recipe or a batch line, both data from elsewhere. JSON Schema lets a
``$ref`` name another document (``http://host/x.json``, ``file:///etc/hostname``,
``other.json``), and jsonschema's default resolver fetches it when an answer is validated:
a shared recipe could make every job send requests to any host, or read local files. So a
schema may refer only to itself:

* each ``$ref`` is a fragment of the schema's own document (``#``, ``#/$defs/item``, an
  ``$anchor``'s ``#name``), and it must lead somewhere;
* ``$dynamicRef`` and ``$recursiveRef`` (which pick their target at validation time) and a
  nested ``$id`` (which would make ``#`` mean another document) are refused;
* no ``$ref`` leads back where it started through schemas applied to the same value
  (``allOf``, ``anyOf``, ``oneOf``, ``not``, ``if``, dependent schemas, other references)
  without looking into a part of it: validating an answer that reaches it could never end;
* validation resolves through a ``referencing.Registry`` that refuses to retrieve anything,
  so a reference that slipped past these checks fails its row instead of being fetched.

A schema that breaks the rule is a ``ConfigError`` naming the reference, at ``mmbatch
check`` and before a job starts (a batch line's schema: that line's error).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from mmbatch.errors import ConfigError

if TYPE_CHECKING:
    import referencing

REFUSED_KEYWORDS = ("$dynamicRef", "$recursiveRef")
"""References resolved by where validation has been, not by the schema's text."""


def no_retrieval(uri: str) -> referencing.Resource[Any]:
    """A registry's ``retrieve`` that reads nothing: every outside reference is unresolvable."""
    from referencing.exceptions import NoSuchResource

    raise NoSuchResource(ref=uri)  # type: ignore[call-arg]


def local_registry() -> referencing.Registry[Any]:
    """A registry that resolves references inside the schema alone, retrieving nothing."""
    import referencing

    return referencing.Registry(retrieve=no_retrieval)  # type: ignore[call-arg]


def check_references(schema: dict[str, Any], where: str, validator: type[Any]) -> None:
    """``ConfigError`` naming the first reference of ``schema`` that leaves it, that leads
    nowhere inside it, or that leads back to where it started without looking into the
    answer, as the ``validator`` class (its dialect's keywords) would follow them."""
    import referencing
    import referencing.jsonschema
    from referencing.exceptions import Unresolvable

    root = referencing.Resource.from_contents(
        schema, default_specification=referencing.jsonschema.DRAFT202012
    )
    resolver = local_registry().resolver_with_root(root)
    subschemas = list(_subschemas(root, where))
    targets: dict[str, Any] = {}
    for ref in (r for sub in subschemas for r in _references(sub, where)):
        if not ref.startswith("#"):
            raise ConfigError(
                f"{where}: $ref {ref!r} leaves the schema; a schema may refer only to its own "
                "parts ('#/$defs/NAME'): no file or URL is read"
            )
        try:
            targets[ref] = resolver.lookup(ref).contents
        except Unresolvable:
            raise ConfigError(f"{where}: $ref {ref!r} leads nowhere in the schema") from None
    loop = InPlace(validator, targets).loop(subschemas)
    if loop:
        raise ConfigError(
            f"{where}: $ref {loop!r} leads back where it started without looking into the "
            "answer (validating an answer that reaches it could never end)"
        )


def _subschemas(resource: referencing.Resource[Any], where: str) -> Iterator[Any]:
    """The contents of ``resource`` and of each of its subschemas (keyword-aware: a property
    named ``$ref`` or a ``const`` holding one is no schema)."""
    contents = resource.contents
    if isinstance(contents, dict):
        for keyword in REFUSED_KEYWORDS:
            if keyword in contents:
                raise ConfigError(
                    f"{where}: {keyword} {contents[keyword]!r} is not supported; refer to "
                    "the schema's own parts with $ref '#/$defs/NAME'"
                )
    yield contents
    for sub in resource.subresources():
        nested = sub.id()
        if nested is not None and not nested.startswith("#"):
            raise ConfigError(
                f"{where}: a nested $id {nested!r} is not supported (it makes '#' mean "
                "another document); keep one $id, at the top"
            )
        yield from _subschemas(sub, where)


def _references(contents: Any, where: str) -> Iterator[str]:
    """The ``$ref`` of one subschema, if it has one."""
    if isinstance(contents, dict) and "$ref" in contents:
        ref = contents["$ref"]
        if not isinstance(ref, str):
            raise ConfigError(f"{where}: $ref must be a string, got {ref!r}")
        yield ref


IN_PLACE_ONE = ("not", "if", "then", "else")
IN_PLACE_LISTS = ("allOf", "anyOf", "oneOf")
IN_PLACE_MAPS = ("dependentSchemas", "dependencies")
"""The keywords whose subschemas apply to the value their schema applies to, not to a part
of it: a circle of these and ``$ref``s is validated without end, whatever the answer."""


class InPlace:
    """The subschemas a schema applies to its own value, as a validator of ``validator``'s
    dialect follows them (before 2019-09, a ``$ref`` replaces its siblings); ``targets``
    holds where each ``$ref`` leads."""

    def __init__(self, validator: type[Any], targets: dict[str, Any]) -> None:
        import jsonschema

        keywords = set(validator.VALIDATORS)
        if "if" in keywords:
            keywords |= {"then", "else"}
        self.keywords = keywords
        self.ref_alone = validator in (
            jsonschema.Draft4Validator,
            jsonschema.Draft6Validator,
            jsonschema.Draft7Validator,
        )
        self.targets = targets

    def edges(self, contents: Any) -> Iterator[tuple[str | None, Any]]:
        """``(the $ref followed or None, subschema)`` for each subschema applied in place."""
        if not isinstance(contents, dict):
            return
        ref = contents.get("$ref")
        if isinstance(ref, str) and "$ref" in self.keywords:
            yield ref, self.targets.get(ref)
            if self.ref_alone:
                return
        for keyword, value in contents.items():
            if keyword not in self.keywords:
                continue
            if keyword in IN_PLACE_ONE:
                yield None, value
            elif keyword in IN_PLACE_LISTS and isinstance(value, list):
                yield from ((None, v) for v in value)
            elif keyword in IN_PLACE_MAPS and isinstance(value, dict):
                yield from ((None, v) for v in value.values())

    def loop(self, starts: list[Any]) -> str | None:
        """A ``$ref`` on a circle of in-place subschemas reached from ``starts``, if any
        (a depth-first walk, without recursion: a schema may be deep)."""
        state: dict[int, bool] = {}  # id of a subschema -> True while on the walk's path
        for start in starts:
            if not isinstance(start, dict) or id(start) in state:
                continue
            state[id(start)] = True
            path: list[tuple[Any, Iterator[tuple[str | None, Any]], str | None]] = [
                (start, self.edges(start), None)
            ]
            while path:
                node, edges, _ = path[-1]
                for ref, sub in edges:
                    if not isinstance(sub, dict):
                        continue
                    if state.get(id(sub)):
                        begin = next(i for i, (n, _, _) in enumerate(path) if n is sub)
                        circle = [r for _, _, r in path[begin + 1 :]] + [ref]
                        return next(r for r in circle if r is not None)
                    if id(sub) not in state:
                        state[id(sub)] = True
                        path.append((sub, self.edges(sub), ref))
                        break
                else:
                    state[id(node)] = False
                    path.pop()
        return None
