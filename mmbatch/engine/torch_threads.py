"""How many threads torch's CPU operators get in vLLM's engine-core process on a GPU.

On one GPU, vLLM's engine core runs the scheduler and the model runner on one Python thread,
and the model runner does some CPU work with torch between GPU steps: above all, before each
vision-encoder batch it concatenates the batch's pixel values into pinned memory
(``MultiModalFlatField._reduce_data``). torch runs such an operator on a thread per core,
and on a many-core GPU host that pool stalled the copy for seconds at a time, with or
without media work beside it, while the GPU waited for the loop; on one thread the copy is
short, and the loop keeps the GPU fed. The measurements:
``docs/pages/performance.md#one-torch-thread-in-the-engine-core``.

vLLM gives its multi-GPU worker processes one torch thread for this reason
(``set_multiprocessing_worker_envs``: "to avoid unnecessary CPU contention"); its one-GPU
engine core, started from the process that builds the engine, keeps torch's default.
``one_thread_for_engine_processes`` gives the processes started while it is open one
thread (a forked process keeps torch's setting, a spawned one reads ``OMP_NUM_THREADS``)
and gives this process its own setting back afterwards.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from mmbatch.engine.environment import environment

ENGINE_TORCH_THREADS = 1


@contextmanager
def one_thread_for_engine_processes(on_gpu: bool) -> Iterator[None]:
    """While open, processes started from this one run torch on ``ENGINE_TORCH_THREADS``.

    Left alone: CPU builds (there torch's threads run the model itself) and a user's own
    ``OMP_NUM_THREADS``, which wins everywhere.
    """
    wanted = {"OMP_NUM_THREADS": str(ENGINE_TORCH_THREADS)} if on_gpu else {}
    with environment(wanted, users_win=True) as chosen:
        if not chosen:
            yield
            return
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(ENGINE_TORCH_THREADS)
        try:
            yield
        finally:
            torch.set_num_threads(threads)


def threads_as_a_local_process(given: str | None) -> None:
    """Give a process that hosts engines on a cluster (a Ray actor) the threads a process of
    the command's own has: the user's ``OMP_NUM_THREADS`` (``given``, read where the command
    ran) where there is one, else none, so that torch and vLLM choose as they do here.

    Ray sets ``OMP_NUM_THREADS`` to an actor's CPUs (1 for a replica), which torch reads as
    it is imported: the actor's own torch work (a vision batch's preprocessing, and the
    model itself on vLLM's CPU build) then ran on one thread, and
    ``one_thread_for_engine_processes`` took Ray's setting for a user's. Called before torch
    is imported in the process."""
    if given is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = given
