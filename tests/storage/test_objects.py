"""Objects read, listed and written through fsspec, against the tests' S3 server over HTTP
(``s3_server.py``), with the faults a store really has: an object that is missing, denied,
cut short mid-read, too large; a bucket that does not exist; a store that is down, then back;
a protocol whose file system is not installed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from s3_server import Bucket, S3Server, faulty_proxy

from mmbatch.errors import MediaError, StorageError, StorageUnavailable
from mmbatch.storage import objects
from mmbatch.storage.objects import (
    delete_objects,
    glob_objects,
    kind_of,
    list_objects,
    local_copy,
    put_file,
    put_object,
    read_object,
    read_whole,
)


def test_read_list_write_and_copy(s3: Bucket, tmp_path: Path) -> None:
    s3.put("in/a.jpg", b"a" * 10)
    s3.put("in/sub/b.png", b"b")
    s3.put("in/.hidden/c.jpg", b"c")
    s3.put("in/empty.jpg", b"")
    assert read_object(s3.url("in/a.jpg"), max_bytes=100) == b"a" * 10
    assert read_object(s3.url("in/empty.jpg"), max_bytes=100) == b""
    assert list_objects(s3.url("in")) == [
        s3.url(k) for k in ("in/.hidden/c.jpg", "in/a.jpg", "in/empty.jpg", "in/sub/b.png")
    ]
    assert glob_objects(s3.url("in/*.jpg")) == [s3.url("in/a.jpg"), s3.url("in/empty.jpg")]
    assert kind_of(s3.url("in")) == "folder"
    assert kind_of(s3.url("in/a.jpg")) == "object"
    assert kind_of(s3.url("in/nothing")) is None
    assert kind_of(s3.url()) == "folder"

    put_object(s3.url("out/x.json"), b"{}")
    put_object(s3.url("out/x.json"), b"[]")  # replaced whole
    local = tmp_path / "f.bin"
    local.write_bytes(b"from a file")
    put_file(s3.url("out/f.bin"), local)
    assert s3.get("out/x.json") == b"[]"
    assert read_whole(s3.url("out/f.bin")) == b"from a file"
    delete_objects([s3.url("out/x.json"), s3.url("out/never-there")])
    assert s3.keys("out") == ["out/f.bin"]

    copy = local_copy(s3.url("in/sub/b.png"))
    assert copy.endswith(".png")
    assert Path(copy).read_bytes() == b"b"
    assert local_copy(s3.url("in/sub/b.png")) == copy  # copied once per process


def test_one_items_object_that_cannot_be_read_is_that_items_error(s3: Bucket) -> None:
    s3.put("big.jpg", b"x" * 1000)
    with pytest.raises(MediaError, match="does not exist") as missing:
        read_object(s3.url("nothing.jpg"), 100)
    assert (missing.value.stage, missing.value.kind) == ("load", "unreadable")
    with pytest.raises(MediaError, match="over the size limit of 100 bytes") as large:
        read_object(s3.url("big.jpg"), 100)
    assert large.value.kind == "too_large"
    with pytest.raises(MediaError, match="does not exist"):
        local_copy(s3.url("nothing.mp4"))


def test_denied_and_cut_short_objects_are_item_errors_through_a_real_http_proxy(
    s3: Bucket, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = bytes(range(256)) * 64
    s3.put("ok.jpg", data)
    s3.put("secret.jpg", data)
    s3.put("cut.jpg", data)
    monkeypatch.setattr(objects, "RETRY_PAUSE_S", 0.01)
    with faulty_proxy(s3_server) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        proxy.deny.add(f"/{s3.name}/secret.jpg")
        proxy.cut.add(f"/{s3.name}/cut.jpg")
        assert read_object(s3.url("ok.jpg"), 1 << 20) == data  # through the proxy
        with pytest.raises(MediaError, match="access denied") as denied:
            read_object(s3.url("secret.jpg"), 1 << 20)
        assert denied.value.kind == "unreadable"
        with pytest.raises(MediaError, match="cannot read") as cut:
            read_object(s3.url("cut.jpg"), 1 << 20)
        assert cut.value.kind == "unreadable"


def test_a_missing_bucket_and_a_missing_protocol_are_the_jobs_errors(s3: Bucket) -> None:
    with pytest.raises(StorageError, match="the bucket 'no-such-bucket' does not exist"):
        kind_of("s3://no-such-bucket/prefix")
    with pytest.raises(StorageError, match="does not exist"):
        read_whole("s3://no-such-bucket/m.jsonl")
    with pytest.raises(StorageError, match=r"pip install 'mmbatch\[gcs\]'"):
        objects.file_system("gs://bucket/x.jpg")
    with pytest.raises(StorageError, match="nosuchproto:// is not a protocol mmbatch reads"):
        objects.file_system("nosuchproto://bucket/x.jpg")


def test_a_store_that_is_down_stops_the_job_and_is_read_again_once_back(
    s3: Bucket, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3.put("a.jpg", b"abc")
    monkeypatch.setattr(objects, "RETRY_PAUSE_S", 0.01)
    s3_server.stop()
    try:
        began = time.monotonic()
        with pytest.raises(StorageUnavailable, match="the store cannot be reached"):
            read_object(s3.url("a.jpg"), 100)
        with pytest.raises(StorageUnavailable):
            put_object(s3.url("b.jpg"), b"x")
        assert time.monotonic() - began < 30
    finally:
        s3_server.start()
    assert read_object(s3.url("a.jpg"), 100) == b"abc"


def test_no_credentials_is_said_once_without_retrying(
    s3: Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(StorageError, match="no credentials found"):
        read_whole(s3.url("m.jsonl"))
    with pytest.raises(StorageUnavailable, match="no credentials found"):
        read_object(s3.url("a.jpg"), 100)
