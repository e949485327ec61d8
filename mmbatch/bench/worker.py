"""One side of the benchmark, in its own process: build one engine, run every workload.

``python -m mmbatch.bench.worker SPEC.json RESULT.json``. Three sides, the same model, media
and sampling:

* ``naive``: what a user writes from vLLM's offline example: open each row's image with PIL
  (for a video frame: open the video, seek, decode up to the frame), chat messages in the
  rows' order, one ``LLM.chat`` call, default engine arguments but the shared ones.
* ``prebuilt``: the ceiling of vLLM's own loop: every input decoded and every prompt built
  before the clock starts (W2's rows image-major), then one ``LLM.generate``.
* ``mmbatch``: the rows as a user's job through the runner (``run_job``), written to JSONL,
  on the engine the command builds (``shared_engine``: on one GPU, one engine process fed
  by this one); a variant with ``"in_process": true`` runs vLLM in this process instead.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

from mmbatch.bench.monitor import CpuMonitor, MachineLoad
from mmbatch.bench.workloads import FRAME_FPS, Row, rows_for


def main(spec_path: str, result_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    jobs = {
        workload: rows_for(
            workload,
            [Path(p) for p in spec["media"][workload]],
            seed=spec["seed"],
            seconds=spec["video_seconds"],
        )
        for workload in spec["workloads"]
    }
    spec["largest_job"] = max((len(rows) for rows in jobs.values()), default=0)
    side = SIDES[spec["mode"]](spec)
    results: dict[str, Any] = {"mode": spec["mode"], "engine_start_s": side.start_s}
    side.run(rows_for("W1", [Path(p) for p in spec["warmup_images"]]))  # compile, graphs
    results["workloads"] = {}
    for workload, rows in jobs.items():
        media = [Path(p) for p in spec["media"][workload]]
        side.prepare(rows)
        before = side.metrics()
        with MachineLoad() as load, CpuMonitor() as cpu:
            start = time.perf_counter()
            measured = side.run(rows)
            wall = time.perf_counter() - start
        after = side.metrics()
        results["workloads"][workload] = {
            "requests": len(rows),
            "images": len({(r.image, r.at) for r in rows}) if workload != "W4" else len(media),
            "distinct_images": len({(r.image, r.at) for r in rows}),
            "wall_s": wall,
            "gpu_busy": load.busy_share,
            "prefix_hit_rate": _rate(after, before, "prefix_cache_hits", "prefix_cache_queries"),
            "mm_hit_rate": _rate(after, before, "mm_cache_hits", "mm_cache_queries"),
            "cpu_seconds": cpu.seconds(),
            **measured,
        }
        print(f"bench[{spec['mode']}] {workload}: {len(rows)} requests in {wall:.1f} s", flush=True)
    results["vllm_version"] = side.vllm_version
    Path(result_path).write_text(json.dumps(results, indent=2))


def _rate(
    after: dict[str, float], before: dict[str, float], hits: str, queries: str
) -> float | None:
    q = after.get(queries, 0) - before.get(queries, 0)
    return (after.get(hits, 0) - before.get(hits, 0)) / q if q else None


def _metrics(llm: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for metric in llm.get_metrics():
        name = metric.name.removeprefix("vllm:")
        if hasattr(metric, "value") and isinstance(metric.value, (int, float)):
            out[name] = out.get(name, 0) + metric.value
    return out


def sampling_settings(spec: dict[str, Any]) -> dict[str, Any]:
    """The same sampling on every side, every setting a model's ``generation_config`` could
    fill given: mmbatch lays the model's defaults under what a job leaves unset (as vLLM's
    servers do), while the baselines' explicit ``SamplingParams`` go to vLLM as they are.
    Left unset, Qwen's defaults gave mmbatch's requests a repetition penalty and top_k=1,
    more work per engine step than the baselines did (every run before 2026-12-01's last)."""
    return {
        "max_tokens": spec["max_tokens"],
        "temperature": spec["temperature"],
        "top_p": spec["top_p"],
        "top_k": 0,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "seed": spec["seed"],
        "ignore_eos": True,
    }


def _counts(outputs: list[Any]) -> dict[str, Any]:
    return {
        "output_tokens": sum(len(o.outputs[0].token_ids) for o in outputs),
        "prompt_tokens": sum(len(o.prompt_token_ids or ()) for o in outputs),
        "cached_tokens": sum(o.num_cached_tokens or 0 for o in outputs),
        "failed": 0,
    }


def frame_at(path: str, seconds: float) -> Any:
    """The frame of ``path`` on screen at ``seconds``, the naive way: open the file, seek to
    the key frame before it, decode forward to it."""
    import av

    with av.open(path) as container:
        stream = container.streams.video[0]
        container.seek(int(seconds / stream.time_base), stream=stream)
        last = None
        for frame in container.decode(stream):
            if frame.time is not None and frame.time > seconds + 1e-6:
                break
            last = frame
        assert last is not None, (path, seconds)
        return last.to_image()


def open_image(row: Row) -> Any:
    from PIL import Image

    return Image.open(row.image) if row.at is None else frame_at(row.image, row.at)


class _Naive:
    def __init__(self, spec: dict[str, Any]) -> None:
        import vllm
        from vllm import LLM, SamplingParams

        start = time.perf_counter()
        self.llm = LLM(model=spec["model"], disable_log_stats=False, **spec["common_engine_args"])
        self.start_s = time.perf_counter() - start
        self.params = SamplingParams(**sampling_settings(spec))
        self.vllm_version = vllm.__version__

    def prepare(self, rows: list[Row]) -> None:
        """Nothing: the naive side reads its media inside the clock."""

    def run(self, rows: list[Row]) -> dict[str, Any]:
        messages = [
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_pil", "image_pil": open_image(row)},
                        {"type": "text", "text": row.prompt},
                    ],
                }
            ]
            for row in rows
        ]
        return _counts(self.llm.chat(messages, self.params, use_tqdm=False))

    def metrics(self) -> dict[str, float]:
        return _metrics(self.llm)


