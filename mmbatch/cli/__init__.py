"""The ``mmbatch`` command: one module per sub-command, each with ``register(commands)``.

Imports of vllm, torch and transformers happen inside the handler that needs them, so
``mmbatch --help`` answers at once.

Exit codes: 0 every item succeeded; 1 the job finished but some items failed (their rows say
why); 2 the job itself failed (bad arguments, unreadable inputs, a fatal engine error).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

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
from mmbatch.cli.options import EXIT_INTERRUPTED, EXIT_ITEMS_FAILED, EXIT_JOB_FAILED, EXIT_OK
from mmbatch.errors import MmbatchError

if TYPE_CHECKING:
    from mmbatch.engine.base import Engine

COMMANDS = (caption, frames, run, check, openai_batch, report, tiny_model, bench)

__all__ = [
    "EXIT_INTERRUPTED",
    "EXIT_ITEMS_FAILED",
    "EXIT_JOB_FAILED",
    "EXIT_OK",
    "build_parser",
    "main",
]


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage mistake said the way every other mistake is: one line,
    ``mmbatch: error: ...``, exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_JOB_FAILED, f"mmbatch: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from mmbatch import __version__

    parser = _Parser(
        prog="mmbatch",
        description="Multimodal batch captioning and extraction on vLLM's offline engine.",
    )
    parser.add_argument("--version", action="version", version=f"mmbatch {__version__}")
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_Parser
    )
    for command in COMMANDS:
        command.register(commands)
    return parser


def main(argv: Sequence[str] | None = None, engine: Engine | None = None) -> int:
    """Run the command ``argv`` names; ``engine`` replaces the vLLM engine of a job command
    (the tests' fake engine goes through the real commands this way)."""
    args = build_parser().parse_args(argv)
    try:
        code: int = args.handler(args) if engine is None else args.handler(args, engine)
    except MmbatchError as exc:
        print(f"mmbatch: error: {exc}", file=sys.stderr)
        return EXIT_JOB_FAILED
    except KeyboardInterrupt:
        # The job saved what it finished (``run_job`` says where): no traceback, and the
        # code a shell gives a process Ctrl-C ended, not 1 ("some items failed").
        print("mmbatch: interrupted; run the same command again to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    return code
