"""``Dataset.map(DatasetMap(...), batched=True)`` on a real datasets.Dataset.

The fast tests cover the callable's contract without an engine (pickling, fingerprint,
GPU choice); the slow ones run the tiny model and check each row's text against the same
picture captioned from its file.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import datasets
import pytest
from conftest import TINY_ENGINE_KWARGS
from datasets.fingerprint import Hasher

from mmbatch.integrations import hf_datasets, lookahead
from mmbatch.integrations.hf_datasets import (
    DatasetMap,
    model_identity,
    prepare_engine_process,
    select_gpu,
)
from mmbatch.media.options import MediaOptions
from mmbatch.output.sinks import MemorySink
from mmbatch.pipeline import RunConfig, run_requests
from mmbatch.types import MediaRef, Request, Sampling

PROMPT = "Describe this image."
SAMPLING = Sampling(max_tokens=12)
GOOD = ["sunset.jpg", "checkerboard.png", "shapes_alpha.png", "arrow_exif_rotated.jpg"]


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The models of the engines built from here on (asks the registry could not answer
    with an engine it keeps)."""
    from mmbatch.engine import builder

    built: list[str] = []
    real = builder.start_engine

    def counting(host, *args):  # type: ignore[no-untyped-def]
        built.append(host.config.model)
        return real(host, *args)

    monkeypatch.setattr(builder, "start_engine", counting)
    return built


def fingerprints_in_a_new_process(model: Path, prompt: str) -> list[str]:
    code = (
        "import sys\nfrom datasets.fingerprint import Hasher\n"
        "from mmbatch.integrations.hf_datasets import DatasetMap\n"
        "fn = DatasetMap(sys.argv[1], sys.argv[2], engine_kwargs={'dtype': 'float32'})\n"
        "print(Hasher.hash(fn), fn.fingerprint)"
    )
    return subprocess.run(
        [sys.executable, "-c", code, str(model), prompt],
        capture_output=True,
        text=True,
        check=True,
        env=os.environ | {"PYTHONHASHSEED": "random"},
    ).stdout.split()


def fingerprints(model: Path, prompt: str) -> list[str]:
    fn = DatasetMap(str(model), prompt, engine_kwargs={"dtype": "float32"})
    return [Hasher.hash(fn), fn.fingerprint]


def test_datasets_fingerprint_is_the_same_in_every_run(tmp_path: Path) -> None:
    # datasets hashes the pickled callable into the cache key; it must not vary by process.
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"a": 1}')
    first = fingerprints(model, PROMPT)
    assert fingerprints_in_a_new_process(model, PROMPT) == first
    assert fingerprints(model, "Another prompt.")[0] != first[0]
    assert fingerprints(model, "Another prompt.")[1] != first[1]
    (model / "config.json").write_text('{"a": 2}')  # the model changed: so must the key
    assert fingerprints(model, PROMPT)[0] != first[0]
    assert fingerprints(model, PROMPT)[1] != first[1]


def test_the_callable_pickles_small_and_builds_nothing(tmp_path: Path) -> None:
    fn = DatasetMap(str(tmp_path), PROMPT)
    clone = pickle.loads(pickle.dumps(fn))
    assert clone.fingerprint == fn.fingerprint
    assert len(pickle.dumps(fn)) < 4000
    assert model_identity("org/name") == "hub:org/name"


def test_rank_picks_one_gpu_round_robin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    select_gpu(None)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3,5"
    select_gpu(3)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "5"
    select_gpu(3)  # again, as every later batch does: stays on its GPU
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "5"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    select_gpu(2)  # no GPU: nothing to pick
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""


def engine_environment(batch: dict, rank: int | None, engine_kwargs: dict) -> dict:  # type: ignore[type-arg]
    from mmbatch.errors import ConfigError

    try:
        prepare_engine_process(rank, engine_kwargs)
        env = os.environ
        outcome = f"{env.get('VLLM_ENABLE_V1_MULTIPROCESSING')}/{env.get('CUDA_VISIBLE_DEVICES')}"
    except ConfigError as exc:
        outcome = str(exc)
    return {"outcome": [outcome] * len(batch["x"])}


