from mmbatch.media.hashing import media_key
from mmbatch.media.options import ImageOptions

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
