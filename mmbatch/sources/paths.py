"""The one rule for local paths named inside an input: they stay inside the input's folder.

An input file or dataset (a manifest, an OpenAI batch file, a local dataset's path column)
is data from elsewhere, so a path written inside it is not trusted with the file system:
``/home/me/.ssh/id_rsa``, ``../../secret.jpg`` or ``file:///etc/hostname`` would otherwise be
read and handed to the model. Whatever the input kind, a path named inside it must resolve
(relative to the input's folder, ``..`` collapsed, symlinks followed, a ``file://`` URL read
as the path it names) inside

* the folder of that input: the folder holding the manifest or the batch file, a local
  dataset's own folder (the folder of a Parquet or tar file named alone); or
* a folder the person running the job allowed: ``--input-root DIR`` (repeatable), or
  ``LocalPaths(roots=...)`` in Python; ``--allow-outside-root`` lifts the rule.

A path refused is that item's error row (stage ``source``, kind ``not_allowed``) naming the
path, where it leads, the rule and the option that widens it; the job goes on. Paths named
on the command line (or in a Python call) are the person's own choice and are not checked.

A ``DatasetMap`` over a dataset from the Hub or from memory has no folder of its own: its
path cells are read only inside the folders its caller allows (``allowed_paths``). Cells
that hold their bytes are not paths and are always taken.

A folder walk (a folder named on the command line) holds its files to the same rule, the
walked folder being their input's folder (``LocalPaths.listed``): a file symlink in it that
leads out of it is passed over (counted in the summary), unless ``--input-root`` or
``--allow-outside-root`` allows where it leads. Linked folders are not walked at all. The
files that datasets' folder builders list (an ``imagefolder``'s path cells) follow the same
rule: a link among them that leads out of the folder listed is its row's error, for the
same reason.

The check is made when the inputs are listed, and the read opens what was checked: the path
is pinned to the file it led to then (its device and inode, ``FileId``), and the reader
compares the file it opened with the pin before reading a byte. A symlink swapped in
between (by someone who can write to the input's folder while the job runs) makes that
item's error row, and the file it leads to is not read. A path that leads nowhere when it
is checked is its row's error then, so that nothing put there later is read either. A path
that cannot name a file (one holding a NUL byte, or a lone surrogate that stands for no byte)
is its row's error too.

Storage URLs (``s3://``, ``gs://``, ``hf://``: ``mmbatch.storage.urls``) follow the same rule.
An input in storage (a manifest, a batch file, a dataset under ``s3://bucket/data/``) has a
prefix for a folder: a relative path written inside it is joined to that prefix, and a URL
it names must lie under the prefix (``..`` collapsed, by whole components), or under a
prefix the person running the job allowed (``--input-root s3://bucket/other``), or anywhere
with ``--allow-outside-root``. A local path named inside an input in storage, or a URL named
inside a local one, leads out of the input's folder by definition and needs the same
widening. Objects have no links to swap, so a URL is not pinned.

A URL of any other protocol (``ftp://``, ``zip://``, ``github://``, ...: the allow-list is
``mmbatch.storage.urls.PROTOCOLS``) is refused wherever it is named inside an input, before
the rule is asked (stage ``source``, kind ``unsupported``); an allowed folder must be a
local folder or a storage prefix (``ConfigError``).

An http(s) URL named inside an input is fetched only where the person running the job
allowed it (``--allow-urls``, which bounds each download in size and time:
``mmbatch.media.fetch``); otherwise it is its item's error (``url_not_allowed``), as a path
out of the input's folder is.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import unquote, urlsplit

from mmbatch.errors import ConfigError, ItemFailure
from mmbatch.media.fetch import is_fetched_url as is_fetched_url  # the rule's URL half
from mmbatch.storage.urls import is_inside as url_is_inside
from mmbatch.storage.urls import (
    is_storage_url,
    join,
    normalised,
    scheme,
    shown,
    unsupported,
    unsupported_folder,
)
from mmbatch.types import FileId, MediaRef, Modality

CLI_OPTION = "--input-root DIR"
LINKED_OUT_FILES = "linked files leading out of the folder"
"""Why a file that listing a folder found is not read: a link that leads out of it."""


class PathNotAllowed(ItemFailure):
    """A path named inside an input that leads outside where the input may point."""

    stage = "source"
    kind = "not_allowed"


def url_not_allowed(url: str, where: str) -> PathNotAllowed:
    """A URL named inside an input of a job that does not fetch URLs: that item's error."""
    return PathNotAllowed(
        f"{where}: {shown(url)!r} is a URL; URLs are fetched only with --allow-urls "
        "(which bounds each download in size and time)"
    )


