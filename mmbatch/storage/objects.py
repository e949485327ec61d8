"""Objects in storage, through fsspec: read (bounded, retried, with timeouts), listed,
written whole, copied to a local file.

A file system is made from the URL alone (``file_system``), for the stores of the
allow-list only (``mmbatch.storage.urls.PROTOCOLS``): fsspec picks the back end by the
protocol (s3fs for ``s3://``, gcsfs for ``gs://``, huggingface_hub for ``hf://``), and that
back end finds its credentials and endpoint where its library always looks (for S3: the
``AWS_*`` environment, ``~/.aws``, an instance role; ``AWS_ENDPOINT_URL`` points it at MinIO,
R2 or any S3-compatible store). mmbatch passes none and keeps none. Listings are never
cached: another process (a Ray writer, an earlier run) may have written since.

What can go wrong is sorted once (``Problem``), and each caller says it its own way:

* ``unreachable``: no connection to the store, after retries. ``StorageUnavailable``, a
  fatal error: the job stops, its rows saved, and resumes once the store is back;
* ``missing``, ``denied``, ``failed``: for one item's object (``read_object``,
  ``local_copy``), that item's error row; for what the job names as a whole (an input
  prefix, a manifest, the output), ``StorageError``, said in one line before anything runs;
* ``no_credentials``: the job's mistake wherever it shows (``StorageError``).

Reads are retried (``READ_ATTEMPTS``, with a growing pause) when the failure may pass: a
connection refused or reset, a timeout, an object cut short mid-read. A write is one PUT of
the whole object, which an object store makes visible whole or not at all: the commit that
``mmbatch.output.remote`` builds on.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from mmbatch.errors import MediaError, StorageError, StorageUnavailable
from mmbatch.storage.redaction import redact
from mmbatch.storage.urls import (
    LOGIN_REFUSED,
    is_storage_url,
    protocol_of,
    shown,
    spelled,
    unsupported,
)

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

T = TypeVar("T")

CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0
"""Seconds a socket may wait to connect, and then for the next bytes of a reply: a stalled
read fails (and is retried) instead of hanging the job."""
READ_ATTEMPTS = 3
RETRY_PAUSE_S = 0.5
"""The pause before the second attempt; each later one waits twice as long."""
INSTALL_HINTS = {
    "s3": "pip install 'mmbatch[s3]'",
    "gs": "pip install 'mmbatch[gcs]'",
}
"""How to get the file system of a protocol that fsspec knows but cannot load."""

Problem = Literal["unreachable", "missing", "denied", "no_credentials", "failed"]

_UNREACHABLE = frozenset(
    {
        "EndpointConnectionError",
        "ConnectTimeoutError",
        "ClientConnectorError",
        "ServerDisconnectedError",
        "ConnectionRefusedError",
        "gaierror",
    }
)
_NO_CREDENTIALS = frozenset(
    {"NoCredentialsError", "PartialCredentialsError", "DefaultCredentialsError"}
)
ENVIRONMENT_PREFIXES = ("AWS_", "GOOGLE_", "GCS", "GCE_", "HF_", "FSSPEC_", "AZURE_")
"""The environment a file system reads its endpoint and credentials from: changed, it makes
another file system (a library caller may point at another store between two jobs)."""
_LOCK = threading.Lock()
_FILE_SYSTEMS: dict[tuple[str, int, str], AbstractFileSystem] = {}


class Failure(Exception):
    """An operation on ``url`` that failed for good: what went wrong, and the library's
    words for it (credentials taken out)."""

    def __init__(self, url: str, problem: Problem, detail: str) -> None:
        super().__init__(url, problem, detail)
        self.url, self.problem, self.detail = url, problem, detail

    def __str__(self) -> str:
        return f"{shown(self.url)}: {self.reason}"

    @property
    def reason(self) -> str:
        return {
            "missing": "it does not exist",
            "denied": f"access denied ({self.detail})",
            "no_credentials": "no credentials found (the store's standard places: its "
            "environment variables, configuration files, an instance role)",
            "unreachable": f"the store cannot be reached ({self.detail})",
            "failed": self.detail,
        }[self.problem]

    def job_error(self, doing: str) -> StorageError | StorageUnavailable:
        """This failure as the job's error: ``StorageUnavailable`` when the store cannot be
        reached (the job resumes once it is back), else ``StorageError``."""
        message = f"cannot {doing} {shown(self.url)}: {self.reason}"
        if self.problem == "unreachable":
            return StorageUnavailable(message)
        return StorageError(message)

    def item_error(self) -> MediaError | StorageUnavailable:
        """This failure as one item's error row, unless the store cannot be reached or the
        job has no credentials: then the job stops, whatever item is read."""
        if self.problem == "unreachable":
            return StorageUnavailable(f"cannot read {shown(self.url)}: {self.reason}")
        if self.problem == "no_credentials":
            return StorageUnavailable(f"cannot read {shown(self.url)}: {self.reason}")
        return MediaError(f"cannot read {shown(self.url)}: {self.reason}", "load", "unreadable")


def problem_of(exc: BaseException) -> Problem:
    """What kind of failure ``exc`` (raised by a file system) is."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & _NO_CREDENTIALS:
        return "no_credentials"
    if names & _UNREACHABLE:
        return "unreachable"
    if isinstance(exc, FileNotFoundError):
        return "missing"
    if isinstance(exc, PermissionError):
        return "denied"
    return "failed"


