"""Decode image bytes with Pillow into the RGB picture the model should see.

Three things a naive ``Image.open(path).convert("RGB")`` gets wrong, done right here:
EXIF orientation is applied (phone photos otherwise arrive sideways), transparency is
composited over white (a bare convert turns transparent pixels black), and the header's
size is checked against a cap *before* any pixel is decoded (decompression bombs).
"""

from __future__ import annotations

import io
import warnings

from PIL import Image, ImageOps, UnidentifiedImageError

from mmbatch.config import ImageOptions
from mmbatch.errors import MediaError


def decode_image(data: bytes, options: ImageOptions) -> Image.Image:
    """Decode ``data`` to an RGB image, or raise ``MediaError`` saying what is wrong."""
    if not data:
        raise MediaError("empty file (0 bytes)", stage="load")
    try:
        with warnings.catch_warnings():
            # We enforce our own pixel cap below; Pillow's warning would only duplicate it.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            opened = Image.open(io.BytesIO(data))
            width, height = opened.size
            if width * height > options.max_source_pixels:
                raise MediaError(
                    f"image is {width}x{height} = {width * height} pixels, over the cap of "
                    f"{options.max_source_pixels} (raise max_source_pixels if this is intended)"
                )
            opened.load()
            image = ImageOps.exif_transpose(opened)
    except MediaError:
        raise
    except UnidentifiedImageError:
        raise MediaError("not an image Pillow can identify") from None
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise MediaError(f"corrupt or unsupported image: {exc}") from None
    image = _to_rgb(image)
    if options.max_pixels is not None:
        image = _limit_pixels(image, options.max_pixels)
    return image


def _to_rgb(image: Image.Image) -> Image.Image:
    if image.mode == "RGB":
        return image
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA"):
        rgba = image.convert("RGBA")
        background = Image.new("RGB", rgba.size, (255, 255, 255))
        background.paste(rgba, mask=rgba.getchannel("A"))
        return background
    return image.convert("RGB")


def _limit_pixels(image: Image.Image, max_pixels: int) -> Image.Image:
    width, height = image.size
    if width * height <= max_pixels:
        return image
    scale = (max_pixels / (width * height)) ** 0.5
    size = (max(1, int(width * scale)), max(1, int(height * scale)))
    return image.resize(size, Image.Resampling.BICUBIC)
