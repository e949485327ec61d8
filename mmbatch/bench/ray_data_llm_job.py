"""The whole job as Ray Data LLM's documentation writes it for a vision-language batch,
timed as a process (``mmbatch bench --whole`` with ``--modes ray-data-llm``): a local Ray,
the folder's pictures read with ``ray.data.read_images``, a ``vLLMEngineProcessorConfig``
with the multimodal stage on, ``build_processor`` with a preprocess that makes each row an
OpenAI-style chat (the picture and the prompt) with the sides' sampling, and the rows (the
picture's name and the text) to a JSON lines file. Two settings part from the documentation's
example, both for vLLM: the picture is an ``image_pil`` part (vLLM 0.26 refuses an ``image``
part; 0.26 and 0.32 take ``image_pil``), and the engine's metrics are not exported to Ray's
Prometheus endpoint (vLLM's exporter imports Ray Serve, which a Ray installed for Core and
Data lacks; no side of the bench exports metrics).

``python ray_data_llm_job.py FOLDER OUT.jsonl SETTINGS_JSON``, run by its path so that
nothing of mmbatch is imported. ``SETTINGS_JSON``: ``{"model", "engine": {...},
"sampling": {...}, "prompt", "batch_size"}``, and where the engine runs on CPUs (vLLM's CPU
build) ``"placement": {"bundles": [{"CPU": 1}]}`` (the engine's actor then asks for no
GPU) and ``"ray_init": {"num_cpus": N}`` (the CPUs Ray may hand out: Ray Data LLM's
stages each hold an actor of one CPU). Beside the output, ``OUT.jsonl.times.json``
holds the wall-clock times (``time.time()``) at which Ray was started, the processor built,
the first row came back (the engine's first answer: Ray Data LLM says no earlier moment at
which its engine is ready) and the last row was written.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

PICTURE_SUFFIXES = (".jpg", ".jpeg", ".png")


def main(folder: str, out: str, settings_json: str) -> None:
    settings = json.loads(settings_json)
    import ray
    from ray.data.llm import build_processor, vLLMEngineProcessorConfig

    times = {"ray_imported": time.time()}
    ray.init(include_dashboard=False, **settings.get("ray_init", {}))
    times["ray_initialised"] = time.time()
    paths = sorted(str(p) for p in Path(folder).iterdir() if p.suffix.lower() in PICTURE_SUFFIXES)
    pictures = ray.data.read_images(paths, include_paths=True, mode="RGB")
    config = vLLMEngineProcessorConfig(
        model_source=settings["model"],
        engine_kwargs=settings["engine"],
        prepare_multimodal_stage=True,
        concurrency=1,
        log_engine_metrics=False,
        batch_size=settings["batch_size"],
        **({"placement_group_config": settings["placement"]} if "placement" in settings else {}),
    )
    prompt, sampling = settings["prompt"], settings["sampling"]

    def preprocess(row: dict[str, Any]) -> dict[str, Any]:
        from PIL import Image

        content = [
            {"type": "image_pil", "image_pil": Image.fromarray(row["image"])},
            {"type": "text", "text": prompt},
        ]
        return {
            "messages": [{"role": "user", "content": content}],
            "sampling_params": sampling,
            "picture": Path(row["path"]).name,
        }

    def postprocess(row: dict[str, Any]) -> dict[str, Any]:
        return {"image": row["picture"], "text": row["generated_text"]}

    processor = build_processor(config, preprocess=preprocess, postprocess=postprocess)
    times["processor_built"] = time.time()
    with open(out, "w", encoding="utf-8") as sink:
        for batch in processor(pictures).iter_rows():
            times.setdefault("first_row", time.time())
            sink.write(json.dumps({"image": batch["image"], "text": batch["text"]}) + "\n")
    times["done"] = time.time()
    Path(out + ".times.json").write_text(json.dumps(times))
    ray.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:4])
