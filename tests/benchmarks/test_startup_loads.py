"""``benchmarks/startup_loads.py`` traces a real process: a tokenizer loaded from the tiny
model is counted once (the load inside ``AutoTokenizer`` is the same load), with its
thread, in the process's role on the job's clock."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from startup_loads import report, traced_environment


def test_a_traced_process_reports_each_load_once(tiny_vl_model: Path, tmp_path: Path) -> None:
    env, traces = traced_environment(tmp_path)
    load = f"import transformers as t; t.AutoTokenizer.from_pretrained({str(tiny_vl_model)!r})"
    subprocess.run([sys.executable, "-c", load], env=env, timeout=300, check=True)
    (process,) = report(traces, 0)["processes"]
    assert process["counts"] == {"tokenizer": 1, "AutoTokenizer": 1}
    assert {event["thread"] for event in process["timeline"]} == {"MainThread"}
    assert all(event["began"] >= 0 for event in process["timeline"])
