"""One line on the terminal that says where an engine's start-up is, updated in place.

An engine takes from half a minute (a tiny model on a CPU) to minutes (a large model on a
GPU) to start, and vLLM's log, which says what it is doing, goes to a file. So while the
engines start, a line on stderr names the phase and counts the seconds and the engines ready
(``mmbatch: starting vLLM: loading weights, 12 s, engines ready 1 of 2``), as a progress bar's
status line does. The phases come from what mmbatch knows of its own steps (the engines
ready, from the process's milestones, which each replica's "ready" message notes) and from
vLLM's own log lines, read from the file they go to as they are written: every engine process
(a replica's, vLLM's engine core) appends to that one file, so this process reads them all
without asking any of them.

Only a terminal gets the line: a stderr that is a file or a pipe is read afterwards, where the
summary's start-up time and its ``startup_phases`` (and vLLM's log, each line timed) say more
than a line per phase would, and where a line rewritten in place is noise. Nor does it show
where vLLM's log goes to the terminal itself (``-v``): the log is the display then.

It must never fail nor slow the job: it reads only the bytes appended since the last look,
four times a second, on a thread of its own; whatever goes wrong there ends the line, not
the job. A line printed meanwhile (``sys.stderr``) clears it first, and it is drawn again.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, TextIO

from mmbatch.clock import milestones
from mmbatch.engine.logs import terminal_fd

PHASES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("importing vLLM", ()),
    ("reading the model's settings", ("non-default args", "Resolved architecture")),
    ("starting the engine core", ("Initializing a V1 LLM engine",)),
    ("loading weights", ("Starting to load model", "Loading safetensors", "Loading weights")),
    ("profiling memory", ("Loading weights took", "Model loading took", "Memory profiling")),
    ("compiling", ("Starting torch.compile", "Dynamo bytecode transform", "Compiling a graph")),
    ("setting up the KV cache", ("KV cache size", "Available KV cache memory")),
    ("capturing CUDA graphs", ("Capturing CUDA graphs", "Profiling CUDA graph memory")),
    ("warming up", ("Warming up model", "Compile and warming up", "Graph capturing finished")),
    ("getting ready", ("init engine (profile",)),
)
"""Each phase of an engine's start-up, in order, and the vLLM log lines (a piece of each)
that say it has begun. Phases only move forward: with several engines logging to one file,
the line says the furthest any has reached."""

TICK = 0.25
"""Seconds between looks at the log and redraws of the line."""
READY = re.compile(r"engine_\d+_ready$")
"""A replica's milestone once it is ready (``ReplicaEngine``)."""
CLEAR = "\r\x1b[K"
PARTIAL_BYTES = 4096
"""The most of an unended log line kept for the next look (the phases' pieces are short)."""


def phase_of(line: str, after: int = 0) -> int:
    """The index of the furthest phase of ``PHASES`` that ``line`` (of vLLM's log) begins,
    if beyond ``after``; else ``after``."""
    for index in range(len(PHASES) - 1, after, -1):
        if any(piece in line for piece in PHASES[index][1]):
            return index
    return after


def engines_ready() -> int:
    """The engines whose start this process has seen end (their milestones)."""
    return sum(1 for name in milestones() if READY.match(name))


