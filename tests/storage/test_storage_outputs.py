"""Outputs in object storage, through the real commands (the fake engine in vLLM's place)
against the tests' S3 server: every format written there holds the rows the same job writes
to a local disk, with its record, summary and quarantine beside it and no part left; a rerun
resumes there (nothing redone, --retry-errors, a killed run's parts); the commit protocol's
states, each read back as ``mmbatch.output.remote`` says."""

from __future__ import annotations

import json
import re
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest
from fake_cli import main
from fake_engine import FakeEngine, Faults
from s3_server import Bucket

from mmbatch.cli import EXIT_ITEMS_FAILED, EXIT_JOB_FAILED
from mmbatch.output.formats import read_output

PICTURES = ("sunset.jpg", "checkerboard.png", "shapes_alpha.png", "truncated.jpg")


@pytest.fixture
def pictures(tmp_path: Path, samples: Path) -> Path:
    folder = tmp_path / "pictures"
    folder.mkdir()
    for name in PICTURES:
        shutil.copyfile(samples / name, folder / name)
    return folder


def caption(inputs: Path | str, out: str, *extra: str, engine: FakeEngine | None = None) -> int:
    argv = ["caption", str(inputs), "--model", "fake", "--out", out, "--no-progress", *extra]
    return main(argv, engine or FakeEngine())


def rows_of(local: Path) -> dict[str, dict[str, Any]]:
    return {row["id"]: row for row in read_output(local)}


def download(s3: Bucket, key: str, target: Path) -> Path:
    """The object (or the prefix of objects) ``key``, copied to ``target``."""
    keys = s3.keys(key)
    if keys == [key]:
        target.write_bytes(s3.get(key))
        return target
    for found in keys:
        file = target / found[len(key) + 1 :]
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_bytes(s3.get(found))
    return target