class LinkedOut(PathNotAllowed):
    """A file found by listing a folder that is a link leading out of that folder."""


class UnusablePath(ItemFailure):
    """A path that cannot name a file at all (a NUL byte in it)."""

    stage = "source"
    kind = "unreadable"


class UnsupportedUrl(ItemFailure):
    """A URL of a protocol mmbatch does not take (``mmbatch.storage.urls.PROTOCOLS``)."""

    stage = "source"
    kind = "unsupported"


class Checked(NamedTuple):
    """A path the rule let through, and the file it led to then (None: no rule applied)."""

    path: str
    pinned: FileId | None

    def ref(self, modality: Modality) -> MediaRef:
        """The media this path names, pinned to the file checked."""
        return MediaRef(modality, self.path, pinned=self.pinned)


@dataclass(frozen=True)
class LocalPaths:
    """Where the local paths named inside inputs may lead, besides each input's folder."""

    roots: tuple[str, ...] = ()
    """Further folders (or storage prefixes) the person running the job allowed."""
    anywhere: bool = False
    """No rule at all (``--allow-outside-root``)."""
    widen: str = CLI_OPTION
    """How the person running the job allows another folder, as the refusal says it."""
    listing: bool = False
    """The paths are files that listing the input's folder found (datasets' folder
    builders), held to a walk's rule (``listed``) rather than named inside an input."""

    def __post_init__(self) -> None:
        for root in self.roots:
            refusal = unsupported_folder(root)
            if refusal is not None:
                raise ConfigError(f"{self.widen}: {refusal}")

    def record(self) -> dict[str, Any]:
        """This rule as a job's summary records it, to be read back by ``recorded``."""
        roots = [r if is_storage_url(r) else os.path.realpath(r) for r in self.roots]
        return {"input_roots": roots} | ({"allow_outside_root": True} if self.anywhere else {})

    @classmethod
    def recorded(cls, job: Mapping[str, Any]) -> LocalPaths:
        """The rule a job ran under, from its summary's ``job`` record (``record``)."""
        roots = job.get("input_roots")
        roots = tuple(str(r) for r in roots) if isinstance(roots, list) else ()
        return cls(roots, job.get("allow_outside_root") is True)

    def resolve(self, named: str, folder: str | None, where: str) -> Checked:
        """The path ``named`` names (relative to ``folder``, the input's own folder, or to
        the working directory where the input has none), if this rule lets it be read,
        pinned to the file it leads to; else an ``ItemFailure`` saying why
        (``PathNotAllowed``, ``UnusablePath``, ``MediaError`` for a path that leads to no
        file). ``where`` names the row or line in the message. ``folder`` may be a storage
        prefix and ``named`` a storage URL: the rule for URLs (``resolve_url``). A URL of a
        protocol that is not taken is refused first (``UnsupportedUrl``), wherever it
        would lead."""
        refusal = unsupported(named)
        if refusal is not None:
            raise UnsupportedUrl(f"{where}: {refusal}")
        if is_storage_url(named) or (folder is not None and is_storage_url(folder)):
            return self.resolve_url(named, folder, where)
        path = _local(named, where)
        if folder is not None:
            path = str(Path(folder, path))  # an absolute path stays itself
        if self.listing:
            return self.listed(path, folder or os.path.dirname(path), where)
        return self.check(path, folder, named, where)

    def listed(self, file: str, folder: str, where: str) -> Checked:
        """``file``, which listing ``folder`` found (a walk, a pattern, a datasets folder
        builder), if this rule lets it be read: where it leads (links followed) must be
        inside ``folder`` or an allowed folder. A link out of it is ``LinkedOut``, which a
        walk counts as passed over and a dataset's row carries as its error."""
        try:
            return self.check(file, folder, file, where)
        except PathNotAllowed:
            real = os.path.realpath(file)
            raise LinkedOut(
                f"{where}: {file!r} leads to {real}, out of the folder {os.path.realpath(folder)}"
                f" that was listed; {LINKED_OUT_FILES} are not read (allow where it leads with "
                f"{self.widen})"
            ) from None

    def check(self, path: str, folder: str | None, named: str, where: str) -> Checked:
        """``resolve`` for ``path``, already joined to its input's ``folder`` (a walked
        file's); ``named`` is how the input wrote it."""
        if self.anywhere:
            return Checked(path, None)
        real = os.path.realpath(path)
        local_roots = [root for root in self.roots if not is_storage_url(root)]
        allowed = ([folder] if folder is not None else []) + local_roots
        if any(is_inside(real, os.path.realpath(root)) for root in allowed):
            return Checked(path, file_id(real, path))
        own = f"the input's folder {os.path.realpath(folder)}" if folder is not None else ""
        extra = f"the allowed folders {', '.join(local_roots)}" if local_roots else ""
        inside = " or ".join(filter(None, (own, extra))) or "an allowed folder (none given)"
        raise PathNotAllowed(
            f"{where}: {named!r} leads to {real}, outside {inside}; a path named inside an "
            f"input must stay inside its folder (allow another folder with {self.widen})"
        )

    def resolve_url(self, named: str, folder: str | None, where: str) -> Checked:
        """``resolve`` where a storage URL takes part: ``named`` is one, or the input's
        ``folder`` is a storage prefix. A URL (or a path joined to the prefix) must lie
        under that prefix or an allowed one; a local path named inside an input in storage
        under an allowed local folder."""
        in_storage = folder is not None and is_storage_url(folder)
        if in_storage and not is_storage_url(named):
            if scheme(named) is not None or named.startswith("/"):
                # A local path (or a file:// URL) in an input kept in storage: never inside
                # its folder, and read only where the local rule allows it.
                return self.check(_local(named, where), None, named, where)
            named_url = _joined(str(folder), named, where)
        else:
            named_url = _normalised(named, where)
        if self.anywhere:
            return Checked(named_url, None)
        own = [str(folder)] if in_storage else []
        others = [root for root in self.roots if is_storage_url(root)]
        if any(url_is_inside(named_url, root) for root in own + others):
            return Checked(named_url, None)
        said = [f"the input's prefix {shown(own[0])}"] if own else []
        said += [f"the allowed prefixes {', '.join(map(shown, others))}"] if others else []
        raise PathNotAllowed(
            f"{where}: {shown(named)!r} leads to {shown(named_url)}, outside "
            f"{' or '.join(said) or 'an allowed prefix (none given)'}; a URL named inside an "
            "input must stay under its prefix (allow another with --input-root URL, or any "
            "with --allow-outside-root)"
        )


