"""Where a job command's lines go: the summary on the streams the command started with (its
last line alone with -q, its object on stdout with --json), what other libraries print to
the engine's log (to the terminal with -v), stdout kept for the summary's object."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TextIO

from mmbatch.cli.options import EXIT_ITEMS_FAILED, EXIT_OK, engine_log_from

if TYPE_CHECKING:
    from mmbatch.output.summary import JobReport


class Terminal:
    """Where a job command's own lines go, as -q and --json say: the streams the command
    started with, kept while ``terminal_for`` silences or moves what else is printed."""

    def __init__(self, args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> None:
        self.quiet = bool(getattr(args, "quiet", False))
        self.json = bool(getattr(args, "json", False))
        self.stdout, self.stderr = stdout, stderr

    def summary(self, report: JobReport, notes: Sequence[str] = ()) -> None:
        """The summary: every line (and ``notes``), or with -q its last line, on stderr;
        with --json its object on stdout."""
        lines = [report.headline()] if self.quiet else [*report.lines(), *notes]
        for line in lines:
            print(line, file=self.stderr, flush=True)
        if self.json:
            self.document = dict(report.document)

    document: dict[str, Any] | None = None
    """The summary's object, printed on stdout once the command's own stdout is back."""

    def print_json(self) -> None:
        if self.json and self.document is not None:
            print(json.dumps(self.document, default=str), file=self.stdout, flush=True)


def show_summary(report: JobReport, args: argparse.Namespace, notes: Sequence[str] = ()) -> int:
    """Print ``report`` as the command's flags say (``Terminal``); the exit code: 0 when
    every row of the output is ok, 1 when any is an error."""
    terminal = getattr(args, "terminal", None) or Terminal(args, sys.stdout, sys.stderr)
    terminal.summary(report, notes)
    return EXIT_OK if report.failed == 0 else EXIT_ITEMS_FAILED


@contextmanager
def terminal_for(args: argparse.Namespace) -> Iterator[None]:
    """A job command's terminal while it runs: what other libraries say goes to its log
    (``OUT.vllm.log``; with -v, the terminal); with -q, mmbatch's own lines before the
    summary are dropped; with --json, whatever else would reach stdout goes to stderr, so
    that stdout holds the summary's object alone. ``args.terminal`` keeps the streams the
    summary and its errors are printed on. A command without these flags is left as is."""
    if not hasattr(args, "json"):
        yield
        return
    from contextlib import ExitStack, redirect_stderr, redirect_stdout
    from pathlib import Path

    from mmbatch.engine.logs import libraries_to_log
    from mmbatch.errors import ConfigError

    args.terminal = terminal = Terminal(args, sys.stdout, sys.stderr)
    log = engine_log_from(args)
    fresh_log = log is not None and not os.path.exists(log)
    with ExitStack() as stack:
        if args.json:
            stack.enter_context(_stdout_to_stderr())
            stack.enter_context(redirect_stdout(sys.stderr))
        if args.quiet:
            stack.enter_context(redirect_stderr(_silent()))
        stack.enter_context(libraries_to_log(log))
        try:
            yield
        except ConfigError:
            if fresh_log:  # a job that could not start leaves no file behind
                Path(str(log)).unlink(missing_ok=True)
            raise
    terminal.print_json()


@contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """File descriptor 1 onto 2 while the block runs (what C code and child processes
    print on stdout)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


_SILENT: list[TextIO] = []


def _silent() -> TextIO:
    """One stream to devnull for the process, never closed: a library that binds a handler
    to it while a command is quiet may still write to it later."""
    if not _SILENT:
        _SILENT.append(open(os.devnull, "w"))  # noqa: SIM115
    return _SILENT[0]
