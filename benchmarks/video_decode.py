"""Decode benchmark: 8 frames sampled by seeking against decoding every frame, same run.

    python benchmarks/video_decode.py [--minutes 10] [--height 1080] [--video PATH]

Writes a synthetic video (default: 10 minutes of 1080p at 25 fps, H.264 with x264's default
key frame interval of 250 frames, a moving texture so the decoder does real work), then
times two ways of getting its frames on this machine:

* ``mmbatch``: ``index_video`` (demux only) + ``select_frames(num_frames=8)`` +
  ``decode_frames``, which seeks to the key frame before each wanted frame;
* ``every frame``: decoding the whole stream, as a loader that does not seek must do.

It prints both (frames delivered per second, frames the decoder actually produced) and the
ratio of wall times. A script, not a test: its numbers depend on the machine. The video is
kept (``--video`` reuses one) because writing it takes longer than either decode.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

from mmbatch.media.options import VideoOptions

FPS = 25
KEYINT = 250


def write_video(path: Path, minutes: float, height: int) -> None:
    """A ``minutes``-long H.264 mp4 of ``height`` lines (16:9): a texture drifting each frame."""
    import av
    import numpy as np

    width = height * 16 // 9 // 2 * 2
    frames = int(minutes * 60 * FPS)
    rng = np.random.default_rng(0)
    texture = rng.integers(0, 256, (height // 8, width // 8, 3), dtype=np.uint8)
    texture = np.kron(texture, np.ones((8, 8, 1), dtype=np.uint8))[:height, :width]
    print(f"writing {frames} frames of {width}x{height} to {path} ...", file=sys.stderr)
    started = time.perf_counter()
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.time_base = Fraction(1, FPS)
        stream.codec_context.gop_size = KEYINT
        stream.codec_context.options = {"preset": "ultrafast", "crf": "28"}
        stream.thread_type = "AUTO"
        for i in range(frames):
            image = np.roll(texture, (i * 3, i * 5), axis=(0, 1))
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts = i
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    print(f"  written in {time.perf_counter() - started:.1f} s", file=sys.stderr)


def time_sampled(path: Path, num_frames: int) -> dict[str, Any]:
    from mmbatch.media.video import decode_frames, index_video, select_frames

    started = time.perf_counter()
    index = index_video(str(path))
    indexed = time.perf_counter() - started
    wanted = select_frames(index, VideoOptions(num_frames=num_frames))
    result = decode_frames(str(path), index, wanted)
    seconds = time.perf_counter() - started
    assert sorted(result.frames) == wanted, "a sampled frame was not decoded"
    return {
        "seconds": seconds,
        "index_seconds": indexed,
        "delivered": len(result.frames),
        "decoded": result.decoded,
        "seeks": result.seeks,
        "total_frames": len(index.pts),
    }


def time_every_frame(path: Path) -> dict[str, Any]:
    import av

    started = time.perf_counter()
    decoded = 0
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        for frame in container.decode(stream):
            frame.to_ndarray(format="rgb24")
            decoded += 1
    return {"seconds": time.perf_counter() - started, "decoded": decoded}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/video_decode.py")
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the video")
    parser.add_argument("--height", type=int, default=1080, help="lines (16:9 frames)")
    parser.add_argument("--num-frames", type=int, default=8)
    parser.add_argument("--video", type=Path, help="use (or write, if missing) this video")
    args = parser.parse_args(argv)

    video = args.video or Path(tempfile.gettempdir()) / (
        f"mmbatch-bench-{args.minutes:g}min-{args.height}p.mp4"
    )
    if not video.exists():
        write_video(video, args.minutes, args.height)
    sampled = time_sampled(video, args.num_frames)
    every = time_every_frame(video)

    sampled_fps = sampled["delivered"] / sampled["seconds"]
    every_fps = every["decoded"] / every["seconds"]
    print(f"video: {video} ({sampled['total_frames']} frames, key frame every {KEYINT})")
    print(
        f"mmbatch num_frames={args.num_frames}: {sampled['delivered']} frames in "
        f"{sampled['seconds']:.2f} s ({sampled_fps:.1f} frames/s delivered; demux index "
        f"{sampled['index_seconds']:.2f} s, {sampled['seeks']} seeks, "
        f"{sampled['decoded']} frames decoded)"
    )
    print(
        f"every frame: {every['decoded']} frames in {every['seconds']:.2f} s "
        f"({every_fps:.1f} frames/s decoded)"
    )
    print(
        f"ratio: the {args.num_frames} frames arrive {every['seconds'] / sampled['seconds']:.1f}x "
        "sooner by seeking than by decoding every frame"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
