"""A hostile corpus, generated (never committed): the files that crash batch jobs in the wild.

``make_hostile_corpus(folder)`` writes them and returns what each must become when the folder
is captioned with ``CORPUS_ARGS``: ``"ok"`` (a caption) or the ``(stage, kind)`` of its error
row. Cases whose outcome depends on the model's processor (strips of extreme aspect ratio)
are listed again in ``ENGINE_DEPENDENT``, with what a real model makes of them. Files a folder
walk passes over (``SKIPPED``) get no row: the summary counts them.
"""

from __future__ import annotations

import io
import os
import struct
import zlib
from pathlib import Path

from media_files import cfr_video, truncated, write_video
from PIL import Image

from mmbatch.jsonl import printable

Expectation = str | tuple[str, str]

BOMB_SIDE = 20_000
SOURCE_PIXEL_CAP = 5_000_000
"""Pictures and video frames over this are refused (the corpus's 2560x2048 video is)."""
CORPUS_ARGS = ("--as-clip", "--max-source-pixels", str(SOURCE_PIXEL_CAP))
"""How the corpus is captioned: its videos whole, under a pixel cap a small file can break."""
NOT_UTF8 = os.fsdecode(b"name_\xff.jpg")


def make_hostile_corpus(folder: Path) -> dict[str, Expectation]:
    folder.mkdir(parents=True, exist_ok=True)
    photo = _photo(96, 64)
    expected: dict[str, Expectation] = {}

    def put(name: str, data: bytes, expectation: Expectation) -> None:
        (folder / name).write_bytes(data)
        expected[name] = expectation

    jpeg = _save(photo, "JPEG", quality=90)
    png = _save(photo, "PNG")
    put("truncated.jpg", jpeg[: len(jpeg) // 2], ("decode", "corrupt"))
    put("truncated.png", png[: len(png) // 2], ("decode", "corrupt"))
    put("zero_bytes.jpg", b"", ("load", "empty"))
    put("text_named.jpg", b"this is a text file, not a JPEG\n" * 20, ("decode", "not_media"))
    put("cmyk.jpg", _save(photo.convert("CMYK"), "JPEG"), "ok")
    put("gray16.png", _gray16_png(), "ok")
    put("animated.gif", _animated_gif(), "ok")
    put("palette_alpha.png", _palette_with_transparency(), "ok")
    put("bomb_20000x20000.png", png_bomb(BOMB_SIDE, BOMB_SIDE), ("decode", "too_large"))
    put("one_pixel.png", _save(Image.new("RGB", (1, 1), (200, 30, 30)), "PNG"), "ok")
    put("huge_exif.jpg", _huge_exif_jpeg(photo), "ok")
    (folder / "dangling.jpg").symlink_to(folder / "no-such-target.jpg")
    expected["dangling.jpg"] = ("load", "unreadable")
    # Extreme aspect ratios, a name that is not UTF-8, a FIFO and a device named
    # like pictures, AVIF, formats a walk passes over, and videos: too large, truncated with
    # its index first, a 16x3600 strip, a FIFO.
    for width, height in ((1, 201), (1, 5000)):
        strip = Image.new("RGB", (width, height), (0, 90, 200))
        put(f"strip_{width}x{height}.png", _save(strip, "PNG"), "ok")
    (folder / NOT_UTF8).write_bytes(jpeg)
    expected[printable(NOT_UTF8)] = "ok"
    os.mkfifo(folder / "fifo.jpg")
    expected["fifo.jpg"] = ("load", "unsupported")
    # A link out of the folder: the walk passes over it (a device named on the command line
    # is an error row: test_special_files).
    (folder / "zero.png").symlink_to("/dev/zero")
    put("photo.avif", _save(photo, "AVIF"), "ok")
    for name, data in SKIPPED.items():
        (folder / name).write_bytes(data)
    cfr_video(folder / "clip.mp4", frames=25)
    expected["clip.mp4"] = "ok"
    write_video(folder / "big_frames.mp4", [0], size=(2560, 2048))
    expected["big_frames.mp4"] = ("decode", "too_large")
    whole = cfr_video(folder / ".whole.mp4", frames=125, faststart=True)  # hidden: skipped
    truncated(whole, folder / "cut_index_first.mp4")
    expected["cut_index_first.mp4"] = ("decode", "corrupt")
    cfr_video(folder / "strip_16x3600.mp4", frames=4, size=(16, 3600))
    expected["strip_16x3600.mp4"] = "ok"
    os.mkfifo(folder / "fifo.mp4")
    expected["fifo.mp4"] = ("load", "unsupported")
    return expected


SKIPPED = {
    "photo.heic": b"\0\0\0\x18ftypheic",
    "drawing.eps": b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n",
    "notes.txt": b"not media",
}
"""Files the corpus's folder walk passes over, each counted by reason in the summary (with
the hidden whole video the truncated one was cut from)."""

ENGINE_DEPENDENT = {
    "thin_1x300.png": ("validate", "rejected"),
    "strip_1x201.png": ("validate", "rejected"),
    "strip_1x5000.png": ("validate", "rejected"),
    "strip_16x3600.mp4": ("validate", "rejected"),
}
"""Fine for the decoder; Qwen2-VL's processor refuses an aspect ratio over 200."""


def make_thin_strip(folder: Path) -> Path:
    path = folder / "thin_1x300.png"
    path.write_bytes(_save(Image.new("RGB", (1, 300), (0, 90, 200)), "PNG"))
    return path


def png_bomb(width: int, height: int) -> bytes:
    """A valid 1-bit greyscale PNG of ``width`` x ``height``: tens of kilobytes on disk,
    ``width * height`` pixels (400 million for the default) once decoded."""
    row = b"\x00" + bytes((width + 7) // 8)  # filter byte, then all-black packed pixels
    compressor = zlib.compressobj(9)
    idat = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", idat)
        + _chunk(b"IEND", b"")
    )


def _chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def _photo(width: int, height: int) -> Image.Image:
    """A picture with structure (gradients and a block), so decoders have work to do."""
    image = Image.new("RGB", (width, height))
    image.putdata(
        [
            ((x * 255) // width, (y * 255) // height, 255 if 20 < x < 50 and 10 < y < 40 else 40)
            for y in range(height)
            for x in range(width)
        ]
    )
    return image


def _save(image: Image.Image, fmt: str, **params: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **params)
    return buffer.getvalue()


def _gray16_png() -> bytes:
    """A 16-bit greyscale ramp: a bare convert("RGB") would clip nearly all of it to white."""
    image = Image.new("I;16", (64, 64))
    image.putdata([(x * 1024) for _ in range(64) for x in range(64)])
    return _save(image, "PNG")


def _animated_gif() -> bytes:
    frames = [
        Image.new("RGB", (48, 48), color) for color in [(255, 0, 0), (0, 255, 0), (0, 0, 255)]
    ]
    buffer = io.BytesIO()
    frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:], duration=80, loop=0)
    return buffer.getvalue()


def _palette_with_transparency() -> bytes:
    image = Image.new("P", (40, 40), 0)
    image.putpalette([0, 0, 0, 255, 0, 0] + [0] * (256 * 3 - 6))
    image.paste(1, (10, 10, 30, 30))
    return _save(image, "PNG", transparency=0)


def _huge_exif_jpeg(photo: Image.Image) -> bytes:
    """A JPEG whose EXIF block is near the 64 KiB segment limit, with an orientation tag."""
    exif = Image.Exif()
    exif[0x010E] = "x" * 60_000  # ImageDescription
    exif[0x0112] = 6  # Orientation: rotate 90
    return _save(photo, "JPEG", exif=exif.tobytes())
