"""A glance at the inputs a job names, before they are listed: how many media files they
come to, and of which kinds, from names alone.

A job's engine begins its start before the inputs are read (``mmbatch.engine.early``), sized
for the media a prompt carries and laid out for the job's size; both are guessed here, for
the price of ``os.scandir`` over the named folders: no file opened, no manifest read. The
count is the files whose suffix names media (the listing may still pass some over: a link
leading out of the folder, a file that is not what its name says); the kinds are those the
suffixes name. Listing the inputs stays the one judge of what they hold: a glance that saw
wrong costs an engine's restart, or a layout for another size, never a row.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from mmbatch.sources.files import MANIFEST_SUFFIXES
from mmbatch.sources.mixed_media import MEDIA_SUFFIXES, modality_of
from mmbatch.types import Modality

PATTERN_CHARACTERS = frozenset("*?[")
MOST_NAMES = 100_000
"""The most names a glance reads in the folders named before it stops counting."""


@dataclass(frozen=True)
class Glance:
    """What a glance at the named inputs saw."""

    counts: Mapping[Modality, int]
    """The media files seen, by the kind their suffix names."""
    complete: bool
    """Whether they are all the inputs come to (not so for a manifest, a pattern, storage,
    a name that cannot be read, folders too large to count)."""
    absent: bool = False
    """A path named is not there: the listing refuses the job, which needs no engine."""

    @property
    def kinds(self) -> frozenset[Modality]:
        """The kinds of media seen."""
        return frozenset(self.counts)

    def files(self, kinds: Collection[Modality]) -> int | None:
        """How many files of ``kinds`` the inputs come to; None: not known without listing
        them, or none seen (the listing says what they hold)."""
        found = sum(self.counts.get(kind, 0) for kind in kinds)
        return found if self.complete and found else None


def glance_at(inputs: Sequence[str]) -> Glance:
    """The media files of ``inputs`` as their names tell, without listing them."""
    counts: Counter[Modality] = Counter()
    complete, absent = True, False
    for raw in inputs:
        absent = absent or _absent(raw)
        found = _names(raw)
        if found is None:
            complete = False
            continue
        names, whole = found
        counts.update(modality_of(name) for name in names if _suffix(name) in MEDIA_SUFFIXES)
        complete = complete and whole
    return Glance(dict(counts), complete, absent)


def _absent(raw: str) -> bool:
    """``raw`` names a local path (no storage URL, no pattern) that is not there."""
    return "://" not in raw and not PATTERN_CHARACTERS & set(raw) and not os.path.lexists(raw)


def _names(raw: str) -> tuple[list[str], bool] | None:
    """The file names ``raw`` comes to at a glance, and whether they are all of them (a
    folder of more than ``MOST_NAMES`` is not counted: a job that large is laid out as one
    of unknown size); None where only listing tells. A folder is walked as the listing
    walks it: hidden names and linked folders passed over."""
    if "://" in raw or PATTERN_CHARACTERS & set(raw) or _suffix(raw) in MANIFEST_SUFFIXES:
        return None
    try:
        if not os.path.isdir(raw):
            return ([raw], True) if os.path.isfile(raw) else None
        names: list[str] = []
        folders = [raw]
        while folders and len(names) <= MOST_NAMES:
            with os.scandir(folders.pop()) as entries:
                for entry in entries:
                    if entry.name.startswith("."):
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        folders.append(entry.path)
                    elif entry.is_file():
                        names.append(entry.name)
        return names, not folders and len(names) <= MOST_NAMES
    except OSError:
        return None


def _suffix(name: str) -> str:
    return os.path.splitext(name)[1].lower()
