"""The Ray Data runner on a real local Ray (``ray.init(num_cpus=2)``), and its pieces that
need no cluster.

The end-to-end test runs the command line with ``--ray`` and the tiny model on vLLM's CPU
build in one Ray actor, over repeated media, a corrupt and a missing file, with rows of an
earlier run already in the output folder, and checks every id's text against the local
path's run of the same requests.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from conftest import TINY_ENGINE_FLAGS
from PIL import Image
from processes import in_session, leaked_shared_memory, left_after, shared_memory

from mmbatch.cli import (
    EXIT_INTERRUPTED,
    EXIT_ITEMS_FAILED,
    EXIT_JOB_FAILED,
    EXIT_OK,
    EXIT_TERMINATED,
    main,
)
from mmbatch.cli.run import recipe_job
from mmbatch.engine.config import EngineConfig
from mmbatch.errors import ConfigError
from mmbatch.jobs import Job, run_in_memory
from mmbatch.media.hashing import media_key
from mmbatch.media.options import ImageOptions
from mmbatch.output.folders import read_folder
from mmbatch.output.rows import FLAT, output_row
from mmbatch.output.stats import JobStats
from mmbatch.pipeline import RunConfig
from mmbatch.types import MediaRef, Request, Result, Sampling


@pytest.fixture(scope="module")
def local_ray():  # type: ignore[no-untyped-def]
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def caption_requests(samples: Path, folder: Path) -> list[Request]:
    """Each sample under two prompts (so pictures repeat, also under two file names), plus
    a file that does not exist and an empty one; samples/ holds a truncated JPEG (and a clip
    and a wav, left out: this job is about pictures)."""
    (folder / "empty.jpg").write_bytes(b"")
    pictures = [p for p in sorted(samples.iterdir()) if p.suffix not in (".mp4", ".wav")]
    paths = [*pictures, folder / "missing.jpg", folder / "empty.jpg"]
    prompts = ["Describe this image.", "List three tags."]
    return [
        Request(f"{p}-{path.name}", prompt, (MediaRef("image", str(path)),))
        for p, prompt in enumerate(prompts)
        for path in paths
    ]


def write_manifest(requests: list[Request], path: Path) -> None:
    rows = [{"id": r.id, "path": r.media[0].source, "prompt": r.prompt} for r in requests]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def rows_on_disk(folder: Path) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for file in sorted(folder.glob("[!.]*.json")):
        for line in file.read_text().splitlines():
            row = json.loads(line)
            assert row["id"] not in rows, f"two rows for {row['id']}"
            rows[row["id"]] = row
    return rows


SAMPLING = Sampling(max_tokens=8)


@pytest.mark.ray
@pytest.mark.slow
def test_ray_run_gives_the_local_runs_rows_and_resumes(
    local_ray,
    samples: Path,
    tiny_vl_model: Path,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # type: ignore[no-untyped-def]
    shared_before = shared_memory()
    requests = caption_requests(samples, tmp_path)
    manifest = tmp_path / "items.jsonl"
    write_manifest(requests, manifest)
    out = tmp_path / "ray-out"
    out.mkdir()
    # An earlier run wrote two rows, then died while writing a third file.
    earlier = [r.id for r in requests[:2]]
    (out / "earlier_000000.json").write_text(
        "".join(
            json.dumps({"id": i, "text": "from the earlier run", "error": None}) + "\n"
            for i in earlier
        )
    )
    (out / "earlier_000001.json").write_text('{"id": "1-sunset.jpg", "text": "cut sh')

    argv = [
        "caption",
        str(manifest),
        # The manifest names the samples by absolute path, outside its own folder.
        "--allow-outside-root",
        "--model",
        str(tiny_vl_model),
        "--out",
        str(out),
        "--max-tokens",
        str(SAMPLING.max_tokens),
        *TINY_ENGINE_FLAGS,
        "--ray",
        "--replicas",
        "1",
        "--gpus-per-replica",
        "0",
        "--ray-batch",
        "2",
    ]
    # The local resume rules: rows planted by hand have no job record, so whether they
    # belong to this job cannot be told, and the folder is refused unless forced.
    assert main(argv) == EXIT_JOB_FAILED
    assert "no job record" in capsys.readouterr().err
    with monkeypatch.context() as env:
        # The engine as a user's job has it (vLLM's default, which the other tests turn off
        # for speed): its engine core in a process of its own, holding shared memory.
        env.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
        code = main([*argv, "--force"])
    assert code == EXIT_ITEMS_FAILED  # the truncated, missing and empty files
    # Its time split as a local job's: the replicas' engine start is start-up, not work.
    said = capsys.readouterr().err
    assert "for the whole command: start-up" in said, said
    ray_rows = rows_on_disk(out)
    assert sorted(ray_rows) == sorted(r.id for r in requests)  # one row per input, no more
    assert (out / ".partial-earlier_000001.json").exists()
    summary = json.loads((tmp_path / "ray-out.summary.json").read_text())
    assert summary["stats"]["total"] == len(requests)
    assert summary["stats"]["rows_from_earlier_runs"] == 2
    assert summary["stats"]["failed"] == 6  # three bad files, each asked two prompts
    stats = summary["stats"]
    assert 0 < stats["startup_seconds"] < stats["process_seconds"]
    assert stats["startup_seconds"] + stats["wall_seconds"] <= stats["process_seconds"] + 0.1
    # The replica's engines, laid out for its share of the job as a command's are.
    assert (
        summary["job"]["engines"] == "each replica: one engine on this machine (no GPU is visible)"
    )
    quarantine = (tmp_path / "ray-out.quarantine.jsonl").read_text().splitlines()
    assert len(quarantine) == 6
    for item_id in earlier:
        assert ray_rows[item_id]["text"] == "from the earlier run"  # skipped, not redone

    # The local run of the same job: the items the Ray run did (the earlier rows skipped).
    run_here = [r for r in requests if r.id not in earlier]
    local, local_stats = local_rows(request.getfixturevalue("vl_engine"), run_here)
    # What the replicas counted that the rows do not say, as the local run counts it: the
    # sunset's two files under each prompt are one request asked twice, answered once.
    assert local_stats.answered_by_identical == 2
    for name in ("answered_by_identical", "repeated_output_tokens"):
        assert summary["stats"][name] == getattr(local_stats, name), name
    # The actor, a fresh process, decoded each readable distinct picture once (the local
    # run's count depends on what the shared engine's earlier jobs left decoded).
    assert summary["stats"]["decodes"] == 4
    for item_id, row in ray_rows.items():
        if item_id in earlier:
            continue
        mine = local[item_id]
        assert row["text"] == mine["text"], item_id
        assert row["error"] == mine["error"], item_id
        assert row["media_hash"] == mine["media_hash"], item_id
        assert row["output_tokens"] == mine["output_tokens"], item_id
    stages = {row["error"]["stage"] for row in ray_rows.values() if row["error"]}
    assert stages == {"load", "decode"}
    texts = {row["text"] for row in ray_rows.values() if row["error"] is None}
    assert len(texts) >= 4  # distinct pictures and prompts do not collapse to one caption

    assert (tmp_path / "ray-out.vllm.log").stat().st_size > 0  # the replica's engine log
    # Ray ended the run's actor, killing the actor's children as it went (vLLM's engine
    # core, with the shared memory it made): none of it is left behind (160 MB), once the
    # last of their processes has exited (the engine's workers take seconds).
    leaked = leaked_shared_memory(shared_before, 60.0)
    assert not leaked, f"shared memory left by the Ray runs' engines: {sorted(leaked)}"


TWO_QUESTIONS = """
name = "two-questions"
[prompt]
system = "Answer briefly."
[[prompt.questions]]
name = "subject"
text = "What is the main subject?"
[[prompt.questions]]
name = "colour"
text = "Which colour dominates?"
[sampling]
max_tokens = 6
[media]
kind = "image"
[output]
format = "text"
"""


@pytest.mark.ray
@pytest.mark.slow
def test_ray_recipe_run_gives_the_local_runs_item_rows(
    local_ray, samples: Path, tiny_vl_model: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:  # type: ignore[no-untyped-def]
    from mmbatch.recipe.spec import load_recipe

    recipe_file = tmp_path / "two.toml"
    recipe_file.write_text(TWO_QUESTIONS)
    names = ["sunset.jpg", "sunset_copy.jpg", "truncated.jpg", "checkerboard.png"]
    inputs = [str(samples / name) for name in names]
    out = tmp_path / "recipe-out"
    argv = ["run", str(recipe_file), *inputs, "--model", str(tiny_vl_model)]
    argv += ["--out", str(out), *TINY_ENGINE_FLAGS, "--ray", "--gpus-per-replica", "0"]
    code = main(argv)
    assert code == EXIT_ITEMS_FAILED  # truncated.jpg
    ray_rows = rows_on_disk(out)
    assert sorted(ray_rows) == sorted(inputs)  # one row per item, not per question

    job = recipe_job(load_recipe(recipe_file), inputs, str(tiny_vl_model))
    engine = request.getfixturevalue("vl_engine")
    rows, _ = run_in_memory(job, engine, RunConfig(progress=False))
    local = {row["id"]: row for row in rows}
    for item_id, row in ray_rows.items():
        assert row["error"] == local[item_id]["error"], item_id
        assert row["media_hash"] == local[item_id]["media_hash"], item_id
        for name in ("subject", "colour"):
            mine, theirs = row["outputs"][name], local[item_id]["outputs"][name]
            assert mine["text"] == theirs["text"], (item_id, name)
            assert mine["prompt"] == theirs["prompt"], (item_id, name)
    assert ray_rows[inputs[2]]["error"]["stage"] == "decode"
    assert ray_rows[inputs[0]]["outputs"]["subject"]["text"]
    # The replica's engine saw each picture twice (two questions, asked together): its
    # caches' counters reach the summary, as a local job's do.
    stats = json.loads((tmp_path / "recipe-out.summary.json").read_text())["stats"]
    assert stats["mm_cache_hit_rate"] > 0, stats
    assert stats["prefix_cache_hit_rate"] is not None, stats


RAY_CLI = """
import sys
from mmbatch.integrations import ray_data
ray_data.ROWS_PER_INPUT_BLOCK = 1
from mmbatch.cli import main
sys.exit(main(sys.argv[1:]))
"""
"""The command line, with one input row per Ray block: the rows then reach the folder block
by block, as a large job's do (512 rows a block), so that a handful of items can be stopped
with some rows written and some not."""


def complete_rows(folder: Path) -> list[str]:
    """The ids of the whole rows in ``folder`` (a file being written may end mid-row)."""
    ids = []
    for file in sorted(folder.glob("[!.]*.json")) if folder.exists() else []:
        data = file.read_bytes()
        ids += [json.loads(line)["id"] for line in data[: data.rfind(b"\n") + 1].splitlines()]
    return ids


def check_ray_job_stopped_then_resumed(
    tiny_vl_model: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    signals: tuple[signal.Signals, ...],
) -> None:
    """``--ray`` stopped as a local job is (``tests/manual/test_ray_stop_sweep.py``): the
    job started, once rows are in the folder stopped by each of ``signals`` in
    turn (SIGINT to its process group, as a terminal sends it; SIGTERM to the job alone, as
    a scheduler sends it), each time resumed from what the last saved; then run to its end
    on the tests' Ray."""
    pictures = tmp_path / "pictures"
    pictures.mkdir()
    for i in range(12):
        colour = (i * 20, 255 - i * 20, i * 7)
        Image.new("RGB", (32, 32), colour).save(pictures / f"{i:02d}.png")
    ids = sorted(str(path) for path in pictures.iterdir())
    out = tmp_path / "rows"
    argv = ["caption", str(pictures), "--model", str(tiny_vl_model), "--out", str(out)]
    argv += ["--max-tokens", "8", *TINY_ENGINE_FLAGS, "--gpus-per-replica", "0", "--ray-batch", "1"]
    # "local": a Ray of the job's own, whatever cluster this machine has; its processes stay
    # in the job's session, where they are looked for after it.
    argv += ["--ray", "local"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}

    saved: list[str] = []
    for how in signals:
        job = subprocess.Popen(
            [sys.executable, "-c", RAY_CLI, *argv],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # a group of its own, as a terminal's foreground job
        )
        with job:
            deadline = time.monotonic() + 300
            while job.poll() is None and len(complete_rows(out)) == len(saved):
                assert time.monotonic() < deadline, f"no new row within 300 s ({how.name})"
                time.sleep(0.02)
            # Rows whole in the folder before the signal (a block is one row here, so a file
            # holds a whole row or none): saved, whatever the job does next.
            before = len(complete_rows(out))
            if how == signal.SIGINT:
                os.killpg(job.pid, signal.SIGINT)
            else:
                job.send_signal(signal.SIGTERM)
            try:
                code = job.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(job.pid, signal.SIGKILL)  # a hung job is not left behind
                raise AssertionError(f"the job hung after {how.name}") from None
            stderr = job.stderr.read().decode()  # type: ignore[union-attr]
        left = left_after(partial(in_session, job.pid), 10.0)
        for line in left:
            os.kill(int(line.split()[0]), signal.SIGKILL)
        wanted = EXIT_INTERRUPTED if how == signal.SIGINT else EXIT_TERMINATED
        assert code == wanted, f"{how.name}: exit {code}\n{stderr[-3000:]}"
        assert "Traceback" not in stderr, stderr[-3000:]
        assert not left, f"processes left after {how.name}: {left}"
        saved = complete_rows(out)
        assert len(set(saved)) == len(saved), f"a row written twice after {how.name}"
        assert 0 < len(saved) < len(ids), f"{how.name} landed after the job's end"
        said = [line for line in stderr.splitlines() if line.startswith("mmbatch: interrupted:")]
        # Ray's writer may still finish a file as the job stops: the line says the least the
        # folder holds, which it does hold; the resume below counts again.
        count = re.fullmatch(
            r"mmbatch: interrupted: at least (\d+) rows? (?:is|are) saved in "
            rf"{re.escape(str(out))} "
            r"\(at most (\d+) items? left; Ray's writers, still stopping, may add the rows "
            r"they hold\)",
            said[-1] if said else "",
        )
        assert count, stderr[-3000:]
        assert int(count[1]) + int(count[2]) == len(ids)
        assert before <= int(count[1]) <= len(saved), (before, count[1], len(saved))
        assert "set aside" not in stderr  # a file a writer was finishing is left to it
        assert stderr.splitlines()[-1].endswith("run the same command again to resume")

    # The last run, here on the tests' Ray: the rows saved are kept, the rest are done.
    capsys.readouterr()
    assert main(argv) == EXIT_OK
    assert f"mmbatch: resuming {out}: {len(saved)} items already have a row" in (
        capsys.readouterr().err
    )
    rows = rows_on_disk(out)  # one row per id at most: it fails on a second
    assert sorted(rows) == ids
    assert all(rows[i]["error"] is None and rows[i]["text"] for i in ids)


