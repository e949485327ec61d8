"""Turn what the user named on the command line into ``Request`` values, reading no media.

Accepted inputs: an image file, a directory (walked recursively, sorted, so the order is
the same on every machine), a glob pattern, or a manifest (``.jsonl`` / ``.csv``) whose rows
have a ``path`` and optionally an ``id`` and a ``prompt``. Manifest paths are relative to
the manifest's folder.

A walk takes the pictures of every format the decoder opens (``picture_suffixes``: AVIF too,
where Pillow has it) and passes over everything else, hidden files and folders, linked
folders (not followed, so a link cannot loop), and linked files that lead out of the walked
folder (the path rule, ``mmbatch.sources.paths``: ``--input-root`` or
``--allow-outside-root`` widens it; a pattern's folder is the part of it before the first
wildcard); each file passed over is counted by reason in the ``ListingLog`` the caller hands
in, which the job's summary shows. A walked file is pinned to the file it was when listed,
as a path named inside a manifest is.

Ids are the identity of a row in the output and on resume, so they must be unique: a file
named twice is one item; two manifest rows with one id are an error, raised before any work.
A file's id is made from its path alone (``path_id``), one id per name on every run.

A manifest is data from elsewhere, read as JSON or CSV and nothing else, and it is not
trusted with the file system: its paths follow the rule every input's paths do
(``mmbatch.sources.paths``: inside the manifest's folder, or a folder the person running the
job allowed), and its URLs are refused unless ``SourcePolicy.allow_urls``. Both are checked
here, before any work starts, and either refusal is that row's error (stage ``source``, kind
``not_allowed``): the rest of the job goes on. A URL named on the command line without
``allow_urls`` is the job's mistake, said before anything runs.

Storage URLs (``s3://``, ``gs://``, ``hf://``: ``mmbatch.storage``) are inputs like paths, and
need no ``allow_urls``: a prefix is walked as a folder is (every object under it, sorted,
hidden names passed over), a pattern matched, a manifest read, an object taken as named; a
bucket or prefix that does not exist, or that the credentials cannot list, is the job's
mistake, said before anything runs. A storage URL named inside a manifest follows the path
rule for URLs (``mmbatch.sources.paths``), as a manifest in storage's relative paths do. A
URL of a protocol mmbatch does not take (``mmbatch.storage.urls.PROTOCOLS``) is its row's
error in a manifest, and the job's mistake on the command line.
Listing reads no media: the objects are read by the loader, beside the engine.
"""

from __future__ import annotations

import csv
import glob
import itertools
import json
import os
import stat
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple, TypeAlias

from mmbatch.errors import ItemFailure, MediaError, SourceError
from mmbatch.jsonl import JsonlError, printable
from mmbatch.media.fetch import is_url, unreadable
from mmbatch.row_schema import COLUMN_NAMES
from mmbatch.sources.log import ListingLog
from mmbatch.sources.paths import (
    LINKED_OUT_FILES,
    LinkedOut,
    LocalPaths,
    is_fetched_url,
    url_not_allowed,
)
from mmbatch.storage.located import LocalPlace, Place, StoredPlace, locate
from mmbatch.storage.objects import list_objects
from mmbatch.storage.urls import shown, unsupported
from mmbatch.types import (
    ClipSpan,
    FileId,
    FrameAt,
    ItemError,
    MediaRef,
    Modality,
    Request,
    TimeSpan,
)

IMAGE_SUFFIXES = frozenset(
    {".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff", ".jfif"}
)
MANIFEST_SUFFIXES = frozenset({".jsonl", ".csv"})
VIDEO_SUFFIXES = frozenset({".mp4", ".mov", ".mkv", ".webm", ".avi", ".m4v", ".mpg", ".mpeg"})
AUDIO_SUFFIXES = frozenset({".wav", ".flac", ".mp3", ".ogg", ".opus", ".m4a", ".aac", ".wma"})


KeepColumns: TypeAlias = "tuple[str, ...] | Literal['all']"
"""The input columns carried into each output row: named ones, or ``"all"``."""


@dataclass(frozen=True)
class SourcePolicy:
    """What the inputs may point at, and what of them is carried into the rows."""

    paths: LocalPaths = field(default_factory=LocalPaths)
    """Where the paths a manifest names may lead, besides the manifest's own folder."""
    allow_urls: bool = False
    keep_columns: KeepColumns = ()
    """A manifest's columns (besides path, id and prompt) copied into each item's row."""


