"""vLLM's start-up log (about a hundred lines) in a file instead of the terminal.

vLLM logs through Python's ``logging`` (configured when it is imported, and again when an
engine is built, from ``VLLM_LOGGING_CONFIG_PATH``), and other libraries write to the
terminal directly while the engine starts (weight-loading progress bars, C++ warnings,
Python warnings). So ``engine_log(path)`` does both: it points vLLM's logging config at a
file handler, for this process and for the engine processes started meanwhile (they read
the environment), and it sends file descriptors 1 and 2 to the same file while the block
runs. vLLM's later messages (while the job runs) keep going to the file through the
handler; the job's own output (progress bar, summary) comes after the block, to the
terminal. ``None`` leaves everything where vLLM sends it (``-v``).
"""

from __future__ import annotations

import json
import logging.config
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeAlias

_ENV = ("VLLM_CONFIGURE_LOGGING", "VLLM_LOGGING_CONFIG_PATH")

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
    saved = {name: os.environ.get(name) for name in _ENV}
    handle, config_path = tempfile.mkstemp(prefix="mmbatch-vllm-logging-", suffix=".json")
    with os.fdopen(handle, "w") as file:
        json.dump(config, file)
    os.environ["VLLM_CONFIGURE_LOGGING"] = "1"
    os.environ["VLLM_LOGGING_CONFIG_PATH"] = config_path
    if "vllm.logger" in sys.modules:  # configured already: point it at the file now
        logging.config.dictConfig(config)
    try:
        with _terminal_to(target):
            yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        Path(config_path).unlink(missing_ok=True)


@contextmanager
def _terminal_to(target: str) -> Iterator[None]:
    """File descriptors 1 and 2 (what C code, subprocesses and Python write) into
    ``target`` while the block runs."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    log = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(log, 1)
        os.dup2(log, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, log):
            os.close(fd)
