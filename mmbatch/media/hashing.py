"""Content keys for media: xxh3-128 over the source bytes *and* the decode options.

vLLM uses the keys we pass as ``multi_modal_uuids`` instead of hashing pixels itself, and
trusts them blindly: a key shared by two different decodings would silently reuse the wrong
encoder output and caption the wrong picture. So the key covers everything that changes the
decoded payload (modality, options, bytes), with each field length-prefixed so that no
concatenation of two inputs can equal another.
"""

from __future__ import annotations

import xxhash

from mmbatch.types import Modality


def media_key(modality: Modality, data: bytes | memoryview, options_token: str) -> str:
    """The key of ``data`` decoded as ``modality`` with the options in ``options_token``."""
    h = xxhash.xxh3_128()
    for part in (modality.encode(), options_token.encode(), data):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return f"{modality}-{h.hexdigest()}"
