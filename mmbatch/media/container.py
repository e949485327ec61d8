"""Opening a media file with PyAV, with its failures turned into ``MediaError``s.

Shared by the video and audio decoders so that a missing file, a file FFmpeg cannot parse
and a truncated container read the same way in every error row.
"""

from __future__ import annotations

import os
from typing import Any

from mmbatch.errors import MediaError
from mmbatch.media.fetch import check_regular, open_regular
from mmbatch.types import FileId

_decoder_threads = 0
"""FFmpeg threads per decoder in this process; 0 leaves the count to FFmpeg (one per core)."""


def set_decoder_threads(count: int) -> None:
    """Decode on ``count`` FFmpeg threads per stream in this process (0: one per core).

    A decode pool's workers take 1: the pool's processes are the parallelism, and each
    decoder's own thread per core only multiplies threads past the cores (8 workers of 16
    threads on a 16-core GPU host), which takes the CPU from vLLM's engine-core loop, the
    bound of a saturated engine, and costs more CPU per frame (a 16-frame H.264 stretch:
    0.30 CPU s on 16 threads against 0.20 s on one, on two cores). A lone decoder keeps
    FFmpeg's count, as PyTorch's DataLoader workers run torch on one thread each."""
    global _decoder_threads
    _decoder_threads = count


def threaded(stream: Any) -> Any:
    """``stream`` set to decode on this process's FFmpeg threads (frame or slice threads,
    whichever the codec allows)."""
    stream.thread_type = "AUTO"
    if _decoder_threads:
        stream.thread_count = _decoder_threads
    return stream


def open_media(path: str, pinned: FileId | None = None) -> Any:
    """``av.open(path)`` for reading; ``MediaError`` (stage load/decode) if that fails. Only
    a regular file is opened (``check_regular``): FFmpeg would block on a FIFO for ever.

    A ``pinned`` path is opened here and checked on its descriptor (``open_regular``), and
    FFmpeg opens that descriptor's file through ``/proc/self/fd``, never the path again: a
    symlink swapped in between cannot lead it elsewhere."""
    if pinned is None:
        check_regular(path)
        return _av_open(path, path)
    with open_regular(path, pinned) as handle:
        return _av_open(path, f"{_FD_FOLDER}/{handle.fileno()}")


_FD_FOLDER = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"
"""Where a process's open descriptors have names that open their files again."""


def _av_open(path: str, opened: str) -> Any:
    import av

    try:
        return av.open(opened)
    except FileNotFoundError:
        raise MediaError(f"{path!r} does not exist", stage="load", kind="unreadable") from None
    except av_errors() as exc:
        raise MediaError(
            f"not a media file PyAV can open: {av_reason(exc)}", kind="not_media"
        ) from None


def av_errors() -> tuple[type[Exception], ...]:
    """What PyAV raises for bad data: its ``FFmpegError`` family (some of which are
    ``ValueError``s, not ``OSError``s) and plain ``OSError``s from reading the file."""
    import av

    return (av.error.FFmpegError, OSError)


def av_reason(exc: BaseException) -> str:
    """The readable part of a PyAV error (its FFmpeg message, without the errno noise)."""
    return str(getattr(exc, "strerror", None) or exc)


def stream_kinds(container: Any) -> str:
    """The kinds of stream a container holds, for 'no video stream (streams: audio)'."""
    return ", ".join(sorted({s.type for s in container.streams})) or "none"
