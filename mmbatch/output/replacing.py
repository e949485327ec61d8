"""``--overwrite``: a new job that replaces an output only once it has finished.

The new job is an ordinary output of its own, a draft beside the old one, in the hidden
folder ``.OUT.overwrite/`` (``draft_of``). It resumes like any output: a draft interrupted
(Ctrl-C, a kill, a dead engine) is taken up again by the same command, and a draft of
another job (the settings changed again meanwhile) is started afresh. The old output is not
touched until the draft's summary is written; then its files replace the old ones
(``commit``). That takes a few renames, so the draft first lists the files it holds in a
marker (``REPLACING``): a run killed among the renames is finished by the next run on that
``--out`` (``finish_replacing``), whichever command it is, before it reads anything, so an
output is never half old and half new.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mmbatch.errors import ConfigError
from mmbatch.jsonl import write_text_atomic
from mmbatch.output.paths import OutputPaths
from mmbatch.output.resume import check_same_job

MARKER = "REPLACING"
"""In a draft whose job has finished: the names of the files that replace the old ones."""


def draft_of(final: Path) -> Path:
    """Where the job that replaces ``final`` writes its rows: ``.OUT.overwrite/OUT``."""
    return final.parent / f".{final.name}.overwrite" / final.name


def prepare_draft(draft: OutputPaths, final: OutputPaths, fingerprint: Mapping[str, Any]) -> None:
    """Make ``draft`` ready for the job of ``fingerprint`` to replace ``final``: refused
    (``ConfigError``, nothing changed) where ``final`` is not an mmbatch job's output; a
    draft another job left is removed (it replaced nothing yet); this job's is resumed."""
    folder = draft.rows.parent
    if _exists(final.rows) and not final.record.exists():
        raise ConfigError(
            f"{final.rows} has no job record ({final.record.name}), so it is not known to be "
            "an mmbatch job's output; --overwrite leaves it alone: name another --out"
        )
    if folder.exists() and not _this_jobs(draft, fingerprint):
        shutil.rmtree(folder)
    folder.mkdir(exist_ok=True)


def commit(draft: OutputPaths, final: OutputPaths) -> None:
    """Put the finished ``draft`` in the place of ``final``: its files replace the old ones,
    and the old files it has no counterpart of (a quarantine file, a spool) go."""
    held = [name for name, path in _files(draft).items() if _exists(path)]
    write_text_atomic(draft.rows.parent / MARKER, json.dumps(held) + "\n")
    _move(draft, final, held)


def finish_replacing(final: OutputPaths) -> None:
    """Finish a replacement that a kill interrupted among its renames (``commit``); nothing
    when there is none."""
    draft = OutputPaths(draft_of(final.rows), final.format, final.row_folder)
    marker = draft.rows.parent / MARKER
    try:
        held = json.loads(marker.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return
    except ValueError:  # killed while the marker was written: the old output still stands
        shutil.rmtree(marker.parent)
        return
    _move(draft, final, [str(name) for name in held])


def _move(draft: OutputPaths, final: OutputPaths, held: list[str]) -> None:
    """Each file of ``held`` from ``draft`` into ``final``'s place (one moved already is
    passed over), every other file of ``final`` removed, then the draft's folder."""
    olds = _files(final)
    for name, new in _files(draft).items():
        old = olds[name]
        if name not in held:
            _remove(old)
        elif _exists(new):
            if old.is_dir() and not old.is_symlink():
                _remove(old)  # a folder cannot be renamed over a folder that holds files
            os.replace(new, old)
    shutil.rmtree(draft.rows.parent)


def _files(paths: OutputPaths) -> dict[str, Path]:
    """The files of an output that a replacement moves, by role."""
    return {
        "rows": paths.rows,
        "record": paths.record,
        "summary": paths.summary,
        "quarantine": paths.quarantine,
        "spool": paths.spool,
    }


def _this_jobs(draft: OutputPaths, fingerprint: Mapping[str, Any]) -> bool:
    try:
        check_same_job(draft.rows, draft.record, fingerprint)
    except ConfigError:
        return False
    return True


def _exists(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif _exists(path):
        path.unlink()