@dataclass(frozen=True)
class InputFile:
    """One distinct file (or URL) the inputs name, with the manifest's id and prompt if any."""

    id: str
    path: str
    prompt: str | None = None
    walked: bool = False
    """Found in a folder or by a glob, rather than named (directly or in a manifest)."""
    columns: tuple[tuple[str, Any], ...] = ()
    """The manifest row's columns kept for the item's row (``SourcePolicy.keep_columns``)."""
    refused: ItemError | None = None
    """Why the path may not be read (``mmbatch.sources.paths``): the item is this error."""
    pinned: FileId | None = None
    """The file the path rule checked (``MediaRef.pinned``); None: read as named."""

    def check_allowed(self) -> None:
        """The refusal as an ``ItemFailure``, if the path was refused: for a caller that
        reads the file while listing (a video's frames, an audio file's length) before
        anything else."""
        if self.refused is not None:
            raise MediaError(self.refused.message, self.refused.stage, self.refused.kind)

    def local_file(self) -> str:
        """Where this file's bytes open as a file, for a caller that reads it while listing
        (a video's index, an audio file's length): its path, or for an object in storage a
        local copy of it (made once per process; the loader decodes from the same copy)."""
        return locate(self.path).local_file()

    def ref(
        self, modality: Modality, part: FrameAt | TimeSpan | ClipSpan | None = None
    ) -> MediaRef:
        """The media this file is (or the ``part`` of it), pinned as it was listed."""
        return MediaRef(modality, self.path, part=part, pinned=self.pinned)


class _Listed(NamedTuple):
    """One input as listing finds it, before its id is made printable."""

    id: Any
    path: str
    prompt: str | None = None
    columns: tuple[tuple[str, Any], ...] = ()
    refused: ItemError | None = None
    pinned: FileId | None = None
    walked: bool = False
    own_id: bool = False
    """The id is a manifest row's own (its ``id``, or its path as written), kept as written;
    else it is made from the file's path (``path_id``)."""


def path_id(path: str) -> str:
    """The id of a file known by its path (walked, matched by a pattern, named): the path as
    text, with each byte that is not UTF-8 written ``\\xNN`` and a backslash ``\\\\``.

    Escaping the odd bytes alone (``printable``) would give two files one id: ``a_\\xff.jpg``
    (the byte 0xff) and a file whose name is those ten characters, which a tool that escapes
    names can leave beside it. A walk would then stop at "duplicate id", so that one file
    dropped into a shared folder blocks every job over it. Telling the two apart only when
    both are there (a suffix on the second found) gives a file another's id when they arrive
    one after the other, and resume then takes the first file's row for the second's; two
    error rows likewise leave the earlier run's row under the wrong file. So the id is a
    function of the name alone: a backslash is escaped too, which makes every name's id its
    own, on every run, whatever else the folder holds, and changes no id but those of names
    holding a backslash (the name with the byte 0xff is still ``x_\\xff.jpg``)."""
    return printable(path.replace("\\", "\\\\"))


def list_inputs(
    inputs: Sequence[str],
    suffixes: frozenset[str] = IMAGE_SUFFIXES,
    policy: SourcePolicy | None = None,
    kind: str = "image",
    log: ListingLog | None = None,
) -> list[InputFile]:
    """The distinct files of ``inputs``, each once: a file reached twice (named, and inside
    a folder) is one item; two manifest rows with one id are a ``SourceError``, as is finding
    no ``kind`` at all. What walks pass over is counted in ``log``."""
    files: list[InputFile] = []
    seen: dict[str, str] = {}  # id -> the path it was first given to
    log = log if log is not None else ListingLog()
    for raw in inputs:
        for listed in _expand([raw], suffixes, policy, log):
            # An id is text in every output, so a file name that is not UTF-8 becomes an id
            # with its odd bytes escaped (the path itself stays the one that opens the file).
            item_id = printable(listed.id) if listed.own_id else path_id(listed.id)
            path = listed.path
            if item_id in seen:
                if listed.id == path == seen[item_id]:
                    continue  # one file reached twice
                raise SourceError(f"duplicate id {item_id!r} in the inputs; ids must be unique")
            seen[item_id] = path
            files.append(
                InputFile(
                    item_id,
                    path,
                    listed.prompt,
                    listed.walked,
                    listed.columns,
                    listed.refused,
                    listed.pinned,
                )
            )
    if not files:  # said loudly: a walk whose every file was passed over
        skipped = f"; {log.lines()[0]}" if log.skipped else ""
        raise SourceError(f"no {kind} found in {', '.join(map(repr, inputs))}{skipped}")
    return files