class StartupLine:
    """The live line (see the module docstring), for the block it is entered around: the
    start of ``engines`` engines whose vLLM log goes to ``log``. Shown only where stderr is
    a terminal and ``log`` is a file (``shows``)."""

    def __init__(
        self,
        log: str | os.PathLike[str] | None,
        engines: int,
        ready: Callable[[], int] = engines_ready,
        fd: int = 2,
    ) -> None:
        self._log = None if log is None else os.fspath(log)
        self._engines = engines
        self._ready = ready
        self._fd = fd
        self._phase = 0
        self._offset = 0
        self._partial = b""
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._drawn = ""
        self._held = False  # a line printed meanwhile is not ended yet: the status waits
        self._out: int | None = None
        self._thread: threading.Thread | None = None
        self._stderr: TextIO | None = None

    @property
    def shows(self) -> bool:
        """Whether the line is drawn: a terminal on ``fd``, and vLLM's log in a file."""
        try:
            return self._log is not None and os.isatty(terminal_fd(self._fd))
        except OSError:
            return False

    def text(self) -> str:
        """The line as it reads now."""
        seconds = time.monotonic() - self._started
        line = f"mmbatch: starting vLLM: {PHASES[self._phase][0]}, {seconds:.0f} s"
        if self._engines > 1:
            line += f", engines ready {min(self._ready(), self._engines)} of {self._engines}"
        return line

    def read_log(self) -> None:
        """Move the phase on by the lines appended to the log since the last look."""
        assert self._log is not None
        try:
            with open(self._log, "rb") as file:
                file.seek(self._offset)
                fresh = file.read(1 << 20)
        except OSError:
            return  # not there yet: the engine has not begun its log
        self._offset += len(fresh)
        # A progress bar's updates end in a carriage return; an unended line is kept short.
        *lines, partial = (self._partial + fresh).replace(b"\r", b"\n").split(b"\n")
        self._partial = partial[-PARTIAL_BYTES:]
        for line in lines:
            self._phase = phase_of(line.decode("utf-8", "replace"), self._phase)

    def __enter__(self) -> StartupLine:
        if not self.shows:
            return self
        try:
            assert self._log is not None
            self._offset = os.path.getsize(self._log) if os.path.exists(self._log) else 0
            # A copy of the terminal: vLLM's start sends descriptor 2 to its log meanwhile.
            self._out = os.dup(terminal_fd(self._fd))
            self._stderr = sys.stderr
            sys.stderr = _ClearingStream(sys.stderr, self)
            self._thread = threading.Thread(target=self._run, name="mmbatch-startup", daemon=True)
            self._thread.start()
        except Exception:
            self._end()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._end()

    def clear(self) -> None:
        """Take the line off the terminal (the start ended)."""
        with self._lock:
            self._clear()

    def print_through(self, stream: TextIO, text: str) -> int:
        """Write ``text`` to ``stream`` with the line taken off first: what is printed starts
        at the line's beginning; the line is drawn again at the next tick once what is
        printed ends its line (``print`` writes the text, then its newline)."""
        if not text:
            return stream.write(text)
        with self._lock:
            self._clear()
            written = stream.write(text)
            stream.flush()
            self._held = not text.endswith("\n")
            return written

    def _clear(self) -> None:
        if self._drawn and self._out is not None:
            self._write(CLEAR)
        self._drawn = ""

    def _run(self) -> None:
        try:
            while not self._stop.wait(TICK):
                self.read_log()
                with self._lock:
                    if self._stop.is_set() or self._out is None:
                        return
                    text = self.text()
                    if not self._held and text != self._drawn:  # once a second at most
                        self._write(CLEAR + text)
                        self._drawn = text
        except Exception:
            return  # a line that cannot be drawn is not drawn; the job goes on

    def _write(self, text: str) -> None:
        assert self._out is not None
        try:
            os.write(self._out, text.encode("utf-8", "replace"))
        except OSError:
            self._stop.set()

    def _end(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * TICK)
            self._thread = None
        self.clear()
        if self._stderr is not None:
            sys.stderr, self._stderr = self._stderr, None
        if self._out is not None:
            out, self._out = self._out, None
            os.close(out)


class _ClearingStream:
    """``sys.stderr`` while the line shows: each write takes the line off first, so that
    what is printed starts at the line's beginning; the line is drawn again at the next tick."""

    def __init__(self, stream: TextIO, line: StartupLine) -> None:
        self._stream = stream
        self._line = line

    def write(self, text: str) -> int:
        return self._line.print_through(self._stream, text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
