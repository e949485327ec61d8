"""Opening a media file with PyAV, with its failures turned into ``MediaError``s.

Shared by the video and audio decoders so that a missing file, a file FFmpeg cannot parse
and a truncated container read the same way in every error row.
"""

from __future__ import annotations

from typing import Any

from mmbatch.errors import MediaError
from mmbatch.media.fetch import check_regular


def open_media(path: str) -> Any:
    """``av.open(path)`` for reading; ``MediaError`` (stage load/decode) if that fails. Only
    a regular file is opened (``check_regular``): FFmpeg would block on a FIFO for ever."""
    import av

    check_regular(path)
    try:
        return av.open(path)
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
