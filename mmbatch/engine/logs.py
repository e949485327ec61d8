"""What other libraries say goes to the job's log file, not to the terminal; decided here.

A job's terminal shows mmbatch's own lines (what is run, the progress bar, the summary) and
its errors. vLLM, transformers, torch, Triton and Ray speak through three channels, each
routed here while a command runs, unless ``-v`` (``path`` None) leaves them on the terminal:

* **Python's logging** (``libraries_to_log``): at each record a library logs, the handlers
  it would reach that print on the terminal (transformers' and Ray's own, vLLM's default, the
  last resort) hand it to the log file instead, however late the library set them up (vLLM
  and transformers are imported half-way through a job). Pointed back when the command ends.
* **Python's warnings** (``libraries_to_log``): shown in the log file.
* **What is printed** below Python's logging (C++ lines of Ray's core worker, progress bars,
  the engine's processes): ``printed_to`` sends file descriptors 1 and 2 to the log file,
  around the parts of a job where mmbatch itself prints nothing (an engine's start, a replica
  process's whole life, a Ray job's run); processes started meanwhile inherit it.

vLLM's start-up log (about a hundred lines) is the largest part. vLLM configures its logging
when it is imported, and again when an engine is built, from ``VLLM_LOGGING_CONFIG_PATH``; so
``engine_log(path)`` points that config at a file handler, for this process and for the
engine processes started meanwhile (they read the environment), and prints into the same
file while the block runs (weight-loading progress bars, C++ warnings). vLLM's later
messages keep going to the file through the handler. ``None`` leaves everything where vLLM
sends it (``-v``).
"""

from __future__ import annotations

import json
import logging
import logging.config
import os
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO, TypeAlias

from mmbatch.engine.environment import environment

VllmLog: TypeAlias = "str | os.PathLike[str] | None"
"""Where a Python call (``caption``, ``load_engine``, ``DatasetMap``) sends vLLM's log:
``"auto"``, a file of its own (``library_log_file``), as a command puts ``OUT.vllm.log``
beside its output; a path: there; None: wherever vLLM prints it (the terminal)."""


def library_log_file(setting: VllmLog = "auto") -> str | None:
    """The file ``setting`` (a ``VllmLog``) names: for ``"auto"``,
    ``$MMBATCH_CACHE_DIR/logs/vllm-<date>-<time>-<pid>.log`` (``~/.cache/mmbatch`` by
    default), new for each process."""
    if setting is None:
        return None
    if setting != "auto":
        return os.fspath(setting)
    from mmbatch.engine.identity import cache_path

    stamp = time.strftime("%Y%m%d-%H%M%S")
    return str(cache_path().parent / "logs" / f"vllm-{stamp}-{os.getpid()}.log")


@contextmanager
def engine_log(path: str | Path | None) -> Iterator[None]:
    """While the block runs, vLLM's log and everything printed go to ``path`` (appended);
    vLLM's logger keeps writing there afterwards. ``os.devnull`` drops them."""
    if path is None:
        yield
        return
    target = str(path)
    Path(target).parent.mkdir(parents=True, exist_ok=True)
    config = {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "plain": {"format": "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s"}
        },
        "handlers": {
            "file": {
                "class": "logging.FileHandler",
                "filename": target,
                "formatter": "plain",
                "mode": "a",
                "encoding": "utf-8",
            }
        },
        "loggers": {"vllm": {"handlers": ["file"], "level": "INFO", "propagate": False}},
    }
    handle, config_path = tempfile.mkstemp(prefix="mmbatch-vllm-logging-", suffix=".json")
    with os.fdopen(handle, "w") as file:
        json.dump(config, file)
    logging_to_file = {"VLLM_CONFIGURE_LOGGING": "1", "VLLM_LOGGING_CONFIG_PATH": config_path}
    try:
        with environment(logging_to_file), printed_to(target):
            if "vllm.logger" in sys.modules:  # configured already: point it at the file now
                logging.config.dictConfig(config)
            yield
    finally:
        Path(config_path).unlink(missing_ok=True)