def image_requests(
    inputs: Sequence[str],
    prompt: str,
    system: str | None = None,
    policy: SourcePolicy | None = None,
    log: ListingLog | None = None,
) -> list[Request]:
    """One request per image found in ``inputs``, each asking ``prompt`` (unless its
    manifest row brings its own)."""
    return [
        Request(
            f.id,
            f.prompt or prompt,
            (f.ref("image"),),
            system,
            columns=f.columns,
            error=f.refused,
        )
        for f in list_inputs(inputs, IMAGE_SUFFIXES, policy, "images", log)
    ]


def _expand(
    inputs: Sequence[str],
    suffixes: frozenset[str] = IMAGE_SUFFIXES,
    policy: SourcePolicy | None = None,
    log: ListingLog | None = None,
) -> Iterator[_Listed]:
    """Every input, in a deterministic order. Folders and globs contribute the files whose
    suffix is in ``suffixes`` (with every picture format the decoder opens, when ``suffixes``
    takes pictures), counting the others in ``log``; a file named explicitly is taken
    whatever its suffix, so that a bad file gets an error row."""
    policy = policy or SourcePolicy()
    log = log if log is not None else ListingLog()
    kinds = "image" if suffixes == IMAGE_SUFFIXES else "media file"
    taken = _taken(suffixes)
    for raw in inputs:
        refusal = unsupported(raw)
        if refusal is not None:  # named by the person running the job: the job's mistake
            raise SourceError(f"input {refusal}")
        place = locate(raw)
        if isinstance(place, StoredPlace):
            yield from _expand_url(place, taken, policy, log, kinds)
        elif is_url(raw):
            _check_url(raw, "input", policy)
            yield _Listed(shown(raw), raw)
        else:
            yield from _expand_local(place, taken, policy, log, kinds)


def _expand_local(
    place: LocalPlace, taken: frozenset[str], policy: SourcePolicy, log: ListingLog, kinds: str
) -> Iterator[_Listed]:
    """A local path named as an input: a folder walked, a manifest read, a file taken as
    named, or a pattern's files."""
    raw, path = place.path, Path(place.path)
    kind = place.kind()
    if kind == "folder":
        yield from _walk(path, taken, log, policy.paths)
    elif kind == "file" and path.suffix.lower() in MANIFEST_SUFFIXES and path.is_file():
        yield from _read_manifest(LocalPlace(str(path)), policy)
    elif kind == "file":
        # Named explicitly: taken whatever its suffix, so a bad file yields an error row.
        yield _Listed(raw, raw)
    elif glob.has_magic(raw):
        files = []
        for match in place.matches():
            if os.path.isdir(match):
                log.skip("folders matched by a pattern (not walked)")
            elif Path(match).suffix.lower() in taken:
                files.append(match)
            else:
                log.skip(_passed_over(Path(match).suffix.lower()))
        if not files:
            raise SourceError(f"the pattern {raw!r} matches no {kinds}")
        for file in files:
            for listed in _admitted(file, _pattern_folder(raw), policy.paths, log):
                yield listed._replace(walked=True)
    else:
        raise SourceError(f"input {raw!r} does not exist")


def _expand_url(
    place: StoredPlace, taken: frozenset[str], policy: SourcePolicy, log: ListingLog, kinds: str
) -> Iterator[_Listed]:
    """A storage URL named as an input: a pattern's objects, a prefix walked, a manifest
    read, or one object taken as named (whatever its suffix, as a file named is)."""
    url = place.url
    if glob.has_magic(url):
        found = [u for u in place.matches() if _taken_object(u, url, taken, log)]
        if not found:
            raise SourceError(f"the pattern {place.shown!r} matches no {kinds}")
        yield from (_Listed(u, u, walked=True) for u in found)
        return
    kind = place.kind()
    if kind is None:
        raise SourceError(f"input {place.shown!r} does not exist")
    if kind == "folder":
        found = [u for u in list_objects(url) if _taken_object(u, url, taken, log)]
        yield from (_Listed(u, u, walked=True) for u in found)
    elif Path(url).suffix.lower() in MANIFEST_SUFFIXES:
        yield from _read_manifest(place, policy)
    else:
        yield _Listed(url, url)


