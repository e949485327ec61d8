"""The ``mmbatch`` command with the fake engine in place of vLLM.

Everything else is the real command: argument parsing, sources, loader, pipeline, the
resumable sink and the exit codes. The kill tests run it as a subprocess
(``python tests/fake_cli.py caption ...``); ``FAKE_STEP_SECONDS`` slows each engine step,
``FAKE_REPLICAS=N`` runs N fake engines each in a replica process of its own (as the real
command runs vLLM: ``ReplicaEngine``), and ``FAKE_TEAR_AT_ROW=N`` makes the process SIGKILL
itself half-way through writing its N-th row, the torn write that a kill during ``write``
can leave.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
from collections.abc import Sequence
from functools import partial
from typing import Any
from unittest import mock

from mmbatch import cli
from mmbatch.engine.base import Engine
from mmbatch.jsonl import encode_line
from mmbatch.out.sinks import JsonlSink
from mmbatch.testing.fake_engine import FakeEngine


def main(argv: Sequence[str], engine: Engine | None = None) -> int:
    engine = engine or fake_engine()
    tear_at = os.environ.get("FAKE_TEAR_AT_ROW")
    if tear_at is None:
        return cli.main(argv, engine)
    with mock.patch.object(JsonlSink, "write", _tearing_write(int(tear_at))):
        return cli.main(argv, engine)


def fake_engine() -> Engine:
    make = partial(
        FakeEngine, per_step=1, step_seconds=float(os.environ.get("FAKE_STEP_SECONDS", "0"))
    )
    replicas = int(os.environ.get("FAKE_REPLICAS", "0"))
    if not replicas:
        return make()
    from mmbatch.engine.replicas import ReplicaEngine

    return ReplicaEngine(make, [None] * replicas)


def _tearing_write(tear_at: int) -> Any:
    real_write = JsonlSink.write
    count = 0

    def write(self: JsonlSink, row: dict[str, Any]) -> None:
        nonlocal count
        count += 1
        if count < tear_at:
            real_write(self, row)
            return
        line = encode_line(row)
        os.write(self._require_open(), line[: len(line) // 2])
        os.kill(os.getpid(), signal.SIGKILL)

    return write


if __name__ == "__main__":
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # a hung test dumps the stacks
    sys.exit(main(sys.argv[1:]))
