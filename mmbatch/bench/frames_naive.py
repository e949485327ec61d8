"""Video frames captioned as a user writes it without mmbatch, timed as a process (``mmbatch
bench --whole`` with ``--modes frames-naive,frames``): import vLLM, build ``LLM``, decode
each video of a folder with PyAV, keep a frame per ``1 / fps`` seconds (the first one shown
at or after each step, at the video's own size), and caption them with ``LLM.chat`` a batch
at a time, the captions to a JSON lines file.

``python frames_naive.py FOLDER OUT.jsonl SETTINGS_JSON``, run by its path so that nothing
of mmbatch is imported. ``SETTINGS_JSON``: ``{"model", "engine": {...}, "sampling": {...},
"prompt", "fps", "batch_size"}``. Beside the output, ``OUT.jsonl.times.json`` holds the
wall-clock times (``time.time()``) at which vLLM was imported, the engine ready and the last
caption written, so that the benchmark splits the process's time into start-up, work and exit.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def sampled_frames(video: Path, fps: float) -> Iterator[tuple[float, Any]]:
    """Each frame of ``video`` first shown at or after a multiple of ``1 / fps`` seconds,
    with its time, as a PIL picture."""
    import av

    step, due = 1.0 / fps, 0.0
    with av.open(str(video)) as container:
        for frame in container.decode(video=0):
            if frame.time is not None and frame.time + 1e-6 >= due:
                yield frame.time, frame.to_image()
                due += step


def main(folder: str, out: str, settings_json: str) -> None:
    settings = json.loads(settings_json)
    from vllm import LLM, SamplingParams

    imported = time.time()
    llm = LLM(model=settings["model"], **settings["engine"])
    ready = time.time()
    sampling = SamplingParams(**settings["sampling"])
    videos = sorted(p for p in Path(folder).iterdir() if p.suffix.lower() == ".mp4")
    batch: list[tuple[str, float, Any]] = []
    with open(out, "w", encoding="utf-8") as sink:

        def caption(batch: list[tuple[str, float, Any]]) -> None:
            messages = [
                [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image_pil", "image_pil": picture},
                            {"type": "text", "text": settings["prompt"]},
                        ],
                    }
                ]
                for _, _, picture in batch
            ]
            outputs = llm.chat(messages, sampling, use_tqdm=False)
            for (name, pts, _), output in zip(batch, outputs, strict=True):
                row = {"video": name, "pts": round(pts, 3), "text": output.outputs[0].text}
                sink.write(json.dumps(row) + "\n")

        for video in videos:
            for pts, picture in sampled_frames(video, settings["fps"]):
                batch.append((video.name, pts, picture))
                if len(batch) == settings["batch_size"]:
                    caption(batch)
                    batch = []
        if batch:
            caption(batch)
    times = {"vllm_imported": imported, "engine_ready": ready, "done": time.time()}
    Path(out + ".times.json").write_text(json.dumps(times))


if __name__ == "__main__":
    main(*sys.argv[1:4])
