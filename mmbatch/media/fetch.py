"""Read the bytes of a media source: a local path, or an http(s) URL when the job allows it.

Only regular files are read. A FIFO named ``b.jpg`` would block the reader forever, and
``/dev/zero`` behind a symlink would feed it forever; a device may even act on being opened.
So a path is checked with ``stat`` before it is opened (nothing that is not a regular file is
ever opened), opened without blocking, and checked again on the open descriptor, so that a
file swapped in between is caught too. A path the path rule checked comes pinned to the file
it led to then (``FileId``, ``mmbatch.sources.paths``): both checks compare the file with
the pin, so a symlink swapped in since the inputs were listed is not read. A read is bounded
in bytes (``DEFAULT_MAX_FILE_BYTES``): a size the file system reports can be wrong
(``/proc`` files say 0), the bytes read cannot.

A storage URL (``s3://``, ``gs://``, ``hf://``: ``mmbatch.storage``) is read through its file
system, bounded the same way (one ranged read of at most the limit), retried and timed out
there; it needs no ``--allow-urls``: what a manifest may name in storage is the path rule's
matter (``mmbatch.sources.paths``), as for local paths. A URL of any protocol outside the
allow-list (``mmbatch.storage.urls.PROTOCOLS``) is refused, and no file system is made for it.

http(s) URLs are off by default: a manifest is data from somewhere else, and fetching whatever it
names would let it make this machine send requests (to internal services, say) and pull
unbounded amounts of data. With ``UrlPolicy`` given, a fetch is bounded in bytes (checked
while reading, not trusted from Content-Length) and in time (per socket operation and in
total), and only http and https are accepted.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass
from typing import BinaryIO

from mmbatch.errors import ConfigError, MediaError
from mmbatch.storage.located import StoredPlace, locate
from mmbatch.storage.objects import read_object
from mmbatch.storage.urls import is_web_url, scheme, shown, unsupported
from mmbatch.types import FileId

URL_SCHEMES = ("http://", "https://")
DEFAULT_URL_MAX_BYTES = 50 * 1024**2
DEFAULT_URL_TIMEOUT_S = 30.0
DEFAULT_MAX_FILE_BYTES = 1024**3
"""The most bytes read from one local media file that is read whole (a picture): anything
larger is refused as ``too_large`` rather than loaded into memory."""
_CHUNK = 64 * 1024


def is_url(source: str) -> bool:
    """Whether ``source`` names a URL (of any protocol: whatever comes before its first
    ``://``, as fsspec reads it) rather than a local path."""
    return scheme(source) is not None


def is_fetched_url(source: str) -> bool:
    """Whether ``source`` is a URL fetched with ``--allow-urls`` (http, https), rather than
    a path or a storage URL, which the path rule holds (``mmbatch.sources.paths``); a URL of
    any other protocol is refused before it is read (``mmbatch.storage.urls.PROTOCOLS``)."""
    return is_web_url(source)


@dataclass(frozen=True)
class UrlPolicy:
    """Permission to fetch http(s) URLs, with the limits each fetch must stay within."""

    max_bytes: int = DEFAULT_URL_MAX_BYTES
    timeout_s: float = DEFAULT_URL_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.max_bytes < 1:
            raise ConfigError(f"the URL size limit must be >= 1 byte, got {self.max_bytes}")
        if self.timeout_s <= 0:
            raise ConfigError(f"the URL time limit must be > 0 s, got {self.timeout_s}")


def read_source(
    source: str,
    urls: UrlPolicy | None,
    max_bytes: int = DEFAULT_MAX_FILE_BYTES,
    pinned: FileId | None = None,
) -> bytes:
    """The bytes of ``source`` (at most ``max_bytes`` of a local file, which must be the file
    ``pinned`` when given, or of an object in storage), or ``MediaError`` saying why they
    cannot be had."""
    if not is_url(source):
        return read_file(source, max_bytes, pinned)[0]
    place = locate(source)
    if isinstance(place, StoredPlace):
        return read_object(source, max_bytes)
    refusal = unsupported(source)
    if refusal is not None:
        raise MediaError(refusal, stage="source", kind="unsupported")
    if urls is None:
        raise MediaError(
            f"{shown(source)!r} is a URL and URL inputs are off (pass --allow-urls to fetch them)",
            stage="load",
            kind="unsupported",
        )
    return fetch_url(source, urls)


def read_file(
    path: str, max_bytes: int = DEFAULT_MAX_FILE_BYTES, pinned: FileId | None = None
) -> tuple[bytes, os.stat_result]:
    """The bytes of the local file ``path`` (see ``read_source``) and the status of the file
    they were read from, taken on the open descriptor: what a caller may know them by."""
    with open_regular(path, pinned) as handle:
        try:
            data = handle.read(max_bytes + 1)
        except OSError as exc:
            raise unreadable(path, exc) from None
        info = os.fstat(handle.fileno())
    if len(data) > max_bytes:
        raise MediaError(
            f"{path!r} is over the size limit of {max_bytes} bytes for one media file",
            stage="load",
            kind="too_large",
        )
    return data, info


def check_regular(path: str, pinned: FileId | None = None) -> os.stat_result:
    """``path``'s status if it is a regular file (symlinks followed), and the file
    ``pinned`` when given; else ``MediaError``: ``unreadable`` (stage "load") when it cannot
    be reached, ``unsupported`` when it is a folder, FIFO, socket or device,
    ``not_allowed`` (stage "source") when it is another file than the pin. Nothing is
    opened."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise unreadable(path, exc) from None
    except ValueError:  # a NUL byte, a lone surrogate: no file has that name
        raise MediaError(
            f"cannot read {path!r}: no file can have that name", stage="load", kind="unreadable"
        ) from None
    _check_pin(path, info, pinned)
    if not stat.S_ISREG(info.st_mode):
        raise MediaError(
            f"{path!r} is {_file_kind(info.st_mode)}, not a regular file; only regular files "
            "are read",
            stage="load",
            kind="unsupported",
        )
    return info


def open_regular(path: str, pinned: FileId | None = None) -> BinaryIO:
    """``path`` opened for binary reading if it is a regular file (the file ``pinned`` when
    given), else ``MediaError`` (see ``check_regular``). Checked before opening and again on
    the open descriptor, before a byte is read."""
    check_regular(path, pinned)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise unreadable(path, exc) from None
    try:
        opened = os.fstat(fd)
        _check_pin(path, opened, pinned)
        mode = opened.st_mode
        if not stat.S_ISREG(mode):  # swapped for something else since the check
            raise MediaError(
                f"{path!r} is {_file_kind(mode)}, not a regular file; only regular files are read",
                stage="load",
                kind="unsupported",
            )
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _check_pin(path: str, info: os.stat_result, pinned: FileId | None) -> None:
    if pinned is not None and (info.st_dev, info.st_ino) != (pinned.device, pinned.inode):
        raise MediaError(
            f"{path!r} is no longer the file checked when the inputs were listed (replaced "
            "since, or a link on its way now leads elsewhere); it was not read",
            stage="source",
            kind="not_allowed",
        )


def _file_kind(mode: int) -> str:
    kinds = (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    )
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def unreadable(path: str, exc: OSError) -> MediaError:
    """Why ``path`` could not be read, as the item's error."""
    reason = "it does not exist" if isinstance(exc, FileNotFoundError) else exc.strerror or exc
    return MediaError(f"cannot read {path!r}: {reason}", stage="load", kind="unreadable")


def fetch_url(url: str, policy: UrlPolicy) -> bytes:
    """GET ``url`` within ``policy``'s byte and time limits."""
    import http.client
    import urllib.error
    import urllib.request

    if not url.lower().startswith(URL_SCHEMES):
        raise MediaError(
            f"{shown(url)!r}: only http and https URLs are fetched",
            stage="load",
            kind="unsupported",
        )
    if shown(url) != url:
        raise MediaError(
            f"{shown(url)!r} holds a user name or password, which is never sent",
            stage="load",
            kind="unsupported",
        )
    deadline = time.monotonic() + policy.timeout_s
    try:
        with urllib.request.urlopen(url, timeout=policy.timeout_s) as response:
            declared = response.headers.get("Content-Length")
            if declared is not None and declared.isdigit() and int(declared) > policy.max_bytes:
                raise _too_large(url, policy)
            chunks: list[bytes] = []
            size = 0
            # read1 returns whatever has arrived, so a server that trickles bytes still
            # meets the clock between reads.
            while chunk := response.read1(_CHUNK):
                size += len(chunk)
                if size > policy.max_bytes:
                    raise _too_large(url, policy)
                if time.monotonic() > deadline:
                    raise MediaError(
                        f"fetching {shown(url)!r} took over {policy.timeout_s:g} s",
                        stage="load",
                        kind="unreadable",
                    )
                chunks.append(chunk)
            return b"".join(chunks)
    except MediaError:
        raise
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        if isinstance(exc, urllib.error.HTTPError):
            exc.close()  # it holds the response's socket
            reason: object = f"HTTP {exc.code} {exc.reason}"
        else:
            reason = getattr(exc, "reason", None) or exc
        raise MediaError(
            f"cannot fetch {shown(url)!r}: {reason}", stage="load", kind="unreadable"
        ) from None


def _too_large(url: str, policy: UrlPolicy) -> MediaError:
    return MediaError(
        f"{shown(url)!r} is over the URL size limit of {policy.max_bytes} bytes",
        stage="load",
        kind="too_large",
    )
