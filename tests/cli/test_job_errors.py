"""Job-level failures end in one line and exit code 2, never a traceback, and leave what is
not the job's output as it was: a read-only or full output folder, a file at ``--out`` that
is not an output, a manifest that is not UTF-8, a WebDataset shard that would be unpickled.

The read-only and full folders are real file systems (a small tmpfs) where this test may
mount one; a full disk is also simulated by making ``write`` fail, which runs anywhere."""

from __future__ import annotations

import errno
import io
import json
import os
import pickle
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
from fake_cli import main
from fake_engine import FakeEngine
from repo_paths import FAKE_CLI

from mmbatch.cli import EXIT_ITEMS_FAILED, EXIT_JOB_FAILED, EXIT_OK


def fake_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(FAKE_CLI), *argv, "--model", "fake", "--no-progress"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The job failed with exit 2 and said why in one line, without a traceback."""
    assert proc.returncode == EXIT_JOB_FAILED, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("mmbatch: error:")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


@pytest.fixture
def pictures(tmp_path: Path, samples: Path) -> Path:
    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(30):
        (folder / f"p{i:02d}.jpg").write_bytes((samples / "sunset.jpg").read_bytes())
    return folder


def tmpfs(where: Path, options: str) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)])
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        folder = tmp_path / "ro"
        folder.mkdir()
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
    else:
        yield from tmpfs(tmp_path / "ro", "size=64k,ro")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """Three pages: the job record takes one, and the rows outgrow the other two."""
    yield from tmpfs(tmp_path / "small", "size=12k")


def test_a_read_only_output_folder_is_one_line(pictures: Path, read_only: Path) -> None:
    proc = fake_cli("caption", str(pictures), "--out", str(read_only / "o.jsonl"))
    line = one_error_line(proc)
    assert "cannot write" in line
    assert "Read-only file system" in line or "Permission denied" in line
    assert list(read_only.iterdir()) == []


@pytest.mark.parametrize("model", [True, False])
def test_a_read_only_save_frames_folder_is_one_line(
    tmp_path: Path, samples: Path, read_only: Path, capsys: pytest.CaptureFixture[str], model: bool
) -> None:
    """Found before the job starts, as a read-only --out is; not one ``decode/corrupt`` row
    per frame, blamed on the video."""
    out = tmp_path / "o.jsonl"
    argv = ["frames", str(samples / "clip.mp4"), "--num-frames", "2", "--out", str(out)]
    argv += ["--save-frames", str(read_only / "frames"), "--no-progress"]
    argv += ["--model", "fake"] if model else []
    assert main(argv, FakeEngine()) == EXIT_JOB_FAILED
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"mmbatch: error: cannot write in the folder {str(read_only)!r}")
    assert "(where the saved frames (--save-frames) go)" in line
    assert "Read-only file system" in line or "Permission denied" in line
    assert not out.exists()
    assert list(read_only.iterdir()) == []


@pytest.mark.parametrize("where", ["--out", "--save-frames"])
def test_a_read_only_output_is_said_before_an_engine_begins(
    tmp_path: Path,
    samples: Path,
    read_only: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    where: str,
) -> None:
    """The engine begins its start before the videos are indexed (``mmbatch.engine.early``),
    and only once the folders the job writes in are known writable."""
    from mmbatch import cli
    from mmbatch.engine.early import EngineStart

    def begin(*args: object) -> None:
        raise AssertionError("an engine was begun")

    monkeypatch.setattr(EngineStart, "begin", classmethod(begin))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    out = read_only / "o.jsonl" if where == "--out" else tmp_path / "o.jsonl"
    frames = read_only / "frames" if where == "--save-frames" else tmp_path / "frames"
    argv = ["frames", str(samples / "clip.mp4"), "--num-frames", "2", "--model", str(model)]
    argv += ["--out", str(out), "--save-frames", str(frames), "--no-progress"]
    assert cli.main(argv) == EXIT_JOB_FAILED  # the command's own engine, not a fake one
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"mmbatch: error: cannot write in the folder {str(read_only)!r}")
    assert not out.exists()


def test_a_read_only_output_folder_is_found_before_anything_starts(
    pictures: Path, read_only: Path, tiny_vl_model: Path
) -> None:
    """The real command on a real model: the folder is named in one line before the decode
    workers or the engine process start, before vLLM is imported (it took 38 s to find, and
    blamed vLLM's log file). ``-X importtime`` lists every module the job imports, and those
    of any process it starts (which inherits the flag)."""
    argv = [sys.executable, "-X", "importtime", "-m", "mmbatch", "caption", str(pictures)]
    argv += ["--model", str(tiny_vl_model), "--out", str(read_only / "o.jsonl")]
    argv += ["--decode-workers", "1", "--no-progress"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
    line = one_error_line(proc)
    assert f"cannot write in the folder {str(read_only)!r}" in line
    assert "Read-only file system" in line or "Permission denied" in line
    assert "vllm" not in imported
    assert "mmbatch.engine.replicas" not in imported  # no engine process
    assert "multiprocessing.popen_spawn_posix" not in imported  # no process at all
    assert list(read_only.iterdir()) == []


def test_a_full_disk_stops_the_job_in_one_line_and_it_resumes(
    pictures: Path, small_disk: Path
) -> None:
    out = small_disk / "o.jsonl"
    line = one_error_line(fake_cli("caption", str(pictures), "--out", str(out)))
    assert "No space left on device" in line
    assert "run the same command again to resume" in line
    written = out.read_bytes()
    assert 0 < written.count(b"\n") < 30
    subprocess.run(["mount", "-o", "remount,size=1m", str(small_disk)], check=True)
    proc = fake_cli("caption", str(pictures), "--out", str(out))
    assert proc.returncode == EXIT_OK, proc.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(Path(r["id"]).name for r in rows) == [f"p{i:02d}.jpg" for i in range(30)]


def test_a_write_failing_for_space_is_one_line_and_the_job_resumes(
    pictures: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mmbatch.output import sinks

    real_write = os.write
    written = 0

    def write(fd: int, data: bytes) -> int:
        nonlocal written
        written += 1
        if written > 10:  # half a line goes down, then the disk is full
            real_write(fd, bytes(data)[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    out = tmp_path / "o.jsonl"
    argv = ["caption", str(pictures), "--model", "fake", "--out", str(out), "--no-progress"]
    with mock.patch.object(sinks.os, "write", write):
        assert main(argv, FakeEngine()) == EXIT_JOB_FAILED
    err = capsys.readouterr().err
    assert "mmbatch: error: cannot write" in err
    assert "No space left on device" in err
    assert main(argv, FakeEngine()) == EXIT_OK  # the torn line is cut, the rest redone
    assert len({json.loads(line)["id"] for line in out.read_text().splitlines()}) == 30


def test_a_file_at_out_that_is_not_parquet_is_left_as_it_is(pictures: Path, tmp_path: Path) -> None:
    out = tmp_path / "x.parquet"
    out.write_text("someone's notes, not a table\n")
    line = one_error_line(fake_cli("caption", str(pictures), "--out", str(out)))
    assert "is not a Parquet file" in line
    assert out.read_text() == "someone's notes, not a table\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "x.parquet"]


def test_a_parquet_table_that_is_not_an_output_is_left_as_it_is(
    pictures: Path, tmp_path: Path
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = tmp_path / "x.parquet"
    pq.write_table(pa.table({"name": ["a", "b"], "price": [1, 2]}), out)
    before = out.read_bytes()
    argv = ["caption", str(pictures), "--model", "fake", "--out", str(out), "--no-progress"]
    for force in ([], ["--force"]):
        assert main([*argv, *force], FakeEngine()) == EXIT_JOB_FAILED
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "x.parquet"]


def test_a_folder_at_out_is_refused(pictures: Path, tmp_path: Path) -> None:
    folder = tmp_path / "photos_out"
    folder.mkdir()
    (folder / "keep.txt").write_text("mine")
    line = one_error_line(fake_cli("caption", str(pictures), "--out", str(folder)))
    assert "is a folder" in line
    datasets_out = fake_cli(
        "caption", str(pictures), "--out", str(folder), "--out-format", "datasets"
    )
    assert "not a datasets folder" in one_error_line(datasets_out)
    assert [p.name for p in folder.iterdir()] == ["keep.txt"]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("m.jsonl", b'{"path": "in/p00.jpg", "prompt": "caf\xe9"}\n', "m.jsonl:1: not UTF-8"),
        ("m.csv", b"path,prompt\nin/p00.jpg,caf\xe9\n", "m.csv:2: not UTF-8 text (byte 0xe9"),
    ],
)
def test_a_manifest_that_is_not_utf8_is_one_line(
    pictures: Path, tmp_path: Path, name: str, content: bytes, message: str
) -> None:
    manifest = tmp_path / name
    manifest.write_bytes(content)
    line = one_error_line(fake_cli("caption", str(manifest), "--out", str(tmp_path / "o.jsonl")))
    assert message in line
    assert "save the manifest as UTF-8" in line or "save the file as UTF-8" in line


def test_a_utf8_csv_with_a_byte_order_mark_is_read(pictures: Path, tmp_path: Path) -> None:
    manifest = tmp_path / "excel.csv"
    manifest.write_bytes(b"\xef\xbb\xbfpath,id\r\nin/p00.jpg,first\r\nin/p01.jpg,second\r\n")
    out = tmp_path / "o.jsonl"
    argv = ["caption", str(manifest), "--model", "fake", "--out", str(out), "--no-progress"]
    assert main(argv, FakeEngine()) == EXIT_OK
    assert sorted(json.loads(line)["id"] for line in out.read_text().splitlines()) == [
        "first",
        "second",
    ]


def tar_shard(path: Path, members: dict[str, bytes]) -> Path:
    """A WebDataset shard at ``path`` holding ``members`` (name: bytes), in that order."""
    with tarfile.open(path, "w") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def test_a_webdataset_shard_that_would_be_unpickled_is_refused(
    tmp_path: Path, samples: Path
) -> None:
    picture = (samples / "sunset.jpg").read_bytes()
    members = {
        f"{key}.{suffix}": data
        for key in ("0001", "0002")
        for suffix, data in (("jpg", picture), ("pth", pickle.dumps({"key": key})))
    }
    shard = tar_shard(tmp_path / "shard.tar", members)
    line = one_error_line(fake_cli("caption", str(shard), "--out", str(tmp_path / "o.jsonl")))
    assert "holds '0001.pth'" in line
    assert "unpickle" in line


def test_a_webdataset_member_datasets_cannot_decode_is_one_line(
    tmp_path: Path, samples: Path
) -> None:
    members = {"0001.jpg": (samples / "sunset.jpg").read_bytes(), "0001.cls": b"cat"}
    shard = tar_shard(tmp_path / "shard.tar", members)
    line = one_error_line(fake_cli("caption", str(shard), "--out", str(tmp_path / "o.jsonl")))
    assert "cannot read" in line
    assert "ValueError" in line


def test_item_failures_still_exit_1(pictures: Path, tmp_path: Path) -> None:
    (pictures / "broken.jpg").write_bytes(b"not a picture")
    assert fake_cli("caption", str(pictures), "--out", str(tmp_path / "o.jsonl")).returncode == (
        EXIT_ITEMS_FAILED
    )


def test_decode_workers_that_cannot_start_stop_the_job_in_one_line(tmp_path: Path) -> None:
    """On the GPU host the workers' start failed (a missing import) and each of 4,500
    pictures became an error row; workers that die on every item alone stop the job."""
    from PIL import Image

    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(12):
        Image.new("RGB", (32, 32), (i * 20, 0, 0)).save(folder / f"p{i:02d}.png")
    shadow = tmp_path / "shadow"  # the spawned decode workers cannot import Pillow
    shadow.mkdir()
    (shadow / "sitecustomize.py").write_text(
        "import sys\n"
        "if '--multiprocessing-fork' in sys.argv:\n"
        "    sys.modules['PIL.Image'] = None\n"
    )
    out = tmp_path / "o.jsonl"
    argv = ["caption", str(folder), "--out", str(out), "--decode-workers", "2"]
    proc = subprocess.run(
        [sys.executable, str(FAKE_CLI), *argv, "--model", "fake", "--no-progress"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow), *sys.path])},
    )
    assert proc.returncode == EXIT_JOB_FAILED, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("mmbatch: error:")]
    assert len(errors) == 1, proc.stderr
    assert "decode worker processes died" in errors[0]
