import json
from pathlib import Path

from fake_engine import FakeEngine

from mmbatch.jobs import Job, run_in_memory
from mmbatch.media.decode import ImageFileJob, decode
from mmbatch.media.hashing import media_key
from mmbatch.media.keys import Keyer
from mmbatch.media.options import ImageOptions, MediaOptions
from mmbatch.pipeline import RunConfig
from mmbatch.sources.files import image_requests
from mmbatch.types import ItemError, MediaRef, Request

OPTS = ImageOptions().cache_token()


def test_same_bytes_and_options_give_the_same_key() -> None:
    assert media_key("image", b"abc", OPTS) == media_key("image", b"abc", OPTS)


def test_different_bytes_give_different_keys() -> None:
    assert media_key("image", b"abc", OPTS) != media_key("image", b"abd", OPTS)


def test_decode_options_are_part_of_the_key() -> None:
    small = ImageOptions(max_pixels=28 * 28).cache_token()
    assert media_key("image", b"abc", OPTS) != media_key("image", b"abc", small)


def test_modality_is_part_of_the_key() -> None:
    assert media_key("image", b"abc", OPTS) != media_key("video", b"abc", OPTS)


def test_fields_cannot_run_into_each_other() -> None:
    # Without length prefixes, ("ab", "c") and ("a", "bc") would hash the same stream.
    assert media_key("image", b"c", "ab") != media_key("image", b"bc", "a")


def test_key_names_its_modality() -> None:
    key = media_key("image", b"abc", OPTS)
    assert key.startswith("image-")
    assert len(key) == len("image-") + 32


def test_a_picture_named_by_many_rows_is_read_once_per_job(tmp_path: Path, samples: Path) -> None:
    """A manifest whose rows all name one picture: read and hashed once, not once a row.
    With a store too small to keep the decoded item, it is decoded again from the file (the
    bytes checked against its key), and every row still gets its caption."""
    picture = tmp_path / "p.png"
    picture.write_bytes((samples / "checkerboard.png").read_bytes())
    rows = 2000
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(
        "".join(json.dumps({"id": f"r{i}", "path": "p.png"}) + "\n" for i in range(rows))
    )
    requests = image_requests([str(manifest)], "p")
    for budget in (None, 1):
        run = RunConfig(progress=False, decode_workers=0, memory_budget=budget)
        written, stats = run_in_memory(Job(requests), FakeEngine(), run)
        assert len(written) == rows
        assert {row["error"] is None for row in written} == {True}
        assert len({row["media_hash"] for row in written}) == 1
        assert stats.bytes_read == picture.stat().st_size


def test_a_picture_is_known_by_its_state_not_its_name(tmp_path: Path, samples: Path) -> None:
    """Rewritten, the file is read and hashed again; its earlier key's job, if it must be
    decoded again, refuses bytes that no longer make that key."""
    picture = tmp_path / "p.png"
    picture.write_bytes((samples / "checkerboard.png").read_bytes())
    keyer = Keyer(MediaOptions())
    request = Request("a", "p", (MediaRef("image", str(picture)),))
    first = keyer.key([request])
    again = keyer.key([request])
    assert again.loaded[0].media_keys == first.loaded[0].media_keys
    assert (first.bytes_read, again.bytes_read) == (picture.stat().st_size, 0)
    [lazy] = again.jobs
    assert isinstance(lazy, ImageFileJob)
    assert not isinstance(decode(lazy)[lazy.key], ItemError)
    picture.write_bytes((samples / "shapes_alpha.png").read_bytes())
    changed = keyer.key([request])
    assert changed.loaded[0].media_keys != first.loaded[0].media_keys
    assert changed.bytes_read == picture.stat().st_size
    error = decode(lazy)[lazy.key]
    assert isinstance(error, ItemError)
    assert "changed while the job ran" in error.message
