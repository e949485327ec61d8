"""Storage URLs as text: which texts are URLs of a store, how they are normalised and joined,
the path rule's test (``is_inside``), and what a message may show of them."""

from __future__ import annotations

import pytest

from mmbatch.storage.redaction import redact
from mmbatch.storage.urls import (
    is_inside,
    is_storage_url,
    join,
    name,
    normalised,
    parent,
    shown,
    spelled,
)


@pytest.mark.parametrize(
    ("text", "storage"),
    [
        ("s3://bucket/x.jpg", True),
        ("S3://bucket/x.jpg", True),
        ("gs://bucket/x", True),
        ("hf://datasets/org/name/x.parquet", True),
        ("memory://x", False),
        ("ftp://host/x.jpg", False),
        ("http://host/x.jpg", False),
        ("https://host/x.jpg", False),
        ("file:///tmp/x.jpg", False),
        ("data:image/png;base64,xx", False),
        ("/tmp/s3://x", False),
        ("relative/x.jpg", False),
    ],
)
def test_which_texts_are_storage_urls(text: str, storage: bool) -> None:
    assert is_storage_url(text) is storage


def test_normalising_collapses_dots_and_slashes_and_refuses_to_climb_out_of_the_bucket() -> None:
    assert normalised("s3://b/p/./q//r/") == "s3://b/p/q/r"
    assert normalised("s3://b/p/../q") == "s3://b/q"
    with pytest.raises(ValueError, match="climbs above its bucket"):
        normalised("s3://b/../other/x")
    with pytest.raises(ValueError, match="names no bucket"):
        normalised("s3:///")


def test_join_parent_and_name() -> None:
    assert join("s3://b/data", "img/1.jpg") == "s3://b/data/img/1.jpg"
    assert join("s3://b/data/", "../secret.jpg") == "s3://b/secret.jpg"
    assert parent("s3://b/data/m.jsonl") == "s3://b/data"
    assert parent("s3://b") == "s3://b"
    assert name("s3://b/data/m.jsonl") == "m.jsonl"


@pytest.mark.parametrize(
    ("url", "root", "inside"),
    [
        ("s3://b/data/x.jpg", "s3://b/data", True),
        ("s3://b/data", "s3://b/data/", True),
        ("s3://b/data2/x.jpg", "s3://b/data", False),  # by whole components
        ("s3://b/data/../secret.jpg", "s3://b/data", False),
        ("s3://b/data/./x.jpg", "s3://b/data", True),
        ("s3a://b/data/x.jpg", "s3://b/data", True),  # one store, two names
        ("gs://b/data/x.jpg", "s3://b/data", False),
        ("s3://other/data/x.jpg", "s3://b/data", False),
        ("s3://b/../b/data/x.jpg", "s3://b/data", False),  # climbing out names nothing
    ],
)
def test_the_path_rule_for_urls(url: str, root: str, inside: bool) -> None:
    assert is_inside(url, root) is inside


def test_messages_show_no_password_and_no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    assert shown("ftp://user:pa55word@host/x.jpg") == "ftp://host/x.jpg"
    assert shown("s3://b/k@v.jpg") == "s3://b/k@v.jpg"  # an @ in a key is no password
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-value-123")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    said = redact("signature for s3cr3t-value-123 in us-east-1 does not match")
    assert said == "signature for *** in us-east-1 does not match"


def test_a_protocol_is_one_name_whatever_its_case_and_a_login_is_refused() -> None:
    assert normalised("S3://b/p/x.jpg") == "s3://b/p/x.jpg"
    assert spelled("GS://b/X.jpg") == "gs://b/X.jpg"  # the key keeps its case
    assert is_inside("S3://b/data/x.jpg", "s3://b/data")
    assert shown("S3://user:pw@b/x") == "s3://b/x"
    with pytest.raises(ValueError, match="user name or password") as refused:
        normalised("s3://user:pa55word@b/data/x.jpg")
    assert "pa55word" not in str(refused.value)
