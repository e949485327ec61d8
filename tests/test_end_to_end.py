"""The image pipeline on the real vLLM CPU build with a tiny random-weight model.

Greedy decoding is deterministic here, which lets these tests prove the sacred property:
whatever the planner's reordering, the windows and the caches do, each id gets exactly the
text that its request produces when run alone, on an engine with every cache turned off.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mmbatch.media.options import MediaOptions
from mmbatch.output.sinks import JsonlSink
from mmbatch.pipeline import RunConfig, run_requests
from mmbatch.types import MediaRef, Request, Sampling

pytestmark = pytest.mark.slow

SAMPLING = Sampling(max_tokens=12)


def run_rows(engine, requests: list[Request], out: Path) -> dict[str, dict]:  # type: ignore[no-untyped-def]
    with JsonlSink(out) as sink:
        run_requests(requests, engine, MediaOptions(), sink, SAMPLING, RunConfig(progress=False))
    return {row["id"]: row for row in map(json.loads, out.read_text().splitlines())}


def test_reordering_and_caching_never_change_a_caption(
    vl_engine,
    samples: Path,
    tmp_path: Path,
    request: pytest.FixtureRequest,  # type: ignore[no-untyped-def]
) -> None:
    # Repeated media (two names for one picture, and each picture several times), two
    # prompts per image, written prompt-major so the planner has to regroup them. A picture's
    # second asking of a prompt runs one token longer: an identical request would be
    # answered once (``mmbatch.repeats``, tested below), and this one is to reach the engine
    # and its caches.
    names = [
        "sunset.jpg",
        "checkerboard.png",
        "sunset_copy.jpg",
        "shapes_alpha.png",
        "arrow_exif_rotated.jpg",
    ]
    prompts = ["Describe this image.", "List three tags."]
    requests = [
        Request(
            f"{p}#{i}:{name}",
            prompt,
            (MediaRef("image", str(samples / name)),),
            sampling=Sampling(max_tokens=SAMPLING.max_tokens + i),
        )
        for p, prompt in enumerate(prompts)
        for i in range(2)
        for name in names
    ]
    batched = run_rows(vl_engine, requests, tmp_path / "batched.jsonl")
    assert len(batched) == len(requests)
    # The caches did hit (read now: vLLM's metrics registry is per process, and the
    # uncached engine below would take it over).
    stats = vl_engine.cache_stats()
    assert stats.mm_hits > 0
    assert stats.prefix_hits > 0
    assert any(row["cached_tokens"] > 0 for row in batched.values())

    uncached_vl_engine = request.getfixturevalue("uncached_vl_engine")
    texts = set()
    for request in requests:
        alone = run_rows(uncached_vl_engine, [request], tmp_path / "alone.jsonl")
        row, solo = batched[request.id], alone[request.id]
        assert row["error"] is None
        assert solo["error"] is None
        assert row["text"] == solo["text"], request.id
        assert row["output_tokens"] == solo["output_tokens"] > 0
        texts.add(row["text"])
    # Different pictures and prompts must not all collapse to one caption, or this test
    # could not tell a swapped caption from a right one.
    assert len(texts) >= 4


def test_rendering_on_several_threads_never_changes_a_caption(
    vl_engine, tiny_vl_model: Path, samples: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """Three render threads finish requests' preprocessing out of order, with vLLM's
    processor cache off; each id still gets the caption the one-thread engine gives it
    (which the test above holds to the caption it gets alone)."""
    from conftest import TINY_ENGINE_KWARGS

    from mmbatch.engine.config import EngineConfig
    from mmbatch.engine.registry import shared_engine

    names = ["sunset.jpg", "checkerboard.png", "shapes_alpha.png", "arrow_exif_rotated.jpg"]
    requests = [
        Request(f"{p}:{name}", prompt, (MediaRef("image", str(samples / name)),))
        for p, prompt in enumerate(["Describe this image.", "List three tags."])
        for name in names
    ]
    config = EngineConfig(str(tiny_vl_model), TINY_ENGINE_KWARGS, render_threads=3)
    threaded = shared_engine(config, {"image": 1})
    try:
        parallel = run_rows(threaded, requests, tmp_path / "parallel.jsonl")
    finally:
        threaded.close()  # type: ignore[attr-defined]
    serial = run_rows(vl_engine, requests, tmp_path / "serial.jsonl")
    for request in requests:
        assert parallel[request.id]["error"] is None
        assert parallel[request.id]["text"] == serial[request.id]["text"], request.id
    assert len({row["text"] for row in serial.values()}) >= 4


class SendAndFinishOrder:
    """The engine, noting each request's ``max_tokens`` in the order it was sent, and each
    output's length in the order it came back: read off the output itself, not off the id
    the engine gave it (everything else goes to the engine untouched)."""

    def __init__(self, engine) -> None:  # type: ignore[no-untyped-def]
        self.engine = engine
        self.sent: list[int] = []
        self.finished: list[int] = []

    def add(self, request, media, sampling) -> None:  # type: ignore[no-untyped-def]
        self.sent.append(sampling.max_tokens)
        self.engine.add(request, media, sampling)

    def step(self):  # type: ignore[no-untyped-def]
        results = self.engine.step()
        self.finished += [result.usage.output_tokens for result in results]
        return results

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self.engine, name)


def test_results_finishing_in_reverse_order_keep_their_ids(
    vl_engine,
    samples: Path,
    tmp_path: Path,
    request: pytest.FixtureRequest,  # type: ignore[no-untyped-def]
) -> None:
    """Requests of one length finish in the order sent, which hides results matched to ids
    by position. These run to 16, 12, 8 and 4 tokens, sent in that order, so they finish in
    reverse; each id must still get the text its request gets alone."""
    image = (MediaRef("image", str(samples / "sunset.jpg")),)
    # One picture: one group, its requests sent in the order of their prompts.
    prompts = ["Describe this image.", "List three tags.", "Name the colours.", "What is it?"]
    requests = [
        Request(f"{n} tokens", prompt, image, sampling=Sampling(max_tokens=n, ignore_eos=True))
        for n, prompt in zip((16, 12, 8, 4), prompts, strict=True)
    ]
    engine = SendAndFinishOrder(vl_engine)
    batched = run_rows(engine, requests, tmp_path / "batched.jsonl")
    assert engine.sent == [16, 12, 8, 4]
    # The premise: every position would be matched wrongly. (Mostly they finish in reverse;
    # two that finish at one step come back in the engine's order, [8, 4, 12, 16].)
    assert sorted(engine.finished) == [4, 8, 12, 16]
    assert all(done != sent for done, sent in zip(engine.finished, engine.sent, strict=True))
    uncached_vl_engine = request.getfixturevalue("uncached_vl_engine")
    for asked in requests:
        alone = run_rows(uncached_vl_engine, [asked], tmp_path / "alone.jsonl")[asked.id]
        row = batched[asked.id]
        assert row["error"] is None
        assert row["output_tokens"] == alone["output_tokens"] == asked.sampling.max_tokens
        assert row["text"] == alone["text"], asked.id
    assert len({row["text"] for row in batched.values()}) == 4


def test_repeated_pictures_are_answered_once_with_the_text_each_gets_alone(
    vl_engine,  # type: ignore[no-untyped-def]
    samples: Path,
    tmp_path: Path,
) -> None:
    """Greedy, a question asked again of a picture (the same file, or its copy under another
    name, which the planner groups apart) reaches the engine once (``mmbatch.repeats``);
    every id still gets the text its request gets alone, and the summary counts the
    repeats."""
    prompt = "Describe this image."
    names = ["sunset.jpg", "checkerboard.png", "sunset.jpg", "sunset_copy.jpg", "checkerboard.png"]
    requests = [
        Request(f"{i}:{name}", prompt, (MediaRef("image", str(samples / name)),))
        for i, name in enumerate(names)
    ]
    engine = SendAndFinishOrder(vl_engine)
    out = tmp_path / "repeated.jsonl"
    with JsonlSink(out) as sink:
        stats = run_requests(
            requests, engine, MediaOptions(), sink, SAMPLING, RunConfig(progress=False)
        )
    rows = {row["id"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert len(engine.sent) == 2
    assert stats.answered_by_identical == 3
    assert "repeats: 3 requests answered by an identical request's answer" in stats.summary()
    # Alone: a pipeline of its own each (nothing remembered), on the engine the tests above
    # hold to the uncached one.
    alone = {
        name: run_rows(vl_engine, [asked], tmp_path / "alone.jsonl")[asked.id]
        for name, asked in zip(names[:2], requests[:2], strict=True)
    }
    for asked, name in zip(requests, names, strict=True):
        row, solo = rows[asked.id], alone[name.replace("_copy", "")]
        assert row["error"] is None
        assert row["text"] == solo["text"], asked.id
        assert row["output_tokens"] == solo["output_tokens"] > 0
    assert alone["sunset.jpg"]["text"] != alone["checkerboard.png"]["text"]


def hub_cache(model_dir: Path, home: Path, repo_id: str) -> dict[str, str]:
    """Lay ``model_dir`` out as the Hugging Face cache holds a downloaded ``repo_id``, and
    return the environment that makes hub loading resolve there with no network."""
    revision = "0" * 40
    repo = home / "hub" / ("models--" + repo_id.replace("/", "--"))
    shutil.copytree(model_dir, repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    return {"HF_HOME": str(home), "HF_HUB_OFFLINE": "1"}


def test_cli_captions_the_samples_with_a_hub_model_name(
    tiny_vl_model: Path, samples: Path, tmp_path: Path
) -> None:
    # A hub name, not a path: the same loading code a user with the hub runs, served from
    # the local cache because no hub is reachable here.
    env = hub_cache(tiny_vl_model, tmp_path / "hf", "mmbatch-test/tiny-qwen2-vl")
    out = tmp_path / "captions.jsonl"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mmbatch",
            "caption",
            str(samples),
            "--model",
            "mmbatch-test/tiny-qwen2-vl",
            "--out",
            str(out),
            "--max-tokens",
            "8",
            *TINY_ENGINE_ARGS,
        ],
        capture_output=True,
        text=True,
        env=os.environ | env,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]  # one sample is a truncated JPEG
    rows = {Path(r["id"]).name: r for r in map(json.loads, out.read_text().splitlines())}
    # The folder's video and wav are not for this model (no --as-clip, no audio): skipped.
    images = [p.name for p in samples.iterdir() if p.suffix not in (".mp4", ".wav")]
    assert sorted(rows) == sorted(images)
    assert rows["truncated.jpg"]["error"]["stage"] == "decode"
    assert rows["sunset.jpg"]["media_hash"] == rows["sunset_copy.jpg"]["media_hash"]
    assert rows["sunset.jpg"]["text"] == rows["sunset_copy.jpg"]["text"]
    for name, row in rows.items():
        if name != "truncated.jpg":
            assert row["error"] is None, row
            assert row["text"], row
            assert row["output_tokens"] > 0, row
    # 6 files, 5 decodable, 4 distinct pictures: each decoded once.
    assert "6 of 6 items: 5 ok, 1 failed (1 at decode)" in proc.stderr
    assert "media: 4 decoded" in proc.stderr
    # Quiet by default: vLLM's start-up log went to a file beside the output, named here.
    log = tmp_path / "captions.jsonl.vllm.log"
    assert f"its log goes to {log}" in proc.stderr
    assert "INFO" not in proc.stderr + proc.stdout
    for line in ("Resolved architecture", "Loading safetensors checkpoint shards"):
        assert line not in proc.stderr + proc.stdout
    logged = log.read_text()
    assert "Resolved architecture" in logged
    assert "Loading safetensors checkpoint shards" in logged
    summary = json.loads(Path(f"{out}.summary.json").read_text())
    assert_start_up_in_steps(summary["stats"]["startup_phases"])


def assert_start_up_in_steps(phases: dict[str, float]) -> None:
    """A job's start-up phases name each step of its own process's checks and of its
    engine's start, in the order each process takes them (the engine reads its chat
    template beside its build, so that one is placed only between its neighbours)."""
    job = ["engine_processes_spawned", "preflight_passed", "template_read", "counts_read",
           "settings_checked", "engines_ready"]  # fmt: skip
    engine = ["engine_0_started", "engine_0_vllm_imported", "engine_0_template_read",
              "engine_0_ready"]  # fmt: skip
    built = ["engine_0_vllm_imported", "engine_0_llm_built", "engine_0_ready"]
    for steps in (job, engine, built):
        missing = [name for name in steps if name not in phases]
        assert not missing, f"{missing} not in {phases}"
        assert [phases[name] for name in steps] == sorted(phases[name] for name in steps), phases


TINY_ENGINE_ARGS = [
    "--engine-arg",
    "dtype=float32",
    "--engine-arg",
    "max_model_len=1024",
    "--engine-arg",
    "enforce_eager=true",
]


def test_cli_interrupted_while_decoding_resumes_to_the_uninterrupted_texts(
    vl_engine,  # type: ignore[no-untyped-def]
    tiny_vl_model: Path,
    samples: Path,
    tmp_path: Path,
) -> None:
    """Ctrl-C on the real command while vLLM generates (``tests/manual/test_kill_sweep.py``
    SIGKILLs it there too): ``check_stopped_while_decoding_then_resumed``."""
    check_stopped_while_decoding_then_resumed(vl_engine, tiny_vl_model, samples, tmp_path, "Ctrl-C")


def check_stopped_while_decoding_then_resumed(
    vl_engine,  # type: ignore[no-untyped-def]
    tiny_vl_model: Path,
    samples: Path,
    tmp_path: Path,
    how: str,
) -> None:
    """The real command on vLLM, SIGKILLed or interrupted by Ctrl-C (SIGINT to its process
    group, as a terminal sends it) while the engine is generating (a moment after its first
    row, drawn from a fixed seed), then resumed by the same command in this process on the
    session's engine. Ctrl-C ends it with exit 130, every written row whole, and no vLLM
    process left (two seconds after a SIGKILL, nothing it started is left). An
    engine start costs ~20-40 s here, so the random kills and interrupts are in
    test_kill_resume.py and test_interrupt.py with fake engines; this proves the same on
    the real engine."""
    import random
    import signal
    import uuid

    from test_interrupt import assert_none_left

    from mmbatch.cli import build_parser, caption
    from mmbatch.output.sinks import MemorySink
    from mmbatch.sources.files import image_requests

    shutil.copytree(samples, tmp_path / "media")
    manifest = tmp_path / "items.jsonl"
    prompts = ["Describe.", "Tags?", "Colors?", "Objects?", "Mood?", "Text?"]
    names = sorted(p.name for p in samples.iterdir() if p.suffix not in (".mp4", ".wav"))
    with manifest.open("w") as handle:
        for name in names:
            for i, prompt in enumerate(prompts if name != "truncated.jpg" else prompts[:1]):
                row = {"id": f"{name}#{i}", "path": f"media/{name}", "prompt": prompt}
                handle.write(json.dumps(row) + "\n")
    requests = image_requests([str(manifest)], "unused")
    reference = MemorySink()
    run = RunConfig(progress=False)
    run_requests(requests, vl_engine, MediaOptions(), reference, Sampling(max_tokens=16), run)
    expected = {r["id"]: (r["text"], r["error"]) for r in reference.rows}

    out = tmp_path / "out.jsonl"
    argv = [sys.executable, "-m", "mmbatch", "caption", str(manifest), "--model"]
    argv += [str(tiny_vl_model), "--out", str(out), "--max-tokens", "16"]
    argv += [*TINY_ENGINE_ARGS, "--engine-arg", "block_size=32", "--no-progress"]
    # One request at a time, so that rows come out one after another and a kill soon after
    # the first lands in the middle of the job (at full width they finish together; with
    # four at a time, an idle machine finished the 31 within the 0.3 s after the first).
    argv += ["--engine-arg", "max_num_seqs=1"]

    def whole_rows() -> list[dict]:  # type: ignore[type-arg]
        data = out.read_bytes() if out.exists() else b""
        return [json.loads(line) for line in data[: data.rfind(b"\n") + 1].splitlines()]

    mark = uuid.uuid4().hex
    job = subprocess.Popen(
        argv,
        env=os.environ | {"MMBATCH_TEST_MARK": mark},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # a group of its own, as a terminal's foreground job
    )
    with job:  # its pipe closed, whatever fails below
        deadline = time.monotonic() + 300
        while job.poll() is None and not whole_rows():
            assert time.monotonic() < deadline, "no row within 300 s"
            time.sleep(0.01)
        time.sleep(random.Random(how).uniform(0, 0.1))  # a moment drawn from a fixed seed
        if how == "SIGKILL":
            job.send_signal(signal.SIGKILL)
            assert job.wait(timeout=60) == -signal.SIGKILL, "the job ended before the kill"
        else:
            os.killpg(job.pid, signal.SIGINT)
            try:
                code = job.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(job.pid, signal.SIGKILL)  # a hung job is not left behind
                raise AssertionError("the job hung after Ctrl-C") from None
            assert code == 130, job.stderr.read().decode()[-3000:]  # type: ignore[union-attr]
            stderr = job.stderr.read().decode()  # type: ignore[union-attr]
            assert "run the same command again to resume" in stderr.splitlines()[-1]
            assert out.read_bytes().endswith(b"\n")  # closed, not torn
    # The engine process (and with it vLLM's engine) went with the job: at once once killed.
    assert_none_left(mark, job.pid, seconds=2.0 if how == "SIGKILL" else 10.0)
    rows = whole_rows()
    assert 0 < len(rows) < len(requests)
    assert len({r["id"] for r in rows}) == len(rows)
    for row in rows:
        assert (row["text"], row["error"]) == expected[row["id"]], row["id"]

    args = build_parser().parse_args(argv[3:])
    assert caption.run(args, vl_engine) == 1  # truncated.jpg
    rows = whole_rows()
    assert sorted(r["id"] for r in rows) == sorted(expected)
    assert {r["id"]: (r["text"], r["error"]) for r in rows} == expected


def test_cli_caption_begins_its_engine_while_listing_and_writes_the_same_rows(
    vl_engine,  # type: ignore[no-untyped-def]
    tiny_vl_model: Path,
    samples: Path,
    tmp_path: Path,
) -> None:
    """The real command on a folder of pictures begins its engine before it lists them
    (``mmbatch.engine.early``; its summary's start-up phases say so), and its rows are
    those of the same job run on an engine given to it, started before the command ran."""
    from mmbatch.cli import build_parser, caption

    pictures = tmp_path / "pictures"
    pictures.mkdir()
    for path in samples.iterdir():
        if path.suffix not in (".mp4", ".wav"):
            shutil.copy(path, pictures / path.name)
    out = tmp_path / "early.jsonl"
    argv = ["caption", str(pictures), "--model", str(tiny_vl_model), "--out", str(out)]
    argv += ["--max-tokens", "12", *TINY_ENGINE_ARGS, "--engine-arg", "block_size=32"]
    argv += ["--no-progress"]
    proc = subprocess.run(
        [sys.executable, "-m", "mmbatch", *argv], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 1, proc.stderr[-3000:]  # truncated.jpg
    summary = json.loads((tmp_path / "early.jsonl.summary.json").read_text())
    phases = summary["stats"]["startup_phases"]
    assert phases["engine_start_begun"] < phases["inputs_listed"] < phases["engines_ready"]

    given = tmp_path / "given.jsonl"
    args = build_parser().parse_args([*argv[:5], str(given), *argv[6:]])
    assert caption.run(args, vl_engine) == 1

    def rows(path: Path) -> dict[str, tuple[str | None, dict | None]]:  # type: ignore[type-arg]
        found = [json.loads(line) for line in path.read_text().splitlines()]
        return {Path(r["id"]).name: (r["text"], r["error"]) for r in found}

    early, expected = rows(out), rows(given)
    assert sorted(early) == sorted(p.name for p in pictures.iterdir())
    assert early == expected


def test_cpu_build_gets_a_sized_kv_cache_unless_the_user_chose(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Without it vLLM's CPU backend reserves 92% of RAM and refuses to start when another
    # process holds some: the README's first command failed that way on a busy machine.
    from mmbatch.engine.config import EngineConfig
    from mmbatch.engine.vllm_settings import (
        DEFAULT_CPU_KV_CACHE_BYTES,
        _cpu_kv_cache_default,
        engine_settings,
    )

    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    settings = engine_settings(EngineConfig(model="some/model"), None)
    assert settings.on_cpu  # vLLM's CPU build runs these tests
    assert settings.llm_kwargs["kv_cache_memory_bytes"] == DEFAULT_CPU_KV_CACHE_BYTES
    kwargs: dict[str, object] = {}
    _cpu_kv_cache_default(kwargs)
    assert kwargs == {"kv_cache_memory_bytes": DEFAULT_CPU_KV_CACHE_BYTES}
    chosen: dict[str, object] = {"gpu_memory_utilization": 0.5}
    _cpu_kv_cache_default(chosen)
    assert chosen == {"gpu_memory_utilization": 0.5}
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")
    from_env: dict[str, object] = {}
    _cpu_kv_cache_default(from_env)
    assert from_env == {}


def test_an_engine_started_and_closed_beside_a_held_one_leaves_it_working(
    uncached_vl_engine,  # type: ignore[no-untyped-def]
    tiny_vl_model: Path,
    samples: Path,
    tmp_path: Path,
) -> None:
    """A notebook holds engine a (in this process, as ``load_engine`` starts it here) and
    captions with model b: b starts beside a in the same process and closes again, and
    vLLM's state that both use there (its distributed groups) stays for a, which then
    captions as it did before."""
    from conftest import TINY_ENGINE_KWARGS

    import mmbatch
    from mmbatch.engine.config import EngineConfig
    from mmbatch.engine.vllm import VLLMEngine

    assert isinstance(uncached_vl_engine, VLLMEngine)
    picture = str(samples / "sunset.jpg")
    before = mmbatch.caption(picture, engine=uncached_vl_engine, sampling=SAMPLING)
    other = {**TINY_ENGINE_KWARGS, "max_num_seqs": 4}  # another engine of the same model
    b = EngineConfig(str(tiny_vl_model), other, str(tmp_path / "b.vllm.log"))
    [row_b] = mmbatch.caption(picture, model=b, sampling=SAMPLING)
    after = mmbatch.caption(picture, engine=uncached_vl_engine, sampling=SAMPLING)
    assert row_b["error"] is None
    assert [row["error"] for row in before + after] == [None, None]
    assert after[0]["text"] == before[0]["text"] != ""
