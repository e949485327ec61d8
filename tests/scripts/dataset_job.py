"""``mmbatch.run_dataset`` over pictures in memory, with the fake engine in place of vLLM.

``python tests/scripts/dataset_job.py CACHE_DIR OUT.json ITEMS``: everything but the engine
is real (the dataset, the origin rule, the runner, its resumable output, the columns file);
each engine step takes ``FAKE_STEP_SECONDS``. The new columns go to ``OUT.json``. The kill
tests start it as a process of its own and SIGKILL it at random moments.
"""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import datasets
from PIL import Image

from mmbatch import DatasetMap, RunConfig, run_dataset
from mmbatch.engine import builder

sys.path.append(str(Path(__file__).resolve().parent.parent))  # tests/, where the fake engine is
from fake_engine import FakeEngine

PROMPT = "Describe this image."


def pictures(items: int) -> datasets.Dataset:
    """``items`` small distinct pictures as bytes cells, one of them broken."""
    cells: list[dict[str, Any]] = []
    for i in range(items - 1):
        buffer = io.BytesIO()
        Image.new("RGB", (16, 16), (i * 6 % 256, 255 - i * 6 % 256, (i * 37) % 256)).save(
            buffer, "PNG"
        )
        cells.append({"bytes": buffer.getvalue(), "path": f"{i:03d}.png"})
    cells.append({"bytes": b"\xff\xd8\xff\xe0 not really", "path": "broken.jpg"})
    return datasets.Dataset.from_dict({"image": cells}).cast_column(
        "image", datasets.Image(decode=False)
    )


def fake_engine(*args: Any) -> FakeEngine:
    return FakeEngine(per_step=1, step_seconds=float(os.environ.get("FAKE_STEP_SECONDS", "0")))


def main(cache_dir: str, out: str, items: str) -> None:
    with mock.patch.object(builder, "start_engine", fake_engine):
        result = run_dataset(
            pictures(int(items)),
            DatasetMap("fake", PROMPT),
            cache_dir=cache_dir,
            run=RunConfig(progress=False, decode_workers=0),
        )
    with open(out, "w", encoding="utf-8") as sink:
        json.dump({"text": list(result["text"]), "error": list(result["error"])}, sink)


if __name__ == "__main__":
    main(*sys.argv[1:4])
