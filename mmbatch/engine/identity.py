"""What a model is, by content: so that an output is never resumed, nor a ``datasets`` cache
reused, with answers from other weights that happen to sit at the same path.

A local model directory is identified by every file's name and the xxh3-128 digest of its
bytes, weights included (a rebuilt checkpoint of the same size is another model). Hashing a
15 GB checkpoint takes a while, so each file is hashed once: its digest is cached, keyed by
its real path, size, mtime and ctime (a copy that restores the mtime, ``cp -p`` or
``rsync -t``, still gets a new ctime), in ``file-digests.json`` under ``$MMBATCH_CACHE_DIR``
(default ``~/.cache/mmbatch``). A cache that cannot be read or written only costs the hashing
again. A hub name is identified by the name and the revision pinned, if any: its content is
the hub's.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import suppress
from pathlib import Path
from typing import Any

import xxhash

from mmbatch.errors import OutputError
from mmbatch.jsonl import write_text_atomic
from mmbatch.media.hashing import file_digest

CACHE_ENV = "MMBATCH_CACHE_DIR"
ANNOUNCE_BYTES = 1024**3
"""Hashing more than this (not cached yet) is announced on stderr: it takes seconds."""


def model_identity(model: str, revision: str | None = None) -> str:
    """``dir:<digest>`` over a local model directory's files, or ``hub:<name>[@revision]``."""
    root = Path(model)
    if not root.is_dir():
        return f"hub:{model}" + (f"@{revision}" if revision else "")
    files = sorted(
        (path.relative_to(root).as_posix(), path)
        for path in root.rglob("*")
        if path.is_file() and not any(p.startswith(".") for p in path.relative_to(root).parts)
    )
    cache = _DigestCache.load()
    h = xxhash.xxh3_128()
    for name, path in files:
        h.update(f"{name}\0{cache.digest(path)}\0".encode())
    cache.save()
    return f"dir:{h.hexdigest()}"


def cache_root() -> Path:
    """The host's cache of what mmbatch keys by content: ``$MMBATCH_CACHE_DIR``, else
    ``~/.cache/mmbatch``."""
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "mmbatch")
    return Path(root)


def cache_path() -> Path:
    return cache_root() / "file-digests.json"


class _DigestCache:
    """File digests by real path, valid while the file's size, mtime and ctime are unchanged."""

    def __init__(self, entries: dict[str, Any]) -> None:
        self.entries = entries
        self.changed = False

    @classmethod
    def load(cls) -> _DigestCache:
        try:
            entries = json.loads(cache_path().read_text(encoding="utf-8"))
        except (OSError, ValueError):
            entries = {}
        return cls(entries if isinstance(entries, dict) else {})

    def digest(self, path: Path) -> str:
        real = os.path.realpath(path)
        info = os.stat(real)
        stamp = [info.st_size, info.st_mtime_ns, info.st_ctime_ns]
        entry = self.entries.get(real)
        if isinstance(entry, dict) and entry.get("stamp") == stamp:
            return str(entry["digest"])
        if info.st_size > ANNOUNCE_BYTES:
            print(
                f"mmbatch: hashing {path.name} ({info.st_size / 1e9:.1f} GB) once, to know the "
                "model by its content",
                file=sys.stderr,
            )
        digest = file_digest(real)[0].hex()
        self.entries[real] = {"stamp": stamp, "digest": digest}
        self.changed = True
        return digest

    def save(self) -> None:
        if not self.changed:
            return
        self.entries = {k: v for k, v in self.entries.items() if os.path.exists(k)}
        with suppress(OutputError):  # no cache: the next run hashes again
            write_text_atomic(cache_path(), json.dumps(self.entries, sort_keys=True) + "\n")
