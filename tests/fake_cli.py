"""The ``mmbatch`` command with the fake engine in place of vLLM.

Everything else is the real command: argument parsing, sources, loader, pipeline, the
resumable sink and the exit codes. The kill tests run it as a subprocess
(``python tests/fake_cli.py caption ...``), set up by the environment:

* ``FAKE_STEP_SECONDS``: each engine step takes that long;
* ``FAKE_REPLICAS=N``: N fake engines, each in a replica process of its own (as the real
  command runs vLLM: ``ReplicaEngine``);
* ``FAKE_ENGINE_CORE=1``: each fake engine starts a child process, as vLLM's engine starts
  its engine core, and ``FAKE_START_SECONDS`` then loads that long;
* ``FAKE_BEGUN_EARLY=1``: the command starts the fake engine itself, where it starts vLLM's
  (``builder.start_engine``): begun while the inputs are listed (``mmbatch.engine.early``),
  as the real command's is, rather than handed to it (``--model`` then names a folder with
  a ``config.json``);
* ``FAKE_TEAR_AT_ROW=N``: the job SIGKILLs itself half-way through writing its N-th row, the
  torn write that a kill during ``write`` can leave;
* ``FAKE_KILL_AT_ORDER=before`` (or ``during``): the job SIGKILLs itself once its rows are
  written, before it puts them in input order (or half-way through rewriting them);
* ``FAKE_PART_ROWS=N``: an output in object storage writes a part every N rows;
* ``FAKE_KILL_AT_STORAGE_WRITE=N``: the job SIGKILLs itself just before its N-th write or
  delete in an output in object storage (a part, a drop, the assembly, the marker, a
  clean-up, a file beside the output): every state its commit passes through.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any, NoReturn
from unittest import mock

from fake_engine import FakeEngine, Lifecycle

from mmbatch import cli
from mmbatch.engine.base import Engine
from mmbatch.jsonl import encode_line
from mmbatch.output import order
from mmbatch.output.order import RowOrder
from mmbatch.output.sinks import JsonlSink

real_write_bytes_atomic = order.write_bytes_atomic


def main(argv: Sequence[str], engine: Engine | None = None) -> int:
    with ExitStack() as patches:
        if os.environ.get("FAKE_BEGUN_EARLY") == "1":
            from mmbatch.engine import builder

            patches.enter_context(mock.patch.object(builder, "start_engine", _started_engine))
        else:
            engine = engine or fake_engine()
        tear_at = os.environ.get("FAKE_TEAR_AT_ROW")
        if tear_at is not None:
            patches.enter_context(
                mock.patch.object(JsonlSink, "write", _tearing_write(int(tear_at)))
            )
        kill_at_order = os.environ.get("FAKE_KILL_AT_ORDER")
        if kill_at_order == "before":
            patches.enter_context(mock.patch.object(RowOrder, "apply", _kill_self))
        elif kill_at_order == "during":
            patches.enter_context(mock.patch.object(order, "write_bytes_atomic", _torn_rewrite))
        _storage_faults(patches)
        return cli.main(argv, engine)


def _storage_faults(patches: ExitStack) -> None:
    from mmbatch.output import remote

    part_rows = os.environ.get("FAKE_PART_ROWS")
    if part_rows is not None:
        patches.enter_context(mock.patch.object(remote, "PART_ROWS", int(part_rows)))
    kill_at = os.environ.get("FAKE_KILL_AT_STORAGE_WRITE")
    if kill_at is None:
        return
    calls = [0]
    for name in ("put_object", "put_file", "delete_objects"):
        real = getattr(remote, name)

        def counted(*args: Any, real: Any = real) -> Any:
            calls[0] += 1
            if calls[0] == int(kill_at):
                _kill_self()
            return real(*args)

        patches.enter_context(mock.patch.object(remote, name, counted))


def fake_engine() -> Engine:
    make = partial(
        FakeEngine,
        per_step=1,
        step_seconds=float(os.environ.get("FAKE_STEP_SECONDS", "0")),
        lifecycle=Lifecycle(
            engine_core=os.environ.get("FAKE_ENGINE_CORE") == "1",
            start_seconds=float(os.environ.get("FAKE_START_SECONDS", "0")),
        ),
    )
    replicas = int(os.environ.get("FAKE_REPLICAS", "0"))
    if not replicas:
        return make()
    from mmbatch.engine.replicas import ReplicaEngine

    return ReplicaEngine(make, [None] * replicas)


def _started_engine(host: object, media: object, layout: object) -> Engine:
    """``builder.start_engine``'s stand-in: the fake engine, whatever was asked."""
    return fake_engine()


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


def _kill_self(*args: object) -> NoReturn:
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")


def _torn_rewrite(path: Path, chunks: Iterable[bytes]) -> None:
    """``write_bytes_atomic``, killed half-way through writing the temporary file."""
    lines = list(chunks)

    def half_then_kill() -> Iterator[bytes]:
        yield b"".join(lines[: len(lines) // 2])
        _kill_self()

    real_write_bytes_atomic(path, half_then_kill())


if __name__ == "__main__":
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # a hung test dumps the stacks
    sys.exit(main(sys.argv[1:]))
