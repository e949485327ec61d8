"""Storage URLs as text: what one is, how it is joined, normalised and shown, and whether one
lies under another. Nothing here touches a file system, so the rules are cheap to check and
to test.

Which protocols a URL may have is decided here, once (``PROTOCOLS``): the object stores
``s3``, ``gs`` and ``hf`` (a storage URL, read and written through fsspec), ``http`` and
``https`` (fetched only with ``--allow-urls``, by ``mmbatch.media.fetch``, never through
fsspec), and ``file`` (a local path). ``s3a`` is ``s3`` and ``gcs`` is ``gs`` (fsspec takes
both names for one store), so a root given one way holds URLs written the other. Any other
protocol, even one fsspec has a file system for (``ftp``, ``zip``, ``github``, ``memory``,
...), is refused wherever a URL is taken (``unsupported``): a URL named inside an input is
its row's error, one named on the command line the job's, and no file system is ever made
for it. A ``data:`` URI has no ``//`` and is no URL here: an OpenAI batch line's holds its
bytes, anywhere else it is a file name like any other. A protocol is one name whatever its
case: ``S3://`` is ``s3://`` (``spelled``), as the file systems take it.

The path rule for URLs (``is_inside``) compares normalised URLs by whole path components:
``s3://b/data2/x`` is not under ``s3://b/data``, and ``s3://b/data/../secret`` is
``s3://b/secret``, not under ``s3://b/data``. A URL whose ``..`` climbs above its bucket
names nothing and is refused (``ValueError``), as is one holding a ``user:password@``
(``LOGIN_REFUSED``): a store's credentials come from its own configuration, never from a
URL, and no such part is ever said or written (``shown``).
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal

UrlKind = Literal["store", "web", "local"]
"""How a URL of a supported protocol is read: through its store's file system (``store``),
fetched with ``--allow-urls`` (``web``), or as the local path it names (``local``)."""
PROTOCOLS: Mapping[str, UrlKind] = MappingProxyType(
    {
        "s3": "store",
        "s3a": "store",
        "s3n": "store",
        "gs": "store",
        "gcs": "store",
        "hf": "store",
        "http": "web",
        "https": "web",
        "file": "local",
    }
)
"""Every protocol mmbatch takes in a URL, and how it reads it: the one allow-list."""
ALIASES = {"s3a": "s3", "s3n": "s3", "gcs": "gs"}
"""Other names of one store, as fsspec takes them."""
STORES = tuple(p for p, kind in PROTOCOLS.items() if kind == "store" and p not in ALIASES)
"""The object stores, each by its own name (``s3``, ``gs``, ``hf``)."""


def scheme(text: str) -> str | None:
    """The protocol ``text`` names (lower case), or None for a plain path. As fsspec reads
    a URL, everything before the first ``://`` is its protocol (``arrow_hdfs``, even
    ``simplecache::s3``), so that nothing fsspec would open as a URL passes for a path."""
    head, sep, _ = text.partition("://")
    return head.lower() if sep and len(head) > 1 else None


def url_kind(text: str) -> UrlKind | None:
    """How the URL ``text`` is read (``PROTOCOLS``); None for a plain path, or for a URL
    whose protocol is not taken (``unsupported`` says so)."""
    protocol = scheme(text)
    return PROTOCOLS.get(protocol) if protocol is not None else None


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
    """Whether ``text`` is a URL of one of the object stores mmbatch reads and writes."""
    return url_kind(text) == "store"


def is_web_url(text: str) -> bool:
    """Whether ``text`` is an http(s) URL: fetched only with ``--allow-urls``."""
    return url_kind(text) == "web"


def unsupported(text: str) -> str | None:
    """Why ``text`` cannot be taken, when it is a URL of a protocol mmbatch does not take
    (None for a plain path or a supported URL): what a refusal says, naming the URL as
    ``shown`` and the protocols that are taken."""
    protocol = scheme(text)
    if protocol is None or protocol in PROTOCOLS:
        return None
    return (
        f"{shown(text)!r}: {protocol}:// is not a protocol mmbatch reads; it reads local "
        f"paths (file://), {', '.join(f'{p}://' for p in STORES)} and, with --allow-urls, "
        "http:// and https://"
    )


def unsupported_folder(text: str) -> str | None:
    """Why ``text`` cannot be a folder a job writes to or reads under (an output, an
    allowed root), when it is a URL but not of a store: any other protocol is refused
    (``unsupported``), and a web or ``file://`` URL is no folder. None for a local path or a
    storage URL."""
    protocol = scheme(text)
    if protocol is None or is_storage_url(text):
        return None
    what = "not a protocol mmbatch takes" if protocol not in PROTOCOLS else "not a store"
    return (
        f"{shown(text)!r}: {protocol}:// is {what}; give a local path or a URL of "
        f"{', '.join(f'{p}://' for p in STORES)}"
    )


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
