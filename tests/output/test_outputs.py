"""Output formats: JSONL, Parquet and a datasets folder hold the same rows; the summary."""

from __future__ import annotations

from contextlib import closing
from pathlib import Path

import datasets
import pyarrow.parquet as pq
import pytest
from fake_engine import FakeEngine

from mmbatch.errors import ConfigError
from mmbatch.jobs import Job, run_job
from mmbatch.output import tables as table_sinks
from mmbatch.output.file_output import FileOutput
from mmbatch.output.formats import output_format, read_output
from mmbatch.output.paths import OutputPaths
from mmbatch.output.summary import read_summary, write_summary
from mmbatch.output.tables import TableSink
from mmbatch.pipeline import RunConfig
from mmbatch.sources.files import image_requests
from mmbatch.types import Sampling


def test_the_format_follows_the_name_unless_asked() -> None:
    assert output_format("x.parquet") == "parquet"
    assert output_format("x.PARQUET") == "parquet"
    assert output_format("x.jsonl") == "jsonl"
    assert output_format("captions") == "jsonl"
    assert output_format("captions", "datasets") == "datasets"
    with pytest.raises(ConfigError, match="unknown output format 'csv'"):
        output_format("x", "csv")


def job_rows(samples: Path, out: Path, fmt: str) -> list[dict]:  # type: ignore[no-untyped-def]
    """A real job over the samples (a fake engine): ok rows and a decode error row."""
    job = Job(image_requests([str(samples)], "Describe."), Sampling())
    run_job(job, FakeEngine(), FileOutput.at(out, fmt), RunConfig(progress=False))
    return list(read_output(out))


@pytest.mark.parametrize("fmt", ["parquet", "datasets"])
def test_columnar_outputs_hold_the_jsonl_rows(samples: Path, tmp_path: Path, fmt: str) -> None:
    reference = job_rows(samples, tmp_path / "rows.jsonl", "jsonl")
    target = tmp_path / ("rows.parquet" if fmt == "parquet" else "rows")
    rows = job_rows(samples, target, fmt)
    assert sorted(rows, key=lambda r: r["id"]) == sorted(reference, key=lambda r: r["id"])
    errors = [r for r in rows if r["error"]]
    assert [Path(r["id"]).name for r in errors] == ["truncated.jpg"]
    assert errors[0]["error"]["stage"] == "decode"
    assert not OutputPaths(target).spool.exists()  # the spool is gone once converted
    if fmt == "parquet":
        assert pq.read_schema(target).field("text").type == "string"
    else:
        loaded = datasets.load_from_disk(str(target))
        assert loaded.num_rows == len(reference)
        assert loaded.features["error"]["stage"] == datasets.Value("string")


@pytest.mark.parametrize("fmt", ["parquet", "datasets"])
def test_columns_null_in_early_rows_keep_their_later_type(
    tmp_path: Path, fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Several conversion chunks, the first ones all without an error, the last without text.
    monkeypatch.setattr(table_sinks, "ROWS_PER_CHUNK", 100)
    target = tmp_path / ("big.parquet" if fmt == "parquet" else "big")
    count = 350
    with closing(TableSink(target, fmt)) as sink:  # type: ignore[arg-type]
        for i in range(count):
            late = i >= count - 2
            sink.write(
                {
                    "id": str(i),
                    "text": None if late else f"t{i}",
                    "error": {"stage": "decode", "message": "bad"} if late else None,
                }
            )
    rows = list(read_output(target))
    assert len(rows) == count
    assert rows[0] == {"id": "0", "text": "t0", "error": None}
    assert rows[-1] == {
        "id": str(count - 1),
        "text": None,
        "error": {"stage": "decode", "message": "bad"},
    }


@pytest.mark.parametrize("fmt", ["parquet", "datasets", "shards"])
def test_outputs_with_and_without_errors_have_one_schema(
    samples: Path, tmp_path: Path, fmt: str
) -> None:
    """An output in which no row failed types its ``error`` column as one with failures
    does (not ``null``), so the two read and concatenate as one table."""
    import pyarrow as pa

    tables = []
    for name, inputs in (("good", ["sunset.jpg", "checkerboard.png"]), ("bad", ["truncated.jpg"])):
        job = Job(image_requests([str(samples / i) for i in inputs], "Describe."), Sampling())
        target = tmp_path / (f"{name}.parquet" if fmt == "parquet" else name)
        shards = 1 if fmt == "shards" else None
        out = FileOutput.at(target, "parquet" if fmt == "shards" else fmt, shard_rows=shards)
        run_job(job, FakeEngine(), out, RunConfig(progress=False))
        if fmt == "datasets":
            loaded = datasets.load_from_disk(str(target))
            assert loaded.features["error"]["kind"] == datasets.Value("string")
            tables.append(loaded.data.table)
        else:  # a file, or a folder of shards
            tables.append(pq.read_table(target))
    good, bad = tables
    assert good.schema == bad.schema
    merged = pa.concat_tables([good, bad])
    assert merged.column("error").to_pylist()[-1]["kind"] == "corrupt"
    # Every row failed: the text column is still text.
    assert pa.types.is_string(bad.schema.field("text").type)


def test_a_columnar_output_replaces_an_older_one(tmp_path: Path) -> None:
    for text in ("first", "second"):
        with closing(TableSink(tmp_path / "out", "datasets")) as sink:
            sink.write({"id": "a", "text": text})
    assert list(read_output(tmp_path / "out")) == [{"id": "a", "text": "second"}]


def test_summary_sits_beside_the_output(tmp_path: Path) -> None:
    out = tmp_path / "captions.jsonl"
    paths = OutputPaths(out)
    assert read_summary(paths) is None
    written = write_summary(paths, {"total": 3, "ok": 2}, {"model": "m"})
    assert paths.summary == tmp_path / "captions.jsonl.summary.json"
    summary = read_summary(paths)
    assert summary is not None
    assert written == summary  # what --json prints is what the file holds
    assert summary["stats"] == {"total": 3, "ok": 2}
    assert summary["job"] == {"model": "m"}
    assert written["output"] == str(out)


def test_an_outputs_files_keep_their_names(tmp_path: Path) -> None:
    """Every file beside an output, by the names earlier versions gave them: an output
    written before resumes only if its record, spool and summary are found again."""
    names = {
        "record": "x.parquet.job.json",
        "summary": "x.parquet.summary.json",
        "quarantine": "x.parquet.quarantine.jsonl",
        "vllm_log": "x.parquet.vllm.log",
        "spool": "x.parquet.rows.jsonl",
        "temporary": ".x.parquet.tmp",
    }
    paths = OutputPaths(tmp_path / "x.parquet", "parquet")
    assert {name: getattr(paths, name) for name in names} == {
        name: tmp_path / file for name, file in names.items()
    }
    assert paths.progress == paths.spool  # a columnar output resumes from its spool
    assert OutputPaths(tmp_path / "x.jsonl").progress == tmp_path / "x.jsonl"
    folder = OutputPaths(tmp_path / "rows", "parquet", row_folder=True)  # Ray's: no spool
    assert folder.progress == tmp_path / "rows"
    assert folder.summary == tmp_path / "rows.summary.json"