class _Prebuilt(_Naive):
    """Every image decoded and every prompt rendered before the clock, then one generate."""

    def __init__(self, spec: dict[str, Any]) -> None:
        from transformers import AutoProcessor

        super().__init__(spec)
        self.processor = AutoProcessor.from_pretrained(spec["model"])
        self.prompts: list[dict[str, Any]] = []

    def prepare(self, rows: list[Row]) -> None:
        ordered = sorted(rows, key=lambda r: (r.image, r.at or 0.0, r.prompt))  # image-major
        pictures = _frames(ordered) if ordered and ordered[0].at is not None else {}
        self.prompts = []
        for row in ordered:
            picture = pictures.get((row.image, row.at))
            if picture is None:
                picture = pictures[(row.image, row.at)] = open_image(row).convert("RGB")
            self.prompts.append(
                {"prompt": self._text(row.prompt), "multi_modal_data": {"image": picture}}
            )

    def _text(self, prompt: str) -> str:
        messages = [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}
        ]
        return str(
            self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        )

    def run(self, rows: list[Row]) -> dict[str, Any]:
        if not self.prompts:  # the warm-up: built here, outside any measurement
            self.prepare(rows)
        prompts, self.prompts = self.prompts, []
        return _counts(self.llm.generate(prompts, self.params, use_tqdm=False))


def _frames(rows: list[Row]) -> dict[tuple[str, float | None], Any]:
    """Every frame the rows name, decoded one pass per video (time off the clock anyway)."""
    from PIL import Image

    from mmbatch.media.video import decode_frames, index_video

    pictures: dict[tuple[str, float | None], Any] = {}
    for video in dict.fromkeys(r.image for r in rows):
        index = index_video(video)
        wanted = {r.at: index.frame_at(r.at or 0.0) for r in rows if r.image == video}
        arrays = decode_frames(video, index, wanted.values()).frames
        for at, i in wanted.items():
            pictures[(video, at)] = Image.fromarray(arrays[i])
    return pictures