@contextmanager
def printed_to(
    target: str | os.PathLike[str] | None, *, every_thread: bool = False
) -> Iterator[None]:
    """File descriptors 1 and 2 (what C code, subprocesses and Python write) into
    ``target`` (appended) while the block runs; None leaves them on the terminal.

    Blocks may overlap across threads (the Ray command starts Ray on a thread while its
    main thread checks the settings, vLLM's log dropped meanwhile): the descriptors go to
    the target of the block entered last of those still open, and back to the terminal
    when none is, whatever order they end in.

    What other threads print through ``sys.stdout`` and ``sys.stderr`` still reaches the
    terminal (``_RoutedStream``): in a job's process those are the job's own lines. A
    process whose every line is its libraries' (an engine process) passes ``every_thread``:
    while the block runs, every thread of it prints into ``target``, the model's processor
    loading on a thread of its own beside ``vllm.LLM`` among them."""
    if target is None:
        yield
        return
    Path(target).parent.mkdir(parents=True, exist_ok=True)
    log = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    entry = [log]
    printing = _EVERY_THREAD if every_thread else threading.get_ident()
    with _PRINTED_LOCK:
        sys.stdout.flush()
        sys.stderr.flush()
        if not _PRINTED_TO:
            _TERMINAL[:] = [os.dup(1), os.dup(2)]
        _route_other_threads()
        _PRINTED_TO.append(entry)
        _PRINTING_THREADS.append(printing)
        os.dup2(log, 1)
        os.dup2(log, 2)
    try:
        yield
    finally:
        with _PRINTED_LOCK:
            sys.stdout.flush()
            sys.stderr.flush()
            _PRINTED_TO.remove(entry)
            _PRINTING_THREADS.remove(printing)
            if _PRINTED_TO:
                os.dup2(_PRINTED_TO[-1][0], 1)
                os.dup2(_PRINTED_TO[-1][0], 2)
            else:
                os.dup2(_TERMINAL[0], 1)
                os.dup2(_TERMINAL[1], 2)
                for fd in _TERMINAL:
                    os.close(fd)
                _TERMINAL.clear()
            os.close(log)


def terminal_fd(fd: int) -> int:
    """Where descriptor ``fd`` (1 or 2) pointed before the open ``printed_to`` blocks sent it
    to a log file (a copy, valid while they are open); ``fd`` itself where none is open."""
    copies = list(_TERMINAL)
    return copies[fd - 1] if copies and fd in (1, 2) else fd


class _RoutedStream:
    """``sys.stdout`` or ``sys.stderr`` (over descriptor 1 or 2) once a ``printed_to`` block
    was opened: a thread inside no open block writes to the terminal (``terminal_fd``), so
    that the job's own lines reach it while another thread's block (an engine's start begun
    while the inputs are read) sends the descriptors to a log; a thread inside one, or any
    thread while none is open, writes to the stream as before."""

    _mmbatch_routed = True

    def __init__(self, stream: TextIO, fd: int) -> None:
        self._stream = stream
        self._fd = fd

    def write(self, text: str) -> int:
        terminal = terminal_fd(self._fd)
        printing = _PRINTING_THREADS
        if terminal == self._fd or threading.get_ident() in printing or _EVERY_THREAD in printing:
            return self._stream.write(text)
        self._stream.flush()
        try:
            os.write(terminal, text.encode(self._stream.encoding or "utf-8", "replace"))
        except OSError:  # the blocks closed meanwhile, and the copy with them
            return self._stream.write(text)
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _route_other_threads() -> None:
    """``sys.stdout`` and ``sys.stderr`` as ``_RoutedStream``s, where they write to the
    process's descriptors 1 and 2 (not where something captures them, a test's capture)."""
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, name)
        if getattr(stream, "_mmbatch_routed", False):
            continue
        try:
            writes_to = stream.fileno()
        except (AttributeError, OSError, ValueError):
            continue
        if writes_to == fd:
            setattr(sys, name, _RoutedStream(stream, fd))


_PRINTED_LOCK = threading.Lock()
_PRINTING_THREADS: list[int] = []
"""The threads inside an open ``printed_to`` block, once for each."""
_EVERY_THREAD = -1
"""In ``_PRINTING_THREADS`` for a block that every thread prints inside (no thread's id)."""
_PRINTED_TO: list[list[int]] = []
"""The open ``printed_to`` blocks' files, in the order they were entered (each a list of
its one descriptor: a block's own entry, however many name the same file)."""
_TERMINAL: list[int] = []
"""Copies of descriptors 1 and 2 as they were before the first open block."""


_FORMAT = "%(levelname)s %(asctime)s [%(name)s] %(message)s"
_LOGGED = "_mmbatch_logged"
"""Set on a record once it is in the log file: a record that reaches two of a library's
terminal handlers is written once."""


