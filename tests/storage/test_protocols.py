"""Which protocols a URL may have is one allow-list (``mmbatch.storage.urls.PROTOCOLS``): every
other protocol fsspec knows (``ftp``, ``zip``, ``github``, ``webhdfs``, ``memory``, ...) is
refused wherever a URL is taken. Named inside an input (a manifest row, a batch file's line,
a dataset's cell) it is that row's error and the job goes on; named on the command line
(an input, ``--out``, ``--input-root``) it is the job's one-line error, exit 2, before any
output exists. In no case is a file system made for it, and nothing is printed but the
command's own lines."""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fake_cli import main
from fake_engine import FakeEngine

from mmbatch import cli
from mmbatch.errors import ConfigError, MediaError, SourceError, StorageError
from mmbatch.media.fetch import read_source
from mmbatch.openai_batch.reader import read_batch
from mmbatch.output.file_output import FileOutput
from mmbatch.sources.files import SourcePolicy, image_requests
from mmbatch.sources.local_datasets import DatasetInput, dataset_requests
from mmbatch.sources.paths import LocalPaths
from mmbatch.storage import objects
from mmbatch.storage.urls import PROTOCOLS, is_storage_url, unsupported
from mmbatch.types import ItemError

OTHERS = sorted(set(fsspec.available_protocols()) - set(PROTOCOLS))
"""Every protocol fsspec has a file system for, but those mmbatch takes."""
CRASHED = ["ftp", "zip", "github", "webhdfs"]
"""Protocols whose file system cannot even be made from a URL alone."""


def url(protocol: str) -> str:
    return f"{protocol}://host/pictures/a.jpg"


@pytest.fixture
def made() -> Iterator[list[str]]:
    """The protocols of every fsspec file system made (or tried) while the test runs, but
    those of the allow-list (datasets reads local files through fsspec's own)."""
    seen: list[str] = []
    real = fsspec.spec._Cached.__call__

    def spy(cls: Any, *args: Any, **kwargs: Any) -> Any:
        names = {cls.protocol} if isinstance(cls.protocol, str) else set(cls.protocol)
        if not names & set(PROTOCOLS):
            seen.append("/".join(sorted(names)))
        return real(cls, *args, **kwargs)

    fsspec.spec._Cached.__call__ = spy  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        fsspec.spec._Cached.__call__ = real  # type: ignore[method-assign]


def assert_unsupported(error: ItemError | dict[str, Any] | None, protocol: str) -> None:
    error = error.to_dict() if isinstance(error, ItemError) else error
    assert error is not None, protocol
    assert (error["stage"], error["kind"]) == ("source", "unsupported"), error
    assert f"{protocol}:// is not a protocol mmbatch reads" in error["message"], error


def test_the_allow_list_is_the_stores_the_web_and_local_files() -> None:
    assert {p for p, kind in PROTOCOLS.items() if kind == "store"} == {
        "s3", "s3a", "s3n", "gs", "gcs", "hf"
    }  # fmt: skip
    assert {p for p, kind in PROTOCOLS.items() if kind != "store"} == {"http", "https", "file"}
    assert {"ftp", "zip", "github", "webhdfs", "memory", "sftp", "data"} <= set(OTHERS)
    for protocol in OTHERS:
        assert not is_storage_url(url(protocol))
        assert unsupported(url(protocol)) is not None
        assert unsupported(url(protocol).upper()) is not None
    assert unsupported("relative/a.jpg") is None
    # Read as fsspec reads it: whatever comes before "://" is a protocol.
    assert unsupported("relative/a://b.jpg") is not None
    assert unsupported("simplecache::s3://bucket/x.jpg") is not None
    assert unsupported("s3a://bucket/x.jpg") is None


