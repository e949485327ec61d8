"""Benchmark workloads: deterministic images on disk and the rows a user would write.

* W1: distinct images, one prompt each.
* W2: four prompts per image (caption, tags, OCR, JSON), rows prompt-major: every image for
  the first prompt, then every image for the second, as a loop over tasks writes them.
* W4: a dataset where 30% of the rows repeat an earlier image, at random places.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

CAPTION = "Describe this image in detail."
W2_PROMPTS = (
    CAPTION,
    "List ten tags for this image, comma separated.",
    "Transcribe any text visible in this image.",
    'Answer in JSON with keys "objects", "colors" and "scene".',
)
WORKLOADS = ("W1", "W2", "W4")


@dataclass(frozen=True)
class Row:
    id: str
    image: str
    prompt: str


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


def rows_for(workload: str, images: list[Path], seed: int = 0) -> list[Row]:
    """The rows of ``workload`` over ``images``, in the order a user would write them."""
    if workload == "W1":
        return [Row(f"w1-{i}", str(p), CAPTION) for i, p in enumerate(images)]
    if workload == "W2":
        return [
            Row(f"w2-{t}-{i}", str(p), prompt)
            for t, prompt in enumerate(W2_PROMPTS)
            for i, p in enumerate(images)
        ]
    if workload == "W4":
        rng = random.Random(seed)
        distinct = images[: round(len(images) * 0.7)]
        picks = list(distinct) + [rng.choice(distinct) for _ in range(len(images) - len(distinct))]
        rng.shuffle(picks)
        return [Row(f"w4-{i}", str(p), CAPTION) for i, p in enumerate(picks)]
    raise ValueError(f"unknown workload {workload!r}; known: {', '.join(WORKLOADS)}")
