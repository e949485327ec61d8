"""Read, hash and decode the media of a window of requests.

The bytes of each source are read once and hashed once; each distinct key is decoded once
(through the store) no matter how many requests or file names share it. Failures become
error ``Result``s for exactly the requests that use the failing media.

Images are read whole, hashed and decoded with Pillow. Videos and audio are hashed by
streaming the file (an hour of video does not fit in memory) and decoded by PyAV from the
path (``mmbatch.media.av_items``): a clip of sampled frames, single frames of a video (all
the window's frames of one video in one decoding pass), or a window of audio.

Media already in memory (``MediaRef.data`` bytes, or an already decoded ``MediaRef.image``)
take the image path minus the file read: hashed once, decoded (or, for a decoded picture,
prepared) once per distinct key.

With the model's ``PromptLimits``, a clip that would not fit the model is shrunk before it
is decoded (within the bounds the options allow), and every request is measured after
decoding; one that is still over becomes an error row instead of reaching the engine.

A request that its source already found unusable (``Request.error``) is not loaded: its
error is its result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from mmbatch.errors import ItemFailure, MediaError
from mmbatch.media import av_items
from mmbatch.media.fetch import read_source
from mmbatch.media.hashing import file_digest, media_key
from mmbatch.media.image import canonical_image_bytes
from mmbatch.media.limits import PromptLimits
from mmbatch.media.options import MediaOptions
from mmbatch.media.store import MediaStore
from mmbatch.types import (
    FrameAt,
    LoadedRequest,
    MediaItem,
    MediaRef,
    Request,
    Result,
    TimeSpan,
)

if TYPE_CHECKING:
    from mmbatch.media.video import VideoIndex


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
        options: MediaOptions | None = None,
        limits: PromptLimits | None = None,
        store: MediaStore | None = None,
    ) -> None:
        options = options or MediaOptions()
        self.image_options = options.image
        self.video_options = options.video
        # Audio reaches vLLM at the model's own rate (vLLM's resampler cannot load here).
        self.audio_options = options.audio.at_model_rate(limits.audio_rate if limits else None)
        self.urls = options.urls
        self.limits = limits
        self.store = store if store is not None else MediaStore()
        self.frame_dir = Path(options.frame_dir) if options.frame_dir is not None else None
        if self.frame_dir is not None:
            self.frame_dir.mkdir(parents=True, exist_ok=True)

    def load(self, requests: Sequence[Request]) -> LoadedWindow:
        window = LoadedWindow()
        plan = _WindowPlan(self, window)
        for request in requests:
            if request.error is not None:
                window.failures.append(Result(request.id, error=request.error))
                continue
            try:
                keys = tuple(plan.key(ref, request) for ref in request.media)
            except ItemFailure as exc:
                window.failures.append(Result.failure(request.id, exc.stage, str(exc), exc.kind))
                continue
            window.requests.append(LoadedRequest(request, keys))

        decode_errors: dict[str, MediaError] = {}
        for key, decode in plan.decoders.items():
            try:
                window.media[key] = self.store.get_or_decode(key, decode)
            except MediaError as exc:
                decode_errors[key] = exc
            except Exception as exc:
                # Decoders meet hostile bytes here; whatever one raises is this item's
                # problem (an error row), never the job's.
                decode_errors[key] = MediaError(
                    f"the decoder failed: {type(exc).__name__}: {exc}", kind="corrupt"
                )
        kept = []
        for loaded in window.requests:
            bad = next((k for k in loaded.media_keys if k in decode_errors), None)
            try:
                if bad is not None:
                    raise decode_errors[bad]
                if self.limits is not None:
                    self.limits.check(loaded.request, [window.media[k] for k in loaded.media_keys])
            except ItemFailure as exc:
                window.failures.append(Result.failure(loaded.id, exc.stage, str(exc), exc.kind))
                continue
            kept.append(loaded)
        window.requests = kept
        return window


class _WindowPlan:
    """One window's bookkeeping: the key of each reference, and how to decode each key."""

    def __init__(self, loader: MediaLoader, window: LoadedWindow) -> None:
        self.loader = loader
        self.window = window
        self.decoders: dict[str, Callable[[], MediaItem]] = {}
        self._image_keys: dict[str, str] = {}
        self._digests: dict[str, bytes] = {}
        self._indices: dict[str, VideoIndex] = {}
        self._index_errors: dict[str, MediaError] = {}
        self._frames: dict[str, av_items.FrameBatch] = {}
        self._errors: dict[str, MediaError] = {}

    def key(self, ref: MediaRef, request: Request) -> str:
        """The media key of ``ref``, registering its decoder; ``ItemFailure`` if unusable."""
        if ref.data is not None or ref.image is not None:
            if ref.modality != "image" or ref.part is not None:
                raise MediaError(
                    f"in-memory {ref.modality} input is not supported",
                    stage="load",
                    kind="unsupported",
                )
            return self._in_memory_image(ref)
        if ref.source in self._errors:
            raise self._errors[ref.source]
        try:
            if ref.modality == "image" and ref.part is None:
                return self._image(ref.source)
            if ref.modality == "image" and isinstance(ref.part, FrameAt):
                return self._frame(ref.source, ref.part)
            if ref.modality == "video" and ref.part is None:
                return self._clip(ref.source, request)
            if ref.modality == "audio" and not isinstance(ref.part, FrameAt):
                return self._audio(ref.source, ref.part)
        except MediaError as exc:
            if exc.stage == "load":  # the file itself is unusable: so is every ref to it
                self._errors[ref.source] = exc
            raise
        raise MediaError(
            f"cannot load {ref.modality} from {ref.part!r}", stage="load", kind="unsupported"
        )

    def _image(self, source: str) -> str:
        key = self._image_keys.get(source)
        if key is not None:
            return key
        data = read_source(source, self.loader.urls)
        self.window.bytes_read += len(data)
        options = self.loader.image_options
        key = media_key("image", data, options.cache_token())
        self._image_keys[source] = key
        self.decoders.setdefault(key, partial(av_items.image_item, key, data, options))
        return key

    def _in_memory_image(self, ref: MediaRef) -> str:
        # Never cached by name: in-memory items may share a label, not content.
        options = self.loader.image_options
        if ref.image is not None:
            key = media_key("image", canonical_image_bytes(ref.image), options.cache_token())
            decode = partial(av_items.decoded_image_item, key, ref.image, options)
        else:
            assert ref.data is not None
            self.window.bytes_read += len(ref.data)
            key = media_key("image", ref.data, options.cache_token())
            decode = partial(av_items.image_item, key, ref.data, options)
        self.decoders.setdefault(key, decode)
        return key

    def _digest(self, source: str) -> bytes:
        digest = self._digests.get(source)
        if digest is None:
            try:
                digest, size = file_digest(source)
            except OSError as exc:
                raise _unreadable(source, exc) from None
            if size == 0:
                raise MediaError("empty file (0 bytes)", stage="load", kind="empty")
            self.window.bytes_read += size
            self._digests[source] = digest
        return digest

    def _index(self, source: str) -> VideoIndex:
        from mmbatch.media.video import index_video

        index = self._indices.get(source)
        if index is None:
            if source in self._index_errors:
                raise self._index_errors[source]
            try:
                index = self._indices[source] = index_video(source)
            except MediaError as exc:
                self._index_errors[source] = exc
                raise
        return index

    def _frame(self, source: str, frame: FrameAt) -> str:
        options = self.loader.video_options
        key = media_key("image", self._digest(source), av_items.frame_token(frame, options))
        batch = self._frames.get(source)
        if batch is None:
            batch = self._frames[source] = av_items.FrameBatch(
                source, partial(self._index, source), options.max_pixels, self.loader.frame_dir
            )
        batch.want(key, frame)
        self.decoders.setdefault(key, partial(batch.item, key))
        return key

    def _clip(self, source: str, request: Request) -> str:
        digest = self._digest(source)
        index = self._index(source)
        options = self.loader.video_options
        if self.loader.limits is not None:
            options = self.loader.limits.fit_clip(request, index, options)
        key = media_key("video", digest, options.cache_token())
        self.decoders.setdefault(key, partial(av_items.clip_item, key, source, index, options))
        return key

    def _audio(self, source: str, span: TimeSpan | None) -> str:
        options = self.loader.audio_options
        key = media_key("audio", self._digest(source), av_items.audio_token(span, options))
        self.decoders.setdefault(key, partial(av_items.audio_item, key, source, span, options))
        return key


def _unreadable(source: str, exc: OSError) -> MediaError:
    return MediaError(
        f"cannot read {source!r}: {exc.strerror or exc}", stage="load", kind="unreadable"
    )