FORMATS = {
    "jsonl": ("out.jsonl", ()),
    "parquet": ("out.parquet", ()),
    "shards": ("shards", ("--out-format", "parquet", "--shard-rows", "2")),
    "webdataset": ("wds", ("--out-format", "webdataset", "--shard-rows", "3")),
    "datasets": ("ds", ("--out-format", "datasets")),
}


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_each_format_written_to_storage_holds_the_local_rows_and_resumes_there(
    s3: Bucket, pictures: Path, tmp_path: Path, fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    name, extra = FORMATS[fmt]
    local = tmp_path / f"local-{name}"
    assert caption(pictures, str(local), *extra) == EXIT_ITEMS_FAILED
    assert caption(pictures, s3.url(name), *extra) == EXIT_ITEMS_FAILED
    err = capsys.readouterr().err
    assert f"rows written to {s3.url(name)}:" in err
    assert f"summary in {s3.url(name)}.summary.json" in err
    keys = s3.keys()
    for side in (".job.json", ".summary.json", ".quarantine.jsonl"):
        assert f"{name}{side}" in keys
    assert not [k for k in keys if ".parts" in k], keys
    remote = download(s3, name, tmp_path / f"remote-{name}")
    assert rows_of(remote) == rows_of(local)
    summary = json.loads(s3.get(f"{name}.summary.json"))
    assert summary["output"] == s3.url(name)
    assert summary["stats"]["failed"] == 1
    if fmt == "webdataset":
        with tarfile.open(next(remote.glob("*.tar"))) as tar:
            assert any(m.name.endswith((".jpg", ".png")) for m in tar)  # the media, copied

    # Run again: everything is there, nothing is redone; --retry-errors redoes the error.
    idle = FakeEngine()
    assert caption(pictures, s3.url(name), *extra, engine=idle) == EXIT_ITEMS_FAILED
    assert idle.added == []
    assert "4 items already have a row" in capsys.readouterr().err
    assert caption(pictures, s3.url(name), *extra, "--retry-errors") == EXIT_ITEMS_FAILED
    assert "1 error rows removed to be retried; 1 item to do" in capsys.readouterr().err
    again = download(s3, name, tmp_path / f"again-{name}")
    assert rows_of(again) == rows_of(local)
    assert not [k for k in s3.keys("") if ".parts" in k]


def test_a_job_stopped_by_its_engine_keeps_its_rows_in_storage_and_resumes_there(
    s3: Bucket, pictures: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from mmbatch.output import remote

    monkeypatch.setattr(remote, "PART_ROWS", 1)  # a part per row
    dying = FakeEngine(per_step=1, faults=Faults(die_after_steps=2))
    assert caption(pictures, s3.url("out.jsonl"), engine=dying) == EXIT_JOB_FAILED
    err = capsys.readouterr().err
    assert re.search(rf"rows? finished (is|are) saved in {re.escape(s3.url('out.jsonl'))}", err)
    saved = {json.loads(line)["id"] for line in s3.get("out.jsonl").splitlines()}
    assert 1 <= len(saved) < len(PICTURES)
    assert not s3.keys("out.jsonl.parts")  # closed as a local output is: assembled

    rest = FakeEngine()
    assert caption(pictures, s3.url("out.jsonl"), engine=rest) == EXIT_ITEMS_FAILED
    assert f"{len(saved)} items already have a row" in capsys.readouterr().err
    everything = {str(pictures / n) for n in PICTURES}
    assert {added.split(":", 1)[1] for added in rest.added} == everything - saved
    rows = [json.loads(line) for line in s3.get("out.jsonl").splitlines()]
    assert sorted(row["id"] for row in rows) == sorted(everything)
    assert not s3.keys("out.jsonl.parts")


def test_each_state_of_the_commit_reads_back_as_its_truth(
    s3: Bucket, pictures: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The states a kill can leave, made by hand: an assembly half-written beside its parts
    (the parts count), a marker with parts not yet deleted (the output counts), a drop after
    a row (the row no longer counts)."""

    def line(item: str, text: str) -> bytes:
        row = {"id": str(pictures / item), "source": str(pictures / item), "text": text}
        return (json.dumps(row | {"media_hash": None, "error": None}) + "\n").encode()

    assert caption(pictures, s3.url("out.jsonl")) == EXIT_ITEMS_FAILED
    finished = s3.get("out.jsonl")
    record = s3.get("out.jsonl.job.json")

    # Parts, and a stale assembly: the parts are the truth (two rows), the rest is redone.
    s3.put("out.jsonl", b"not even json\n")
    s3.put("out.jsonl.parts/00000000-aaaa.jsonl", finished.splitlines(keepends=True)[0])
    s3.put("out.jsonl.parts/00000001-aaaa.jsonl", finished.splitlines(keepends=True)[1])
    capsys.readouterr()
    assert caption(pictures, s3.url("out.jsonl")) == EXIT_ITEMS_FAILED
    assert "2 items already have a row; 2 items to do" in capsys.readouterr().err
    assert s3.get("out.jsonl") == finished

    # A marker: the assembly is whole, its parts are cleared and nothing is redone.
    s3.put("out.jsonl.parts/00000000-bbbb.jsonl", line("sunset.jpg", "stale"))
    s3.put(
        "out.jsonl.parts/assembled.json", json.dumps({"parts": ["00000000-bbbb.jsonl"]}).encode()
    )
    idle = FakeEngine()
    assert caption(pictures, s3.url("out.jsonl"), engine=idle) == EXIT_ITEMS_FAILED
    assert idle.added == []
    assert not s3.keys("out.jsonl.parts")
    assert s3.get("out.jsonl") == finished

    # A drop after a row: that item is redone.
    s3.put("out.jsonl.job.json", record)
    s3.put("out.jsonl.parts/00000000-cccc.jsonl", finished)
    s3.put(
        "out.jsonl.parts/00000001-cccc.drop.json",
        json.dumps({"ids": [str(pictures / "sunset.jpg")]}).encode(),
    )
    once = FakeEngine()
    assert caption(pictures, s3.url("out.jsonl"), engine=once) == EXIT_ITEMS_FAILED
    assert [added.split(":", 1)[1] for added in once.added] == [str(pictures / "sunset.jpg")]
    assert s3.get("out.jsonl") == finished


def test_an_output_in_storage_that_is_another_jobs_is_refused_naming_the_url(
    s3: Bucket, pictures: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert caption(pictures, s3.url("out.jsonl")) == EXIT_ITEMS_FAILED
    capsys.readouterr()
    assert caption(pictures, s3.url("out.jsonl"), "--prompt", "other") == EXIT_JOB_FAILED
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"mmbatch: error: {s3.url('out.jsonl')} was written by a different job")
    assert "/tmp" not in err  # said of the store, not of the local mirror
    s3.put("foreign.jsonl", b'{"a": 1}\n')
    assert caption(pictures, s3.url("foreign.jsonl")) == EXIT_JOB_FAILED
    assert f"{s3.url('foreign.jsonl')} is not an mmbatch output" in capsys.readouterr().err
    assert s3.get("foreign.jsonl") == b'{"a": 1}\n'  # left as it is


def test_no_such_bucket_for_the_output_is_one_line_before_any_engine(
    s3: Bucket, pictures: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    never = FakeEngine()
    assert caption(pictures, "s3://no-such-bucket-here/out.jsonl", engine=never) == 2
    err = capsys.readouterr().err.strip().splitlines()
    # Named by the output the user gave, not by an object of the job's own making.
    assert err[-1] == (
        "mmbatch: error: s3://no-such-bucket-here/out.jsonl: the bucket 'no-such-bucket-here' "
        "does not exist (or cannot be seen with these credentials)"
    )
    assert never.added == []
