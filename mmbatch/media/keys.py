"""Read and hash the media of some requests: their content keys, and the decode jobs that
would make each keyed item. Nothing is decoded here.

The bytes of each source are read once and hashed once per job: a file is known by its
status (device, inode, size, times) after its first read, so a thousand rows naming one
picture read it once. Images are read whole (the bytes go on to their decode job; a file
keyed earlier gets a job that reads it again only if its item must be decoded again);
videos and audio are hashed by streaming the file (an hour of video does not fit in memory)
and decoded from the path. All the frames a set of requests
wants from one video become one job, decoded in one pass. A clip that would not fit the
model is shrunk here, before anything is decoded, within the bounds its options allow.

A reference that cannot be keyed (a missing file, a video without a video stream) fails the
requests that use it, and only those: they come back as failure ``Result``s.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import weakref
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, TypeAlias, TypeVar

import xxhash

from mmbatch.errors import ItemFailure, MediaError
from mmbatch.media.decode import (
    AudioJob,
    ClipJob,
    DecodedImageJob,
    DecodeJob,
    FramesJob,
    ImageFileJob,
    ImageJob,
    audio_token,
    clip_token,
    frame_token,
)
from mmbatch.media.fetch import (
    DEFAULT_MAX_FILE_BYTES,
    is_fetched_url,
    is_url,
    read_file,
    read_source,
)
from mmbatch.media.hashing import file_digest, media_key
from mmbatch.media.image import canonical_image_bytes
from mmbatch.media.limits import PromptLimits
from mmbatch.media.options import MediaOptions
from mmbatch.storage.located import locate
from mmbatch.storage.objects import read_many
from mmbatch.types import ClipSpan, FrameAt, LoadedRequest, MediaRef, Request, Result, TimeSpan

if TYPE_CHECKING:
    from mmbatch.media.video import VideoIndex

K = TypeVar("K")
V = TypeVar("V")

CACHE_ENTRIES = 4096
"""Sources whose digest or index is remembered: a job's requests on one source are planned
together, so a small cache catches every repeat (a source also named by a later group)."""
URL_FETCHES = 8
"""A unit's URLs fetched at once: a remote server answers each GET after a round trip, and a
unit's pictures wait for about one round trip instead of one each."""
URL_BYTES_HELD = 64 * 1024**2
"""The most bytes of fetched pictures kept by their key for other units naming the same URL
(a unit's URLs are fetched before it is keyed, so a unit keyed at the same time as the one
that fetched a URL would otherwise fetch it again to decode it)."""
INDEX_ENTRIES = 16
"""Video indices remembered (an hour's index is a few megabytes): a job's clips of one video
are planned together, so the video being keyed is always among them."""


@dataclass
class KeyedUnit:
    """Some requests with their media keys, the jobs that decode those keys, and the
    requests that failed before any decoding."""

    loaded: list[LoadedRequest] = field(default_factory=list)
    jobs: list[DecodeJob] = field(default_factory=list)
    failures: list[Result] = field(default_factory=list)
    bytes_read: int = 0
    fetched: dict[str, bytes | MediaError] = field(default_factory=dict, repr=False)
    """Pictures in storage, and at http(s) URLs not fetched before in the job, read for this
    unit all at once, before it is keyed."""


