"""Decode audio with PyAV into what an audio model takes: mono float32 at the model's rate.

Any container and codec FFmpeg reads works (wav, flac, mp3, ogg, m4a, the sound track of a
video). Resampling happens here, with FFmpeg's resampler (``av.AudioResampler``), because
vLLM resamples with torchaudio, which cannot load beside the CPU build of torch: audio must
reach vLLM already at the model's rate, as ``(samples, rate)``.

Long files are split into windows (``audio_windows``); each window is decoded by seeking to
its start, so a window late in an hour-long file does not decode the hour before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mmbatch.errors import MediaError
from mmbatch.media.container import av_errors, av_reason, open_media, stream_kinds, threaded
from mmbatch.media.options import AudioOptions
from mmbatch.types import FileId, TimeSpan

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class AudioInfo:
    """What the container says about its first audio stream."""

    duration: float
    sample_rate: int
    channels: int


def probe_audio(path: str, pinned: FileId | None = None) -> AudioInfo:
    """The duration and format of ``path``'s first audio stream; ``MediaError`` if none.

    The duration comes from the stream header when it has one, else from the container,
    else (some raw streams) from decoding the whole stream once.
    """
    with open_media(path, pinned) as container:
        stream = _audio_stream(container)
        duration: float | None = None
        if stream.duration is not None and stream.time_base is not None:
            duration = float(stream.duration * stream.time_base)
        elif container.duration is not None:
            duration = container.duration / 1_000_000
        if duration is None:
            try:
                duration = sum(f.samples / f.sample_rate for f in container.decode(stream))
            except av_errors() as exc:
                raise MediaError(f"cannot read the audio stream: {av_reason(exc)}") from None
        return AudioInfo(duration, stream.sample_rate or 0, stream.channels or 0)


def _audio_stream(container: Any) -> Any:
    if not container.streams.audio:
        raise MediaError(
            f"no audio stream (streams: {stream_kinds(container)})", kind="unsupported"
        )
    return container.streams.audio[0]


def audio_windows(duration: float, options: AudioOptions) -> list[TimeSpan]:
    """Cover ``[0, duration)`` with windows of ``options.window_s`` seconds that overlap by
    ``options.overlap_s``; the last one ends at ``duration``. A short file is one window."""
    if duration <= 0:
        return [TimeSpan(0.0, 0.0)]
    step = options.window_s - options.overlap_s
    spans = []
    start = 0.0
    while True:
        end = min(start + options.window_s, duration)
        spans.append(TimeSpan(round(start, 6), round(end, 6)))
        if end >= duration:
            return spans
        start += step


def decode_audio(
    path: str, sample_rate: int, span: TimeSpan | None = None, pinned: FileId | None = None
) -> np.ndarray:
    """``path``'s first audio stream (or the ``span`` of it) as mono float32 samples at
    ``sample_rate``; ``pinned``: the file it must be (``open_media``). Raises ``MediaError``
    if there is no audio or nothing decodes."""
    import av
    import numpy as np

    start = span.start if span is not None else 0.0
    end = span.end if span is not None else float("inf")
    chunks: list[np.ndarray] = []
    first: float | None = None
    with open_media(path, pinned) as container:
        stream = threaded(_audio_stream(container))
        # Planar float at the target rate, channels kept: the mono mix is their mean, not
        # FFmpeg's -3 dB downmix, so a stereo file with equal channels keeps its level.
        resampler = av.AudioResampler(format="fltp", rate=sample_rate)
        if start > 0 and stream.time_base is not None:
            container.seek(int(start / stream.time_base), stream=stream)
        try:
            for frame in container.decode(stream):
                t = frame.time if frame.time is not None else 0.0
                if t >= end:
                    break
                if first is None:
                    first = t
                chunks.extend(_mono(f) for f in resampler.resample(frame))
            chunks.extend(_mono(f) for f in resampler.resample(None))
        except av_errors() as exc:
            if not chunks:
                raise MediaError(f"cannot decode the audio: {av_reason(exc)}") from None
            # A damaged tail: keep what decoded.
    if not chunks:
        raise MediaError("the audio stream decodes to no samples")
    samples = np.concatenate(chunks).astype(np.float32, copy=False)
    offset = max(0, round((start - (first or 0.0)) * sample_rate))
    stop = None if end == float("inf") else offset + round((end - start) * sample_rate)
    return np.ascontiguousarray(samples[offset:stop])


def _mono(frame: Any) -> np.ndarray:
    planes: np.ndarray = frame.to_ndarray()  # [channels, samples]
    return planes.mean(axis=0) if planes.shape[0] > 1 else planes.reshape(-1)
