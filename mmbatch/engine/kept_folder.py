"""Where kept engines live, and who may reach them: one owner-only folder of this user's.

A kept engine (``mmbatch engine start``) listens on a Unix socket, never a network port, so
that only its user can reach it: the socket is made owner-only (0600) in a folder that is
owner-only (0700) and owned by this user, and each connection proves it holds the secret
in an owner-only key file beside it (``multiprocessing.connection``'s authkey). A folder
that another user owns, or that others may read or enter, is refused rather than trusted:
whoever controls the folder could put a socket of theirs where a job looks for its engine.

Each engine ``NAME`` has four files there: ``NAME.sock`` (the socket), ``NAME.key`` (the
secret), ``NAME.json`` (what ``mmbatch engine list`` shows: model, pid, start time, layout)
and ``NAME.log`` (vLLM's log and the server's own).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmbatch.errors import ConfigError

FOLDER_ENV = "MMBATCH_ENGINES_DIR"
"""Where kept engines live, if set (else ``$XDG_RUNTIME_DIR/mmbatch/engines``, else
``~/.cache/mmbatch/engines``)."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def engines_folder(create: bool = True) -> Path:
    """The owner-only folder kept engines live in, made (0700) if ``create`` and missing,
    checked either way (``check_private_folder``)."""
    chosen = os.environ.get(FOLDER_ENV)
    if chosen:
        folder = Path(chosen)
    elif os.environ.get("XDG_RUNTIME_DIR"):
        folder = Path(os.environ["XDG_RUNTIME_DIR"]) / "mmbatch" / "engines"
    else:
        folder = Path.home() / ".cache" / "mmbatch" / "engines"
    if create and not folder.exists():
        folder.parent.mkdir(parents=True, exist_ok=True)
        with suppress(FileExistsError):  # made meanwhile: checked below like any other
            folder.mkdir(mode=0o700)
    if folder.exists():
        check_private_folder(folder)
    return folder


def check_private_folder(folder: Path) -> None:
    """``ConfigError`` unless ``folder`` is a real folder (not a link), owned by this user,
    that no one else may read, write or enter (mode 0700 or stricter)."""
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"the engines folder {folder} is not a folder")
    if info.st_uid != os.geteuid():
        raise ConfigError(
            f"the engines folder {folder} belongs to another user (uid {info.st_uid}); "
            "a kept engine lives only in a folder of your own"
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        raise ConfigError(
            f"the engines folder {folder} has mode {mode:04o}: others may reach it; "
            f"make it owner-only (chmod 700 {folder})"
        )


def check_name(name: str) -> str:
    """``name``, if it can name an engine (letters, digits, ``.``, ``_``, ``-``)."""
    if not _NAME.fullmatch(name):
        raise ConfigError(
            f"engine name {name!r}: use letters, digits, '.', '_' and '-' (at most 64)"
        )
    return name


@dataclass(frozen=True)
class EngineFiles:
    """The files of the kept engine ``name`` in ``folder``."""

    folder: Path
    name: str

    @classmethod
    def of(cls, name: str, create: bool = False) -> EngineFiles:
        return cls(engines_folder(create), check_name(name))

    @property
    def socket(self) -> Path:
        return self.folder / f"{self.name}.sock"

    @property
    def key(self) -> Path:
        return self.folder / f"{self.name}.key"

    @property
    def info(self) -> Path:
        return self.folder / f"{self.name}.json"

    @property
    def log(self) -> Path:
        return self.folder / f"{self.name}.log"

    def new_key(self) -> bytes:
        """A fresh secret, written owner-only (refused if the file exists: never another's)."""
        secret = secrets.token_bytes(32)
        fd = os.open(self.key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as file:
            file.write(secret)
        return secret

    def read_key(self) -> bytes:
        info = os.lstat(self.key)
        if info.st_uid != os.geteuid() or stat.S_IMODE(info.st_mode) & 0o077:
            raise ConfigError(f"the key of engine {self.name!r} ({self.key}) is not owner-only")
        return self.key.read_bytes()

    def read_info(self) -> dict[str, Any] | None:
        """What the engine wrote of itself; None if it has not (yet)."""
        try:
            loaded = json.loads(self.info.read_text())
        except (OSError, ValueError):
            return None
        return loaded if isinstance(loaded, dict) else None

    def write_info(self, info: dict[str, Any]) -> None:
        partial = self.info.with_suffix(".json.part")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as file:
            json.dump(info, file)
        partial.replace(self.info)

    def remove(self) -> None:
        """Its socket, key and record gone (the log stays, for what it says)."""
        for path in (self.socket, self.key, self.info):
            path.unlink(missing_ok=True)


def kept_engines() -> list[EngineFiles]:
    """The kept engines that have a record in the folder, by name."""
    folder = engines_folder(create=False)
    if not folder.exists():
        return []
    return [EngineFiles(folder, path.stem) for path in sorted(folder.glob("*.json"))]