class Keyer:
    """Keys requests for one job's media options (with the model's limits, if known)."""

    def __init__(self, options: MediaOptions, limits: PromptLimits | None = None) -> None:
        self.options = options
        self.limits = limits
        self._lock = threading.Lock()
        self._digests: dict[str, tuple[bytes, int]] = {}
        """Streamed files' digests: a video's frames may be keyed in several units."""
        self._image_keys: dict[FileState, str] = {}
        """Picture files' keys by the file's status: each file is read and hashed once."""
        self._url_keys: dict[str, str | MediaError] = {}
        """Pictures at http(s) URLs: each URL's key, or why it could not be fetched. Each is
        fetched once per job, however many requests name it."""
        self._url_bytes = HeldBytes(URL_BYTES_HELD)
        """The bytes fetched, by their key: a unit naming a URL fetched for another unit
        decodes them if it must, rather than fetching them again."""
        self._reading: dict[Hashable, threading.Event] = {}
        """Picture files (by status) and URLs being read by one reader thread, for the
        others to wait on."""
        self._indices: dict[str, VideoIndex] = {}
        """Videos' indices: the clips cut from one video are keyed one request at a time."""
        self._spill: str | None = None
        """Where videos and audio held in memory are written to be decoded (``_spilled``)."""

    def key(self, requests: Sequence[Request]) -> KeyedUnit:
        """Key every request of ``requests`` (a request already failed by its source is a
        failure at once)."""
        unit = KeyedUnit(fetched=_fetch_pictures(requests) | self._fetch_urls(requests))
        frames: dict[str, tuple[VideoIndex, dict[str, FrameAt]]] = {}
        jobs: dict[str, DecodeJob] = {}
        unusable: dict[str, MediaError] = {}
        for request in requests:
            if request.error is not None:
                unit.failures.append(Result(request.id, error=request.error))
                continue
            try:
                keys = tuple(
                    self._key(ref, request, unit, jobs, frames, unusable) for ref in request.media
                )
            except ItemFailure as exc:
                unit.failures.append(Result.failure(request.id, exc.stage, str(exc), exc.kind))
                continue
            unit.loaded.append(LoadedRequest(request, keys))
        unit.jobs = list(jobs.values())
        unit.fetched = {}  # decoded from the jobs' own bytes now
        max_pixels = self.options.frame_max_pixels
        save_dir = self.options.frame_dir
        for source, (index, wanted) in frames.items():
            unit.jobs.append(FramesJob(source, index, tuple(wanted.items()), max_pixels, save_dir))
        return unit

    def _key(
        self,
        ref: MediaRef,
        request: Request,
        unit: KeyedUnit,
        jobs: dict[str, DecodeJob],
        frames: dict[str, tuple[VideoIndex, dict[str, FrameAt]]],
        unusable: dict[str, MediaError],
    ) -> str:
        if ref.data is not None and ref.modality != "image":
            ref = replace(ref, source=self._spilled(ref.data, unit), data=None)
        elif ref.data is not None or ref.image is not None:
            return self._in_memory_image(ref, unit, jobs)
        source = ref.source
        if source in unusable:
            raise unusable[source]
        try:
            ref = _from_a_file(ref)
            if ref.modality == "image" and ref.part is None:
                return self._image(ref, unit, jobs)
            if ref.modality == "image" and isinstance(ref.part, FrameAt):
                return self._frame(ref, ref.part, unit, frames)
            if ref.modality == "video" and (ref.part is None or isinstance(ref.part, ClipSpan)):
                return self._clip(ref, ref.part, request, unit, jobs)
            if ref.modality == "audio" and (ref.part is None or isinstance(ref.part, TimeSpan)):
                return self._audio(ref, ref.part, unit, jobs)
        except MediaError as exc:
            if exc.stage == "load":  # the file itself is unusable: so is every ref to it
                unusable[source] = exc
            raise
        raise MediaError(
            f"cannot load {ref.modality} from {ref.part!r}", stage="load", kind="unsupported"
        )

    def _image(self, ref: MediaRef, unit: KeyedUnit, jobs: dict[str, DecodeJob]) -> str:
        # Hashed from the bytes that will be decoded, and remembered by the file's status
        # (not its name): a file changed since has another status, and vLLM trusts our keys
        # blindly.
        options = self.options.image
        read: bytes | None
        fetched = unit.fetched.get(ref.source)
        with self._lock:
            known = self._url_keys.get(ref.source)
        if isinstance(fetched, MediaError):
            raise fetched
        if fetched is not None:
            read = fetched
            key = media_key("image", read, options.cache_token())
        elif isinstance(known, MediaError):
            raise known
        elif known is not None:  # fetched for another unit: its bytes, if they are still held
            with self._lock:
                held = self._url_bytes.get(known)
            job: DecodeJob
            if held is None:  # fetched again only if its item must be decoded again
                job = ImageFileJob(known, ref.source, options, urls=self.options.urls)
            else:
                job = ImageJob(known, held, options)
            jobs.setdefault(known, job)
            return known
        elif is_url(ref.source):
            read = read_source(ref.source, self.options.urls)
            key = media_key("image", read, options.cache_token())
        else:
            key, read = self._local_image(ref)
        if read is None:  # read earlier in the job
            jobs.setdefault(key, ImageFileJob(key, ref.source, options, ref.pinned))
            return key
        unit.bytes_read += len(read)
        jobs.setdefault(key, ImageJob(key, read, options))
        return key

    def _local_image(self, ref: MediaRef) -> tuple[str, bytes | None]:
        """The key of the picture file ``ref`` names, with its bytes when this call read
        them (None: the file was read earlier in the job, and is still as it was). One
        reader thread reads a file while the others wanting it wait for its key."""
        state = _state(ref)
        if state is not None and (known := self._claim(self._image_keys, state)) is not None:
            return known, None
        try:
            data, info = read_file(ref.source, pinned=ref.pinned)
            key = media_key("image", data, self.options.image.cache_token())
            with self._lock:
                _remember(self._image_keys, file_state(info), key)
            return key, data
        finally:
            self._release(state)

    def _fetch_urls(self, requests: Sequence[Request]) -> dict[str, bytes | MediaError]:
        """The whole pictures at http(s) URLs that ``requests`` name and that no reader
        thread fetched before in the job, fetched at once (``URL_FETCHES`` in flight)."""
        wanted = _whole_pictures(requests, is_fetched_url)
        with self._lock:
            new = [url for url in wanted if url not in self._url_keys]
        if len(new) <= 1:
            fetched = [self._fetch_once(url) for url in new]
        else:
            with ThreadPoolExecutor(min(URL_FETCHES, len(new))) as pool:
                fetched = list(pool.map(self._fetch_once, new))
        return {url: data for url, data in zip(new, fetched, strict=True) if data is not None}

    def _fetch_once(self, url: str) -> bytes | MediaError | None:
        """The bytes at ``url`` (or why they cannot be had), None when another reader thread
        fetched it (its key, or its error, is in ``_url_keys`` now)."""
        if self._claim(self._url_keys, url) is not None:
            return None
        try:
            try:
                data = read_source(url, self.options.urls)
            except MediaError as exc:
                with self._lock:
                    _remember(self._url_keys, url, exc)
                return exc
            key = media_key("image", data, self.options.image.cache_token())
            with self._lock:
                self._url_bytes.put(key, data)
                _remember(self._url_keys, url, key)
            return data
        finally:
            self._release(url)

    def _claim(self, known: dict[K, V], identity: K) -> V | None:
        """What ``known`` holds for ``identity``, waiting while another reader thread reads
        it; None when no thread holds it: then this thread must read it, and ``_release``
        it after (read, or failed: a waiting thread then reads it itself, failing alike)."""
        while True:
            with self._lock:
                value, reading = known.get(identity), self._reading.get(identity)
                if value is None and reading is None:
                    self._reading[identity] = threading.Event()
                    return None
            if value is not None:
                return value
            assert reading is not None
            reading.wait()

    def _release(self, identity: Hashable | None) -> None:
        """This thread is done reading ``identity`` (see ``_claim``)."""
        with self._lock:
            done = self._reading.pop(identity, None) if identity is not None else None
        if done is not None:
            done.set()

    def _in_memory_image(self, ref: MediaRef, unit: KeyedUnit, jobs: dict[str, DecodeJob]) -> str:
        # Never remembered by name: in-memory items may share a label, not content.
        if ref.part is not None:
            raise MediaError(
                f"in-memory {ref.modality} input is not supported", stage="load", kind="unsupported"
            )
        options = self.options.image
        job: DecodeJob
        if ref.image is not None:
            key = media_key("image", canonical_image_bytes(ref.image), options.cache_token())
            job = DecodedImageJob(key, ref.image, options)
        else:
            assert ref.data is not None
            unit.bytes_read += len(ref.data)
            key = media_key("image", ref.data, options.cache_token())
            job = ImageJob(key, ref.data, options)
        jobs.setdefault(key, job)
        return key

    def _spilled(self, data: bytes | memoryview, unit: KeyedUnit) -> str:
        """A file holding ``data``, a video's or an audio's bytes held in memory (a datasets
        ``Video(decode=False)`` cell): they are demuxed and decoded from a file, seeking
        where they need, as a file named in the job is. Each distinct content is written
        once, to a folder of this job's own that goes with it; its digest is known here."""
        digest = xxhash.xxh3_128_digest(data)
        with self._lock:
            if self._spill is None:
                self._spill = tempfile.mkdtemp(prefix="mmbatch-media-")
                weakref.finalize(self, shutil.rmtree, self._spill, ignore_errors=True)
            path = os.path.join(self._spill, digest.hex())
            known = path in self._digests
        if not known:
            with open(path, "wb") as sink:
                sink.write(data)
            unit.bytes_read += len(data)
            with self._lock:
                _remember(self._digests, path, (digest, len(data)))
        return path

    def _digest(self, ref: MediaRef, unit: KeyedUnit) -> bytes:
        source = ref.source
        with self._lock:
            known = self._digests.get(source)
        if known is None:
            try:
                known = file_digest(source, ref.pinned)
            except OSError as exc:
                raise MediaError(
                    f"cannot read {source!r}: {exc.strerror or exc}",
                    stage="load",
                    kind="unreadable",
                ) from None
            if known[1] == 0:
                raise MediaError("empty file (0 bytes)", stage="load", kind="empty")
            unit.bytes_read += known[1]
            with self._lock:
                _remember(self._digests, source, known)
        return known[0]

    def _index(self, ref: MediaRef) -> VideoIndex:
        """The video's index (demuxed once for all the clips cut from it)."""
        from mmbatch.media.video import index_video

        source = ref.source
        with self._lock:
            known = self._indices.get(source)
        if known is None:
            known = index_video(source, self.options.video.max_source_pixels, ref.pinned)
            with self._lock:
                _remember(self._indices, source, known, INDEX_ENTRIES)
        return known

    def _frame(
        self,
        ref: MediaRef,
        frame: FrameAt,
        unit: KeyedUnit,
        frames: dict[str, tuple[VideoIndex, dict[str, FrameAt]]],
    ) -> str:
        token = frame_token(frame, self.options.frame_max_pixels)
        key = media_key("image", self._digest(ref, unit), token)
        if ref.source not in frames:
            frames[ref.source] = (self._index(ref), {})
        frames[ref.source][1][key] = frame
        return key

    def _clip(
        self,
        ref: MediaRef,
        span: ClipSpan | None,
        request: Request,
        unit: KeyedUnit,
        jobs: dict[str, DecodeJob],
    ) -> str:
        digest = self._digest(ref, unit)
        options = self.options.video
        index = self._index(ref)
        clip = index if span is None else index.between(span.first, span.stop)
        if self.limits is not None:
            options = self.limits.fit_clip(request, clip, options)
        key = media_key("video", digest, clip_token(options, span))
        jobs.setdefault(key, ClipJob(key, ref.source, index, options, span))
        return key

    def _audio(
        self, ref: MediaRef, span: TimeSpan | None, unit: KeyedUnit, jobs: dict[str, DecodeJob]
    ) -> str:
        options = self.options.audio
        key = media_key("audio", self._digest(ref, unit), audio_token(span, options))
        jobs.setdefault(key, AudioJob(key, ref.source, span, options, ref.pinned))
        return key


