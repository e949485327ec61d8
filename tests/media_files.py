"""Video and audio files made with PyAV, so that tests know exactly what is in them.

Frame ``i`` of a coded video is painted one flat colour that encodes ``i`` (``frame_colour``),
so a test can read back which frame it got (``frame_number``) and prove that the frame taken
at time ``t`` is the one on screen at ``t``. The codec is lossy; the colour steps are wide
enough that rounding recovers ``i`` exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

R_STEP, G_STEP, R_LEVELS = 40, 30, 6
"""frame i -> red (i % 6) * 40, green (i // 6) * 30: up to 48 distinct frames per cycle."""


def frame_colour(i: int) -> tuple[int, int, int]:
    i %= R_LEVELS * 8
    return (i % R_LEVELS) * R_STEP + 20, (i // R_LEVELS) * G_STEP + 10, 128


def frame_number(rgb: np.ndarray) -> int:
    """The ``i`` (mod 48) whose colour fills the middle of ``rgb``."""
    h, w = rgb.shape[:2]
    r, g = (float(c) for c in rgb[h // 4 : 3 * h // 4, w // 4 : 3 * w // 4, :2].mean(axis=(0, 1)))
    return round((r - 20) / R_STEP) + R_LEVELS * round((g - 10) / G_STEP)


def write_video(
    path: Path,
    pts: Sequence[int],
    size: tuple[int, int] = (64, 48),
    gop: int = 12,
    rotation: int | None = None,
    marker: bool = False,
    codec: str = "libx264",
    faststart: bool = False,
    time_base: Fraction = Fraction(1, 1000),
    rate: int = 25,
    picture: Callable[[int, int, int], np.ndarray] | None = None,
) -> Path:
    """An H.264 mp4 whose frame ``i`` shows ``frame_colour(i)`` from ``pts[i]`` on, in
    ``time_base`` units (milliseconds unless told).

    ``marker`` paints the top-left 8x8 corner white, to see where rotation puts it;
    ``faststart`` puts the index (``moov``) before the data, as streaming sites do;
    ``picture(i, width, height)`` paints frame ``i`` instead (an RGB array).
    """
    width, height = size
    options = {"movflags": "+faststart"} if faststart else {}
    with av.open(str(path), "w", options=options) as container:
        stream = container.add_stream(codec, rate=rate)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.time_base = time_base
        stream.codec_context.gop_size = gop
        if codec == "libx264":
            # Key frames exactly every `gop` frames (no scene-cut ones), near-lossless colour.
            stream.codec_context.options = {"crf": "4", "sc_threshold": "0", "bf": "0"}
        if rotation is not None:
            stream.set_display_rotation(rotation)
        for i, stamp in enumerate(pts):
            if picture is not None:
                rgb = picture(i, width, height)
            else:
                rgb = np.empty((height, width, 3), np.uint8)
                rgb[:] = frame_colour(i)
            if marker:
                rgb[:8, :8] = 255
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
            frame.pts, frame.time_base = stamp, time_base
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def cfr_video(path: Path, frames: int = 50, fps: int = 25, **kwargs: object) -> Path:
    step = 1000 // fps
    return write_video(path, [i * step for i in range(frames)], rate=fps, **kwargs)  # type: ignore[arg-type]


def native_clock_video(path: Path, frames: int, fps: int = 25, **kwargs: object) -> Path:
    """``frames`` frames at ``fps``, stamped in the encoder's own clock (``1/fps``), as
    FFmpeg writes by default: an mp4 then counts in 1/12800 s at 25 fps, where frame ``i``'s
    time, ``i * 512 / 12800`` s, is rarely the float ``i * (1 / 25)``."""
    clock = Fraction(1, fps)
    return write_video(path, range(frames), time_base=clock, rate=fps, **kwargs)  # type: ignore[arg-type]


def scene_video(
    path: Path, scenes: Sequence[tuple[int, tuple[int, int, int]]], fps: int = 25, gop: int = 250
) -> Path:
    """Scenes of known lengths: ``(frames, colour)`` each, a flat colour with a small square
    moving across it (motion within a scene, which must not count as a cut), at ``fps`` in
    the encoder's own clock. Key frames only every ``gop`` frames, never at a cut (x264's
    scene-cut key frames are off): a cut is found from the pictures, not from the codec."""
    colours = [colour for frames, colour in scenes for _ in range(frames)]

    def picture(i: int, width: int, height: int) -> np.ndarray:
        rgb = np.empty((height, width, 3), np.uint8)
        rgb[:] = colours[i]
        x = (3 * i) % (width - 8)
        rgb[height // 3 : height // 3 + 8, x : x + 8] = 255 - np.array(colours[i], np.uint8)
        return rgb

    clock = Fraction(1, fps)
    return write_video(
        path, range(len(colours)), gop=gop, time_base=clock, rate=fps, picture=picture
    )


VFR_PTS_MS = (0, 10, 200, 230, 900, 1000, 1500, 1510, 1520, 3000)
"""A variable frame rate: frames 10 ms apart, then one that stays 670 ms, then 1.48 s."""


def tone(rate: int, seconds: float, channels: int, freq: float = 440.0) -> np.ndarray:
    """A 0.5-amplitude sine, the same on every channel: ``[channels, samples]`` float32."""
    t = np.arange(int(rate * seconds)) / rate
    return np.tile((0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32), (channels, 1))


def write_audio(
    path: Path,
    rate: int = 8000,
    seconds: float = 2.5,
    layout: str = "stereo",
    codec: str = "pcm_s16le",
    freq: float = 440.0,
) -> Path:
    """A tone in any container/codec PyAV writes (wav, flac, ogg/opus, mp3...)."""
    channels = 2 if layout == "stereo" else 1
    samples = tone(rate, seconds, channels, freq)
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=rate, layout=layout)
        step = 1024
        for start in range(0, samples.shape[1], step):
            chunk = np.ascontiguousarray(samples[:, start : start + step])
            frame = av.AudioFrame.from_ndarray(chunk, format="fltp", layout=layout)
            frame.sample_rate, frame.pts = rate, start
            frame.time_base = Fraction(1, rate)
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def truncated(source: Path, path: Path, keep: float = 0.5) -> Path:
    """The first ``keep`` share of ``source``'s bytes (an mp4 cut off mid-download)."""
    data = source.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return path


def fps_filter_pts(path: Path, fps: float) -> list[int]:
    """The pts (in the stream's time base) of the source frames FFmpeg's ``fps`` filter
    outputs at ``fps``, with its defaults, in output order, repeats included: every decoded
    frame pushed through PyAV's ``buffer -> fps -> buffersink`` graph, each tagged with its
    own pts, and the EOF pushed after them."""
    taken: list[int] = []
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        graph = av.filter.Graph()
        source = graph.add_buffer(template=stream)
        rate = graph.add("fps", fps=repr(fps))
        sink = graph.add("buffersink")
        source.link_to(rate)
        rate.link_to(sink)
        graph.configure()

        def drain() -> None:
            while True:
                try:
                    frame = graph.pull()
                except (av.error.BlockingIOError, av.error.EOFError):
                    return
                taken.append(frame.opaque)

        for frame in container.decode(stream):
            frame.opaque = frame.pts
            graph.push(frame)
            drain()
        graph.push(None)
        drain()
    return taken