def file_system(url: str) -> tuple[AbstractFileSystem, str]:
    """The file system holding ``url``, and the path it knows the object by. One file
    system per protocol and process (fsspec's own instance cache keeps it); a protocol
    without one is a ``StorageError`` with the install hint. Only the stores of the
    allow-list (``urls.PROTOCOLS``) have one: for any other protocol fsspec is not asked,
    and ``StorageError`` says which are taken."""
    if not is_storage_url(url):
        raise StorageError(unsupported(url) or f"{shown(url)!r} is not a storage URL")
    if shown(url) != spelled(url):
        raise StorageError(f"{shown(url)} {LOGIN_REFUSED}")
    protocol = protocol_of(url)
    key = (protocol, os.getpid(), _environment_digest())
    with _LOCK:
        fs = _FILE_SYSTEMS.get(key)
    if fs is None:
        fs = _make(protocol, url)
        with _LOCK:
            _FILE_SYSTEMS[key] = fs
    return fs, fs._strip_protocol(spelled(url))


def _environment_digest() -> str:
    """A digest of the storage environment (``ENVIRONMENT_PREFIXES``): what it holds is
    not kept, only whether it changed."""
    relevant = sorted((k, v) for k, v in os.environ.items() if k.startswith(ENVIRONMENT_PREFIXES))
    return hashlib.sha256(repr(relevant).encode()).hexdigest()


def _make(protocol: str, url: str) -> AbstractFileSystem:
    try:
        import fsspec
    except ImportError:
        raise StorageError(
            f"{shown(url)}: reading or writing storage URLs needs fsspec; install it with: "
            f"{INSTALL_HINTS.get(protocol, 'pip install fsspec')}"
        ) from None
    try:
        cls = fsspec.get_filesystem_class(protocol)
    except ImportError as exc:
        hint = INSTALL_HINTS.get(protocol, f"install the fsspec back end for {protocol}://")
        raise StorageError(
            f"{shown(url)}: no file system for {protocol}:// here ({exc}); install it with: {hint}"
        ) from None
    _quiet_lost_connections(fsspec)
    # A file system of this module's own (fsspec's cache would hand back one made for an
    # earlier environment).
    options: dict[str, object] = {"skip_instance_cache": True}
    if protocol == "s3":
        options |= {
            "use_listings_cache": False,
            "config_kwargs": {
                "connect_timeout": CONNECT_TIMEOUT_S,
                "read_timeout": READ_TIMEOUT_S,
                "retries": {"max_attempts": 2, "mode": "standard"},
            },
        }
    elif protocol == "gs":
        options |= {"use_listings_cache": False}
    return cls(**options)


def _quiet_lost_connections(fsspec: Any) -> None:
    """Keep fsspec's event loop from printing a traceback for a connection the store
    dropped under a request body being sent: the request itself fails, is retried and said
    (``attempt``); the body's own task, whose failure nobody awaits, would otherwise be
    logged by asyncio as "Task exception was never retrieved" on the job's terminal."""
    from fsspec.asyn import get_loop

    loop = get_loop()

    def handler(loop: Any, context: dict[str, Any]) -> None:
        if isinstance(context.get("exception"), (OSError, ConnectionError)):
            return
        loop.default_exception_handler(context)

    loop.call_soon_threadsafe(loop.set_exception_handler, handler)


def attempt(url: str, call: Callable[[], T], attempts: int = READ_ATTEMPTS) -> T:
    """``call()``, tried up to ``attempts`` times while its failure may pass; else
    ``Failure``."""
    for n in range(attempts):
        try:
            return call()
        except (MediaError, StorageError, StorageUnavailable):
            raise
        except Exception as exc:
            problem = problem_of(exc)
            if problem in ("missing", "denied", "no_credentials") or n == attempts - 1:
                said = f"{type(exc).__name__}: {exc}" if problem == "failed" else str(exc)
                raise Failure(url, problem, redacted(said)) from None
            time.sleep(RETRY_PAUSE_S * 2**n)
    raise AssertionError("unreachable")