@pytest.mark.parametrize(
    "policy", [LocalPaths(), LocalPaths(anywhere=True), LocalPaths(("s3://bucket/pictures",))]
)
def test_a_manifest_row_of_any_other_protocol_is_its_error(
    tmp_path: Path, made: list[str], policy: LocalPaths
) -> None:
    manifest = tmp_path / "items.jsonl"
    manifest.write_text("".join(json.dumps({"path": url(p)}) + "\n" for p in OTHERS))
    requests = image_requests([str(manifest)], "p", policy=SourcePolicy(policy, allow_urls=True))
    assert [r.id for r in requests] == [url(p) for p in OTHERS]
    for request, protocol in zip(requests, OTHERS, strict=True):
        assert_unsupported(request.error, protocol)
        assert f"{manifest}:" in request.error.message  # type: ignore[union-attr]
    assert made == []


def test_a_batch_line_and_a_dataset_cell_of_any_other_protocol_are_their_rows_errors(
    tmp_path: Path, made: list[str]
) -> None:
    import datasets

    lines = [batch_line(f"r{i}", url(p)) for i, p in enumerate(OTHERS)]
    (tmp_path / "requests.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    for paths in (LocalPaths(), LocalPaths(anywhere=True)):
        batch = read_batch(tmp_path / "requests.jsonl", paths=paths)
        for request, protocol in zip(batch.requests, OTHERS, strict=True):
            if protocol == "data":  # read as a data: URI, refused as one that is not base64
                assert request.error is not None
                assert "base64" in request.error.message
                continue
            assert_unsupported(request.error, protocol)
    cells = [url(p) for p in OTHERS] + [{"bytes": None, "path": url(p)} for p in OTHERS]
    features = datasets.Features(
        {"image": {"bytes": datasets.Value("binary"), "path": datasets.Value("string")}}
    )
    as_dicts = [c if isinstance(c, dict) else {"bytes": None, "path": c} for c in cells]
    datasets.Dataset.from_dict({"image": as_dicts}, features).to_parquet(
        str(tmp_path / "d.parquet")
    )
    spec = DatasetInput(str(tmp_path / "d.parquet"), "parquet", image_column="image")
    requests = dataset_requests(spec, "p", paths=LocalPaths(anywhere=True))
    for request, protocol in zip(requests, OTHERS * 2, strict=True):
        assert_unsupported(request.error, protocol)
    assert made == []


def test_what_the_library_is_handed_directly_is_refused_without_a_file_system(
    tmp_path: Path, made: list[str]
) -> None:
    for protocol in OTHERS:
        with pytest.raises(ConfigError, match=f"{protocol}:// is not a protocol mmbatch takes"):
            FileOutput.at(f"{protocol}://host/out.jsonl")
        with pytest.raises(ConfigError, match=r"--input-root DIR: .* not a protocol"):
            LocalPaths((f"{protocol}://host/pictures",))
        with pytest.raises(SourceError, match=f"input '{url(protocol)}': {protocol}://"):
            image_requests([url(protocol)], "p", policy=SourcePolicy(allow_urls=True))
        with pytest.raises(SourceError, match=f"the batch file .*{protocol}://"):
            read_batch(f"{protocol}://host/requests.jsonl")
        with pytest.raises(SourceError, match=f"the dataset .*{protocol}:// is not a protocol"):
            DatasetInput(f"{protocol}://host/data", "parquet")
        with pytest.raises(MediaError, match=f"{protocol}:// is not a protocol") as read:
            read_source(url(protocol), None)
        assert read.value.kind == "unsupported"
        with pytest.raises(StorageError, match=f"{protocol}:// is not a protocol"):
            objects.file_system(url(protocol))
    # A web or file:// URL is no folder to write to or read under either.
    for text in ("https://host/out.jsonl", "file:///tmp/out.jsonl"):
        with pytest.raises(ConfigError, match="is not a store"):
            FileOutput.at(text)
        with pytest.raises(SourceError, match="is not a store"):
            DatasetInput(text, "disk")
    assert made == []


def batch_line(custom_id: str, image: str) -> dict[str, Any]:
    content = [{"type": "image_url", "image_url": {"url": image}}, {"type": "text", "text": "Q?"}]
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 8}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


