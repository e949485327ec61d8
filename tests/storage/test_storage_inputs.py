"""Inputs in object storage, through the real commands (the fake engine in vLLM's place)
against the tests' S3 server: a prefix of pictures walked, a pattern, a manifest in storage
and one naming storage URLs under the path rule, video frames, an OpenAI batch file, local
datasets (Parquet, WebDataset) kept in storage. Each job's rows are those of the same job
over the same files on local disk, but for the names."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest
from fake_cli import main
from fake_engine import FakeEngine
from media_files import cfr_video
from s3_server import Bucket

from mmbatch.cli import EXIT_ITEMS_FAILED, EXIT_JOB_FAILED, EXIT_OK

PICTURES = ("sunset.jpg", "checkerboard.png", "shapes_alpha.png", "truncated.jpg")


def read_rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.read_text().splitlines()]


def by_name(rows: list[dict[str, Any]], key: str = "id") -> dict[str, dict[str, Any]]:
    """Rows by the last part of their id (a local path and a URL name one file alike)."""
    found = {str(row[key]).rsplit("/", 1)[-1]: row for row in rows}
    assert len(found) == len(rows)
    return found


def run(*argv: str) -> int:
    return main([*argv, "--model", "fake", "--no-progress"], FakeEngine())


def same_answers(mine: dict[str, Any], theirs: dict[str, Any]) -> None:
    for name in ("media_hash", "text", "prompt"):
        assert mine[name] == theirs[name], name
    assert (mine["error"] or {}).get("kind") == (theirs["error"] or {}).get("kind")


def test_a_prefix_is_walked_like_a_folder_and_gives_the_local_rows(
    s3: Bucket, samples: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    local = tmp_path / "pictures"
    (local / "sub").mkdir(parents=True)
    for name in PICTURES:
        shutil.copyfile(samples / name, local / ("sub" if name == "sunset.jpg" else "") / name)
    (local / "notes.txt").write_text("not a picture")
    prefix = s3.upload(local, "data/pictures")
    s3.put("data/pictures/.cache/x.jpg", (samples / "sunset.jpg").read_bytes())
    s3.put("data/pictures/.hidden.jpg", b"")

    assert run("caption", str(local), "--out", str(tmp_path / "local.jsonl")) == EXIT_ITEMS_FAILED
    assert run("caption", prefix, "--out", str(tmp_path / "s3.jsonl")) == EXIT_ITEMS_FAILED
    err = capsys.readouterr().err
    assert "1 hidden folder (not walked)" in err
    rows = read_rows(tmp_path / "s3.jsonl")
    assert sorted(row["id"] for row in rows) == sorted(
        f"{prefix}/{'sub/' if n == 'sunset.jpg' else ''}{n}" for n in PICTURES
    )
    assert rows[0]["source"].startswith("s3://")
    local_rows = by_name(read_rows(tmp_path / "local.jsonl"))
    for name, row in by_name(rows).items():
        same_answers(row, local_rows[name])
    summary = json.loads((tmp_path / "s3.jsonl.summary.json").read_text())
    assert summary["stats"]["decodes"] == 3  # the truncated picture fails to decode

    # A pattern takes what it matches, as a local one does.
    assert run("caption", f"{prefix}/*.png", "--out", str(tmp_path / "glob.jsonl")) == EXIT_OK
    assert sorted(by_name(read_rows(tmp_path / "glob.jsonl"))) == [
        "checkerboard.png",
        "shapes_alpha.png",
    ]


def test_a_manifest_in_storage_names_objects_under_its_prefix_only(
    s3: Bucket, samples: Path, tmp_path: Path
) -> None:
    for name in PICTURES:
        s3.put(f"data/img/{name}", (samples / name).read_bytes())
    s3.put("other/sunset.jpg", (samples / "sunset.jpg").read_bytes())
    lines = [
        {"id": "relative", "path": "img/sunset.jpg"},
        {"id": "absolute", "path": s3.url("data/img/checkerboard.png")},
        {"id": "climbs-out", "path": "img/../../other/sunset.jpg"},
        {"id": "elsewhere", "path": s3.url("other/sunset.jpg")},
        {"id": "local", "path": str(samples / "sunset.jpg")},
        {"id": "missing", "path": "img/nothing.jpg"},
    ]
    manifest = s3.put("data/items.jsonl", "".join(json.dumps(x) + "\n" for x in lines).encode())
    out = tmp_path / "out.jsonl"
    assert run("caption", manifest, "--out", str(out)) == EXIT_ITEMS_FAILED
    rows = {row["id"]: row for row in read_rows(out)}
    assert rows["relative"]["error"] is None
    assert rows["relative"]["source"] == s3.url("data/img/sunset.jpg")
    assert rows["absolute"]["error"] is None
    for refused in ("climbs-out", "elsewhere", "local"):
        assert rows[refused]["error"]["kind"] == "not_allowed", refused
    assert "outside the input's prefix" in rows["elsewhere"]["error"]["message"]
    assert "--input-root" in rows["elsewhere"]["error"]["message"]
    assert rows["missing"]["error"]["kind"] == "unreadable"
    assert "does not exist" in rows["missing"]["error"]["message"]

    # The command line widens the rule: another prefix, a local folder.
    wider = tmp_path / "wider.jsonl"
    roots = ["--input-root", s3.url("other"), "--input-root", str(samples)]
    assert run("caption", manifest, "--out", str(wider), *roots) == EXIT_ITEMS_FAILED
    rows = {row["id"]: row for row in read_rows(wider)}
    assert rows["elsewhere"]["error"] is None
    assert rows["climbs-out"]["error"] is None  # it leads into s3://bucket/other
    assert rows["local"]["error"] is None
    assert rows["elsewhere"]["media_hash"] == rows["relative"]["media_hash"]


def test_a_protocol_in_capitals_is_the_same_store_and_a_password_in_a_url_is_never_said(
    s3: Bucket, samples: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s3.put("data/img/sunset.jpg", (samples / "sunset.jpg").read_bytes())
    upper = s3.url("data/img/sunset.jpg").replace("s3://", "S3://")
    login = s3.url("data/img/sunset.jpg").replace("s3://", "s3://user:pa55word@")
    lines = [
        {"id": "capitals", "path": upper},
        {"path": login},
        {"path": "https://user:pa55word@127.0.0.1:9/x.jpg"},
    ]
    s3.put("data/items.jsonl", "".join(json.dumps(x) + "\n" for x in lines).encode())
    manifest = s3.url("data/items.jsonl").replace("s3://", "S3://")
    out = s3.url("out/rows.jsonl").replace("s3://", "S3://")
    assert run("caption", manifest, "--out", out, "--allow-urls") == EXIT_ITEMS_FAILED
    rows = [json.loads(line) for line in s3.get("out/rows.jsonl").splitlines()]
    assert rows[0]["id"] == "capitals"
    assert rows[0]["error"] is None
    assert rows[0]["source"] == s3.url("data/img/sunset.jpg")
    assert rows[1]["source"] == s3.url("data/img/sunset.jpg")
    assert rows[1]["error"]["kind"] == "not_allowed"
    assert "user name or password" in rows[1]["error"]["message"]
    assert rows[2]["source"] == "https://127.0.0.1:9/x.jpg"
    assert "user name or password" in rows[2]["error"]["message"]
    login_out = s3.url("out/other.jsonl").replace("s3://", "s3://user:pa55word@")
    assert run("caption", manifest, "--out", login_out) == EXIT_JOB_FAILED
    assert run("caption", login, "--out", s3.url("out/more.jsonl")) == EXIT_JOB_FAILED
    said = capsys.readouterr()
    assert said.err.count("user name or password") == 2
    assert not [key for key in s3.keys("out") if not key.startswith("out/rows.jsonl")]
    written = b"".join(s3.get(key) for key in s3.keys("out"))
    assert b"user name or password" in written  # the quarantine is in the store
    for text in (said.out, said.err, written.decode(errors="replace")):
        assert "pa55word" not in text


def test_a_local_manifest_reaches_storage_only_where_the_command_line_allows(
    s3: Bucket, samples: Path, tmp_path: Path
) -> None:
    picture = s3.put("img/sunset.jpg", (samples / "sunset.jpg").read_bytes())
    manifest = tmp_path / "m.csv"
    manifest.write_text(f"id,path\na,{picture}\n")
    out = tmp_path / "out.jsonl"
    assert run("caption", str(manifest), "--out", str(out)) == EXIT_ITEMS_FAILED
    (row,) = read_rows(out)
    assert row["error"]["kind"] == "not_allowed"
    allowed = tmp_path / "allowed.jsonl"
    assert run("caption", str(manifest), "--out", str(allowed), "--input-root", s3.url()) == 0
    (row,) = read_rows(allowed)
    assert row["error"] is None


def test_frames_of_videos_in_storage_are_the_local_frames_and_go_to_storage(
    s3: Bucket, tmp_path: Path
) -> None:
    videos = tmp_path / "videos"
    videos.mkdir()
    for n in range(2):
        cfr_video(videos / f"v{n}.mp4", frames=20, fps=10)
    prefix = s3.upload(videos, "videos")
    assert run("frames", str(videos), "--fps", "2", "--out", str(tmp_path / "local.jsonl")) == 0
    assert run("frames", prefix, "--fps", "2", "--out", s3.url("frames.jsonl")) == EXIT_OK
    local = read_rows(tmp_path / "local.jsonl")
    remote = [json.loads(line) for line in s3.get("frames.jsonl").splitlines()]
    assert len(remote) == len(local) == 8
    for mine, theirs in zip(remote, local, strict=True):
        assert mine["id"].replace(prefix, str(videos)) == theirs["id"]
        same_answers(mine, theirs)


def test_an_openai_batch_file_in_storage_reads_its_pictures_beside_it(
    s3: Bucket, samples: Path, tmp_path: Path
) -> None:
    s3.put("batch/sunset.jpg", (samples / "sunset.jpg").read_bytes())
    lines = []
    for custom_id, url in (("near", "sunset.jpg"), ("far", str(samples / "sunset.jpg"))):
        content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "?"}]
        body = {"messages": [{"role": "user", "content": content}], "max_tokens": 4}
        lines.append({"custom_id": custom_id, "url": "/v1/chat/completions", "body": body})
    batch = s3.put("batch/requests.jsonl", "".join(json.dumps(x) + "\n" for x in lines).encode())
    assert run("run-openai-batch", batch, "--out", s3.url("batch/out.jsonl")) == 1
    rows = by_name(
        [json.loads(line) for line in s3.get("batch/out.jsonl").splitlines()], "custom_id"
    )
    assert rows["near"]["response"]["status_code"] == 200
    assert rows["far"]["response"]["status_code"] == 400
    assert "not_allowed" in json.dumps(rows["far"]["response"]["body"])


def parquet_dataset(samples: Path, folder: Path) -> Path:
    import datasets

    names = list(PICTURES)
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("string")})
    cells = [{"bytes": (samples / n).read_bytes(), "path": n} for n in names]
    table = datasets.Dataset.from_dict({"image": cells, "label": names}, features=features)
    folder.mkdir()
    table.to_parquet(str(folder / "train-00000.parquet"))
    return folder


def webdataset_shards(samples: Path, folder: Path) -> Path:
    folder.mkdir()
    with tarfile.open(folder / "00000.tar", "w") as tar:
        for n, name in enumerate(("sunset.jpg", "arrow_exif_rotated.jpg", "truncated.jpg")):
            data = (samples / name).read_bytes()
            for member, content in ((f"{n:04d}.jpg", data), (f"{n:04d}.txt", name.encode())):
                info = tarfile.TarInfo(member)
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    return folder


@pytest.mark.parametrize("fmt", ["parquet", "webdataset"])
def test_a_local_dataset_kept_in_storage_gives_the_local_rows(
    s3: Bucket, samples: Path, tmp_path: Path, fmt: str
) -> None:
    make = parquet_dataset if fmt == "parquet" else webdataset_shards
    local = make(samples, tmp_path / "dataset")
    url = s3.upload(local, f"datasets/{fmt}")
    for where, out in ((str(local), "local.jsonl"), (url, "s3.jsonl")):
        code = run("caption", where, "--out", str(tmp_path / out))
        assert code in (EXIT_OK, EXIT_ITEMS_FAILED)
    local_rows, remote = read_rows(tmp_path / "local.jsonl"), read_rows(tmp_path / "s3.jsonl")
    assert [row["id"] for row in remote] == [row["id"] for row in local_rows]
    for mine, theirs in zip(remote, local_rows, strict=True):
        same_answers(mine, theirs)


def test_report_over_an_output_in_storage_says_to_copy_it_down(
    s3: Bucket, capsys: pytest.CaptureFixture[str]
) -> None:
    from mmbatch.cli import main as real_main

    assert real_main(["report", s3.url("out.jsonl"), "--html", "r.html"]) == EXIT_JOB_FAILED
    assert "copy it and its OUT.summary.json down first" in capsys.readouterr().err


def test_a_prefix_that_is_not_there_is_one_line_and_begins_no_engine(
    s3: Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A prefix in the store is counted only as it is listed, so the command's engine begins
    only then (``mmbatch.engine.early``): a prefix the store does not have is one line, no
    output, and no engine begun."""
    from processes import starts_ended

    from mmbatch import cli
    from mmbatch.engine import registry

    begun: list[FakeEngine] = []

    def begin(host: Any, media: Any, layout: Any) -> tuple[FakeEngine, Any]:
        begun.append(FakeEngine())
        return begun[-1], layout

    monkeypatch.setattr(registry, "shared_engine_and_layout", begin)
    closed: list[FakeEngine] = []
    monkeypatch.setattr(FakeEngine, "close", lambda self: closed.append(self))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    out = tmp_path / "out.jsonl"
    argv = ["caption", s3.url("no/such/prefix"), "--model", str(model), "--out", str(out)]
    assert cli.main(argv) == EXIT_JOB_FAILED
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "does not exist" in err[0]
    starts_ended()
    assert begun == closed == []
    assert not out.exists()


def test_what_storage_cannot_give_is_one_line_and_exit_2_before_any_engine(
    s3: Bucket, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "out.jsonl")
    cases = {
        "s3://no-such-bucket-anywhere/data": "the bucket 'no-such-bucket-anywhere' does not exist",
        s3.url("no/such/prefix"): "does not exist",
        "gs://some-bucket/pictures": "pip install 'mmbatch[gcs]'",
    }
    for url, said in cases.items():
        never = FakeEngine()
        assert main(["caption", url, "--model", "fake", "--out", out], never) == EXIT_JOB_FAILED
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        assert err[0].startswith("mmbatch: error: ")
        assert said in err[0]
        assert never.added == []
        assert not Path(out).exists()
