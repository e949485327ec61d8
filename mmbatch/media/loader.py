"""Read, hash and decode the media of a window of requests.

The bytes of each source are read once and hashed once; each distinct key is decoded once
(through the store) no matter how many requests or file names share it. Failures become
error ``Result``s for exactly the requests that use the failing media.

Media already in memory (``MediaRef.data`` bytes, or an already decoded ``MediaRef.image``)
take the same path minus the file read: hashed once, decoded (or, for a decoded picture,
prepared) once per distinct key.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from mmbatch.config import ImageOptions
from mmbatch.errors import ItemFailure, MediaError
from mmbatch.media.fetch import UrlPolicy, read_source
from mmbatch.media.hashing import media_key
from mmbatch.media.image import canonical_image_bytes, decode_image, prepare_decoded
from mmbatch.media.store import MediaStore
from mmbatch.types import LoadedRequest, MediaItem, MediaRef, Request, Result


@dataclass
class LoadedWindow:
    """A window's requests with their media keys and decoded media, plus its failures."""

    requests: list[LoadedRequest] = field(default_factory=list)
    media: dict[str, MediaItem] = field(default_factory=dict)
    failures: list[Result] = field(default_factory=list)
    bytes_read: int = 0


class MediaLoader:
    """Turns requests into ``LoadedRequest``s whose media are decoded and held in a store."""

    def __init__(
        self,
        image_options: ImageOptions,
        store: MediaStore | None = None,
        urls: UrlPolicy | None = None,
    ) -> None:
        self.image_options = image_options
        self.store = store if store is not None else MediaStore()
        self.urls = urls
        """Fetch http(s) sources within these limits; None refuses URLs (error rows)."""

    def load(self, requests: Sequence[Request]) -> LoadedWindow:
        window = LoadedWindow()
        keys_by_source: dict[str, str] = {}
        content_by_key: dict[str, Any] = {}  # raw bytes, or an already decoded picture
        read_errors: dict[str, MediaError] = {}
        for request in requests:
            try:
                keys = tuple(
                    self._key(ref, keys_by_source, content_by_key, read_errors, window)
                    for ref in request.media
                )
            except ItemFailure as exc:
                window.failures.append(Result.failure(request.id, exc.stage, str(exc), exc.kind))
                continue
            window.requests.append(LoadedRequest(request, keys))

        decode_errors: dict[str, MediaError] = {}
        for key, data in content_by_key.items():
            try:
                window.media[key] = self.store.get_or_decode(key, partial(self._decode, key, data))
            except MediaError as exc:
                decode_errors[key] = exc
            except Exception as exc:
                # Decoders meet hostile bytes here; whatever one raises is this item's
                # problem (an error row), never the job's.
                decode_errors[key] = MediaError(
                    f"the decoder failed: {type(exc).__name__}: {exc}", kind="corrupt"
                )
        if decode_errors:
            kept = []
            for loaded in window.requests:
                bad = next((k for k in loaded.media_keys if k in decode_errors), None)
                if bad is None:
                    kept.append(loaded)
                else:
                    err = decode_errors[bad]
                    window.failures.append(Result.failure(loaded.id, err.stage, str(err), err.kind))
            window.requests = kept
        return window

    def _key(
        self,
        ref: MediaRef,
        keys_by_source: dict[str, str],
        content_by_key: dict[str, Any],
        read_errors: dict[str, MediaError],
        window: LoadedWindow,
    ) -> str:
        in_memory = ref.data is not None or ref.image is not None
        if not in_memory:
            # Only files are known by name: in-memory items may share a label, not content.
            if ref.source in read_errors:
                raise read_errors[ref.source]
            key = keys_by_source.get(ref.source)
            if key is not None:
                return key
        if ref.modality != "image":
            raise MediaError(
                f"{ref.modality} input is not supported yet", stage="load", kind="unsupported"
            )
        content: Any
        data: bytes | memoryview
        if ref.image is not None:
            data = canonical_image_bytes(ref.image)
            content = ref.image
        elif ref.data is not None:
            data = content = ref.data
            window.bytes_read += len(data)
        else:
            try:
                data = content = read_source(ref.source, self.urls)
            except MediaError as exc:
                read_errors[ref.source] = exc
                raise
            window.bytes_read += len(data)
        key = media_key(ref.modality, data, self.image_options.cache_token())
        if not in_memory:
            keys_by_source[ref.source] = key
        content_by_key.setdefault(key, content)
        return key

    def _decode(self, key: str, content: Any) -> MediaItem:
        if isinstance(content, (bytes, memoryview)):
            image = decode_image(content, self.image_options)
        else:
            image = prepare_decoded(content, self.image_options)
        width, height = image.size
        meta = {"width": width, "height": height, "nbytes": width * height * 3}
        return MediaItem("image", key, image, meta)
