"""A script that maps a dataset with ``DatasetMap``, then maps it again with ``num_proc=2``
workers, forked from this process while it keeps its engine, pipeline and look-ahead, then
maps once more here; it writes what each map gave, and which engines did the work, to a
JSON file (``test_hf_datasets``).

A process of its own, not the test's: datasets forks its workers, and a worker forked from
a process that ran torch's OpenMP threads (the tests' own, which build the tiny models and
run in-process engines) hangs in its first parallel operation, engine or none.

    python map_then_fork.py MODEL SAMPLES ENGINE_KWARGS_JSON OUT_JSON
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

PROMPT = "Describe this image."
GOOD = ["sunset.jpg", "checkerboard.png", "shapes_alpha.png", "arrow_exif_rotated.jpg"]


def main(model: str, samples: Path, engine_kwargs: dict[str, object], out: Path) -> None:
    import datasets

    from mmbatch.engine.identity import cache_path
    from mmbatch.engine.registry import kept_engine
    from mmbatch.integrations.hf_datasets import DatasetMap
    from mmbatch.types import Sampling

    cells = [{"bytes": (samples / n).read_bytes(), "path": n} for n in GOOD]
    ds = datasets.Dataset.from_dict({"image": cells})
    ds = ds.cast_column("image", datasets.Image(decode=False))
    task = DatasetMap(model, PROMPT, engine_kwargs=engine_kwargs, sampling=Sampling(max_tokens=12))
    mapped = ds.map(task, batched=True, batch_size=1)  # each batch looks ahead to the next
    engine = kept_engine(task.engine_config, {"image": 1})
    replicas = [r.process.pid for r in getattr(engine, "_replicas", [])]
    logs = cache_path().parent / "logs"
    logged = set(logs.glob("vllm-*.log"))
    forked = ds.map(task, batched=True, batch_size=1, num_proc=2, with_rank=True)
    # vLLM's log of each engine started meanwhile, named by the process that started it
    started = sorted({p.stem.rsplit("-", 1)[1] for p in set(logs.glob("vllm-*.log")) - logged})
    again = ds.map(task, batched=True, batch_size=1)
    after = kept_engine(task.engine_config, {"image": 1})
    report = {
        "pid": str(os.getpid()),
        "mapped": list(mapped["text"]),
        "forked": list(forked["text"]),
        "forked_errors": list(forked["error"]),
        "again": list(again["text"]),
        "started_in": started,
        "same_engine": engine is not None and after is engine,
        "replicas": replicas,
        "replicas_after": [r.process.pid for r in getattr(after, "_replicas", [])],
    }
    out.write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3]), Path(sys.argv[4]))
