"""The real command's processes on vLLM's CPU build, as a user runs it.

Left to mmbatch, a CPU engine runs vLLM's engine core in its own process
(``mmbatch.engine.core_process``): no process under the engine process. With vLLM's
multiprocessing on (a user's ``VLLM_ENABLE_V1_MULTIPROCESSING=1``, and what vLLM does on a
GPU), the engine process mmbatch starts has vLLM's engine core under it, and a worker under
that:

* A job killed while they start (the worst case: nothing stops them, and on a GPU they hold
  it for good) leaves none of them two seconds later.
* A job that ends normally leaves nothing behind, no process and no shared memory or
  semaphore, and prints no warning of any: its engine processes are ended at once at its
  exit, without waiting for vLLM's teardown (10 s on this CPU), and the command's resource
  tracker, quiet, unlinks what they held (``mmbatch.lifetime.quiet_resource_tracker``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pytest
from processes import command, in_session, leaked_shared_memory, left_after, shared_memory
from test_end_to_end import TINY_ENGINE_ARGS

pytestmark = pytest.mark.slow

MULTIPROCESSING = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
VLLM_PROCESS = ("VLLM::EngineCore", "VLLM::Worker")
"""What vLLM calls the processes it starts (``setproctitle``)."""


def caption_command(model: Path, inputs: Path, out: Path) -> list[str]:
    argv = [sys.executable, "-m", "mmbatch", "caption", str(inputs), "--model", str(model)]
    return [*argv, "--out", str(out), "--max-tokens", "8", *TINY_ENGINE_ARGS, "--no-progress"]


def pictures(samples: Path, folder: Path) -> Path:
    folder.mkdir()
    for name in ("sunset.jpg", "checkerboard.png", "shapes_alpha.png"):
        shutil.copyfile(samples / name, folder / name)
    return folder


def test_a_job_killed_while_vllm_starts_its_processes_leaves_none(
    tiny_vl_model: Path, samples: Path, tmp_path: Path
) -> None:
    argv = caption_command(tiny_vl_model, pictures(samples, tmp_path / "in"), tmp_path / "o.jsonl")
    job = subprocess.Popen(
        argv,
        env=os.environ | MULTIPROCESSING,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # what it starts stays in its session, whatever its group
    )
    with job:
        deadline = time.monotonic() + 300
        while not any(command(pid).startswith("VLLM::Worker") for pid in in_session(job.pid)):
            assert job.poll() is None, "the job ended before vLLM started its worker"
            assert time.monotonic() < deadline, "vLLM started no worker within 300 s"
            time.sleep(0.05)
        started = [command(pid) for pid in in_session(job.pid)]
        job.kill()
    left = left_after(partial(in_session, job.pid), 2.0)
    assert not left, f"left two seconds after the job was killed: {left} (of {started})"


def test_a_finished_job_leaves_nothing_and_warns_of_no_leaked_resources(
    tiny_vl_model: Path, samples: Path, tmp_path: Path
) -> None:
    before = shared_memory()
    argv = caption_command(tiny_vl_model, pictures(samples, tmp_path / "in"), tmp_path / "o.jsonl")
    argv += ["--decode-workers", "1"]  # multiprocessing's queues and locks, released too
    job = subprocess.Popen(
        argv,
        env=os.environ | MULTIPROCESSING,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    with job:
        _, stderr = job.communicate(timeout=600)  # until every process holding it closed it
    assert job.returncode == 0, stderr[-3000:]
    assert "resource_tracker" not in stderr, stderr[-3000:]
    assert "leaked" not in stderr, stderr[-3000:]
    assert not left_after(partial(in_session, job.pid), 2.0)  # the last may still be exiting
    # The tracker, the last to go, unlinked it all (what another test holds is not counted).
    assert not leaked_shared_memory(before, 5.0)


def test_left_to_mmbatch_a_cpu_engine_runs_vllm_s_engine_core_in_its_own_process(
    tiny_vl_model: Path, samples: Path, tmp_path: Path
) -> None:
    argv = caption_command(tiny_vl_model, pictures(samples, tmp_path / "in"), tmp_path / "o.jsonl")
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    log = tmp_path / "stderr.txt"  # a file, not a pipe: nothing read meanwhile can fill it
    seen: set[str] = set()
    with log.open("w") as stderr_file:
        job = subprocess.Popen(
            argv, env=env, stdout=subprocess.DEVNULL, stderr=stderr_file, start_new_session=True
        )
        with job:
            deadline = time.monotonic() + 300
            while job.poll() is None:
                seen |= {command(pid) for pid in in_session(job.pid)}
                if time.monotonic() > deadline:
                    job.kill()  # before the ``with`` waits for it
                    pytest.fail(f"the job ran over 300 s: {seen}")
                time.sleep(0.05)
    stderr = log.read_text()
    assert job.returncode == 0, stderr[-3000:]
    assert len((tmp_path / "o.jsonl").read_text().splitlines()) == 3
    assert any("mmbatch" in name for name in seen), seen  # the job
    assert not [name for name in seen if name.startswith(VLLM_PROCESS)], seen