def _taken_object(url: str, root: str, taken: frozenset[str], log: ListingLog) -> bool:
    """Whether a walk of the prefix ``root`` takes the object ``url``: not hidden (no name
    on its way down from ``root`` starting with a dot), and of a suffix ``taken``; what it
    passes over is counted in ``log``."""
    names = url[len(root.rstrip("/")) + 1 :].split("/") if url.startswith(root) else [url]
    if any(name.startswith(".") for name in names[:-1]):
        log.skip("hidden folders (not walked)")
        return False
    if names[-1].startswith("."):
        log.skip("hidden files")
        return False
    suffix = Path(names[-1]).suffix.lower()
    if suffix not in taken:
        log.skip(_passed_over(suffix))
        return False
    return True


SKIP_HINTS = {
    ".heic": "no decoder here: pip install pillow-heif",
    ".heif": "no decoder here: pip install pillow-heif",
    ".eps": "PostScript is not rendered",
    ".ps": "PostScript is not rendered",
}
"""Why a walk passes over files that look like pictures, where there is more to say."""


def _taken(suffixes: frozenset[str]) -> frozenset[str]:
    """``suffixes``, with every picture format the decoder opens when it takes pictures."""
    if not suffixes >= IMAGE_SUFFIXES:
        return suffixes
    from mmbatch.media.image import picture_suffixes

    return suffixes | (picture_suffixes() - VIDEO_SUFFIXES - AUDIO_SUFFIXES)


def _passed_over(suffix: str) -> str:
    """The reason a walk gives for a file of ``suffix`` that it does not take."""
    name = f"{suffix} files" if suffix else "files without a suffix"
    hint = SKIP_HINTS.get(suffix)
    return f"{name} ({hint})" if hint else name


def _walk(
    root: Path, suffixes: frozenset[str], log: ListingLog, paths: LocalPaths
) -> Iterator[_Listed]:
    """The files of ``root`` (and its folders) whose suffix is in ``suffixes``, sorted,
    each held to the path rule (``_admitted``); what is passed over is counted in ``log``."""
    found = []

    def unreadable(error: OSError) -> None:
        log.skip(f"unreadable folders ({error.strerror or error})")

    for dirpath, dirnames, filenames in os.walk(root, onerror=unreadable):
        kept = []
        for name in sorted(dirnames):
            if name.startswith("."):
                log.skip("hidden folders (not walked)")
            elif os.path.islink(os.path.join(dirpath, name)):
                log.skip("linked folders (not followed)")
            else:
                kept.append(name)
        dirnames[:] = kept
        for name in sorted(filenames):
            suffix = Path(name).suffix.lower()
            if name.startswith("."):
                log.skip("hidden files")
            elif suffix in suffixes:
                found.append(os.path.join(dirpath, name))
            else:
                log.skip(_passed_over(suffix))
    for file in found:
        for listed in _admitted(file, str(root), paths, log):
            yield listed._replace(walked=True)


LINKED_OUT = f"{LINKED_OUT_FILES} (allow with --input-root DIR or --allow-outside-root)"
"""The reason a walk gives for a file symlink that leads where the path rule refuses."""


def _admitted(file: str, folder: str, paths: LocalPaths, log: ListingLog) -> Iterator[_Listed]:
    """``file``, found in ``folder`` by a walk or a pattern, if the path rule lets it be read
    (pinned to the file it is now); a link out of ``folder`` is passed over and counted. A
    file found that is no longer there when checked is its row's error."""
    try:
        info = os.lstat(file)
        if not stat.S_ISLNK(info.st_mode) and not paths.anywhere:
            # Not a link, in a folder reached without following one: inside, as it is.
            yield _Listed(file, file, pinned=FileId(info.st_dev, info.st_ino))
            return
        checked = paths.listed(file, folder, file)
    except LinkedOut:
        log.skip(LINKED_OUT)
        return
    except OSError as exc:
        failure = unreadable(file, exc)
        yield _Listed(file, file, refused=ItemError(failure.stage, str(failure), failure.kind))
        return
    except ItemFailure as exc:  # a dangling link
        yield _Listed(file, file, refused=ItemError(exc.stage, str(exc), exc.kind))
        return
    yield _Listed(file, file, pinned=checked.pinned)


def _pattern_folder(pattern: str) -> str:
    """The folder a pattern walks: its path up to the first part with a wildcard."""
    parts = Path(pattern).parts
    fixed = list(itertools.takewhile(lambda p: not glob.has_magic(p), parts))
    return str(Path(*fixed)) if fixed else "."


