"""Decode image bytes with Pillow into the RGB picture the model should see.

Four things a naive ``Image.open(path).convert("RGB")`` gets wrong, done right here:
EXIF orientation is applied (phone photos otherwise arrive sideways), transparency is
composited over white (a bare convert turns transparent pixels black), 16-bit greyscale is
scaled rather than clipped to white, and the header's size is checked against a cap
*before* any pixel is decoded (decompression bombs).

A picture that arrives already decoded (a PIL image from a datasets ``Image()`` column) goes
through the same cap, compositing and resizing in ``prepare_decoded``; its content key is
taken over ``canonical_image_bytes``, which covers mode, size, palette and transparency as
well as the pixels, since any of them changes what the model sees.

Which formats are opened is decided once (``pillow_formats``): every format this Pillow can
decode (AVIF included where it is built in; HEIC where pillow-heif is installed), except
PostScript, which Pillow renders by running Ghostscript on the file: bytes from a folder of
photos are no reason to run an interpreter.
"""

from __future__ import annotations

import io
import json
import warnings
from contextlib import suppress
from functools import lru_cache

from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

from mmbatch.errors import MediaError
from mmbatch.media.options import ImageOptions, scaled_size


def decode_image(data: bytes | memoryview, options: ImageOptions) -> Image.Image:
    """Decode ``data`` to an RGB image, or raise ``MediaError`` saying what is wrong."""
    if not data:
        raise MediaError("empty file (0 bytes)", stage="load", kind="empty")
    try:
        with warnings.catch_warnings():
            # We enforce our own pixel cap below; Pillow's warning would only duplicate it.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            opened = Image.open(io.BytesIO(data), formats=pillow_formats())
            _check_size(*opened.size, options)
            if options.max_pixels is not None:
                # A JPEG bound for far fewer pixels decodes at 1/2 to 1/8 scale (DCT scaling),
                # a fraction of a full decode; Pillow keeps the result at least this large.
                opened.draft("RGB", scaled_size(*opened.size, options.max_pixels))
            opened.load()
            image = ImageOps.exif_transpose(opened)
    except MediaError:
        raise
    except UnidentifiedImageError:
        raise MediaError("not an image Pillow can identify", kind="not_media") from None
    except Image.DecompressionBombError as exc:
        # Pillow's own, larger cap fires while opening, before ours can look at the size.
        raise MediaError(f"decompression bomb refused: {exc}", kind="too_large") from None
    except (OSError, ValueError, SyntaxError) as exc:
        raise MediaError(f"corrupt or unsupported image: {exc}") from None
    image = _to_rgb(image)
    if options.max_pixels is not None:
        image = _limit_pixels(image, options.max_pixels)
    return image


NOT_OPENED = frozenset({"EPS", "MPEG"})
"""Formats Pillow knows but that are not opened here: PostScript (Pillow renders it by running
Ghostscript on the file) and MPEG (a video, which Pillow only identifies)."""


@lru_cache(maxsize=1)
def pillow_formats() -> tuple[str, ...]:
    """The formats ``decode_image`` opens: Pillow's own decoders (not its stubs, which need
    a handler registered, and not ``NOT_OPENED``), with pillow-heif's when installed."""
    with suppress(ImportError):  # HEIF only where pillow-heif is installed
        from pillow_heif import register_heif_opener  # type: ignore[import-not-found]

        register_heif_opener()
    Image.init()
    return tuple(
        sorted(
            name
            for name, (factory, _) in Image.OPEN.items()
            if name not in NOT_OPENED
            and not (isinstance(factory, type) and issubclass(factory, ImageFile.StubImageFile))
        )
    )


@lru_cache(maxsize=1)
def picture_suffixes() -> frozenset[str]:
    """The file suffixes of ``pillow_formats``: what a folder walk takes as pictures."""
    formats = set(pillow_formats())
    return frozenset(
        suffix for suffix, name in Image.registered_extensions().items() if name in formats
    )


def canonical_image_bytes(image: Image.Image) -> bytes:
    """The bytes that identify a decoded picture: a header (mode, size, palette,
    transparency) and the raw pixels. Raises ``MediaError`` if the pixels cannot be read."""
    palette = image.palette.tobytes().hex() if image.mode in ("P", "PA") and image.palette else ""
    header = json.dumps(
        {
            "format": "mmbatch-decoded-image-v1",
            "mode": image.mode,
            "size": list(image.size),
            "palette": palette,
            "transparency": repr(image.info.get("transparency")),
        },
        sort_keys=True,
    )
    try:
        pixels = image.tobytes()
    except (OSError, ValueError) as exc:
        raise MediaError(f"cannot read the decoded image's pixels: {exc}") from None
    return header.encode() + b"\0" + pixels


def prepare_decoded(image: Image.Image, options: ImageOptions) -> Image.Image:
    """An already decoded picture, made what ``decode_image`` would return: capped, RGB,
    resized. The caller's image is never modified."""
    _check_size(*image.size, options)
    rgb = _to_rgb(image)
    if options.max_pixels is not None:
        rgb = _limit_pixels(rgb, options.max_pixels)
    return rgb


def _to_rgb(image: Image.Image) -> Image.Image:
    if image.mode == "RGB":
        return image
    if image.mode == "I" or image.mode.startswith("I;16"):
        # 16-bit greyscale (PNG, TIFF): a bare convert("RGB") clips every value above 255,
        # which turns all but the darkest 1/256 of the range white. Scale to 8 bits instead.
        image = image.convert("I").point(lambda v: v * (1 / 256)).convert("L")
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA"):
        rgba = image.convert("RGBA")
        background = Image.new("RGB", rgba.size, (255, 255, 255))
        background.paste(rgba, mask=rgba.getchannel("A"))
        return background
    return image.convert("RGB")


def _limit_pixels(image: Image.Image, max_pixels: int) -> Image.Image:
    size = scaled_size(*image.size, max_pixels)
    if size == image.size:
        return image
    return image.resize(size, Image.Resampling.BICUBIC)


def _check_size(width: int, height: int, options: ImageOptions) -> None:
    """Refuse a picture over ``max_source_pixels`` (from its header, before decoding)."""
    if width * height > options.max_source_pixels:
        raise MediaError(
            f"image is {width}x{height} = {width * height} pixels, over the cap of "
            f"{options.max_source_pixels} (raise max_source_pixels if this is intended)",
            kind="too_large",
        )
