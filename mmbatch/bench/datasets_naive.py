"""A Hugging Face datasets job as a user writes it without mmbatch, timed as a process
(``mmbatch bench --whole`` with ``--modes ds-naive``): import vLLM, build ``LLM``, load the
pictures' folder as an ``imagefolder``, and ``Dataset.map`` a function that calls
``LLM.chat`` on each batch of decoded pictures (512 rows a batch), its captions then written
to a JSON lines file.

``python datasets_naive.py FOLDER OUT.jsonl SETTINGS_JSON``, run by its path so that nothing
of mmbatch is imported. ``SETTINGS_JSON``: ``{"model", "engine": {...}, "sampling": {...},
"prompt", "batch_size"}``. ``OUT.jsonl.times.json`` holds the wall-clock times at which vLLM
was imported, the engine ready and the last caption written.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any


def main(folder: str, out: str, settings_json: str) -> None:
    settings = json.loads(settings_json)
    import datasets
    from vllm import LLM, SamplingParams

    imported = time.time()
    llm = LLM(model=settings["model"], **settings["engine"])
    ready = time.time()
    sampling = SamplingParams(**settings["sampling"])
    ds = datasets.load_dataset("imagefolder", data_dir=folder, split="train")

    def caption(batch: dict[str, list[Any]]) -> dict[str, list[str]]:
        messages = [
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_pil", "image_pil": image},
                        {"type": "text", "text": settings["prompt"]},
                    ],
                }
            ]
            for image in batch["image"]
        ]
        outputs = llm.chat(messages, sampling, use_tqdm=False)
        return {"text": [output.outputs[0].text for output in outputs]}

    captioned = ds.map(
        caption, batched=True, batch_size=settings["batch_size"], load_from_cache_file=False
    )
    with open(out, "w", encoding="utf-8") as sink:
        for text in captioned["text"]:
            sink.write(json.dumps({"text": text}) + "\n")
    times = {"vllm_imported": imported, "engine_ready": ready, "done": time.time()}
    Path(out + ".times.json").write_text(json.dumps(times))


if __name__ == "__main__":
    main(*sys.argv[1:4])