def _joined(folder: str, named: str, where: str) -> str:
    try:
        return join(folder, named)
    except ValueError as exc:
        raise PathNotAllowed(f"{where}: {named!r}: {exc}") from None


def _normalised(url: str, where: str) -> str:
    try:
        return normalised(url)
    except ValueError as exc:
        raise PathNotAllowed(f"{where}: {exc}") from None


def is_inside(path: str, root: str) -> bool:
    """Whether the resolved ``path`` is ``root`` or lies below it, by whole path components
    (``/data2/x`` is not inside ``/data``)."""
    try:
        return os.path.commonpath([path, root]) == root
    except ValueError:  # one relative, one absolute (or on different drives)
        return False


def file_id(path: str, shown: str | None = None) -> FileId:
    """The file ``path`` leads to now; ``MediaError`` (stage "load") naming it as ``shown``
    when it leads nowhere."""
    from mmbatch.media.fetch import unreadable

    try:
        info = os.stat(path)
    except OSError as exc:
        raise unreadable(shown or path, exc) from None
    return FileId(info.st_dev, info.st_ino)


def _local(named: str, where: str) -> str:
    """``named`` as a file-system path: a ``file://`` URL is the path it names."""
    path = named
    if named[:7].lower() == "file://":
        parts = urlsplit(named)
        if parts.netloc not in ("", "localhost"):
            raise PathNotAllowed(f"{where}: {named!r} names a file on another host")
        path = unquote(parts.path)
    if "\0" in path:
        raise UnusablePath(f"{where}: {named!r} holds a NUL byte, which no file name can")
    try:
        os.fsencode(path)
    except UnicodeEncodeError:  # a lone surrogate that stands for no byte ("\ud800")
        raise UnusablePath(
            f"{where}: {named!r} holds a character that no file name can (a lone surrogate)"
        ) from None
    return path
