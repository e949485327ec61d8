"""vLLM's engine processes on a GPU get one torch thread; this process keeps its own.

The engine core is forked or spawned while ``VLLMEngine`` builds ``vllm.LLM``; both ways of
starting a process are checked here with real processes, as vLLM starts them.
"""

from __future__ import annotations

import multiprocessing
import os
from typing import Any

import pytest
import torch

from mmbatch.engine.torch_threads import ENGINE_TORCH_THREADS, one_thread_for_engine_processes


def _report(queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    import torch

    queue.put((torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")))


def _child_threads(method: str) -> tuple[int, str | None]:
    context: Any = multiprocessing.get_context(method)
    queue = context.Queue()
    child = context.Process(target=_report, args=(queue,))
    child.start()
    try:
        return queue.get(timeout=120)  # type: ignore[no-any-return]
    finally:
        child.join()


@pytest.fixture
def two_threads(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """This process as on a machine with cores to spare and no OMP_NUM_THREADS set."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_engine_processes_started_on_a_gpu_get_one_torch_thread(
    two_threads: None, method: str
) -> None:
    with one_thread_for_engine_processes(on_gpu=True):
        threads, variable = _child_threads(method)
    assert (threads, variable) == (ENGINE_TORCH_THREADS, str(ENGINE_TORCH_THREADS))
    # this process gets its own setting back
    assert torch.get_num_threads() == 2
    assert "OMP_NUM_THREADS" not in os.environ


def test_a_users_omp_num_threads_wins(two_threads: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    with one_thread_for_engine_processes(on_gpu=True):
        assert _child_threads("fork") == (2, "2")
    assert os.environ["OMP_NUM_THREADS"] == "2"


def test_cpu_builds_keep_torchs_threads_for_the_model(two_threads: None) -> None:
    with one_thread_for_engine_processes(on_gpu=False):
        assert _child_threads("fork") == (2, None)