def _read_manifest(manifest: Place, policy: SourcePolicy) -> Iterator[_Listed]:
    """A manifest's rows, each path held to the rule (relative to the manifest's folder, or
    to its prefix for a manifest in storage)."""
    folder = manifest.parent.text
    for line_no, row in _manifest_rows(manifest):
        where = f"{manifest.text}:{line_no}"
        raw_path = row.get("path")
        if not isinstance(raw_path, str) or not raw_path:
            raise SourceError(f"{where}: row has no 'path' (got {row!r})")
        item_id = row.get("id", shown(raw_path))
        if not isinstance(item_id, (str, int)) or isinstance(item_id, bool) or item_id == "":
            # str() would make null "None" and an object its Python repr: not an id anyone
            # wrote, and two rows could share it.
            raise SourceError(
                f"{where}: 'id' must be a non-empty string or an integer, got {json.dumps(item_id)}"
            )
        prompt = row.get("prompt")
        kept = input_columns(row, policy.keep_columns, _MANIFEST_FIELDS)
        if prompt is not None and not isinstance(prompt, str):
            raise SourceError(f"{where}: 'prompt' must be a string, got {prompt!r}")
        if is_fetched_url(raw_path):
            # A manifest's URL is its row's matter, as a path out of its folder is.
            refused = None if policy.allow_urls else _url_refused(raw_path, where)
            yield _Listed(str(item_id), raw_path, prompt or None, kept, refused, own_id=True)
            continue
        try:
            path, pinned = policy.paths.resolve(raw_path, folder, where)
        except ItemFailure as exc:  # refused by the rule, or naming no file
            refused = ItemError(exc.stage, str(exc), exc.kind)
            yield _Listed(str(item_id), raw_path, prompt or None, kept, refused, own_id=True)
            continue
        locate(path).reachable()  # a store this machine cannot read is said now, not per row
        yield _Listed(str(item_id), path, prompt or None, kept, pinned=pinned, own_id=True)


_MANIFEST_FIELDS = frozenset({"path", "id", "prompt"})


def input_columns(
    row: Mapping[str, Any], keep: KeepColumns, own: frozenset[str] = frozenset()
) -> tuple[tuple[str, Any], ...]:
    """The columns of an input ``row`` that ``keep`` names (``"all"``: every one but the
    ``own`` ones the input is read by), as JSON values, each under its name, or
    ``input_NAME`` where mmbatch's rows have a field of that name. A named column the row
    lacks is null."""
    names = [n for n in row if n not in own] if keep == "all" else list(keep)
    return tuple(
        (f"input_{name}" if name in COLUMN_NAMES else name, json_value(row.get(name)))
        for name in names
    )


def json_value(value: Any) -> Any:
    """``value`` as JSON can hold it: containers walked, anything else as its text."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, Mapping):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    return str(value)


def _check_url(url: str, where: str, policy: SourcePolicy) -> None:
    """A URL named on the command line without ``allow_urls``: the job's mistake."""
    if not policy.allow_urls:
        raise SourceError(_url_refused(url, where).message)


def _url_refused(url: str, where: str) -> ItemError:
    refused = url_not_allowed(url, where)
    return ItemError(refused.stage, str(refused), refused.kind)


def _manifest_rows(manifest: Place) -> Iterator[tuple[int, dict[str, Any]]]:
    name = manifest.shown
    if Path(manifest.text).suffix.lower() != ".csv":
        try:
            yield from manifest.lines()
        except JsonlError as exc:
            raise SourceError(str(exc)) from None
        return
    with manifest.open() as handle:
        reader = csv.DictReader(_text_lines(handle, name))
        try:
            for row in reader:
                yield reader.line_num, {k: v for k, v in row.items() if v not in (None, "")}
        except csv.Error as exc:
            raise SourceError(f"{manifest.text}:{reader.line_num}: not valid CSV ({exc})") from None


def _text_lines(lines: Iterable[bytes], manifest: str) -> Iterator[str]:
    """The lines of a CSV manifest as text: UTF-8, without the byte-order mark Excel puts
    first (else it would be part of the first column's name); a line that is not UTF-8 is a
    ``SourceError`` naming it."""
    for line_no, line in enumerate(lines, start=1):
        try:
            yield line.decode("utf-8-sig" if line_no == 1 else "utf-8")
        except UnicodeDecodeError as exc:
            raise SourceError(
                f"{manifest}:{line_no}: not UTF-8 text (byte 0x{line[exc.start]:02x} at column "
                f"{exc.start + 1}); save the manifest as UTF-8"
            ) from None
