"""Ray across machines, with the data where every node can reach it: a local Ray cluster whose
actors reach the inputs only by URL (the local copies are gone before the job starts) and
whose writers put the output in the store, against the tests' S3 server. The driver lists
URLs; the actors read the pictures from the store; a Parquet dataset kept in the store is
read by Ray's tasks, not by the driver. The rows are the local runner's for the same
pictures, and a rerun resumes from the store.

Each test starts a vLLM engine in a Ray actor (the tiny model on vLLM's CPU build): minutes,
so they are few.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import TINY_ENGINE_FLAGS
from s3_server import Bucket, S3Server

from mmbatch.cli import EXIT_ITEMS_FAILED, main
from mmbatch.jobs import Job, run_in_memory
from mmbatch.pipeline import RunConfig
from mmbatch.sources.local_datasets import DatasetInput, dataset_requests
from mmbatch.types import MediaRef, Request, Sampling

PICTURES = ("sunset.jpg", "sunset_copy.jpg", "checkerboard.png", "truncated.jpg")
PROMPT = "Describe this image."


@pytest.fixture(scope="module")
def ray_reaching_s3(s3_server: S3Server) -> Iterator[Any]:
    """A local Ray cluster whose workers find the store as every node of a real cluster
    does: through the standard AWS environment, their own."""
    import ray

    saved = dict(os.environ)
    os.environ.update(s3_server.environment())
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()
        os.environ.clear()
        os.environ.update(saved)


def ray_argv(inputs: str, out: str, model: Path) -> list[str]:
    return [
        "caption",
        inputs,
        "--model",
        str(model),
        "--out",
        out,
        "--prompt",
        PROMPT,
        "--max-tokens",
        "8",
        *TINY_ENGINE_FLAGS,
        "--ray",
        "--gpus-per-replica",
        "0",
        "--no-progress",
    ]


def rows_in_store(s3: Bucket, folder: str) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for key in s3.keys(folder):
        if Path(key).name.startswith((".", "_")):
            continue
        for line in s3.get(key).splitlines():
            row = json.loads(line)
            assert row["id"] not in rows, f"two rows for {row['id']}"
            rows[row["id"]] = row
    return rows


def local_rows(engine: Any, requests: list[Request]) -> dict[str, dict[str, Any]]:
    job = Job(requests, Sampling(max_tokens=8))
    rows, _ = run_in_memory(job, engine, RunConfig(progress=False))
    return {row["id"]: row for row in rows}


@pytest.mark.ray
@pytest.mark.slow
def test_ray_reads_pictures_by_url_writes_to_the_store_and_resumes_there(
    ray_reaching_s3: Any,
    s3: Bucket,
    samples: Path,
    tiny_vl_model: Path,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
) -> None:
    staged = tmp_path / "staged"
    staged.mkdir()
    for name in PICTURES:
        shutil.copyfile(samples / name, staged / name)
    prefix = s3.upload(staged, "in")
    shutil.rmtree(staged)  # the store holds the only copies the job may read
    argv = ray_argv(prefix, s3.url("ray-out"), tiny_vl_model)
    assert main(argv) == EXIT_ITEMS_FAILED  # truncated.jpg
    rows = rows_in_store(s3, "ray-out")
    assert sorted(rows) == sorted(f"{prefix}/{name}" for name in PICTURES)
    for side in ("ray-out.job.json", "ray-out.summary.json", "ray-out.quarantine.jsonl"):
        assert side in s3.keys("")
    summary = json.loads(s3.get("ray-out.summary.json"))
    assert summary["output"] == s3.url("ray-out")
    assert summary["stats"]["failed"] == 1

    local = local_rows(
        request.getfixturevalue("vl_engine"),
        [Request(n, PROMPT, (MediaRef("image", str(samples / n)),)) for n in PICTURES],
    )
    for name in PICTURES:
        mine, theirs = rows[f"{prefix}/{name}"], local[name]
        assert mine["media_hash"] == theirs["media_hash"], name
        assert mine["text"] == theirs["text"], name
        assert (mine["error"] or {}).get("stage") == (theirs["error"] or {}).get("stage")

    capsys.readouterr()
    assert main(argv) == EXIT_ITEMS_FAILED  # nothing left to do: no actor starts
    assert f"resuming {s3.url('ray-out')}: 4 items already have a row" in capsys.readouterr().err
    assert rows_in_store(s3, "ray-out") == rows


@pytest.mark.ray
@pytest.mark.slow
def test_ray_reads_a_parquet_dataset_kept_in_the_store_in_its_tasks(
    ray_reaching_s3: Any,
    s3: Bucket,
    samples: Path,
    tiny_vl_model: Path,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    import datasets

    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("string")})
    cells = [{"bytes": (samples / n).read_bytes(), "path": n} for n in PICTURES]
    table = datasets.Dataset.from_dict({"image": cells, "label": list(PICTURES)}, features)
    local = tmp_path / "dataset"
    local.mkdir()
    table.select(range(2)).to_parquet(str(local / "train-00000.parquet"))
    table.select(range(2, 4)).to_parquet(str(local / "train-00001.parquet"))
    url = s3.upload(local, "datasets/pictures")

    assert main(ray_argv(url, s3.url("ray-ds"), tiny_vl_model)) == EXIT_ITEMS_FAILED
    rows = rows_in_store(s3, "ray-ds")
    assert sorted(rows) == ["0", "1", "2", "3"]  # ids: the rows' indices, across both files
    spec = DatasetInput(str(local), "parquet")
    mine = local_rows(request.getfixturevalue("vl_engine"), dataset_requests(spec, PROMPT, keep=()))
    for item_id, row in rows.items():
        assert row["media_hash"] == mine[item_id]["media_hash"], item_id
        assert row["text"] == mine[item_id]["text"], item_id
        assert row["source"].startswith(f"{url}/train-0000")
    assert rows["3"]["error"]["stage"] == "decode"  # truncated.jpg
