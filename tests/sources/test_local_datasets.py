"""Local Hugging Face datasets as inputs: every format yields the stored bytes, row by row."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path
from typing import Any
from unittest import mock

import datasets
import pytest

from mmbatch.cli import EXIT_JOB_FAILED, main
from mmbatch.errors import SourceError
from mmbatch.sources.local_datasets import DatasetInput, dataset_requests, detect_format
from mmbatch.types import Request

NAMES = ["sunset.jpg", "checkerboard.png", "arrow_exif_rotated.jpg", "truncated.jpg"]


def image_dataset(samples: Path) -> datasets.Dataset:
    """The samples as stored bytes, with a caption id column and one row with no image."""
    cells = [{"bytes": (samples / n).read_bytes(), "path": n} for n in NAMES] + [None]
    ds = datasets.Dataset.from_dict({"picture": cells, "key": [f"k{i}" for i in range(len(cells))]})
    return ds.cast_column("picture", datasets.Image())


@pytest.fixture
def on_disk(tmp_path: Path, samples: Path) -> Path:
    image_dataset(samples).save_to_disk(str(tmp_path / "disk"))
    return tmp_path / "disk"


@pytest.fixture
def parquet_file(tmp_path: Path, samples: Path) -> Path:
    image_dataset(samples).to_parquet(str(tmp_path / "data.parquet"))
    return tmp_path / "data.parquet"


@pytest.fixture
def image_folder(tmp_path: Path, samples: Path) -> Path:
    folder = tmp_path / "imagefolder"
    folder.mkdir()
    with (folder / "metadata.jsonl").open("w") as handle:
        for name in NAMES:
            shutil.copyfile(samples / name, folder / name)
            handle.write(json.dumps({"file_name": name, "key": name}) + "\n")
    return folder


JPGS = ["sunset.jpg", "arrow_exif_rotated.jpg", "truncated.jpg"]


@pytest.fixture
def tars(tmp_path: Path, samples: Path) -> Path:
    """Two shards; each sample has a photo (.jpg), a second picture (.png) and metadata."""
    folder = tmp_path / "shards"
    folder.mkdir()
    for shard, names in enumerate((JPGS[:2], JPGS[2:])):
        with tarfile.open(folder / f"shard-{shard}.tar", "w") as tar:
            for name in names:
                stem = name.rsplit(".", 1)[0]
                for member, data in (
                    (f"{stem}.jpg", (samples / name).read_bytes()),
                    (f"{stem}.png", (samples / "checkerboard.png").read_bytes()),
                    (f"{stem}.json", json.dumps({"key": name}).encode()),
                ):
                    info = tarfile.TarInfo(member)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return folder


def stored_bytes(requests) -> list[bytes]:  # type: ignore[no-untyped-def]
    return [r.media[0].data for r in requests]


def split(requests: list[Request]) -> tuple[list[Request], list[Request]]:
    """The requests to run, and those whose rows are errors already (no usable picture)."""
    return [r for r in requests if r.error is None], [r for r in requests if r.error]


def test_save_to_disk_folder(on_disk: Path, samples: Path) -> None:
    assert detect_format(str(on_disk)) == "disk"
    spec = DatasetInput(str(on_disk), "disk", id_column="key")
    requests, unusable = split(dataset_requests(spec, "Describe."))
    assert [r.id for r in requests] == ["k0", "k1", "k2", "k3"]
    assert stored_bytes(requests) == [(samples / n).read_bytes() for n in NAMES]
    # Views into the memory-mapped Arrow file, not copies of every picture.
    assert all(isinstance(data, memoryview) for data in stored_bytes(requests))
    assert requests[0].media[0].source == f"{on_disk}#0 (sunset.jpg)"
    assert requests[3].media[0].source == f"{on_disk}#3 (truncated.jpg)"
    assert all(r.prompt == "Describe." for r in requests)
    # The row with no image is an error row, not a crash and not a lost row.
    [failed] = unusable
    assert failed.id == "k4"
    assert failed.error is not None
    assert failed.error.stage == "source"
    assert failed.error.message == f"{on_disk}#4: no image (the cell is empty)"


def test_parquet_file_and_folder(parquet_file: Path, samples: Path) -> None:
    for path in (parquet_file, parquet_file.parent):
        assert detect_format(str(path)) == "parquet"
        requests, unusable = split(dataset_requests(DatasetInput(str(path), "parquet"), "p"))
        assert [r.id for r in requests] == ["0", "1", "2", "3"]
        assert stored_bytes(requests) == [(samples / n).read_bytes() for n in NAMES]
        assert [f.id for f in unusable] == ["4"]


def test_imagefolder_with_metadata(image_folder: Path, samples: Path) -> None:
    assert detect_format(str(image_folder)) == "imagefolder"
    spec = DatasetInput(str(image_folder), "imagefolder", id_column="key")
    requests, unusable = split(dataset_requests(spec, "p"))
    assert unusable == []
    by_id = {r.id: r.media[0] for r in requests}
    assert sorted(by_id) == sorted(NAMES)
    for name, ref in by_id.items():
        # imagefolder cells name the file: read by path, the loader hashes its bytes.
        content = ref.data if ref.data is not None else Path(ref.source).read_bytes()
        assert content == (samples / name).read_bytes()


def test_webdataset_tars_need_the_column_named(tars: Path, samples: Path) -> None:
    assert detect_format(str(tars)) == "webdataset"
    # Two image columns (jpg and png): which one to caption must be said.
    with pytest.raises(SourceError, match="several image columns"):
        dataset_requests(DatasetInput(str(tars), "webdataset"), "p")
    requests, unusable = split(
        dataset_requests(DatasetInput(str(tars), "webdataset", image_column="jpg"), "p")
    )
    assert unusable == []
    assert stored_bytes(requests) == [(samples / n).read_bytes() for n in JPGS]


def test_a_plain_picture_folder_is_read_by_path(samples: Path) -> None:
    assert detect_format(str(samples)) is None
    assert detect_format(str(samples / "sunset.jpg")) is None


def test_bad_column_and_split_are_named(on_disk: Path, tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="no column 'photo'; columns: picture, key"):
        dataset_requests(DatasetInput(str(on_disk), "disk", image_column="photo"), "p")
    both = datasets.DatasetDict(
        {"a": datasets.load_from_disk(str(on_disk)), "b": datasets.load_from_disk(str(on_disk))}
    )
    both.save_to_disk(str(tmp_path / "dict"))
    assert detect_format(str(tmp_path / "dict")) == "disk"
    with pytest.raises(SourceError, match="has splits a, b: pick one with --split"):
        dataset_requests(DatasetInput(str(tmp_path / "dict"), "disk"), "p")
    requests = dataset_requests(DatasetInput(str(tmp_path / "dict"), "disk", split="b"), "p")
    assert len(requests) == 5  # four pictures and the empty cell, whose row is an error
    assert [r.id for r in requests if r.error is not None] == ["4"]


def caption_argv(tmp_path: Path, *inputs: Path | str) -> list[str]:
    return ["caption", *map(str, inputs), "--model", "no-such-model", "--out", str(tmp_path / "o")]


def test_caption_checks_dataset_options_before_any_engine(
    on_disk: Path,
    samples: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each fails with its own message, not with "cannot load no-such-model": options that
    # fit no such input are said before an engine begins; a column or split the dataset
    # lacks once it is read (a dataset's size is known only then, so no engine begins
    # before it is read).
    from fake_engine import FakeEngine
    from processes import starts_ended

    from mmbatch.engine import registry

    begun: list[str] = []

    def begin(host: Any, media: Any, layout: Any) -> tuple[FakeEngine, Any]:
        begun.append(host.config.model)
        return FakeEngine(), layout

    monkeypatch.setattr(registry, "shared_engine_and_layout", begin)
    closed = mock.patch.object(FakeEngine, "close", autospec=True)
    cases = [
        ([*caption_argv(tmp_path, on_disk), "--image-column", "nope"], "no column 'nope'"),
        (caption_argv(tmp_path, on_disk, samples), "a dataset is read one at a time"),
        (
            [*caption_argv(tmp_path, samples), "--image-column", "image"],
            "apply to datasets only",
        ),
        ([*caption_argv(tmp_path, on_disk), "--split", "test"], "holds a single split"),
    ]
    with closed as close:
        for argv, message in cases:
            assert main(argv) == EXIT_JOB_FAILED, argv
            assert message in capsys.readouterr().err
        starts_ended()
    assert not (tmp_path / "o").exists()
    assert len(begun) == close.call_count == 0


def anonymous_mib() -> int:
    """This process's resident memory that is not file pages (copies, not mappings)."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("RssAnon:"))
    return int(line.split()[1]) // 1024


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_listing_a_dataset_does_not_copy_its_media(tmp_path: Path) -> None:
    import os

    cells = [{"bytes": os.urandom(400_000), "path": f"{i}.jpg"} for i in range(100)]
    datasets.Dataset.from_dict({"image": cells}).cast_column(
        "image", datasets.Image()
    ).save_to_disk(str(tmp_path / "big"))
    del cells
    before = anonymous_mib()
    requests = dataset_requests(DatasetInput(str(tmp_path / "big"), "disk"), "p")
    grown = anonymous_mib() - before
    assert sum(len(r.media[0].data) for r in requests) == 100 * 400_000  # 38 MiB listed
    assert grown < 10, f"{grown} MiB copied"
