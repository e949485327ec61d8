"""What vLLM's own log says of an engine's build, read from a whole-process run's log files
once it is over (``mmbatch bench --whole``: each run's ``engine_log``).

A run's start-up phases say when each engine was built; vLLM's log says what the build
spent its time on: the weights, torch.compile, the CUDA graphs, the whole ``init engine``.
On a GPU host the logs stay on the host; the report comes back. So the figures are read
into the report, one value per engine in the order its log says them, with whether vLLM
warned that it had to start its workers with ``spawn`` (each then imports vLLM again).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

FIGURES = {
    "model_loading_s": re.compile(r"Model loading took [\d.]+ GiB memory and ([\d.]+) seconds"),
    "torch_compile_s": re.compile(r"torch\.compile took ([\d.]+) s in total"),
    "graph_capture_s": re.compile(r"Graph capturing finished in ([\d.]+) secs"),
    "init_engine_s": re.compile(
        r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"
    ),
}
"""vLLM's log lines (0.26 through 0.32) and the seconds each says, by the name the report
gives them."""
SPAWN_WARNING = "We must use the `spawn` multiprocessing start method"


def engine_log_figures(paths: Iterable[Path]) -> dict[str, Any]:
    """The seconds ``FIGURES`` names, one list each, from the files among ``paths`` that
    exist (a name with no line in them is left out), and ``spawn_warning`` where vLLM gave
    it."""
    found: dict[str, Any] = {}
    for path in paths:
        if not path.is_file():
            continue
        for line in path.read_text(errors="replace").splitlines():
            for name, pattern in FIGURES.items():
                if match := pattern.search(line):
                    found.setdefault(name, []).append(float(match.group(1)))
            if SPAWN_WARNING in line:
                found["spawn_warning"] = True
    return found


def run_logs(out: Path) -> list[Path]:
    """The log files of the run whose rows go to ``out``: its own output
    (``NAME.jsonl.log``) and vLLM's (``NAME.jsonl.vllm.log``; a Ray run's ``NAME.vllm.log``
    beside its folder ``NAME``), sorted by name."""
    stem = out.name.removesuffix(".jsonl")
    return sorted(out.parent.glob(f"{stem}.*log"))
