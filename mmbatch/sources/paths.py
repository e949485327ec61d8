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

The check is made when the inputs are listed; a symlink swapped for another between then and
the read is not caught (that needs write access to the input's folder while the job runs).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from mmbatch.errors import ItemFailure

CLI_OPTION = "--input-root DIR"


class PathNotAllowed(ItemFailure):
    """A path named inside an input that leads outside where the input may point."""

    stage = "source"
    kind = "not_allowed"


@dataclass(frozen=True)
class LocalPaths:
    """Where the local paths named inside inputs may lead, besides each input's folder."""

    roots: tuple[str, ...] = ()
    """Further folders the person running the job allowed."""
    anywhere: bool = False
    """No rule at all (``--allow-outside-root``)."""
    widen: str = CLI_OPTION
    """How the person running the job allows another folder, as the refusal says it."""

    def record(self) -> dict[str, Any]:
        """This rule as a job's summary records it, to be read back by ``recorded``."""
        return {"input_roots": [os.path.realpath(r) for r in self.roots]} | (
            {"allow_outside_root": True} if self.anywhere else {}
        )

    @classmethod
    def recorded(cls, job: Mapping[str, Any]) -> LocalPaths:
        """The rule a job ran under, from its summary's ``job`` record (``record``)."""
        roots = job.get("input_roots")
        roots = tuple(str(r) for r in roots) if isinstance(roots, list) else ()
        return cls(roots, job.get("allow_outside_root") is True)

    def resolve(self, named: str, folder: str | None, where: str) -> str:
        """The path ``named`` names (relative to ``folder``, the input's own folder, or to
        the working directory where the input has none), if this rule lets it be read;
        else ``PathNotAllowed`` saying why. ``where`` names the row or line in the message."""
        path = _local(named, where)
        if folder is not None:
            path = str(Path(folder, path))  # an absolute path stays itself
        if self.anywhere:
            return path
        real = os.path.realpath(path)
        allowed = ([folder] if folder is not None else []) + list(self.roots)
        if any(is_inside(real, os.path.realpath(root)) for root in allowed):
            return path
        own = f"the input's folder {os.path.realpath(folder)}" if folder is not None else ""
        extra = f"the allowed folders {', '.join(self.roots)}" if self.roots else ""
        inside = " or ".join(filter(None, (own, extra))) or "an allowed folder (none given)"
        raise PathNotAllowed(
            f"{where}: {named!r} leads to {real}, outside {inside}; a path named inside an "
            f"input must stay inside its folder (allow another folder with {self.widen})"
        )


def is_inside(path: str, root: str) -> bool:
    """Whether the resolved ``path`` is ``root`` or lies below it, by whole path components
    (``/data2/x`` is not inside ``/data``)."""
    try:
        return os.path.commonpath([path, root]) == root
    except ValueError:  # one relative, one absolute (or on different drives)
        return False


def _local(named: str, where: str) -> str:
    """``named`` as a file-system path: a ``file://`` URL is the path it names."""
    if named[:7].lower() != "file://":
        return named
    parts = urlsplit(named)
    if parts.netloc not in ("", "localhost"):
        raise PathNotAllowed(f"{where}: {named!r} names a file on another host")
    return unquote(parts.path)
