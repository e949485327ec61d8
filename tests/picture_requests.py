"""Distinct pictures on disk and the caption requests over them, as the fake-engine tests of
the pipeline and of engine replicas build their jobs."""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from mmbatch.types import MediaRef, Request


def write_pictures(folder: Path, count: int, size: int = 32) -> list[Path]:
    """``count`` PNGs of one flat colour each, no two alike (so no two share a media key)."""
    folder.mkdir(exist_ok=True)
    paths = []
    for i in range(count):
        path = folder / f"{i:03d}.png"
        Image.new("RGB", (size, size), (i * 7 % 256, i * 13 % 256, i * 29 % 256)).save(path)
        paths.append(path)
    return paths


def caption_requests(paths: list[Path], prompts: list[str]) -> list[Request]:
    """Prompt-major rows: every picture for the first prompt, then for the next; ids
    ``P:NAME`` (the prompt's index, the picture's file name)."""
    return [
        Request(f"{p}:{path.name}", prompt, (MediaRef("image", str(path)),))
        for p, prompt in enumerate(prompts)
        for path in paths
    ]