def redacted(text: str) -> str:
    """``text`` (a library's words for a failure) without the credentials of the
    environment, those that any file system of this process resolved, and any a request
    carries in its headers (``mmbatch.storage.redaction``)."""
    with _LOCK:
        made = [(key[0], fs) for key, fs in _FILE_SYSTEMS.items() if key[1] == os.getpid()]
    return redact(text, made)


def read_object(url: str, max_bytes: int) -> bytes:
    """The bytes of one item's object, at most ``max_bytes`` (read in one ranged GET, so a
    huge object named like a picture is never fetched whole): ``MediaError`` for that item
    (missing, denied, cut short, too large), ``StorageUnavailable`` for the job."""
    fs, path = file_system(url)

    def read() -> bytes:
        try:
            return bytes(fs.cat_file(path, start=0, end=max_bytes + 1))
        except OSError as exc:
            if "range" in str(exc).lower() and "not satisfiable" in str(exc).lower():
                return b""  # no byte 0 to start at: an empty object
            raise

    try:
        data = attempt(url, read)
    except Failure as failure:
        raise failure.item_error() from None
    if len(data) > max_bytes:
        raise MediaError(
            f"{shown(url)} is over the size limit of {max_bytes} bytes for one media file",
            stage="load",
            kind="too_large",
        )
    return data


def read_many(urls: list[str], max_bytes: int) -> dict[str, bytes | MediaError]:
    """The bytes of several items' objects of one store, read at once (their GETs in
    flight together on the file system's event loop, where it has one), each bounded as
    ``read_object``; one that fails in that pass is read again on its own, with retries,
    and is its item's ``MediaError`` if it still fails. ``StorageUnavailable`` for the
    job."""
    if not urls:
        return {}
    fs, _ = file_system(urls[0])
    paths = [fs._strip_protocol(spelled(url)) for url in urls]
    ends = [max_bytes + 1] * len(paths)
    try:
        found = fs.cat_ranges(paths, [0] * len(paths), ends, on_error="return")
    except Exception:  # the batch as a whole failed: each object on its own says why
        found = [None] * len(paths)
    read: dict[str, bytes | MediaError] = {}
    for url, data in zip(urls, found, strict=True):
        if isinstance(data, (bytes, bytearray)) and len(data) <= max_bytes:
            read[url] = bytes(data)
            continue
        try:
            read[url] = read_object(url, max_bytes)
        except MediaError as exc:
            read[url] = exc
    return read


def read_whole(url: str, doing: str = "read") -> bytes:
    """The bytes of an object the job names as a whole (a manifest, a batch file, a row
    file): ``StorageError`` or ``StorageUnavailable`` when it cannot be read."""
    fs, path = file_system(url)
    try:
        return bytes(attempt(url, lambda: fs.cat_file(path)))
    except Failure as failure:
        raise failure.job_error(doing) from None


ObjectKind = Literal["object", "folder"]


def kind_of(url: str) -> ObjectKind | None:
    """Whether ``url`` names an object, a folder (a prefix holding objects, or a bucket),
    or nothing (None); ``StorageError`` when its bucket does not exist or it cannot be
    asked (no credentials, denied)."""
    fs, path = file_system(url)
    try:
        info = attempt(url, lambda: fs.info(path))
    except Failure as failure:
        if failure.problem != "missing":
            raise failure.job_error("list") from None
        bucket = path.split("/", 1)[0]
        if bucket != path and not _bucket_exists(fs, url, bucket):
            raise StorageError(
                f"{shown(url)}: the bucket {bucket!r} does not exist (or cannot be seen with "
                "these credentials)"
            ) from None
        return None
    return "folder" if info.get("type") == "directory" else "object"


def _bucket_exists(fs: AbstractFileSystem, url: str, bucket: str) -> bool:
    try:
        attempt(url, lambda: fs.info(bucket))
    except Failure as failure:
        if failure.problem == "missing":
            return False
        raise failure.job_error("list") from None
    return True


def list_objects(url: str) -> list[str]:
    """The URLs of every object under the folder ``url``, at any depth, sorted (the same
    order on every machine)."""
    fs, path = file_system(url)
    try:
        found = attempt(url, lambda: fs.find(path, detail=False))
    except Failure as failure:
        raise failure.job_error("list") from None
    return sorted(fs.unstrip_protocol(p) for p in found if p != path)


def list_beside(url: str) -> list[str]:
    """The URLs of every object whose name begins with ``url``'s (``OUT``, ``OUT.job.json``,
    ``OUT.parts/...``, ``OUT/...``), sorted: what an output holds, in one listing."""
    fs, path = file_system(url)
    folder, _, stem = path.rpartition("/")

    def find() -> list[str]:
        try:
            return list(fs.find(folder, prefix=stem, detail=False))
        except TypeError:  # a file system whose listing takes no prefix
            return [p for p in fs.find(folder, detail=False) if p.startswith(path)]

    try:
        found = attempt(url, find)
    except Failure as failure:
        raise failure.job_error("list") from None
    return sorted(fs.unstrip_protocol(p) for p in found if p.startswith(path))


