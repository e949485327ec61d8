"""The datasets face as datasets users work: a dataset's origin decides which local paths
its cells may name; ``run_dataset`` runs a whole ``Dataset`` or ``IterableDataset`` as one
job, resumable and cached, with the rows ``ds.map(DatasetMap(...))`` gives.

Fast tests cover the origin rule and the job's bookkeeping (a fake engine where an engine is
needed at all); the slow ones run the tiny model and check each row's text against the same
picture captioned alone, from its file.
"""

from __future__ import annotations

import ast
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import datasets
import pytest
from conftest import TINY_ENGINE_KWARGS
from fake_cli import main
from fake_engine import FakeEngine
from processes import in_session
from repo_paths import README, SCRIPTS

from mmbatch import DatasetMap, RunConfig, run_dataset
from mmbatch.errors import ConfigError
from mmbatch.integrations import dataset_streams
from mmbatch.integrations.dataset_origin import mapped_dataset, origin_of
from mmbatch.media.options import MediaOptions
from mmbatch.output.sinks import MemorySink
from mmbatch.pipeline import close_pipeline, run_requests
from mmbatch.sources.files import LINKED_OUT, image_requests
from mmbatch.sources.log import ListingLog
from mmbatch.sources.paths import LINKED_OUT_FILES
from mmbatch.types import MediaRef, Request, Sampling

PROMPT = "Describe this image."
SAMPLING = Sampling(max_tokens=12)
GOOD = ["sunset.jpg", "checkerboard.png", "shapes_alpha.png", "arrow_exif_rotated.jpg"]
QUIET = RunConfig(progress=False)


@pytest.fixture
def hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A datasets cache of this test's own: what ``load_dataset`` builds, and where the jobs
    of datasets held in memory go."""
    cache = tmp_path / "hf-cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(cache))
    return cache


@pytest.fixture
def photos(tmp_path: Path, samples: Path) -> Path:
    """A user's folder of pictures: the good samples, a corrupt one, and a copy of one."""
    folder = tmp_path / "photos"
    folder.mkdir()
    for name in [*GOOD, "truncated.jpg"]:
        shutil.copy(samples / name, folder / name)
    shutil.copy(samples / "sunset.jpg", folder / "sunset_again.jpg")
    return folder


