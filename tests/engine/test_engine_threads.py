"""vLLM's engine processes on a GPU get one torch thread; the process that starts them keeps
its own.

The engine core is forked or spawned while ``VLLMEngine`` builds ``vllm.LLM`` in an engine
process of mmbatch's own (a fresh interpreter). Each case runs in such a fresh interpreter
here too, with real fork and spawn children: this test process has run vLLM's CPU engine,
which binds torch's threads its own way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mmbatch.engine.torch_threads import ENGINE_TORCH_THREADS

ENGINE_PROCESS = """
import json, multiprocessing, os, sys
import torch
from mmbatch.engine.torch_threads import one_thread_for_engine_processes

def report(queue):
    import torch
    queue.put((torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")))

if __name__ == "__main__":
    method, on_gpu = sys.argv[1], sys.argv[2] == "gpu"
    torch.set_num_threads(2)  # as on a machine with cores to spare
    context = multiprocessing.get_context(method)
    queue = context.Queue()
    with one_thread_for_engine_processes(on_gpu=on_gpu):
        child = context.Process(target=report, args=(queue,))
        child.start()
        child_threads = queue.get(timeout=60)
        child.join()
    after = (torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS"))
    print(json.dumps({"child": child_threads, "after": after}))
"""


def engine_process(
    folder: Path, method: str, platform: str, **env: str
) -> dict[str, list[int | str | None]]:
    """What a child started inside the block saw, and this process's setting after it."""
    script = folder / "engine_process.py"  # a file: a spawned child imports its main module
    script.write_text(ENGINE_PROCESS)
    environment = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"} | env
    done = subprocess.run(
        [sys.executable, str(script), method, platform],
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_engine_processes_started_on_a_gpu_get_one_torch_thread(
    tmp_path: Path, method: str
) -> None:
    seen = engine_process(tmp_path, method, "gpu")
    assert seen["child"] == [ENGINE_TORCH_THREADS, str(ENGINE_TORCH_THREADS)]
    assert seen["after"] == [2, None]  # the starting process gets its own setting back


def test_a_users_omp_num_threads_wins(tmp_path: Path) -> None:
    seen = engine_process(tmp_path, "fork", "gpu", OMP_NUM_THREADS="2")
    assert seen["child"] == [2, "2"]
    assert seen["after"] == [2, "2"]


def test_cpu_builds_keep_torchs_threads_for_the_model(tmp_path: Path) -> None:
    assert engine_process(tmp_path, "fork", "cpu")["child"] == [2, None]