def _fetch_pictures(requests: Sequence[Request]) -> dict[str, bytes | MediaError]:
    """The whole pictures in storage that ``requests`` name, read at once: a store answers
    each GET after a round trip, and a unit's pictures wait for one round trip instead of
    one each (``read_many``). Only one store's at a time (the usual case: all of them)."""
    urls = _whole_pictures(requests, _in_store)
    same_store = [u for u in urls if u.split("://", 1)[0] == urls[0].split("://", 1)[0]]
    return read_many(same_store, DEFAULT_MAX_FILE_BYTES) if len(same_store) > 1 else {}


def _in_store(source: str) -> bool:
    """Whether ``source`` names an object in a store (``mmbatch.storage.located``)."""
    return locate(source).store is not None


def _whole_pictures(requests: Sequence[Request], named: Callable[[str], bool]) -> list[str]:
    """The distinct sources of the whole pictures ``requests`` name (read whole, not decoded
    from a file, not held in memory) for which ``named(source)`` holds, in order."""
    wanted: dict[str, None] = {}
    for request in requests:
        if request.error is not None:
            continue
        for ref in request.media:
            whole = ref.modality == "image" and ref.part is None and ref.data is None
            if whole and ref.image is None and named(ref.source):
                wanted[ref.source] = None
    return list(wanted)