@contextmanager
def libraries_to_log(path: str | os.PathLike[str] | None) -> Iterator[None]:
    """While the block runs, what other libraries log (Python's ``logging``) or warn
    (``warnings``) goes to ``path`` (appended, made when first written) instead of the
    terminal; None leaves it where the libraries send it (``-v``). mmbatch's own lines are
    printed, not logged, and stay on the terminal."""
    if path is None:
        yield
        return
    log = _LibraryLog(str(path))
    _install_record_factory()
    with _routes_lock:
        _routes.append(log)
    last_resort, show = logging.lastResort, warnings.showwarning
    logging.lastResort = log.file  # a record no handler takes (a library never set one up)
    warnings.showwarning = log.warning
    try:
        yield
    finally:
        if warnings.showwarning == log.warning:
            warnings.showwarning = show
        if logging.lastResort is log.file:
            logging.lastResort = last_resort
        with _routes_lock:
            _routes.remove(log)
        log.close()


class _LibraryLog:
    """The log file of one command, and the terminal handlers it diverts meanwhile."""

    def __init__(self, path: str) -> None:
        self.file = _FileMadeWhenWritten(path, mode="a", encoding="utf-8", delay=True)
        self.file.setFormatter(logging.Formatter(_FORMAT))
        self.file.setLevel(logging.NOTSET)
        self.diverted: set[logging.Handler] = set()
        self._lock = threading.Lock()

    def divert(self, record: logging.LogRecord) -> None:
        """Send ``record`` here instead of through the handlers of its logger (and of the
        loggers it propagates to) that print on the terminal."""
        logger: logging.Logger | None = logging.getLogger(record.name)
        while logger is not None:
            for handler in logger.handlers:
                if handler not in self.diverted and _prints_on_terminal(handler):
                    with self._lock:
                        if handler not in self.diverted:
                            handler.addFilter(self._write)
                            self.diverted.add(handler)
            logger = logger.parent if logger.propagate else None

    def _write(self, record: logging.LogRecord) -> bool:
        """A diverted handler's filter: ``record`` into the file, not onto the terminal."""
        if not getattr(record, _LOGGED, False):
            setattr(record, _LOGGED, True)
            self.file.handle(record)
        return False

    def warning(
        self,
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        """``warnings.showwarning``, into the file."""
        text = warnings.formatwarning(message, category, filename, lineno, line).rstrip()
        record = logging.LogRecord(
            "py.warnings", logging.WARNING, filename, lineno, text, None, None
        )
        setattr(record, _LOGGED, True)
        self.file.handle(record)

    def close(self) -> None:
        with self._lock:
            for handler in self.diverted:
                handler.removeFilter(self._write)
            self.diverted.clear()
        self.file.close()


class _FileMadeWhenWritten(logging.FileHandler):
    """A log file (and its folder) made by the first record, not before: a command that
    stops at a mistake in its settings leaves nothing behind."""

    def _open(self) -> Any:
        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        return super()._open()


_routes: list[_LibraryLog] = []
"""The logs of the commands running in this process, the latest last (it takes records)."""
_routes_lock = threading.Lock()
_factory_lock = threading.Lock()
_factory_installed = False


def _install_record_factory() -> None:
    """Put ``_divert_record`` in front of the record factory, once per process: it passes
    every record through unchanged and, while a command's log is open, diverts the
    terminal handlers the record is about to reach. Left in place afterwards (other
    libraries, Ray among them, wrap the factory in turn), where it does nothing."""
    global _factory_installed
    with _factory_lock:
        if _factory_installed:
            return
        previous = logging.getLogRecordFactory()

        def _divert_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            route = _routes[-1] if _routes else None
            if route is not None and not record.name.startswith("mmbatch"):
                route.divert(record)
            return record

        logging.setLogRecordFactory(_divert_record)
        _factory_installed = True


def _prints_on_terminal(handler: logging.Handler) -> bool:
    """Whether ``handler`` writes to the process's standard output or error (not a file
    of its own, not a test's capture)."""
    if not isinstance(handler, logging.StreamHandler) or isinstance(handler, logging.FileHandler):
        return False
    stream = handler.stream
    if any(stream is s for s in (sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__)):
        return True
    try:
        return stream.fileno() in (1, 2)
    except (AttributeError, OSError, ValueError):
        return False