def glob_objects(pattern: str) -> list[str]:
    """The URLs of the objects matching ``pattern`` (``*``, ``**``, ``?``), sorted."""
    fs, path = file_system(pattern)
    try:
        found = attempt(pattern, lambda: fs.glob(path, detail=True))
    except Failure as failure:
        raise failure.job_error("list") from None
    return sorted(fs.unstrip_protocol(p) for p, info in found.items() if info["type"] == "file")


def exists(url: str) -> bool:
    """Whether an object (or a folder) is at ``url``."""
    return kind_of(url) is not None


def put_object(url: str, data: bytes) -> None:
    """Write ``data`` as the object ``url``, replacing it whole: one PUT, which the store
    makes visible whole or not at all."""
    fs, path = file_system(url)
    try:
        attempt(url, lambda: fs.pipe_file(path, data))
    except Failure as failure:
        raise failure.job_error("write") from None


def put_file(url: str, local: str | Path) -> None:
    """Upload the local file ``local`` as the object ``url`` (whole, as ``put_object``)."""
    fs, path = file_system(url)
    try:
        attempt(url, lambda: fs.put_file(str(local), path))
    except Failure as failure:
        raise failure.job_error("write") from None


def delete_objects(urls: list[str]) -> None:
    """Remove the objects ``urls`` of one store (one missing already is no failure), in as
    few requests as the store takes (S3: a thousand a request)."""
    if not urls:
        return
    fs, _ = file_system(urls[0])
    paths = [fs._strip_protocol(spelled(url)) for url in urls]
    try:
        attempt(urls[0], lambda: _remove(fs, paths))
    except Failure as failure:
        raise failure.job_error("remove") from None


def _remove(fs: AbstractFileSystem, paths: list[str]) -> None:
    try:
        fs.rm(paths)
    except FileNotFoundError:  # a file system that says so of one gone already
        for path in paths:
            with suppress(FileNotFoundError):
                fs.rm_file(path)


def download(url: str, local: str | Path, doing: str = "read") -> None:
    """Copy the object ``url`` to the local file ``local`` (streamed, not held)."""
    fs, path = file_system(url)
    try:
        attempt(url, lambda: fs.get_file(path, str(local)))
    except Failure as failure:
        raise failure.job_error(doing) from None


_COPIES: dict[str, str] = {}
_COPYING: dict[str, threading.Event] = {}
_COPY_FOLDER: list[str] = []


def local_copy(url: str) -> str:
    """A local file holding the object ``url``, for media decoded from a file (a video
    demuxed and seeked, an audio file): copied once per process, streamed to a folder of
    the process's own that goes when it exits, keeping the object's suffix so that its
    format is found as a file's is. One item's object that cannot be copied is that item's
    ``MediaError``."""
    while True:
        with _LOCK:
            known, copying = _COPIES.get(url), _COPYING.get(url)
            if known is None and copying is None:
                _COPYING[url] = threading.Event()
                break
        if known is not None:
            return known
        assert copying is not None
        copying.wait()
    try:
        target = os.path.join(_copy_folder(), _copy_name(url))
        fs, path = file_system(url)
        try:
            attempt(url, lambda: fs.get_file(path, target))
        except Failure as failure:
            Path(target).unlink(missing_ok=True)
            raise failure.item_error() from None
        with _LOCK:
            _COPIES[url] = target
        return target
    finally:
        with _LOCK:
            done = _COPYING.pop(url, None)
        if done is not None:
            done.set()


def _copy_name(url: str) -> str:
    suffix = Path(url.rsplit("/", 1)[-1]).suffix
    return hashlib.sha256(url.encode()).hexdigest()[:32] + suffix


def _copy_folder() -> str:
    with _LOCK:
        if not _COPY_FOLDER:
            folder = tempfile.mkdtemp(prefix="mmbatch-copies-")
            atexit.register(shutil.rmtree, folder, ignore_errors=True)
            _COPY_FOLDER.append(folder)
        return _COPY_FOLDER[0]


def arrow_file_system(url: str) -> tuple[Any, str]:
    """The file system holding ``url`` as pyarrow takes one (for Ray Data's readers and
    writers), and the path it knows ``url`` by: the same fsspec file system, so that every
    process finds its credentials and endpoint as this one does. It pickles as its
    settings (no credential), and each Ray worker that unpickles it makes its own."""
    import pyarrow.fs

    fs, path = file_system(url)
    return pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(fs)), path