class _Mmbatch:
    def __init__(self, spec: dict[str, Any]) -> None:
        """The engine(s) ``mmbatch caption`` would lay out for the largest of the side's
        jobs: how many per GPU, compiled or not, as the product decides for its users."""
        import vllm

        from mmbatch.engine import builder
        from mmbatch.engine.config import EngineConfig
        from mmbatch.engine.registry import shared_engine_and_layout

        start = time.perf_counter()
        kwargs = {**spec["common_engine_args"], **spec["mmbatch_engine_args"]}
        config = EngineConfig(
            spec["model"],
            kwargs,
            gpus=spec.get("gpus"),
            engines_per_gpu=spec.get("engines_per_gpu"),
            render_threads=spec["render_threads"],
        )
        self.engine: Any
        if spec.get("in_process"):  # as a notebook's engine: its settings as given
            host = builder.read_host(config, in_process=True)
            self.engine = builder.start_engine(host, {"image": 1}, host.layout())
        else:
            host = builder.read_host(config)
            chosen = host.layout(spec["largest_job"])
            self.engine, layout = shared_engine_and_layout(host, {"image": 1}, chosen)
            print(f"bench[mmbatch]: {layout.describe()}", flush=True)
        self.start_s = time.perf_counter() - start
        self.spec = spec
        self.vllm_version = vllm.__version__

    def prepare(self, rows: list[Row]) -> None:
        """Nothing: mmbatch reads its media inside the clock, as a job does."""

    def run(self, rows: list[Row]) -> dict[str, Any]:
        """The rows as a user's job: the runner, writing JSON lines, as ``mmbatch caption``
        (and ``mmbatch frames`` for video frames)."""
        import tempfile

        from mmbatch.jobs import Job, run_job
        from mmbatch.media.options import MediaOptions, VideoOptions
        from mmbatch.output.file_output import FileOutput
        from mmbatch.pipeline import RunConfig
        from mmbatch.sources.timeline import frame_requests
        from mmbatch.types import MediaRef, Request, Sampling

        sampling = Sampling(**sampling_settings(self.spec))
        if rows and rows[0].at is not None:
            video = VideoOptions(sampling="fps", fps=FRAME_FPS, max_frames=10**6)
            videos = list(dict.fromkeys(r.image for r in rows))
            requests = frame_requests(videos, video, rows[0].prompt)
            job = Job(requests, sampling, MediaOptions(video=video))
        else:
            requests = [Request(r.id, r.prompt, (MediaRef("image", r.image),)) for r in rows]
            job = Job(requests, sampling)
        run = RunConfig(progress=False, decode_workers=self.spec.get("decode_workers"))
        with tempfile.TemporaryDirectory() as folder:
            out = FileOutput.at(f"{folder}/rows.jsonl")
            stats = run_job(job, self.engine, out, run).run
        return {
            "output_tokens": stats.output_tokens,
            "prompt_tokens": stats.prompt_tokens,
            "cached_tokens": stats.cached_tokens,
            "failed": stats.failed,
            "decodes": stats.decodes,
            "answered_by_identical": stats.answered_by_identical,
            "engine_queue": stats.queue_summary(),
            "engine_timeline": stats.queue_timeline(),
        }

    def metrics(self) -> dict[str, float]:
        if hasattr(self.engine, "llm"):
            return _metrics(self.engine.llm)
        cache = self.engine.cache_stats()  # the engine processes' counters, as last reported
        return {
            "prefix_cache_queries": cache.prefix_queries,
            "prefix_cache_hits": cache.prefix_hits,
            "mm_cache_queries": cache.mm_queries,
            "mm_cache_hits": cache.mm_hits,
        }


SIDES: dict[str, Any] = {"naive": _Naive, "prebuilt": _Prebuilt, "mmbatch": _Mmbatch}


def _stop_once(signum: int, frame: object) -> None:
    """The first Ctrl-C or SIGTERM unwinds this side as Ctrl-C does, shutting its engine
    down on the way out rather than leaving it on the GPU; the signals after it (``timeout``
    signals the bench's whole group, and then the bench signals its side) are let pass, so
    that they do not cut that shut-down short."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGINT, _stop_once)
    signal.signal(signal.SIGTERM, _stop_once)
    main(sys.argv[1], sys.argv[2])
