"""Benchmark workloads: deterministic media on disk and the rows a user would write.

* W1: distinct images, one prompt each (steady state: thousands of them).
* W2: four prompts per image (caption, tags, OCR, JSON), rows prompt-major: every image for
  the first prompt, then every image for the second, as a loop over tasks writes them.
* W3: frame captions: videos sampled at 1 frame per second, one row per frame.
* W4: a dataset where 30% of the rows repeat an earlier image, at random places.
"""

from __future__ import annotations

import multiprocessing
import os
import random
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

CAPTION = "Describe this image in detail."
FRAME_PROMPT = "Describe this video frame in detail."
W2_PROMPTS = (
    CAPTION,
    "List ten tags for this image, comma separated.",
    "Transcribe any text visible in this image.",
    'Answer in JSON with keys "objects", "colors" and "scene".',
)
WORKLOADS = ("W1", "W2", "W3", "W4")
FRAME_FPS = 1.0
"""W3 samples each video at this rate."""


@dataclass(frozen=True)
class Row:
    """One request of a workload: an image file, or one frame (``at`` seconds) of a video."""

    id: str
    image: str
    prompt: str
    at: float | None = None


def make_images(folder: Path, count: int, size: int, seed: int) -> list[Path]:
    """``count`` random-noise JPEGs of ``size`` x ``size`` (noise: no two share an encoding)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(count):
        path = folder / f"img{i:05d}.jpg"
        if not path.exists():
            pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(path, quality=90)
        else:
            rng.integers(0, 256, (size, size, 3), dtype=np.uint8)  # keep the stream aligned
        paths.append(path)
    return paths


def make_videos(folder: Path, count: int, seconds: int, size: int, seed: int) -> list[Path]:
    """``count`` H.264 videos of ``seconds`` at 10 fps, ``size`` x ``size``, a key frame every
    5 s: a slowly moving gradient under noise, so that every sampled frame differs from every
    other. Each video has a random stream of its own (``seed`` and its number), so the videos
    are made at once, a process each up to the machine's cores: one 100 s video takes 5-10 s
    of one core, and a host with a GPU waits for them before any side runs."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"video{n:03d}.mp4" for n in range(count)]
    missing = [(n, path) for n, path in enumerate(paths) if not path.exists()]
    if len(missing) <= 1:
        for n, path in missing:
            _make_video(path, n, seconds, size, seed)
        return paths
    workers = min(len(missing), os.cpu_count() or 1)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        made = [pool.submit(_make_video, path, n, seconds, size, seed) for n, path in missing]
        for future in made:
            future.result()
    return paths


def _make_video(path: Path, n: int, seconds: int, size: int, seed: int) -> None:
    """Video number ``n`` of ``make_videos``, written to a temporary name and then renamed,
    so that a video cut short is made again by the next run rather than taken as made."""
    import av

    rng = np.random.default_rng((seed, n))
    ramp = np.linspace(0, 255, size, dtype=np.float32)
    partial = path.with_name(f".{path.name}.partial")
    with av.open(str(partial), "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=10)
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        stream.options = {"preset": "ultrafast", "g": "50"}  # a key frame every 5 s
        for i in range(seconds * 10):
            shift = (i * 3 + n * 17) % size
            base = np.roll(ramp, shift)[None, :, None] + np.zeros((size, 1, 3), np.float32)
            noise = rng.integers(0, 48, (size, size, 3))
            pixels = np.clip(base + noise, 0, 255).astype(np.uint8)
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    partial.replace(path)


def rows_for(workload: str, media: list[Path], seed: int = 0, seconds: int = 60) -> list[Row]:
    """The rows of ``workload`` over ``media`` (images, or W3's videos of ``seconds``), in
    the order a user would write them."""
    if workload == "W1":
        return [Row(f"w1-{i}", str(p), CAPTION) for i, p in enumerate(media)]
    if workload == "W2":
        return [
            Row(f"w2-{t}-{i}", str(p), prompt)
            for t, prompt in enumerate(W2_PROMPTS)
            for i, p in enumerate(media)
        ]
    if workload == "W3":
        times = [k / FRAME_FPS for k in range(int(seconds * FRAME_FPS))]
        return [
            Row(f"w3-{v}-{t:.3f}", str(p), FRAME_PROMPT, at=t)
            for v, p in enumerate(media)
            for t in times
        ]
    if workload == "W4":
        rng = random.Random(seed)
        distinct = media[: round(len(media) * 0.7)]
        picks = list(distinct) + [rng.choice(distinct) for _ in range(len(media) - len(distinct))]
        rng.shuffle(picks)
        return [Row(f"w4-{i}", str(p), CAPTION) for i, p in enumerate(picks)]
    raise ValueError(f"unknown workload {workload!r}; known: {', '.join(WORKLOADS)}")
