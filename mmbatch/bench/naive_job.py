"""The whole job as a user writes it without mmbatch, timed as a process (``mmbatch bench
--whole``): import vLLM, build ``LLM``, open every picture of a folder with PIL, one
``LLM.chat`` call, the captions to a JSON lines file.

``python naive_job.py FOLDER OUT.jsonl SETTINGS_JSON``, run by its path so that nothing of
mmbatch is imported. ``SETTINGS_JSON``: ``{"model", "engine": {...}, "sampling": {...},
"prompt"}``. Beside the output, ``OUT.jsonl.times.json`` holds the wall-clock times
(``time.time()``) at which vLLM was imported, the engine ready and the last caption written,
so that the benchmark splits the process's time into start-up, work and exit.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main(folder: str, out: str, settings_json: str) -> None:
    settings = json.loads(settings_json)
    from PIL import Image
    from vllm import LLM, SamplingParams

    imported = time.time()
    llm = LLM(model=settings["model"], **settings["engine"])
    ready = time.time()
    paths = sorted(p for p in Path(folder).iterdir() if p.suffix.lower() in (".jpg", ".png"))
    messages = [
        [
            {
                "role": "user",
                "content": [
                    {"type": "image_pil", "image_pil": Image.open(path)},
                    {"type": "text", "text": settings["prompt"]},
                ],
            }
        ]
        for path in paths
    ]
    outputs = llm.chat(messages, SamplingParams(**settings["sampling"]), use_tqdm=False)
    with open(out, "w", encoding="utf-8") as sink:
        for path, output in zip(paths, outputs, strict=True):
            sink.write(json.dumps({"image": path.name, "text": output.outputs[0].text}) + "\n")
    times = {"vllm_imported": imported, "engine_ready": ready, "done": time.time()}
    Path(out + ".times.json").write_text(json.dumps(times))


if __name__ == "__main__":
    main(*sys.argv[1:4])
