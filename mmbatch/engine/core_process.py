"""Where vLLM's engine core runs: in a process of its own on a GPU, as vLLM starts it, and in
the process that builds the engine on vLLM's CPU build.

vLLM's offline engine starts its engine core (the scheduler and the model runner) in a
process of its own (``VLLM_ENABLE_V1_MULTIPROCESSING``), so that on a GPU the core's loop
runs beside the engine's own work (rendering prompts, processing media, detokenizing). On
the CPU build that process, and the worker process it starts in turn, import vLLM and torch
again before the model loads: most of a CPU engine's start, for no work gained, since the
model's operators run on the same cores whichever process calls them. There the core runs
in the engine's own process (half the memory too); the texts are the same. The
measurements: ``docs/pages/performance.md#the-engine-core-in-the-engines-process-on-a-cpu``.
A user's own ``VLLM_ENABLE_V1_MULTIPROCESSING`` wins everywhere.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from mmbatch.engine.environment import environment

CORE_PROCESSES = "VLLM_ENABLE_V1_MULTIPROCESSING"
"""vLLM's switch between an engine core in a process of its own (1, its default) and one in
the process that builds the engine (0)."""


@contextmanager
def core_in_this_process(on_cpu: bool) -> Iterator[None]:
    """While open, an engine built here on vLLM's CPU build (``on_cpu``) runs its engine
    core in this process; a GPU's, or a user's own setting, is left as it is. vLLM reads
    the variable as the engine is built; this process's setting is given back afterwards."""
    with environment({CORE_PROCESSES: "0"} if on_cpu else {}, users_win=True):
        yield