def test_num_proc_workers_get_a_gpu_each_and_an_in_process_engine(
    environ_kept: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Real datasets worker processes (daemonic): vLLM could not start its engine process
    # there, so the engine must run in the worker, on the GPU its rank picks.
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    ds = datasets.Dataset.from_dict({"x": list(range(4))})

    def run(engine_kwargs: dict, num_proc: int | None) -> list[str]:  # type: ignore[type-arg]
        kwargs = {"engine_kwargs": engine_kwargs}
        out = ds.map(
            engine_environment, batched=True, with_rank=True, num_proc=num_proc, fn_kwargs=kwargs
        )
        return list(out["outcome"])

    assert run({}, num_proc=2) == ["0/4", "0/4", "0/6", "0/6"]
    [refusal] = set(run({"tensor_parallel_size": 2}, num_proc=2))
    assert refusal.startswith("tensor_parallel_size > 1 needs worker processes")
    # In the main process nothing changes: vLLM may start its processes there.
    assert run({"tensor_parallel_size": 2}, num_proc=None) == ["None/4,6"] * 4


def test_the_plain_and_the_pipelined_map_share_one_datasets_cache(tmp_path: Path) -> None:
    """Switching between ``ds.map(captioner)`` and ``ds.map(captioner.pipelined)`` recomputed
    everything: datasets hashed them differently. Rows that fail before any engine work
    need no engine, so a real map runs here."""
    import inspect

    captioner = DatasetMap(str(tmp_path), PROMPT)
    assert inspect.iscoroutinefunction(captioner.pipelined)  # datasets runs it as one
    assert Hasher.hash(captioner.pipelined) == Hasher.hash(captioner)
    assert not inspect.iscoroutinefunction(captioner)
    assert DatasetMap.__name__ == "DatasetMap"
    clone = pickle.loads(pickle.dumps(captioner.pipelined))  # as worker processes get it
    assert inspect.iscoroutinefunction(clone)
    assert clone.fingerprint == captioner.fingerprint
    datasets.Dataset.from_dict({"image": [None, None]}).save_to_disk(str(tmp_path / "ds"))
    ds = datasets.load_from_disk(str(tmp_path / "ds"))  # on disk: datasets caches maps
    plain = ds.map(captioner, batched=True)
    [cache] = plain.cache_files
    written = os.stat(cache["filename"]).st_mtime_ns
    pipelined = ds.map(captioner.pipelined, batched=True)
    assert pipelined._fingerprint == plain._fingerprint
    assert pipelined.cache_files == plain.cache_files
    assert os.stat(cache["filename"]).st_mtime_ns == written  # read, not computed again
    assert pipelined["error"] == ["source: this row: no image (the cell is empty)"] * 2


def test_a_missing_column_is_a_job_error(tmp_path: Path) -> None:
    from mmbatch.errors import ConfigError

    fn = DatasetMap(str(tmp_path), PROMPT)
    with pytest.raises(ConfigError, match="no column 'image' \\(it has photo\\)"):
        fn({"photo": [None]})
    with pytest.raises(ConfigError, match="batched=True"):
        fn({"image": {"bytes": b"", "path": None}}, 3)  # what batched=False would pass


def test_bad_rows_never_raise_and_keep_their_place(tmp_path: Path, builds: list[str]) -> None:
    # Rows unusable before any engine work: no engine is built for them.
    fn = DatasetMap(str(tmp_path), PROMPT)
    out = fn({"image": [None, 7, {"bytes": None, "path": None}]}, [10, 11, 12], None)
    assert out == {
        "text": ["", "", ""],
        "error": [
            "source: row 10: no image (the cell is empty)",
            "source: row 11: cannot use a int as image; expected {'bytes', 'path'} "
            "(decode=False), bytes, a path or a PIL image",
            "source: row 12: the image cell has neither bytes nor a path",
        ],
    }
    assert builds == []


def mapper(model: Path, prompt: str = PROMPT) -> DatasetMap:
    return DatasetMap(str(model), prompt, engine_kwargs=TINY_ENGINE_KWARGS, sampling=SAMPLING)


def texts_from_files(engine, samples: Path) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """Each good sample captioned from its file: the reference the map must agree with."""
    requests = [Request(n, PROMPT, (MediaRef("image", str(samples / n)),)) for n in GOOD]
    sink = MemorySink()
    run_requests(requests, engine, MediaOptions(), sink, SAMPLING, RunConfig(progress=False))
    return {row["id"]: row["text"] for row in sink.rows}


@pytest.mark.slow
def test_map_over_raw_bytes_gives_each_row_its_own_caption(
    vl_engine,  # type: ignore[no-untyped-def]
    tiny_vl_model: Path,
    samples: Path,
    builds: list[str],
) -> None:
    reference = texts_from_files(vl_engine, samples)
    assert len(set(reference.values())) >= 3  # or a swapped caption could not be seen
    names = [*GOOD, "truncated.jpg", "empty", "sunset.jpg", *reversed(GOOD)]
    cells = [
        None if n == "empty" else {"bytes": (samples / n).read_bytes(), "path": n} for n in names
    ]
    ds = datasets.Dataset.from_dict({"image": cells, "name": names})
    ds = ds.cast_column("image", datasets.Image(decode=False))
    out = ds.map(
        mapper(tiny_vl_model), batched=True, batch_size=4, with_indices=True, with_rank=True
    )
    assert builds == []  # the process's engine, not a second one
    assert out.num_rows == ds.num_rows
    assert out["name"] == names  # the input columns stay, in order
    for name, text, error in zip(out["name"], out["text"], out["error"], strict=True):
        if name == "truncated.jpg":
            assert error.startswith("decode: corrupt or unsupported image")
            assert text == ""
        elif name == "empty":
            assert error == "source: row 5: no image (the cell is empty)"
        else:
            assert error == ""
            assert text == reference[name], name


@pytest.mark.slow
def test_pipelined_batches_give_the_same_columns_and_overlap_in_the_engine(
    vl_engine,  # type: ignore[no-untyped-def]
    tiny_vl_model: Path,
    samples: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``DatasetMap.pipelined``: datasets runs the batches as concurrent coroutines, all on
    the process's one engine: every batch is submitted before the first one's rows are
    waited for (a plain call without its look-ahead drains the engine after every batch)."""
    reference = texts_from_files(vl_engine, samples)
    names = [*GOOD, "truncated.jpg", *reversed(GOOD), "sunset.jpg"]
    cells = [{"bytes": (samples / n).read_bytes(), "path": n} for n in names]
    ds = datasets.Dataset.from_dict({"image": cells, "name": names})
    ds = ds.cast_column("image", datasets.Image(decode=False))

    events: list[str] = []
    real_submit, real_rows = hf_datasets.start_in_memory, hf_datasets.rows_of

    def submitting(job, engine):  # type: ignore[no-untyped-def]
        events.append("submitted")
        return real_submit(job, engine)

    def waiting(submission):  # type: ignore[no-untyped-def]
        events.append("waited")
        return real_rows(submission)

    monkeypatch.setattr(hf_datasets, "start_in_memory", submitting)
    monkeypatch.setattr(hf_datasets, "rows_of", waiting)
    # datasets runs coroutines on an event loop it makes and never closes; closed here, or
    # its ResourceWarning fails whichever later test the garbage collector meets it in.
    loops: list[asyncio.AbstractEventLoop] = []
    new_loop = asyncio.new_event_loop
    monkeypatch.setattr(asyncio, "new_event_loop", lambda: loops.append(new_loop()) or loops[-1])
    captioner = mapper(tiny_vl_model)
    out = ds.map(captioner.pipelined, batched=True, batch_size=3, with_indices=True)
    monkeypatch.undo()
    for loop in loops:
        loop.close()
    plain = ds.map(captioner, batched=True, batch_size=3, with_indices=True)
    assert out["text"] == plain["text"]
    assert out["error"] == plain["error"]
    for name, text, error in zip(out["name"], out["text"], out["error"], strict=True):
        if name == "truncated.jpg":
            assert error.startswith("decode: corrupt or unsupported image")
        else:
            assert text == reference[name], name
    # four batches (3, 3, 3, 1 rows), all in the engine before the first is waited for
    assert events[: events.index("waited")] == ["submitted"] * 4, events


@pytest.mark.slow
def test_decoded_pictures_get_the_same_captions(
    vl_engine,  # type: ignore[no-untyped-def]
    tiny_vl_model: Path,
    samples: Path,
) -> None:
    reference = texts_from_files(vl_engine, samples)
    ds = datasets.Dataset.from_dict({"image": [str(samples / n) for n in GOOD]})
    ds = ds.cast_column("image", datasets.Image())  # decoded: the map gets PIL images
    out = ds.map(mapper(tiny_vl_model), batched=True, batch_size=8)
    assert out["error"] == [""] * len(GOOD)
    assert out["text"] == [reference[n] for n in GOOD]


@pytest.mark.slow
def test_datasets_cache_holds_across_instances(
    vl_engine,  # type: ignore[no-untyped-def]
    tiny_vl_model: Path,
    samples: Path,
    tmp_path: Path,
) -> None:
    cells = [{"bytes": (samples / n).read_bytes(), "path": n} for n in GOOD]
    datasets.Dataset.from_dict({"image": cells}).cast_column(
        "image", datasets.Image(decode=False)
    ).save_to_disk(str(tmp_path / "ds"))
    ds = datasets.load_from_disk(str(tmp_path / "ds"))  # on disk: datasets caches maps
    first = ds.map(mapper(tiny_vl_model), batched=True)
    [cache] = first.cache_files
    written = os.stat(cache["filename"]).st_mtime_ns
    # A new callable with the same settings, as the next run would build: cache hit.
    again = ds.map(mapper(tiny_vl_model), batched=True)
    assert again._fingerprint == first._fingerprint
    assert again.cache_files == first.cache_files
    assert os.stat(cache["filename"]).st_mtime_ns == written
    assert again["text"] == first["text"]
    # Other settings: another fingerprint, another file.
    other = ds.map(mapper(tiny_vl_model, "List three tags."), batched=True)
    assert other.cache_files != first.cache_files


@pytest.mark.slow
def test_usage_columns_and_several_answers_per_row(
    vl_engine,  # type: ignore[no-untyped-def]
    tiny_vl_model: Path,
    samples: Path,
) -> None:
    cells = [{"bytes": (samples / n).read_bytes(), "path": n} for n in GOOD] + [None]
    ds = datasets.Dataset.from_dict({"image": cells})
    ds = ds.cast_column("image", datasets.Image(decode=False))
    fn = DatasetMap(
        str(tiny_vl_model),
        PROMPT,
        engine_kwargs=TINY_ENGINE_KWARGS,
        sampling=replace(SAMPLING, n=2, temperature=1.0, seed=5),
        with_usage=True,
    )
    out = ds.map(fn, batched=True, batch_size=len(cells))
    ok = out.select(range(len(GOOD)))
    assert all(len(texts) == 2 for texts in ok["text"])
    assert all(reasons == ["length"] * 2 for reasons in ok["finish_reason"])
    assert ok["output_tokens"] == [2 * SAMPLING.max_tokens] * len(GOOD)
    assert all(n > 0 for n in ok["prompt_tokens"])
    failed = out[len(GOOD)]
    assert (failed["text"], failed["finish_reason"], failed["output_tokens"]) == ([], [], 0)
    assert failed["error"].startswith("source:")


@pytest.mark.slow
def test_the_plain_call_looks_ahead_and_each_row_gets_its_answer_alone(
    vl_engine,  # type: ignore[no-untyped-def]
    tiny_vl_model: Path,
    samples: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A plain ``ds.map(DatasetMap(...))``: each call submits the next batch's rows before it
    returns (so the engine has them while datasets writes this batch and reads the next), the
    next call takes those answers instead of running its rows again, and each row's greedy
    text is still the one its picture and prompt get run alone, over three batches whose
    pictures repeat."""
    other = "What is shown?"
    names = [*GOOD, "arrow_exif_rotated.jpg", "truncated.jpg", "sunset.jpg", "checkerboard.png"]
    names += ["shapes_alpha.png", "sunset.jpg", "arrow_exif_rotated.jpg", "checkerboard.png"]
    prompts = [PROMPT] * 4 + [other] * 4 + [PROMPT, other, PROMPT, other]
    alone = {}
    for name, prompt in set(zip(names, prompts, strict=True)):
        request = Request("alone", prompt, (MediaRef("image", str(samples / name)),))
        sink = MemorySink()
        run_requests(
            [request], vl_engine, MediaOptions(), sink, SAMPLING, RunConfig(progress=False)
        )
        [row] = sink.rows
        alone[name, prompt] = row["text"] if row["error"] is None else "error"
    assert len(set(alone.values())) >= 4  # or a swapped caption could not be seen
    cells = [{"bytes": (samples / n).read_bytes(), "path": n} for n in names]
    ds = datasets.Dataset.from_dict({"image": cells, "name": names, "prompt": prompts})
    ds = ds.cast_column("image", datasets.Image(decode=False))

    events: list[int | str] = []  # requests submitted, and "returned" at each call's end
    engine_adds: list[str] = []
    real_submit, real_run = lookahead.start_in_memory, lookahead.LookAhead.run
    real_add = type(vl_engine).add

    def submitting(job, engine):  # type: ignore[no-untyped-def]
        events.append(len(job.requests))
        return real_submit(job, engine)

    def running(self, *args):  # type: ignore[no-untyped-def]
        rows = real_run(self, *args)
        events.append("returned")
        return rows

    def adding(engine, request, media, sampling):  # type: ignore[no-untyped-def]
        engine_adds.append(request.id)
        return real_add(engine, request, media, sampling)

    monkeypatch.setattr(lookahead, "start_in_memory", submitting)
    monkeypatch.setattr(lookahead.LookAhead, "run", running)
    monkeypatch.setattr(type(vl_engine), "add", adding)
    captioner = replace(mapper(tiny_vl_model), prompt_column="prompt")
    out = ds.map(captioner, batched=True, batch_size=4, with_indices=True, with_rank=True)
    monkeypatch.undo()
    for name, prompt, text, error in zip(
        out["name"], out["prompt"], out["text"], out["error"], strict=True
    ):
        assert (text if error == "" else "error") == alone[name, prompt], (name, prompt)
    # this batch's rows, then the next batch's guessed; the next call takes them all
    assert events == [4, 4, "returned", 4, "returned", "returned"], events
    assert len(engine_adds) == len(set(engine_adds)) <= len(names)  # no row ran twice


@pytest.mark.slow
def test_num_proc_workers_forked_after_a_map_build_engines_of_their_own(
    tiny_vl_model: Path, samples: Path, tmp_path: Path
) -> None:
    """datasets forks its ``num_proc`` workers from a process that mapped already: each
    starts with a copy of that process's engine, its pipeline and its look-ahead, without the
    threads that serve them (waited on, they hung the worker). Each worker builds an engine
    of its own and gives every row the text the process gives it; the process's engine stays
    its own, and maps on. In a process of its own (``map_then_fork.py`` says why)."""
    import json
    import signal

    out = tmp_path / "maps.json"
    script = Path(__file__).with_name("map_then_fork.py")
    args = [str(tiny_vl_model), str(samples), json.dumps(TINY_ENGINE_KWARGS), str(out)]
    job = subprocess.Popen([sys.executable, str(script), *args], start_new_session=True)
    try:
        assert job.wait(timeout=300) == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGKILL)  # a hung worker is not left behind
        job.wait()
    maps = json.loads(out.read_text())
    assert len(set(maps["mapped"])) == len(GOOD)  # or a row given another's could pass
    assert maps["forked_errors"] == [""] * len(GOOD)
    assert maps["forked"] == maps["mapped"]
    assert maps["again"] == maps["mapped"]
    assert len(maps["started_in"]) == 2  # an engine in each worker
    assert maps["pid"] not in maps["started_in"]  # and none anew here
    assert maps["same_engine"]
    assert maps["replicas_after"] == maps["replicas"] != []  # none ended, none restarted