def imagefolder(photos: Path, hf_cache: Path, **kwargs: Any) -> Any:
    ds = datasets.load_dataset(
        "imagefolder", data_dir=str(photos), split="train", cache_dir=str(hf_cache), **kwargs
    )
    return ds.cast_column("image", datasets.Image(decode=False))


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The models of the engines built from here on, each a fake one: a test that must build
    none shows it, and one that needs an engine only for bookkeeping gets a fast one."""
    from mmbatch.engine import builder, registry

    built: list[str] = []

    def fake(host, *args):  # type: ignore[no-untyped-def]
        built.append(host.config.model)
        return FakeEngine()

    monkeypatch.setattr(builder, "start_engine", fake)
    yield built
    for key, (engine, _) in list(registry._ENGINES.items()):
        if isinstance(engine, FakeEngine):  # kept by the registry: gone with the test
            del registry._ENGINES[key]
            close_pipeline(engine)


# -- which local paths a dataset's cells may name --------------------------------------


def test_each_way_of_building_a_dataset_has_the_origin_its_paths_come_from(
    photos: Path, hf_cache: Path, tmp_path: Path
) -> None:
    local = imagefolder(photos, hf_cache)
    in_memory = datasets.Dataset.from_dict({"image": [str(photos / "sunset.jpg")]})
    in_memory.to_parquet(str(tmp_path / "shared.parquet"))
    parquet = datasets.load_dataset(
        "parquet",
        data_files=str(tmp_path / "shared.parquet"),
        split="train",
        cache_dir=str(hf_cache),
    )
    # A saved folder handed over by someone else, whose info claims an imagefolder built it.
    local.save_to_disk(str(tmp_path / "saved"))
    saved = datasets.load_from_disk(str(tmp_path / "saved"))
    assert saved.info.builder_name == "imagefolder"
    streamed = datasets.load_dataset(
        "imagefolder", data_dir=str(photos), split="train", streaming=True
    )
    cases = {
        "imagefolder": local,
        "imagefolder after a map": local.map(lambda row: row),
        "imagefolder held in memory": imagefolder(photos, hf_cache, keep_in_memory=True),
        "from_dict": in_memory,
        "from_generator": datasets.Dataset.from_generator(
            _rows_of, gen_kwargs={"paths": ["a.jpg"]}, cache_dir=str(hf_cache)
        ),
        "streamed imagefolder": streamed,
        "from_dict, streamed": in_memory.to_iterable_dataset(),
        "parquet": parquet,
        "parquet, streamed": parquet.to_iterable_dataset(),
        "saved": saved,
        "parquet streamed from its file": datasets.load_dataset(
            "parquet", data_files=str(tmp_path / "shared.parquet"), split="train", streaming=True
        ),
    }
    trust = {name: origin_of(ds).trust for name, ds in cases.items()}
    assert trust == {
        "imagefolder": "listed",
        "imagefolder after a map": "listed",
        "imagefolder held in memory": "listed",
        "from_dict": "own",
        "from_generator": "own",
        "streamed imagefolder": "listed",
        "from_dict, streamed": "own",
        "parquet": "files",
        "parquet, streamed": "files",
        "saved": "files",
        "parquet streamed from its file": "files",
    }
    assert origin_of(saved).folders == (str(tmp_path / "saved"),)
    # The folder listed, and the data files' folder, whichever way the rows are read.
    for name in ("imagefolder", "imagefolder after a map", "streamed imagefolder"):
        assert origin_of(cases[name]).folder == str(photos), name
    for name in ("parquet", "parquet streamed from its file"):
        assert origin_of(cases[name]).folders == (str(tmp_path),), name
        assert origin_of(cases[name]).folder == str(tmp_path), name
    assert origin_of([1, 2]).trust == "unknown"


def _rows_of(paths: list[str]) -> Iterator[dict[str, str]]:
    for path in paths:
        yield {"image": path}


def test_the_dataset_a_map_runs_on_is_found_in_datasets_own_frames(
    photos: Path, hf_cache: Path, environ_kept: None
) -> None:
    local = imagefolder(photos, hf_cache)
    seen: list[str] = []

    def record(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        seen.append(origin_of(mapped_dataset()).trust)
        return {"n": [0] * len(batch["image"])}

    local.map(record, batched=True, batch_size=2)
    list(local.to_iterable_dataset().map(record, batched=True, batch_size=2))
    assert set(seen) == {"listed"}
    assert len(seen) == 3 + 3
    with_workers = local.map(
        lambda batch: {"trust": [origin_of(mapped_dataset()).trust] * len(batch["image"])},
        batched=True,
        num_proc=2,
    )
    assert set(with_workers["trust"]) == {"listed"}
    assert mapped_dataset() is None  # not inside a map


def test_a_map_over_an_imagefolder_reads_its_paths_and_files_from_elsewhere_stay_refused(
    photos: Path,
    hf_cache: Path,
    tmp_path: Path,
    builds: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The imagefolder's path cells are read (the rows go to the engine); a Parquet file
    from elsewhere whose cells name the same files is refused row by row, loudly, and starts
    no engine."""
    task = DatasetMap("fake", PROMPT)
    local = imagefolder(photos, hf_cache)
    assert local[0]["image"]["bytes"] is None  # a path cell
    out = local.map(task, batched=True, batch_size=3)
    assert all("not_allowed" not in e and "outside" not in e for e in out["error"])
    assert builds == ["fake"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cells = [{"bytes": None, "path": str(photos / n)} for n in GOOD]
    datasets.Dataset.from_dict({"image": cells}).to_parquet(str(elsewhere / "d.parquet"))
    shared = datasets.load_dataset(
        "parquet", data_files=str(elsewhere / "d.parquet"), split="train", cache_dir=str(hf_cache)
    )
    capsys.readouterr()
    for refused in (
        shared.map(task, batched=True, with_indices=True)["error"],
        run_dataset(shared, task, cache_dir=tmp_path / "jobs", run=QUIET)["error"],
    ):
        assert len(refused) == len(GOOD)
        for index, error in enumerate(refused):
            assert error.startswith(f"source: row {index}: {str(photos / GOOD[index])!r} leads")
            assert "allow another folder with DatasetMap(allowed_paths=[DIR])" in error
    said = capsys.readouterr().err
    assert "4 of 4 rows name files on this machine outside the folders allowed for" in said
    assert f"DatasetMap(..., allowed_paths=[{str(photos)!r}])" in said
    allowed = DatasetMap("fake", PROMPT, allowed_paths=[str(photos)])
    assert shared.map(allowed, batched=True)["error"] == [""] * len(GOOD)


def test_an_imagefolders_link_out_of_its_folder_is_not_read_by_any_face(
    photos: Path,
    hf_cache: Path,
    tmp_path: Path,
    samples: Path,
    builds: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A file symlink in an imagefolder that leads out of it: each datasets face makes its
    row an error, for the reason a walk of the command passes it over, and opens nothing
    there; links inside the folder (and across its subfolders) are read as the command
    reads them."""
    secret = tmp_path / "elsewhere" / "secret.png"
    secret.parent.mkdir()
    shutil.copy(samples / "checkerboard.png", secret)
    (photos / "out.png").symlink_to(secret)
    (photos / "sub").mkdir()
    (photos / "sub" / "same.jpg").symlink_to(photos / "sunset.jpg")
    opened: list[str] = []
    real_open = os.open

    def recorded(name: Any, *args: Any, **kwargs: Any) -> int:
        opened.append(os.path.realpath(name))
        return real_open(name, *args, **kwargs)

    monkeypatch.setattr(os, "open", recorded)
    ds = imagefolder(photos, hf_cache)
    names = [Path(c["path"]).relative_to(photos).as_posix() for c in ds["image"]]
    task = DatasetMap("fake", PROMPT)
    stream = datasets.load_dataset(
        "imagefolder", data_dir=str(photos), split="train", streaming=True
    ).cast_column("image", datasets.Image(decode=False))
    faces = {
        "map": ds.map(task, batched=True, batch_size=3, with_indices=True)["error"],
        "run_dataset": run_dataset(ds, task, cache_dir=tmp_path / "jobs", run=QUIET)["error"],
        "stream": [row["error"] for row in stream.map(task, batched=True, with_indices=True)],
    }
    out = names.index("out.png")
    for face, errors in faces.items():
        error = errors[out]
        assert error.startswith(f"source: row {out}: {str(photos / 'out.png')!r} leads to "), face
        assert f"out of the folder {photos} that was listed; {LINKED_OUT_FILES}" in error, face
        assert "allow where it leads with DatasetMap(allowed_paths=[DIR])" in error, face
        assert errors[names.index("sub/same.jpg")] == "", face
        assert errors[names.index("sunset.jpg")] == "", face
    assert str(secret) not in opened
    # The command passes the same link over, for the same reason.
    log = ListingLog()
    listed = image_requests([str(photos)], PROMPT, log=log)
    assert "out.png" not in {Path(r.id).name for r in listed}
    assert log.skipped[LINKED_OUT] == 1
    assert LINKED_OUT.startswith(LINKED_OUT_FILES)
    # Allowed where it leads, it is read.
    allowed = DatasetMap("fake", PROMPT, allowed_paths=[str(secret.parent)])
    assert ds.map(allowed, batched=True)["error"][out] == ""


def test_a_parquet_files_relative_cells_are_relative_to_its_folder_in_both_faces(
    tmp_path: Path,
    samples: Path,
    hf_cache: Path,
    builds: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Parquet loaded with ``load_dataset("parquet", data_files=...)``, its cells naming the
    pictures beside it (relative, and absolute), read from another working directory:
    captions, not refusals, from ``ds.map``, ``run_dataset`` and a stream, as ``mmbatch
    caption`` reads the file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    data = tmp_path / "data"
    (data / "pics").mkdir(parents=True)
    for name in GOOD:
        shutil.copy(samples / name, data / "pics" / name)
    cells = [{"bytes": None, "path": f"pics/{name}"} for name in GOOD[:-1]]
    cells.append({"bytes": None, "path": str(data / "pics" / GOOD[-1])})
    pq.write_table(pa.table({"image": pa.array(cells, image)}), data / "d.parquet")
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    load = {"data_files": str(data / "d.parquet"), "split": "train"}
    ds = datasets.load_dataset("parquet", cache_dir=str(hf_cache), **load)
    ds = ds.cast_column("image", datasets.Image(decode=False))
    stream = datasets.load_dataset("parquet", streaming=True, **load)
    stream = stream.cast_column("image", datasets.Image(decode=False))
    task = DatasetMap("fake", PROMPT)
    assert ds[0]["image"] == {"bytes": None, "path": "pics/sunset.jpg"}
    faces = {
        "map": ds.map(task, batched=True),
        "run_dataset": run_dataset(ds, task, cache_dir=tmp_path / "jobs", run=QUIET),
        "stream map": datasets.Dataset.from_list(list(stream.map(task, batched=True))),
        "stream run_dataset": run_dataset(stream, task, cache_dir=tmp_path / "s", run=QUIET),
    }
    for face, out in faces.items():
        assert out["error"] == [""] * len(GOOD), face
        assert len(set(out["text"])) == len(GOOD), face
    # The same texts as the command gives the file.
    argv = ["caption", str(data / "d.parquet"), "--image-column", "image", "--model", "fake"]
    argv += ["--prompt", PROMPT]
    assert main([*argv, "--no-progress", "--out", str(tmp_path / "o.jsonl")], FakeEngine()) == 0
    rows = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert [r["text"] for r in rows] == list(faces["map"]["text"])
    # A cell that leaves the data files' folder is still refused.
    (tmp_path / "secret.png").write_bytes((samples / "checkerboard.png").read_bytes())
    up = pa.array([{"bytes": None, "path": "../secret.png"}], image)
    pq.write_table(pa.table({"image": up}), data / "up.parquet")
    refused = datasets.load_dataset(
        "parquet", data_files=str(data / "up.parquet"), split="train", cache_dir=str(hf_cache)
    )
    [error] = refused.map(task, batched=True)["error"]
    assert f"leads to {tmp_path / 'secret.png'}, outside the input's folder {data}" in error


def test_a_call_that_cannot_see_its_dataset_stops_at_a_path_cell_with_the_fix(
    photos: Path, builds: list[str]
) -> None:
    batch = {"image": [{"bytes": None, "path": str(photos / "sunset.jpg")}]}
    with pytest.raises(ConfigError) as refused:
        DatasetMap("fake", PROMPT)(batch)
    message = str(refused.value)
    assert "\n" not in message
    assert f"DatasetMap(..., allowed_paths=[{str(photos)!r}])" in message
    assert "mmbatch.run_dataset" in message
    assert builds == []
    out = DatasetMap("fake", PROMPT, allowed_paths=[str(photos)])(batch)
    assert out["error"] == [""]


def test_a_task_never_overwrites_a_column_nor_reads_a_missing_one(photos: Path) -> None:
    ds = datasets.Dataset.from_dict({"image": [str(photos / "sunset.jpg")], "text": ["kept"]})
    with pytest.raises(ConfigError, match="already has a column 'text'"):
        run_dataset(ds, DatasetMap("fake", PROMPT))
    with pytest.raises(ConfigError, match="no column 'picture'"):
        run_dataset(ds, DatasetMap("fake", PROMPT, column="picture", text_column="caption"))


# -- the whole dataset as one job --------------------------------------------------------


def fake_job(cache: Path, out: Path, items: int, step: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(SCRIPTS / "dataset_job.py"), str(cache), str(out), str(items)],
        env=os.environ | {"FAKE_STEP_SECONDS": step},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def test_run_dataset_killed_at_any_moment_resumes_every_row_exactly_once(tmp_path: Path) -> None:
    """SIGKILL the whole-dataset face at random moments (start-up, mid-job, writing the
    columns), resume each time, and compare with an uninterrupted run: every row once in the
    job's rows, and the same columns."""
    items = 40
    whole = tmp_path / "whole.json"
    job = fake_job(tmp_path / "uninterrupted", whole, items, "0")
    assert job.wait(timeout=300) == 0, job.stderr.read().decode()[-3000:]  # type: ignore[union-attr]
    job.stderr.close()  # type: ignore[union-attr]
    expected = json.loads(whole.read_text())
    assert expected["error"][-1].startswith("decode:")
    assert expected["error"][:-1] == [""] * 39
    cache, out = tmp_path / "killed", tmp_path / "killed.json"
    rng = random.Random(7)
    kills = 0
    for delay in [rng.uniform(0.5, 4.0) for _ in range(6)]:
        job = fake_job(cache, out, items, "0.04")
        time.sleep(delay)
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            kills += 1
        job.wait(timeout=60)
        job.stderr.close()  # type: ignore[union-attr]
        assert not in_session(job.pid)
    assert kills >= 3
    job = fake_job(cache, out, items, "0")
    assert job.wait(timeout=300) == 0, job.stderr.read().decode()[-3000:]  # type: ignore[union-attr]
    job.stderr.close()  # type: ignore[union-attr]
    assert json.loads(out.read_text()) == expected
    [rows] = list(cache.rglob("rows.jsonl"))
    ids = [json.loads(line)["id"] for line in rows.read_text().splitlines()]
    assert ids == [str(i) for i in range(items)]  # each once, in input order


def test_a_finished_job_is_loaded_from_the_cache_and_load_from_cache_file_false_redoes_it(
    tmp_path: Path, builds: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from mmbatch.integrations import dataset_tables

    ds = datasets.Dataset.from_dict({"image": [b"\x89PNG not really", b"GIF8 neither"]})
    first = run_dataset(ds, DatasetMap("fake", PROMPT), cache_dir=tmp_path, run=QUIET)
    [columns] = list(tmp_path.rglob("columns.arrow"))
    written = columns.stat().st_mtime_ns
    ran: list[int] = []
    real = dataset_tables.run_task_job
    monkeypatch.setattr(
        dataset_tables,
        "run_task_job",
        lambda *a: ran.append(1) or real(*a),  # type: ignore[func-returns-value]
    )
    again = run_dataset(ds, DatasetMap("fake", PROMPT), cache_dir=tmp_path, run=QUIET)
    assert ran == []
    assert columns.stat().st_mtime_ns == written
    assert again["error"] == first["error"]
    assert again.column_names == ["image", "text", "error"]
    other = run_dataset(ds, DatasetMap("fake", "Tags."), cache_dir=tmp_path, run=QUIET)
    assert ran == [1]
    assert other.num_rows == 2
    run_dataset(ds, DatasetMap("fake", PROMPT), cache_dir=tmp_path, load_from_cache_file=False)
    assert ran == [1, 1]


def test_a_finished_jobs_columns_that_are_not_its_own_are_named_with_the_fix(
    tmp_path: Path, builds: list[str]
) -> None:
    """A ``columns.arrow`` cut short, another job's, an Arrow file of other columns and rows,
    or bytes that are no Arrow: one line naming the folder and how to run again, never
    pyarrow's or datasets' own exception; ``load_from_cache_file=False`` then runs it."""
    import pyarrow as pa

    ds = datasets.Dataset.from_dict({"image": pictures(3)})
    task = DatasetMap("fake", PROMPT)
    texts = list(run_dataset(ds, task, cache_dir=tmp_path / "jobs", run=QUIET)["text"])
    assert len(set(texts)) == 3
    [columns] = list((tmp_path / "jobs").rglob("columns.arrow"))
    good = columns.read_bytes()
    other = datasets.Dataset.from_dict({"image": pictures(2)})
    run_dataset(other, task, cache_dir=tmp_path / "other", run=QUIET)
    [others] = list((tmp_path / "other").rglob("columns.arrow"))
    foreign = tmp_path / "foreign.arrow"
    table = pa.table({"label": [1, 2, 3, 4, 5]})
    with pa.OSFile(str(foreign), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    corruptions = {
        "truncated": (good[: len(good) // 2], "it cannot be read"),
        "another job's": (others.read_bytes(), "it holds 2 rows, the dataset 3"),
        "foreign": (foreign.read_bytes(), "its columns are label, not text, error"),
        "garbage": (b"\x00garbage, not Arrow" * 50, "it cannot be read"),
    }
    for name, (data, why) in corruptions.items():
        columns.write_bytes(data)
        with pytest.raises(ConfigError) as refused:
            run_dataset(ds, task, cache_dir=tmp_path / "jobs", run=QUIET)
        message = str(refused.value)
        assert "\n" not in message, name
        assert f"the finished job's columns {columns} are not this job's ({why}" in message, name
        assert "run_dataset(..., load_from_cache_file=False)" in message, name
        assert str(columns.parent) in message, name
    # The record beside them says whose job the folder holds.
    columns.write_bytes(good)
    record = columns.parent / "rows.jsonl.job.json"
    kept = record.read_text()
    record.write_text(kept.replace(ds._fingerprint, "another dataset"))
    with pytest.raises(ConfigError, match=r"its job record rows.jsonl.job.json is another job's"):
        run_dataset(ds, task, cache_dir=tmp_path / "jobs", run=QUIET)
    record.write_text(kept)
    assert run_dataset(ds, task, cache_dir=tmp_path / "jobs", run=QUIET)["text"] == texts
    columns.write_bytes(b"garbage")
    again = run_dataset(
        ds, task, cache_dir=tmp_path / "jobs", load_from_cache_file=False, run=QUIET
    )
    assert list(again["text"]) == texts


def pictures(count: int) -> list[dict[str, Any]]:
    """``count`` distinct small PNGs as undecoded cells: the fake engine's text names each."""
    import io

    from PIL import Image

    cells = []
    for index in range(count):
        data = io.BytesIO()
        Image.new("RGB", (8, 8), (index * 40, 0, 0)).save(data, format="PNG")
        cells.append({"bytes": data.getvalue(), "path": f"p{index}.png"})
    return cells


@pytest.mark.parametrize("position", ["saved", "not savable"])
def test_a_stream_stopped_mid_window_resumes_with_every_row_once(
    tmp_path: Path,
    builds: list[str],
    monkeypatch: pytest.MonkeyPatch,
    position: str,
) -> None:
    """Stopped while writing the second of three windows, then run again: the first window
    is not read or run again, and every row of the stream is in the result once, in order.
    A stream whose position cannot be saved is read past the windows already written."""
    monkeypatch.setattr(dataset_streams, "WINDOW_ROWS", 2)
    if position == "not savable":

        def no_state(self: Any) -> Any:
            raise NotImplementedError("no state for this stream")

        monkeypatch.setattr(datasets.IterableDataset, "state_dict", no_state)
    cells = pictures(6)
    table = datasets.Dataset.from_dict({"image": cells})
    table = table.cast_column("image", datasets.Image(decode=False))
    task = DatasetMap("fake", PROMPT)
    whole = run_dataset(table.to_iterable_dataset(), task, cache_dir=tmp_path / "w", run=QUIET)
    assert whole["error"] == [""] * 6
    assert len(set(whole["text"])) == 6
    real_write = dataset_streams._write_window
    writes: list[str] = []

    def stop_in_the_second(rows: Any, raw: Any, path: Path) -> int:
        writes.append(path.name)
        if len(writes) == 2:
            next(rows)  # one row of the window read, then the job is stopped
            raise KeyboardInterrupt
        return real_write(rows, raw, path)

    monkeypatch.setattr(dataset_streams, "_write_window", stop_in_the_second)
    cache = tmp_path / "stopped"
    with pytest.raises(KeyboardInterrupt):
        run_dataset(table.to_iterable_dataset(), task, cache_dir=cache, run=QUIET)
    monkeypatch.setattr(dataset_streams, "_write_window", real_write)
    [folder] = [p.parent for p in cache.rglob("stream.json")]
    saved = json.loads((folder / "stream.json").read_text())
    assert (saved["windows"], saved["ended"]) == (1, False)
    assert (saved["position"] is None) == (position == "not savable")
    [first] = list(folder.glob("jobs/*/columns.arrow"))
    done = first.stat().st_mtime_ns
    real_resumed = dataset_streams._resumed
    read: list[str] = []

    def recorded(*args: Any) -> Iterator[dict[str, Any]]:
        for row in real_resumed(*args):
            read.append(row["image"]["path"])
            yield row

    monkeypatch.setattr(dataset_streams, "_resumed", recorded)
    out = run_dataset(table.to_iterable_dataset(), task, cache_dir=cache, run=QUIET)
    assert [c["path"] for c in out["image"]] == [c["path"] for c in cells]
    assert out["text"] == whole["text"]
    assert out["error"] == [""] * 6
    assert first.stat().st_mtime_ns == done  # the first window's job was not run again
    # Read on from where the stream stood; a stream that cannot say where reads past the
    # rows of the windows written (they are not in what is yielded).
    assert read == [c["path"] for c in cells[2:]]
    jobs = sorted(folder.glob("jobs/*/rows.jsonl"))
    assert [len(f.read_text().splitlines()) for f in jobs] == [2, 2, 2]


# -- the tiny model ----------------------------------------------------------------------


def texts_alone(engine: Any, photos: Path) -> dict[str, str]:
    """Each picture captioned alone, from its file: what every face must give it."""
    texts = {}
    for path in sorted(photos.iterdir()):
        sink = MemorySink()
        request = Request(path.name, PROMPT, (MediaRef("image", str(path)),))
        run_requests([request], engine, MediaOptions(), sink, SAMPLING, QUIET)
        [row] = sink.rows
        texts[path.name] = row["text"] if row["error"] is None else "error"
    return texts


def tiny_task(model: Path, **kwargs: Any) -> DatasetMap:
    return DatasetMap(
        str(model), PROMPT, engine_kwargs=TINY_ENGINE_KWARGS, sampling=SAMPLING, **kwargs
    )


@pytest.mark.slow
def test_both_faces_give_each_row_of_an_imagefolder_the_text_it_gets_alone(
    vl_engine: Any, tiny_vl_model: Path, photos: Path, hf_cache: Path
) -> None:
    alone = texts_alone(vl_engine, photos)
    assert len(set(alone.values())) >= 4  # or a swapped caption could not be seen
    ds = imagefolder(photos, hf_cache)
    names = [Path(cell["path"]).name for cell in ds.with_format("arrow")["image"].to_pylist()]
    whole = run_dataset(ds, tiny_task(tiny_vl_model), run=QUIET)
    mapped = ds.map(tiny_task(tiny_vl_model), batched=True, batch_size=2)
    for out in (whole, mapped):
        for name, text, error in zip(names, out["text"], out["error"], strict=True):
            if alone[name] == "error":
                assert error.startswith("decode: corrupt or unsupported image"), name
            else:
                assert (error, text) == ("", alone[name]), name
    assert whole.column_names == ["image", "text", "error"]
    # The whole job planned the copy with its original and answered it once.
    [summary] = list(hf_cache.rglob("rows.jsonl.summary.json"))
    assert json.loads(summary.read_text())["stats"]["answered_by_identical"] == 1


@pytest.mark.slow
def test_streams_run_in_windows_with_both_faces_and_resume_from_the_last_window(
    vl_engine: Any,
    tiny_vl_model: Path,
    photos: Path,
    hf_cache: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    alone = texts_alone(vl_engine, photos)
    monkeypatch.setattr(dataset_streams, "WINDOW_ROWS", 2)

    def stream() -> Any:
        s = datasets.load_dataset(
            "imagefolder", data_dir=str(photos), split="train", streaming=True
        )
        return s.cast_column("image", datasets.Image(decode=False))

    names = [Path(row["image"]["path"]).name for row in stream()]
    mapped = list(stream().map(tiny_task(tiny_vl_model), batched=True, batch_size=4))
    assert [row["text"] or "error" for row in mapped] == [alone[n] for n in names]
    # Stopped after its second window, then run again: the first two windows are not read
    # or run again, and the result is the whole stream's.
    real_run = dataset_streams._run_window
    windows: list[str] = []

    def stop_at_the_third(path: Path, *args: Any) -> Any:
        windows.append(path.name)
        if len(windows) == 3:
            raise KeyboardInterrupt
        return real_run(path, *args)

    monkeypatch.setattr(dataset_streams, "_run_window", stop_at_the_third)
    with pytest.raises(KeyboardInterrupt):
        run_dataset(stream(), tiny_task(tiny_vl_model), run=QUIET)
    monkeypatch.setattr(dataset_streams, "_run_window", real_run)
    [folder] = [p.parent for p in hf_cache.rglob("stream.json")]
    done = {p.parent.name: p.stat().st_mtime_ns for p in folder.glob("jobs/*/columns.arrow")}
    assert len(done) == 2, sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))
    out = run_dataset(stream(), tiny_task(tiny_vl_model), run=QUIET)
    after = {p.parent.name: p.stat().st_mtime_ns for p in folder.glob("jobs/*/columns.arrow")}
    assert len(after) == 3
    assert all(after[name] == mtime for name, mtime in done.items())
    assert len(list(folder.glob("window-*.arrow"))) == 3  # 6 rows, 2 a window
    assert [t or "error" for t in out["text"]] == [alone[n] for n in names]
    assert [Path(c["path"]).name for c in out["image"]] == names


@pytest.mark.slow
def test_video_and_audio_columns_work_like_pictures(
    tiny_vl_model: Path, tiny_audio_model: Path, samples: Path, tmp_path: Path
) -> None:
    clip = {"bytes": (samples / "clip.mp4").read_bytes(), "path": "clip.mp4"}
    videos = datasets.Dataset.from_dict({"video": [clip, {"bytes": b"nope", "path": "x.mp4"}]})
    videos = videos.cast_column("video", datasets.Video(decode=False))
    task = tiny_task(tiny_vl_model, column="video")
    out = run_dataset(videos, task, cache_dir=tmp_path, run=QUIET)
    assert out["error"][0] == ""
    assert out["text"][0]
    assert out["error"][1].startswith("decode:")
    sound = {"bytes": (samples / "tone.wav").read_bytes(), "path": "tone.wav"}
    voices = datasets.Dataset.from_dict({"audio": [sound]})
    voices = voices.cast_column("audio", datasets.Audio(decode=False))
    heard = run_dataset(voices, tiny_task(tiny_audio_model, column="audio"), cache_dir=tmp_path)
    mapped = voices.map(tiny_task(tiny_audio_model, column="audio"), batched=True)
    assert heard["error"] == mapped["error"] == [""]
    assert heard["text"] == mapped["text"]


@pytest.mark.slow
def test_the_readme_datasets_example_runs_as_written(
    tiny_vl_model: Path, photos: Path, tmp_path: Path
) -> None:
    """The README's datasets example is an imagefolder mapped by ``DatasetMap``:
    that code, run as it is in a folder holding ``photos/`` and the tiny model as
    ``.tiny``, captions every picture (the corrupt one is its row's error), and prints none
    of vLLM's log (about 120 lines once): it goes to a file of its own, as the command's
    goes to ``OUT.vllm.log``, and stderr says where; nor what transformers logs at
    ``TRANSFORMERS_VERBOSITY=info`` as the model's processor loads, in this process and in
    the engine's: that goes to the same file."""
    section = README.read_text(encoding="utf-8").split("**Hugging Face datasets:**", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    (tmp_path / ".tiny").symlink_to(tiny_vl_model)
    script = tmp_path / "example.py"
    script.write_text(code.group(1) + "\n    print(list(out['error']))\n")
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=os.environ
        | {
            "HF_DATASETS_CACHE": str(tmp_path / "hf-cache"),
            "MMBATCH_CACHE_DIR": str(tmp_path),
            "TRANSFORMERS_VERBOSITY": "info",
        },
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    errors = ast.literal_eval(proc.stdout.strip().splitlines()[-1])  # the printed column
    assert len(errors) == len(GOOD) + 2
    assert sorted(bool(e) for e in errors) == [False] * (len(GOOD) + 1) + [True]
    vllm_line = re.compile(r"\b(INFO|WARNING|DEBUG) (\d{4}-)?\d\d-\d\d \d\d:\d\d")
    assert not vllm_line.search(proc.stderr), proc.stderr[-3000:]
    [said] = [line for line in proc.stderr.splitlines() if "its log goes to" in line]
    [log] = list((tmp_path / "logs").iterdir())
    assert str(log) in said
    assert len(vllm_line.findall(log.read_text())) > 20
    assert "[transformers]" not in proc.stderr, proc.stderr[-3000:]
    assert "transformers.configuration_utils] loading configuration file" in log.read_text()
