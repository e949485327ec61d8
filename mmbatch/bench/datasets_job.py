"""mmbatch's datasets faces as a user runs them, timed as a process (``mmbatch bench
--whole`` with ``--modes ds-map``, ``ds-pipelined`` or ``ds-whole``): load the pictures'
folder as an ``imagefolder`` with its pictures undecoded, then ``Dataset.map`` a
``DatasetMap`` (512 rows a batch), map its ``pipelined`` twin (256 a batch), or hand the
whole dataset to ``run_dataset``; the captions then go to a JSON lines file.

``python -m mmbatch.bench.datasets_job FACE FOLDER OUT.jsonl SETTINGS_JSON``, with
``SETTINGS_JSON`` as ``datasets_naive.py`` takes it. ``OUT.jsonl.times.json`` holds the
wall-clock times of the process's start-up moments (``mmbatch.clock``) and of the
last caption written.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from mmbatch.clock import milestones_wall

FACES = ("map", "pipelined", "whole")


def captioned(face: str, folder: str, out: str, settings: dict[str, Any]) -> Any:
    import datasets

    from mmbatch.integrations.dataset_runs import run_dataset
    from mmbatch.integrations.hf_datasets import DatasetMap
    from mmbatch.pipeline import RunConfig
    from mmbatch.types import Sampling

    ds = datasets.load_dataset("imagefolder", data_dir=folder, split="train")
    ds = ds.cast_column("image", datasets.Image(decode=False))
    task = DatasetMap(
        settings["model"],
        settings["prompt"],
        engine_kwargs=settings["engine"],
        sampling=Sampling(**settings["sampling"]),
    )
    if face == "whole":
        return run_dataset(ds, task, cache_dir=out + ".job", run=RunConfig(progress=False))
    if face == "pipelined":
        return ds.map(task.pipelined, batched=True, batch_size=256, load_from_cache_file=False)
    return ds.map(task, batched=True, batch_size=settings["batch_size"], load_from_cache_file=False)


def main(face: str, folder: str, out: str, settings_json: str) -> None:
    if face not in FACES:
        raise SystemExit(f"datasets_job: FACE must be one of {', '.join(FACES)}, not {face!r}")
    result = captioned(face, folder, out, json.loads(settings_json))
    with open(out, "w", encoding="utf-8") as sink:
        for text, error in zip(result["text"], result["error"], strict=True):
            sink.write(json.dumps({"text": text, "error": error}) + "\n")
    times = {**milestones_wall(), "done": time.time()}
    Path(out + ".times.json").write_text(json.dumps(times))


if __name__ == "__main__":
    main(*sys.argv[1:5])
