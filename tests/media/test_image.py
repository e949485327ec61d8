import io
from pathlib import Path

import pytest
from PIL import Image

from mmbatch.errors import MediaError
from mmbatch.media.image import decode_image
from mmbatch.media.options import ImageOptions

OPTS = ImageOptions()


def png_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def test_exif_orientation_is_applied(samples: Path) -> None:
    with Image.open(samples / "arrow_exif_rotated.jpg") as stored:
        assert stored.size == (240, 160)  # stored landscape, EXIF says rotate 90 degrees
    decoded = decode_image((samples / "arrow_exif_rotated.jpg").read_bytes(), OPTS)
    assert decoded.size == (160, 240)
    assert decoded.mode == "RGB"


def test_transparency_is_composited_over_white(samples: Path) -> None:
    decoded = decode_image((samples / "shapes_alpha.png").read_bytes(), OPTS)
    assert decoded.mode == "RGB"
    assert decoded.getpixel((2, 2)) == (255, 255, 255)  # transparent corner
    assert decoded.getpixel((60, 60)) == (220, 30, 30)  # opaque red circle


def test_palette_with_transparency_is_composited() -> None:
    image = Image.new("P", (4, 4), 0)
    image.putpalette([0, 0, 0, 10, 200, 10] + [0] * 762)
    image.putpixel((1, 1), 1)
    image.info["transparency"] = 0
    decoded = decode_image(png_bytes(image), OPTS)
    assert decoded.getpixel((0, 0)) == (255, 255, 255)
    assert decoded.getpixel((1, 1)) == (10, 200, 10)


def test_grayscale_becomes_rgb() -> None:
    decoded = decode_image(png_bytes(Image.new("L", (3, 3), 77)), OPTS)
    assert decoded.mode == "RGB"
    assert decoded.getpixel((0, 0)) == (77, 77, 77)


def test_truncated_jpeg_is_a_decode_error(samples: Path) -> None:
    with pytest.raises(MediaError, match="truncated") as info:
        decode_image((samples / "truncated.jpg").read_bytes(), OPTS)
    assert info.value.stage == "decode"


def test_empty_file_is_a_load_error() -> None:
    with pytest.raises(MediaError, match="0 bytes") as info:
        decode_image(b"", OPTS)
    assert info.value.stage == "load"


def test_text_file_is_not_an_image() -> None:
    with pytest.raises(MediaError, match="not an image"):
        decode_image(b"hello, I am a text file named .jpg\n", OPTS)


def test_pixel_cap_refuses_before_decoding() -> None:
    data = png_bytes(Image.new("RGB", (300, 200)))
    with pytest.raises(MediaError, match=r"300x200 = 60000 pixels, over the cap of 50000"):
        decode_image(data, ImageOptions(max_source_pixels=50_000))


def test_max_pixels_downscales_keeping_aspect() -> None:
    decoded = decode_image(png_bytes(Image.new("RGB", (400, 100))), ImageOptions(max_pixels=10_000))
    width, height = decoded.size
    assert width * height <= 10_000
    assert abs(width / height - 4) < 0.1
