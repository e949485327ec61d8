"""The processes a job leaves, found the ways that do not miss one.

A job the tests start gets a session of its own (``start_new_session=True``); every process
it starts stays in that session, whatever process group it moves to (an engine replica
leads a group of its own, which vLLM's engine core and workers join). vLLM renames its
processes (``VLLM::EngineCore``), which overwrites what ``/proc/PID/environ`` shows, so a
mark in the environment alone would not find them; the session does. A zombie (ended, not
yet reaped by its new parent) holds nothing and does not count.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name: state, ppid, pgrp, session..."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def _pids() -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def alive(pid: int) -> bool:
    """``pid`` runs (exists, and is not a zombie)."""
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def in_session(session: int) -> list[int]:
    """The live processes of ``session`` (a job started in a session of its own: its pid)."""
    return [pid for pid in _pids() if (f := _stat(pid)) and f[0] != "Z" and int(f[3]) == session]


def marked(mark: str) -> list[int]:
    """The live processes whose environment holds ``MMBATCH_TEST_MARK=mark``."""
    needle = f"MMBATCH_TEST_MARK={mark}".encode()
    found = []
    for pid in _pids():
        try:
            if needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") and alive(pid):
                found.append(pid)
        except OSError:
            continue  # gone, or not ours to read
    return found


def children(pid: int) -> list[int]:
    """The live processes whose parent is ``pid``."""
    return [p for p in _pids() if (f := _stat(p)) and f[0] != "Z" and int(f[1]) == pid]


def group_leaders(pids: list[int]) -> list[int]:
    """Those of ``pids`` that lead a process group of their own (an engine replica does)."""
    return [pid for pid in pids if (f := _stat(pid)) and int(f[2]) == pid]


def command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
    except OSError:
        return "(gone)"


def left_after(find: Callable[[], list[int]], seconds: float) -> list[str]:
    """What ``find`` still finds once ``seconds`` have passed (at once if nothing is left),
    as ``pid command`` lines for a failure message."""
    deadline = time.monotonic() + seconds
    while True:
        left = find()
        if not left or time.monotonic() >= deadline:
            return [f"{pid} {command(pid)}" for pid in left]
        time.sleep(0.02)


def shared_memory() -> set[str]:
    """The POSIX shared memory segments and named semaphores of this host (Linux)."""
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def _mapped_shared_memory() -> set[int]:
    """The inodes of the files in /dev/shm that some live process maps. By inode, not name:
    glibc makes a named semaphore under a temporary name, maps it, then renames it, so a
    holder's map shows the temporary name."""
    inodes = set()
    for pid in _pids():
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue  # gone meanwhile, or not ours to read
        for line in maps.splitlines():
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith("/dev/shm/"):
                inodes.add(int(fields[4]))
    return inodes


def _unheld(names: set[str]) -> set[str]:
    """Those of ``names`` still in /dev/shm that no live process maps."""
    mapped = _mapped_shared_memory()
    unheld = set()
    for name in names:
        try:
            inode = os.stat(f"/dev/shm/{name}").st_ino
        except OSError:
            continue  # unlinked meanwhile
        if inode not in mapped:
            unheld.add(name)
    return unheld


def leaked_shared_memory(before: set[str], seconds: float) -> set[str]:
    """The shared memory segments (``psm_*``: vLLM's message queues) and named semaphores
    (``sem.mp-*``: multiprocessing's locks and queues) made since ``before`` that no process
    maps any more and that are still there once ``seconds`` have passed (at once if none
    is): nothing will unlink those. One that some process still maps is not counted: it may
    be another test's or job's on this host (tests run on two workers), or one whose last
    holder is still exiting; a tracker unlinks it once its holders are gone."""
    deadline = time.monotonic() + seconds
    while True:
        leaked = _unheld(shared_memory() - before)
        if not leaked or time.monotonic() >= deadline:
            return leaked
        time.sleep(0.2)


def starts_ended() -> None:
    """Wait for the engine starts begun in this process (``mmbatch.engine.early``): a start
    the job abandoned closes what it built once done."""
    import threading

    for thread in threading.enumerate():
        if thread.name == "mmbatch-engine-start":
            thread.join(timeout=30)
