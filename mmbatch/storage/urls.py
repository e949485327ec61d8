"""Storage URLs as text: what one is, how it is joined, normalised and shown, and whether one
lies under another. Nothing here touches a file system, so the rules are cheap to check and
to test.

A storage URL is ``PROTOCOL://PATH`` for any protocol but those read otherwise: ``http``
and ``https`` are fetched only with ``--allow-urls`` (``mmbatch.media.fetch``), ``file://``
is a local path, ``data:`` holds its bytes. ``s3a`` is ``s3`` and ``gcs`` is ``gs`` (fsspec
takes both names for one store), so a root given one way holds URLs written the other. A
protocol is one name whatever its case: ``S3://`` is ``s3://`` (``spelled``), as the file
systems take it.

The path rule for URLs (``is_inside``) compares normalised URLs by whole path components:
``s3://b/data2/x`` is not under ``s3://b/data``, and ``s3://b/data/../secret`` is
``s3://b/secret``, not under ``s3://b/data``. A URL whose ``..`` climbs above its bucket
names nothing and is refused (``ValueError``), as is one holding a ``user:password@``
(``LOGIN_REFUSED``): a store's credentials come from its own configuration, never from a
URL, and no such part is ever said or written (``shown``).
"""

from __future__ import annotations

import posixpath
import re

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
NOT_STORAGE = frozenset({"http", "https", "file", "data"})
"""Protocols that are not object storage: fetched with --allow-urls, or local."""
ALIASES = {"s3a": "s3", "s3n": "s3", "gcs": "gs"}
"""Other names of one store, as fsspec takes them."""


def scheme(text: str) -> str | None:
    """The protocol ``text`` names (lower case), or None for a plain path."""
    found = _SCHEME.match(text)
    return found.group(1).lower() if found else None


LOGIN_REFUSED = (
    "holds a user name or password; credentials come from the store's own configuration "
    "(its environment variables, configuration files, an instance role), never from a URL"
)


def spelled(url: str) -> str:
    """``url`` with its protocol in lower case (``S3://b/k`` is ``s3://b/k``): the one
    spelling the file systems, the path rule and an output's objects know it by."""
    protocol = scheme(url)
    return url if protocol is None else protocol + url[len(protocol) :]


def is_storage_url(text: str) -> bool:
    """Whether ``text`` is a URL of object storage (see the module's docstring)."""
    protocol = scheme(text)
    return protocol is not None and protocol not in NOT_STORAGE


def protocol_of(url: str) -> str:
    """The store's protocol, its aliases made one (``s3a`` -> ``s3``)."""
    protocol = scheme(url) or ""
    return ALIASES.get(protocol, protocol)


def normalised(url: str) -> str:
    """``url`` with ``.``, ``..`` and repeated slashes collapsed, no trailing slash and its
    protocol in lower case; ``ValueError`` when ``..`` climbs above its bucket."""
    protocol = scheme(url)
    if protocol is None:
        raise ValueError(f"{url!r} is not a URL")
    rest = url[len(protocol) + 3 :]
    if shown(url) != spelled(url):
        raise ValueError(f"{shown(url)!r} {LOGIN_REFUSED}")
    parts: list[str] = []
    for part in rest.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if len(parts) <= 1:
                raise ValueError(f"{shown(url)!r} climbs above its bucket")
            parts.pop()
            continue
        parts.append(part)
    if not parts:
        raise ValueError(f"{shown(url)!r} names no bucket")
    return f"{protocol}://{'/'.join(parts)}"


def join(folder: str, relative: str) -> str:
    """``relative`` (a path written inside an input) under the URL ``folder``, normalised."""
    return normalised(f"{folder.rstrip('/')}/{relative}")


def parent(url: str) -> str:
    """The URL of the folder (prefix) holding ``url``; a bucket is its own parent."""
    clean = normalised(url)
    protocol = clean.split("://", 1)[0]
    path = clean.split("://", 1)[1]
    head = posixpath.dirname(path)
    return f"{protocol}://{head or path}"


def name(url: str) -> str:
    """The last component of ``url``'s path (an object's name)."""
    return posixpath.basename(url.rstrip("/"))


def is_inside(url: str, root: str) -> bool:
    """Whether ``url`` is ``root`` or lies below it, both normalised, by whole components
    and in the same store (``s3a://b/x`` is inside ``s3://b``)."""
    try:
        target, base = normalised(url), normalised(root)
    except ValueError:
        return False
    if protocol_of(target) != protocol_of(base):
        return False
    path, prefix = target.split("://", 1)[1], base.split("://", 1)[1]
    return path == prefix or path.startswith(prefix + "/")


def shown(url: str) -> str:
    """``url`` as a message or a row may show it: without a ``user:password@`` part, its
    protocol in lower case."""
    protocol = scheme(url)
    if protocol is None:
        return url
    rest = url[len(protocol) + 3 :]
    host, sep, tail = rest.partition("/")
    if "@" in host:
        host = host.rsplit("@", 1)[1]
    return f"{protocol}://{host}{sep}{tail}"
