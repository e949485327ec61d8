"""What each process of a job loads as it starts, and when: ``mmbatch caption`` (or any
mmbatch command) run whole, every process traced.

``python benchmarks/startup_loads.py --out REPORT.json -- caption PICS --model M [flags]``
runs ``python -m mmbatch caption PICS --model M ...`` with a start-up hook in every
process it starts (the job, its engine processes, vLLM's engine cores and workers: the hook
is this file, imported from a ``sitecustomize`` on ``PYTHONPATH``, which spawned processes
inherit). The hook notes each call of:

* transformers' tokenizer and processor loads (``PreTrainedTokenizerBase.from_pretrained``,
  ``ProcessorMixin.from_pretrained``, ``AutoTokenizer``/``AutoProcessor``; a load made
  inside another of the same kind is not counted twice);
* vLLM's configuration (``EngineArgs.create_engine_config``, ``create_model_config``), its
  multimodal processor (``MultiModalRegistry.create_processor``) and ``vllm.LLM`` itself;

with its thread, its start and its seconds, on the job's clock (seconds since the job's
process started). The report has, per process (its role from its place in the process
tree), the count of each and the timeline, and the job's ``startup_phases`` when the
command wrote a summary. It answers "how often is the tokenizer loaded, by whom, and does
it wait for anything" on the host that runs the engine, whatever versions it has.
"""

from __future__ import annotations

import argparse
import functools
import importlib.abc
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

TRACE_DIR = "MMBATCH_STARTUP_LOADS_DIR"
"""The environment variable naming the folder each traced process writes its lines in."""

TRACED: dict[str, list[tuple[str, str, str]]] = {
    "transformers.tokenization_utils_base": [
        ("PreTrainedTokenizerBase", "from_pretrained", "tokenizer")
    ],
    "transformers.processing_utils": [("ProcessorMixin", "from_pretrained", "processor")],
    "transformers.models.auto.processing_auto": [
        ("AutoProcessor", "from_pretrained", "AutoProcessor")
    ],
    "transformers.models.auto.tokenization_auto": [
        ("AutoTokenizer", "from_pretrained", "AutoTokenizer")
    ],
    "vllm.engine.arg_utils": [
        ("EngineArgs", "create_engine_config", "create_engine_config"),
        ("EngineArgs", "create_model_config", "create_model_config"),
    ],
    "vllm.multimodal.registry": [("MultiModalRegistry", "create_processor", "mm_create_processor")],
    "vllm.entrypoints.llm": [("LLM", "__init__", "LLM")],
}
"""Module -> (class, method, label) of each call noted, wrapped as the module is imported."""

_NESTING = threading.local()


def install() -> None:
    """Trace this process (from ``sitecustomize``) if ``TRACE_DIR`` is set: a note of its
    start, then one line per traced call."""
    if not os.environ.get(TRACE_DIR):
        return
    sys.meta_path.insert(0, _Wrapper())
    _note({"event": "start", "argv": sys.argv[:3], "ppid": os.getppid()})


def _note(line: dict[str, Any]) -> None:
    path = Path(os.environ[TRACE_DIR]) / f"{os.getpid()}.jsonl"
    line = {"pid": os.getpid(), "wall": time.time(), **line}
    with path.open("a") as file:
        file.write(json.dumps(line) + "\n")


def _wrap(cls: type, name: str, label: str) -> None:
    raw = cls.__dict__[name]
    is_classmethod = isinstance(raw, classmethod)
    function = raw.__func__ if is_classmethod else raw

    @functools.wraps(function)
    def traced(*args: Any, **kwargs: Any) -> Any:
        depth = getattr(_NESTING, label, 0)
        setattr(_NESTING, label, depth + 1)
        began = time.time()
        try:
            return function(*args, **kwargs)
        finally:
            setattr(_NESTING, label, depth)
            if not depth:  # a load inside another of its kind is the same load
                _note(
                    {
                        "event": label,
                        "began": began,
                        "seconds": round(time.time() - began, 3),
                        "thread": threading.current_thread().name,
                    }
                )

    setattr(cls, name, classmethod(traced) if is_classmethod else traced)


