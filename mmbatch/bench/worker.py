"""One side of the benchmark, in its own process: build one engine, run every workload.

``python -m mmbatch.bench.worker SPEC.json RESULT.json``. The naive side is what a user
writes from vLLM's offline example: open each row's image with PIL, build chat messages in
dataset order, make one ``LLM.chat`` call, default engine arguments except the ones the
spec names for both sides (model, max_model_len, load_format). The mmbatch side runs the
real pipeline (loader, planner, VLLMEngine) over the same files, sampling and model.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from mmbatch.bench.monitor import GpuMonitor
from mmbatch.bench.workloads import Row, rows_for


def main(spec_path: str, result_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    side = _Naive(spec) if spec["mode"] == "naive" else _Mmbatch(spec)
    results: dict[str, Any] = {
        "mode": spec["mode"],
        "engine_start_s": side.start_s,
        "workloads": {},
    }
    side.run(rows_for("W1", [Path(p) for p in spec["warmup_images"]]))  # compile, graphs
    for workload in spec["workloads"]:
        images = [Path(p) for p in spec["images"][workload]]
        rows = rows_for(workload, images, seed=spec["seed"])
        before = side.metrics()
        with GpuMonitor() as gpu:
            start = time.perf_counter()
            measured = side.run(rows)
            wall = time.perf_counter() - start
        after = side.metrics()
        results["workloads"][workload] = {
            "requests": len(rows),
            "images": len(images),
            "distinct_images": len({r.image for r in rows}),
            "wall_s": wall,
            "gpu_busy": gpu.busy_share,
            "prefix_hit_rate": _rate(after, before, "prefix_cache_hits", "prefix_cache_queries"),
            "mm_hit_rate": _rate(after, before, "mm_cache_hits", "mm_cache_queries"),
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


def _sampling(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "max_tokens": spec["max_tokens"],
        "temperature": spec["temperature"],
        "top_p": spec["top_p"],
        "seed": spec["seed"],
        "ignore_eos": True,
    }


class _Naive:
    def __init__(self, spec: dict[str, Any]) -> None:
        import vllm
        from vllm import LLM, SamplingParams

        start = time.perf_counter()
        self.llm = LLM(model=spec["model"], disable_log_stats=False, **spec["common_engine_args"])
        self.start_s = time.perf_counter() - start
        self.params = SamplingParams(**_sampling(spec))
        self.vllm_version = vllm.__version__

    def run(self, rows: list[Row]) -> dict[str, Any]:
        from PIL import Image

        messages = [
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_pil", "image_pil": Image.open(row.image)},
                        {"type": "text", "text": row.prompt},
                    ],
                }
            ]
            for row in rows
        ]
        outputs = self.llm.chat(messages, self.params, use_tqdm=False)
        return {
            "output_tokens": sum(len(o.outputs[0].token_ids) for o in outputs),
            "prompt_tokens": sum(len(o.prompt_token_ids or ()) for o in outputs),
            "cached_tokens": sum(o.num_cached_tokens or 0 for o in outputs),
            "failed": 0,
        }

    def metrics(self) -> dict[str, float]:
        return _metrics(self.llm)


class _Mmbatch:
    def __init__(self, spec: dict[str, Any]) -> None:
        import vllm

        from mmbatch.engine.config import EngineConfig
        from mmbatch.engine.vllm import VLLMEngine

        start = time.perf_counter()
        kwargs = {**spec["common_engine_args"], **spec["mmbatch_engine_args"]}
        self.engine = VLLMEngine(
            EngineConfig(spec["model"], kwargs), {"image": 1}, render_threads=spec["render_threads"]
        )
        self.start_s = time.perf_counter() - start
        self.spec = spec
        self.vllm_version = vllm.__version__

    def run(self, rows: list[Row]) -> dict[str, Any]:
        """The rows as a user's job: the runner, writing JSON lines, as ``mmbatch caption``."""
        import tempfile

        from mmbatch.jobs import FileOutput, Job, run_job
        from mmbatch.pipeline import RunConfig
        from mmbatch.types import MediaRef, Request, Sampling

        requests = [Request(r.id, r.prompt, (MediaRef("image", r.image),)) for r in rows]
        job = Job(requests, Sampling(**_sampling(self.spec)))
        with tempfile.TemporaryDirectory() as folder:
            out = FileOutput.at(f"{folder}/rows.jsonl")
            stats = run_job(job, self.engine, out, RunConfig(progress=False)).run
        return {
            "output_tokens": stats.output_tokens,
            "prompt_tokens": stats.prompt_tokens,
            "cached_tokens": stats.cached_tokens,
            "failed": stats.failed,
            "decodes": stats.decodes,
            "engine_queue": stats.queue_summary(),
        }

    def metrics(self) -> dict[str, float]:
        return _metrics(self.engine.llm)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
