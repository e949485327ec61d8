"""Media that arrive in memory (datasets cells): bytes, decoded pictures, and bad cells."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from media_loader import MediaLoader
from PIL import Image

from mmbatch.media.image import canonical_image_bytes
from mmbatch.media.options import ImageOptions, MediaOptions
from mmbatch.sources.cells import BadCell, media_ref
from mmbatch.sources.paths import LocalPaths, file_id
from mmbatch.types import MediaRef, Request


def load(*refs: MediaRef, options: ImageOptions | None = None):  # type: ignore[no-untyped-def]
    loader = MediaLoader(MediaOptions(image=options or ImageOptions()))
    requests = [Request(str(i), "p", (ref,)) for i, ref in enumerate(refs)]
    return loader, loader.load(requests)


def test_bytes_in_memory_key_like_the_same_file(samples: Path) -> None:
    path = samples / "sunset.jpg"
    loader, window = load(
        MediaRef("image", str(path)),
        MediaRef("image", "row 1", data=path.read_bytes()),
        MediaRef("image", "row 2", data=(samples / "sunset_copy.jpg").read_bytes()),
    )
    keys = {loaded.id: loaded.media_keys[0] for loaded in window.requests}
    assert keys["0"] == keys["1"] == keys["2"]
    assert loader.store.decodes == 1
    assert window.bytes_read == 3 * path.stat().st_size


def test_in_memory_items_sharing_a_label_are_told_apart_by_content(samples: Path) -> None:
    # datasets often stores the same bare file name (or none) for many rows.
    _, window = load(
        MediaRef("image", "image.jpg", data=(samples / "sunset.jpg").read_bytes()),
        MediaRef("image", "image.jpg", data=(samples / "checkerboard.png").read_bytes()),
    )
    first, second = (loaded.media_keys[0] for loaded in window.requests)
    assert first != second
    assert window.media[first].payload.size != window.media[second].payload.size


def test_corrupt_bytes_fail_only_their_row(samples: Path) -> None:
    _, window = load(
        MediaRef("image", "good", data=(samples / "sunset.jpg").read_bytes()),
        MediaRef("image", "bad", data=(samples / "truncated.jpg").read_bytes()),
        MediaRef("image", "empty", data=b""),
    )
    assert [loaded.id for loaded in window.requests] == ["0"]
    failures = {f.request_id: f.error.to_dict() for f in window.failures if f.error}
    assert failures["1"]["stage"] == "decode"
    assert failures["2"] == {"stage": "load", "kind": "empty", "message": "empty file (0 bytes)"}


def test_decoded_picture_is_prepared_like_its_file(samples: Path) -> None:
    # A datasets Image() column hands over PIL images with EXIF already applied; the
    # prepared payload must equal what decoding the file gives.
    path = samples / "shapes_alpha.png"
    with Image.open(path) as opened:
        decoded = opened.copy()
    loader, window = load(MediaRef("image", str(path)), MediaRef("image", "row 1", image=decoded))
    from_file, from_pil = (window.media[loaded.media_keys[0]] for loaded in window.requests)
    assert from_pil.payload.mode == "RGB"
    assert from_pil.payload.tobytes() == from_file.payload.tobytes()
    assert decoded.mode == "RGBA"  # the caller's image is left as it was
    assert loader.store.decodes == 2  # two keys: a file's bytes and a picture's pixels


def test_decoded_picture_keys_cover_mode_size_and_palette() -> None:
    base = Image.new("L", (4, 2), 7)
    same = Image.new("L", (4, 2), 7)
    assert canonical_image_bytes(base) == canonical_image_bytes(same)
    reshaped = Image.frombytes("L", (2, 4), base.tobytes())  # same pixels, other shape
    other_mode = Image.frombytes("P", (4, 2), base.tobytes())
    other_palette = other_mode.copy()
    other_palette.putpalette([255, 0, 0] * 256)
    keys = {canonical_image_bytes(image) for image in (base, reshaped, other_mode, other_palette)}
    assert len(keys) == 4
    _, window = load(MediaRef("image", "a", image=base), MediaRef("image", "b", image=same))
    assert window.requests[0].media_keys == window.requests[1].media_keys


def test_decoded_picture_over_the_pixel_cap_is_an_error_row() -> None:
    _, window = load(
        MediaRef("image", "big", image=Image.new("RGB", (100, 100))),
        options=ImageOptions(max_source_pixels=100),
    )
    assert window.requests == []
    assert window.failures[0].error is not None
    assert "over the cap of 100" in window.failures[0].error.message


def test_a_ref_holds_bytes_or_a_picture_not_both() -> None:
    with pytest.raises(ValueError, match="both bytes and a decoded image"):
        MediaRef("image", "x", data=b"1", image=Image.new("RGB", (1, 1)))


NO_PATHS = LocalPaths()
"""Path cells allowed nowhere (a dataset with no folder of its own, nothing allowed)."""


def test_dataset_cells_become_refs(samples: Path, tmp_path: Path) -> None:
    data = (samples / "sunset.jpg").read_bytes()
    ref = media_ref({"bytes": data, "path": "sunset.jpg"}, "image", "row 3", NO_PATHS, None)
    assert ref == MediaRef("image", "row 3 (sunset.jpg)", data=data)
    x = tmp_path / "x"
    x.mkdir()
    (x / "a.jpg").write_bytes(data)
    (x / "b.png").write_bytes(data)
    a, b = str(x / "a.jpg"), str(x / "b.png")
    under_x = LocalPaths((str(x),))  # path cells are read under x only (mmbatch.sources.paths)
    assert media_ref({"bytes": None, "path": a}, "image", "r", under_x, None) == MediaRef(
        "image", a, pinned=file_id(a)
    )
    assert media_ref(b, "image", "r", under_x, None) == MediaRef("image", b, pinned=file_id(b))
    assert media_ref("b.png", "image", "r", NO_PATHS, str(x)) == MediaRef(
        "image", b, pinned=file_id(b)
    )
    audio = media_ref({"bytes": b"RIFF", "path": None}, "audio", "row 0", NO_PATHS, None)
    assert audio == MediaRef("audio", "row 0", data=b"RIFF")
    picture = Image.new("RGB", (2, 2))
    assert media_ref(picture, "image", "row 5", NO_PATHS, None).image is picture


@pytest.mark.parametrize(
    ("cell", "message"),
    [
        (None, "row 7: no image (the cell is empty)"),
        ({"bytes": None, "path": None}, "row 7: the image cell has neither bytes nor a path"),
        ({"bytes": 12, "path": None}, "row 7: 'bytes' holds int, not bytes"),
        (3.5, "row 7: cannot use a float as image"),
    ],
)
def test_unusable_cells_name_the_row(cell: object, message: str) -> None:
    with pytest.raises(BadCell, match=re.escape(message)) as info:
        media_ref(cell, "image", "row 7", NO_PATHS, None)
    assert info.value.stage == "source"