class _Wrapper(importlib.abc.MetaPathFinder):
    """Wraps the traced methods of a module once it is imported."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in TRACED:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        execute = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            execute(module)
            for cls, name, label in TRACED[fullname]:
                try:
                    _wrap(getattr(module, cls), name, label)
                except (AttributeError, KeyError) as exc:  # another version's layout
                    _note({"event": "not traced", "what": f"{cls}.{name}", "why": str(exc)})

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def report(trace_dir: Path, job_pid: int) -> dict[str, Any]:
    """The traced processes, each with its role, counts and timeline on the job's clock."""
    lines = [
        json.loads(line)
        for path in sorted(trace_dir.glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    starts = {line["pid"]: line for line in lines if line["event"] == "start"}
    job_start = (
        starts[job_pid]["wall"] if job_pid in starts else min(s["wall"] for s in starts.values())
    )

    def depth(pid: int) -> int:
        level = 0
        while pid != job_pid and pid in starts and level < 8:
            pid, level = starts[pid]["ppid"], level + 1
        return level if pid == job_pid else -1

    roles = {0: "job", 1: "engine process", 2: "vLLM engine core", 3: "vLLM worker"}
    processes = []
    for pid, start in sorted(starts.items(), key=lambda item: item[1]["wall"]):
        events = [line for line in lines if line["pid"] == pid and line["event"] != "start"]
        processes.append(
            {
                "pid": pid,
                "role": roles.get(depth(pid), "other"),
                "argv": start["argv"],  # a child of the job with no loads: a tracker
                "started": round(start["wall"] - job_start, 3),
                "counts": dict(Counter(e["event"] for e in events)),
                "timeline": [
                    {
                        "event": e["event"],
                        "began": round(e.get("began", e["wall"]) - job_start, 3),
                        "seconds": e.get("seconds"),
                        "thread": e.get("thread"),
                    }
                    for e in sorted(events, key=lambda e: e.get("began", e["wall"]))
                ],
            }
        )
    return {"processes": processes}


def traced_environment(folder: Path) -> tuple[dict[str, str], Path]:
    """The environment under which every Python process started traces itself, its lines
    in the folder returned (both made inside ``folder``)."""
    hook, traces = folder / "hook", folder / "traces"
    hook.mkdir()
    traces.mkdir()
    (hook / "sitecustomize.py").write_text("import startup_loads\nstartup_loads.install()\n")
    paths = [str(hook), str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]
    return os.environ | {
        TRACE_DIR: str(traces),
        "PYTHONPATH": os.pathsep.join(filter(None, paths)),
    }, traces


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the JSON report to write")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then mmbatch's arguments")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    with tempfile.TemporaryDirectory(prefix="startup-loads-") as folder:
        env, traces = traced_environment(Path(folder))
        began = time.time()
        job = subprocess.Popen([sys.executable, "-m", "mmbatch", *command], env=env)
        code = job.wait()
        result = report(traces, job.pid)
    result |= {"command": command, "exit_code": code, "wall_s": round(time.time() - began, 2)}
    summary = _summary_of(command)
    if summary is not None:
        result["startup_phases"] = summary.get("stats", {}).get("startup_phases")
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for process in result["processes"]:
        print(f"{process['role']} (pid {process['pid']}): {process['counts']}")
    return code


def _summary_of(command: list[str]) -> dict[str, Any] | None:
    """The command's summary, where its ``--out`` names one."""
    if "--out" not in command[:-1]:
        return None
    path = Path(command[command.index("--out") + 1] + ".summary.json")
    return json.loads(path.read_text()) if path.is_file() else None


if __name__ == "__main__":
    sys.exit(main())
