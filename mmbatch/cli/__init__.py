"""The ``mmbatch`` command: one module per sub-command, each with ``register(commands)``.

Imports of vllm, torch and transformers happen inside the handler that needs them, so
``mmbatch --help`` answers at once.

Exit codes: 0 every item succeeded; 1 the job finished but some items failed (their rows say
why); 2 the job itself failed (bad arguments, unreadable inputs, a fatal engine error); 130
Ctrl-C and 143 SIGTERM, both resumable.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from mmbatch.cli import (
    bench,
    caption,
    check,
    frames,
    openai_batch,
    report,
    run,
    tiny_model,
)
from mmbatch.cli import engine as engine_command
from mmbatch.cli.options import (
    EXIT_INTERRUPTED,
    EXIT_ITEMS_FAILED,
    EXIT_JOB_FAILED,
    EXIT_OK,
    EXIT_TERMINATED,
)
from mmbatch.cli.parsing import Parser
from mmbatch.cli.terminal import terminal_for
from mmbatch.clock import milestone
from mmbatch.errors import MmbatchError

if TYPE_CHECKING:
    from mmbatch.engine.base import Engine

COMMANDS = (caption, frames, run, check, openai_batch, report, tiny_model, bench, engine_command)

__all__ = [
    "EXIT_INTERRUPTED",
    "EXIT_ITEMS_FAILED",
    "EXIT_JOB_FAILED",
    "EXIT_OK",
    "EXIT_TERMINATED",
    "build_parser",
    "main",
]


def build_parser() -> argparse.ArgumentParser:
    from mmbatch import __version__

    parser = Parser(
        prog="mmbatch",
        description="Multimodal batch captioning and extraction on vLLM's offline engine.",
    )
    parser.add_argument("--version", action="version", version=f"mmbatch {__version__}")
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=Parser
    )
    for command in COMMANDS:
        command.register(commands)
    return parser


def main(argv: Sequence[str] | None = None, engine: Engine | None = None) -> int:
    """Run the command ``argv`` names; ``engine`` replaces the vLLM engine of a job command
    (the tests' fake engine goes through the real commands this way)."""
    args = build_parser().parse_args(argv)
    milestone("imports_done")  # every command's module imported, its arguments read
    if argv is None and engine is None:  # the command line's own process
        from mmbatch.lifetime import quiet_resource_tracker

        quiet_resource_tracker()
    try:
        with _sigterm_as_ctrl_c(), terminal_for(args):
            code: int = args.handler(args) if engine is None else args.handler(args, engine)
    except MmbatchError as exc:
        print(f"mmbatch: error: {exc}", file=sys.stderr)
        return EXIT_JOB_FAILED
    except Terminated:
        print("mmbatch: terminated; run the same command again to resume", file=sys.stderr)
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        # The job saved what it finished (``run_job`` says where): no traceback, and the
        # code a shell gives a process Ctrl-C ended, not 1 ("some items failed").
        print("mmbatch: interrupted; run the same command again to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    return code


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C would be, so that it takes the same way out."""


@contextmanager
def _sigterm_as_ctrl_c() -> Iterator[None]:
    """SIGTERM (``timeout``, Slurm, Kubernetes, ``kill``) stops a command as Ctrl-C does:
    the rows finished are closed whole and the engine processes are stopped before the
    command exits, so that a GPU is free when the job is started again. Python's default
    ends the process where it stands, leaving engines to notice on their own."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may take signals
        return

    def terminate(signum: int, frame: object) -> None:
        # Once: a second SIGTERM (a group signalled twice) must not cut the stop short.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
