"""Content keys for media: xxh3-128 over the source bytes *and* the decode options.

vLLM uses the keys we pass as ``multi_modal_uuids`` instead of hashing pixels itself, and
trusts them blindly: a key shared by two different decodings would silently reuse the wrong
encoder output and caption the wrong picture. So the key covers everything that changes the
decoded payload (modality, options, bytes), with each field length-prefixed so that no
concatenation of two inputs can equal another.
"""

from __future__ import annotations

import xxhash

from mmbatch.media.fetch import open_regular
from mmbatch.types import FileId, Modality


def media_key(modality: Modality, data: bytes | memoryview, options_token: str) -> str:
    """The key of ``data`` decoded as ``modality`` with the options in ``options_token``."""
    h = xxhash.xxh3_128()
    for part in (modality.encode(), options_token.encode(), data):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return f"{modality}-{h.hexdigest()}"


CHUNK_BYTES = 8 * 1024 * 1024


def file_digest(path: str, pinned: FileId | None = None) -> tuple[bytes, int]:
    """The xxh3-128 digest of the file at ``path`` and its size, read in chunks.

    Videos and long audio are keyed by this digest instead of being held in memory whole:
    an hour of video is gigabytes, while xxh3 streams it at memory speed; a model's files
    are known by it too (``mmbatch.engine.identity``). Raises
    ``MediaError`` for a path that is not a regular file (``open_regular``), ``OSError`` for
    a failed read. ``pinned``: the file ``path`` must be (``open_regular``).
    """
    h = xxhash.xxh3_128()
    size = 0
    with open_regular(path, pinned) as handle:
        while chunk := handle.read(CHUNK_BYTES):
            h.update(chunk)
            size += len(chunk)
    return h.digest(), size
