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


def check_references(schema: dict[str, Any], where: str) -> None:
    """``ConfigError`` naming the first reference of ``schema`` that leaves it, or that
    leads nowhere inside it."""
    import referencing
    import referencing.jsonschema
    from referencing.exceptions import Unresolvable

    root = referencing.Resource.from_contents(
        schema, default_specification=referencing.jsonschema.DRAFT202012
    )
    resolver = local_registry().resolver_with_root(root)
    for ref in _references(root, where):
        if not ref.startswith("#"):
            raise ConfigError(
                f"{where}: $ref {ref!r} leaves the schema; a schema may refer only to its own "
                "parts ('#/$defs/NAME'): no file or URL is read"
            )
        try:
            resolver.lookup(ref)
        except Unresolvable:
            raise ConfigError(f"{where}: $ref {ref!r} leads nowhere in the schema") from None


def _references(resource: referencing.Resource[Any], where: str) -> Iterator[str]:
    """Every ``$ref`` of ``resource`` and its subschemas (keyword-aware: a property named
    ``$ref`` or a ``const`` holding one is not a reference)."""
    contents = resource.contents
    if isinstance(contents, dict):
        for keyword in REFUSED_KEYWORDS:
            if keyword in contents:
                raise ConfigError(
                    f"{where}: {keyword} {contents[keyword]!r} is not supported; refer to "
                    "the schema's own parts with $ref '#/$defs/NAME'"
                )
        ref = contents.get("$ref")
        if ref is not None:
            if not isinstance(ref, str):
                raise ConfigError(f"{where}: $ref must be a string, got {ref!r}")
            yield ref
    for sub in resource.subresources():
        nested = sub.id()
        if nested is not None and not nested.startswith("#"):
            raise ConfigError(
                f"{where}: a nested $id {nested!r} is not supported (it makes '#' mean "
                "another document); keep one $id, at the top"
            )
        yield from _references(sub, where)
