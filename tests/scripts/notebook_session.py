"""A notebook's session, run by tests/test_notebook.py in a process of its own: one-call
captions on a model, then an engine opened in a ``with`` block, closed on the way out. It
prints what it saw as one JSON line."""

import gc
import json
import sys
import weakref

from PIL import Image

import mmbatch
from mmbatch.engine.logs import library_log_file


def main(model: str, samples: str) -> None:
    kwargs = {"dtype": "float32", "max_model_len": 1024, "enforce_eager": True}
    sampling = mmbatch.Sampling(max_tokens=8)
    sunset = f"{samples}/sunset.jpg"
    with open(sunset, "rb") as handle:
        sunset_bytes = handle.read()
    board = Image.open(f"{samples}/checkerboard.png")
    quiet = mmbatch.RunConfig(progress=False)
    rows = mmbatch.caption(
        [sunset, board, sunset_bytes],
        model=mmbatch.EngineConfig(model, kwargs, log_file=library_log_file()),
        sampling=sampling,
        run=quiet,
    )
    with mmbatch.load_engine(model, **kwargs) as engine:
        again = mmbatch.caption(sunset, engine=engine, sampling=sampling, run=quiet)
        # What holds the model and its KV cache: vLLM's LLM and its engine.
        held = [weakref.ref(engine.llm), weakref.ref(engine.llm.llm_engine)]
    gc.collect()
    try:
        engine.add(None, [], sampling)  # type: ignore[arg-type]
        closed = "no error"
    except mmbatch.FatalEngineError as exc:
        closed = str(exc)
    seen = {
        "ids": [row["id"] for row in rows],
        "texts": [row["text"] for row in rows],
        "errors": [row["error"] for row in rows],
        "again": again[0]["text"],
        "released": [ref() is None for ref in held],
        "closed": closed,
    }
    print(json.dumps(seen))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