def _from_a_file(ref: MediaRef) -> MediaRef:
    """``ref``, read from a local file where its media are decoded from one (a video's
    frames and clips, audio): an object in storage is copied to one first, once per process
    (``local_copy``), and keyed and decoded from it as a local file is. A whole picture is
    read into memory straight from storage."""
    if ref.modality == "image" and ref.part is None:
        return ref
    local = locate(ref.source).local_file()
    return ref if local == ref.source else replace(ref, source=local)


class HeldBytes:
    """Bytes by key, the most recently put kept, at most ``limit`` of them in all."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.size = 0
        self._held: dict[str, bytes] = {}

    def put(self, key: str, data: bytes) -> None:
        if len(data) > self.limit or key in self._held:
            return
        self._held[key] = data
        self.size += len(data)
        while self.size > self.limit:
            self.size -= len(self._held.pop(next(iter(self._held))))

    def get(self, key: str) -> bytes | None:
        return self._held.get(key)


FileState: TypeAlias = "tuple[int, int, int, int, int]"
"""A file's device, inode, size, and modification and change times (ns): another state
of the file, rewritten in place or replaced, has another."""


def file_state(info: os.stat_result) -> FileState:
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def _state(ref: MediaRef) -> FileState | None:
    """The state of the file ``ref`` names now, if it may be known by it: None when it
    cannot be reached or is not the file its pin names (the read then says why)."""
    try:
        info = os.stat(ref.source)
    except (OSError, ValueError):
        return None
    pinned = ref.pinned
    if pinned is not None and (info.st_dev, info.st_ino) != (pinned.device, pinned.inode):
        return None
    return file_state(info)


def _remember(cache: dict[K, V], source: K, value: V, most: int = CACHE_ENTRIES) -> None:
    if len(cache) >= most:
        cache.pop(next(iter(cache)))
    cache[source] = value