def local_rows(engine: Any, requests: list[Request]) -> tuple[dict[str, dict[str, Any]], JobStats]:
    rows, stats = run_in_memory(Job(requests, SAMPLING), engine, RunConfig(progress=False))
    return {row["id"]: row for row in rows}, stats


@pytest.mark.ray
def test_requests_sharing_a_picture_are_packed_into_one_group(
    local_ray, samples: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    from mmbatch.integrations.ray_data import media_groups, requests_dataset

    requests = caption_requests(samples, tmp_path)
    options = ImageOptions()
    packed = media_groups(requests_dataset(requests), options, partitions=3).take_all()
    ids_seen = [i for group in packed for i in group["id"]]
    assert sorted(ids_seen) == sorted(r.id for r in requests)  # each request exactly once
    by_group = {group["media_group"]: group for group in packed}
    sunset = media_key("image", (samples / "sunset.jpg").read_bytes(), options.cache_token())
    # Two file names with the same bytes, two prompts: one group of four.
    names = sorted(Path(p).name for p in by_group[sunset]["path"])
    assert names == ["sunset.jpg", "sunset.jpg", "sunset_copy.jpg", "sunset_copy.jpg"]
    assert f"unreadable:{tmp_path / 'missing.jpg'}" in by_group
    assert len(packed) == 7  # 5 distinct sample pictures, the missing file, the empty file


@pytest.mark.ray
def test_the_driver_plans_the_rows_it_built_as_it_would_read_them_back(
    local_ray, samples: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """``driver_requests`` gives the driver the requests it plans, resumes and counts
    without running Ray Data over the rows it built from them: the same, id by id, as those
    it reads back from the Dataset (``_whole_job``), system prompts kept and a row with an
    empty prompt an error, with and without a job's default prompt."""
    from mmbatch.integrations.ray_data import _whole_job, driver_requests, requests_dataset
    from mmbatch.integrations.ray_replica import RayJob

    requests = caption_requests(samples, tmp_path)
    requests[0] = Request(requests[0].id, "", requests[0].media, system="Be brief.")
    requests[1] = Request(requests[1].id, "", requests[1].media)
    engine = EngineConfig(model="m")
    for job in (RayJob(engine, SAMPLING), RayJob(engine, SAMPLING, prompt="Say what it is.")):
        read_back = _whole_job(requests_dataset(requests), job).requests
        planned = driver_requests(requests, job)
        assert {r.id: r for r in planned} == {r.id: r for r in read_back}
        assert len(planned) == len(requests)
        first, second, third = planned[:3]
        assert (first.system, third.prompt) == ("Be brief.", requests[2].prompt)
        assert second.error is not None
        assert second.error.message == "the row has no prompt"


@pytest.mark.ray
def test_pictures_named_by_path_cross_rays_object_store_as_their_paths_only(
    local_ray, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """A job of files sends each picture's path through Ray, never its bytes: the rows
    grouped for the replicas (what the shuffle moves and the actors receive) hold a small
    part of what the pictures weigh; each actor reads its pictures from the file."""
    import numpy as np

    from mmbatch.integrations.ray_data import media_groups, requests_dataset

    noise = np.random.default_rng(0)
    requests = []
    for index in range(12):
        path = tmp_path / f"noise{index}.png"
        pixels = noise.integers(0, 256, (128, 128, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(path)
        requests.append(Request(f"r{index}", "Describe.", (MediaRef("image", str(path)),)))
    pictures = sum(Path(r.media[0].source).stat().st_size for r in requests)
    packed = media_groups(requests_dataset(requests), ImageOptions(), partitions=2).materialize()
    assert pictures > 12 * 40_000  # incompressible pictures
    assert packed.size_bytes() < pictures / 20
    assert set(packed.schema().names) == {"id", "path", "prompt", "system", "media_group"}


def test_a_replica_batch_gives_one_row_per_request_failures_included(
    samples: Path, tmp_path: Path
) -> None:
    """The actor's bookkeeping, in-process on a fake engine (the real engine runs on Ray
    above): keying, packing, unpacking, error rows and the fixed output schema."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from fake_engine import FakeEngine, expected_text

    from mmbatch.integrations import ray_replica, ray_rows

    rows = [
        {"id": "a", "path": str(samples / "sunset.jpg"), "prompt": "p"},
        {"id": "b", "path": str(samples / "sunset_copy.jpg"), "prompt": None},
        {"id": "c", "path": str(samples / "truncated.jpg"), "prompt": "p"},
        {"id": "d", "path": str(tmp_path / "missing.jpg"), "prompt": "q"},
        {"id": "e", "path": str(samples / "checkerboard.png"), "prompt": "q"},
        {"id": "f", "path": str(samples / "sunset.jpg"), "prompt": "q"},
    ]
    keyed = ray_rows.add_media_group(pa.Table.from_pylist(rows), ImageOptions())
    keys = keyed[ray_rows.GROUP_COLUMN]
    groups = [
        ray_rows.pack_group(keyed.filter(pc.equal(keys, key)))
        for key in pc.unique(keys).to_pylist()
    ]
    assert len(groups) == 4  # a, b and f share one picture
    job = ray_replica.RayJob(EngineConfig("unused"))
    replica = ray_replica.EngineReplica(job, engine=FakeEngine())
    out = asyncio.run(replica(pa.concat_tables(groups)))

    assert out.schema == ray_rows.flat_schema()
    by_id = {row["id"]: row for row in out.to_pylist()}
    assert sorted(by_id) == ["a", "b", "c", "d", "e", "f"]
    assert by_id["b"]["error"] == {
        "stage": "source",
        "kind": "other",
        "message": "the row has no prompt",
    }
    assert by_id["c"]["error"]["stage"] == "decode"
    assert by_id["d"]["error"]["stage"] == "load"
    for item_id in "aef":
        row = by_id[item_id]
        assert row["error"] is None
        assert row["text"] == expected_text([row["media_hash"]], row["prompt"])
    assert by_id["a"]["media_hash"] == by_id["f"]["media_hash"] == keys[0].as_py()


def test_a_replica_asks_each_item_every_question_of_a_recipe(samples: Path, tmp_path: Path) -> None:
    import pyarrow as pa
    from fake_engine import FakeEngine, expected_text

    from mmbatch.integrations import ray_replica, ray_rows
    from mmbatch.recipe.spec import load_recipe

    recipe_file = tmp_path / "two.toml"
    recipe_file.write_text(TWO_QUESTIONS)
    recipe = load_recipe(recipe_file)
    rows = [
        {"id": "a", "path": str(samples / "sunset.jpg"), "prompt": None},
        {"id": "b", "path": str(samples / "truncated.jpg"), "prompt": None},
    ]
    keyed = ray_rows.add_media_group(pa.Table.from_pylist(rows), ImageOptions())
    groups = [ray_rows.pack_group(keyed.slice(i, 1)) for i in range(keyed.num_rows)]
    job = ray_replica.RayJob(EngineConfig("unused"), prompt=recipe.questions[0].text, recipe=recipe)
    replica = ray_replica.EngineReplica(job, engine=FakeEngine())
    out = asyncio.run(replica(pa.concat_tables(groups)))
    by_id = {row["id"]: row for row in out.to_pylist()}
    assert sorted(by_id) == ["a", "b"]
    assert by_id["b"]["error"]["stage"] == "decode"
    a = by_id["a"]
    assert a["error"] is None
    for question in recipe.questions:
        answer = a["outputs"][question.name]
        assert answer["prompt"] == question.text
        assert answer["text"] == expected_text([a["media_hash"]], question.text)


def test_row_folders_are_read_back_and_partial_files_set_aside(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "a.json").write_text(
        '{"id": "x", "error": null, "output_tokens": 3}\n'
        '{"id": "y", "error": {"stage": "decode", "message": "truncated"}}\n'
    )
    (tmp_path / "b.json").write_text('{"id": "z", "error": nu')
    rows = list(read_folder(tmp_path, "jsonl", FLAT))
    assert [FLAT.row_id(r) for r in rows] == ["x", "y"]
    outcomes = [FLAT.outcome(r) for r in rows]
    assert [o.ok for o in outcomes] == [True, False]
    assert outcomes[0].usage.output_tokens == 3
    assert outcomes[1].error is not None
    assert outcomes[1].error.stage == "decode"
    assert (tmp_path / ".partial-b.json").exists()
    assert not (tmp_path / "b.json").exists()

    parquet = tmp_path / "pq"
    parquet.mkdir()
    table = pa.table(
        {
            "id": ["p"],
            "error": pa.array(
                [None], pa.struct([("stage", pa.string()), ("message", pa.string())])
            ),
            "prompt_tokens": [5],
            "output_tokens": [2],
        }
    )
    pq.write_table(table, parquet / "good.parquet")
    (parquet / "cut.parquet").write_bytes((parquet / "good.parquet").read_bytes()[:40])
    rows = list(read_folder(parquet, "parquet", FLAT))
    assert [(r["id"], FLAT.outcome(r).usage.prompt_tokens) for r in rows] == [("p", 5)]
    assert (parquet / ".partial-cut.parquet").exists()
    with pytest.raises(ValueError, match="must hold only"):
        list(read_folder(tmp_path, "parquet", FLAT))


def test_a_stopped_ray_jobs_count_leaves_files_being_written_to_their_writers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """After Ctrl-C, Ray's writers stop in the background: a file one is still writing is
    neither counted nor set aside (its writer may finish it), and the count is said as the
    least that is saved, not as an exact number; a local output's count stays exact."""
    from mmbatch.jobs import say_interrupted
    from mmbatch.output.file_output import FileOutput

    folder = tmp_path / "rows"
    folder.mkdir()
    picture = (MediaRef("image", "x.jpg"),)
    job = Job([Request(i, "p", picture) for i in "xyzw"])
    whole = [output_row(r, ("key",), Result(r.id, "t", "stop")) for r in job.requests[:2]]
    (folder / "a.json").write_text("".join(json.dumps(row) + "\n" for row in whole))
    (folder / "b.json").write_text('{"id": "z", "text": "being wri')  # a writer is at it
    say_interrupted(job, FileOutput(folder, "jsonl", row_folder=True))
    assert capsys.readouterr().err == (
        f"mmbatch: interrupted: at least 2 rows are saved in {folder} (at most 2 items left; "
        "Ray's writers, still stopping, may add the rows they hold)\n"
    )
    assert sorted(p.name for p in folder.iterdir()) == ["a.json", "b.json"]

    local = tmp_path / "rows.jsonl"
    local.write_text("".join(json.dumps(row) + "\n" for row in whole))
    say_interrupted(job, FileOutput(local, "jsonl"))
    assert capsys.readouterr().err == (
        f"mmbatch: interrupted: 2 rows are saved in {local} (2 items left)\n"
    )


def test_a_row_folder_resumes_by_the_local_runners_rules(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ray's driver plans with ``FileOutput.ready``, as ``run_job`` does: another job's
    folder is refused, error rows are retried, an item whose prompt changed is redone, and it
    is said the same way."""
    from mmbatch.output.file_output import FileOutput

    folder = tmp_path / "rows"
    folder.mkdir()
    error = {"stage": "decode", "kind": "corrupt", "message": "truncated"}
    written = [
        {"id": "x", "prompt": "p", "text": "kept", "error": None},
        {"id": "y", "prompt": "p", "text": None, "error": error},
        {"id": "z", "prompt": "an older prompt", "text": "stale", "error": None},
    ]
    (folder / "a.json").write_text("".join(json.dumps(row) + "\n" for row in written))
    picture = (MediaRef("image", "x.jpg"),)
    job = Job([Request(i, "p", picture) for i in "xyzw"], fingerprint={"prompt": "p"})
    out = FileOutput(folder, "jsonl", retry_errors=True, row_folder=True)
    out.record(Job([], fingerprint={"prompt": "another"}))
    with pytest.raises(ConfigError, match="was written by a different job"):
        out.ready(job)
    out.record(job)
    plan = out.ready(job)
    assert [r.id for r in plan.pending] == ["y", "z", "w"]
    assert (plan.kept_ok, plan.retried, plan.changed) == (1, 1, 1)
    said = capsys.readouterr().err
    assert f"mmbatch: resuming {folder}: 1 item already has a row" in said
    assert "1 error rows removed to be retried" in said
    assert [FLAT.row_id(row) for row in read_folder(folder, "jsonl", FLAT)] == ["x"]


@pytest.mark.ray
@pytest.mark.slow
def test_a_ray_jobs_terminal_holds_its_summary_and_its_log_what_ray_says(
    samples: Path, tiny_vl_model: Path, tmp_path: Path
) -> None:
    """A Ray job as a user runs it (``mmbatch caption FILES --ray``, in a process of its own:
    what reaches its terminal is what is tested), quiet: the summary's last line alone on the
    terminal. Ray's start (its token authentication warning, the local instance started),
    Ray Data's progress and plans, and its core worker's C++ line on the replica's
    constructor arguments are in the job's log; mmbatch asks Ray Data for its actor pool in
    Ray's current words, so no deprecation is said anywhere."""
    pictures = [str(samples / name) for name in ("sunset.jpg", "checkerboard.png")]
    out = tmp_path / "rows"
    argv = ["caption", *pictures, "--model", str(tiny_vl_model), "--out", str(out), "-q"]
    argv += ["--max-tokens", "4", *TINY_ENGINE_FLAGS, "--gpus-per-replica", "0"]
    argv += ["--ray", "local"]  # a Ray of the job's own, started and stopped by it
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run(
        [sys.executable, "-m", "mmbatch", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == EXIT_OK, done.stderr[-3000:]
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f"rows written to {out}: 2 ok, 0 failed; summary in {tmp_path / 'rows.summary.json'}"
    ]
    log = (tmp_path / "rows.vllm.log").read_text()
    assert "Started a local Ray instance" in log
    assert "Running Dataset" in log or "Starting execution of Dataset" in log
    assert "constructor arguments in the object store" in log
    assert "``concurrency`` is deprecated" not in log
    # Its start-up by phase, the replica's among the driver's (on the driver's clock): the
    # command's, Ray's start (begun while the settings were checked), the job planned, then
    # the replica's actor, vLLM's import in its engine process and its engine built there,
    # its engine ready and its first row.
    summary = json.loads((tmp_path / "rows.summary.json").read_text())
    phases = summary["stats"]["startup_phases"]
    order = ["imports_done", "settings_checked", "job_planned", "replica_0_actor_started",
             "replica_0_engine_0_vllm_imported", "replica_0_engine_0_llm_built",
             "replica_0_engine_ready", "replica_0_first_row"]  # fmt: skip
    assert [phases[name] for name in order] == sorted(phases[name] for name in order), phases
    # A replica's batches end one by one: the end of its first is not the job's last row.
    assert "replica_0_last_row" not in phases
    assert phases["imports_done"] < phases["ray_initialised"] <= phases["job_planned"]
    # The job's start-up ends where its replica's engine was ready.
    assert abs(summary["stats"]["startup_seconds"] - phases["replica_0_engine_ready"]) < 0.5
    # Where the replica's engine wrote its log, named for whoever collects it.
    assert summary["job"]["ray"]["vllm_log"] == str(tmp_path / "rows.vllm.log")
    assert "init engine" in log  # the replica engine's own start-up lines


@pytest.mark.ray
def test_the_replicas_actor_pool_is_asked_for_in_rays_current_words(
    local_ray,  # type: ignore[no-untyped-def]
) -> None:
    """``map_batches(concurrency=...)`` is deprecated since Ray 2.51 (said through Ray Data's
    logger, not Python's warnings): the replicas' pool is a ``compute`` strategy."""
    from mmbatch.integrations.ray_data import RayResources, caption_dataset
    from mmbatch.integrations.ray_replica import RayJob

    said: list[str] = []

    class Heard(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append(record.getMessage())

    inputs = local_ray.data.range(2)  # Ray Data sets up its loggers as it is first used
    heard = Heard(logging.WARNING)
    logger = logging.getLogger("ray.data")
    logger.addHandler(heard)
    try:
        rows = caption_dataset(
            inputs,
            RayJob(EngineConfig("model", {})),
            RayResources(replicas=2, gpus_per_replica=0),
        )
    finally:
        logger.removeHandler(heard)
    assert not [line for line in said if "deprecated" in line], said
    pool = rows._logical_plan.dag.compute  # the replicas' map, last
    assert (pool.min_size, pool.max_size) == (2, 2)


THREADS = """
import json, os, torch
print(json.dumps([os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads()]))
"""


@pytest.mark.ray
def test_a_replicas_process_runs_torch_on_the_threads_of_a_local_engine_process(
    local_ray,  # type: ignore[no-untyped-def]
) -> None:
    """Ray gives an actor of one CPU (a replica) ``OMP_NUM_THREADS=1``; a replica's process
    has the threads a process the command starts here has (torch's own choice, or the
    user's ``OMP_NUM_THREADS``), so that its preprocessing, and the model on vLLM's CPU
    build, are not held to one thread, and its engine core on a GPU gets one as a local
    one does."""
    from mmbatch.integrations.ray_replica import EngineReplica, RayJob

    def torch_threads(replica: EngineReplica) -> list[str | int | None]:
        import os

        import torch

        return [os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads()]

    replica_class = local_ray.remote(num_cpus=1)(EngineReplica)
    for users in (None, "2"):
        env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
        here = subprocess.run(
            [sys.executable, "-c", THREADS],
            env=env | ({"OMP_NUM_THREADS": users} if users else {}),
            capture_output=True,
            text=True,
            timeout=120,
        )
        job = RayJob(EngineConfig("model", {}), omp_threads=users)
        replica = replica_class.remote(job, None, object())  # an engine given: none starts
        seen = local_ray.get(replica.__ray_call__.remote(torch_threads))
        local_ray.kill(replica)
        assert seen == json.loads(here.stdout), users


def test_gpus_per_replica_defaults_to_the_engines_parallel_size() -> None:
    from mmbatch.integrations.ray_data import RayResources

    engine = EngineConfig("m", {"tensor_parallel_size": 2, "pipeline_parallel_size": 2})
    assert RayResources().num_gpus(engine, cpu_build=False) == 4
    assert RayResources(gpus_per_replica=0).num_gpus(engine, cpu_build=False) == 0
    assert RayResources().num_gpus(EngineConfig("m"), cpu_build=False) == 1
    # vLLM's CPU build asks Ray for no GPU; this machine has that build.
    assert RayResources().num_gpus(engine, cpu_build=True) == 0
    assert RayResources().num_gpus(engine) == 0
    assert RayResources(gpus_per_replica=1).num_gpus(engine, cpu_build=True) == 1


CPU_BUILD_PROBE = """
import json, sys
from mmbatch.engine.installed_vllm import cpu_build
told = cpu_build()
imported = "vllm" in sys.modules
from vllm.platforms import current_platform
print(json.dumps([told, imported, current_platform.is_cpu()]))
"""


def test_whether_vllm_is_its_cpu_build_is_told_as_vllm_tells_it_without_importing_it() -> None:
    """Ray's driver asks how many GPUs a replica takes before anything else needs vLLM:
    answered without vLLM's import (seconds), as vLLM's own platform detection answers it."""
    probe = subprocess.run(
        [sys.executable, "-c", CPU_BUILD_PROBE], capture_output=True, text=True, timeout=120
    )
    assert probe.returncode == 0, probe.stderr
    assert json.loads(probe.stdout.strip().splitlines()[-1]) == [True, False, True]


class _FakeRay:
    def __init__(self, gpus: float) -> None:
        self.gpus = gpus

    def cluster_resources(self) -> dict[str, float]:
        return {"CPU": 8.0, "GPU": self.gpus}


def test_a_cluster_that_can_never_hold_the_replicas_fails_at_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from mmbatch.errors import ConfigError
    from mmbatch.integrations import ray_data

    monkeypatch.setattr(ray_data, "_most_gpus_possible", lambda: None)  # no autoscaler
    with pytest.raises(ConfigError) as info:
        ray_data._check_resources(_FakeRay(0), 1.0)
    message = str(info.value)
    assert "1 replica(s) x 1 GPU(s)" in message
    assert "has 0 and no autoscaler to add more" in message
    assert "--gpus-per-replica 0" in message
    with pytest.raises(ConfigError, match="has 2 and no autoscaler"):
        ray_data._check_resources(_FakeRay(2), 1.0, replicas=4)
    ray_data._check_resources(_FakeRay(4), 1.0, replicas=4)  # fits
    ray_data._check_resources(_FakeRay(0), 0.0, replicas=4)  # CPUs only
    monkeypatch.setattr(ray_data, "_most_gpus_possible", lambda: 2.0)  # can grow to 2
    with pytest.raises(ConfigError, match="can grow to 2"):
        ray_data._check_resources(_FakeRay(0), 1.0, replicas=4)
    monkeypatch.setattr(ray_data, "_most_gpus_possible", lambda: 8.0)
    ray_data._check_resources(_FakeRay(0), 1.0, replicas=4)
    assert "its autoscaler can add up to 8: the job waits for them" in capsys.readouterr().err


@pytest.mark.ray
def test_asking_a_gpu_of_a_cluster_without_one_exits_2_before_any_output(
    local_ray,  # type: ignore[no-untyped-def]
    samples: Path,
    tiny_vl_model: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "rows"
    model = str(tiny_vl_model)  # the settings are checked (and pass) before the cluster is
    argv = ["caption", str(samples / "sunset.jpg"), "--model", model, "--out", str(out)]
    assert main([*argv, "--ray", "--gpus-per-replica", "1"]) == EXIT_JOB_FAILED
    assert "has 0 and no autoscaler to add more" in capsys.readouterr().err
    assert not out.exists()
    assert not (tmp_path / "rows.job.json").exists()


@pytest.mark.ray
def test_a_typo_in_an_engine_setting_exits_2_before_any_replica_starts(
    local_ray,  # type: ignore[no-untyped-def]
    samples: Path,
    tiny_vl_model: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A misspelt engine argument, or a value vLLM does not take, is one line and exit 2
    before any actor starts: no output folder, no job record, no engine log."""
    from mmbatch.integrations.ray_data import RayResources, requests_dataset, run_on_ray
    from mmbatch.integrations.ray_replica import RayJob

    out = tmp_path / "rows"
    nothing_written = [out, tmp_path / "rows.job.json", tmp_path / "rows.vllm.log"]
    argv = ["caption", str(samples / "sunset.jpg"), "--model", str(tiny_vl_model)]
    argv += ["--out", str(out), "--ray", "--gpus-per-replica", "0"]
    typos = {
        "max_model_lenn=5": "engine argument 'max_model_lenn': vLLM has no such argument "
        "(did you mean 'max_model_len'?)",
        "max_model_len=many": "engine argument max_model_len='many': Input should be a valid "
        "integer",
    }
    for typo, said in typos.items():
        assert main([*argv, "--engine-arg", typo]) == EXIT_JOB_FAILED
        lines = capsys.readouterr().err.splitlines()
        assert lines[-1].startswith(f"mmbatch: error: {said}")  # the last line, and the only
        assert sum("error" in line for line in lines) == 1
        assert not [path for path in nothing_written if path.exists()]

    # From Python the driver checks them as well, before it writes anything.
    picture = Request("a", "Describe.", (MediaRef("image", str(samples / "sunset.jpg")),))
    log = tmp_path / "vllm.log"
    engine = EngineConfig(str(tiny_vl_model), {"dtype": "flaot16"}, log_file=str(log))
    with pytest.raises(ConfigError, match="engine argument dtype='flaot16'"):
        run_on_ray(requests_dataset([picture]), RayJob(engine), RayResources(), out)
    assert not [path for path in [*nothing_written, log] if path.exists()]


@pytest.mark.ray
@pytest.mark.slow
def test_an_engine_that_does_not_start_on_ray_says_why_as_the_local_runner_does(
    local_ray,  # type: ignore[no-untyped-def]
    samples: Path,
    tiny_vl_model: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Weights that cannot be read pass every check of the settings; the replica's engine
    then fails to start, and the job says so in the engine's own words (no "the actor
    died"), with its log beside the output and the rows left to do."""
    import shutil

    broken = tmp_path / "broken-model"
    shutil.copytree(tiny_vl_model, broken)
    for weights in broken.glob("*.safetensors"):
        weights.write_bytes(weights.read_bytes()[:64])
    out = tmp_path / "rows"
    argv = ["caption", str(samples / "sunset.jpg"), "--model", str(broken), "--out", str(out)]
    argv += [*TINY_ENGINE_FLAGS, "--ray", "--gpus-per-replica", "0"]
    assert main(argv) == EXIT_JOB_FAILED
    err = capsys.readouterr().err
    log = tmp_path / "rows.vllm.log"
    said = err[err.index("mmbatch: error: ") :].splitlines()
    assert said[0].startswith(
        f"mmbatch: error: engine replica 0: the vLLM engine did not start (its log: {log}): "
    )
    # vLLM's own words: the weights' error itself, or (its engine core in a process of its
    # own) that process's failure, the weights' error then in the log.
    assert "SafetensorError" in said[0] + log.read_text(errors="replace"), said[0]
    assert said[1:] == [
        f"The 0 rows finished are saved in {out} (1 item left); run the same command again "
        "to resume."
    ]
    assert "actor died" not in err
    assert log.stat().st_size > 0


def test_without_ray_the_error_says_how_to_install_it(samples: Path, tmp_path: Path) -> None:
    # ray hidden from this process only: None in sys.modules makes `import ray` fail.
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "from mmbatch.cli import main\n"
        f"sys.exit(main(['caption', {str(samples)!r}, '--model', 'm', '--out', "
        f"{str(tmp_path / 'o')!r}, '--ray']))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == EXIT_JOB_FAILED, proc.stderr
    assert "pip install 'mmbatch[ray]'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_forwarded_env_keeps_vllm_settings_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from mmbatch.integrations.ray_data import forwarded_env

    environ = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "HOME": "/root", "X": "y"}
    assert forwarded_env(environ) == {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    assert forwarded_env()["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"  # read from os.environ


def test_on_ray_the_output_is_a_folder(tmp_path: Path) -> None:
    from mmbatch.errors import ConfigError
    from mmbatch.integrations.ray_data import RayResources, run_on_ray
    from mmbatch.integrations.ray_replica import RayJob
    from mmbatch.output.file_output import FileOutput

    out = tmp_path / "captions.jsonl"
    out.write_text("")
    job = RayJob(EngineConfig("m"))
    with pytest.raises(ConfigError, match="is a file"):
        run_on_ray(None, job, RayResources(), out)
    with pytest.raises(ConfigError, match="a folder of row files is one of"):
        run_on_ray(None, job, RayResources(), FileOutput(tmp_path / "o", "datasets"))  # type: ignore[arg-type]