@pytest.mark.parametrize("kind", ["manifest", "batch", "dataset"])
def test_the_commands_give_such_urls_error_rows_go_on_and_print_no_traceback(
    tmp_path: Path,
    samples: Path,
    kind: str,
    made: list[str],
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Through each command, with every path allowed (``--allow-outside-root``): the
    picture captioned, one error row per other URL, exit 1, and nothing on stderr but the
    command's own lines (no file system's traceback, now or when the process cleans up)."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "ok.jpg").write_bytes((samples / "sunset.jpg").read_bytes())
    named = ["ok.jpg", *(url(p) for p in CRASHED)]
    out = tmp_path / "o.jsonl"
    if kind == "manifest":
        (data / "items.jsonl").write_text("".join(json.dumps({"path": p}) + "\n" for p in named))
        argv = ["caption", str(data / "items.jsonl"), "--model", "fake"]
    elif kind == "batch":
        lines = [batch_line(f"r{i}", p) for i, p in enumerate(named)]
        (data / "requests.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        argv = ["run-openai-batch", str(data / "requests.jsonl"), "--model", "fake"]
    else:
        import datasets

        datasets.Dataset.from_dict({"image": named}).to_parquet(str(data / "d.parquet"))
        argv = ["caption", str(data / "d.parquet"), "--image-column", "image", "--model", "f"]
    argv += ["--out", str(out), "--no-progress", "--allow-outside-root"]
    assert main(argv, FakeEngine()) == cli.EXIT_ITEMS_FAILED
    gc.collect()  # a file system half made would complain as it goes
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    errors = [
        row["response"]["body"].get("error") if kind == "batch" else row["error"] for row in rows
    ]
    assert errors[0] is None
    for error, protocol in zip(errors[1:], CRASHED, strict=True):
        if kind == "batch":
            error = {"stage": error["stage"], "kind": error["code"], "message": error["message"]}
        assert_unsupported(error, protocol)
    err = capfd.readouterr().err
    assert "Traceback" not in err, err
    assert "Exception ignored" not in err, err
    assert made == []


@pytest.mark.parametrize(
    ("where", "said"),
    [
        (["caption", "ftp://host/a.jpg", "--out", "OUT"], "input 'ftp://host/a.jpg': ftp://"),
        (["caption", "INPUT", "--out", "zip://host/o.jsonl"], "argument --out: 'zip://host"),
        (
            ["caption", "INPUT", "--out", "OUT", "--input-root", "github://org/repo"],
            "argument --input-root: 'github://org/repo': github://",
        ),
        (["run-openai-batch", "webhdfs://host/r.jsonl", "--out", "OUT"], "the batch file"),
        (["caption", "zip://host/d", "--input-format", "disk", "--out", "OUT"], "the dataset"),
    ],
)
def test_such_a_url_on_the_command_line_is_one_line_and_exit_2(
    tmp_path: Path,
    samples: Path,
    where: list[str],
    said: str,
    made: list[str],
    capfd: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "out" / "o.jsonl"
    argv = [
        str(out) if arg == "OUT" else str(samples / "sunset.jpg") if arg == "INPUT" else arg
        for arg in where
    ]
    try:
        code = main([*argv, "--model", "fake", "--no-progress"], FakeEngine())
    except SystemExit as exc:  # an option's value refused by the parser
        code = exc.code
    assert code == cli.EXIT_JOB_FAILED
    gc.collect()
    err = capfd.readouterr().err
    [line] = err.splitlines()
    assert line.startswith("mmbatch: error: "), line
    assert said in line, line
    assert not out.parent.exists()
    assert made == []


def test_urls_fetched_with_allow_urls_are_as_they_were(tmp_path: Path, made: list[str]) -> None:
    """http(s) stays the --allow-urls matter: refused without it (its row's error), taken
    with it, fetched later by the loader and never through fsspec."""
    manifest = tmp_path / "items.jsonl"
    manifest.write_text(json.dumps({"path": "https://example.invalid/a.jpg"}) + "\n")
    [refused] = image_requests([str(manifest)], "p")
    assert refused.error is not None
    assert refused.error.kind == "not_allowed"
    assert "--allow-urls" in refused.error.message
    [taken] = image_requests([str(manifest)], "p", policy=SourcePolicy(allow_urls=True))
    assert taken.error is None
    assert taken.media[0].source == "https://example.invalid/a.jpg"
    assert made == []
