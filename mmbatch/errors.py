"""The exception tree, drawn once::

    MmbatchError
    ├── ConfigError          bad settings, arguments or model directory: fix and rerun
    ├── SourceError          the inputs cannot be listed (missing path, malformed manifest)
    ├── OutputError          the output cannot be written (read-only folder, full disk)
    ├── StorageError         object storage refused the job (no bucket, no credentials, denied)
    ├── ItemFailure          one item cannot be processed; becomes an error row, the job goes on
    │   ├── MediaError       unreadable, corrupt or unsupported media (stage "load"/"decode")
    │   └── RequestRejected  the engine refused this one request (stage "validate")
    └── FatalEngineError     the engine itself is gone: stop the job loudly, progress saved
        ├── DecodersFailed       the decode worker processes cannot run here
        └── StorageUnavailable   the object store cannot be reached (after retries)

Only ``ItemFailure`` is ever turned into data; everything else propagates. Each item failure
carries a ``kind`` (see ``mmbatch.types.FailureKind``) besides its stage, so that the summary
and the quarantine file can say *what* went wrong across thousands of rows at a glance.
"""

from __future__ import annotations

from mmbatch.types import FailureKind, Stage


class MmbatchError(Exception):
    """Base of every error mmbatch raises on purpose."""


class ConfigError(MmbatchError):
    """Settings that cannot work; raised before any item is processed."""


class SourceError(MmbatchError):
    """The job's inputs cannot be enumerated."""


class OutputError(MmbatchError):
    """A file of the job's output cannot be written; the rows already written are kept, and
    the same command resumes once the cause (permissions, space) is fixed."""


class StorageError(MmbatchError):
    """Object storage refused what the job asked of it as a whole: a bucket or prefix that
    does not exist, no credentials, access denied, no file system for the URL's protocol.
    One item's object that cannot be read is that item's ``MediaError`` instead."""


class ItemFailure(MmbatchError):
    """One item failed; the pipeline records it as an error row and carries on."""

    stage: Stage = "load"
    kind: FailureKind = "other"


class MediaError(ItemFailure):
    """Media that cannot be read or decoded."""

    def __init__(
        self, message: str, stage: Stage = "decode", kind: FailureKind = "corrupt"
    ) -> None:
        super().__init__(message)
        self.stage = stage
        self.kind = kind


class RequestRejected(ItemFailure):
    """The engine refused one request (too long, malformed media) without harm to others."""

    stage: Stage = "validate"
    kind: FailureKind = "rejected"

    def __init__(self, message: str, kind: FailureKind = "rejected") -> None:
        super().__init__(message)
        self.kind = kind


class FatalEngineError(MmbatchError):
    """The engine, or the decode workers that feed it, cannot go on; the job stops and says
    how to resume."""


class DecodersFailed(FatalEngineError):
    """The decode worker processes cannot run here. The engine itself is well: what it holds
    of the job is aborted rather than left to finish for nobody (a shared engine serves the
    next caller)."""


class StorageUnavailable(FatalEngineError):
    """The object store the job reads or writes cannot be reached, after retries (its server
    stopped, the network gone). The engine itself is well; the job stops, its rows saved, and
    the same command resumes once the store is back."""
