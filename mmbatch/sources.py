"""Turn what the user named on the command line into ``Request`` values, reading no media.

Accepted inputs: an image file, a directory (walked recursively, sorted, so the order is
the same on every machine), a glob pattern, or a manifest (``.jsonl`` / ``.csv``) whose rows
have a ``path`` and optionally an ``id`` and a ``prompt``. Manifest paths are relative to
the manifest's folder.

Ids are the identity of a row in the output and on resume, so they must be unique: a file
named twice is one item; two manifest rows with one id are an error, raised before any work.
"""

from __future__ import annotations

import csv
import glob
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from mmbatch.errors import SourceError
from mmbatch.types import MediaRef, Request

IMAGE_SUFFIXES = frozenset(
    {".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff", ".jfif"}
)
MANIFEST_SUFFIXES = frozenset({".jsonl", ".csv"})


def image_requests(inputs: Sequence[str], prompt: str, system: str | None = None) -> list[Request]:
    """One request per image found in ``inputs``, each asking ``prompt`` (unless its
    manifest row brings its own)."""
    requests: list[Request] = []
    seen: set[str] = set()
    for item_id, path, row_prompt in _expand(inputs):
        if item_id in seen:
            if item_id == path:
                continue  # the same file reached twice (named and inside a folder): one item
            raise SourceError(f"duplicate id {item_id!r} in the inputs; ids must be unique")
        seen.add(item_id)
        requests.append(
            Request(
                id=item_id,
                prompt=row_prompt if row_prompt is not None else prompt,
                media=(MediaRef("image", path),),
                system=system,
            )
        )
    if not requests:
        raise SourceError(f"no images found in {', '.join(map(repr, inputs))}")
    return requests


def _expand(inputs: Sequence[str]) -> Iterator[tuple[str, str, str | None]]:
    """Yield ``(id, path, prompt-or-None)`` for every input, in a deterministic order."""
    for raw in inputs:
        path = Path(raw)
        if path.is_dir():
            for found in _walk_images(path):
                yield str(found), str(found), None
        elif path.suffix.lower() in MANIFEST_SUFFIXES and path.is_file():
            yield from _read_manifest(path)
        elif path.exists() or path.is_symlink():
            # Named explicitly: taken whatever its suffix, so a bad file yields an error row.
            yield raw, raw, None
        elif glob.has_magic(raw):
            matches = sorted(glob.glob(raw, recursive=True))
            files = [m for m in matches if Path(m).suffix.lower() in IMAGE_SUFFIXES]
            if not files:
                raise SourceError(f"the pattern {raw!r} matches no image")
            for file in files:
                yield file, file, None
        else:
            raise SourceError(f"input {raw!r} does not exist")


def _walk_images(root: Path) -> list[Path]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if not name.startswith(".") and Path(name).suffix.lower() in IMAGE_SUFFIXES:
                found.append(Path(dirpath) / name)
    return found


def _read_manifest(manifest: Path) -> Iterator[tuple[str, str, str | None]]:
    base = manifest.parent
    for line_no, row in _manifest_rows(manifest):
        where = f"{manifest}:{line_no}"
        raw_path = row.get("path")
        if not isinstance(raw_path, str) or not raw_path:
            raise SourceError(f"{where}: row has no 'path' (got {row!r})")
        item_id = row.get("id", raw_path)
        prompt = row.get("prompt")
        if prompt is not None and not isinstance(prompt, str):
            raise SourceError(f"{where}: 'prompt' must be a string, got {prompt!r}")
        yield str(item_id), str(base / raw_path), prompt or None


def _manifest_rows(manifest: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    if manifest.suffix.lower() != ".csv":
        yield from jsonl_objects(manifest)
        return
    with manifest.open(newline="", encoding="utf-8") as handle:
        for line_no, row in enumerate(csv.DictReader(handle), start=2):
            yield line_no, {k: v for k, v in row.items() if v not in (None, "")}


def jsonl_objects(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """The JSON object on each non-blank line of ``path``, with its line number; a file that
    cannot be read or a line that is not an object is a ``SourceError`` naming the line."""
    try:
        handle = path.open(encoding="utf-8")
    except OSError as exc:
        raise SourceError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
    with handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise SourceError(f"{path}:{line_no}: not valid JSON ({exc})") from None
            if not isinstance(row, dict):
                raise SourceError(f"{path}:{line_no}: expected a JSON object, got {row!r}")
            yield line_no, row
